"""The SLO kinds under the old API group, the new one, or both (a migration), on a real API server.

These tests install and delete CRDs, so they run on a control plane of this module's own (as
test_watching_cluster's CRD tests do) and leave it as they found it: the new group's CRDs installed,
the old group's absent. The old group's CRDs are config/crd's with the group changed.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.admin import Admin, AdminError, Obj
from controlplane.cluster import Cluster, crds
from tests.integration import crs
from tests.integration.grants import assert_exactly_slo_api_verbs
from tests.integration.own import own_control_plane
from tests.integration.process import TOKEN, start_process
from tests.integration.service import RunningService, running
from tests.integration.test_watch_stream import Stream, initial, served

pytestmark = pytest.mark.integration

NEW, OLD = "inference.modelsphere.dev", "inference.x-k8s.io"
OLD_SLO = f"{OLD}/v1alpha1"
LLM_KIND, JOB_KIND = "LLMSLORequirement", "JobSLORequirement"
SLO_PLURALS = ("llmslorequirements", "jobslorequirements")

_ids = itertools.count(1)


# -- CRDs of either group ----------------------------------------------------------------------


def slo_crds(group: str) -> list[Obj]:
    """config/crd's SLO CRDs, served under `group`."""
    out = []
    for crd in crds():
        if crd["spec"]["group"] != NEW:
            continue
        moved = copy.deepcopy(crd)
        moved["spec"]["group"] = group
        moved["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{group}"
        out.append(moved)
    assert len(out) == 2
    return out


def crd_installed(admin: Admin, plural: str, group: str) -> bool:
    try:
        admin.request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{group}"
        )
    except AdminError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def install(admin: Admin, group: str, plurals: tuple[str, ...] = SLO_PLURALS) -> None:
    wanted = [c for c in slo_crds(group) if c["spec"]["names"]["plural"] in plurals]
    admin.apply_all(wanted)
    admin.wait_crds(wanted)


def uninstall(admin: Admin, group: str, plurals: tuple[str, ...] = SLO_PLURALS) -> None:
    for plural in plurals:
        if crd_installed(admin, plural, group):
            admin.delete_crd(f"{plural}.{group}")


def under(group: str, obj: Obj) -> Obj:
    """The CR as it would be created under `group`."""
    return {**copy.deepcopy(obj), "apiVersion": f"{group}/v1alpha1"}


# -- fixtures ----------------------------------------------------------------------------------


# A control plane of this module's own: its tests delete and install CRDs.
_own = own_control_plane("groups-kubeconfigs", "own_kubeconfig")
own, own_kubeconfig = _own.cluster, _own.kubeconfig


@pytest.fixture
def own_admin(own: Cluster) -> Iterator[Admin]:
    """The own cluster's admin; every test ends with the new group's CRDs and not the old's."""
    assert own.admin is not None
    yield own.admin
    uninstall(own.admin, OLD)
    missing = tuple(p for p in SLO_PLURALS if not crd_installed(own.admin, p, NEW))
    if missing:
        install(own.admin, NEW, missing)


@pytest.fixture
def ns(own_admin: Admin) -> str:
    name = f"g{os.getpid() % 10000}-{next(_ids)}"
    own_admin.ensure_namespace(name)
    return name


def only_old_group(admin: Admin) -> None:
    uninstall(admin, NEW)
    install(admin, OLD)


def stored(admin: Admin, group: str, kind: str, namespace: str, name: str) -> Obj:
    return admin.get(f"{group}/v1alpha1", kind, namespace, name)


def config_routes(body: Obj) -> list[str]:
    return [item["route"] for item in body["items"]]


async def all_routes(service: RunningService) -> list[str]:
    listed = await service.get("/config", params={"pageSize": "200"})
    assert listed.status_code == 200, listed.text
    return config_routes(listed.json())


def shown_group(service: RunningService, route: str) -> str | None:
    claims = service.indexed(route)
    return str(claims[0][1]["apiVersion"]).split("/")[0] if len(claims) == 1 else None


def llm_groups(service: RunningService) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The LLM kind's served and watched groups."""
    [state] = [s for s in service.runtime.kind_states() if s.kind == "llm"]
    return state.served, state.watched


def leftovers(service: RunningService, group: str) -> float:
    value = service.runtime.metrics.registry.get_sample_value(
        "slo_api_group_leftovers", {"kind": "llm", "group": group}
    )
    return value if value is not None else -1.0


# -- only the old group ------------------------------------------------------------------------


async def test_with_only_the_old_group_every_operation_works_with_default_settings(
    own_admin: Admin, ns: str, own_kubeconfig: Path, tmp_path: Path
) -> None:
    only_old_group(own_admin)
    llm_route, job_route, pool_route = f"chat-{ns}", f"render-{ns}", f"slot-{ns}"
    own_admin.create(under(OLD, crs.llm(ns, "chat", service_id=llm_route, priority=3)))
    own_admin.create(under(OLD, crs.job(ns, "render", service_id=job_route)))
    own_admin.create(crs.pool(ns, pool_route, [llm_route], swapPolicy="sticky"))

    # The real process with nothing about groups in its environment.
    process = await start_process(own_kubeconfig, tmp_path)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(base_url=process.url, headers=auth, timeout=30) as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
            for kind in ("llm", "job"):
                assert ready.json()["kinds"][kind] == {
                    "synced": True,
                    "present": True,
                    "stale": False,
                    "objects": 1,
                    "groups": [NEW, OLD],
                    "served": [OLD],
                    "watched": [OLD],
                    "leftovers": 0,
                }

            read = await client.get(f"/routes/{llm_route}")
            assert read.status_code == 200, read.text
            assert read.json()["priority"] == 3
            assert read.json()["pool"]["route"] == pool_route
            etag = read.headers["etag"]

            written = await client.put(
                f"/routes/{llm_route}",
                json={"route": llm_route, "priority": 6},
                headers={"If-Match": etag},
            )
            assert written.status_code == 200, written.text
            assert written.json()["priority"] == 6
            assert stored(own_admin, OLD, LLM_KIND, ns, "chat")["spec"]["priority"] == 6

            # The legacy path, as the platform daemon calls it.
            job = await client.put(
                f"/config/{job_route}", json={"route": job_route, "highPriority": True}
            )
            assert job.status_code == 200, job.text
            assert stored(own_admin, OLD, JOB_KIND, ns, "render")["spec"]["priority"] == 10
            assert (await client.get(f"/config/{job_route}")).json()["priority"] == 10

            reset = await client.delete(f"/routes/{llm_route}")
            assert reset.status_code == 204
            assert stored(own_admin, OLD, LLM_KIND, ns, "chat")["spec"]["priority"] == 0

            pool = await client.put(f"/routes/{pool_route}", json={"pool": {"swapBudget": "90s"}})
            assert pool.status_code == 200, pool.text

            listed = await client.get("/config", params={"pageSize": "200"})
            assert listed.status_code == 200
            assert {llm_route, job_route, pool_route} <= set(config_routes(listed.json()))
            assert (await client.get(f"/routes/nope-{ns}")).status_code == 404
    finally:
        process.proc.terminate()
        process.proc.wait(timeout=30)

    logged = [str(line.get("message", "")) for line in process.lines() if "groups of" in str(line)]
    assert any(
        m.startswith("groups of llm (llmslorequirements/v1alpha1): ")
        and f"{NEW} (not served), {OLD} (served, watched)" in m
        and "0 migration leftovers skipped" in m
        for m in logged
    ), json.dumps(logged)


def _role(namespace: str, name: str, group: str) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [
            {
                "apiGroups": [group],
                "resources": list(SLO_PLURALS),
                "verbs": ["get", "list", "watch", "patch"],
            }
        ],
    }


def _bind(namespace: str, name: str, kind: str, role: str) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }


async def test_kubernetes_identities_are_reviewed_on_the_group_that_holds_the_cr(
    own_admin: Admin, ns: str, own_kubeconfig: Path
) -> None:
    """Only the old group is served. `editor` holds slo-api-edit (which covers both groups);
    `newcomer` holds every verb, but on the new group only, where no CR is: it must not reach
    the old group's CR through slo-api's own rights."""
    only_old_group(own_admin)
    route = f"chat-{ns}"
    own_admin.create(under(OLD, crs.llm(ns, "chat", service_id=route, priority=3)))
    own_admin.create(_role(ns, "new-group-only", NEW))
    for who, kind, role in (
        ("editor", "ClusterRole", "slo-api-edit"),
        ("newcomer", "Role", "new-group-only"),
    ):
        own_admin.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": who, "namespace": ns},
            }
        )
        own_admin.create(_bind(ns, who, kind, role))
    auth = {
        who: {"Authorization": f"Bearer {own_admin.service_account_token(ns, who)}"}
        for who in ("editor", "newcomer")
    }
    async with running(own_kubeconfig, slo_api_kubernetes_auth=True) as service:
        await service.eventually(lambda: service.indexed(route), what=route)
        client = service.client
        editor, newcomer = auth["editor"], auth["newcomer"]

        read = await client.get(f"/routes/{route}", headers=editor)
        assert read.status_code == 200, read.text
        written = await client.put(f"/routes/{route}", json={"priority": 5}, headers=editor)
        assert written.status_code == 200, written.text
        assert stored(own_admin, OLD, LLM_KIND, ns, "chat")["spec"]["priority"] == 5
        listed = await client.get("/config", params={"pageSize": "200"}, headers=editor)
        assert route in config_routes(listed.json())

        for method, body in (("GET", None), ("PUT", {"priority": 9}), ("DELETE", None)):
            refused = await client.request(method, f"/routes/{route}", json=body, headers=newcomer)
            assert refused.status_code == 404, (method, refused.text)
        listed = await client.get("/config", params={"pageSize": "200"}, headers=newcomer)
        assert route not in config_routes(listed.json())
        stream = await client.get(
            "/config", params={"watch": "true", "kind": "llm"}, headers=newcomer
        )
        assert stream.status_code == 403, stream.text
        assert stored(own_admin, OLD, LLM_KIND, ns, "chat")["spec"]["priority"] == 5


# -- both groups (a migration) -----------------------------------------------------------------


async def test_during_a_migration_the_preferred_copy_answers_and_old_only_crs_stay_writable(
    own_admin: Admin, ns: str, own_kubeconfig: Path
) -> None:
    install(own_admin, OLD)
    both, old_only = f"both-{ns}", f"legacy-{ns}"
    own_admin.create(under(OLD, crs.llm(ns, "svc", service_id=both, priority=2)))
    own_admin.create(under(OLD, crs.llm(ns, "legacy", service_id=old_only, priority=1)))
    # The migration copied one CR under the same namespace and name into the new group.
    own_admin.create(crs.llm(ns, "svc", service_id=both, priority=7))

    async with running(own_kubeconfig) as service:
        await service.eventually(
            lambda: shown_group(service, both) == NEW and service.indexed(old_only),
            what="both routes",
        )
        read = await service.get(f"/routes/{both}")
        assert read.status_code == 200, read.text  # not 409: the old copy is a leftover
        assert read.json()["priority"] == 7
        assert (await all_routes(service)).count(both) == 1
        assert (await service.get(f"/routes/{old_only}")).json()["priority"] == 1

        ready = (await service.get("/readyz")).json()["kinds"]["llm"]
        assert ready["served"] == [NEW, OLD]
        assert ready["watched"] == [NEW, OLD]
        assert ready["leftovers"] == 1
        assert ready["objects"] == 2
        assert leftovers(service, OLD) == 1

        # A write lands in the group that holds the copy shown; the leftover is untouched.
        changed = await service.put(f"/routes/{both}", {"priority": 8})
        assert changed.status_code == 200, changed.text
        assert stored(own_admin, NEW, LLM_KIND, ns, "svc")["spec"]["priority"] == 8
        assert stored(own_admin, OLD, LLM_KIND, ns, "svc")["spec"]["priority"] == 2
        legacy = await service.put(f"/routes/{old_only}", {"priority": 4})
        assert legacy.status_code == 200, legacy.text
        assert stored(own_admin, OLD, LLM_KIND, ns, "legacy")["spec"]["priority"] == 4
        assert (await service.delete(f"/routes/{old_only}")).status_code == 204
        assert stored(own_admin, OLD, LLM_KIND, ns, "legacy")["spec"]["priority"] == 0

        # The preferred copy deleted: the leftover is the route again, and is written there.
        own_admin.delete(crs.SLO, LLM_KIND, ns, "svc")
        await service.eventually(lambda: shown_group(service, both) == OLD, what="the old copy")
        assert (await service.get(f"/routes/{both}")).json()["priority"] == 2
        assert (await service.put(f"/routes/{both}", {"priority": 5})).status_code == 200
        assert stored(own_admin, OLD, LLM_KIND, ns, "svc")["spec"]["priority"] == 5
        assert leftovers(service, OLD) == 0

        # Copied again, the new group's copy takes the route back.
        own_admin.create(crs.llm(ns, "svc", service_id=both, priority=9))
        await service.eventually(lambda: shown_group(service, both) == NEW, what="the new copy")
        assert (await service.get(f"/routes/{both}")).json()["priority"] == 9
        assert (await all_routes(service)).count(both) == 1


async def test_during_a_migration_each_cr_is_shown_to_whoever_may_read_its_own_group(
    own_admin: Admin, ns: str, own_kubeconfig: Path
) -> None:
    """A namespace holds CRs of both groups; `newcomer`'s Role grants get, list and watch on the
    new group only. GET, /config (both views) and the stream agree: the new group's CR, not the
    old group's beside it."""
    install(own_admin, OLD)
    moved, legacy = f"moved-{ns}", f"legacy-{ns}"
    own_admin.create(crs.llm(ns, "moved", service_id=moved))
    own_admin.create(under(OLD, crs.llm(ns, "legacy", service_id=legacy)))
    own_admin.create(_role(ns, "new-group-only", NEW))
    own_admin.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "newcomer", "namespace": ns},
        }
    )
    own_admin.create(_bind(ns, "newcomer", "Role", "new-group-only"))
    newcomer = {"Authorization": f"Bearer {own_admin.service_account_token(ns, 'newcomer')}"}
    async with served(own_kubeconfig, slo_api_kubernetes_auth=True) as (service, client):
        await service.eventually(
            lambda: shown_group(service, moved) == NEW and shown_group(service, legacy) == OLD,
            what="both routes",
        )
        assert (await client.get(f"/routes/{moved}", headers=newcomer)).status_code == 200
        assert (await client.get(f"/routes/{legacy}", headers=newcomer)).status_code == 404
        for view in ("summary", "full"):
            listed = await client.get(
                "/config", params={"pageSize": "200", "view": view}, headers=newcomer
            )
            assert listed.status_code == 200, listed.text
            assert config_routes(listed.json()) == [moved], view
        request = client.build_request(
            "GET", "/config", params={"watch": "true", "kind": "llm"}, headers=newcomer
        )
        response = await client.send(request, stream=True)
        try:
            assert response.status_code == 200, await response.aread()
            events = await Stream(response).until(initial)
            assert [e["route"] for e in events if e["type"] == "ADDED"] == [moved]
        finally:
            await response.aclose()


async def test_two_different_crs_claiming_a_route_conflict_across_groups(
    own_admin: Admin, ns: str, own_kubeconfig: Path
) -> None:
    install(own_admin, OLD)
    route = f"dup-{ns}"
    own_admin.create(under(OLD, crs.llm(ns, "old-name", service_id=route)))
    own_admin.create(crs.llm(ns, "new-name", service_id=route))

    async with running(own_kubeconfig) as service:
        await service.eventually(lambda: len(service.indexed(route)) == 2, what="both claims")
        for answer in (
            await service.get(f"/routes/{route}"),
            await service.put(f"/routes/{route}", {"priority": 1}),
            await service.delete(f"/routes/{route}"),
        ):
            assert answer.status_code == 409, answer.text
            assert "2 CRs" in answer.json()["error"]["message"]
        listed = await service.get("/config", params={"pageSize": "200"})
        [line] = [i for i in listed.json()["items"] if i["route"] == route]
        assert line["ambiguous"] is True


# -- CRDs coming and going while running -------------------------------------------------------


async def test_deleting_the_old_crd_leaves_the_new_groups_routes_and_drops_the_rest(
    own_admin: Admin, ns: str, own_kubeconfig: Path
) -> None:
    install(own_admin, OLD)
    both, old_only, new_only = f"both-{ns}", f"legacy-{ns}", f"fresh-{ns}"
    own_admin.create(under(OLD, crs.llm(ns, "svc", service_id=both)))
    own_admin.create(crs.llm(ns, "svc", service_id=both, priority=7))
    own_admin.create(under(OLD, crs.llm(ns, "legacy", service_id=old_only)))
    own_admin.create(crs.llm(ns, "fresh", service_id=new_only))
    own_admin.create(under(OLD, crs.job(ns, "old-job", service_id=f"job-{ns}")))

    async with running(own_kubeconfig, crd_recheck_seconds=1) as service:
        await service.eventually(
            lambda: service.indexed(old_only) and service.indexed(new_only), what="the routes"
        )
        uninstall(own_admin, OLD, ("llmslorequirements",))

        await service.eventually(lambda: not service.indexed(old_only), what="old-only gone")
        # Its watch ended, its informer found it gone and discovery agrees.
        await service.eventually(
            lambda: llm_groups(service) == ((NEW,), (NEW,)), what="rediscovery"
        )
        assert (await service.get(f"/routes/{old_only}")).status_code == 404
        assert (await service.get(f"/routes/{both}")).json()["priority"] == 7
        assert (await service.get(f"/routes/{new_only}")).status_code == 200
        routes = await all_routes(service)
        assert both in routes
        assert new_only in routes
        assert old_only not in routes
        ready = await service.get("/readyz")
        assert ready.status_code == 200
        llm = ready.json()["kinds"]["llm"]
        assert (llm["served"], llm["watched"], llm["leftovers"]) == ([NEW], [NEW], 0)
        # Only the LLM kind's old CRD went: the job kind still serves its old-group CR.
        assert ready.json()["kinds"]["job"]["served"] == [NEW, OLD]
        assert (await service.get(f"/routes/job-{ns}")).status_code == 200


async def test_installing_the_new_crd_while_running_is_picked_up_without_a_restart(
    own_admin: Admin, ns: str, own_kubeconfig: Path
) -> None:
    only_old_group(own_admin)
    both, old_only = f"both-{ns}", f"legacy-{ns}"
    own_admin.create(under(OLD, crs.llm(ns, "svc", service_id=both, priority=2)))
    own_admin.create(under(OLD, crs.llm(ns, "legacy", service_id=old_only)))

    async with running(own_kubeconfig, crd_recheck_seconds=1) as service:
        assert (await service.get(f"/routes/{both}")).json()["priority"] == 2
        assert (await service.get("/readyz")).json()["kinds"]["llm"]["served"] == [OLD]

        install(own_admin, NEW, ("llmslorequirements",))
        own_admin.create(crs.llm(ns, "svc", service_id=both, priority=7))
        await service.eventually(lambda: shown_group(service, both) == NEW, what="the new copy")
        assert (await service.get(f"/routes/{both}")).json()["priority"] == 7
        assert (await service.get(f"/routes/{old_only}")).status_code == 200
        ready = (await service.get("/readyz")).json()["kinds"]["llm"]
        assert ready["served"] == [NEW, OLD]
        assert ready["leftovers"] == 1
        assert (await service.put(f"/routes/{both}", {"priority": 8})).status_code == 200
        assert stored(own_admin, NEW, LLM_KIND, ns, "svc")["spec"]["priority"] == 8
        assert stored(own_admin, OLD, LLM_KIND, ns, "svc")["spec"]["priority"] == 2


# -- RBAC --------------------------------------------------------------------------------------


def test_the_service_account_has_exactly_its_verbs_under_the_old_group(
    own: Cluster, own_admin: Admin, ns: str
) -> None:
    install(own_admin, OLD)
    own_admin.create(under(OLD, crs.llm(ns, "rbac")))
    own_admin.create(under(OLD, crs.job(ns, "rbac-job")))
    sa = own.slo_api_client()
    try:
        for kind, name in ((LLM_KIND, "rbac"), (JOB_KIND, "rbac-job")):
            assert_exactly_slo_api_verbs(sa, OLD_SLO, kind, ns, name)
    finally:
        sa.close()
