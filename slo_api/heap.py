"""When the cyclic garbage collector runs, around the index's bulk work.

A full collection scans every tracked object that is not frozen; at 100,000 routes that is
90 ms or more, spent wherever an allocation happens to trip it: inside a turn of the event
loop that is already busy. Two rules keep it out of the way. While a relist is applied in
turns nothing is collected by itself: the young generations are collected between turns,
where each collection is short. And the heap alive after the first sync, and again after each
bulk change once its last turn is done, is frozen: never scanned again (what was alive is
still freed when its last reference goes; only a reference cycle among it would no longer be
collected, and the full collection this replaces found none after a relist of 100,000 CRs).
"""

from __future__ import annotations

import asyncio
import gc

# Between two turns of a bulk change the youngest generation is collected; every this many
# turns the middle one too (what survived the turns since: a few milliseconds).
MIDDLE_EVERY = 10

_holds = 0
# Whether the collector is to run by itself again once nothing holds it (it did before).
_enable = False


def freeze_alive() -> None:
    """Collect everything once, then freeze what is left (after the first sync)."""
    gc.collect()
    gc.freeze()


def hold() -> None:
    """No automatic collection until every `hold()` is released; relists of several kinds
    after one outage run at once, and the change log records them after the index."""
    global _holds, _enable
    if _holds == 0 and gc.isenabled():
        _enable = True
        gc.disable()
    _holds += 1


def release() -> None:
    global _holds, _enable
    _holds -= 1
    if _holds == 0 and _enable:
        # In a turn of its own, and before the collector runs by itself again: else the next
        # allocation to trip a full collection would scan all the bulk change left, inside
        # whatever turn that is (and every full collection after it would again).
        try:
            asyncio.get_running_loop().call_soon(_freeze_and_enable)
        except RuntimeError:  # no loop: the collector's own time
            _enable = False
            gc.enable()


def _freeze_and_enable() -> None:
    global _enable
    if _holds == 0 and _enable:  # else a new bulk change holds it, and enables it after
        _enable = False
        gc.collect(1)  # the young generations' garbage is not frozen with the rest
        gc.freeze()
        gc.enable()


def between_turns(turn: int) -> None:
    """What a bulk change that holds the collector collects after its `turn`th turn."""
    gc.collect(1 if turn % MIDDLE_EVERY == MIDDLE_EVERY - 1 else 0)
