"""The harness is a real API server: CEL rules, pruning and RBAC behave as in a cluster."""

from __future__ import annotations

import time
from typing import Any

import pytest

from controlplane.admin import Admin, AdminError
from controlplane.cluster import Cluster
from tests.integration import crs
from tests.integration.grants import assert_exactly_slo_api_verbs

pytestmark = pytest.mark.integration


def _refusal(admin: Admin, obj: crs.Obj) -> AdminError:
    with pytest.raises(AdminError) as caught:
        admin.create(obj)
    return caught.value


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        (
            {
                "minimumDeployment": {"type": "pdengine", "value": 2},
                "maximumDeployment": {"type": "replica", "value": 4},
            },
            "spec.maximumDeployment",
            "both be pdengine",
        ),
        (
            {
                "minimumDeployment": {"type": "replica", "value": 1},
                "maximumDeployment": {"type": "pdengine", "value": 4},
            },
            "spec.maximumDeployment",
            "both be pdengine",
        ),
        (
            {
                "minimumDeployment": {"type": "pdengine", "value": 1},
                "maximumDeployment": {"type": "pdengine", "value": 1},
            },
            "spec.maximumDeployment.value",
            "must not be 1",
        ),
        (
            {
                "minimumDeployment": {"type": "replica", "value": 3},
                "maximumDeployment": {"type": "replica", "value": 2},
            },
            "spec.maximumDeployment.value",
            "not be below",
        ),
    ],
)
def test_each_cel_rule_is_enforced_with_a_field(
    admin: Admin, namespace: str, spec: crs.Obj, field: str, says: str
) -> None:
    error = _refusal(admin, crs.llm(namespace, "svc", **spec))
    assert error.status == 422
    causes = error.body["details"]["causes"]
    assert any(c["field"] == field and says in c["message"] for c in causes), causes


def test_valid_pdengine_and_zero_bounds_are_accepted(admin: Admin, namespace: str) -> None:
    admin.create(
        crs.llm(
            namespace,
            "pd",
            minimumDeployment={"type": "pdengine", "value": 0},
            maximumDeployment={"type": "pdengine", "value": 2},
        )
    )
    stored = admin.create(
        crs.llm(
            namespace,
            "zero",
            minimumDeployment={"type": "replica", "value": 0},
            maximumDeployment={"type": "replica", "value": 0},
        )
    )
    assert stored["spec"]["maximumDeployment"] == {"type": "replica", "value": 0}


def test_job_needs_a_queue_with_promql(admin: Admin, namespace: str) -> None:
    error = _refusal(admin, crs.job(namespace, "j", queue={"maxDepth": 3}))
    assert error.status == 422
    assert any(c["field"] == "spec.queue.promql" for c in error.body["details"]["causes"])


def test_unknown_spec_fields_are_pruned_and_defaults_applied(admin: Admin, namespace: str) -> None:
    stored = admin.create(crs.llm(namespace, "pruned", notAField=True))
    assert "notAField" not in stored["spec"]
    assert stored["spec"]["priority"] == 0
    assert stored["spec"]["minimumDeployment"] == {"type": "replica", "value": 1}


def test_modelpool_swap_policy_enum_and_status_subresource(admin: Admin, namespace: str) -> None:
    error = _refusal(admin, crs.pool(namespace, "p-bad", ["a"], swapPolicy="reclaim"))
    assert error.status == 422
    assert any(c["field"] == "spec.swapPolicy" for c in error.body["details"]["causes"])
    created = admin.create(crs.pool(namespace, "p", ["a", "b"]))
    assert created["spec"]["swapBudget"] == "300s"
    assert created["spec"]["gpu"] == 1
    admin.merge_patch(
        crs.POOL,
        "ModelPool",
        namespace,
        "p",
        {"status": {"phase": "Ready", "residentMember": "a"}},
        subresource="status",
    )
    assert admin.get(crs.POOL, "ModelPool", namespace, "p")["status"]["residentMember"] == "a"


def test_slo_api_service_account_has_exactly_its_verbs(
    cluster: Cluster, admin: Admin, namespace: str
) -> None:
    admin.create(crs.llm(namespace, "rbac"))
    admin.create(crs.job(namespace, "rbac-job"))
    admin.create(crs.pool(namespace, "rbac-pool", ["rbac"]))
    sa = cluster.slo_api_client()
    try:
        for api, kind, name in (
            (crs.SLO, "LLMSLORequirement", "rbac"),
            (crs.SLO, "JobSLORequirement", "rbac-job"),
            (crs.POOL, "ModelPool", "rbac-pool"),
        ):
            assert_exactly_slo_api_verbs(sa, api, kind, namespace, name)
        with pytest.raises(AdminError) as secrets:
            sa.request("GET", f"/api/v1/namespaces/{namespace}/secrets")
        assert secrets.value.status == 403
    finally:
        sa.close()


GO_DURATIONS_ACCEPTED = ["300s", "1h30m", "1.5h", ".5s", "1.s", "1\u00b5s", "1\u03bcs", "+5m"]
GO_DURATIONS_REFUSED = ["\u0663s", "\uff13s", "5", "1d", "-5m", "5 m", "", ".s", "1S", "1h-1m"]


@pytest.mark.parametrize("field", ["swapBudget", "reclaimAfter"])
def test_modelpool_durations_have_go_s_shape(admin: Admin, namespace: str, field: str) -> None:
    for number, value in enumerate(GO_DURATIONS_ACCEPTED):
        stored = admin.create(
            crs.pool(namespace, f"ok-{field.lower()}-{number}", ["a"], **{field: value})
        )
        assert stored["spec"][field] == value
    for value in GO_DURATIONS_REFUSED:
        error = _refusal(
            admin, crs.pool(namespace, f"bad-{field.lower()}", ["a"], **{field: value})
        )
        assert error.status == 422, value
        assert any(c["field"] == f"spec.{field}" for c in error.body["details"]["causes"]), value


@pytest.mark.parametrize("build", [crs.llm, crs.job])
def test_service_ids_follow_the_route_name_rule(admin: Admin, namespace: str, build: Any) -> None:
    longest = "s" * 253
    assert (
        admin.create(build(namespace, "longest", service_id=longest))["spec"]["serviceId"]
        == longest
    )
    for number, service_id in enumerate(
        ["s" * 254, "tab\there", "new\nline", "bell\x07", "del\x7f"]
    ):
        error = _refusal(admin, build(namespace, f"bad-{number}", service_id=service_id))
        assert error.status == 422, repr(service_id)
        causes = error.body["details"]["causes"]
        assert any(c["field"] == "spec.serviceId" for c in causes), causes


def _rules_of(admin: Admin, role: str) -> set[tuple[str, str, str]]:
    found = admin.get("rbac.authorization.k8s.io/v1", "ClusterRole", None, role)
    return {
        (group, resource, verb)
        for rule in found.get("rules") or []
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


@pytest.mark.parametrize(
    ("builtin", "verbs"),
    [
        ("view", {"get", "list", "watch"}),
        ("edit", {"get", "list", "watch", "patch"}),
        ("admin", {"get", "list", "watch", "patch"}),
    ],
)
def test_the_built_in_roles_aggregate_slo_api_s_user_roles(
    admin: Admin, builtin: str, verbs: set[str]
) -> None:
    """kube-controller-manager's clusterrole-aggregation fills them, as in a real cluster."""
    wanted = {
        (group, plural, verb)
        for group, plural in (
            ("inference.modelsphere.dev", "llmslorequirements"),
            ("inference.modelsphere.dev", "jobslorequirements"),
            # The older group of the SLO kinds, which a cluster may still serve.
            ("inference.x-k8s.io", "llmslorequirements"),
            ("inference.x-k8s.io", "jobslorequirements"),
            ("inference.llmkube.dev", "modelpools"),
        )
        for verb in verbs
    }
    deadline = time.monotonic() + 30
    while not wanted <= _rules_of(admin, builtin):
        assert time.monotonic() < deadline, f"{builtin} never aggregated slo-api's rules"
        time.sleep(0.2)
    if builtin == "view":
        assert (
            not {r for r in _rules_of(admin, builtin) if r[1] in {p for _, p, _ in wanted}} - wanted
        )
