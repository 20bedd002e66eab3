"""The change feed behind `GET /config?watch=true`: streams opened, served and ended.

The pieces, each with one job: `history` (what was published, what is kept for resuming),
`registry` (the open streams, their caps and access), `flusher` (when streams wake and the
shared bytes they get) and `framing` (NDJSON and SSE, shared with the HTTP layer).

Nothing a stream's client does (reading slowly, not at all) blocks the watch loops or
another stream: a stream costs its history nothing until the history is over its byte bound,
and a stream that has not written what must then be dropped is ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable

from slo_api.feed import framing
from slo_api.feed.flusher import WRITE_BYTES, Flusher
from slo_api.feed.history import BLOCK, VIEWS, ChangeLog, Expired, History, versions_of
from slo_api.feed.pump import Pump, Write
from slo_api.feed.registry import Registry, Stream, StreamAccess
from slo_api.metrics import Metrics
from slo_api.service import Allowed, Service, shown

log = logging.getLogger("slo_api.feed")

FLUSH_SECONDS = 0.1
# A resume from another replica that is ahead of this one's informers waits this long at
# most for them to catch up (it then goes on: what they bring later follows anyway).
RESUME_WAIT_SECONDS = 3.0
# After SIGTERM, how long a stream may take to write what it has before it is cut: a client
# that stopped reading must not hold the process past its grace period.
STOP_WRITE_SECONDS = 2.0
# ERROR codes after which a client resumes with `since`: the stream's last bookmark precedes it.
RESUMABLE = frozenset({"unavailable"})


class Closing(Exception):
    """The process is shutting down: no new streams."""


class Feed:
    def __init__(
        self,
        service: Service,
        metrics: Metrics,
        *,
        history_bytes: int,
        max_streams: int,
        streams_per_identity: int,
        bookmark_seconds: float,
        access_seconds: float = 10.0,
        review_grace_seconds: float = 300.0,
        flush_seconds: float = FLUSH_SECONDS,
        lifetime_seconds: float = 1800.0,
        by: Callable[[int], object] | None = None,
    ) -> None:
        self.service = service
        self.index = service.index
        self.metrics = metrics
        # `by`: who made the change the index stores at a resourceVersion (the route history).
        self.log = ChangeLog(service, history_bytes, by)
        # Trimmed before the flusher hears of the changes: a stream left behind is ended first.
        self.log.listeners.append(self._trim)
        self.flusher = Flusher(self.log, flush_seconds, self._deliver_all)
        self.registry = Registry(max_streams, streams_per_identity, review_grace_seconds)
        self.bookmark_seconds = bookmark_seconds
        self.access_seconds = access_seconds
        self.lifetime_seconds = lifetime_seconds
        self.closing = False
        # The summary view (what programs follow) from the start, so a stream moved here from
        # another replica finds the history it resumes in; the full view from its first
        # stream (rendering every route's full item costs CPU and memory nobody may need).
        self.log.history("summary", None)
        self._tasks: list[asyncio.Task[None]] = []
        self._force: asyncio.TimerHandle | None = None
        self._waiting: dict[Pump, Stream] = {}  # writes under way, for when they are done
        self._checks: set[asyncio.Task[None]] = set()  # access checks of streams held back

    @property
    def streams(self) -> set[Stream]:
        return self.registry.streams

    def revision(self, seq: int) -> str:
        return self.log.revision(seq)

    @property
    def head(self) -> int:
        return self.log.seq

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(
                self._every(self.bookmark_seconds, self._bookmarks), name="feed-bookmarks"
            ),
            asyncio.create_task(
                self._every(self.access_seconds, self._recheck), name="feed-access"
            ),
        ]

    async def _every(self, seconds: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await job()
            except Exception:
                # Supervised: a bug in one round must not end bookmarks or re-checks for good.
                log.exception("change feed housekeeping failed")

    async def _bookmarks(self) -> None:
        self.flusher.tick()

    async def _recheck(self) -> None:
        for stream, code, message in await self.registry.recheck():
            self.end(stream, code, message)
        # Streams held back for a place their access was not asked about go on if it now is.
        version = self.index.places_version
        self._deliver_all(
            [s for s in self.registry.streams if s.allowed is not None and s.places != version]
        )

    def close_all(self) -> None:
        """End every stream (after what it is writing); refuse new ones. A stream still
        writing `STOP_WRITE_SECONDS` later (its client stopped reading) is cut."""
        if self.closing:
            return
        self.closing = True
        self.flusher.wake_all()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._force = loop.call_later(STOP_WRITE_SECONDS, self._cut_all)

    def _cut_all(self) -> None:
        for stream in list(self.registry.streams):
            self._cancel(stream)

    async def stop(self) -> None:
        self.close_all()
        for task in [*self._tasks, *self._checks]:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    # -- streams ---------------------------------------------------------------------------

    def open(
        self,
        view: str,
        kind: str | None,
        since: str | None = None,
        *,
        sse: bool = False,
        access: StreamAccess | None = None,
        allowed: Allowed | None = None,
    ) -> Stream:
        """Register a stream; raises Closing, TooManyStreams or Expired."""
        if self.closing:
            raise Closing("the server is shutting down")
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}")
        if since is not None and (view, kind) not in self.log.histories:
            # Nobody here watched this kind alone: resume in the view's history, filtered.
            history = self.log.history(view, None)
        else:
            history = self.log.history(view, kind)
        cursor, floor = (self.log.seq, None) if since is None else self.log.parse(since, history)
        stream = Stream(history, kind, sse, cursor, access, allowed, initial=since is None)
        if floor is not None:
            stream.floor, stream.reached = floor, versions_of(floor)
        stream.bookmarks = self.flusher.round
        self.registry.add(stream)
        self.metrics.watchers.set(len(self.registry))
        return stream

    async def settle(self, since: str) -> None:
        """Before resuming from another replica's revision: give this one's informers a
        moment to reach the versions it names."""
        try:
            versions = self.log.versions(since)
        except Expired:
            return  # open() says so
        if not versions:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESUME_WAIT_SECONDS
        while any(self.log.versions_reached().get(s, -1) < v for s, v in versions.items()):
            if loop.time() > deadline:
                log.info("resuming a change stream before this replica caught up with it")
                return
            await asyncio.sleep(0.05)

    def close(self, stream: Stream) -> None:
        self.registry.discard(stream)
        self.metrics.watchers.set(len(self.registry))

    def end(self, stream: Stream, code: str, message: str) -> None:
        """End a stream from outside it, with an ERROR line (its writer may be stuck)."""
        if self._mark_ended(stream, code, message):
            self._cancel(stream)

    def _mark_ended(self, stream: Stream, code: str, message: str) -> bool:
        if stream.ended is not None:
            return False
        stream.ended = (code, message)
        self.metrics.watchers_dropped.labels(code).inc()
        return True

    def retire(self, stream: Stream) -> None:
        """End a stream whose lifetime is over with a last bookmark of where it got to."""
        stream.retired = True
        if stream.finished is not None and not stream.finished.done():
            stream.finished.set_result(None)  # its task writes the last line

    def gone(self, stream: Stream) -> None:
        """The client went away."""
        stream.gone = True
        self._cancel(stream)

    def _cancel(self, stream: Stream) -> None:
        # Only while it is in serve(): its last write has a timeout of its own.
        if stream.serving and not stream.cancelled and stream.task is not None:
            stream.cancelled = True
            stream.task.cancel()

    def _trim(self, histories: list[History]) -> None:
        for history in histories:
            before = history.floor
            floor = history.trim()
            if floor == before:
                continue
            for stream in self.registry.on(history):
                if stream.cursor < floor:
                    self.end(
                        stream,
                        code="too_slow",
                        message="the stream fell further behind than the history keeps; "
                        "watch again without since",
                    )

    async def serve(self, stream: Stream, write: Write) -> None:
        """Write the stream's events until it is ended, its lifetime is over or the feed
        closes.

        The stream's own task writes its initial state; after it, the flusher writes to it
        (see `_deliver`) and the task only waits for the stream to be over. `Feed.end`
        cancels the task running this (the caller catches that cancellation when
        `stream.cancelled` says it was the feed's). A write that fails raises here.
        """
        stream.task = asyncio.current_task()
        stream.serving = True
        # Randomised like the API server's watch timeout: streams opened together (after a
        # rollout) do not all come back together.
        life = self.lifetime_seconds * (1 + random.random())
        lifetime = asyncio.get_running_loop().call_later(life, self.retire, stream)
        try:
            if stream.sse:
                await write(framing.preamble(True))
            if stream.initial:
                if not await self._asked_everywhere(stream):
                    return  # ended: its task writes the ERROR line
                await self._initial(stream, write)
            if self.closing or stream.retired:
                return
            stream.write = write
            finished = stream.finished = asyncio.get_running_loop().create_future()
            self.flusher.join(stream)
            self._deliver(stream)  # what came meanwhile, or all after a resume's position
            await finished
        finally:
            lifetime.cancel()
            self.flusher.leave(stream)
            if stream.pump is not None:
                self._waiting.pop(stream.pump, None)
                stream.pump.abandon()  # cut while its client was not reading
                stream.pump = None
            stream.serving = False

    def _deliver_all(self, streams: Iterable[Stream]) -> None:
        sent = 0
        for stream in streams:
            try:
                sent += self._deliver(stream)
            except Exception as exc:
                # One stream's failure ends that stream, not the flush for the others.
                if stream.finished is not None and not stream.finished.done():
                    _fail(stream.finished, exc)
        if sent:
            self.metrics.stream_events.inc(sent)

    def _deliver(self, stream: Stream) -> int:
        """Write to a stream past its initial state what it has not had yet (from the flusher:
        no task is woken); the events written.

        A write the client's socket cannot take now goes on by itself, and the stream gets
        nothing more until it is done: the history keeps what follows (bounded in bytes: a
        stream that falls behind what it keeps is ended), never a queue per stream.
        """
        finished, write = stream.finished, stream.write
        if finished is None or finished.done() or write is None or stream.pump is not None:
            return 0
        flusher, changelog = self.flusher, self.log
        sent = 0
        while True:
            if self.closing or stream.ended is not None or stream.retired:
                finished.set_result(None)  # ended: its task writes the last line
                return sent
            seq = changelog.seq
            if stream.cursor < seq:
                if stream.places != self.index.places_version and not self._places_known(stream):
                    return sent  # held back until its access there is known
                chunk, count, upto = flusher.batch(stream)
                stream.cursor = upto
                if not count:
                    stream.written = upto
                    continue
            elif stream.bookmarks != flusher.round:
                stream.bookmarks = flusher.round
                chunk = framing.bookmark(
                    changelog.revision(stream.cursor, stream.floor), stream.sse
                )
                count, upto = 1, stream.cursor
            else:
                return sent
            sent += count
            pump = Pump.start(write(chunk), self._written)
            if pump is None:
                stream.written = upto
                if upto == seq and stream.bookmarks == flusher.round:
                    return sent  # level with the log (the usual case): nothing more to look at
                continue
            if pump.error is not None:
                _fail(finished, pump.error)
            else:
                stream.pump, stream.writing_upto = pump, upto
                self._waiting[pump] = stream
            return sent

    async def _asked_everywhere(self, stream: Stream) -> bool:
        """Before an initial state: a namespace that gained its first CR since the stream's
        access was asked about is asked about now, or its routes would miss the initial
        state for good. False when that check ended the stream."""
        for _ in range(3):  # places keep appearing: the first delivery asks again
            if self._places_known(stream, start=False):
                break
            ending = await self.registry.check(stream)
            if ending is not None:
                self._mark_ended(stream, ending.code, ending.message)  # not cancelled: it returns
                return False
            if stream.unanswered_since is not None:
                break  # no answer now: the re-checks go on with the view it has
        return True

    def _places_known(self, stream: Stream, start: bool = True) -> bool:
        """Whether the stream's access was asked about every place its kinds hold CRs at now.

        A namespace that gains its first CR is asked about before any change is written to
        the stream (the check is started here with `start`, or left to the timer while
        checks fail): its ADDED then arrives on the same stream, in order, once the caller's
        rights there are known, instead of being left out of the stream for good.
        """
        access = stream.access
        if access is None or stream.allowed is None or access.settled():
            stream.places = self.index.places_version
            return True
        if start and not stream.checking and stream.unanswered_since is None:
            task = asyncio.get_running_loop().create_task(self._check(stream))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)
        return False

    async def _check(self, stream: Stream) -> None:
        ending = await self.registry.check(stream)
        if ending is not None:
            self.end(*ending)
        else:
            self._deliver_all([stream])

    def _written(self, pump: Pump) -> None:
        """A write that had to wait is done: the stream goes on from where it got to."""
        stream = self._waiting.pop(pump, None)
        if stream is None or stream.pump is not pump:
            return
        stream.pump = None
        if pump.error is not None:
            if stream.finished is not None and not stream.finished.done():
                _fail(stream.finished, pump.error)
            return
        stream.written = stream.writing_upto
        sent = self._deliver(stream)
        if sent:
            self.metrics.stream_events.inc(sent)

    async def _initial(self, stream: Stream, write: Write) -> None:
        # The snapshot's place and its route list are taken in one go (no await between).
        # Items are read as the writes go: one that changes meanwhile is sent as it is then,
        # and its change follows the initial bookmark too (whole items: the client converges).
        changelog = self.log
        at = stream.cursor = changelog.seq
        # What was published at `at` (the index may be ahead: its changes follow as events).
        last = changelog.published(stream.view)
        routes = list(self.index.routes(stream.kind))
        if changelog.pending:
            routes = [route for route in routes if route in last]
        view, kind, sse, allowed = stream.view, stream.kind, stream.sse, stream.allowed
        if allowed is None:
            # Sees every route: a join of cached blocks, shared with every such stream.
            count = 0
            for start in range(0, len(routes), BLOCK):
                data, n = changelog.block(view, sse, routes[start : start + BLOCK])
                if n:
                    await write(data)
                    count += n
            await write(framing.bookmark(changelog.revision(at), sse, initial=True))
            self.metrics.stream_events.inc(count + 1)
            stream.initial = False
            stream.written = at
            return
        frame, owners = changelog.initial_frame, changelog.owners
        chunk: list[bytes] = []
        size = count = 0
        for route in routes:
            if not shown(owners(route), kind, allowed):
                continue
            encoded = frame(view, route, sse, allowed)
            if encoded is None:
                continue  # gone since the snapshot: its DELETED follows
            chunk.append(encoded)
            size += len(encoded)
            if size >= WRITE_BYTES:
                count += len(chunk)
                await write(b"".join(chunk))
                chunk, size = [], 0
        chunk.append(framing.bookmark(changelog.revision(at), sse, initial=True))
        count += len(chunk)
        await write(b"".join(chunk))
        self.metrics.stream_events.inc(count)
        stream.initial = False
        stream.written = at

    def tail(self, stream: Stream) -> bytes:
        """The stream's last bytes: its ERROR line, or a final bookmark of where it got to
        (its lifetime is over, or the server stops): the place to resume from."""
        written = (
            None if stream.written is None else self.log.revision(stream.written, stream.floor)
        )
        if stream.ended is not None:
            code, message = stream.ended
            error = framing.error(code, message, written, stream.sse)
            if code in RESUMABLE and written is not None:
                # The place to resume from, right before the line that says to.
                return framing.bookmark(written, stream.sse) + error
            return error
        if written is None:
            return b""
        return framing.bookmark(written, stream.sse, final=True)


def _fail(finished: asyncio.Future[None], error: BaseException) -> None:
    """End a stream whose write failed: its task raises what the write did."""
    if not isinstance(error, Exception):  # a cancelled write: the client or server went
        error = ConnectionError(f"the stream's write ended: {error!r}")
    finished.set_exception(error)


__all__ = ["Closing", "Expired", "Feed", "Stream", "StreamAccess"]
