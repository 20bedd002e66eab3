"""An asyncio event loop on virtual time, for tests of waits, backoffs and wake-ups.

`loop.time()` starts at 0 and, whenever no callback is ready and no I/O is pending, jumps to the
next timer instead of waiting for it: hours of backoff run in milliseconds, and what happens
"within 3 s" is exact, whatever the machine's load. I/O still works (the selector is polled);
a loop with neither timers nor I/O waits for real, up to `IDLE_LIMIT` seconds, then fails.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
IDLE_LIMIT = 10.0


class _Selector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[Any]:
        ready: list[Any] = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            ready = super().select(IDLE_LIMIT)
            if not ready:
                raise RuntimeError("the loop has nothing to do: every task waits for ever")
            return ready
        assert self.loop is not None
        self.loop.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self.now = 0.0

    def time(self) -> float:
        return self.now


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end on a fresh virtual-time loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
