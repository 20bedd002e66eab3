"""An error whose `field` is set says it once: a client shows `field: message` (swissd's does),
so no message, the error's or a cause's, starts with its own field again."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slo_api.errors import ApiError
from slo_api.kinds import build_kinds
from slo_api.kube import KubeError
from slo_api.limits import refusal
from slo_api.ownership import Owner
from slo_api.service import field_managed
from slo_api.settings import Settings
from slo_api.upstream import to_api_error
from tests.unit.conftest import AUTH, Started, job_cr, llm_cr
from tests.unit.fakes import FakeKube, fail

KINDS = {k.name: k for k in build_kinds(Settings(slo_api_token="unit-write-token"))}


def said_twice(error: dict[str, Any]) -> list[str]:
    """Each message (the error's, its causes') as a client shows it, when it names its field
    twice at the start: `priority: priority must be...`."""
    repeated = []
    for part in [error, *(error.get("causes") or [])]:
        field, message = part.get("field"), str(part.get("message", ""))
        if field and (message == field or message.startswith((f"{field}:", f"{field} "))):
            repeated.append(f"{field}: {message}")
    return repeated


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("a", {"priority": "high"}, "priority"),  # a pydantic type error
        ("a", {"priority": 11}, "priority"),
        ("a", {"highPriority": "yes"}, "highPriority"),
        ("a", {"colour": "red"}, "colour"),  # not a field of the kind
        ("a", {"ttft": {"default": {"metrics": [{"type": "p90"}]}}}, None),  # missing
        ("a", {"route": "b"}, "route"),  # the body's route against the URL's
        ("q", {"queue": {"maxDepth": None}}, "queue.maxDepth"),
        ("q", {"queue": None}, "queue"),
    ],
)
async def test_body_errors_name_their_field_once(
    start: Started, route: str, body: dict[str, Any], field: str | None
) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a")], "jobslorequirements": [job_cr("q")]})
    async with start(kube) as (client, _):
        response = await client.put(f"/routes/{route}", json=body, headers=AUTH)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if field is not None:
        assert error["field"] == field
    assert error.get("field")
    assert said_twice(error) == []
    assert error["message"].strip(" :")


async def test_a_number_too_large_names_its_field_once(start: Started) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a")]})
    async with start(kube) as (client, _):
        response = await client.put(
            "/routes/a",
            content=b'{"priority": ' + b"9" * 5000 + b"}",
            headers={**AUTH, "Content-Type": "application/json"},
        )
    error = response.json()["error"]
    assert error["field"] == "priority"
    assert said_twice(error) == []
    assert error["message"].startswith("the number")


async def test_a_query_parameter_error_names_its_field_once(start: Started) -> None:
    async with start() as (client, _):
        response = await client.get("/config?since=1", headers=AUTH)
    error = response.json()["error"]
    assert error["field"] == "since"
    assert said_twice(error) == []


async def test_the_api_servers_422_causes_name_their_fields_once(start: Started) -> None:
    status = {
        "kind": "Status",
        "code": 422,
        "reason": "Invalid",
        "message": 'LLMSLORequirement "a" is invalid: [...]',
        "details": {
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "field": "spec.priority",
                    "message": "Invalid value: 11: spec.priority in body should be <= 10",
                },
                {
                    "reason": "FieldValueInvalid",
                    "field": "spec.maximumDeployment.value",
                    "message": "Invalid value: -1: spec.maximumDeployment.value in body "
                    "should be >= 0",
                },
            ]
        },
    }
    kube = FakeKube(
        {"llmslorequirements": [llm_cr("a")]},
        error_callback=fail(KubeError.from_body(422, json.dumps(status)), "patch"),
    )
    async with start(kube) as (client, _):
        response = await client.put("/routes/a", json={"priority": 3}, headers=AUTH)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert said_twice(error) == []
    assert error["field"] == "priority"
    assert [c["field"] for c in error["causes"]] == ["priority", "maximumDeployment.value"]
    # The first cause is the error's own field; the others are named in its message.
    assert error["message"] == (
        "Invalid value: 11: priority in body should be <= 10; maximumDeployment.value: "
        "Invalid value: -1: maximumDeployment.value in body should be >= 0"
    )


def test_an_unknown_field_the_crd_refuses_is_named_once() -> None:
    status = {
        "kind": "Status",
        "code": 422,
        "details": {
            "causes": [
                {
                    "field": "patch",
                    "message": 'strict decoding error: unknown field "spec.reclaimAfter"',
                }
            ]
        },
    }
    error = to_api_error(KubeError.from_body(422, json.dumps(status)), KINDS["llm"], llm_cr("a"))
    assert error.field == "reclaimAfter"
    assert said_twice(error.body()["error"]) == []
    assert error.message == "the installed CRD has no such field"


@pytest.mark.parametrize("cap", ["maxPriority", "maxReplicas", "maxOTPS", "minTTFTSeconds"])
def test_a_limit_exceeded_names_its_field_once(cap: str) -> None:
    denial = (
        "ValidatingAdmissionPolicy 'slo-limits' with binding 'slo-limits' denied request: "
        f"{cap} is 5 in this namespace's SLOLimits default: spec.x 7 is beyond it"
    )
    error = refusal(denial)
    assert error is not None
    assert said_twice(error.body()["error"]) == []


def test_the_rule_is_the_error_types_own() -> None:
    error = ApiError(
        400,
        "priority: must be an integer",
        field="priority",
        causes=[
            {"field": "priority", "message": "priority must be an integer"},
            {"field": "otps", "message": "otps is required"},
            {"field": "", "message": "something else"},
        ],
    )
    assert error.body()["error"] == {
        "code": "invalid_request",
        "message": "must be an integer",
        "field": "priority",
        "causes": [
            {"field": "priority", "message": "must be an integer"},
            {"field": "otps", "message": "is required"},
            {"field": "", "message": "something else"},
        ],
    }
    # A field that is only the start of a longer word is not the field.
    assert ApiError(400, "priorityClass is not set", field="priority").message == (
        "priorityClass is not set"
    )


@pytest.mark.parametrize(
    "fields", [["priority"], ["priority", "ttft"], ["priority", "ttft", "otps"]]
)
def test_a_field_managed_names_its_field_once(fields: list[str]) -> None:
    owners = [Owner(f, "argocd-controller", "Apply", "2026-12-01T10:00:00Z") for f in fields]
    error = field_managed(KINDS["llm"], owners).body()["error"]
    assert error["field"] == KINDS["llm"].api_field(fields[0])
    shown = f"{error['field']}: {error['message']}"
    assert shown.count(f"{error['field']}") == 1, shown
    for other in fields[1:]:
        assert KINDS["llm"].api_field(other) in error["message"]
    assert said_twice(error) == []
