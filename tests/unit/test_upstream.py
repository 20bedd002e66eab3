"""Mapping the API server's Status errors to what a client is told."""

from __future__ import annotations

import json

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
        conditional=False,
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
        conditional=False,
    )
    assert error.field == "pool.reclaimAfter"
    assert "installed CRD" in error.message
    assert "secret-pool" not in json.dumps(error.body())
    assert "team-a" not in json.dumps(error.body())


def test_conflict_is_412_when_conditional() -> None:
    conflict = KubeError(409, "Conflict", 'modelpools "p" ...', is_status=True)
    assert (
        to_api_error(conflict, KINDS["pool"], pool_cr("p", ["a"]), conditional=True).status == 412
    )


def test_a_plain_text_404_is_not_a_status() -> None:
    error = KubeError.from_body(404, b"404 page not found\n")
    assert error.status == 404
    assert error.is_status is False


def test_retry_after_is_read_from_headers_and_details() -> None:
    assert KubeError.from_body(429, b"slow down", {"Retry-After": "3"}).retry_after == 3
    status = {"kind": "Status", "code": 429, "details": {"retryAfterSeconds": 2}}
    assert KubeError.from_body(429, json.dumps(status)).retry_after == 2
