"""The index follows the API server through changes, outages, compaction and CRD churn (DESIGN §4).

Tests that only create, change and delete CRs use the shared session cluster. Tests that stop
the API server, compact etcd or delete CRDs run against a control plane of this module's own, so
nothing they break is seen by other modules. A `TcpProxy` (tests/integration/tcpproxy.py, a TCP
relay in front of the API server) lets a test cut slo-api off while the admin keeps working, or
freeze slo-api's connections so they go silent without closing, as a dead network path does.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.admin import Admin, AdminError
from controlplane.cluster import Cluster, crds
from slo_api.groups import KindWatch
from slo_api.index import CRIndex
from tests.conftest import control_plane
from tests.integration import crs
from tests.integration.service import RunningService, running
from tests.integration.tcpproxy import TcpProxy

pytestmark = pytest.mark.integration

JOB_CRD = "jobslorequirements.inference.modelsphere.dev"
JOB_GROUPS = ["inference.modelsphere.dev", "inference.x-k8s.io"]
LLM = (crs.SLO, "LLMSLORequirement")
JOB = (crs.SLO, "JobSLORequirement")

_ids = itertools.count(1)


# -- helpers -----------------------------------------------------------------------------------


def sample(service: RunningService, name: str, **labels: str) -> float:
    value = service.runtime.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def relists(service: RunningService, kind: str) -> float:
    return sample(service, "slo_api_watch_relists_total", kind=kind)


def restarts(service: RunningService, kind: str, reason: str) -> float:
    return sample(service, "slo_api_watch_restarts_total", kind=kind, reason=reason)


def upstream_calls(service: RunningService, verb: str) -> float:
    registry = service.runtime.metrics.registry
    return sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "slo_api_upstream_requests"
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("verb") == verb
    )


def uids(service: RunningService, route: str) -> list[str]:
    return [obj["metadata"]["uid"] for _, obj in service.indexed(route)]


def names(service: RunningService, plural: str, namespace: str) -> set[str]:
    return {
        obj["metadata"]["name"]
        for obj in service.runtime.index.objects(plural)
        if obj["metadata"]["namespace"] == namespace
    }


def informer(service: RunningService, kind: str) -> KindWatch:
    return next(i for i in service.runtime.informers if i.kind.name == kind)


def job_state(*, present: bool, objects: int) -> dict[str, object]:
    """The job kind in /readyz, served under the new group or not at all."""
    served = JOB_GROUPS[:1] if present else []
    return {
        "synced": True,
        "present": present,
        "stale": False,
        "objects": objects,
        "groups": JOB_GROUPS,
        "served": served,
        "watched": served,
        "leftovers": 0,
    }


def install_job_crd(admin: Admin) -> None:
    """Install the JobSLO CRD again and wait until it is served.

    Waits for Established itself first: right after creation the CRD's status.conditions can
    be null, which Admin.wait_crds does not expect.
    """
    [crd] = [c for c in crds() if c["metadata"]["name"] == JOB_CRD]
    admin.apply(crd)
    deadline = time.monotonic() + 60
    while True:
        status = (
            admin.request(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{JOB_CRD}"
            ).get("status")
            or {}
        )
        if any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ):
            break
        assert time.monotonic() < deadline, f"{JOB_CRD} not established"
        time.sleep(0.1)
    admin.wait_crds([crd])


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane of this module's own: its tests stop it, compact it, delete its CRDs."""
    with control_plane(tmp_path_factory, "watching-kubeconfigs") as started:
        yield started


@pytest.fixture
def own_admin(own: Cluster) -> Iterator[Admin]:
    """The own cluster's admin; every test leaves the API server up and every CRD installed."""
    assert own.admin is not None
    yield own.admin
    try:
        own.admin.request("GET", "/readyz")
    except (AdminError, httpx.HTTPError):
        own.plane.start_apiserver()
    try:
        own.admin.request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{JOB_CRD}"
        )
    except AdminError:
        install_job_crd(own.admin)


@pytest.fixture
def own_namespace(own_admin: Admin) -> str:
    name = f"w{os.getpid() % 10000}-{next(_ids)}"
    own_admin.ensure_namespace(name)
    return name


@pytest.fixture
def own_kubeconfig(own: Cluster) -> Path:
    assert own.credentials is not None
    return own.credentials.slo_api_kubeconfig


@pytest.fixture
async def gate(own: Cluster) -> AsyncIterator[TcpProxy]:
    async with TcpProxy("127.0.0.1", own.plane.port) as started:
        yield started


@pytest.fixture
def gated_kubeconfig(own_kubeconfig: Path, gate: TcpProxy, tmp_path: Path) -> Path:
    """slo-api's kubeconfig, pointed at the gate instead of the API server."""
    path = gate.kubeconfig(own_kubeconfig, tmp_path / "gated.kubeconfig")
    path.chmod(0o600)
    return path


# -- following changes (shared cluster) --------------------------------------------------------


async def test_a_service_id_change_moves_the_cr_and_a_delete_removes_it(
    service: RunningService, admin: Admin, namespace: str
) -> None:
    old, new = f"{namespace}-before", f"{namespace}-after"
    created = admin.create(crs.llm(namespace, "svc", service_id=old))
    await service.eventually(lambda: service.indexed(old), what="the CR under its first route")

    admin.merge_patch(*LLM, namespace, "svc", {"spec": {"serviceId": new}})
    await service.eventually(
        lambda: service.indexed(new) and not service.indexed(old), what="the route move"
    )
    assert uids(service, new) == [created["metadata"]["uid"]]
    assert old not in service.runtime.index.routes()
    assert old not in service.runtime.index.routes("llm")
    assert new in service.runtime.index.routes("llm")
    assert (await service.get(f"/routes/{old}")).status_code == 404
    assert (await service.get(f"/routes/{new}")).status_code == 200

    admin.delete(*LLM, namespace, "svc")
    await service.eventually(lambda: not service.indexed(new), what="the delete")
    assert new not in service.runtime.index.routes()
    assert service.runtime.index.get("llmslorequirements", namespace, "svc") is None
    assert (await service.get(f"/routes/{new}")).status_code == 404


async def test_a_delete_and_recreate_under_the_same_name_keeps_the_new_cr(
    service: RunningService, admin: Admin, namespace: str
) -> None:
    first_route, second_route = f"{namespace}-first", f"{namespace}-second"
    first = admin.create(crs.llm(namespace, "svc", service_id=first_route))
    await service.eventually(lambda: service.indexed(first_route), what="the first CR")

    # Back to back, so the watch delivers DELETED and ADDED for one name in a row.
    admin.delete(*LLM, namespace, "svc")
    second = admin.create(crs.llm(namespace, "svc", service_id=second_route))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]

    await service.eventually(
        lambda: uids(service, second_route) == [second["metadata"]["uid"]],
        what="the recreated CR",
    )
    assert not service.indexed(first_route)
    stored = service.runtime.index.get("llmslorequirements", namespace, "svc")
    assert stored is not None
    assert stored["metadata"]["uid"] == second["metadata"]["uid"]

    # Recreated under the same route too: the route points at the new UID, once.
    admin.delete(*LLM, namespace, "svc")
    third = admin.create(crs.llm(namespace, "svc", service_id=second_route))
    await service.eventually(
        lambda: uids(service, second_route) == [third["metadata"]["uid"]],
        what="the CR recreated under the same route",
    )


async def test_managed_fields_are_not_stored_from_lists_or_events(
    slo_api_kubeconfig: Path, admin: Admin, namespace: str
) -> None:
    listed_route, watched_route = f"{namespace}-listed", f"{namespace}-watched"
    listed = admin.create(crs.llm(namespace, "listed", service_id=listed_route))
    assert listed["metadata"].get("managedFields"), "the API server should send managedFields"

    async with running(slo_api_kubeconfig) as service:
        await service.eventually(lambda: service.indexed(listed_route), what="the listed CR")
        admin.create(crs.job(namespace, "watched", service_id=watched_route))
        await service.eventually(lambda: service.indexed(watched_route), what="the watched CR")
        admin.merge_patch(*LLM, namespace, "listed", {"spec": {"priority": 1}})
        await service.eventually(
            lambda: service.indexed(listed_route)[0][1]["spec"].get("priority") == 1,
            what="the modification",
        )
        for route in (listed_route, watched_route):
            [(_, obj)] = service.indexed(route)
            assert "managedFields" not in obj["metadata"], route
            assert obj["metadata"]["uid"], route  # the rest of metadata is kept


async def test_lists_are_streamed_through_watches(
    slo_api_kubeconfig: Path, admin: Admin, namespace: str
) -> None:
    routes = [f"{namespace}-s{i}" for i in range(30)]
    for i, route in enumerate(routes):
        admin.create(crs.llm(namespace, f"s{i}", service_id=route, priority=i % 11))
    # A CR Argo CD applied, as earlier tests leave in the shared cluster: the history lists its
    # revisions (to read the owners they remember), which are not the informers' lists. The
    # history is off here, so the count below is the informers' alone.
    marked = crs.llm(namespace, "marked", service_id=f"{namespace}-marked")
    marked["metadata"]["annotations"] = {"argocd.argoproj.io/tracking-id": "app:g/K:ns/marked"}
    admin.create(marked)
    async with running(slo_api_kubeconfig, route_history_entries=0) as service:
        for route in routes:
            [(_, obj)] = service.indexed(route)
            assert obj["spec"]["serviceId"] == route
            assert "managedFields" not in obj["metadata"]
        # Each kind's first list came as the initial events of a watch (sendInitialEvents),
        # never a paged list: neither side held the whole list at once.
        assert upstream_calls(service, "list") == 0
        assert relists(service, "llm") >= 1
        # And the watch that followed is live.
        admin.merge_patch(*LLM, namespace, "s0", {"spec": {"priority": 9}})
        await service.eventually(
            lambda: service.indexed(routes[0])[0][1]["spec"]["priority"] == 9, what="an update"
        )


# -- outages (own cluster) ---------------------------------------------------------------------


async def test_the_watch_recovers_after_the_api_server_restarts(
    own: Cluster, own_admin: Admin, own_namespace: str, own_kubeconfig: Path
) -> None:
    ns = own_namespace
    kept, changed, added = f"{ns}-kept", f"{ns}-changed", f"{ns}-added"
    own_admin.create(crs.llm(ns, "kept", service_id=kept))
    own_admin.create(crs.llm(ns, "changed", service_id=f"{ns}-unchanged"))

    # A stopping API server holds open watches silent until they end; the inactivity timeout
    # ends them (and keeps the stop short).
    async with running(own_kubeconfig, watch_inactivity_seconds=3) as service:
        await service.eventually(lambda: service.indexed(kept), what="the initial list")

        await asyncio.to_thread(own.plane.restart_apiserver)
        own_admin.merge_patch(*LLM, ns, "changed", {"spec": {"serviceId": changed}})
        own_admin.create(crs.llm(ns, "added", service_id=added))

        # No restart of slo-api: its watch loops find the API server again by themselves.
        await service.eventually(
            lambda: service.indexed(changed) and service.indexed(added),
            within=60,
            what="changes made after the restart",
        )
        assert not service.indexed(f"{ns}-unchanged")
        assert service.indexed(kept)
        assert (await service.get("/readyz")).status_code == 200
        # The API server is watched again: one more change arrives promptly.
        own_admin.delete(*LLM, ns, "kept")
        await service.eventually(lambda: not service.indexed(kept), what="a later delete")


RESTARTS = 3
OUTAGE_SECONDS = 25  # long enough for the refused reconnects to grow the backoff past 10 s
CURRENT_WITHIN = 10.0


async def test_the_index_is_current_within_seconds_of_each_api_server_restart(
    own: Cluster, own_admin: Admin, own_namespace: str, own_kubeconfig: Path
) -> None:
    ns = own_namespace
    own_admin.create(crs.llm(ns, "gone", service_id=f"{ns}-gone"))
    async with running(own_kubeconfig, watch_inactivity_seconds=3) as service:
        await service.eventually(lambda: service.indexed(f"{ns}-gone"), what="the initial list")
        for n in range(RESTARTS):
            recoveries = service.runtime.recovery.recoveries
            await asyncio.to_thread(own.plane.stop_apiserver)
            await asyncio.sleep(OUTAGE_SECONDS)
            # Returns once the API server's /readyz says 200.
            await asyncio.to_thread(own.plane.start_apiserver)
            ready_at = time.monotonic()
            route = f"{ns}-after-{n}"
            own_admin.create(crs.llm(ns, f"after-{n}", service_id=route))
            if n == 0:
                own_admin.delete(*LLM, ns, "gone")

            def current(route: str = route) -> bool:
                kinds = service.runtime.kind_states()
                return bool(service.indexed(route)) and not any(k.stale for k in kinds)

            left = CURRENT_WITHIN - (time.monotonic() - ready_at)
            await service.eventually(
                current, within=left, what=f"the index current after restart {n + 1}"
            )
            took = time.monotonic() - ready_at
            # Woken by the probe, not by the end of a backoff the outage grew.
            assert service.runtime.recovery.recoveries > recoveries
            assert not service.indexed(f"{ns}-gone")
            assert (await service.get("/readyz")).status_code == 200
            print(f"restart {n + 1}: the index was current {took:.1f}s after readiness")


@pytest.mark.parametrize("replace_turn", [None, 2], ids=["one-step", "built-aside"])
async def test_after_compaction_an_expired_watch_relists_and_drops_what_vanished(
    own: Cluster,
    own_admin: Admin,
    own_namespace: str,
    gated_kubeconfig: Path,
    gate: TcpProxy,
    replace_turn: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asides: list[object] = []
    if replace_turn is not None:
        # Three changes over a turn of two: the relist is applied to a copy of the index
        # built aside and swapped in, as one that changes over 1,000 CRs is.
        monkeypatch.setattr("slo_api.index.REPLACE_TURN", replace_turn)
        aside = CRIndex._aside

        def counted(index: CRIndex) -> CRIndex:
            asides.append(index)
            return aside(index)

        monkeypatch.setattr(CRIndex, "_aside", counted)
    ns = own_namespace
    for name in ("a", "b", "c"):
        own_admin.create(crs.llm(ns, name, service_id=f"{ns}-{name}"))
    own_admin.create(crs.job(ns, "j", service_id=f"{ns}-j"))

    # The history off: its lists of revisions (after each change it records) would count as
    # lists below, which are to be the informers' alone.
    async with running(gated_kubeconfig, route_history_entries=0) as service:
        await service.eventually(
            lambda: service.indexed(f"{ns}-c") and service.indexed(f"{ns}-j"), what="the list"
        )
        relists_before = relists(service, "llm")
        expired_before = restarts(service, "llm", "expired")
        # The first lists were streamed through watches, not paged.
        assert upstream_calls(service, "list") == 0

        # slo-api loses the API server; meanwhile CRs change, the API server restarts with a
        # fresh watch cache, and etcd forgets the history slo-api would resume from.
        gate.down()
        own_admin.delete(*LLM, ns, "b")
        own_admin.merge_patch(*LLM, ns, "a", {"spec": {"serviceId": f"{ns}-a2"}})
        own_admin.create(crs.llm(ns, "d", service_id=f"{ns}-d"))
        await asyncio.to_thread(own.plane.stop_apiserver)
        own.plane.compact_etcd()
        await asyncio.to_thread(own.plane.start_apiserver)
        gate.up()

        await service.eventually(
            lambda: relists(service, "llm") > relists_before, within=60, what="a relist"
        )
        # Nothing stale: the list replaced the kind's entries, the deleted CR went with it.
        assert names(service, "llmslorequirements", ns) == {"a", "c", "d"}
        assert not service.indexed(f"{ns}-b")
        assert not service.indexed(f"{ns}-a")
        assert service.indexed(f"{ns}-a2")
        assert service.indexed(f"{ns}-d")
        assert service.indexed(f"{ns}-j")
        # It relisted because the watch it resumed was refused with 410 (Expired), the way
        # client-go's reflector recovers, not because a broken connection forced a relist.
        assert restarts(service, "llm", "expired") > expired_before
        # After a 410 the relist pages through etcd, as client-go's reflector does.
        assert upstream_calls(service, "list") > 0
        assert (await service.get("/readyz")).status_code == 200
        assert bool(asides) == (replace_turn is not None)


async def test_a_change_seen_only_in_a_relist_is_in_the_history_once(
    own: Cluster, own_admin: Admin, own_namespace: str, gated_kubeconfig: Path, gate: TcpProxy
) -> None:
    """A relist has no state between the last one watched and the one listed: the history
    records that one difference, once, and nothing again for what was recorded before."""
    ns = own_namespace
    own_admin.create(crs.llm(ns, "h", service_id=f"{ns}-h", priority=1))
    route = f"{ns}-h"
    async with running(gated_kubeconfig) as service:
        await service.eventually(lambda: service.indexed(route), what="the list")
        assert (await service.put(f"/routes/{route}", {"priority": 2})).is_success

        async def recorded(at_least: int) -> bool:
            got = await service.get(f"/routes/{route}/history")
            return bool(got.status_code == 200 and got.json()["total"] >= at_least)

        # The write's event observed (its revision is in) before the watch is cut: a write
        # whose event the cut swallows is inside the relist's gap, and has no revision of
        # its own (its answer alone does not show what else changed up to the listed state).
        await service.eventually(lambda: recorded(1), within=60, what="the write recorded")
        relists_before = relists(service, "llm")
        gate.down()
        for priority in (5, 7):  # two changes: the relist shows only the last
            own_admin.request(
                "PATCH",
                own_admin.path(*LLM, ns, "h"),
                {"spec": {"priority": priority}},
                "application/merge-patch+json",
                params={"fieldManager": "kubectl-patch"},
            )
        await asyncio.to_thread(own.plane.stop_apiserver)
        own.plane.compact_etcd()
        await asyncio.to_thread(own.plane.start_apiserver)
        gate.up()
        await service.eventually(
            lambda: relists(service, "llm") > relists_before, within=60, what="a relist"
        )

        await service.eventually(lambda: recorded(2), within=120, what="both changes recorded")
        await service.runtime.history.close()
        history = (await service.get(f"/routes/{route}/history")).json()
    assert history["total"] == 2, history
    relisted, written = history["items"]
    assert relisted["changes"] == [{"field": "priority", "from": 2, "to": 7}]
    # A listed copy keeps only the GitOps tools' managedFields: otherwise nobody is named.
    assert relisted["actor"] == "unknown"
    assert written["changes"] == [{"field": "priority", "from": 1, "to": 2}]
    assert written["actor"] == "token:write"


async def test_a_silent_connection_is_reconnected_without_a_relist(
    own_admin: Admin, own_namespace: str, gated_kubeconfig: Path, gate: TcpProxy
) -> None:
    ns = own_namespace
    async with running(gated_kubeconfig, watch_inactivity_seconds=2) as service:
        # Ready means listed; an event after that proves the watch itself is open, so the
        # black hole below catches it (and not a watch still being opened).
        own_admin.create(crs.llm(ns, "early", service_id=f"{ns}-early"))
        await service.eventually(lambda: service.indexed(f"{ns}-early"), what="the watch open")
        relists_before = relists(service, "llm")
        assert gate.freeze() >= 1  # slo-api's open watches go quiet and never close
        own_admin.create(crs.llm(ns, "late", service_id=f"{ns}-late"))
        await service.eventually(
            lambda: service.indexed(f"{ns}-late"), within=30, what="the event after reconnecting"
        )
        assert restarts(service, "llm", "inactive") >= 1
        # It resumed from the last resourceVersion: no list was needed.
        assert relists(service, "llm") == relists_before


# -- CRDs coming and going (own cluster) -------------------------------------------------------


async def test_a_missing_crd_is_ready_as_absent_and_picked_up_when_installed(
    own: Cluster, own_admin: Admin, own_namespace: str, own_kubeconfig: Path
) -> None:
    ns = own_namespace
    route = f"{ns}-job"
    own_admin.create(crs.llm(ns, "llm", service_id=f"{ns}-llm"))
    await asyncio.to_thread(own_admin.delete_crd, JOB_CRD)

    async with running(own_kubeconfig, crd_recheck_seconds=1) as service:
        ready = await service.get("/readyz")
        assert ready.status_code == 200, ready.text
        kinds = ready.json()["kinds"]
        assert kinds["job"] == job_state(present=False, objects=0)
        assert kinds["llm"]["present"] is True
        assert sample(service, "slo_api_kind_present", kind="job") == 0.0
        assert service.indexed(f"{ns}-llm")
        assert (await service.get(f"/routes/{route}")).status_code == 404

        await asyncio.to_thread(install_job_crd, own_admin)
        own_admin.create(crs.job(ns, "job", service_id=route))
        await service.eventually(lambda: service.indexed(route), what="the job route")
        assert informer(service, "job").present
        assert (await service.get(f"/routes/{route}")).status_code == 200
        ready = await service.get("/readyz")
        assert ready.json()["kinds"]["job"] == job_state(present=True, objects=1)


async def test_a_crd_deleted_while_watched_empties_only_its_kind(
    own: Cluster, own_admin: Admin, own_namespace: str, own_kubeconfig: Path
) -> None:
    ns = own_namespace
    own_admin.create(crs.llm(ns, "llm", service_id=f"{ns}-llm"))
    own_admin.create(crs.job(ns, "job", service_id=f"{ns}-job"))

    async with running(own_kubeconfig, crd_recheck_seconds=1) as service:
        await service.eventually(lambda: service.indexed(f"{ns}-job"), what="the job route")
        await asyncio.to_thread(own_admin.delete_crd, JOB_CRD)
        job = informer(service, "job")
        await service.eventually(
            lambda: not job.present and service.runtime.index.count("jobslorequirements") == 0,
            what="the job kind emptied",
        )
        assert service.runtime.index.routes("job") == []
        assert service.indexed(f"{ns}-llm")
        ready = await service.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["kinds"]["job"] == job_state(present=False, objects=0)

        # Installed again, it is found again.
        await asyncio.to_thread(install_job_crd, own_admin)
        with pytest.raises(AdminError):
            own_admin.get(*JOB, ns, "job")  # the CRs went with their CRD
        own_admin.create(crs.job(ns, "job2", service_id=f"{ns}-job2"))
        await service.eventually(lambda: service.indexed(f"{ns}-job2"), what="the new job CR")
        assert job.present
