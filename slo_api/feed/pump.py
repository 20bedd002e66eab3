"""A write driven from callbacks instead of a task.

The flusher hands each stream its bytes in one pass. A stream's write (the ASGI `send`) almost
always finishes at once: the socket takes the bytes. Started here, such a write costs no task,
no wake-up and no turn of the event loop; one that must wait (the client's socket is full) is
carried on by the callback of what it waits for, as a task would carry it, and says when it is
done. One stream waiting costs the others nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any

# A stream's write: what it returns is stepped through its `__await__`, with no task.
Write = Callable[[bytes], Awaitable[None]]


class Pump:
    """Runs `write` (an awaitable) as far as it goes now; `finished` says whether it got to
    its end.

    When it did not, `done(self)` is called once it does (`error` holds what it raised, if
    anything). `abandon()` drops it where it waits: `done` is then never called.
    """

    __slots__ = ("_coro", "_done", "error", "finished")

    def __init__(self, write: Awaitable[Any], done: Callable[[Pump], None]) -> None:
        self._coro: Generator[Any, None, Any] | None = write.__await__()
        self._done = done
        self.finished = False
        self.error: BaseException | None = None
        self._step()

    def _step(self) -> None:
        coro = self._coro
        assert coro is not None
        try:
            waited = coro.send(None)
        except StopIteration:
            self.finished = True
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a cancelled future it waited for raises in it, too
            self.finished = True
            self.error = exc
        else:
            if waited is None:  # a bare yield (asyncio.sleep(0)): the next turn of the loop
                asyncio.get_running_loop().call_soon(self._resume)
            else:  # an asyncio future, as a task would be given it
                waited._asyncio_future_blocking = False
                waited.add_done_callback(self._resume)
            return
        self._coro = None

    def _resume(self, _: object = None) -> None:
        if self._coro is None:
            return  # abandoned
        self._step()
        if self.finished:
            self._done(self)

    def abandon(self) -> None:
        coro, self._coro = self._coro, None
        if coro is not None:
            coro.close()
