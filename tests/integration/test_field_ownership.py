"""Writes a GitOps tool would silently revert are refused, on the real API server's
managedFields: applied server-side by Argo CD, Flux or Helm, or client-side on a CR Argo CD
tracks; and still refused after a forced write or a kubectl edit took the field from the tool
(the memory of `Ownership.carry`, fed with the informer's consecutive states)."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration.service import RunningService, running

pytestmark = pytest.mark.integration

KIND = "LLMSLORequirement"
TTFT = {"default": {"metrics": [{"type": "p90", "threshold": 0.8}]}}


def _stored(admin: Admin, namespace: str, name: str = "owned") -> dict[str, Any]:
    obj: dict[str, Any] = admin.get(crs.SLO, KIND, namespace, name)
    return obj


async def _applied(
    admin: Admin, service: RunningService, namespace: str, manager: str, **meta: Any
) -> str:
    """An LLM route whose CR `manager` applied server-side, setting priority and bounds."""
    route = f"owned-{namespace}"
    obj = crs.llm(
        namespace,
        "owned",
        service_id=route,
        priority=3,
        minimumDeployment={"type": "replica", "value": 1},
    )
    obj["metadata"].update(meta)
    admin.apply(obj, field_manager=manager)
    await service.eventually(lambda: service.indexed(route), what="indexed")
    return route


@pytest.mark.parametrize("manager", ["argocd-controller", "kustomize-controller", "helm"])
async def test_a_field_a_gitops_tool_applied_is_refused_and_the_cr_untouched(
    admin: Admin, namespace: str, service: RunningService, manager: str
) -> None:
    route = await _applied(admin, service, namespace, manager)
    before = _stored(admin, namespace)
    for params in ({}, {"dryRun": "true"}):
        put = await service.put(f"/routes/{route}", {"priority": 9}, params=params)
        assert put.status_code == 409, put.text
        error = put.json()["error"]
        assert error["code"] == "field_managed"
        assert manager in error["message"]
        assert "source it syncs from" in error["message"]
        assert {"field": "priority", "manager": manager} == {
            k: error["causes"][0][k] for k in ("field", "manager")
        }
    reset = await service.delete(f"/routes/{route}")
    assert reset.status_code == 409
    assert {c["field"] for c in reset.json()["error"]["causes"]} == {"priority"}
    after = _stored(admin, namespace)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    read = (await service.get(f"/routes/{route}")).json()
    assert read["managed"]["priority"] == manager
    assert read["managed"]["minimumDeployment"] == manager


async def test_other_fields_and_an_echo_with_one_such_change_are_written(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _applied(admin, service, namespace, "argocd-controller")
    put = await service.put(f"/routes/{route}", {"ttft": TTFT})
    assert put.status_code == 200, put.text
    body = put.json()
    assert body["managed"] == {
        "minimumDeployment": "argocd-controller",
        "priority": "argocd-controller",
    }
    body["maximumDeployment"] = {"type": "replica", "value": 4}
    echoed = await service.put(f"/routes/{route}", body)
    assert echoed.status_code == 200, echoed.text
    spec = _stored(admin, namespace)["spec"]
    assert spec["maximumDeployment"] == {"type": "replica", "value": 4}
    assert spec["ttft"] == TTFT
    assert spec["priority"] == 3


async def test_force_writes_with_the_warning_and_says_so_in_the_audit_and_event(
    admin: Admin, namespace: str, service: RunningService, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slo_api.audit")
    route = await _applied(admin, service, namespace, "kustomize-controller")
    dry = await service.put(
        f"/routes/{route}", {"priority": 9}, params={"force": "true", "dryRun": "true"}
    )
    assert dry.status_code == 200
    assert _stored(admin, namespace)["spec"]["priority"] == 3
    put = await service.put(f"/routes/{route}", {"priority": 9}, params={"force": "true"})
    assert put.status_code == 200, put.text
    for answer in (dry, put):
        warning = answer.headers["Warning"]
        assert warning.startswith('299 - "')
        assert warning.endswith('"')
        assert "kustomize-controller" in warning
    assert put.json()["priority"] == 9
    assert _stored(admin, namespace)["spec"]["priority"] == 9
    audits = [r.__dict__ for r in caplog.records if getattr(r, "audit", False)]
    assert [a["forced"] for a in audits] == [
        "kustomize-controller (priority)",
        "kustomize-controller (priority)",
    ]

    def events() -> list[dict[str, Any]]:
        found = admin.list("events.k8s.io/v1", "Event", namespace)
        return [e for e in found if e["regarding"]["name"] == "owned"]

    recorded = await service.eventually(events, what="an Event")
    assert "forced over kustomize-controller" in recorded[0]["note"]


async def test_client_side_apply_conflicts_only_with_a_gitops_marker(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    """Argo CD's default sync is client-side apply: the applier is kubectl-client-side-apply,
    and the fields its source sets are those of the last-applied configuration."""
    for name, marked in (("marked", True), ("plain", False)):
        route = f"{name}-{namespace}"
        obj = crs.llm(namespace, name, service_id=route, priority=3)
        annotations = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj)}
        if marked:
            annotations["argocd.argoproj.io/tracking-id"] = (
                f"app:{crs.SLO}/{KIND}:{namespace}/{name}"
            )
        obj["metadata"]["annotations"] = annotations
        admin.create(obj, field_manager="kubectl-client-side-apply")
        await service.eventually(functools.partial(service.indexed, route), what="indexed")
        put = await service.put(f"/routes/{route}", {"priority": 9})
        if marked:
            assert put.status_code == 409, put.text
            assert put.json()["error"]["causes"][0]["manager"] == "kubectl-client-side-apply"
            assert _stored(admin, namespace, name)["spec"]["priority"] == 3
            # Not in the last-applied configuration: not the tool's.
            assert (await service.put(f"/routes/{route}", {"ttft": TTFT})).status_code == 200
        else:
            assert put.status_code == 200, put.text
            assert _stored(admin, namespace, name)["spec"]["priority"] == 9


async def test_a_co_owned_cr_takes_the_write(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _applied(
        admin,
        service,
        namespace,
        "argocd-controller",
        annotations={"slo-api.modelsphere.dev/co-owned": "true"},
    )
    put = await service.put(f"/routes/{route}", {"priority": 9})
    assert put.status_code == 200, put.text
    assert "Warning" not in put.headers
    assert "managed" not in put.json()
    assert _stored(admin, namespace)["spec"]["priority"] == 9


async def test_co_owners_declared_by_setting_take_the_write(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    async with running(slo_api_kubeconfig, gitops_co_owners="argocd-controller") as service:
        route = await _applied(admin, service, namespace, "argocd-controller")
        put = await service.put(f"/routes/{route}", {"priority": 9})
        assert put.status_code == 200, put.text
        assert _stored(admin, namespace)["spec"]["priority"] == 9


async def test_a_pool_field_helm_applied_is_named_as_the_api_names_it(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    name = f"pool-{namespace}"
    admin.apply(
        crs.pool(namespace, name, ["member-a"], swapPolicy="sticky", swapBudget="300s"),
        field_manager="helm",
    )
    await service.eventually(lambda: service.indexed(name), what="indexed")
    read = (await service.get(f"/routes/{name}")).json()
    assert read["managed"] == {"pool.swapBudget": "helm", "pool.swapPolicy": "helm"}
    put = await service.put(f"/routes/{name}", {"pool": {"swapBudget": "90s"}})
    assert put.status_code == 409, put.text
    assert put.json()["error"]["causes"][0]["field"] == "pool.swapBudget"
    assert admin.get(crs.POOL, "ModelPool", namespace, name)["spec"]["swapBudget"] == "300s"
    # reclaimAfter was not in the chart: it is the client's.
    other = await service.put(f"/routes/{name}", {"pool": {"reclaimAfter": "5m"}})
    assert other.status_code == 200, other.text


# -- ownership that outlives one write ---------------------------------------------------------


class Memory:
    """The running service's own memory of GitOps owners: the route history's, fed with the
    informers' consecutive states through `Ownership.carry`, and read by GET and the guard."""

    def __init__(self, service: RunningService) -> None:
        self.ownership = service.runtime.service.ownership
        self.remembered = service.runtime.history.remembered


TRACKED = "argocd.argoproj.io/tracking-id"


def _tracking(namespace: str) -> dict[str, Any]:
    return {"annotations": {TRACKED: f"app:{crs.SLO}/{KIND}:{namespace}/owned"}}


def _edit(admin: Admin, namespace: str, patch: dict[str, Any], manager: str) -> dict[str, Any]:
    """A change around slo-api, recorded under `manager` (kubectl edit's is kubectl-edit)."""
    path = admin.path(crs.SLO, KIND, namespace, "owned")
    result: dict[str, Any] = admin.request(
        "PATCH", path, patch, "application/merge-patch+json", {"fieldManager": manager}
    )
    return result


async def test_a_forced_write_leaves_the_field_argo_cds_for_the_next_put(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    memory = Memory(service)
    route = await _applied(admin, service, namespace, "argocd-controller", **_tracking(namespace))
    forced = await service.put(f"/routes/{route}", {"priority": 9}, params={"force": "true"})
    assert forced.status_code == 200, forced.text
    stored = _stored(admin, namespace)
    # On the API server the field is slo-api's now: managedFields alone forgets the tool.
    assert "priority" not in memory.ownership.owners(stored)
    assert (await service.get(f"/routes/{route}")).json()["managed"]["priority"] == (
        "argocd-controller"
    )
    again = await service.put(f"/routes/{route}", {"priority": 7})
    assert again.status_code == 409, again.text
    cause = again.json()["error"]["causes"][0]
    assert (cause["field"], cause["manager"]) == ("priority", "argocd-controller")
    assert "changed since by slo-api" in cause["message"]
    assert _stored(admin, namespace)["spec"]["priority"] == 9
    warned = await service.put(f"/routes/{route}", {"priority": 7}, params={"force": "true"})
    assert "argocd-controller" in warned.headers["Warning"]
    # Argo CD syncs: the field is simply its own again.
    await _applied(admin, service, namespace, "argocd-controller", **_tracking(namespace))
    await service.eventually(
        lambda: service.indexed(route)[0][1]["spec"]["priority"] == 3, what="the sync"
    )
    read = (await service.get(f"/routes/{route}")).json()
    assert read["managed"]["priority"] == "argocd-controller"
    assert not memory.remembered(_stored(admin, namespace))["priority"].remembered


async def test_a_replica_started_after_a_forced_write_still_refuses_the_tools_field(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    """The memory outlives the process: a replica that starts after the forced write reads
    the tool's claim back from the newest revision of the route's history."""
    async with running(slo_api_kubeconfig) as first:
        route = await _applied(admin, first, namespace, "argocd-controller", **_tracking(namespace))
        forced = await first.put(f"/routes/{route}", {"priority": 9}, params={"force": "true"})
        assert forced.status_code == 200, forced.text
        history = await first.get(f"/routes/{route}/history")
        assert history.status_code == 200, history.text
        assert history.json()["items"][0]["changes"][0]["field"] == "priority"
    async with running(slo_api_kubeconfig) as second:
        await second.eventually(
            lambda: "priority" in second.runtime.history.remembered(_stored(admin, namespace)),
            what="the claim read back from the history",
        )
        read = (await second.get(f"/routes/{route}")).json()
        assert read["managed"]["priority"] == "argocd-controller"
        put = await second.put(f"/routes/{route}", {"priority": 7})
        assert put.status_code == 409, put.text
        assert _stored(admin, namespace)["spec"]["priority"] == 9


@pytest.mark.parametrize(
    ("manager", "marker"),
    [
        ("argocd-controller", {"annotations": {TRACKED: "app:x"}}),
        (
            "kustomize-controller",
            {
                "labels": {
                    "kustomize.toolkit.fluxcd.io/name": "apps",
                    "kustomize.toolkit.fluxcd.io/namespace": "flux-system",
                }
            },
        ),
    ],
)
async def test_a_kubectl_edit_of_a_field_the_tool_applies_stays_the_tools(
    admin: Admin, namespace: str, service: RunningService, manager: str, marker: dict[str, Any]
) -> None:
    memory = Memory(service)
    route = await _applied(admin, service, namespace, manager, **marker)
    edited = _edit(admin, namespace, {"spec": {"priority": 5}}, "kubectl-edit")
    version = edited["metadata"]["resourceVersion"]
    assert "priority" not in memory.ownership.owners(edited)
    await service.eventually(
        lambda: service.indexed(route)[0][1]["metadata"]["resourceVersion"] == version,
        what="the edit in the index",
    )
    read = (await service.get(f"/routes/{route}")).json()
    assert read["priority"] == 5
    assert read["managed"]["priority"] == manager
    put = await service.put(f"/routes/{route}", {"priority": 7})
    assert put.status_code == 409, put.text
    assert "changed since by kubectl-edit" in put.json()["error"]["causes"][0]["message"]
    # The CR no longer carries the tool's marker: nothing remembered stays in force.
    unmark = {k: {key: None for key in v} for k, v in marker.items()}
    _edit(admin, namespace, {"metadata": unmark}, "kubectl-edit")
    await service.eventually(
        lambda: "priority" not in memory.remembered(_stored(admin, namespace)),
        what="the memory released",
    )
    assert (await service.put(f"/routes/{route}", {"priority": 7})).status_code == 200


async def test_a_human_apply_of_an_instance_labelled_cr_is_not_refused(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    """`kubectl apply` (client-side) of a CR that a Helm chart labelled
    app.kubernetes.io/instance: not Argo CD's unless Argo CD is said to track by that label."""
    for label, expected in (("", 200), ("app.kubernetes.io/instance", 409)):
        async with running(slo_api_kubeconfig, gitops_argocd_tracking_label=label) as service:
            name = f"human-{expected}"
            route = f"{name}-{namespace}"
            obj = crs.llm(namespace, name, service_id=route, priority=3)
            obj["metadata"]["labels"] = {"app.kubernetes.io/instance": "chat"}
            obj["metadata"]["annotations"] = {
                "kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj)
            }
            admin.create(obj, field_manager="kubectl-client-side-apply")
            await service.eventually(functools.partial(service.indexed, route), what="indexed")
            put = await service.put(f"/routes/{route}", {"priority": 9})
            assert put.status_code == expected, put.text
            if expected == 409:
                cause = put.json()["error"]["causes"][0]
                assert cause["manager"] == "kubectl-client-side-apply"


async def test_flux_if_not_present_lets_writes_through(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    """Flux created the CR and, with ssa: IfNotPresent, never applies it again."""
    route = await _applied(
        admin,
        service,
        namespace,
        "kustomize-controller",
        labels={
            "kustomize.toolkit.fluxcd.io/name": "apps",
            "kustomize.toolkit.fluxcd.io/namespace": "flux-system",
        },
        annotations={"kustomize.toolkit.fluxcd.io/ssa": "IfNotPresent"},
    )
    assert "managed" not in (await service.get(f"/routes/{route}")).json()
    put = await service.put(f"/routes/{route}", {"priority": 9})
    assert put.status_code == 200, put.text
    assert "Warning" not in put.headers
    assert _stored(admin, namespace)["spec"]["priority"] == 9
