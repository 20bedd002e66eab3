"""Schema-driven fuzzing of the running process on the real control plane.

schemathesis generates requests from the app's own OpenAPI document (valid ones and, in
negative mode, ones the schema forbids) for every operation, half of them aimed at routes seeded
in a fresh namespace so the write paths reach the API server. For each response: no 5xx, the
status is one the document lists, the body and headers match the documented schema, routes
refuse requests without the token. Afterwards no CR outside the seeded namespace has changed.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration.live import AUTH, Live, live_service

pytestmark = pytest.mark.integration

EXAMPLES = 40  # per operation and generation mode
BUDGET_SECONDS = 30.0  # past this, remaining examples are skipped cheaply
KINDS = [
    (crs.SLO, "LLMSLORequirement"),
    (crs.SLO, "JobSLORequirement"),
    (crs.POOL, "ModelPool"),
]
POSITIVE_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    ignored_auth,
]
NEGATIVE_CHECKS = [*POSITIVE_CHECKS, negative_data_rejection]


def everything_but(admin: Admin, namespace: str) -> dict[tuple[str, str, str], str]:
    """resourceVersion of every CR of the three kinds outside `namespace`."""
    versions = {}
    for api_version, kind in KINDS:
        for obj in admin.list(api_version, kind):
            meta = obj["metadata"]
            if meta["namespace"] != namespace:
                versions[(kind, meta["namespace"], meta["name"])] = meta["resourceVersion"]
    return versions


@pytest.fixture(scope="module")
def seeded(
    admin: Admin, slo_api_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Live, str, list[str]]]:
    namespace = f"fuzz-{time.monotonic_ns() % 100000}"
    admin.ensure_namespace(namespace)
    llm, job, pool, twice = (f"{p}-{namespace}" for p in ("chat", "render", "slot", "twice"))
    admin.create(crs.llm(namespace, "chat", service_id=llm, maximumDeployment={"value": 4}))
    admin.create(crs.job(namespace, "render", service_id=job))
    admin.create(crs.pool(namespace, pool, [llm, job], default=llm))
    admin.create(crs.llm(namespace, "twice-a", service_id=twice))
    admin.create(crs.job(namespace, "twice-b", service_id=twice))
    log = tmp_path_factory.mktemp("fuzz") / "slo-api.log"
    # A change stream sends a bookmark every few seconds, so a client's read timeout never
    # ends it: its lifetime does, with the final bookmark the schema describes.
    with live_service(slo_api_kubeconfig, log, WATCH_LIFETIME_SECONDS="2") as live:
        for route in (llm, job, pool):
            live.wait_for(route)
        yield live, namespace, [llm, job, pool, twice]


def fuzz(
    live: Live,
    cases: st.SearchStrategy[Any],
    checks: list[Any],
    sent: collections.Counter[int],
    ends: float,
) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def run(case: Any) -> None:
        if time.monotonic() > ends:
            return
        response = case.call(base_url=live.url, headers=AUTH, timeout=15)
        sent[response.status_code] += 1
        case.validate_response(response, checks=checks, headers=AUTH)

    run()


def test_fuzzing_the_openapi_document_finds_no_5xx_and_no_schema_drift(
    admin: Admin, seeded: tuple[Live, str, list[str]]
) -> None:
    live, namespace, routes = seeded
    document = live.client.get("/openapi.json").json()
    schema = schemathesis.openapi.from_dict(document)
    before = everything_but(admin, namespace)
    ends = time.monotonic() + BUDGET_SECONDS
    sent: collections.Counter[int] = collections.Counter()
    failures: list[str] = []

    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]
        definition = document["paths"][operation.path][operation.method.lower()]
        modes = [(schemathesis.GenerationMode.POSITIVE, POSITIVE_CHECKS)]
        if definition.get("parameters") or definition.get("requestBody"):
            # Only what can be sent wrong can be fuzzed negatively.
            modes.append((schemathesis.GenerationMode.NEGATIVE, NEGATIVE_CHECKS))
        for mode, checks in modes:
            strategies = [operation.as_strategy(generation_mode=mode)]
            if "{route}" in operation.path:
                strategies += [
                    operation.as_strategy(generation_mode=mode, path_parameters={"route": r})
                    for r in routes
                ]
            try:
                fuzz(live, st.one_of(strategies), checks, sent, ends)
            except Exception as exc:
                failures.append(f"{operation.label} ({mode.value}): {type(exc).__name__}: {exc}")

    assert not failures, "\n\n".join(failures[:5])
    # How much was sent, by status (shown with -s; RELIABILITY.md quotes it).
    print(f"fuzz: {sum(sent.values())} requests: {dict(sorted(sent.items()))}")
    assert sum(sent.values()) > 300, sent
    assert not [s for s in sent if s >= 500], sent
    assert everything_but(admin, namespace) == before


# Any text at all, beside the fields a body may have. Hypothesis leaves surrogates out unless
# asked, and draws them rarely even then: half of these characters are one.
ANY_CHAR = st.characters(exclude_categories=()) | st.characters(
    min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()
)
ANY_TEXT = st.text(ANY_CHAR, max_size=16)
FIELDS = st.sampled_from(
    ["route", "priority", "highPriority", "ttft", "otps", "queue", "pool", "minimumDeployment"]
)
ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | ANY_TEXT,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(FIELDS | ANY_TEXT, inner, max_size=4)
    ),
    max_leaves=16,
)
# Keys drawn from a few on purpose, so that bodies repeat keys too.
KEYS = FIELDS | ANY_TEXT | st.sampled_from(["\ud800", "a\udc00", "priority\udbff"])
BODY_EXAMPLES = 400


def _object(pairs: list[tuple[str, Any]], escaped: bool) -> bytes:
    """A JSON object of these pairs in this order, repeated keys kept (a dict would drop them).

    ensure_ascii writes every surrogate as a \\uXXXX escape; otherwise they go raw (not UTF-8).
    """
    members = (
        f"{json.dumps(k, ensure_ascii=escaped)}: {json.dumps(v, ensure_ascii=escaped)}"
        for k, v in pairs
    )
    return ("{" + ", ".join(members) + "}").encode("utf-8", "surrogatepass")


def test_no_body_at_all_makes_a_5xx(seeded: tuple[Live, str, list[str]]) -> None:
    """Arbitrary JSON with arbitrary Unicode keys and strings (escaped lone surrogates too,
    or raw ones, which are not UTF-8) is answered 2xx or 4xx on every route and kind."""
    live, _namespace, routes = seeded
    sent: collections.Counter[int] = collections.Counter()

    @settings(
        max_examples=BODY_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        route=st.sampled_from(routes),
        pairs=st.lists(st.tuples(KEYS, ANY_JSON), max_size=6),
        escaped=st.booleans(),
        dry_run=st.booleans(),
    )
    def run(route: str, pairs: list[tuple[str, Any]], escaped: bool, dry_run: bool) -> None:
        raw = _object(pairs, escaped)
        response = live.client.put(
            f"/routes/{route}",
            content=raw,
            params={"dryRun": "true"} if dry_run else None,
            headers={"Content-Type": "application/json"},
        )
        sent[response.status_code] += 1
        assert response.status_code < 500, (response.status_code, response.text, raw[:300])
        if response.status_code >= 400:
            assert response.json()["error"]["code"]

    run()
    assert not [s for s in sent if s >= 500], sent
    assert sent[400] > 0, sent
    assert "Traceback" not in live.log.read_text()
