"""A write driven from callbacks: at once when it need not wait, later when it must."""

from __future__ import annotations

import asyncio

from slo_api.feed.pump import Pump


async def test_a_write_that_need_not_wait_is_done_at_once() -> None:
    done: list[Pump] = []
    out: list[bytes] = []

    async def write(chunk: bytes) -> None:
        out.append(chunk)

    pump = Pump(write(b"a"), done.append)
    assert pump.finished
    assert pump.error is None
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

    pump = Pump(write(b"a"), done.append)
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

    failed = Pump(broken(b"a"), lambda p: None)
    assert failed.finished
    assert isinstance(failed.error, ConnectionResetError)

    closed: list[bool] = []
    done: list[Pump] = []

    async def stuck(chunk: bytes) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            closed.append(True)

    pump = Pump(stuck(b"a"), done.append)
    pump.abandon()
    assert closed == [True]
    await asyncio.sleep(0)
    assert done == []
