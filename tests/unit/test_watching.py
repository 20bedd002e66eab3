"""The watch loops against faults a real API server will not produce on demand.

Most tests drive an `Informer` with a scripted fake of `Kube` on a fake clock: sleeps are
recorded and advance the clock, so backoff can be checked exactly and nothing waits. The
inactivity test and the stream tests use the real `Kube` against a small HTTP server instead,
since a silent connection is about the client's read timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from slo_api import watching
from slo_api.index import CRIndex
from slo_api.kinds.base import Kind
from slo_api.kinds.job import JobKind
from slo_api.kinds.llm import LLMKind
from slo_api.kube import Kube, KubeError, KubeTimeout, KubeUnavailable, Resource
from slo_api.metrics import Metrics
from slo_api.recovery import Backoff
from slo_api.service import Service
from slo_api.watching import Informer, Loops

Obj = dict[str, Any]
GROUP = "inference.modelsphere.dev"
LLM_RES = Resource(GROUP, "v1alpha1", "llmslorequirements")
JOB_RES = Resource(GROUP, "v1alpha1", "jobslorequirements")
REAL_SLEEP = asyncio.sleep
RECHECK = 60.0


# -- builders ------------------------------------------------------------------------------


def cr(name: str, rv: int, route: str | None = None, uid: str | None = None) -> Obj:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": uid or f"uid-{name}",
            "resourceVersion": str(rv),
        },
        "spec": {"serviceId": route or name},
    }


def page(items: list[Obj], rv: str, cont: str | None = None) -> Obj:
    meta: Obj = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {"items": items, "metadata": meta}


def event(kind: str, obj: Obj) -> Obj:
    return {"type": kind, "object": obj}


def bookmark(rv: int) -> Obj:
    return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(rv)}}}


def status(code: int, reason: str, **details: Any) -> KubeError:
    body = {"kind": "Status", "code": code, "reason": reason, "message": reason}
    if details:
        body["details"] = details
    return KubeError.from_status(body)


NOT_SERVED = KubeError(404, message="404 page not found")  # a missing CRD: no JSON Status


# -- the fake clock and the fake Kube ------------------------------------------------------


@dataclass
class Clock:
    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await REAL_SLEEP(0)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Fake time for the watch loops, with no jitter (tests that want jitter patch it)."""
    fake = Clock()
    monkeypatch.setattr(watching, "time", SimpleNamespace(monotonic=fake.monotonic))
    monkeypatch.setattr(
        watching,
        "asyncio",
        SimpleNamespace(sleep=fake.sleep, CancelledError=asyncio.CancelledError),
    )
    monkeypatch.setattr(
        watching, "random", SimpleNamespace(random=lambda: 0.0, randint=random.randint)
    )
    monkeypatch.setattr("slo_api.recovery.random", SimpleNamespace(random=lambda: 0.0))
    return fake


# A watch script: events to yield, exceptions to raise, numbers of seconds to let pass.
Step = Obj | BaseException | float


class FakeKube(Kube):
    """Answers list and watch from scripts; once a script runs out, the call hangs."""

    def __init__(self, clock: Clock) -> None:  # no API client: nothing real is called
        self.clock = clock
        self.pages: list[Obj | BaseException] = []
        self.watches: list[list[Step]] = []
        self.list_calls: list[str | None] = []
        self.scopes: list[tuple[str, str | None, str]] = []  # (call, namespace, selector)
        self.watch_calls: list[str] = []
        self.watch_kwargs: list[Obj] = []
        # Streamed lists (sendInitialEvents); None: the API server refuses them, as one
        # without the WatchList feature does.
        self.initial: list[list[Step]] | None = None
        self.stream_calls = 0
        self.idle = asyncio.Event()

    async def _hang(self) -> None:
        self.idle.set()
        await asyncio.Event().wait()

    async def list(
        self,
        res: Resource,
        *,
        limit: int = 500,
        continue_: str | None = None,
        resource_version: str | None = None,
        namespace: str | None = None,
        label_selector: str = "",
    ) -> Obj:
        self.list_calls.append(continue_)
        self.scopes.append(("list", namespace, label_selector))
        if not self.pages:
            await self._hang()
        result = self.pages.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result

    async def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        timeout_seconds: int,
        read_timeout: float,
        initial_events: bool = False,
        namespace: str | None = None,
        label_selector: str = "",
        on_open: Callable[[], None] | None = None,
    ) -> AsyncGenerator[Obj, None]:
        if initial_events:
            self.stream_calls += 1
            if self.initial is None:
                raise status(422, "Invalid")
            if not self.initial:
                await self._hang()
            for step in self.initial.pop(0):
                if isinstance(step, BaseException):
                    raise step
                yield step  # type: ignore[misc]
            return
        self.watch_calls.append(resource_version)
        self.watch_kwargs.append({"timeout_seconds": timeout_seconds, "read_timeout": read_timeout})
        self.scopes.append(("watch", namespace, label_selector))
        if not self.watches:
            if on_open is not None:
                on_open()  # an open watch with nothing to say
            await self._hang()
        script = self.watches.pop(0)
        # Accepted (a 200) unless the script starts with an error: refused or not answered.
        if on_open is not None and not (script and isinstance(script[0], BaseException)):
            on_open()
        for step in script:
            if isinstance(step, BaseException):
                raise step
            if isinstance(step, int | float):
                self.clock.now += step
                continue
            yield step


@dataclass
class Loop:
    informer: Informer
    index: CRIndex
    metrics: Metrics

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, {"kind": "llm", **labels}) or 0.0

    def relists(self) -> float:
        return self.sample("slo_api_watch_relists_total")

    def restarts(self, reason: str) -> float:
        return self.sample("slo_api_watch_restarts_total", reason=reason)

    def names(self, plural: str = "llmslorequirements") -> list[str]:
        return sorted(o["metadata"]["name"] for o in self.index.objects(plural))


def make_loop(kube: Kube, inactivity: float = 90) -> Loop:
    kinds: list[Kind] = [LLMKind(LLM_RES), JobKind(JOB_RES)]
    index = Service.index_for(kinds)
    metrics = Metrics()
    informer = Informer(
        Loops(kube, index, metrics, crd_recheck_seconds=RECHECK, inactivity_seconds=inactivity),
        kinds[0],
    )
    return Loop(informer, index, metrics)


async def run_until_idle(loop: Loop, kube: FakeKube) -> None:
    """Run the informer until it has used every script up, then stop it."""
    task = asyncio.create_task(loop.informer.run())
    idle = asyncio.create_task(kube.idle.wait())
    try:
        done, _ = await asyncio.wait({task, idle}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # the loop must never end by itself: raise what ended it
            raise AssertionError("the watch loop returned")
        assert idle in done, "the watch loop did not use its scripts up"
    finally:
        for t in (task, idle):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t


@pytest.fixture
def kube(clock: Clock) -> FakeKube:
    return FakeKube(clock)


# -- backoff -------------------------------------------------------------------------------


def test_backoff_doubles_from_0_8_s_and_never_sleeps_30_s_or_more(clock: Clock) -> None:
    backoff = Backoff()
    delays = [backoff.next() for _ in range(9)]
    # The step stops at half the cap: with the jitter (up to twice the step), sleeps stay
    # under 30 s, and spread.
    assert delays == pytest.approx([0.8, 1.6, 3.2, 6.4, 12.8, 15, 15, 15, 15])


def test_backoff_is_jittered_within_one_to_two_times_the_step_and_capped_at_30_s(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("slo_api.recovery.random", random.Random(7))
    steps = [0.8, 1.6, 3.2, 6.4, 12.8] + [15.0] * 200
    backoff = Backoff()
    observed = [backoff.next() for _ in steps]
    for step, delay in zip(steps, observed, strict=True):
        assert step <= delay < 2 * step
    capped = observed[5:]
    assert len(set(capped)) == len(capped), "sleeps at the cap should still be spread"
    assert max(observed) < 30  # the cap is 30 s, jitter included
    assert max(observed) > 25


def test_backoff_starts_over_when_reset(clock: Clock) -> None:
    backoff = Backoff()
    for _ in range(5):
        backoff.next()
    backoff.reset()
    assert backoff.next() == pytest.approx(0.8)
    assert backoff.next() == pytest.approx(1.6)


# -- list, then watch ----------------------------------------------------------------------


async def test_lists_then_watches_from_the_last_resource_version(
    clock: Clock, kube: FakeKube
) -> None:
    kube.pages = [page([cr("a", 3)], "10")]
    kube.watches = [
        [event("ADDED", cr("b", 11)), bookmark(15), 30.0],  # a normal close after a while
        [event("MODIFIED", cr("a", 16, route="a2")), event("DELETED", cr("b", 17)), 30.0],
    ]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert kube.list_calls == [None]  # one list: normal closes re-watch, they do not relist
    assert kube.watch_calls == ["10", "15", "17"]  # the bookmark's RV is a resume point
    assert clock.sleeps == []
    assert loop.names() == ["a"]
    assert loop.index.routes("llm") == ["a2"]
    assert loop.relists() == 1
    assert loop.restarts("closed") == 2
    for kwargs in kube.watch_kwargs:
        assert 300 <= kwargs["timeout_seconds"] <= 600
        assert kwargs["read_timeout"] == 90
    assert loop.informer.synced
    assert loop.informer.present


async def test_a_scoped_informer_lists_and_watches_one_namespace_by_label(
    clock: Clock, kube: FakeKube
) -> None:
    kube.pages = [page([cr("a", 5)], "10")]
    kube.watches = [[event("ADDED", cr("b", 11))]]
    loop = make_loop(kube)
    loop.informer.namespace, loop.informer.label_selector = "ns", "tier=prod"
    # Held from another namespace's watch of the same group (and one held in "ns", which the
    # list does not return, so it goes).
    elsewhere, stale = cr("elsewhere", 1), cr("stale", 1)
    elsewhere["metadata"]["namespace"] = "other"
    for obj in (elsewhere, stale):
        loop.index.upsert("llmslorequirements", obj, GROUP)
    await run_until_idle(loop, kube)
    assert kube.scopes == [
        ("list", "ns", "tier=prod"),
        ("watch", "ns", "tier=prod"),
        ("watch", "ns", "tier=prod"),
    ]
    # The list replaced what was held in its namespace only.
    assert loop.names() == ["a", "b", "elsewhere"]


async def test_a_watch_that_ends_at_once_with_no_events_is_a_failure(
    clock: Clock, kube: FakeKube
) -> None:
    kube.pages = [page([], "10")]
    kube.watches = [[], [], []]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert clock.sleeps == pytest.approx([0.8, 1.6, 3.2])  # the backoff grows
    assert kube.watch_calls == ["10"] * 4
    assert kube.list_calls == [None]
    assert loop.restarts("quick-close") == 3


async def test_a_short_watch_with_events_is_not_a_failure(clock: Clock, kube: FakeKube) -> None:
    kube.pages = [page([], "10")]
    kube.watches = [[event("ADDED", cr("a", 11))], [bookmark(12)]]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert clock.sleeps == []
    assert kube.watch_calls == ["10", "11", "12"]


async def test_the_backoff_starts_over_after_a_healthy_watch(clock: Clock, kube: FakeKube) -> None:
    kube.pages = [page([], "10")]
    kube.watches = [[], [], [event("ADDED", cr("a", 11)), 200.0], []]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert clock.sleeps == pytest.approx([0.8, 1.6, 0.8])


# -- the backoff starts over whenever the API server answers ------------------------------

REFUSED: Step = KubeUnavailable(0, "Unavailable", "cannot reach the API server")


async def test_a_410_after_an_outage_relists_at_once_whatever_the_backoff_grew_to(
    clock: Clock, kube: FakeKube
) -> None:
    kube.pages = [page([cr("a", 3)], "10"), page([cr("b", 25)], "30")]
    # Refused four times (an API server restarting), then back with a fresh watch cache.
    kube.watches = [[REFUSED]] * 4 + [[status(410, "Expired")]]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert clock.sleeps == pytest.approx([0.8, 1.6, 3.2, 6.4])  # no fifth sleep
    assert kube.list_calls == [None, None]
    assert loop.names() == ["b"]


async def test_a_second_410_straight_after_the_relist_backs_off(
    clock: Clock, kube: FakeKube
) -> None:
    kube.pages = [page([], "10"), page([], "20"), page([], "30")]
    kube.watches = [[status(410, "Expired")], [status(410, "Expired")]]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    # The first relists at once; a server that keeps answering 410 gets no hot loop.
    assert clock.sleeps == pytest.approx([0.8])
    assert kube.list_calls == [None, None, None]


async def test_a_watch_that_opened_and_lived_resets_the_backoff(
    clock: Clock, kube: FakeKube
) -> None:
    kube.pages = [page([cr("a", 3)], "10")]
    kube.watches = [
        [REFUSED],
        [REFUSED],
        [REFUSED],
        [event("ADDED", cr("b", 11)), 30.0, REFUSED],  # open for 30 s, then lost
        [REFUSED],
    ]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    # Not 6.4: the watch that opened was an answer, whatever the time since the failures.
    assert clock.sleeps == pytest.approx([0.8, 1.6, 3.2, 0.8])


async def test_a_list_resets_the_backoff(clock: Clock, kube: FakeKube) -> None:
    failed: list[Obj | BaseException] = [status(500, "InternalError")] * 3
    kube.pages = [*failed, page([], "10"), page([], "20")]
    kube.watches = [[status(500, "InternalError")]]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert clock.sleeps == pytest.approx([0.8, 1.6, 3.2, 0.8])


async def test_a_watch_start_that_times_out_backs_off(clock: Clock, kube: FakeKube) -> None:
    not_accepted = KubeTimeout(0, "Timeout", "the watch was not accepted in time")
    kube.pages = [page([], "10")]
    kube.watches = [[not_accepted], [not_accepted], [not_accepted]]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert clock.sleeps == pytest.approx([0.8, 1.6, 3.2])
    assert kube.watch_calls == ["10"] * 4
    assert loop.restarts("timeout") == 3
    assert loop.restarts("inactive") == 0


async def test_an_informer_is_current_until_a_failure(
    clock: Clock, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube.pages = [page([], "10")]
    kube.watches = [[event("ADDED", cr("a", 11)), 30.0, REFUSED], [REFUSED]]
    loop = make_loop(kube)
    seen: list[bool] = []
    sleep = clock.sleep

    async def record(seconds: float) -> None:
        seen.append(loop.informer.current)
        await sleep(seconds)

    monkeypatch.setattr("slo_api.watching.asyncio.sleep", record)  # the clock's namespace
    assert not loop.informer.current
    await run_until_idle(loop, kube)
    assert seen == [False]  # not current while it backs off
    assert loop.informer.current  # the watch open now


# -- errors --------------------------------------------------------------------------------


async def test_429_on_the_watch_honours_retry_after_and_rewatches(
    clock: Clock, kube: FakeKube
) -> None:
    kube.pages = [page([cr("a", 3)], "10")]
    kube.watches = [
        [KubeError(429, "TooManyRequests", retry_after=7.0)],
        [status(429, "TooManyRequests", retryAfterSeconds=3)],  # as an ERROR event
        [KubeError(429, "TooManyRequests")],  # no Retry-After: back off
    ]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert clock.sleeps == pytest.approx([7.0, 3.0, 0.8])
    assert kube.watch_calls == ["10"] * 4
    assert kube.list_calls == [None]
    assert loop.restarts("throttled") == 3
    assert loop.names() == ["a"]


async def test_429_on_the_list_honours_retry_after(clock: Clock, kube: FakeKube) -> None:
    kube.pages = [KubeError(429, "TooManyRequests", retry_after=4.0), page([cr("a", 3)], "10")]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert clock.sleeps == pytest.approx([4.0])
    assert kube.list_calls == [None, None]
    assert loop.names() == ["a"]


async def test_410_on_the_watch_relists_and_replaces_only_this_kind(
    clock: Clock, kube: FakeKube
) -> None:
    kube.pages = [page([cr("a", 3), cr("b", 4)], "10"), page([cr("b", 25, route="b2")], "30")]
    kube.watches = [[event("ADDED", cr("c", 11)), status(410, "Expired")]]
    loop = make_loop(kube)
    loop.index.upsert("jobslorequirements", cr("job", 1))
    await run_until_idle(loop, kube)

    assert kube.list_calls == [None, None]
    assert kube.watch_calls == ["10", "30"]
    assert clock.sleeps == []  # the API server answered: relist at once
    assert loop.names() == ["b"]  # a and c vanished while the watch could not resume
    assert loop.index.routes("llm") == ["b2"]
    assert loop.names("jobslorequirements") == ["job"]  # the other kind is untouched
    assert loop.index.routes("job") == ["job"]
    assert loop.relists() == 2
    assert loop.restarts("expired") == 1


async def test_an_unknown_watch_error_relists(clock: Clock, kube: FakeKube) -> None:
    kube.pages = [page([cr("a", 3)], "10"), page([], "30")]
    kube.watches = [[status(500, "InternalError")]]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert kube.list_calls == [None, None]
    assert loop.names() == []
    assert loop.restarts("relist") == 1
    assert loop.informer.synced  # once synced, always synced


async def test_a_forbidden_watch_is_logged_loudly_and_relists(
    clock: Clock, kube: FakeKube, caplog: pytest.LogCaptureFixture
) -> None:
    kube.pages = [page([cr("a", 3)], "10"), page([cr("a", 3)], "30")]
    kube.watches = [[status(403, "Forbidden")]]
    loop = make_loop(kube)
    with caplog.at_level(logging.ERROR, logger="slo_api.watch"):
        await run_until_idle(loop, kube)

    assert loop.restarts("relist") == 1
    assert any(
        r.levelno == logging.ERROR and r.getMessage().startswith("RBAC:") for r in caplog.records
    )


async def test_a_lost_connection_resumes_from_the_last_resource_version(
    clock: Clock, kube: FakeKube
) -> None:
    lost = KubeUnavailable(0, "Unavailable", "the watch broke")
    refused = KubeUnavailable(0, "Unavailable", "cannot reach the API server")
    kube.pages = [page([cr("a", 3)], "10")]
    kube.watches = [
        [event("ADDED", cr("b", 11)), 30.0, lost],  # a healthy watch breaks: resume at once
        [refused],  # the API server is down: back off
        [refused],
        [event("DELETED", cr("a", 12)), 30.0],
    ]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert kube.list_calls == [None]  # no relist: the server replays what was missed
    assert kube.watch_calls == ["10", "11", "11", "11", "12"]
    assert clock.sleeps == pytest.approx([0.8, 1.6])
    assert loop.names() == ["b"]
    assert loop.restarts("unavailable") == 3


async def test_a_silent_watch_is_reconnected_from_the_last_resource_version(
    clock: Clock, kube: FakeKube
) -> None:
    kube.pages = [page([], "10")]
    kube.watches = [[event("ADDED", cr("a", 11)), 90.0, KubeTimeout(0, "Timeout", "silent")]]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert kube.watch_calls == ["10", "11"]
    assert kube.list_calls == [None]
    assert loop.restarts("inactive") == 1


async def test_410_while_paging_restarts_the_list(clock: Clock, kube: FakeKube) -> None:
    kube.pages = [
        page([cr("a", 3)], "10", cont="first"),
        status(410, "Expired"),  # the continue token expired
        page([cr("b", 5)], "30", cont="second"),
        page([cr("c", 6)], "30"),
    ]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert kube.list_calls == [None, "first", None, "second"]
    assert loop.names() == ["b", "c"]  # nothing from the abandoned pass
    assert kube.watch_calls == ["30"]
    assert loop.relists() == 1
    assert clock.sleeps == []


# -- CRDs ----------------------------------------------------------------------------------


async def test_a_missing_crd_counts_as_synced_and_absent(clock: Clock, kube: FakeKube) -> None:
    kube.pages = [NOT_SERVED]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert loop.informer.synced
    assert not loop.informer.present
    assert loop.names() == []
    assert clock.sleeps == [RECHECK]  # looked up again later
    assert kube.list_calls == [None, None]


async def test_a_crd_installed_later_is_picked_up(clock: Clock, kube: FakeKube) -> None:
    kube.pages = [NOT_SERVED, NOT_SERVED, page([cr("a", 3)], "10")]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert clock.sleeps == [RECHECK, RECHECK]
    assert loop.informer.present
    assert loop.names() == ["a"]
    assert kube.watch_calls == ["10"]


async def test_a_404_with_a_status_is_an_error_not_a_missing_crd(
    clock: Clock, kube: FakeKube
) -> None:
    kube.pages = [status(404, "NotFound")]
    loop = make_loop(kube)
    await run_until_idle(loop, kube)

    assert not loop.informer.synced
    assert clock.sleeps == pytest.approx([0.8])


async def test_a_crd_deleted_while_watched_empties_its_kind(clock: Clock, kube: FakeKube) -> None:
    kube.pages = [page([cr("a", 3), cr("b", 4)], "10")]
    kube.watches = [[event("DELETED", cr("a", 11)), NOT_SERVED]]
    loop = make_loop(kube)
    loop.index.upsert("jobslorequirements", cr("job", 1))
    await run_until_idle(loop, kube)

    assert loop.names() == []
    assert loop.index.routes("llm") == []
    assert not loop.informer.present
    assert loop.informer.synced
    assert loop.names("jobslorequirements") == ["job"]
    assert clock.sleeps == [RECHECK]


# -- the real Kube against a small HTTP server ---------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakeApiServer:
    """Serves list and watch of one plural from a queue of handlers; then hangs."""

    def __init__(self) -> None:
        self.handlers: list[Handler] = []
        self.queries: list[dict[str, str]] = []
        # Whether list streams (sendInitialEvents) are served from the handlers or refused.
        self.streams_lists = False
        self.refused_streams = 0
        self.stopping = asyncio.Event()
        self.readyz: list[int] = []  # the answers to GET /readyz, in turn
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> FakeApiServer:
        app = web.Application()
        app.router.add_get("/apis/{group}/{version}/{plural}", self._handle)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        self.stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _readyz(self, request: web.Request) -> web.StreamResponse:
        code = self.readyz.pop(0)
        return web.Response(status=code, text="ok" if code == 200 else "[-]etcd failed")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("sendInitialEvents") == "true" and not self.streams_lists:
            # As an API server without the WatchList feature answers.
            self.refused_streams += 1
            invalid = {"kind": "Status", "code": 422, "reason": "Invalid", "message": "forbidden"}
            return web.json_response(invalid, status=422)
        self.queries.append(dict(request.query))
        if not self.handlers:
            await self.stopping.wait()
            return web.Response(status=503)
        return await self.handlers.pop(0)(request)

    def json(self, body: Obj, status: int = 200, headers: dict[str, str] | None = None) -> None:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.json_response(body, status=status, headers=headers)

        self.handlers.append(handler)

    def not_found(self) -> None:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.Response(status=404, text="404 page not found\n")

        self.handlers.append(handler)

    def stream(self, chunks: list[bytes], then: str = "silent") -> None:
        """A watch answering `chunks`, then going silent (open, no bytes) or closing."""

        async def handler(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse()
            response.content_type = "application/json"
            await response.prepare(request)
            for chunk in chunks:
                await response.write(chunk)
            if then == "silent":
                await self.stopping.wait()
            with contextlib.suppress(ConnectionResetError):  # the client may have gone
                await response.write_eof()
            return response

        self.handlers.append(handler)


def line(obj: Obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    started = await FakeApiServer().start()
    try:
        yield started
    finally:
        await started.stop()


@pytest.fixture
async def real_kube(server: FakeApiServer) -> AsyncIterator[Kube]:
    configuration = client.Configuration()
    configuration.host = server.url
    kube = Kube(client.ApiClient(configuration), timeout=2)
    try:
        yield kube
    finally:
        await kube.close()


async def collect(kube: Kube, rv: str = "5", read_timeout: float = 2) -> list[Obj]:
    return [
        e
        async for e in kube.watch(
            LLM_RES, resource_version=rv, timeout_seconds=300, read_timeout=read_timeout
        )
    ]


async def test_the_inactivity_timeout_reconnects_a_silent_watch(
    server: FakeApiServer, real_kube: Kube
) -> None:
    server.json(page([cr("a", 3)], "5"))
    server.stream([line(event("ADDED", cr("b", 6)))])  # then silent, never closed
    server.stream([line(event("MODIFIED", cr("b", 7, route="b2")))])
    loop = make_loop(real_kube, inactivity=0.3)
    task = asyncio.create_task(loop.informer.run())
    try:
        for _ in range(200):
            if loop.index.routes("llm") == ["a", "b2"]:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"the second watch's event never arrived: {server.queries}")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    list_query, first, second = server.queries[:3]
    assert "watch" not in list_query
    assert first["watch"].lower() == "true"
    assert first["allowWatchBookmarks"].lower() == "true"
    assert first["resourceVersion"] == "5"
    assert 300 <= int(first["timeoutSeconds"]) <= 600
    assert second["resourceVersion"] == "6"  # resumed where the silent watch stopped
    assert loop.restarts("inactive") >= 1
    assert loop.relists() == 1


async def test_a_silent_stream_raises_kube_timeout(server: FakeApiServer, real_kube: Kube) -> None:
    server.stream([line(event("ADDED", cr("a", 6)))])
    seen: list[Obj] = []

    async def read() -> None:
        async for e in real_kube.watch(
            LLM_RES, resource_version="5", timeout_seconds=300, read_timeout=0.2
        ):
            seen.append(e)

    with pytest.raises(KubeTimeout):
        await read()
    assert [e["object"]["metadata"]["name"] for e in seen] == ["a"]


async def test_an_error_event_keeps_its_status(server: FakeApiServer, real_kube: Kube) -> None:
    expired = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "too old resource version: 5 (10)",
        "reason": "Expired",
        "code": 410,
    }
    server.stream([line(bookmark(6)), line({"type": "ERROR", "object": expired})], then="close")
    with pytest.raises(KubeError) as caught:
        await collect(real_kube)
    assert caught.value.status == 410
    assert caught.value.reason == "Expired"
    assert caught.value.is_status


async def test_a_bare_404_is_told_apart_from_a_status(
    server: FakeApiServer, real_kube: Kube
) -> None:
    server.not_found()
    server.json({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
    with pytest.raises(KubeError) as bare:
        await collect(real_kube)
    assert bare.value.status == 404
    assert not bare.value.is_status
    with pytest.raises(KubeError) as with_status:
        await real_kube.list(LLM_RES)
    assert with_status.value.status == 404
    assert with_status.value.is_status


async def test_a_429_answer_carries_retry_after(server: FakeApiServer, real_kube: Kube) -> None:
    throttled = {"kind": "Status", "code": 429, "reason": "TooManyRequests"}
    server.json(throttled, status=429, headers={"Retry-After": "3"})
    with pytest.raises(KubeError) as caught:
        await collect(real_kube)
    assert caught.value.status == 429
    assert caught.value.retry_after == 3


async def test_events_are_read_whatever_the_chunking_and_size(
    server: FakeApiServer, real_kube: Kube
) -> None:
    big = cr("big", 7)
    big["spec"]["note"] = "x" * 200_000  # one line far over aiohttp's 64 KiB readline limit
    data = line(event("ADDED", cr("a", 6))) + line(event("ADDED", big)) + line(bookmark(8))
    chunks = [data[i : i + 1000] for i in range(0, len(data), 1000)]
    server.stream(chunks, then="close")
    events = await collect(real_kube)
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert events[1]["object"]["spec"]["note"] == big["spec"]["note"]


async def test_the_probe_says_whether_the_api_server_answers(
    server: FakeApiServer, real_kube: Kube
) -> None:
    server.readyz = [200, 500, 403]
    assert await real_kube.ready()
    assert not await real_kube.ready()  # up, not ready: the loops keep waiting
    assert await real_kube.ready()  # refused: a server that is down cannot refuse
    await server.stop()
    assert not await real_kube.ready()  # nobody there


async def test_a_watch_says_when_it_is_accepted(server: FakeApiServer, real_kube: Kube) -> None:
    server.stream([line(bookmark(6))], then="close")
    server.json({"kind": "Status", "code": 500, "reason": "InternalError"}, status=500)
    opened: list[str] = []
    events = real_kube.watch(
        LLM_RES,
        resource_version="5",
        timeout_seconds=300,
        read_timeout=2,
        on_open=lambda: opened.append("open"),
    )
    assert [e["type"] async for e in events] == ["BOOKMARK"]
    assert opened == ["open"]
    with pytest.raises(KubeError):
        async for _ in real_kube.watch(
            LLM_RES,
            resource_version="5",
            timeout_seconds=300,
            read_timeout=2,
            on_open=lambda: opened.append("refused"),
        ):
            pass
    assert opened == ["open"]


# -- lists streamed through the watch (sendInitialEvents) -----------------------------------


def initial_end(rv: int) -> Obj:
    return {
        "type": "BOOKMARK",
        "object": {
            "metadata": {
                "resourceVersion": str(rv),
                "annotations": {"k8s.io/initial-events-end": "true"},
            }
        },
    }


async def test_a_streamed_list_fills_the_index_and_the_watch_resumes_from_its_end(
    clock: Clock,
) -> None:
    kube = FakeKube(clock)
    kube.initial = [[event("ADDED", cr("a", 5)), event("ADDED", cr("b", 6)), initial_end(9)]]
    kube.watches = [[event("MODIFIED", cr("a", 10, route="moved"))]]
    loop = make_loop(kube)
    task = asyncio.create_task(loop.informer.run())
    await kube.idle.wait()
    assert loop.names() == ["a", "b"]
    assert loop.index.routes() == ["b", "moved"]
    assert kube.list_calls == []  # no paged list
    assert kube.watch_calls[0] == "9"
    assert loop.informer.synced
    assert loop.relists() == 1
    task.cancel()


async def test_an_api_server_that_refuses_streamed_lists_is_listed_in_pages(clock: Clock) -> None:
    kube = FakeKube(clock)
    kube.pages = [page([cr("a", 5)], "9"), page([cr("a", 11)], "12")]
    kube.watches = [[status(410, "Expired")]]
    loop = make_loop(kube)
    task = asyncio.create_task(loop.informer.run())
    await kube.idle.wait()
    assert loop.names() == ["a"]
    # Refused once, then never asked again: the relist after the 410 pages too.
    assert kube.stream_calls == 1
    assert kube.list_calls == [None, None]
    task.cancel()


async def test_after_a_410_the_relist_pages_then_streaming_resumes(clock: Clock) -> None:
    kube = FakeKube(clock)
    kube.initial = [
        [event("ADDED", cr("a", 5)), initial_end(9)],
        [event("ADDED", cr("c", 30)), initial_end(31)],
    ]
    kube.pages = [page([cr("b", 20)], "21")]
    kube.watches = [[status(410, "Expired")], [status(500, "InternalError")]]
    loop = make_loop(kube)
    task = asyncio.create_task(loop.informer.run())
    await kube.idle.wait()
    # list (stream) -> 410 -> paged list -> error -> streamed list again
    assert kube.stream_calls == 2
    assert kube.list_calls == [None]
    assert loop.names() == ["c"]
    task.cancel()


async def test_a_streamed_list_cut_short_changes_nothing_and_is_retried(clock: Clock) -> None:
    kube = FakeKube(clock)
    kube.pages = []
    kube.initial = [
        [event("ADDED", cr("a", 5)), KubeUnavailable(0, "Unavailable", "reset")],
        [event("ADDED", cr("a", 5)), event("ADDED", cr("b", 6)), initial_end(9)],
    ]
    loop = make_loop(kube)
    loop.index.upsert("llmslorequirements", cr("old", 1), GROUP)
    task = asyncio.create_task(loop.informer.run())
    await kube.idle.wait()
    assert kube.stream_calls == 2
    assert loop.names() == ["a", "b"]  # replaced once, whole
    assert clock.sleeps  # backed off before the second try
    task.cancel()


async def test_a_stream_that_ends_before_its_initial_events_end_is_a_failure(
    clock: Clock,
) -> None:
    kube = FakeKube(clock)
    kube.initial = [
        [event("ADDED", cr("a", 5))],
        [event("ADDED", cr("a", 5)), initial_end(9)],
    ]
    loop = make_loop(kube)
    loop.index.upsert("llmslorequirements", cr("old", 1), GROUP)
    task = asyncio.create_task(loop.informer.run())
    await kube.idle.wait()
    assert kube.stream_calls == 2
    assert loop.names() == ["a"]
    task.cancel()


async def test_a_missing_crd_found_by_a_streamed_list_is_indexed_as_empty(clock: Clock) -> None:
    kube = FakeKube(clock)
    kube.initial = [[NOT_SERVED]]
    loop = make_loop(kube)
    loop.index.upsert("llmslorequirements", cr("old", 1), GROUP)
    task = asyncio.create_task(loop.informer.run())
    await kube.idle.wait()
    assert loop.informer.synced
    assert not loop.informer.present
    assert loop.names() == []
    assert kube.list_calls == []
    task.cancel()


async def test_a_streamed_list_applies_every_event_before_its_end(clock: Clock) -> None:
    kube = FakeKube(clock)
    kube.initial = [
        [
            event("ADDED", cr("a", 5)),
            event("ADDED", cr("b", 6)),
            event("MODIFIED", cr("a", 7, route="moved")),
            event("DELETED", cr("b", 8)),
            event("ADDED", cr("c", 9)),
            initial_end(9),
        ]
    ]
    loop = make_loop(kube)
    loop.index.upsert("llmslorequirements", cr("b", 1), GROUP)
    task = asyncio.create_task(loop.informer.run())
    await kube.idle.wait()
    task.cancel()
    assert loop.names() == ["a", "c"]  # no ghost of b
    assert loop.index.routes() == ["c", "moved"]  # not a's first version
    assert kube.watch_calls == ["9"]


async def test_a_refused_stream_is_tried_again_later(clock: Clock) -> None:
    kube = FakeKube(clock)
    kube.pages = [page([cr("a", 5)], "9"), page([cr("a", 5)], "12")]
    kube.watches = [[status(500, "InternalError")], [700.0, status(500, "InternalError")]]
    loop = make_loop(kube)
    task = asyncio.create_task(loop.informer.run())
    await kube.idle.wait()
    task.cancel()
    # Refused once: the relist soon after pages; one 10 minutes later tries a stream again
    # (refused again here, so it pages once more).
    assert kube.stream_calls == 2
    assert kube.list_calls == [None, None, None]


async def test_a_list_is_streamed_through_the_real_client(
    server: FakeApiServer, real_kube: Kube
) -> None:
    server.streams_lists = True
    server.stream([line(event("ADDED", cr("a", 3))), line(initial_end(5))])
    server.stream([line(event("MODIFIED", cr("a", 6, route="a2")))])
    loop = make_loop(real_kube)
    task = asyncio.create_task(loop.informer.run())
    try:
        for _ in range(200):
            if loop.index.routes("llm") == ["a2"]:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"the watch after the streamed list: {server.queries}")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    listed, watched = server.queries[:2]
    assert listed["sendInitialEvents"] == "true"
    assert listed["resourceVersionMatch"] == "NotOlderThan"
    assert "resourceVersion" not in listed  # the most recent state, served consistently
    assert watched["resourceVersion"] == "5"
    assert "sendInitialEvents" not in watched
    assert loop.relists() == 1
