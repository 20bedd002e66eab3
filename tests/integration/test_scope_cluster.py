"""Scoped watching on a real API server, with the namespaced overlay's RBAC and nothing more.

This module's own control plane has config/overlays/namespaced's Roles and RoleBindings and not
the ClusterRoleBinding, so slo-api's ServiceAccount may touch the three kinds only in the
overlay's namespaces; slo-api, told to watch just those (WATCH_NAMESPACES), works with that.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.admin import Admin, AdminError, load_yaml_dir
from controlplane.cluster import CONFIG, Cluster
from tests.conftest import control_plane
from tests.integration import crs
from tests.integration.grants import assert_exactly_slo_api_verbs
from tests.integration.service import RunningService, running

pytestmark = pytest.mark.integration

OVERLAY = CONFIG / "overlays" / "namespaced"
ELSEWHERE = "elsewhere"
LLM = (crs.SLO, "LLMSLORequirement")
# Each kind, and the suffix create_all gives its CR's name.
KINDS = ((*LLM, ""), (crs.SLO, "JobSLORequirement", "-job"), (crs.POOL, "ModelPool", "-pool"))

_ids = itertools.count(1)


def watched_namespaces() -> list[str]:
    """WATCH_NAMESPACES as the overlay's Deployment patch sets it."""
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    for patch in kustomization["patches"]:
        for op in yaml.safe_load(patch["patch"]):
            value = op.get("value") or {}
            if value.get("name") == "WATCH_NAMESPACES":
                return str(value["value"]).split(",")
    raise AssertionError("the overlay does not set WATCH_NAMESPACES")


NAMESPACES = watched_namespaces()


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane whose slo-api identity has only the namespaced overlay's grants."""
    with control_plane(tmp_path_factory, "scope-kubeconfigs") as started:
        admin = started.admin
        assert admin is not None
        admin.request("DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/slo-api")
        for namespace in [*NAMESPACES, ELSEWHERE]:
            admin.ensure_namespace(namespace)
        admin.apply_all(load_yaml_dir(OVERLAY))
        yield started


@pytest.fixture
def own_admin(own: Cluster) -> Admin:
    assert own.admin is not None
    return own.admin


@pytest.fixture
def own_kubeconfig(own: Cluster) -> Path:
    assert own.credentials is not None
    return own.credentials.slo_api_kubeconfig


@pytest.fixture
def tag() -> str:
    """A prefix for this test's CR and route names (the namespaces are shared)."""
    return f"s{next(_ids)}"


def create_all(admin: Admin, namespace: str, name: str) -> None:
    """An LLM route `name`, a job route `name-job` and a pool `name-pool` holding the LLM."""
    admin.create(crs.llm(namespace, name))
    admin.create(crs.job(namespace, f"{name}-job"))
    admin.create(crs.pool(namespace, f"{name}-pool", [name]))


def labelled(obj: dict[str, Any], **labels: str) -> dict[str, Any]:
    obj["metadata"]["labels"] = labels
    return obj


async def config_routes(service: RunningService) -> set[str]:
    listed = await service.get("/config", params={"pageSize": "200"})
    assert listed.status_code == 200, listed.text
    return {item["route"] for item in listed.json()["items"]}


# -- RBAC ---------------------------------------------------------------------------------------


def test_the_overlay_grants_exactly_its_verbs_and_only_in_the_watched_namespaces(
    own: Cluster, own_admin: Admin, tag: str
) -> None:
    for namespace in (*NAMESPACES, ELSEWHERE):
        create_all(own_admin, namespace, tag)
    sa = own.slo_api_client()
    try:
        for api, kind, suffix in KINDS:
            name = f"{tag}{suffix}"
            for namespace in NAMESPACES:
                assert_exactly_slo_api_verbs(sa, api, kind, namespace, name, listed_in=namespace)
            # Nothing outside the watched namespaces, and nothing cluster-wide.
            for refused in (
                sa.path(api, kind, ELSEWHERE, name),
                sa.path(api, kind, ELSEWHERE),
                sa.path(api, kind),
            ):
                with pytest.raises(AdminError) as caught:
                    sa.request("GET", refused)
                assert caught.value.status == 403, refused
        with pytest.raises(AdminError) as secrets:
            sa.request("GET", f"/api/v1/namespaces/{NAMESPACES[0]}/secrets")
        assert secrets.value.status == 403
    finally:
        sa.close()


# -- scoped watching ----------------------------------------------------------------------------


async def test_with_watch_namespaces_it_runs_on_roles_and_never_shows_other_namespaces(
    own_admin: Admin, own_kubeconfig: Path, tag: str
) -> None:
    inside, outside = f"{tag}-in", f"{tag}-out"
    create_all(own_admin, NAMESPACES[0], inside)
    create_all(own_admin, ELSEWHERE, outside)

    scope = ",".join(NAMESPACES)
    async with running(own_kubeconfig, watch_namespaces=scope) as service:
        ready = await service.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["scope"] == {"namespaces": NAMESPACES, "labelSelector": None}
        assert ready.json()["kinds"]["pool"]["watched"] == ["inference.llmkube.dev"]

        for route in (inside, f"{inside}-job", f"{inside}-pool"):
            assert (await service.get(f"/routes/{route}")).status_code == 200, route
        read = (await service.get(f"/routes/{inside}")).json()
        assert read["pool"]["route"] == f"{inside}-pool"
        written = await service.put(f"/routes/{inside}", {"priority": 4})
        assert written.status_code == 200, written.text
        assert own_admin.get(*LLM, NAMESPACES[0], inside)["spec"]["priority"] == 4

        for route in (outside, f"{outside}-job", f"{outside}-pool"):
            answer = await service.get(f"/routes/{route}")
            assert answer.status_code == 404, route
            assert (await service.put(f"/routes/{route}", {})).status_code == 404, route
        listed = await config_routes(service)
        assert {inside, f"{inside}-job", f"{inside}-pool"} <= listed
        assert not {outside, f"{outside}-job", f"{outside}-pool"} & listed

        # Created while running: one outside first, then one inside. The inside one shows;
        # the outside one is on no watch at all.
        own_admin.create(crs.llm(ELSEWHERE, f"{tag}-late-out"))
        own_admin.create(crs.llm(NAMESPACES[-1], f"{tag}-late-in"))
        await service.eventually(lambda: service.indexed(f"{tag}-late-in"), what="late-in")
        assert not service.indexed(f"{tag}-late-out")
        assert (await service.get(f"/routes/{tag}-late-out")).status_code == 404


async def test_a_label_selector_narrows_the_routes_and_a_restart_re_scopes(
    own_admin: Admin, own_kubeconfig: Path, tag: str
) -> None:
    prod, dev = f"{tag}-prod", f"{tag}-dev"
    ns = NAMESPACES[0]
    own_admin.create(labelled(crs.llm(ns, prod), tier="prod"))
    own_admin.create(labelled(crs.llm(ns, dev), tier="dev"))
    scope = ",".join(NAMESPACES)

    async with running(
        own_kubeconfig, watch_namespaces=scope, watch_label_selector="tier=prod"
    ) as service:
        assert (await service.get("/readyz")).json()["scope"]["labelSelector"] == "tier=prod"
        assert (await service.get(f"/routes/{prod}")).status_code == 200
        assert (await service.get(f"/routes/{dev}")).status_code == 404
        listed = await config_routes(service)
        assert prod in listed
        assert dev not in listed
        # Relabelled out of the selector while running: the watch drops it.
        own_admin.merge_patch(*LLM, ns, prod, {"metadata": {"labels": {"tier": "dev"}}})
        await service.eventually(lambda: not service.indexed(prod), what="prod relabelled")
        assert (await service.get(f"/routes/{prod}")).status_code == 404

    own_admin.merge_patch(*LLM, ns, prod, {"metadata": {"labels": {"tier": "prod"}}})
    async with running(
        own_kubeconfig, watch_namespaces=scope, watch_label_selector="tier=dev"
    ) as service:
        assert (await service.get(f"/routes/{dev}")).status_code == 200
        assert (await service.get(f"/routes/{prod}")).status_code == 404
        listed = await config_routes(service)
        assert dev in listed
        assert prod not in listed
