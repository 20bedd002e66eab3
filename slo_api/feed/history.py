"""The change log: what was published, and the history streams read and resume from.

The index tells the log which routes a change touched; the log renders those routes' /config
items in each view someone watches, compares them with what it last published, and records
the real differences, each with the next sequence number.

Retention is per (view, kind) someone watches, so one view's or kind's churn never expires
another's positions, and bounded in bytes. An entry is dropped only when its history is over
its byte bound; a live stream that had not yet written it is then ended (it fell further
behind than the bound), never one that had.

A revision is `<epoch>.<sequence>`: the epoch is random per process, so a revision from another
process (or an earlier run of this one) is refused like one older than the history.
"""

from __future__ import annotations

import bisect
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from slo_api.feed import framing
from slo_api.service import Service

VIEWS = ("summary", "full")

Owners = tuple[tuple[str, str], ...]  # (kind name, namespace) of each CR claiming a route
Allowed = frozenset[tuple[str, str]]  # (kind name, namespace) pairs a caller may list
# Measured bytes a history entry costs beside its item (the Change, its list slot and its
# dictionary entry; see tests/unit/test_feed.py); its encoded frames are counted as made.
ENTRY_OVERHEAD = 400


def shown(owners: Owners, kind: str | None, allowed: Allowed | None) -> bool:
    """The visibility rule of a route, for /config and its stream alike: claimed by a CR of
    the kind asked for (any kind without one), and by at least one CR the caller may list
    (of any kind: an ambiguous route is listed as such to whoever may see one of its CRs)."""
    if not owners:
        return False
    if kind is not None and all(k != kind for k, _ in owners):
        return False
    return allowed is None or any(owner in allowed for owner in owners)


class Expired(Exception):
    """A revision this process cannot resume from."""


@dataclass(slots=True, eq=False)
class Change:
    """One route's /config item changing in one view."""

    seq: int
    route: str
    before: bytes | None
    after: bytes | None
    owners_before: Owners
    owners_after: Owners
    frames: dict[tuple[str, bool], bytes] = field(default_factory=dict)

    def frame(self, type_: str, sse: bool, revision: Callable[[int], bytes]) -> bytes:
        key = (type_, sse)
        encoded = self.frames.get(key)
        if encoded is None:
            item = self.before if type_ == "DELETED" else self.after
            assert item is not None
            position = revision(self.seq)
            encoded = self.frames[key] = framing.frame(
                framing.change_line(type_, self.route, item, position), position, sse
            )
        return encoded

    def event(
        self, kind: str | None, allowed: Allowed | None, sse: bool, revision: Callable[[int], bytes]
    ) -> bytes | None:
        was = shown(self.owners_before, kind, allowed)
        now = shown(self.owners_after, kind, allowed)
        if now:
            return self.frame("MODIFIED" if was else "ADDED", sse, revision)
        if was:
            return self.frame("DELETED", sse, revision)
        return None

    @property
    def size(self) -> int:
        return ENTRY_OVERHEAD + len(self.after if self.after is not None else self.before or b"")


class History:
    """The changes of one (view, kind), oldest first, at most `budget` bytes of them."""

    def __init__(self, view: str, kind: str | None, floor: int, budget: int) -> None:
        self.view = view
        self.kind = kind
        self.budget = budget
        self.changes: list[Change] = []
        self._seqs: list[int] = []
        self._start = 0  # changes[:_start] are dropped (removed in bulk, so trimming is O(1))
        self.bytes = 0
        # A cursor at or after the floor can resume: nothing after it was dropped.
        self.floor = floor

    def __len__(self) -> int:
        return len(self.changes) - self._start

    def append(self, change: Change) -> None:
        self.changes.append(change)
        self._seqs.append(change.seq)
        self.bytes += change.size

    def trim(self) -> int:
        """Drop the oldest entries while over budget; returns the floor: a stream whose
        cursor is below it has lost an entry it needed."""
        changes, start = self.changes, self._start
        while self.bytes > self.budget and start < len(changes):
            change = changes[start]
            start += 1
            self.bytes -= change.size
            self.floor = change.seq
        if start > 1024 and start > len(changes) // 2:
            del changes[:start]
            del self._seqs[:start]
            start = 0
        self._start = start
        return self.floor

    def after(self, cursor: int, limit: int) -> tuple[list[Change], int, bool]:
        """Entries after `cursor`, about `limit` bytes of them, the sequence read to, and
        whether that was all there is."""
        at = max(bisect.bisect_right(self._seqs, cursor), self._start)
        out: list[Change] = []
        taken = 0
        changes = self.changes
        for i in range(at, len(changes)):
            change = changes[i]
            out.append(change)
            taken += change.size
            if taken >= limit:
                return out, change.seq, i == len(changes) - 1
        return out, cursor, True


class ChangeLog:
    def __init__(self, service: Service, budget: int) -> None:
        self.service = service
        self.index = service.index
        self.budget = budget
        self.epoch = secrets.token_hex(4)
        self.seq = 0
        self.histories: dict[tuple[str, str | None], History] = {}
        # What was last published, per view anyone has watched: route -> /config item.
        self._last: dict[str, dict[str, bytes]] = {}
        self._owners: dict[str, Owners] = {}
        # Each route's initial-state frame (an ADDED without a position), by view and format,
        # kept until the route next changes: an initial state is a join of these.
        self._initial: dict[tuple[str, bool], dict[str, bytes]] = {}
        self.listeners: list[Callable[[list[History]], None]] = []
        self.index.subscribe(self._changed)

    # -- revisions -------------------------------------------------------------------------

    def revision(self, seq: int) -> str:
        return f"{self.epoch}.{seq}"

    def position(self, seq: int) -> bytes:
        return b"%b.%d" % (self.epoch.encode(), seq)

    def parse(self, revision: str, history: History) -> int:
        """The sequence a resume in `history` may start after, or Expired."""
        epoch, _, number = revision.strip().partition(".")
        if epoch != self.epoch or not number.isdigit() or int(number) > self.seq:
            raise Expired(f"revision {revision!r} is not from this server process")
        seq = int(number)
        if seq < history.floor:
            raise Expired(f"revision {revision!r} is older than the history kept")
        return seq

    # -- following -------------------------------------------------------------------------

    def history(self, view: str, kind: str | None) -> History:
        """The history of a (view, kind), kept from now on once a stream asks for it."""
        found = self.histories.get((view, kind))
        if found is None:
            self._activate(view)
            found = self.histories[(view, kind)] = History(view, kind, self.seq, self.budget)
        return found

    def _activate(self, view: str) -> None:
        """Start following a view: its current items become the published state."""
        if view in self._last:
            return
        routes = self.index.routes()
        if not self._last:
            self._owners = {route: self._owners_of(route) for route in routes}
        line = self.service.line
        self._last[view] = {route: line(view, route) for route in routes}

    def _owners_of(self, route: str) -> Owners:
        kinds = self.service.kinds
        # claimed_in, not claims: the index keeps CRs encoded, and only namespaces are needed.
        return tuple((kinds[plural].name, ns) for plural, ns in self.index.claimed_in(route))

    def owners(self, route: str) -> Owners:
        return self._owners.get(route, ())

    def initial_frame(self, view: str, route: str, sse: bool) -> bytes | None:
        frames = self._initial.get((view, sse))
        if frames is None:
            frames = self._initial[(view, sse)] = {}
        encoded = frames.get(route)
        if encoded is None:
            item = self._last[view].get(route)
            if item is None:
                return None
            encoded = frames[route] = framing.frame(
                framing.change_line("ADDED", route, item, None), None, sse
            )
        return encoded

    def _changed(self, routes: set[str]) -> None:
        """The index listener: record what really changed on the touched routes."""
        if not self._last:
            return  # nobody has watched yet: nothing to compare or to tell
        touched: dict[tuple[str, str | None], History] = {}
        line = self.service.line
        for route in sorted(routes):
            owners = self._owners_of(route)
            old_owners = self._owners.get(route, ())
            if owners:
                self._owners[route] = owners
            else:
                self._owners.pop(route, None)
            for view, last in self._last.items():
                before = last.get(route)
                after = line(view, route) if owners else None
                if before == after and old_owners == owners:
                    continue  # a relist re-storing an object, or a change another view shows
                if after is None:
                    last.pop(route, None)
                else:
                    last[route] = after
                for sse in (False, True):
                    frames = self._initial.get((view, sse))
                    if frames is not None:
                        frames.pop(route, None)
                self.seq += 1
                change = Change(self.seq, route, before, after, old_owners, owners)
                for kind in _kinds_of(old_owners, owners):
                    history = self.histories.get((view, kind))
                    if history is not None:
                        history.append(change)
                        touched[(view, kind)] = history
        if touched:
            for listener in self.listeners:
                listener(list(touched.values()))


def _kinds_of(before: Owners, after: Owners) -> Iterable[str | None]:
    yield None
    yield from sorted({k for k, _ in before} | {k for k, _ in after})
