"""The change log: what was published, and the history streams read and resume from.

The index tells the log which routes a change touched; the log renders those routes' /config
items in each view someone watches, compares them with what it last published, and records
the real differences, each with the next sequence number.

Retention is per (view, kind) someone watches, so one view's or kind's churn never expires
another's positions, and bounded in bytes. An entry is dropped only when its history is over
its byte bound; a live stream that had not yet written it is then ended (it fell further
behind than the bound), never one that had.

A revision names a point in the cluster's history: the resourceVersion each informer had
reached and how many objects it held there, with this process's epoch and sequence beside it,
base64 of a small binary encoding. The informers are the kinds' (kind, API group, and
namespace when namespaces are scoped) and the guardrails' (SLOLimits, exempt namespaces): the
full view shows a route's limits, so a change they cause has its place among the versions
like any other. This process resumes from its own sequence exactly. Another replica (or this
one after a restart) resumes from the versions: it replays every change it recorded from a
version the revision had not reached (the same change may come twice: events carry whole
items, so the client converges), and answers 410 when its history does not reach back that
far. A replica knows the cluster from its first list on; a version before that is covered
only where nothing moved in between: its first list had as many objects, none newer.
Versions are compared as KEP-5504 lets a client (slo_api.versions): where an informer met
one that does not compare, another process's revision cannot be placed and is 410 too.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import hashlib
import itertools
import secrets
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import orjson

from slo_api import heap
from slo_api.bounded import Shared
from slo_api.feed import framing
from slo_api.index import Source
from slo_api.packed import Dictionaries, unpack
from slo_api.service import Allowed, Owners, Service, shown

VIEWS = ("summary", "full")

# Per informer, sorted: the resourceVersion it reached, and 1 + the objects it held there
# (0: not known, the index being ahead of what was published for it).
Vector = tuple[tuple[Source, int, int], ...]
# Per informer, the version a resumed stream's revision had reached and 1 + the objects held
# there (0: not known).
Floor = dict[Source, tuple[int, int]]
Cause = tuple[Source, int]  # a change's informer and resourceVersion
Place = tuple[int, int]  # a history entry's sequence, and the resourceVersion that caused it
NOWHERE: Source = ("", "", "")
# Routes per cached block of an initial state: a new stream's initial state is a join of
# blocks, each rebuilt only when one of its routes changes.
BLOCK = 1024
CHUNK = 500  # routes compared per turn of the event loop
# The distinct claims of routes (kind, namespace, API group of each CR) shared among them.
_SHARED_OWNERS: Shared[Owners] = Shared(4096)
Block = tuple[list[str], bytes, int]  # its routes, their ADDED frames, how many
# Bytes a history entry costs beside its item: the Change, its sequence and version, its list
# and array slots (about 115 measured: bench/stream_costs.py and tracemalloc; a Change shared
# with a kind's history costs that history its slots only), and once framed who made it and
# its own More; an entry is counted as that, its item and one framed copy of it (what streams
# of one format make of it).
ENTRY_OVERHEAD = 250


class Expired(Exception):
    """A revision this process cannot resume from."""


class More:
    """What few changes hold beside their item, and what framing one adds: one object that
    every unframed change of a log without them shares (`shared`), so an entry of the
    history is a Change of six slots, not of thirteen."""

    __slots__ = (
        "before",
        "by",
        "by_of",
        "dictionary",
        "frames",
        "plain_after",
        "plain_before",
        "shared",
    )

    def __init__(
        self,
        by_of: Callable[[int], bytes | None] | None,
        before: bytes | None = None,
        plain_before: bytes | None = None,
        plain_after: bytes | None = None,
        dictionary: bytes | None = None,
        shared: bool = False,
    ) -> None:
        # The item before it, kept only where a stream may see the change as DELETED while
        # the route is still there (its copy shown moved to a kind, namespace or API group
        # the stream does not see).
        self.before = before
        # The full view's items without a member's `pool` (for callers who may not read the
        # pool), only where they differ from the change's.
        self.plain_before = plain_before
        self.plain_after = plain_after
        # Who made it (JSON), when the change is a recorded one: on its ADDED and MODIFIED.
        # Asked (`by_of(rv)`) when first framed, not when the index stores it: a write's watch
        # event may come before its answer, which names its caller.
        self.by: bytes | None = None
        self.by_of = by_of
        # Its framed forms, made on first use (most changes are framed in one or two forms).
        self.frames: dict[tuple[str, bool, bool], bytes] | None = None
        # The change's item is packed against it (see ChangeLog._pack); None: as it is.
        self.dictionary = dictionary
        self.shared = shared

    def own(self) -> More:
        """A copy of a shared one, for one change to frame into."""
        return More(self.by_of, self.before, self.plain_before, self.plain_after, self.dictionary)


@dataclass(slots=True, eq=False)
class Change:
    """One route's /config item changing in one view. Its sequence and the resourceVersion
    that caused it are the history's (`History.append`), in arrays of machine integers: an
    int object each was 60 bytes of the ~250 an entry held."""

    route: str
    # The item after the change; before it, for a change that removed the route.
    item: bytes
    owners_before: Owners
    owners_after: Owners
    # What caused it: the informer (its resourceVersion, a relist's the list's, is the
    # history's).
    source: Source
    # Shared by most (see More).
    more: More

    def frame(
        self,
        type_: str,
        sse: bool,
        revision: Callable[[int], bytes],
        at: Place,
        plain: bool = False,
        own: bytes | None = None,
    ) -> bytes:
        """This change, the history's entry `at` (its sequence and version), framed; `own` is
        a position only one stream is given (see ChangeLog.position_above): framed for it
        alone, not kept."""
        deleted = type_ == "DELETED"
        more = self.more
        variant = more.plain_before if deleted else more.plain_after
        plain = plain and variant is not None  # the same bytes otherwise: framed once
        key = (type_, sse, plain)
        frames = more.frames
        encoded = None if own is not None or frames is None else frames.get(key)
        if encoded is None:
            if more.shared:
                more = self.more = more.own()
            if more.by_of is not None:
                more.by, more.by_of = more.by_of(at[1]), None
            if plain:
                item = variant
            elif deleted and more.before is not None:
                item = more.before
            elif more.dictionary is not None:
                item = unpack(self.item, more.dictionary)
            else:
                item = self.item
            assert item is not None
            position = revision(at[0]) if own is None else own
            encoded = framing.frame(
                framing.change_line(
                    type_, self.route, item, position, None if deleted else more.by
                ),
                position,
                sse,
            )
            if own is None:
                if more.frames is None:
                    more.frames = {}
                more.frames[key] = encoded
        return encoded

    def event(
        self,
        kind: str | None,
        allowed: Allowed | None,
        sse: bool,
        revision: Callable[[int], bytes],
        at: Place,
        full_view: Callable[[Owners, Allowed | None], str] | None = None,
        own: bytes | None = None,
    ) -> bytes | None:
        """This change (the history's entry `at`) as a stream sees it; `full_view`
        (Service.full_view) picks, in the full view, whether it sees a member's `pool`."""
        was = shown(self.owners_before, kind, allowed)
        now = shown(self.owners_after, kind, allowed)
        if now:
            plain = full_view is not None and full_view(self.owners_after, allowed) != "full"
            return self.frame("MODIFIED" if was else "ADDED", sse, revision, at, plain, own)
        if was:
            plain = full_view is not None and full_view(self.owners_before, allowed) != "full"
            return self.frame("DELETED", sse, revision, at, plain, own)
        return None

    @property
    def size(self) -> int:
        # The same from its append to its trim (who made it, asked when it is framed, is in
        # the overhead): the history's count of bytes never drifts.
        return ENTRY_OVERHEAD + 2 * len(self.item)


class History:
    """The changes of one (view, kind), oldest first, at most `budget` bytes of them."""

    def __init__(
        self,
        view: str,
        kind: str | None,
        floor: int,
        budget: int,
        pack: Callable[[str, Change], None] | None = None,
    ) -> None:
        self.view = view
        self.kind = kind
        self.budget = budget
        self.changes: list[Change] = []
        # Each entry's sequence, the resourceVersion that caused it, and its bytes as counted
        # when it came (its item may be packed since).
        self._seqs = array("q")
        self._rvs: array[int] | list[int] = array("q")
        self._sizes = array("q")
        # With `pack`: each route's newest entry; the one a newer entry replaces is packed.
        self._pack = pack
        self._newest: dict[str, Change] | None = {} if pack is not None else None
        self._start = 0  # changes[:_start] are dropped (removed in bulk, so trimming is O(1))
        self.bytes = 0
        # A cursor at or after the floor can resume: nothing after it was dropped.
        self.floor = floor
        # The same in versions, per informer: what a revision from elsewhere must have reached.
        self.floor_rv: dict[Source, int] = {}
        # For the guardrails' informers (often quiet for long: their version may stay behind
        # the floor another replica started its history at), their state at the start (see
        # Limits.state): a revision before the floor that names this state is covered. Gone
        # once an entry of theirs is dropped.
        self.floor_state: dict[Source, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self.changes) - self._start

    def live(self) -> Iterator[tuple[Place, Change]]:
        """Each entry kept, oldest first: its sequence and version, and its change."""
        seqs, rvs, changes = self._seqs, self._rvs, self.changes
        for i in range(self._start, len(changes)):
            yield (seqs[i], rvs[i]), changes[i]

    def append(self, seq: int, rv: int, change: Change) -> None:
        size = change.size
        self.changes.append(change)
        self._seqs.append(seq)
        try:
            self._rvs.append(rv)
        except OverflowError:
            # Past 64 bits (KEP-5504 allows any length; conformance tests go to 128): kept
            # as int objects from then on.
            self._rvs = [*self._rvs, rv]
        self._sizes.append(size)
        self.bytes += size
        newest = self._newest
        if newest is not None and self._pack is not None:
            replaced = newest.get(change.route)
            newest[change.route] = change
            if replaced is not None:
                self._pack(self.view, replaced)

    def trim(self) -> int:
        """Drop the oldest entries while over budget; returns the floor: a stream whose
        cursor is below it has lost an entry it needed."""
        changes, start, newest = self.changes, self._start, self._newest
        while self.bytes > self.budget and start < len(changes):
            change, rv = changes[start], self._rvs[start]
            self.bytes -= self._sizes[start]
            self.floor = self._seqs[start]
            start += 1
            if newest is not None and newest.get(change.route) is change:
                del newest[change.route]
            if rv > self.floor_rv.get(change.source, 0):
                self.floor_rv[change.source] = rv
                self.floor_state.pop(change.source, None)
        if start > 1024 and start > len(changes) // 2:
            del changes[:start]
            del self._seqs[:start]
            del self._rvs[:start]
            del self._sizes[:start]
            start = 0
        self._start = start
        return self.floor

    def after(self, cursor: int, limit: int) -> tuple[list[tuple[Place, Change]], int, bool]:
        """Entries after `cursor` (each its sequence and version, and its change), about
        `limit` bytes of them, the sequence read to, and whether that was all there is."""
        seqs, rvs, changes = self._seqs, self._rvs, self.changes
        at = max(bisect.bisect_right(seqs, cursor), self._start)
        out: list[tuple[Place, Change]] = []
        taken = 0
        for i in range(at, len(changes)):
            out.append(((seqs[i], rvs[i]), changes[i]))
            taken += self._sizes[i]
            if taken >= limit:
                return out, seqs[i], i == len(changes) - 1
        return out, cursor, True


class ChangeLog:
    def _by_json(self, rv: int) -> bytes | None:
        who = self._by(rv) if self._by is not None else None
        return None if who is None else orjson.dumps(who)

    def __init__(
        self, service: Service, budget: int, by: Callable[[int], object] | None = None
    ) -> None:
        self.service = service
        # Who made the change the index is storing (at a resourceVersion), or None.
        self._by = by
        self._by_json_of = self._by_json if by is not None else None
        # What every change without a `before` or plain items holds until it is framed.
        self._more = More(self._by_json_of, shared=True)
        # The same for packed changes, per dictionary (a view's, see _pack).
        self._packed_more: dict[bytes, More] = {}
        self._dictionaries = Dictionaries()
        self.index = service.index
        self.budget = budget
        self._epoch = secrets.token_bytes(4)
        self.seq = 0
        # One mark per publication (see _mark): its last sequence, where its bytes start in
        # `_mark_data`, and its informers (shared). Parallel arrays of machine integers and
        # one buffer: a publication per change costs a few dozen bytes, not a tuple of tuples.
        self._mark_seqs = array("q")
        self._mark_at = array("q")
        self._mark_data = bytearray()
        self._mark_sources: list[tuple[Source, ...]] = []
        self._sources: dict[tuple[Source, ...], tuple[Source, ...]] = {}
        # Routes touched and not yet compared, with what touched them (in order).
        self._pending: dict[str, Cause] = {}
        # Recording spread over turns holds the collector's automatic runs (see heap).
        self._holding = False
        self._turns = 0
        self._pending_count: Counter[Source] = Counter()
        self._pending_floor: dict[Source, int] = {}
        # Pending routes whose copy shown moved to another API group: a change even where
        # the items are the same bytes (what a caller's `list` is asked about moved).
        self._moved: set[str] = set()
        self._scheduled = False
        self._dropped_upto = -1  # the last sequence of the newest mark dropped
        self.histories: dict[tuple[str, str | None], History] = {}
        # What was last published, per view anyone has watched: route -> /config item.
        self._last: dict[str, dict[str, bytes]] = {}
        self._owners: dict[str, Owners] = {}
        # The full view's published items without a member's `pool`, where they differ.
        self._plain: dict[str, bytes] = {}
        # Each route's initial-state frame (an ADDED without a position), by view and format,
        # kept until the route next changes: an initial state is a join of these.
        self._initial: dict[tuple[str, bool], dict[str, bytes]] = {}
        # The same joined by blocks of consecutive routes, for streams that see every route;
        # and which block each route is in, to drop it when the route changes.
        self._blocks: dict[tuple[str, bool], dict[tuple[str, str, int], Block]] = {}
        self._block_of: dict[tuple[str, bool], dict[str, tuple[str, str, int]]] = {}
        self.listeners: list[Callable[[list[History]], None]] = []
        self.index.subscribe(self._changed)

    # -- revisions -------------------------------------------------------------------------

    def vector(self, seq: int) -> Vector:
        """Where the informers were once the changes up to `seq`, and no later one, were
        published: a change published before others of its view in the same go stands one
        version before their cause (a stream cut there has not written the others)."""
        if seq >= self.seq:
            return self._positions()
        if seq <= self._dropped_upto:
            # Older than every history (a stream stuck that long): nothing is known of it,
            # so it names nothing another replica could resume from.
            return tuple((s, 0, 0) for s, _, _ in self._positions())
        at = bisect.bisect_left(self._mark_seqs, seq)
        if at == len(self._mark_seqs):
            return self._positions()
        return self._marked(at, seq)

    def _marked(self, at: int, seq: int) -> Vector:
        """Mark `at`'s vector for `seq`, one of its publication's: the informers' versions
        after it for the last change of a view, else the one inside it (see _mark)."""
        data, sources, last = self._mark_data, self._mark_sources[at], self._mark_seqs[at]
        pos = self._mark_at[at]
        after = []
        for source in sources:
            value, pos = _unvarint(data, pos)
            held, pos = _unvarint(data, pos)
            after.append((source, _unzigzag(value), _unzigzag(held)))
        differs = data[pos]
        pos += 1
        inside = after
        if differs:
            inside = []
            for source in sources:
                value, pos = _unvarint(data, pos)
                held, pos = _unvarint(data, pos)
                inside.append((source, _unzigzag(value), _unzigzag(held)))
        count, pos = _unvarint(data, pos)
        for _ in range(count):
            back, pos = _unvarint(data, pos)
            if last - back == seq:
                return tuple(after)
        return tuple(inside)

    def revision(self, seq: int, floor: Floor | None = None) -> str:
        """The revision of a stream's position `seq`. A stream resumed from another
        process's revision also had everything that revision reached: `floor` (its
        versions, see parse) raises the versions to it, else a line it is sent before this
        process caught up would name older versions than the client holds, and a resume
        from that line elsewhere would send it older states again."""
        vector = self.vector(seq) if floor is None else self.raised(seq, floor)
        payload = bytearray(self._epoch)
        _varint(payload, seq)
        payload += _digest(s for s, _, _ in vector)
        for _, value, _ in vector:
            _varint(payload, value)
        for _, _, held in vector:
            _varint(payload, held)
        return base64.urlsafe_b64encode(bytes(payload)).rstrip(b"=").decode()

    def position(self, seq: int) -> bytes:
        return self.revision(seq).encode()

    def raised(self, seq: int, floor: Floor) -> Vector:
        """vector(seq), each informer's version at least the one `floor` names."""
        return tuple(
            (s, *floor[s]) if s in floor and floor[s][0] > v else (s, v, held)
            for s, v, held in self.vector(seq)
        )

    def position_above(self, seq: int, floor: Floor) -> bytes | None:
        """The position of `seq` for a stream resumed from `floor`, or None where it is
        the one every stream is given (the frames cached for all can be used)."""
        if self.raised(seq, floor) == self.vector(seq):
            return None
        return self.revision(seq, floor).encode()

    def _decode(self, revision: str) -> tuple[bytes, int, bytes, list[int]]:
        try:
            text = revision.strip()
            payload = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            epoch, at = payload[:4], 4
            seq, at = _unvarint(payload, at)
            digest, at = payload[at : at + 4], at + 4
            values = []
            while at < len(payload):
                value, at = _unvarint(payload, at)
                values.append(value)
        except (ValueError, IndexError):
            raise Expired(f"revision {revision!r} is not one this server gave out") from None
        if len(epoch) != 4 or len(digest) != 4:
            raise Expired(f"revision {revision!r} is not one this server gave out")
        return epoch, seq, digest, values

    def sequence(self, revision: str) -> int:
        """The sequence in the process that gave the revision out."""
        return self._decode(revision)[1]

    def versions(self, revision: str) -> dict[Source, int] | None:
        """The informers' versions a revision from another process names; None for one of
        this process's own."""
        remote = self._remote(revision)
        return None if remote is None else {s: v for s, (v, _) in remote.items()}

    def _remote(self, revision: str) -> dict[Source, tuple[int, int | None]] | None:
        """Per informer, the version and objects held (None: not known) a revision from
        another process names; None for one of this process's own."""
        epoch, _, digest, values = self._decode(revision)
        if epoch == self._epoch:
            return None
        opaque = self.index.opaque | self.service.limits.opaque
        if opaque:
            # Which of this replica's changes such a revision had seen cannot be told: a
            # guess could skip one (a resume replays from the versions it names).
            names = ", ".join(sorted("/".join(filter(None, source)) for source in opaque))
            raise Expired(
                f"revision {revision!r} is from another replica, and the API server's "
                f"resourceVersions of {names} are not comparable (KEP-5504)"
            )
        mine = sorted(self.versions_reached())
        if digest != _digest(mine) or len(values) not in (len(mine), 2 * len(mine)):
            if self.service.limits.positions and digest == _digest(sorted(self.index.positions)):
                # Given before revisions named the guardrails' informers too: where it stands
                # among the limits' changes is not known.
                raise Expired(f"revision {revision!r} is from an earlier version of this server")
            raise Expired(f"revision {revision!r} is from a server that follows other resources")
        # A revision without counts (from a server before they were given) knows none.
        held = values[len(mine) :] or [0] * len(mine)
        return {
            source: (values[i], held[i] - 1 if held[i] else None) for i, source in enumerate(mine)
        }

    def parse(self, revision: str, history: History) -> tuple[int, Floor | None]:
        """The sequence a resume in `history` may start after, and for a revision from
        another process the version it reached per informer with the objects held there
        (as a Vector's, 0: not known), or Expired.

        The history is in the order this process recorded its changes, not in versions: its
        own write is recorded from its answer, which may be ahead of its informers, before the
        older events they then bring. So a resume starts before the first change the revision
        had not reached and sends, after it, only the changes it had not reached either.
        """
        remote = self._remote(revision)
        if remote is None:
            seq = self.sequence(revision)
            if seq > self.seq:
                raise Expired(f"revision {revision!r} is not from this server process")
            if seq < history.floor:
                raise Expired(f"revision {revision!r} is older than the history kept")
            return seq, None
        limits = self.service.limits
        first = {**self.index.first_positions, **limits.first_positions}
        lists = {**self.index.first_lists, **limits.first_lists}
        floor: Floor = {}
        for source, (version, held) in remote.items():
            if version < history.floor_rv.get(source, 0):
                state = history.floor_state.get(source)
                if state is None or held != state[1] or state[0] > version:
                    raise Expired(f"revision {revision!r} is older than the history kept")
            floor[source] = (version, 0 if held is None else held + 1)
            if version < first.get(source, 0):
                # Before this process's first list (a restart, a new replica): covered only
                # if nothing moved since, and then it stands where that list did.
                listed = lists.get(source)
                if listed is None or held != listed[1] or listed[0] > version:
                    raise Expired(f"revision {revision!r} is older than the history kept")
                floor[source] = (first[source], listed[1] + 1)
        reached = versions_of(floor)
        for (seq, rv), change in history.live():
            if not reached_by(change.source, rv, reached):
                return seq - 1, floor
        return self.seq, floor

    def caught_up(self, reached: dict[Source, int]) -> bool:
        """Whether every change recorded from now on is past `reached` (the informers have
        gone past it, and nothing they applied waits to be recorded)."""
        if self._pending:
            return False
        now = self.versions_reached()
        return all(now.get(source, -1) >= version for source, version in reached.items())

    # -- following -------------------------------------------------------------------------

    def history(self, view: str, kind: str | None) -> History:
        """The history of a (view, kind), kept from now on once a stream asks for it."""
        found = self.histories.get((view, kind))
        if found is None:
            self.follow(view)
            # The history of the whole view packs what newer entries replaced (it holds them all).
            pack = self._pack if kind is None else None
            found = History(view, kind, self.seq, self.budget, pack)
            self.histories[(view, kind)] = found
            found.floor_rv = self.versions_reached()
            limits = self.service.limits
            found.floor_state = {
                s: limits.state(s) for s in limits.positions if s not in self._pending_floor
            }
            self._mark((), {})
        return found

    def _pack(self, view: str, change: Change) -> None:
        """Keep packed (see slo_api.packed) the item of a change that a newer change of its
        route replaced: nothing but the history reads it any more (the index, the published
        state and the initial frames moved on), and only to frame it for a stream that is
        behind. A summary item keeps about a third of its bytes."""
        more = change.more
        if more.dictionary is not None:
            return
        data, dictionary = self._dictionaries.packed(view, change.item)
        if dictionary is None:
            return  # it would not be smaller
        change.item = data
        if not more.shared:
            more.dictionary = dictionary
            return
        shared = self._packed_more.get(dictionary)
        if shared is None:
            shared = More(self._by_json_of, dictionary=dictionary, shared=True)
            self._packed_more[dictionary] = shared
        change.more = shared

    def follow(self, view: str) -> None:
        """Start following a view (for its first stream, or its first /config page): its
        current items become the published state, and each change of one moves `seq`."""
        if view in self._last:
            return
        # What is still pending is recorded first: the new view starts from what the others
        # have published (its items are read from the index, which is ahead of them).
        while self._pending:
            self._publish()
        routes = self.index.routes()
        if not self._last:
            self._owners = {route: self._owners_of(route) for route in routes}
        line = self.service.line
        last = self._last[view] = {route: line(view, route) for route in routes}
        if view == "full":
            for route in routes:
                plain = line("full-unpooled", route)
                if plain != last[route]:
                    self._plain[route] = plain

    def _owners_of(self, route: str) -> Owners:
        kinds = self.service.kinds
        # claimed_in, not claims: the index keeps CRs encoded, and only places are needed.
        owners = tuple(
            (kinds[plural].name, ns, g) for plural, ns, g in self.index.claimed_in(route)
        )
        # Kept for every route: one tuple for all the routes of a kind in one namespace (and
        # API group), not one each.
        return _SHARED_OWNERS.share(owners)

    @property
    def pending(self) -> bool:
        """Whether the index is ahead of what was published (a relist being recorded)."""
        return bool(self._pending)

    def published(self, view: str) -> dict[str, bytes]:
        return self._last[view]

    def owners(self, route: str) -> Owners:
        return self._owners.get(route, ())

    def initial_frame(
        self, view: str, route: str, sse: bool, allowed: Allowed | None = None
    ) -> bytes | None:
        """A route's ADDED frame in an initial state, as a caller who may list `allowed`
        sees it (a member's `pool` only as Service.full_view says)."""
        source = self._last[view]
        if view == "full" and route in self._plain:
            view = self.service.full_view(self.owners(route), allowed)
            if view != "full":
                source = self._plain
        frames = self._initial.get((view, sse))
        if frames is None:
            frames = self._initial[(view, sse)] = {}
        encoded = frames.get(route)
        if encoded is None:
            item = source.get(route)
            if item is None:
                return None
            encoded = frames[route] = framing.frame(
                framing.change_line("ADDED", route, item, None), None, sse
            )
        return encoded

    def block(self, view: str, sse: bool, routes: list[str]) -> tuple[bytes, int]:
        """The ADDED frames of `routes` (consecutive in the sorted list), joined."""
        key = (routes[0], routes[-1], len(routes))
        blocks = self._blocks.setdefault((view, sse), {})
        found = blocks.get(key)
        if found is not None and found[0] == routes:
            return found[1], found[2]
        last = self._last[view]
        frame, line = framing.frame, framing.change_line
        frames = [
            frame(line("ADDED", route, last[route], None), None, sse)
            for route in routes
            if route in last
        ]
        data = b"".join(frames)
        blocks[key] = (routes, data, len(frames))
        owner = self._block_of.setdefault((view, sse), {})
        for route in routes:
            old = owner.get(route)
            if old is not None and old != key:
                blocks.pop(old, None)  # routes moved along (some added or removed before)
            owner[route] = key
        return data, len(frames)

    def _forget_frames(self, view: str, route: str) -> None:
        for sse in (False, True):
            for variant in (view, "full-unpooled") if view == "full" else (view,):
                frames = self._initial.get((variant, sse))
                if frames is not None:
                    frames.pop(route, None)
            owner = self._block_of.get((view, sse))
            key = owner.pop(route, None) if owner is not None else None
            if key is not None:
                self._blocks[(view, sse)].pop(key, None)

    def _changed(self, routes: set[str]) -> None:
        """The index listener: note the touched routes, and what touched them.

        They are compared and recorded `CHUNK` at a time, one chunk per turn of the event
        loop: a relist that touches every route does not stall the loop for all of them.
        """
        if not self._last:
            return  # nobody has watched yet: nothing to compare or to tell
        source, rv = self.index.cause or (NOWHERE, 0)
        cause: Cause = (source, rv)
        pending, count = self._pending, self._pending_count
        if not pending:  # the usual case, and a relist's 100,000 routes at once: ~5 ms, not 50
            self._pending = dict.fromkeys(routes, cause)
        else:
            for route in routes:
                old = pending.pop(route, None)
                if old is not None:
                    count[old[0]] -= 1
                pending[route] = cause
        count[cause[0]] += len(routes)
        self._moved |= self.index.moved
        self._pending_floor.setdefault(source, rv)
        if not self._scheduled:
            if len(routes) > CHUNK:
                self._schedule()  # the first chunk too in a turn of its own (a relist's)
            else:
                self._publish()

    def _publish(self) -> None:
        self._scheduled = False
        pending = self._pending
        chunk = list(itertools.islice(pending.items(), CHUNK))
        for route, _ in chunk:
            del pending[route]
        try:
            self._record(sorted(chunk))
        finally:
            # Scheduled whatever the chunk did: each turn takes its routes off what is pending.
            if pending:
                self._schedule()
            elif self._holding:
                self._holding = False
                heap.release()

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside a loop (a test, a tool): all of it now
            while self._pending:
                self._publish()
            return
        # Recorded over several turns: the collector runs between them only (see heap).
        if self._holding:
            heap.between_turns(self._turns)
            self._turns += 1
        else:
            self._holding, self._turns = True, 0
            heap.hold()
        self._scheduled = True
        loop.call_soon(self._publish)

    def _record(self, chunk: list[tuple[str, Cause]]) -> None:
        touched: dict[tuple[str, str | None], History] = {}
        line = self.service.line
        start = self.seq
        lasts: dict[str, int] = {}  # the last change of each view in this chunk
        lowest: dict[Source, int] = {}  # each cause's version, the lowest per informer
        count = self._pending_count
        for route, (source, rv) in chunk:
            count[source] -= 1
            if count[source] <= 0:
                del count[source]
                self._pending_floor.pop(source, None)
            owners = self._owners_of(route)
            old_owners = self._owners.get(route, ())
            moved = route in self._moved
            if moved:
                self._moved.discard(route)
            if owners:
                self._owners[route] = owners
            else:
                self._owners.pop(route, None)
            for view, last in self._last.items():
                before = last.get(route)
                after = line(view, route) if owners else None
                if before == after and old_owners == owners and not moved:
                    continue  # a relist re-storing an object, or a change another view shows
                if after is None:
                    last.pop(route, None)
                else:
                    last[route] = after
                plain_before = plain_after = None
                if view == "full":
                    plain_before = self._plain.pop(route, None)
                    if after is not None:
                        plain = line("full-unpooled", route)
                        if plain != after:
                            plain_after = self._plain[route] = plain
                self._forget_frames(view, route)
                self.seq += 1
                lasts[view] = self.seq
                if rv < lowest.get(source, rv + 1):
                    lowest[source] = rv
                item = after if after is not None else before
                assert item is not None  # else nothing changed
                kept = before if after is not None and old_owners != owners else None
                more = self._more
                if kept is not None or plain_before is not None or plain_after is not None:
                    more = More(self._by_json_of, kept, plain_before, plain_after)
                change = Change(route, item, old_owners, owners, source, more)
                for kind in _kinds_of(old_owners, owners):
                    history = self.histories.get((view, kind))
                    if history is not None:
                        history.append(self.seq, rv, change)
                        touched[(view, kind)] = history
        if self.seq != start:
            self._mark(tuple(lasts.values()), lowest)
        if touched:
            for listener in self.listeners:
                listener(list(touched.values()))

    def _positions(self) -> Vector:
        """The informers' versions and objects held, less what is still waiting to be
        recorded: an informer with changes pending (or a relist still being applied) stands
        before the first of them (and what it held there is not known)."""
        floor, counts = self._pending_floor, self.index.counts
        # A relist the index applies over several turns stands before its version till done.
        replacing = self.index.replacing
        limits = self.service.limits
        held = {s: limits.held(s) for s in limits.positions}
        return tuple(
            sorted(
                (s, min(v, floor[s] - 1), 0)
                if s in floor
                else (s, min(v, replacing[s] - 1), 0)
                if s in replacing
                else (s, v, (held[s] if s in held else counts[s]) + 1)
                for s, v in self.versions_reached().items()
            )
        )

    def versions_reached(self) -> dict[Source, int]:
        """The version each informer reached: the kinds' (the index's) and the guardrails'
        (a route's full view shows its namespace's limits)."""
        return {**self.index.positions, **self.service.limits.positions}

    def _mark(self, lasts: tuple[int, ...], lowest: dict[Source, int]) -> None:
        # A position inside the chunk (not the last of its view) stands before every cause
        # the chunk holds: a stream cut there has not written the rest.
        # Kept as long as the changes they mark, as varints in one buffer (see _marked): the
        # vector after it, whether the one inside differs and then that one, and the
        # publication's last change of each view (counted back from its last sequence).
        vector = self._positions()
        inside = tuple(
            (s, min(v, lowest[s] - 1), 0) if s in lowest else (s, v, held) for s, v, held in vector
        )
        sources = tuple(s for s, _, _ in vector)
        data = self._mark_data
        self._mark_seqs.append(self.seq)
        self._mark_at.append(len(data))
        self._mark_sources.append(self._sources.setdefault(sources, sources))
        for _, value, held in vector:
            _varint(data, _zigzag(value))
            _varint(data, _zigzag(held))
        data.append(inside != vector)
        if inside != vector:
            for _, value, held in inside:
                _varint(data, _zigzag(value))
                _varint(data, _zigzag(held))
        _varint(data, len(lasts))
        for last in lasts:
            _varint(data, self.seq - last)
        if len(self._mark_seqs) > 4096 and self.histories:
            # Marks older than every history's floor can no longer be asked for.
            floor = min(h.floor for h in self.histories.values())
            drop = bisect.bisect_left(self._mark_seqs, floor)
            if drop > len(self._mark_seqs) // 2:
                self._dropped_upto = self._mark_seqs[drop - 1]
                start = self._mark_at[drop]
                del self._mark_seqs[:drop]
                del self._mark_sources[:drop]
                del data[:start]
                self._mark_at = array("q", (at - start for at in self._mark_at[drop:]))
                self._sources = {s: s for s in self._mark_sources}


def versions_of(floor: Floor) -> dict[Source, int]:
    return {source: version for source, (version, _) in floor.items()}


def reached_by(source: Source, rv: int, reached: dict[Source, int]) -> bool:
    """Whether a revision that reached these versions had seen a change `source` caused at
    `rv` (one caused by no informer never was)."""
    return rv <= reached.get(source, -1)


def _varint(out: bytearray, value: int) -> None:
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _zigzag(value: int) -> int:
    """A varint's value for any integer (a version before the first is -1)."""
    return value << 1 if value >= 0 else (-value << 1) - 1


def _unzigzag(value: int) -> int:
    return value >> 1 if not value & 1 else -((value + 1) >> 1)


def _unvarint(data: bytes | bytearray, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _digest(sources: Iterable[Source]) -> bytes:
    """Which informers a revision's versions belong to, in order (replicas must agree)."""
    names = "\n".join("/".join(source) for source in sources)
    return hashlib.blake2b(names.encode(), digest_size=4).digest()


def _kinds_of(before: Owners, after: Owners) -> Iterable[str | None]:
    yield None
    yield from sorted({k for k, _, _ in before} | {k for k, _, _ in after})
