"""openapi.yaml is the app's own schema, and documents every body and error."""

from __future__ import annotations

from pathlib import Path

import yaml

from slo_api.openapi import render

DOC = Path(__file__).resolve().parents[2] / "openapi.yaml"


def test_openapi_yaml_matches_the_app() -> None:
    assert DOC.read_text() == render(), "openapi.yaml drifted from the app: run `make openapi`"


def test_each_kind_has_a_body_schema_and_errors_share_the_envelope() -> None:
    doc = yaml.safe_load(render())
    schemas = doc["components"]["schemas"]
    assert {"LLMBody", "JobBody", "PoolBody", "Error"} <= set(schemas)
    put = doc["paths"]["/routes/{route}"]["put"]
    body = put["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    assert [ref["$ref"].rsplit("/", 1)[1] for ref in body] == ["LLMBody", "JobBody", "PoolBody"]
    for status in ("400", "401", "404", "409", "412", "502", "504"):
        content = put["responses"][status]["content"]["application/json"]["schema"]
        assert content == {"$ref": "#/components/schemas/Error"}
    assert put["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/healthz"]["get"]
    ids = [op["operationId"] for path in doc["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    assert {"getRoute", "putRoute", "deleteRoute", "listRoutes", "getRouteConfig"} <= set(ids)


def test_the_summary_schema_has_every_kinds_summary_fields_and_no_other() -> None:
    summary = yaml.safe_load(render())["components"]["schemas"]["Summary"]
    by_kind = summary["x-summary"]
    assert set(by_kind) == {"llm", "job", "pool"}
    assert by_kind["pool"]["residentMember"] == "status.residentMember"
    fields = {name for fields in by_kind.values() for name in fields}
    ambiguous = {"ambiguous", "kinds", "count"}
    assert set(summary["properties"]) == {"route", "kind"} | fields | ambiguous
