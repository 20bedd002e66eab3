"""Mapping the API server's Status errors to what a client is told."""

from __future__ import annotations

import json

import pytest

from slo_api.kinds import build_kinds
from slo_api.kube import KubeError
from slo_api.settings import Settings
from slo_api.upstream import to_api_error
from tests.unit.conftest import pool_cr

KINDS = {k.name: k for k in build_kinds(Settings(slo_api_token="unit-write-token"))}


def test_a_422_uses_the_causes_never_the_message_that_names_the_cr() -> None:
    status = {
        "kind": "Status",
        "code": 422,
        "reason": "Invalid",
        "message": 'ModelPool.inference.llmkube.dev "secret-pool" is invalid: [...]',
        "details": {
            "name": "secret-pool",
            "kind": "ModelPool",
            "causes": [
                {
                    "reason": "FieldValueNotSupported",
                    "field": "spec.swapPolicy",
                    "message": 'Unsupported value: "reclaim": supported values: "sticky"',
                },
                {
                    "reason": "FieldValueInvalid",
                    "field": "spec.gpu",
                    "message": "Invalid value: -1: spec.gpu in body should be >= 0",
                },
            ],
        },
    }
    error = to_api_error(
        KubeError.from_body(422, json.dumps(status)),
        KINDS["pool"],
        pool_cr("secret-pool", ["a"]),
    )
    assert error.status == 400
    assert error.field == "pool.swapPolicy"
    assert [c["field"] for c in error.causes or []] == ["pool.swapPolicy", "pool.gpu"]
    assert "secret-pool" not in json.dumps(error.body())
    assert "spec.gpu" not in json.dumps(error.body())


def test_strict_field_validation_names_only_the_unknown_field() -> None:
    leaked = '{"metadata":{"name":"secret-pool","namespace":"team-a"}}'
    status = {
        "kind": "Status",
        "code": 422,
        "reason": "Invalid",
        "message": "...",
        "details": {
            "causes": [
                {
                    "field": "patch",
                    "reason": "FieldValueInvalid",
                    "message": f'Invalid value: "{leaked}": strict decoding'
                    ' error: unknown field "spec.reclaimAfter"',
                }
            ]
        },
    }
    error = to_api_error(
        KubeError.from_body(422, json.dumps(status)),
        KINDS["pool"],
        pool_cr("secret-pool", ["a"]),
    )
    assert error.field == "pool.reclaimAfter"
    assert "installed CRD" in error.message
    assert "secret-pool" not in json.dumps(error.body())
    assert "team-a" not in json.dumps(error.body())


def test_a_plain_text_404_is_not_a_status() -> None:
    error = KubeError.from_body(404, b"404 page not found\n")
    assert error.status == 404
    assert error.is_status is False


def test_retry_after_is_read_from_headers_and_details() -> None:
    assert KubeError.from_body(429, b"slow down", {"Retry-After": "3"}).retry_after == 3
    status = {"kind": "Status", "code": 429, "details": {"retryAfterSeconds": 2}}
    assert KubeError.from_body(429, json.dumps(status)).retry_after == 2


def _status(code: int, reason: str, message: str, causes: list[dict[str, str]]) -> KubeError:
    body = {
        "kind": "Status",
        "code": code,
        "reason": reason,
        "message": message,
        "details": {"name": "secret-pool", "kind": "modelpools", "causes": causes},
    }
    return KubeError.from_body(code, json.dumps(body))


POLICY = (
    "ValidatingAdmissionPolicy 'gpu-guard' with binding 'gpu-guard-team-a' denied request: "
    "pool secret-pool in team-a may not swap faster than 60s; see secret-pool-runbook"
)


@pytest.mark.parametrize(("code", "reason"), [(403, "Forbidden"), (422, "Invalid")])
def test_a_validating_admission_policy_denial_is_400_with_its_reason_and_no_names(
    code: int, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    message = f'modelpools.inference.llmkube.dev "secret-pool" is forbidden: {POLICY}'
    error = to_api_error(
        _status(code, reason, message, [{"message": POLICY}]),
        KINDS["pool"],
        pool_cr("secret-pool", ["a"])
        | {"metadata": {"name": "secret-pool", "namespace": "team-a"}},
    )
    assert error.status == 400
    assert "may not swap faster than 60s" in error.message
    assert "gpu-guard" in error.message
    text = json.dumps(error.body())
    assert '"secret-pool"' not in text
    assert " secret-pool " not in text
    assert " team-a " not in text
    # Only the whole name goes: a longer word that contains it stays.
    assert "secret-pool-runbook" in text
    assert "gpu-guard-team-a" in text
    assert not [r for r in caplog.records if "RBAC" in r.getMessage()]


def test_a_webhook_denial_keeps_its_message() -> None:
    message = (
        'admission webhook "policy.example.dev" denied the request: '
        "team-a has no GPU quota left for secret-pool"
    )
    error = to_api_error(
        _status(400, "BadRequest", message, []),
        KINDS["pool"],
        {"metadata": {"name": "secret-pool", "namespace": "team-a"}, "spec": {}},
    )
    assert error.status == 400
    assert "denied the request" in error.message
    assert "no GPU quota left for" in error.message
    assert "secret-pool" not in error.message
    assert "team-a" not in error.message
    forbidden = to_api_error(
        _status(403, "Forbidden", message, []),
        KINDS["pool"],
        {"metadata": {"name": "secret-pool", "namespace": "team-a"}, "spec": {}},
    )
    assert forbidden.status == 400
    assert "no GPU quota left for" in forbidden.message


def test_slo_api_s_own_rbac_refusal_stays_a_502_with_an_rbac_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    message = (
        'modelpools.inference.llmkube.dev "secret-pool" is forbidden: User '
        '"system:serviceaccount:llm-scaler:slo-api" cannot patch resource "modelpools" in API '
        'group "inference.llmkube.dev" in the namespace "team-a"'
    )
    error = to_api_error(
        _status(403, "Forbidden", message, []),
        KINDS["pool"],
        {"metadata": {"name": "secret-pool", "namespace": "team-a"}, "spec": {}},
    )
    assert error.status == 502
    assert [r for r in caplog.records if "RBAC" in r.getMessage()]


def test_the_scrub_in_422_causes_catches_unquoted_names() -> None:
    error = to_api_error(
        _status(
            422,
            "Invalid",
            "...",
            [{"field": "spec.gpu", "message": "secret-pool needs gpu in team-a, not team-ab"}],
        ),
        KINDS["pool"],
        {"metadata": {"name": "secret-pool", "namespace": "team-a"}, "spec": {}},
    )
    assert error.message == "… needs gpu in …, not team-ab"
