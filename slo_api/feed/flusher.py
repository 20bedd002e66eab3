"""When streams are woken, and the bytes they are given.

Changes go out together, `flush_seconds` after the first of a burst: a thousand streams then
cost a thousand writes per flush, not per change. Each stream waits on its history's signal,
so a change wakes only the streams it may concern. What a stream is given is framed once for
every stream at the same place in the same history with the same access: level streams (the
usual case) share one batch of bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from slo_api.feed.history import ChangeLog, History
from slo_api.feed.registry import Stream
from slo_api.service import Allowed

# Most bytes per write: what a stream holds beyond the history's shared bytes is one write.
WRITE_BYTES = 256 * 1024
BATCHES = 256  # shared batches kept
BatchKey = tuple[int, int, int, str | None, bool, Allowed | None]


class Flusher:
    def __init__(self, log: ChangeLog, flush_seconds: float) -> None:
        self.log = log
        self.flush_seconds = flush_seconds
        self.round = 0  # bumped by each bookmark tick
        self._signals: dict[int, asyncio.Future[None]] = {}
        self._due: set[int] = set()
        self._timer: asyncio.TimerHandle | None = None
        # By (history, cursor, newest sequence, kind, format, access): level streams share.
        self._batches: dict[BatchKey, tuple[bytes, int, int]] = {}
        log.listeners.append(self.changed)

    # -- waking ----------------------------------------------------------------------------

    def changed(self, histories: list[History]) -> None:
        self._due.update(id(h) for h in histories)
        if self.flush_seconds <= 0:
            self.flush()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # changed outside the loop (a test): nobody can be waiting
                self.flush()
                return
            self._timer = loop.call_later(self.flush_seconds, self.flush)

    def flush(self) -> None:
        self._timer = None
        due, self._due = self._due, set()
        for key in due:
            self._wake(key)

    def wake_all(self) -> None:
        for key in list(self._signals):
            self._wake(key)

    def tick(self) -> None:
        self.round += 1
        self.wake_all()

    def _wake(self, key: int) -> None:
        signal = self._signals.pop(key, None)
        if signal is not None and not signal.done():
            signal.set_result(None)

    async def wait(self, history: History) -> None:
        signal = self._signals.get(id(history))
        if signal is None:
            signal = self._signals[id(history)] = asyncio.get_running_loop().create_future()
        # Shielded: one stream's cancellation must not cancel what the others await.
        await asyncio.shield(signal)

    # -- batches ---------------------------------------------------------------------------

    def batch(self, stream: Stream) -> tuple[bytes, int, int]:
        """The next bytes for a stream after its cursor, their event count, and the sequence
        they bring it to (the newest one when they are all it was missing)."""
        history = stream.history
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
        position: Callable[[int], bytes] = self.log.position
        kind, allowed, sse = stream.kind, stream.allowed, stream.sse
        # Static tokens (allowed None) see every `pool`: nothing to choose per change.
        full_view = self.log.service.full_view if allowed is not None else None
        lines = []
        for change in changes:
            encoded = change.event(kind, allowed, sse, position, full_view)
            if encoded is not None:
                lines.append(encoded)
        # Read to the end: nothing newer concerns this history, so the stream is level with
        # the whole log (its bookmarks may name the newest revision).
        return b"".join(lines), len(lines), self.log.seq if complete else upto
