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

    running = asyncio.Event()

    async def stubborn() -> None:
        # asyncio.wait_for on Python 3.11 can return a result and drop a cancellation that
        # arrived at the same moment; the loop then carries on as if nothing happened.
        running.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        await asyncio.Event().wait()

    runtime.informers[0].run = stubborn  # type: ignore[method-assign]
    runtime.start()
    tasks = list(runtime._tasks)
    await running.wait()  # the loop is inside its first wait: the cancellation reaches it there
    stopping = asyncio.create_task(runtime.stop())
    # Nothing from outside cancels `stop` here: it must finish the stubborn loop by itself.
    done, _ = await asyncio.wait({stopping}, timeout=10)
    assert stopping in done, "stop() hung on a watch loop that lost its cancellation"
    assert all(task.done() for task in tasks)
    assert kube.closed
    assert runtime.shutting_down


async def test_a_kind_watch_that_fails_is_counted_and_started_again() -> None:
    kube = FakeKube()
    token = "unit-write-token"
    metrics = Metrics()
    runtime = Runtime(Settings(slo_api_token=token), kube, metrics, TokenStore(token))  # type: ignore[arg-type]
    runs = 0
    again = asyncio.Event()

    async def fails_once() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("a bug")
        again.set()
        await asyncio.Event().wait()

    runtime.informers[0].run = fails_once  # type: ignore[method-assign]
    runtime.start()
    try:
        await asyncio.wait_for(again.wait(), timeout=10)  # after a backoff under 2 s
        assert all(not task.done() for task in runtime._tasks)
        kind = runtime.informers[0].kind.name
        failures = metrics.registry.get_sample_value(
            "slo_api_watch_task_failures_total", {"kind": kind, "task": "kind"}
        )
        assert failures == 1
    finally:
        await runtime.stop()


async def test_attainment_first_refreshes_once_every_kind_is_listed() -> None:
    """A refresh before the first list finds no route, and every route would then say
    `no_data` (with `source.status` "ok") until the next one, a minute later."""
    kube = FakeKube()
    token = "unit-write-token"
    settings = Settings(slo_api_token=token, prometheus_url="http://127.0.0.1:9")
    runtime = Runtime(settings, kube, Metrics(), TokenStore(token))  # type: ignore[arg-type]
    refreshed = asyncio.Event()
    listed_at_each: list[bool] = []  # per refresh: whether every kind was listed by then

    async def refresh() -> None:
        listed_at_each.append(all(i.synced for i in runtime.informers))
        refreshed.set()

    async def listing() -> None:
        await asyncio.Event().wait()

    runtime.attainment.refresh = refresh  # type: ignore[method-assign]
    for informer in runtime.informers:
        informer.run = listing  # type: ignore[method-assign]
    runtime.start()
    try:
        await asyncio.sleep(1.5)  # the lists take this long
        assert listed_at_each == []
        for informer in runtime.informers:
            informer.discovered = True  # and no group served: listed
        await asyncio.wait_for(refreshed.wait(), timeout=10)
        assert listed_at_each == [True]
    finally:
        await runtime.stop()
