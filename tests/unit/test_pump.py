"""A write driven from callbacks: at once when it need not wait, later when it must."""

from __future__ import annotations

import asyncio

from slo_api.feed.pump import Pump


async def test_a_write_that_need_not_wait_is_done_at_once() -> None:
    done: list[Pump] = []
    out: list[bytes] = []

    async def write(chunk: bytes) -> None:
        out.append(chunk)

    assert Pump.start(write(b"a"), done.append) is None
    assert out == [b"a"]
    assert done == []  # only a write that waited is told about


async def test_a_write_that_waits_goes_on_when_what_it_waits_for_is_done() -> None:
    done: list[Pump] = []
    gate = asyncio.Event()
    out: list[bytes] = []

    async def write(chunk: bytes) -> None:
        await asyncio.sleep(0)
        await gate.wait()
        out.append(chunk)

    pump = Pump.start(write(b"a"), done.append)
    assert pump is not None
    assert not pump.finished
    for _ in range(3):
        await asyncio.sleep(0)
    assert out == []
    assert done == []
    gate.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert out == [b"a"]
    assert done == [pump]
    assert pump.finished
    assert pump.error is None


async def test_a_failed_write_says_why_and_an_abandoned_one_is_closed() -> None:
    async def broken(chunk: bytes) -> None:
        raise ConnectionResetError("gone")

    failed = Pump.start(broken(b"a"), lambda p: None)
    assert failed is not None
    assert failed.finished
    assert isinstance(failed.error, ConnectionResetError)

    closed: list[bool] = []
    done: list[Pump] = []

    async def stuck(chunk: bytes) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            closed.append(True)

    pump = Pump.start(stuck(b"a"), done.append)
    assert pump is not None
    pump.abandon()
    assert closed == [True]
    await asyncio.sleep(0)
    assert done == []


async def test_an_awaitable_that_is_not_a_coroutine_is_stepped_through_its_await() -> None:
    done: list[Pump] = []
    ready = asyncio.get_running_loop().create_future()
    ready.set_result(None)
    assert Pump.start(ready, done.append) is None

    later = asyncio.get_running_loop().create_future()
    pump = Pump.start(later, done.append)
    assert pump is not None
    assert not pump.finished
    later.set_result(None)
    await asyncio.sleep(0)
    assert done == [pump]
    assert pump.finished
    assert pump.error is None
