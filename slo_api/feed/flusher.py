"""When streams are given their bytes, and the bytes they are given.

Changes go out together, `flush_seconds` after the first of a burst: a thousand streams then
cost a thousand writes per flush, not per change. A flush hands the bytes to the streams of
each history that changed (`deliver`), with no task woken per stream, `PASS_STREAMS` streams
per turn of the event loop, so a request waits for a slice of a flush, not all of it. What
a stream is given is framed once for every stream at the same place in the same history with
the same access: level streams (the usual case) share one batch of bytes.

A write is a system call per stream: with thousands of streams one flush takes a good part of
a second (and on a busy node more of the CPU than the loop thread's clock shows: the kernel's
side of the writes, the clients' reads). The next flush then comes later than
`flush_seconds` (`LOOP_SHARE`): flushing takes at most that share of the event loop, requests
keep the rest, and each flush carries more changes per write instead of falling behind; but
never later than `MAX_SPACING_SECONDS`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from slo_api.feed.history import ChangeLog, History, reached_by
from slo_api.feed.registry import Stream
from slo_api.service import Allowed

# Most bytes per write: what a stream holds beyond the history's shared bytes is one write.
WRITE_BYTES = 256 * 1024
BATCHES = 256  # shared batches kept
PASS_STREAMS = 500  # streams a flush writes per turn of the event loop
LOOP_SHARE = 0.1  # most of the event loop's time that flushes take
# However long flushes take, changes go out at least this often: spacing them further makes
# each write larger, and so each flush longer.
MAX_SPACING_SECONDS = 0.5
# The loop thread's own CPU: on a busy node, time the process waited for a core is no cost
# of the flush's (and must not space the next one).
clock = time.thread_time
BatchKey = tuple[int, int, int, str | None, bool, Allowed | None]
Deliver = Callable[[Iterable[Stream]], None]


class Flusher:
    def __init__(self, log: ChangeLog, flush_seconds: float, deliver: Deliver) -> None:
        self.log = log
        self.flush_seconds = flush_seconds
        self.deliver = deliver
        self.round = 0  # bumped by each bookmark tick
        # The streams past their initial state, by history: what a flush hands bytes to. In
        # the order they joined (a dict, not a set): a flush then walks the streams' objects,
        # and the server's behind them, in about the order they were made, as they lie in
        # memory; in hash order the same pass took a fifth longer, in cache misses.
        self._live: dict[int, dict[Stream, None]] = {}
        self._due: set[int] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._passing = False  # a flush is writing its slices
        self._pass_seconds = 0.0  # how long the last flush's slices took in all
        # By (history, cursor, newest sequence, kind, format, access): level streams share.
        self._batches: dict[BatchKey, tuple[bytes, int, int]] = {}
        log.listeners.append(self.changed)

    # -- streams ---------------------------------------------------------------------------

    def join(self, stream: Stream) -> None:
        self._live.setdefault(id(stream.history), {})[stream] = None

    def leave(self, stream: Stream) -> None:
        live = self._live.get(id(stream.history))
        if live is not None:
            live.pop(stream, None)
            if not live:
                del self._live[id(stream.history)]

    # -- when ------------------------------------------------------------------------------

    def changed(self, histories: list[History]) -> None:
        self._due.update(id(h) for h in histories)
        if self.flush_seconds <= 0 or not _in_loop():
            self.flush()  # outside the loop (a test): nobody can be waiting
        elif self._timer is None and not self._passing:
            self._schedule()

    def _schedule(self) -> None:
        spaced = min(self._pass_seconds * (1 - LOOP_SHARE) / LOOP_SHARE, MAX_SPACING_SECONDS)
        delay = max(self.flush_seconds, spaced)
        self._timer = asyncio.get_running_loop().call_later(delay, self.flush)

    def flush(self) -> None:
        self._timer = None
        due, self._due = self._due, set()
        streams = [s for key in due for s in list(self._live.get(key, ()))]
        if self.flush_seconds <= 0 or len(streams) <= PASS_STREAMS or not _in_loop():
            began = clock()
            self.deliver(streams)
            self._pass_seconds = clock() - began
            return
        self._passing = True
        self._pass_seconds = 0.0
        self._slice(streams, 0)

    def _slice(self, streams: list[Stream], start: int) -> None:
        began = clock()
        try:
            self.deliver(streams[start : start + PASS_STREAMS])
        finally:
            self._pass_seconds += clock() - began
            if start + PASS_STREAMS < len(streams):
                asyncio.get_running_loop().call_soon(self._slice, streams, start + PASS_STREAMS)
            else:
                self._passing = False
                if self._due:
                    self._schedule()

    def wake_all(self) -> None:
        self.deliver([s for live in list(self._live.values()) for s in list(live)])

    def tick(self) -> None:
        self.round += 1
        self.wake_all()

    # -- batches ---------------------------------------------------------------------------

    def batch(self, stream: Stream) -> tuple[bytes, int, int]:
        """The next bytes for a stream after its cursor, their event count, and the sequence
        they bring it to (the newest one when they are all it was missing)."""
        history, reached = stream.history, stream.reached
        if reached is not None:
            # Resumed from another process's revision: its own batches (see _build) till it
            # reads to the end once nothing recorded from then on can be what it had.
            caught_up = self.log.caught_up(reached)
            built = self._build(stream)
            if caught_up and built[2] == self.log.seq:
                stream.reached = None
                stream.resent = set()
            return built
        key = (id(history), stream.cursor, self.log.seq, stream.kind, stream.sse, stream.allowed)
        found = self._batches.get(key)
        if found is None:
            found = self._build(stream)
            if len(self._batches) >= BATCHES:
                self._batches.clear()
            self._batches[key] = found
        return found

    def _build(self, stream: Stream) -> tuple[bytes, int, int]:
        changes, upto, complete = stream.history.after(stream.cursor, WRITE_BYTES)
        reached = stream.reached
        if reached is not None:
            # Not what its revision had seen (ChangeLog.parse), unless it was sent a later
            # item of that route already.
            resent = stream.resent
            kept = []
            for entry in changes:
                change = entry[1]
                if change.route in resent or not reached_by(change.source, entry[0][1], reached):
                    resent.add(change.route)
                    kept.append(entry)
            changes = kept
        position: Callable[[int], bytes] = self.log.position
        kind, allowed, sse = stream.kind, stream.allowed, stream.sse
        # Static tokens (allowed None) see every `pool`: nothing to choose per change.
        full_view = self.log.service.full_view if allowed is not None else None
        # Till it caught up, a resumed stream's positions may stand above every other's.
        floor = stream.floor if reached is not None else None
        lines = []
        for at, change in changes:
            own = None if floor is None else self.log.position_above(at[0], floor)
            encoded = change.event(kind, allowed, sse, position, at, full_view, own)
            if encoded is not None:
                lines.append(encoded)
        # Read to the end: nothing newer concerns this history, so the stream is level with
        # the whole log (its bookmarks may name the newest revision).
        return b"".join(lines), len(lines), self.log.seq if complete else upto


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
