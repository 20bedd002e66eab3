"""The error codes are one list: every code the service answers, or ends a change stream with,
or sloctl looks for, is in it, and the OpenAPI document names exactly that list."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from slo_api.errors import CODES, ERRORS, STREAM_ERRORS, ApiError
from slo_api.openapi import render

SOURCE = Path(__file__).resolve().parents[2] / "slo_api"


def _strings(node: ast.AST) -> set[str]:
    """The string constants `node` is, or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {s for e in node.elts for s in _strings(e)}
    return set()


def _named_code(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "code") or (
        isinstance(node, ast.Attribute) and node.attr == "code"
    )


def codes_in(tree: ast.AST) -> set[str]:
    """Every literal code in the source: passed as `code=`, or compared with a `code`."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "code":
            found |= _strings(node.value)
        elif isinstance(node, ast.Compare) and _named_code(node.left):
            for comparator in node.comparators:
                found |= _strings(comparator)
    return found


def test_the_scan_finds_codes_however_they_are_written() -> None:
    tree = ast.parse(
        'ApiError(409, "m", code="field_managed")\n'
        'feed.end(stream, code="too_slow", message="m")\n'
        'if code in ("unauthorized", "forbidden"): pass\n'
        'if error.code == "expired": pass\n'
    )
    assert codes_in(tree) == {"field_managed", "too_slow", "unauthorized", "forbidden", "expired"}


def test_every_code_used_anywhere_is_in_the_one_list() -> None:
    used: dict[str, set[str]] = {}
    for path in SOURCE.rglob("*.py"):
        for code in codes_in(ast.parse(path.read_text())):
            used.setdefault(code, set()).add(str(path.relative_to(SOURCE)))
    assert {"field_managed", "unavailable", "too_slow", "expired"} <= set(used)
    unknown = {c: where for c, where in used.items() if c not in ERRORS and c not in STREAM_ERRORS}
    assert not unknown, unknown
    assert set(CODES.values()) <= set(ERRORS)
    assert ERRORS["field_managed"] == 409
    assert CODES[409] == "conflict"
    # A stream ends with its own code, or with the code the same loss of access answers.
    assert [c for c in STREAM_ERRORS if c not in ERRORS] == ["too_slow"]


def test_an_error_with_a_code_not_in_the_list_is_refused() -> None:
    assert ApiError(503, "m", code="unavailable").code == "unavailable"
    assert ApiError(410, "m").code == "expired"
    with pytest.raises(ValueError, match="not an error code"):
        ApiError(409, "m", code="field-managed")


@pytest.mark.parametrize("status", [406, 408, 414, 418, 422, 431, 501, 505])
def test_a_status_without_a_code_of_its_own_still_answers_one_of_the_list(status: int) -> None:
    # A framework error with a status ERRORS does not name (Starlette's 406, a 501 for an
    # unknown method...) is answered with a listed code: a client switching on codes, and the
    # OpenAPI document's enum, never meet one outside the list.
    code = ApiError(status, "m").code
    assert code in ERRORS
    assert code == ("internal_error" if status >= 500 else "invalid_request")


def test_the_openapi_document_lists_exactly_these_codes() -> None:
    document = yaml.safe_load(render())
    schemas = document["components"]["schemas"]
    code = schemas["ErrorDetail"]["properties"]["code"]
    assert code["enum"] == list(ERRORS)
    assert all(f"{c} ({s})" in code["description"] for c, s in ERRORS.items())
    config = document["paths"]["/config"]["get"]["responses"]["200"]["content"]
    event = config["application/x-ndjson"]["schema"]
    assert event["properties"]["error"]["properties"]["code"]["enum"] == list(STREAM_ERRORS)
