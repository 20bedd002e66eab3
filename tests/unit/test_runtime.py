"""Stopping the runtime: watch loops end and the client closes, whatever they were doing."""

from __future__ import annotations

import asyncio
import contextlib

from slo_api.auth import TokenStore
from slo_api.metrics import Metrics
from slo_api.runtime import Runtime
from slo_api.settings import Settings
from tests.unit.fakes import FakeKube


async def test_stop_finishes_when_a_watch_loop_loses_a_cancellation() -> None:
    kube = FakeKube()
    token = "unit-write-token"
    runtime = Runtime(Settings(slo_api_token=token), kube, Metrics(), TokenStore(token))  # type: ignore[arg-type]

    async def stubborn() -> None:
        # asyncio.wait_for on Python 3.11 can return a result and drop a cancellation that
        # arrived at the same moment; the loop then carries on as if nothing happened.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        await asyncio.Event().wait()

    runtime.informers[0].run = stubborn  # type: ignore[method-assign]
    runtime.start()
    tasks = list(runtime._tasks)
    await asyncio.sleep(0.01)
    stopping = asyncio.create_task(runtime.stop())
    # Nothing from outside cancels `stop` here: it must finish the stubborn loop by itself.
    done, _ = await asyncio.wait({stopping}, timeout=10)
    assert stopping in done, "stop() hung on a watch loop that lost its cancellation"
    assert all(task.done() for task in tasks)
    assert kube.closed
    assert runtime.shutting_down
