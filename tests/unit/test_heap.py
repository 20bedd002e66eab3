"""The collector is held off while bulk changes run in turns, and always given back."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from slo_api import heap
from slo_api import index as index_module
from tests.unit.test_feed import make_feed
from tests.unit.test_index_cache import LLM, cr
from tests.unit.test_index_relist import GROUP, make_index
from tests.unit.test_index_relist import cr as relist_cr


@pytest.fixture(autouse=True)
def collector_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    assert heap._holds == 0, "a hold was never released"
    gc.unfreeze()  # what a bulk change froze: the rest of the tests' heap
    if not was:
        gc.disable()


class Collections:
    """Records the manual collections heap asks for (they still run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.generations: list[int] = []
        real = gc.collect

        def collect(generation: int = 2) -> int:
            self.generations.append(generation)
            return real(generation)

        monkeypatch.setattr(gc, "collect", collect)


def test_holds_nest_and_only_the_last_release_gives_the_collector_back() -> None:
    heap.hold()
    heap.hold()
    assert not gc.isenabled()
    heap.release()
    assert not gc.isenabled()
    heap.release()
    assert gc.isenabled()


def test_a_collector_disabled_before_the_first_hold_stays_disabled() -> None:
    gc.disable()
    heap.hold()
    heap.release()
    assert not gc.isenabled()
    gc.enable()


async def test_a_relist_in_turns_collects_only_between_turns_then_freezes_in_a_turn_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    collections = Collections(monkeypatch)
    many = 3 * index_module.REPLACE_TURN
    index = make_index()
    index.reached(LLM, GROUP, None, "1")
    enabled_between_turns: list[bool] = []
    relist = asyncio.create_task(
        index.replace_in_turns(LLM, [relist_cr(f"c{i}", "1", f"r{i}") for i in range(many)], GROUP)
    )
    await asyncio.sleep(0)
    while index.replacing:
        enabled_between_turns.append(gc.isenabled())
        await asyncio.sleep(0)
    await relist
    assert enabled_between_turns
    assert not any(enabled_between_turns)
    young = list(collections.generations)
    assert young  # one after each turn but the last
    assert all(g in (0, 1) for g in young)
    assert not gc.isenabled()  # not before the heap is frozen
    frozen = gc.get_freeze_count()
    await asyncio.sleep(0)  # which is done on a turn of its own, after a young collection
    assert collections.generations[len(young) :] == [1]
    assert gc.get_freeze_count() > frozen
    assert gc.isenabled()


async def test_a_bulk_change_starting_before_the_full_collection_gives_the_collector_back() -> None:
    heap.hold()
    heap.release()  # the freeze is due on the next turn
    heap.hold()  # but another bulk change starts first
    await asyncio.sleep(0)
    assert not gc.isenabled()
    heap.release()
    await asyncio.sleep(0)
    assert gc.isenabled()


async def test_a_relist_cancelled_half_way_gives_the_collector_back() -> None:
    index = make_index()
    index.reached(LLM, GROUP, None, "1")
    many = 3 * index_module.REPLACE_TURN
    relist = asyncio.create_task(
        index.replace_in_turns(LLM, [relist_cr(f"c{i}", "1", f"r{i}") for i in range(many)], GROUP)
    )
    await asyncio.sleep(0)
    assert not gc.isenabled()
    relist.cancel()
    with pytest.raises(asyncio.CancelledError):
        await relist
    await asyncio.sleep(0)
    assert gc.isenabled()


async def test_the_change_log_recording_over_turns_holds_the_collector_even_if_a_chunk_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("slo_api.feed.history.CHUNK", 2)
    feed = make_feed()
    feed.log.follow("summary")  # a view someone watches: its changes are recorded
    index = feed.index
    real = feed.service.line
    calls = 0

    def line(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("a bug in one chunk")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(feed.service, "line", line)
    index.reached(LLM, GROUP, None, "5")
    index.replace(LLM, [cr("a", f"n{i}", f"r{i}", rv=5) for i in range(7)], GROUP)
    assert feed.log.pending
    held_while_pending: list[bool] = []
    loop = asyncio.get_running_loop()
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda *_: None)  # the failing chunk's error, logged by the loop
    try:
        while feed.log.pending:
            held_while_pending.append(not gc.isenabled())
            await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(handler)
    assert held_while_pending
    assert all(held_while_pending)
    await asyncio.sleep(0)
    assert gc.isenabled()
    assert calls > 3  # the chunks after the failing one were recorded too


async def test_a_relist_of_one_turn_leaves_the_collector_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The usual relist (few CRs, or few changed): no hold, and no collection after it.
    collections = Collections(monkeypatch)
    index = make_index()
    index.reached(LLM, GROUP, None, "1")
    await index.replace_in_turns(LLM, [relist_cr(f"c{i}", "1", f"r{i}") for i in range(10)], GROUP)
    await asyncio.sleep(0)
    assert collections.generations == []
    assert gc.isenabled()
