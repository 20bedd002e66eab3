"""The error codes are one list: every code the service answers is in it, and the OpenAPI
document names exactly that list."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from slo_api.errors import CODES, ERRORS
from slo_api.openapi import render

SOURCE = Path(__file__).resolve().parents[2] / "slo_api"


def test_every_code_the_service_answers_is_in_the_one_list() -> None:
    used = set()
    for path in SOURCE.rglob("*.py"):
        used |= set(re.findall(r'\bcode="([a-z_]+)"', path.read_text()))
    assert used
    assert used <= set(ERRORS), used - set(ERRORS)
    assert set(CODES.values()) <= set(ERRORS)
    assert ERRORS["field_managed"] == 409
    assert CODES[409] == "conflict"


def test_the_openapi_document_lists_exactly_these_codes() -> None:
    document = yaml.safe_load(render())
    code = document["components"]["schemas"]["ErrorDetail"]["properties"]["code"]
    assert code["enum"] == list(ERRORS)
