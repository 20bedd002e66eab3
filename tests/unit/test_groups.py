"""KindWatch: discovery decides which API groups are watched; settings name the groups.

Driven with a fake of the `Kube` seam that serves CRs per group and answers discovery from a
table the test changes, as installing or deleting a CRD would.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import subprocess
import sys
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest
from pydantic import ValidationError

from slo_api.groups import KindWatch
from slo_api.index import group_of
from slo_api.kinds import build_kinds
from slo_api.kinds.base import Kind
from slo_api.kinds.llm import LLMKind
from slo_api.kube import Kube, KubeError, Resource
from slo_api.metrics import Metrics
from slo_api.service import Service, Target
from slo_api.settings import Settings
from slo_api.watching import Loops

Obj = dict[str, Any]
NEW, OLD = "inference.modelsphere.dev", "inference.x-k8s.io"
PLURAL = "llmslorequirements"
GONE: Obj = {"type": "the CRD was deleted"}


def cr(group: str, name: str, route: str | None = None, rv: int = 1) -> Obj:
    return {
        "apiVersion": f"{group}/v1alpha1",
        "kind": "LLMSLORequirement",
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{group}-{name}",
            "resourceVersion": str(rv),
        },
        "spec": {"serviceId": route or name},
    }


class GroupsKube(Kube):
    """Discovery from `served` (group -> plurals); lists from `objects` (group -> CRs);
    watches deliver what `push` sends to a group."""

    def __init__(self) -> None:  # no API client: nothing real is called
        self.served_plurals: dict[str, set[str]] = {}
        self.objects: dict[str, list[Obj]] = {}
        self.discovery_error: KubeError | None = None
        self.discovery_calls = 0
        self.events: dict[str, asyncio.Queue[Obj]] = {}
        self.watching: dict[str, int] = {}  # open watches per group
        self.held: set[str] = set()  # groups whose lists do not answer (yet)
        self.discovery_bug: Exception | None = None

    def serve(self, group: str, *objs: Obj) -> None:
        self.served_plurals[group] = {PLURAL}
        self.objects[group] = list(objs)

    def unserve(self, group: str) -> None:
        """The group's CRD deleted: gone from discovery and lists, and its watches end."""
        self.served_plurals.pop(group, None)
        self.objects.pop(group, None)
        for _ in range(self.watching.get(group, 0)):
            self.push(group, GONE)

    def push(self, group: str, event: Obj) -> None:
        self.events.setdefault(group, asyncio.Queue()).put_nowait(event)

    async def served(self, group: str, version: str) -> set[str]:
        self.discovery_calls += 1
        if self.discovery_error is not None:
            raise self.discovery_error
        if self.discovery_bug is not None:
            raise self.discovery_bug
        return set(self.served_plurals.get(group, set()))

    async def list(self, res: Resource, **_: Any) -> Obj:
        while res.group in self.held:
            await asyncio.sleep(0.001)
        if res.group not in self.objects:
            raise KubeError(404, message="404 page not found")
        items = [copy.deepcopy(o) for o in self.objects[res.group]]
        return {"items": items, "metadata": {"resourceVersion": "100"}}

    async def watch(
        self,
        res: Resource,
        *,
        initial_events: bool = False,
        namespace: str | None = None,
        label_selector: str = "",
        **_: Any,
    ) -> AsyncGenerator[Obj, None]:
        if initial_events:
            # A list streamed as the watch's initial events: the same CRs a list answers.
            listed = await self.list(res, namespace=namespace, label_selector=label_selector)
            for obj in listed["items"]:
                yield {"type": "ADDED", "object": obj}
            end = {"k8s.io/initial-events-end": "true"}
            yield {"type": "BOOKMARK", "object": {"metadata": {"annotations": end}}}
            return
        queue = self.events.setdefault(res.group, asyncio.Queue())
        self.watching[res.group] = self.watching.get(res.group, 0) + 1
        try:
            while True:
                event = await queue.get()
                if event is GONE:
                    raise KubeError(404, message="404 page not found")
                yield event
        finally:
            self.watching[res.group] -= 1


def make_watch(kube: GroupsKube, groups: tuple[str, ...] = (NEW, OLD)) -> KindWatch:
    kind: Kind = LLMKind(Resource(groups[0], "v1alpha1", PLURAL), groups)
    return KindWatch(
        Loops(kube, Service.index_for([kind]), Metrics(), crd_recheck_seconds=3600), kind
    )


async def until(check: Callable[[], bool], what: str = "condition") -> None:
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never: {what}")


async def deleted(watch: KindWatch, group: str) -> None:
    """Wait until the group's informers found its CRD gone (their watches ended with 404)."""
    await until(
        lambda: not any(i.present for (g, _), i in watch.informers.items() if g == group),
        f"{group} found absent",
    )


def routes(watch: KindWatch) -> dict[str, str]:
    """Route -> the group of the copy shown."""
    return {r: group_of(watch.index.claims(r)[0][1]) for r in watch.index.routes()}


@pytest.fixture
async def kube() -> GroupsKube:
    return GroupsKube()


async def stop(watch: KindWatch) -> None:
    await watch._stop(watch.kind.groups)


# -- discovery -------------------------------------------------------------------------------


async def test_only_the_old_group_served_is_watched_and_synced(kube: GroupsKube) -> None:
    kube.serve(OLD, cr(OLD, "legacy"))
    watch = make_watch(kube)
    await watch.discover()
    try:
        await until(lambda: watch.synced, "synced")
        state = watch.state()
        assert state.served == (OLD,)
        assert state.watched == (OLD,)
        assert state.present
        assert state.objects == 1
        assert routes(watch) == {"legacy": OLD}
    finally:
        await stop(watch)


async def test_no_group_served_is_synced_and_absent(kube: GroupsKube) -> None:
    watch = make_watch(kube)
    assert not watch.synced  # nothing is known before discovery answered
    await watch.discover()
    assert watch.synced
    assert not watch.present
    assert watch.state().served == ()


async def test_a_group_without_the_plural_counts_as_absent(kube: GroupsKube) -> None:
    kube.served_plurals[NEW] = {"somethingelse"}  # the group at this version, not this kind
    watch = make_watch(kube)
    await watch.discover()
    assert watch.synced
    assert watch.state().served == ()


async def test_a_group_that_appears_is_watched_without_a_restart(kube: GroupsKube) -> None:
    kube.serve(OLD, cr(OLD, "both"), cr(OLD, "old-only"))
    watch = make_watch(kube)
    await watch.discover()
    try:
        await until(lambda: watch.synced, "synced")
        kube.serve(NEW, cr(NEW, "both"))
        await watch.discover()
        assert watch.synced  # readiness is not taken back while the new group lists
        await until(lambda: watch.state().watched == (NEW, OLD), "both groups watched")
        assert routes(watch) == {"both": NEW, "old-only": OLD}
        assert watch.state().leftovers == {OLD: 1}
        assert watch.index.count(PLURAL) == 2

        # Watch events of each group land in that group's copies.
        kube.push(NEW, {"type": "ADDED", "object": cr(NEW, "new-only", rv=101)})
        kube.push(OLD, {"type": "DELETED", "object": cr(OLD, "both")})
        await until(lambda: "new-only" in routes(watch), "the new group's event")
        await until(lambda: watch.state().leftovers == {}, "the old group's event")
        assert routes(watch) == {"both": NEW, "old-only": OLD, "new-only": NEW}
    finally:
        await stop(watch)


async def test_a_group_that_goes_away_empties_what_came_from_it(kube: GroupsKube) -> None:
    kube.serve(NEW, cr(NEW, "both"), cr(NEW, "new-only"))
    kube.serve(OLD, cr(OLD, "both"), cr(OLD, "old-only"))
    watch = make_watch(kube)
    await watch.discover()
    try:
        await until(lambda: len(watch.state().watched) == 2, "both groups watched")
        assert routes(watch) == {"both": NEW, "new-only": NEW, "old-only": OLD}

        kube.unserve(OLD)
        await deleted(watch, OLD)
        await watch.discover()
        assert set(watch._tasks) == {(NEW, None)}
        assert routes(watch) == {"both": NEW, "new-only": NEW}
        assert watch.state().leftovers == {}

        # The preferred group going reveals the leftover copies again once it is back.
        kube.serve(OLD, cr(OLD, "both"), cr(OLD, "old-only"))
        await watch.discover()
        await until(lambda: "old-only" in routes(watch), "the old group again")
        kube.unserve(NEW)
        await deleted(watch, NEW)
        await watch.discover()
        assert routes(watch) == {"both": OLD, "old-only": OLD}
        assert watch.state().served == (OLD,)
    finally:
        await stop(watch)


async def test_a_group_discovery_misses_is_kept_while_its_lists_still_work(
    kube: GroupsKube,
) -> None:
    kube.serve(NEW, cr(NEW, "a"))
    watch = make_watch(kube)
    await watch.discover()
    try:
        await until(lambda: watch.synced, "synced")
        # Discovery lags behind (an API server just restarted): the group looks gone, but
        # nothing ended its watch, so its routes stay.
        del kube.served_plurals[NEW]
        await watch.discover()
        assert routes(watch) == {"a": NEW}
        assert set(watch._tasks) == {(NEW, None)}
        assert watch.state().served == ()
        assert watch.state().watched == (NEW,)
        kube.push(NEW, {"type": "ADDED", "object": cr(NEW, "b", rv=101)})
        await until(lambda: "b" in routes(watch), "an event after the miss")
    finally:
        await stop(watch)


async def test_a_group_discovery_misses_before_its_first_list_holds_readiness(
    kube: GroupsKube,
) -> None:
    kube.serve(NEW, cr(NEW, "a"))
    kube.held.add(NEW)  # the first list takes a while
    watch = make_watch(kube, groups=(NEW,))
    await watch.discover()
    try:
        del kube.served_plurals[NEW]  # discovery misses the group once meanwhile
        await watch.discover()
        # Not "synced" with nothing listed: the group's informer goes on to its first list.
        assert not watch.synced
        assert set(watch._tasks) == {(NEW, None)}
        kube.held.clear()
        await until(lambda: watch.synced, "synced by the first list")
        assert routes(watch) == {"a": NEW}
    finally:
        await stop(watch)


async def test_an_unexpected_discovery_failure_is_counted_and_retried(
    kube: GroupsKube, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kube.serve(NEW, cr(NEW, "a"))
    watch = make_watch(kube)
    watch.metrics.watch_kind_states(lambda: [watch.state()])
    delays: list[float] = []
    real_sleep = asyncio.sleep
    stale: list[bool] = []

    async def sleep(seconds: float) -> None:
        # asyncio.sleep itself is patched: `until` polls with it too.
        if 0.5 <= seconds < 3600:  # a backoff, not the recheck period
            delays.append(seconds)
            stale.append(watch.stale)
            if len(delays) == 3:
                kube.discovery_bug = None
        await real_sleep(0)

    monkeypatch.setattr("asyncio.sleep", sleep)
    # A 200 that is not JSON, or a credential plugin failing inside the client: not a
    # KubeError.
    kube.discovery_bug = ValueError("Expecting value: line 1 column 1")
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: len(delays) >= 3 and watch.discovery_ok, "discovery recovered")
        await until(lambda: watch.synced, "synced")
        assert not task.done()  # the kind's watch goes on
        assert stale[0] is True  # while discovery fails, the kind may be behind
        registry = watch.metrics.registry
        failures = registry.get_sample_value(
            "slo_api_watch_task_failures_total", {"kind": "llm", "task": "discovery"}
        )
        assert failures == 3
        assert delays[0] < delays[1] < 30
        assert any("unexpectedly" in r.getMessage() for r in caplog.records)
        assert routes(watch) == {"a": NEW}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_an_informer_that_fails_outside_its_handlers_is_restarted(
    kube: GroupsKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube.serve(NEW, cr(NEW, "a"))
    watch = make_watch(kube, groups=(NEW,))
    await watch.discover()
    try:
        await until(lambda: watch.synced and not watch.stale, "synced")
        informer = watch.informers[(NEW, None)]
        # A bug in what the loop does on a deleted CRD (its handler, outside any try).
        absent = informer._absent
        calls = 0

        def broken() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a bug")
            absent()

        monkeypatch.setattr(informer, "_absent", broken)
        kube.unserve(NEW)
        await until(
            lambda: (
                watch.metrics.registry.get_sample_value(
                    "slo_api_watch_task_failures_total", {"kind": "llm", "task": "informer"}
                )
                == 1
            ),
            "the failure counted",
        )
        assert watch.stale  # not watched while it restarts
        assert not watch._tasks[(NEW, None)].done()
        await until(lambda: not informer.present, "the restarted loop found the CRD gone")
        assert routes(watch) == {}
        assert not watch.stale  # known absent: nothing to be behind on
    finally:
        await stop(watch)


async def test_a_failed_discovery_holds_readiness_and_is_retried(
    kube: GroupsKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube.serve(NEW, cr(NEW, "a"))
    kube.discovery_error = KubeError(0, "Unavailable", "cannot reach the API server")
    watch = make_watch(kube)
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) == 2:
            kube.discovery_error = None
        await real_sleep(0)

    monkeypatch.setattr("slo_api.groups.asyncio.sleep", sleep)
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: len(delays) >= 2, "two failed discoveries")
        assert not watch.synced
        await until(lambda: watch.synced, "synced after discovery recovered")
        assert routes(watch) == {"a": NEW}
        assert delays[0] < 3600  # a backoff, not the recheck period
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert watch._tasks == {}  # stopping the kind stopped its group informers


async def test_the_groups_are_logged_once_synced_and_when_they_change(
    kube: GroupsKube, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slo_api.watch")
    kube.serve(NEW, cr(NEW, "both"))
    kube.serve(OLD, cr(OLD, "both"), cr(OLD, "old-only"))
    watch = make_watch(kube)
    await watch.discover()
    try:
        await until(lambda: len(watch.state().watched) == 2, "both groups watched")
        lines = [r.getMessage() for r in caplog.records if "groups of" in r.getMessage()]
        assert lines[-1] == (
            f"groups of llm (llmslorequirements/v1alpha1): {NEW} (served, watched), "
            f"{OLD} (served, watched); 2 CRs, 1 migration leftovers skipped"
        )
        assert any("a migration" in r.getMessage() for r in caplog.records)
        kube.unserve(OLD)
        await deleted(watch, OLD)
        await watch.discover()
        assert (
            caplog.records[-1]
            .getMessage()
            .endswith(
                f"{NEW} (served, watched), {OLD} (not served); 1 CRs, 0 migration leftovers skipped"
            )
        )
    finally:
        await stop(watch)


# -- metrics ---------------------------------------------------------------------------------


async def test_metrics_say_per_group_what_is_served_watched_and_left_over(
    kube: GroupsKube,
) -> None:
    kube.serve(NEW, cr(NEW, "both"))
    kube.serve(OLD, cr(OLD, "both"))
    watch = make_watch(kube)
    watch.metrics.watch_kind_states(lambda: [watch.state()])
    await watch.discover()
    try:
        await until(lambda: len(watch.state().watched) == 2, "both groups watched")
        registry = watch.metrics.registry

        def value(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, labels)

        assert value("slo_api_group_served", kind="llm", group=OLD) == 1
        assert value("slo_api_group_watched", kind="llm", group=NEW) == 1
        assert value("slo_api_group_leftovers", kind="llm", group=OLD) == 1
        assert value("slo_api_group_leftovers", kind="llm", group=NEW) == 0
        assert value("slo_api_index_objects", kind="llm") == 1  # the kind's gauges stay
        assert value("slo_api_kind_present", kind="llm") == 1
        kube.unserve(OLD)
        await deleted(watch, OLD)
        await watch.discover()
        assert value("slo_api_group_served", kind="llm", group=OLD) == 0
        assert value("slo_api_group_leftovers", kind="llm", group=OLD) == 0
    finally:
        await stop(watch)


# -- writes go where the copy shown lives ----------------------------------------------------


def test_a_target_names_the_group_of_the_copy_it_resolved_to() -> None:
    [llm, _, pool] = build_kinds(Settings(slo_api_token="x" * 16))
    old = Target.of("a", llm, cr(OLD, "a"))
    assert old.resource == Resource(OLD, "v1alpha1", PLURAL)
    assert (old.group, old.api_version) == (OLD, f"{OLD}/v1alpha1")
    assert Target.of("a", llm, cr(NEW, "a")).resource == Resource(NEW, "v1alpha1", PLURAL)
    # An object from a group the kind does not list (or none) is written to the preferred one.
    assert Target.of("a", llm, {"metadata": {}}).resource == llm.resource
    assert Target.of("a", pool, {"apiVersion": f"{OLD}/v1alpha1"}).resource == pool.resource


# -- settings --------------------------------------------------------------------------------


def test_the_default_groups() -> None:
    settings = Settings(slo_api_token="x" * 16)
    assert settings.llm_group == (NEW, OLD)
    assert settings.job_group == (NEW, OLD)
    assert settings.pool_group == ("inference.llmkube.dev",)
    llm, job, pool = build_kinds(settings)
    assert job.groups == (NEW, OLD)
    assert llm.groups == (NEW, OLD)
    assert llm.resource == Resource(NEW, "v1alpha1", PLURAL)
    assert pool.groups == ("inference.llmkube.dev",)


def test_a_group_list_is_read_in_order_with_spaces_trimmed() -> None:
    settings = Settings(slo_api_token="x" * 16, llm_group=f" {OLD} , {NEW} ")
    assert settings.llm_group == (OLD, NEW)
    assert build_kinds(settings)[0].resource.group == OLD


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (f"{NEW},,{OLD}", "has an empty group"),
        (f"{NEW},", "has an empty group"),
        ("", "has an empty group"),
        (f"{NEW},{OLD},{NEW}", f"lists {NEW} more than once"),
        ("inference.modelsphere.dev;inference.x-k8s.io", "is not an API group"),
        ("Inference.Example", "is not an API group"),
    ],
)
def test_bad_group_lists_are_refused_with_the_reason(value: str, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(slo_api_token="x" * 16, job_group=value)
    assert says in str(caught.value)


def test_the_process_exits_2_naming_a_bad_group_setting() -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLO_API_")},
        "SLO_API_TOKEN": "x",
        "LLM_GROUP": f"{NEW},{NEW}",
    }
    result = subprocess.run(
        [sys.executable, "-m", "slo_api"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "LLM_GROUP" in result.stderr
    assert f"lists {NEW} more than once" in result.stderr
