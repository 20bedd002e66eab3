"""A write driven from callbacks instead of a task.

The flusher hands each stream its bytes in one pass. A stream's write (the ASGI `send`) almost
always finishes at once: the socket takes the bytes. Started here (`Pump.start`), such a write is
one step of its coroutine: no task, no wake-up, no turn of the event loop and no object of
its own. One that must wait (the client's socket is full) is carried on by a `Pump`, from the
callback of what it waits for, as a task would carry it, and says when it is done. One stream
waiting costs the others nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator
from types import CoroutineType
from typing import Any

# A stream's write: what it returns is stepped through its `__await__`, with no task.
Write = Callable[[bytes], Awaitable[None]]
Steps = Coroutine[Any, None, Any] | Generator[Any, None, Any]


class Pump:
    """A write that did not get to its end at once.

    `done(self)` is called once it does (`error` holds what it raised, if anything).
    `abandon()` drops it where it waits: `done` is then never called.
    """

    __slots__ = ("_coro", "_done", "error", "finished")

    def __init__(
        self,
        steps: Steps | None,
        done: Callable[[Pump], None],
        error: BaseException | None = None,
    ) -> None:
        self._coro = steps
        self._done = done
        self.finished = steps is None
        self.error = error

    @classmethod
    def start(cls, write: Awaitable[Any], done: Callable[[Pump], None]) -> Pump | None:
        """Run `write` as far as it goes now: None when it got to its end, else the `Pump`
        that carries it on (or holds what it raised: `finished` and `error`)."""
        # A coroutine is stepped as it is; any other awaitable through its `__await__`.
        steps: Steps = write if type(write) is CoroutineType else write.__await__()
        try:
            waited = steps.send(None)
        except StopIteration:
            return None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            return cls(None, done, exc)
        pump = cls(steps, done)
        pump._wait(waited)
        return pump

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
            self._wait(waited)
            return
        self._coro = None

    def _wait(self, waited: Any) -> None:
        if waited is None:  # a bare yield (asyncio.sleep(0)): the next turn of the loop
            asyncio.get_running_loop().call_soon(self._resume)
        else:  # an asyncio future, as a task would be given it
            waited._asyncio_future_blocking = False
            waited.add_done_callback(self._resume)

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
