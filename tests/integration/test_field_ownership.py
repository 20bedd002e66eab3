"""Writes a GitOps tool would silently revert are refused, on the real API server's
managedFields: applied server-side by Argo CD, Flux or Helm, or client-side with a marker."""

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
