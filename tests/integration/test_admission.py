"""A cluster's own admission policy refusing a write: the client hears the policy, not RBAC."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from controlplane.admin import Admin, AdminError
from tests.integration import crs
from tests.integration.service import RunningService

pytestmark = pytest.mark.integration

ADMISSION = "admissionregistration.k8s.io/v1"


def _policy(name: str, priority: int, reason: str | None) -> crs.Obj:
    validation: crs.Obj = {
        "expression": f"object.spec.priority != {priority}",
        # Names the CR without quotes, as a policy author would.
        "messageExpression": (
            f"'priority {priority} is reserved in ' + object.metadata.namespace"
            " + ' for the team, not for ' + object.metadata.name"
        ),
    }
    if reason is not None:
        validation["reason"] = reason
    return {
        "apiVersion": ADMISSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["inference.modelsphere.dev"],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": ["llmslorequirements"],
                    }
                ]
            },
            "validations": [validation],
        },
    }


def _binding(name: str, namespace: str) -> crs.Obj:
    return {
        "apiVersion": ADMISSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }


@pytest.fixture
def policies(admin: Admin, namespace: str) -> Iterator[dict[int, str]]:
    """Priority 3 refused with reason Forbidden (403), priority 4 with the default (422)."""
    made: dict[int, str] = {}
    try:
        for priority, reason in ((3, "Forbidden"), (4, None)):
            name = f"slo-guard-{priority}-{namespace}"
            admin.create(_policy(name, priority, reason))
            made[priority] = name
            admin.create(_binding(name, namespace))
        yield made
    finally:
        for name in made.values():
            for kind in ("ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy"):
                try:
                    admin.delete(ADMISSION, kind, None, name)
                except AdminError:
                    logging.getLogger(__name__).warning("could not delete %s %s", kind, name)


async def test_an_admission_policy_denial_is_a_400_with_its_reason_and_no_names(
    admin: Admin,
    namespace: str,
    service: RunningService,
    policies: dict[int, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = "guarded-cr"
    route = f"guarded-{namespace}"
    admin.create(crs.llm(namespace, name, service_id=route))
    await service.eventually(lambda: service.indexed(route), what=f"{route} indexed")
    path = f"/routes/{route}"

    # A new policy takes effect once the API server has compiled it, each on its own time:
    # dry runs until both do.
    async def denied() -> bool:
        for priority in policies:
            probe = await service.put(path, {"priority": priority}, params={"dryRun": "true"})
            if probe.status_code != 400:
                return False
        return True

    await service.eventually(denied, within=60, what="both policies in force")
    caplog.set_level(logging.INFO)
    for priority in (3, 4):
        response = await service.put(path, {"priority": priority})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_request"
        assert f"ValidatingAdmissionPolicy '{policies[priority]}'" in error["message"]
        assert f"priority {priority} is reserved in" in error["message"]
        assert "for the team, not for" in error["message"]
        assert name not in response.text
        assert namespace not in response.text.replace(policies[priority], "")
    assert not [r for r in caplog.records if "RBAC" in r.getMessage()]
    stored = admin.get(crs.SLO, "LLMSLORequirement", namespace, name)
    assert stored["spec"]["priority"] == 0
    allowed = await service.put(path, {"priority": 5})
    assert allowed.status_code == 200
