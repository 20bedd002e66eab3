"""Fields a GitOps tool owns (from managedFields) are not changed behind its back: 409
field_managed, force with a Warning, co-ownership, and `managed` in what GET answers."""

from __future__ import annotations

import copy
import json
from typing import Any

from slo_api.ownership import LAST_APPLIED, Ownership
from tests.unit.conftest import AUTH, Started, llm_cr, pool_cr
from tests.unit.fakes import FakeKube

PLURAL = "llmslorequirements"
TRACKING = {
    "argocd.argoproj.io/tracking-id": "app:inference.modelsphere.dev/LLMSLORequirement:ns/a"
}


def applied_by(manager: str, *fields: str, operation: str = "Apply") -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "time": "2026-12-01T10:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:serviceId": {}, **{f"f:{f}": {".": {}} for f in fields}}},
    }


def owned(obj: dict[str, Any], *entries: dict[str, Any], **annotations: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["managedFields"] = list(entries)
    if annotations:
        obj["metadata"]["annotations"] = annotations
    return obj


def test_only_gitops_managers_own_fields() -> None:
    rules = Ownership()
    obj = owned(
        llm_cr("a"),
        applied_by("argocd-controller", "priority", "ttft"),
        applied_by("kubectl-edit", "minimumDeployment", operation="Update"),
        applied_by("slo-api", "otps", operation="Update"),
    )
    owners = rules.owners(obj)
    assert sorted(owners) == ["priority", "ttft"]
    assert owners["priority"].manager == "argocd-controller"
    assert owners["priority"].operation == "Apply"


def test_client_side_apply_counts_only_with_a_marker_and_in_last_applied() -> None:
    rules = Ownership()
    last = json.dumps({"spec": {"serviceId": "a", "priority": 3}})
    entry = applied_by("kubectl-client-side-apply", "priority", "ttft", operation="Update")
    marked = owned(llm_cr("a"), entry, **{LAST_APPLIED: last}, **TRACKING)
    assert list(rules.owners(marked)) == ["priority"]
    assert rules.owners(owned(llm_cr("a"), entry, **{LAST_APPLIED: last})) == {}


def test_co_owned_cr_and_co_owner_managers_own_nothing() -> None:
    entry = applied_by("argocd-controller", "priority")
    annotated = owned(llm_cr("a"), entry, **{"slo-api.modelsphere.dev/co-owned": "true"})
    assert Ownership().owners(annotated) == {}
    co = Ownership(co_owners=frozenset({"argocd-controller"}))
    assert co.owners(owned(llm_cr("a"), entry)) == {}


def test_the_index_keeps_just_enough_of_managed_fields() -> None:
    rules = Ownership()
    obj = owned(
        llm_cr("a"),
        applied_by("argocd-controller", "priority"),
        applied_by("some-controller", "priority", operation="Update"),
    )
    trimmed = rules.trim(obj)
    assert trimmed["metadata"]["managedFields"] == [
        {
            "manager": "argocd-controller",
            "operation": "Apply",
            "time": "2026-12-01T10:00:00Z",
            "fieldsV1": {"f:spec": {"f:priority": {}}},
        }
    ]
    assert rules.owners(trimmed) == rules.owners(obj)
    plain = rules.trim(owned(llm_cr("a"), applied_by("kubectl-create", "priority")))
    assert "managedFields" not in plain["metadata"]
    assert "managedFields" in obj["metadata"]  # the object given is not changed


async def test_a_change_to_an_owned_field_is_refused_and_nothing_is_written(
    start: Started,
) -> None:
    cr = owned(llm_cr("cr-1", route="a", priority=5), applied_by("argocd-controller", "priority"))
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube) as (client, _):
        for dry_run in ("false", "true"):
            put = await client.put(
                "/routes/a", params={"dryRun": dry_run}, json={"priority": 7}, headers=AUTH
            )
            assert put.status_code == 409
            error = put.json()["error"]
            assert error["code"] == "field_managed"
            assert "argocd-controller" in error["message"]
            assert "source it syncs from" in error["message"]
            assert error["causes"][0]["field"] == "priority"
            assert error["causes"][0]["manager"] == "argocd-controller"
        assert kube.patches == []
        reset = await client.delete("/routes/a", headers=AUTH)
        assert reset.status_code == 409
        assert reset.json()["error"]["code"] == "field_managed"
        assert kube.patches == []


async def test_an_echo_and_other_fields_go_through(start: Started) -> None:
    cr = owned(llm_cr("cr-1", route="a", priority=5), applied_by("argocd-controller", "priority"))
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube) as (client, _):
        body = (await client.get("/routes/a", headers=AUTH)).json()
        assert body["managed"] == {"priority": "argocd-controller"}
        body["minimumDeployment"] = {"type": "replica", "value": 3}
        put = await client.put("/routes/a", json=body, headers=AUTH)
        assert put.status_code == 200, put.text
        assert "Warning" not in put.headers
        assert kube.patches[-1][1]["spec"] == {"minimumDeployment": {"type": "replica", "value": 3}}


async def test_force_writes_with_a_warning_naming_the_tool(start: Started) -> None:
    cr = owned(llm_cr("cr-1", route="a"), applied_by("kustomize-controller", "priority"))
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube) as (client, _):
        dry = await client.put(
            "/routes/a",
            params={"force": "true", "dryRun": "true"},
            json={"priority": 7},
            headers=AUTH,
        )
        put = await client.put(
            "/routes/a", params={"force": "true"}, json={"priority": 7}, headers=AUTH
        )
        assert put.status_code == dry.status_code == 200
        assert put.headers["Warning"].startswith('299 - "')
        assert "kustomize-controller" in put.headers["Warning"]
        assert dry.headers["Warning"] == put.headers["Warning"]
        assert kube.objects[(PLURAL, "ns", "cr-1")]["spec"]["priority"] == 7


async def test_a_stale_index_cannot_allow_a_write(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    async with start(kube) as (client, _):
        # Argo CD takes the field over without the index hearing of it yet.
        obj = kube.objects[(PLURAL, "ns", "cr-1")]
        obj["metadata"]["managedFields"] = [applied_by("argocd-controller", "priority")]
        kube.rv += 1
        obj["metadata"]["resourceVersion"] = str(kube.rv)
        put = await client.put("/routes/a", json={"priority": 7}, headers=AUTH)
        assert put.status_code == 409
        assert put.json()["error"]["code"] == "field_managed"
        assert obj["spec"]["priority"] == 0


async def test_co_owner_setting_lets_writes_through(start: Started) -> None:
    cr = owned(llm_cr("cr-1", route="a"), applied_by("argocd-controller", "priority"))
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube, gitops_co_owners="argocd-controller") as (client, _):
        put = await client.put("/routes/a", json={"priority": 7}, headers=AUTH)
        assert put.status_code == 200
        assert "managed" not in put.json()


async def test_full_view_and_pool_fields_carry_managed(start: Started) -> None:
    pool = owned(pool_cr("gpu", ["a"]), applied_by("helm", "swapBudget", operation="Update"))
    kube = FakeKube({"modelpools": [pool]})
    async with start(kube) as (client, _):
        page = await client.get("/config", params={"view": "full"}, headers=AUTH)
        assert page.json()["items"][0]["managed"] == {"pool.swapBudget": "helm"}
        put = await client.put("/routes/gpu", json={"pool": {"swapBudget": "60s"}}, headers=AUTH)
        assert put.status_code == 409
        assert put.json()["error"]["causes"][0]["field"] == "pool.swapBudget"


async def test_a_stale_index_cannot_refuse_a_write_either(start: Started) -> None:
    cr = owned(llm_cr("cr-1", route="a"), applied_by("argocd-controller", "priority"))
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube) as (client, _):
        # The field was handed over (say, Argo CD stopped managing the CR): the index lags.
        obj = kube.objects[(PLURAL, "ns", "cr-1")]
        obj["metadata"]["managedFields"] = [applied_by("kubectl-edit", "priority")]
        kube.rv += 1
        obj["metadata"]["resourceVersion"] = str(kube.rv)
        put = await client.put("/routes/a", json={"priority": 7}, headers=AUTH)
        assert put.status_code == 200, put.text
        assert kube.objects[(PLURAL, "ns", "cr-1")]["spec"]["priority"] == 7
