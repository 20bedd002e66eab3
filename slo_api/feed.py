"""The change feed behind `GET /config?watch=true`.

The index tells the feed which routes a change touched; the feed renders those routes' /config
items in each view someone watches, compares them with what it last published, and appends the
real differences to one bounded history with a new revision. Every stream reads that history
from its own cursor, so publishing a change costs the same with one watcher or a thousand, and
nothing a watcher does (reading slowly, not at all) can block the watch loops or another stream:
a stream that falls `queue` changes behind while still writing is ended.

A revision is `<epoch>.<sequence>`: the epoch is random per process, so a revision from another
process (or an earlier run of this one) is refused like one too old for the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson

from slo_api.metrics import Metrics
from slo_api.service import Service

log = logging.getLogger("slo_api.feed")

VIEWS = ("summary", "full")
INITIAL_CHUNK = 512  # ADDED lines per write of the initial state
BATCH = 1024  # most changes taken from the history per write
FLUSH_SECONDS = 0.5  # changes are sent at most this long after they happen, together

Owners = tuple[tuple[str, str], ...]  # (kind name, namespace) of each CR claiming a route
Visible = Callable[[str, str], Awaitable[bool]]
Send = Callable[[bytes, int], Awaitable[None]]


class Expired(Exception):
    """`since` names a revision this process cannot resume from."""


class TooManyWatchers(Exception):
    pass


class Closing(Exception):
    """The process is shutting down: no new streams."""


@dataclass(slots=True, eq=False)
class Change:
    """One route's /config item changing in one view."""

    seq: int
    view: str
    route: str
    before: bytes | None
    after: bytes | None
    owners_before: Owners
    owners_after: Owners
    encoded: dict[tuple[str, bool], bytes] = field(default_factory=dict)


def _kinds(owners: Owners) -> frozenset[str]:
    return frozenset(kind for kind, _ in owners)


def _present(owners: Owners, kind: str | None) -> bool:
    return bool(owners) if kind is None else any(k == kind for k, _ in owners)


class Watcher:
    """One open stream: what it asked for and how far through the history it has got."""

    def __init__(
        self, view: str, kind: str | None, visible: Visible | None, cursor: int, sse: bool
    ) -> None:
        self.view = view
        self.kind = kind
        self.visible = visible
        self.cursor = cursor
        self.sse = sse
        self.initial = True
        self.sending = False
        self.dropped: str | None = None
        self.bookmarks = 0
        self.task: asyncio.Task[None] | None = None
        self._visibility: dict[tuple[str, str], bool] = {}

    async def sees(self, owners: Owners) -> bool:
        """A route is visible when any CR claiming it (and of the watched kind) is."""
        if self.visible is None:
            return bool(owners)
        for owner in owners:
            if self.kind is not None and owner[0] != self.kind:
                continue
            seen = self._visibility.get(owner)
            if seen is None:
                seen = self._visibility[owner] = await self.visible(*owner)
            if seen:
                return True
        return False

    def forget_visibility(self) -> None:
        # Asked again after each bookmark, so a changed permission is noticed at the next change.
        self._visibility.clear()


class Feed:
    def __init__(
        self,
        service: Service,
        metrics: Metrics,
        *,
        history: int,
        queue: int,
        max_watchers: int,
        bookmark_seconds: float,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        self.service = service
        self.index = service.index
        self.metrics = metrics
        self.history_size = history
        self.queue = queue
        self.max_watchers = max_watchers
        self.bookmark_seconds = bookmark_seconds
        self.flush_seconds = flush_seconds
        self.epoch = secrets.token_hex(4)
        self.watchers: set[Watcher] = set()
        self.closing = False
        self._seq = 0
        self._base = 1  # the sequence of self._history[0]
        self._history: list[Change] = []
        # What was last published, per view that anyone has watched: route -> /config item.
        self._last: dict[str, dict[str, bytes]] = {}
        # The sequence from which each view's changes are in the history.
        self._view_since: dict[str, int] = {}
        self._owners: dict[str, Owners] = {}
        self._bookmark_round = 0
        self._wake: asyncio.Future[None] | None = None
        self._wake_timer: asyncio.TimerHandle | None = None
        # Encoded batches by (first, last sequence, view, kind, sse), for the current head.
        self._chunks: dict[tuple[int, int, str, str | None, bool], tuple[bytes, int]] = {}
        self._ticker: asyncio.Task[None] | None = None
        self.index.subscribe(self._changed)

    # -- revisions -------------------------------------------------------------------------

    @property
    def head(self) -> int:
        return self._seq

    def revision(self, seq: int) -> str:
        return f"{self.epoch}.{seq}"

    def parse(self, revision: str, view: str) -> int:
        """The sequence a resume may start after, or Expired."""
        epoch, _, number = revision.strip().partition(".")
        if epoch != self.epoch or not number.isdigit():
            raise Expired(f"revision {revision!r} is not from this server process")
        seq = int(number)
        if seq > self._seq:
            raise Expired(f"revision {revision!r} is not from this server process")
        oldest = max(self._base - 1, self._view_since.get(view, self._seq + 1))
        if seq < oldest:
            raise Expired(f"revision {revision!r} is older than the history kept")
        return seq

    # -- publishing ------------------------------------------------------------------------

    def _owners_of(self, route: str) -> Owners:
        kinds = self.service.kinds
        # claimed_in, not claims: the index keeps CRs encoded, and only namespaces are needed.
        return tuple((kinds[plural].name, ns) for plural, ns in self.index.claimed_in(route))

    def _activate(self, view: str) -> None:
        """Start following a view: its current items become the published state."""
        if view in self._last:
            return
        routes = self.index.routes()
        if not self._last:
            self._owners = {route: self._owners_of(route) for route in routes}
        line = self.service.line
        self._last[view] = {route: line(view, route) for route in routes}
        self._view_since[view] = self._seq

    def _changed(self, routes: set[str]) -> None:
        """The index listener: publish what really changed on the touched routes."""
        if not self._last:
            return  # nobody has watched yet: nothing to compare or to tell
        appended = False
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
                self._append(view, route, before, after, old_owners, owners)
                appended = True
        if appended:
            self._chunks.clear()
            self._drop_slow()
            self._wake_soon()

    def _append(
        self,
        view: str,
        route: str,
        before: bytes | None,
        after: bytes | None,
        owners_before: Owners,
        owners_after: Owners,
    ) -> None:
        self._seq += 1
        self._history.append(
            Change(self._seq, view, route, before, after, owners_before, owners_after)
        )
        if len(self._history) > 2 * self.history_size:
            # Trimmed in halves, so appending stays amortised O(1).
            extra = len(self._history) - self.history_size
            del self._history[:extra]
            self._base += extra

    def _drop_slow(self) -> None:
        for watcher in [w for w in self.watchers if w.sending]:
            if self._seq - watcher.cursor > self.queue:
                self.drop(watcher, "slow")

    def drop(self, watcher: Watcher, reason: str) -> None:
        """End a stream from outside it (its writer may be stuck on a full socket)."""
        if watcher.dropped is not None:
            return
        watcher.dropped = reason
        self.metrics.watchers_dropped.labels(reason).inc()
        if watcher.task is not None:
            watcher.task.cancel()

    def _wake_soon(self) -> None:
        """Wake the watchers after `flush_seconds`: the changes of a burst go out together, so
        a thousand streams cost a thousand writes per flush, not per change."""
        if self.flush_seconds <= 0:
            self._wake_all()
        elif self._wake_timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # changed outside the loop (a test): nobody can be waiting
                self._wake_all()
                return
            self._wake_timer = loop.call_later(self.flush_seconds, self._wake_all)

    def _wake_all(self) -> None:
        self._wake_timer = None
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
        self._wake = None

    async def _wait(self) -> None:
        if self._wake is None:
            self._wake = asyncio.get_running_loop().create_future()
        # Shielded: one watcher's cancellation must not cancel the future all others await.
        await asyncio.shield(self._wake)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._ticker = asyncio.create_task(self._tick(), name="feed-bookmarks")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.bookmark_seconds)
            self._bookmark_round += 1
            self._wake_all()

    def close_all(self) -> None:
        """End every stream cleanly (after what it has already taken); refuse new ones."""
        self.closing = True
        self._wake_all()

    async def stop(self) -> None:
        self.close_all()
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None

    # -- streams ---------------------------------------------------------------------------

    def open(
        self,
        view: str,
        kind: str | None,
        since: str | None = None,
        visible: Visible | None = None,
        sse: bool = False,
    ) -> Watcher:
        """Register a stream; raises Closing, TooManyWatchers or Expired."""
        if self.closing:
            raise Closing("the server is shutting down")
        if len(self.watchers) >= self.max_watchers:
            raise TooManyWatchers(f"{self.max_watchers} change streams are open already")
        if since is not None:
            cursor = self.parse(since, view)
            self._activate(view)
        else:
            self._activate(view)
            cursor = self._seq
        watcher = Watcher(view, kind, visible, cursor, sse)
        watcher.initial = since is None
        watcher.bookmarks = self._bookmark_round
        self.watchers.add(watcher)
        self.metrics.watchers.set(len(self.watchers))
        return watcher

    def close(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)
        self.metrics.watchers.set(len(self.watchers))

    async def serve(self, watcher: Watcher, write: Callable[[bytes], Awaitable[None]]) -> None:
        """Write the watcher's events with `write` until it is dropped or the feed closes.

        `Feed.drop` cancels the task running this when the watcher falls too far behind.
        """
        watcher.task = asyncio.current_task()

        async def send(chunk: bytes, events: int) -> None:
            watcher.sending = True
            try:
                await write(chunk)
            finally:
                watcher.sending = False
            self.metrics.stream_events.inc(events)

        if watcher.initial:
            await self._initial(watcher, send)
        while not self.closing and watcher.dropped is None:
            if watcher.cursor < self._seq:
                await self._replay(watcher, send)
            elif watcher.bookmarks != self._bookmark_round:
                watcher.bookmarks = self._bookmark_round
                watcher.forget_visibility()
                await send(self.bookmark(watcher), 1)
            else:
                await self._wait()

    async def _initial(self, watcher: Watcher, send: Send) -> None:
        # Taken in one go (no await between), so the snapshot is the state at `cursor`; and
        # taken now, not at `open`: changes made while the response started are in it.
        watcher.cursor = self._seq
        last = self._last[watcher.view]
        routes = list(self.index.routes(watcher.kind))
        items = [(route, last[route], self._owners.get(route, ())) for route in routes]
        revision = self.revision(watcher.cursor).encode()
        chunk: list[bytes] = []
        for route, item, owners in items:
            if watcher.visible is not None and not await watcher.sees(owners):
                continue
            chunk.append(self._encode("ADDED", route, item, revision, watcher.sse))
            if len(chunk) >= INITIAL_CHUNK:
                await send(b"".join(chunk), len(chunk))
                chunk = []
        chunk.append(self.bookmark(watcher, initial=True))
        await send(b"".join(chunk), len(chunk))
        watcher.initial = False

    async def _replay(self, watcher: Watcher, send: Send) -> None:
        start = watcher.cursor + 1
        if start < self._base:
            # Fell out of the history without being caught writing (_drop_slow ends those).
            watcher.dropped = "slow"
            self.metrics.watchers_dropped.labels("slow").inc()
            return
        offset = start - self._base
        batch = self._history[offset : offset + BATCH]
        watcher.cursor = batch[-1].seq
        if watcher.visible is None:
            # Watchers that are level with each other get the same bytes: encoded once.
            key = (start, watcher.cursor, watcher.view, watcher.kind, watcher.sse)
            shared = self._chunks.get(key)
            if shared is None:
                shared = self._chunks[key] = self._chunk(watcher, batch)
            chunk, count = shared
        else:
            lines = []
            for change in batch:
                if change.view == watcher.view:
                    was = await watcher.sees(change.owners_before)
                    now = await watcher.sees(change.owners_after)
                    encoded = self._event(change, was, now, watcher.sse)
                    if encoded is not None:
                        lines.append(encoded)
            chunk, count = b"".join(lines), len(lines)
        if count:
            await send(chunk, count)

    def _chunk(self, watcher: Watcher, batch: list[Change]) -> tuple[bytes, int]:
        kind, sse = watcher.kind, watcher.sse
        lines = []
        for change in batch:
            if change.view == watcher.view:
                was = _present(change.owners_before, kind)
                now = _present(change.owners_after, kind)
                encoded = self._event(change, was, now, sse)
                if encoded is not None:
                    lines.append(encoded)
        return b"".join(lines), len(lines)

    def _event(self, change: Change, was: bool, now: bool, sse: bool) -> bytes | None:
        if now:
            type_ = "MODIFIED" if was else "ADDED"
        elif was:
            type_ = "DELETED"
        else:
            return None
        key = (type_, sse)
        encoded = change.encoded.get(key)
        if encoded is None:
            item = change.after if now else change.before
            assert item is not None
            revision = self.revision(change.seq).encode()
            encoded = change.encoded[key] = self._encode(type_, change.route, item, revision, sse)
        return encoded

    def bookmark(self, watcher: Watcher, initial: bool = False) -> bytes:
        revision = self.revision(max(watcher.cursor, 0))
        event: dict[str, object] = {"type": "BOOKMARK", "revision": revision}
        if initial:
            event["initial"] = True
        return self.frame(orjson.dumps(event), revision.encode(), watcher.sse)

    def error(self, watcher: Watcher, code: str, message: str) -> bytes:
        event = {"type": "ERROR", "error": {"code": code, "message": message}}
        revision = self.revision(watcher.cursor).encode()
        return self.frame(orjson.dumps(event), revision, watcher.sse)

    @staticmethod
    def _encode(type_: str, route: str, item: bytes, revision: bytes, sse: bool) -> bytes:
        line = b'{"type":"%b","route":%b,"object":%b,"revision":"%b"}' % (
            type_.encode(),
            orjson.dumps(route),
            item,
            revision,
        )
        return Feed.frame(line, revision, sse)

    @staticmethod
    def frame(line: bytes, revision: bytes, sse: bool) -> bytes:
        if sse:
            return b"id: %b\ndata: %b\n\n" % (revision, line)
        return line + b"\n"
