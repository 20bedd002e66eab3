"""When the cyclic garbage collector runs, around the index's bulk work.

A full collection scans every tracked object that is not frozen; at 100,000 routes that is
tens of milliseconds, spent wherever an allocation happens to trip it: inside a turn of the
event loop that is already busy applying 1,000 CRs of a relist. Two rules keep it out of
such turns. The heap alive after the first sync is frozen (never scanned again; what was
alive is still freed when its last reference goes, only a reference cycle among it would no
longer be collected). And while a relist is applied in turns nothing is collected by itself:
the young generations are collected between turns, where each collection is short, and once
the last bulk change is done a full collection runs in a turn of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator

# Between two turns of a bulk change the youngest generation is collected; every this many
# turns the middle one too (what survived the turns since: a few milliseconds).
MIDDLE_EVERY = 10

_holds = 0
_was_enabled = False


def freeze_alive() -> None:
    """Collect everything once, then freeze what is left (after the first sync)."""
    gc.collect()
    gc.freeze()


def hold() -> None:
    """No automatic collection until every `hold()` is released; relists of several kinds
    after one outage run at once, and the change log records them after the index."""
    global _holds, _was_enabled
    if _holds == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _holds += 1


def release() -> None:
    global _holds
    _holds -= 1
    if _holds == 0 and _was_enabled:
        gc.enable()
        # What the bulk change left for a full collection is scanned in a turn of its own,
        # not at the next allocation that trips it, inside whatever turn that is.
        with contextlib.suppress(RuntimeError):  # no loop: the collector's own time
            asyncio.get_running_loop().call_soon(gc.collect)


@contextlib.contextmanager
def held() -> Iterator[None]:
    hold()
    try:
        yield
    finally:
        release()


def between_turns(turn: int) -> None:
    """What a bulk change holding `held()` collects after its `turn`th turn."""
    gc.collect(1 if turn % MIDDLE_EVERY == MIDDLE_EVERY - 1 else 0)
