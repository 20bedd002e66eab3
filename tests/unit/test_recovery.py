"""Recovery from an outage, on virtual time (tests/unit/vtime.py): the backoff an outage grew
is not slept once the API server answers again, and every long-lived task is supervised.

`OutageKube` is an API server that is down until `back_at` (every call refused) and then up
with a fresh watch cache, as a restarted one is: a watch from a resourceVersion of before the
outage is answered 410, a list succeeds, a watch from the list's resourceVersion stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

from slo_api import recovery, watching
from slo_api.kinds.base import Kind
from slo_api.kinds.job import JobKind
from slo_api.kinds.llm import LLMKind
from slo_api.kinds.pool import PoolKind
from slo_api.kube import Kube, KubeError, KubeUnavailable, Resource
from slo_api.metrics import Metrics
from slo_api.recovery import Recovery, supervise
from slo_api.service import Service
from slo_api.watching import Informer, Loops
from tests.unit import vtime
from tests.unit.fakes import FakeKube

Obj = dict[str, Any]
GROUP = "inference.modelsphere.dev"
RESOURCES = [
    Resource(GROUP, "v1alpha1", "llmslorequirements"),
    Resource(GROUP, "v1alpha1", "jobslorequirements"),
    Resource("inference.llmkube.dev", "v1alpha1", "modelpools"),
]


def now() -> float:
    return asyncio.get_running_loop().time()


@pytest.fixture(autouse=True)
def virtual_monotonic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The informers read the virtual loop's clock (they use time.monotonic for quick closes)."""
    monkeypatch.setattr(watching, "time", SimpleNamespace(monotonic=now))


class OutageKube(FakeKube):
    def __init__(self, down_at: float, back_at: float) -> None:
        super().__init__()
        self.down_at = down_at
        self.back_at = back_at
        self.probes = 0
        self.probing = 0
        self.most_probing = 0
        self.lists: list[tuple[str, float]] = []  # (plural, when)

    @property
    def cache_start(self) -> int:
        # The restarted API server's watch cache starts after every version of before.
        return 200 if now() >= self.back_at else 100

    def up(self) -> bool:
        return not self.down_at <= now() < self.back_at

    def _refuse(self) -> None:
        if not self.up():
            raise KubeUnavailable(0, "Unavailable", "cannot reach the API server")

    async def ready(self) -> bool:
        self.probes += 1
        self.probing += 1
        self.most_probing = max(self.most_probing, self.probing)
        try:
            await asyncio.sleep(0.01)
            return self.up()
        finally:
            self.probing -= 1

    async def served(self, group: str, version: str) -> set[str]:
        self._refuse()
        return {r.plural for r in RESOURCES if r.group == group}

    async def list(self, res: Resource, **_: Any) -> Obj:
        self._refuse()
        self.lists.append((res.plural, now()))
        return {"items": [], "metadata": {"resourceVersion": str(self.cache_start)}}

    async def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        initial_events: bool = False,
        on_open: Callable[[], None] | None = None,
        **_: Any,
    ) -> AsyncGenerator[Obj, None]:
        if initial_events:
            raise KubeError(422, "Invalid", "no streamed lists here", is_status=True)
        self._refuse()
        if int(resource_version) < self.cache_start:
            raise KubeError(410, "Expired", "too old resource version", is_status=True)
        if on_open is not None:
            on_open()
        while self.up():
            await asyncio.sleep(0.5)
        raise KubeUnavailable(0, "Unavailable", "the watch broke")
        yield {}  # pragma: no cover - makes this a generator


def informers(kube: OutageKube, shared: Recovery) -> list[Informer]:
    kinds: list[Kind] = [LLMKind(RESOURCES[0]), JobKind(RESOURCES[1]), PoolKind(RESOURCES[2])]
    index = Service.index_for(kinds)
    metrics = Metrics()
    loops = Loops(cast(Kube, kube), index, metrics)  # the fake stands where Kube does
    return [Informer(loops, kind, recovery=shared) for kind in kinds]


async def outage(down_for: float, *, probe: bool = True) -> tuple[OutageKube, float]:
    """Three kinds through an outage from t=100 of `down_for` seconds; how long after the API
    server is back the last kind has listed again."""
    kube = OutageKube(down_at=100, back_at=100 + down_for)
    shared = Recovery(kube.ready if probe else None)
    loops = informers(kube, shared)
    tasks = [asyncio.create_task(i.run()) for i in loops]
    try:
        while not all(i.synced for i in loops):
            await asyncio.sleep(0.1)
        await asyncio.sleep(kube.back_at + 120 - now())
        relisted = {p: t for p, t in kube.lists if t >= kube.back_at}
        assert len(relisted) == 3, kube.lists
        return kube, max(relisted.values()) - kube.back_at
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await shared.close()


@pytest.mark.parametrize("down_for", [5.0, 20.0, 25.0, 30.0, 47.0, 300.0, 3600.0])
def test_every_kind_is_current_within_seconds_of_the_api_server_answering_again(
    down_for: float,
) -> None:
    kube, took = vtime.run(outage(down_for))
    # The probe runs about once a second; each loop wakes within a second of its answer.
    assert took < 2.5, took
    assert kube.most_probing == 1  # one probe for all the sleeping loops


def test_without_the_probe_the_grown_backoff_is_slept_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the probe is for: 30 s of refused reconnects leave each loop asleep for up to
    # 30 s into a recovered API server. The jitter at its least (each sleep its step: 0.8,
    # 1.6, ... 12.8, then 15 s), so the outcome is the arithmetic's, not chance's: the loops
    # wake 39.8 s into the outage, 9.8 s after the API server is back.
    monkeypatch.setattr(random, "random", lambda: 0.0)
    _, took = vtime.run(outage(30.0, probe=False))
    assert took > 2.5


def test_a_probe_that_answers_at_once_leaves_the_sleepers_their_backoff() -> None:
    async def main() -> tuple[bool, float]:
        answers = 0

        async def probe() -> bool:
            nonlocal answers
            answers += 1
            return True  # the API server is up: whatever failed, it was not an outage

        shared = Recovery(probe)
        started = now()
        woken = await shared.pause(20)
        await shared.close()
        assert answers == 1
        return woken, now() - started

    woken, slept = vtime.run(main())
    assert not woken
    assert slept == pytest.approx(20)


def test_sleepers_are_woken_with_jitter_under_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> list[float]:
        back_at = 10.0

        async def probe() -> bool:
            return now() >= back_at

        shared = Recovery(probe)
        woke: list[float] = []

        async def sleeper() -> None:
            assert await shared.pause(30)
            woke.append(now())

        await asyncio.gather(*(sleeper() for _ in range(20)))
        await shared.close()
        assert shared.recoveries == 1
        return [t - back_at for t in woke]

    after = vtime.run(main())
    assert all(0 <= t < 1 + recovery.PROBE_SECONDS for t in after), after
    assert len({round(t, 3) for t in after}) > 10  # spread, not all in the same instant


def test_a_loop_that_fails_just_after_an_outage_ended_is_woken_too() -> None:
    async def main() -> tuple[float, float]:
        back_at = 10.0

        async def probe() -> bool:
            return now() >= back_at

        shared = Recovery(probe)
        assert await shared.pause(30)  # asleep through the outage's end
        # A call started during the outage that failed only after it (a connection attempt
        # into a healed partition): the probe answers at once, yet it is the outage's failure.
        await asyncio.sleep(12 - now())
        started = now()
        assert await shared.pause(30)
        tail = now() - started
        # Long after, a failure that the probe answers at once is not an outage.
        await asyncio.sleep(back_at + recovery.TAIL_SECONDS + 1 - now())
        started = now()
        assert not await shared.pause(30)
        later = now() - started
        await shared.close()
        assert shared.recoveries == 1
        return tail, later

    tail, later = vtime.run(main())
    assert tail < 1.1
    assert later == pytest.approx(30)


def test_a_failing_probe_is_only_a_missed_hint() -> None:
    async def main() -> float:
        async def probe() -> bool:
            raise RuntimeError("a bug in the probe")

        shared = Recovery(probe)
        started = now()
        assert not await shared.pause(8)
        await shared.close()
        return now() - started

    assert vtime.run(main()) == pytest.approx(8)


# -- supervision -------------------------------------------------------------------------------


def test_a_supervised_task_that_fails_or_returns_is_counted_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> tuple[list[str], list[float]]:
        runs: list[str] = []
        failures: list[str] = []
        pauses: list[float] = []

        async def run() -> None:
            runs.append("run")
            if len(runs) == 1:
                raise ValueError("a 200 that is not JSON")
            if len(runs) == 2:
                return
            await asyncio.Event().wait()

        async def pause(seconds: float) -> None:
            pauses.append(seconds)
            await asyncio.sleep(seconds)

        task = asyncio.create_task(
            supervise(
                "the watch of llm",
                run,
                on_failure=lambda e: failures.append(type(e).__name__),
                pause=pause,
            )
        )
        await asyncio.sleep(60)
        assert not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert len(runs) == 3
        return failures, pauses

    failures, pauses = vtime.run(main())
    assert failures == ["ValueError", "NoneType"]
    assert len(pauses) == 2
    assert pauses[0] < pauses[1]  # backed off, growing
    messages = [r.getMessage() for r in caplog.records]
    assert any("failed unexpectedly" in m for m in messages)
    assert any("never should" in m for m in messages)


def test_stop_tasks_ends_a_task_that_lost_its_cancellation_even_when_itself_cancelled() -> None:
    async def stubborn(started: asyncio.Event) -> None:
        # As asyncio.wait_for on Python 3.11 can: the first cancellation is dropped.
        with contextlib.suppress(asyncio.CancelledError):
            started.set()
            await asyncio.Event().wait()
        await asyncio.Event().wait()

    async def main() -> tuple[bool, bool]:
        started = asyncio.Event()
        task = asyncio.create_task(stubborn(started))
        await started.wait()
        stopping = asyncio.create_task(recovery.stop_tasks([task]))
        await asyncio.sleep(0)  # stop_tasks has cancelled the task once and waits
        stopping.cancel()
        try:
            await stopping
        except asyncio.CancelledError:
            raised = True
        else:
            raised = False
        return task.done(), raised

    ended, raised = vtime.run(main())
    assert ended, "the task is stopped before the caller's cancellation goes on"
    assert raised, "the caller's cancellation is not swallowed"
