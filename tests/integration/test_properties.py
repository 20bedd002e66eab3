"""Properties of the write path, on generated bodies against the running process (DESIGN §3).

- Any valid LLM or job body (within the per-field rules and the CRDs' cross-field CEL rules)
  round-trips: PUT answers 200, and a fresh GET reads back every field that was sent.
- Any invalid body (a wrong type, a value out of range, an unknown field, a rule broken across
  fields) is a 400 naming the offending `field`, and the CR is left exactly as it was.
"""

from __future__ import annotations

import string
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration.live import Live, live_service

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
INT32 = 2**31 - 1
INT64 = 2**63 - 1
METRIC_TYPES = ["avg", "p50", "p80", "p90", "p95", "p99"]
LLM_FIELDS = {
    "route",
    "kind",
    "highPriority",
    "priority",
    "minimumDeployment",
    "maximumDeployment",
    "ttft",
    "otps",
    "pool",
}
JOB_FIELDS = {
    "route",
    "kind",
    "highPriority",
    "priority",
    "minimumDeployment",
    "maximumDeployment",
    "queue",
    "pool",
}
EXAMPLES = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- valid bodies ----------------------------------------------------------------------------

thresholds = st.one_of(
    st.integers(0, 10**6), st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
)
metrics = st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(METRIC_TYPES), "threshold": thresholds}),
    min_size=1,
    max_size=3,
)
context_range = st.fixed_dictionaries(
    {"contextLengthRangeLow": st.integers(0, INT64), "metrics": metrics},
    optional={"contextLengthRangeHigh": st.integers(1, INT64)},
)
section = st.fixed_dictionaries(
    {"default": st.fixed_dictionaries({"metrics": metrics})},
    optional={"ranges": st.lists(context_range, max_size=3)},
)
promql = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=60).filter(
    lambda s: not s.isspace()
)


STORED = "stored priority"


@st.composite
def priority_fields(draw: st.DrawFn) -> tuple[Obj, Obj]:
    """(what is sent, what a read must say). The rules depend on the stored priority, so
    `read[STORED]` says what to store first."""
    stored = draw(st.integers(0, 10))
    how = draw(st.sampled_from(["none", "high", "priority", "both"]))
    if how == "none":
        return {}, {STORED: stored, "priority": stored}
    if how == "high":
        high = draw(st.booleans())
        # false lowers only 10; a tier 1..9 stays.
        written = 10 if high else (0 if stored == 10 else stored)
        return {"highPriority": high}, {
            STORED: stored,
            "highPriority": written == 10,
            "priority": written,
        }
    if how == "priority":
        value = draw(st.integers(0, 10))
        return {"priority": value}, {STORED: stored, "highPriority": value == 10, "priority": value}
    # An agreeing pair always means its priority, whichever of the two changed.
    high = draw(st.booleans())
    value = 10 if high else draw(st.integers(0, 9))
    sent = {"highPriority": high, "priority": value}
    return sent, {STORED: stored, **sent}


def bound(type_: str | None, value: int) -> Obj:
    return {"value": value} if type_ is None else {"type": type_, "value": value}


def read_bound(sent: Obj | None) -> Obj | None:
    return None if sent is None else {"type": sent.get("type", "replica"), "value": sent["value"]}


@st.composite
def llm_bounds(draw: st.DrawFn) -> Obj:
    """Both bounds, obeying the CEL rules: both pdengine or neither; a pdengine maximum is
    not 1; the maximum is not below a minimum of the same type."""
    low = draw(st.integers(0, INT32))
    if draw(st.booleans()):
        high = draw(st.integers(low, INT32).filter(lambda v: v != 1))
        return {
            "minimumDeployment": bound("pdengine", low),
            "maximumDeployment": bound("pdengine", high),
        }
    min_type = draw(st.sampled_from([None, "replica", "concurrency"]))
    max_type = draw(st.sampled_from([None, "replica"]))
    if draw(st.booleans()):
        return {"minimumDeployment": bound(min_type, low), "maximumDeployment": None}
    same = min_type in (None, "replica")
    high = draw(st.integers(low if same else 0, INT32))
    return {"minimumDeployment": bound(min_type, low), "maximumDeployment": bound(max_type, high)}


@st.composite
def job_bounds(draw: st.DrawFn) -> Obj:
    """Both bounds; a replica minimum is not above the (replica) maximum."""
    low = draw(st.integers(0, INT32))
    min_type = draw(st.sampled_from([None, "replica", "concurrency"]))
    if draw(st.booleans()):
        return {"minimumDeployment": bound(min_type, low), "maximumDeployment": None}
    floor = low if min_type in (None, "replica") else 0
    high = draw(st.integers(floor, INT32))
    max_type = draw(st.sampled_from([None, "replica"]))
    return {"minimumDeployment": bound(min_type, low), "maximumDeployment": bound(max_type, high)}


@st.composite
def llm_body(draw: st.DrawFn, route: str) -> tuple[Obj, Obj]:
    sent, read = draw(priority_fields())
    if draw(st.booleans()):
        sent["route"] = route
    if draw(st.booleans()):
        sent["kind"] = "llm"
    if draw(st.booleans()):
        bounds = draw(llm_bounds())
        sent |= bounds
        read |= {k: read_bound(v) for k, v in bounds.items()}
    for name in ("ttft", "otps"):
        choice = draw(st.one_of(st.none(), st.just("absent"), section))
        if choice != "absent":
            sent[name] = read[name] = choice
    return sent, read


@st.composite
def job_body(draw: st.DrawFn, route: str) -> tuple[Obj, Obj]:
    sent, read = draw(priority_fields())
    if draw(st.booleans()):
        sent["kind"] = "job"
    if draw(st.booleans()):
        bounds = draw(job_bounds())
        sent |= bounds
        read |= {k: read_bound(v) for k, v in bounds.items()}
    if draw(st.booleans()):
        queue = draw(
            st.fixed_dictionaries(
                {}, optional={"maxDepth": st.integers(0, INT32), "promql": promql}
            )
        )
        sent["queue"] = queue
        read |= {f"queue.{k}": v for k, v in queue.items()}
    return sent, read


# -- invalid bodies --------------------------------------------------------------------------

not_an_int = st.one_of(
    st.booleans(),
    st.text(max_size=5),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
beyond_int64 = st.one_of(st.integers(INT64 + 1, 10**40), st.integers(-(10**40), -INT64 - 2))
bad_priority = st.one_of(not_an_int, st.integers(11, INT64), st.integers(-INT64, -1), beyond_int64)
bad_count = st.one_of(
    not_an_int.filter(lambda v: v is not None),
    st.integers(INT32 + 1, INT64),
    st.integers(-INT64, -1),
    beyond_int64,
)
# Context lengths are int64 in the CRD, so only negatives and what no int64 holds are bad.
bad_context_length = st.one_of(
    not_an_int.filter(lambda v: v is not None), st.integers(-INT64, -1), beyond_int64
)
bad_word = st.text(string.ascii_letters + "-_ ", max_size=12)
unknown = st.text(string.ascii_letters, min_size=1, max_size=12)


@st.composite
def broken(draw: st.DrawFn, kind: str, route: str) -> tuple[Obj, str]:
    """A body with exactly one thing wrong, and the `field` the 400 must name."""
    body, _ = draw(llm_body(route) if kind == "llm" else job_body(route))
    mistakes = [
        "unknown",
        "priority",
        "highPriority",
        "disagree",
        "min.value",
        "min.type",
        "min.extra",
        "min.null",
        "route",
        "kind",
        "max.order",
    ]
    mistakes += (
        [
            "section.empty",
            "metric.type",
            "threshold",
            "range.low",
            "queue",
            "cel.pdengine",
            "cel.pdengine1",
        ]
        if kind == "llm"
        else ["ttft", "queue.maxDepth", "queue.promql", "queue.null", "max.type"]
    )
    mistake = draw(st.sampled_from(mistakes))
    metric = {"type": "p90", "threshold": 0.5}
    if mistake == "unknown":
        name = draw(unknown.filter(lambda n: n not in LLM_FIELDS | JOB_FIELDS))
        body[name] = draw(st.one_of(st.integers(-5, 5), st.text(max_size=5), st.none()))
        return body, name
    if mistake == "priority":
        body.pop("highPriority", None)
        body["priority"] = draw(bad_priority)
        return body, "priority"
    if mistake == "highPriority":
        body.pop("priority", None)
        body["highPriority"] = draw(not_an_int.filter(lambda v: not isinstance(v, bool)))
        return body, "highPriority"
    if mistake == "disagree":
        # Both changed from what is stored (see `disagreeing`) and disagreeing.
        body["highPriority"] = True
        body["priority"] = draw(st.integers(0, 9))
        return body, "highPriority"
    if mistake.startswith("min."):
        body.pop("maximumDeployment", None)
        if mistake == "min.null":
            body["minimumDeployment"] = None
            return body, "minimumDeployment"
        body["minimumDeployment"] = {"type": "replica", "value": 1}
        if mistake == "min.value":
            body["minimumDeployment"]["value"] = draw(bad_count)
            return body, "minimumDeployment.value"
        if mistake == "min.type":
            body["minimumDeployment"]["type"] = draw(
                st.one_of(
                    bad_word.filter(lambda w: w not in ("replica", "concurrency", "pdengine")),
                    st.integers(),
                )
            )
            return body, "minimumDeployment.type"
        name = draw(unknown.filter(lambda n: n not in ("type", "value")))
        body["minimumDeployment"][name] = 1
        return body, f"minimumDeployment.{name}"
    if mistake == "route":
        body["route"] = draw(st.text(max_size=10).filter(lambda r: r != route))
        return body, "route"
    if mistake == "kind":
        body["kind"] = draw(
            st.sampled_from(["llm", "job", "pool", "LLM", ""]).filter(lambda k: k != kind)
        )
        return body, "kind"
    if mistake == "max.order":
        low = draw(st.integers(1, INT32))
        body["minimumDeployment"] = {"type": "replica", "value": low}
        body["maximumDeployment"] = {"type": "replica", "value": draw(st.integers(0, low - 1))}
        return body, "maximumDeployment.value"
    if mistake == "cel.pdengine":
        ends = [{"type": "pdengine", "value": 4}, {"type": "replica", "value": 4}]
        if draw(st.booleans()):
            ends.reverse()
        body["minimumDeployment"], body["maximumDeployment"] = ends
        return body, "maximumDeployment"
    if mistake == "cel.pdengine1":
        body["minimumDeployment"] = {"type": "pdengine", "value": draw(st.integers(0, 1))}
        body["maximumDeployment"] = {"type": "pdengine", "value": 1}
        return body, "maximumDeployment.value"
    if mistake == "section.empty":
        body["ttft"] = {"default": {"metrics": []}}
        return body, "ttft.default.metrics"
    if mistake == "metric.type":
        body["otps"] = {
            "default": {
                "metrics": [
                    {**metric, "type": draw(bad_word.filter(lambda w: w not in METRIC_TYPES))}
                ]
            }
        }
        return body, "otps.default.metrics[0].type"
    if mistake == "threshold":
        value = draw(st.one_of(st.floats(max_value=-1e-9, allow_infinity=False), st.text()))
        body["ttft"] = {"default": {"metrics": [{**metric, "threshold": value}]}}
        return body, "ttft.default.metrics[0].threshold"
    if mistake == "range.low":
        body["ttft"] = {
            "default": {"metrics": [metric]},
            "ranges": [{"contextLengthRangeLow": draw(bad_context_length), "metrics": [metric]}],
        }
        return body, "ttft.ranges[0].contextLengthRangeLow"
    if mistake == "queue":
        body["queue"] = {"maxDepth": 1, "promql": "up"}
        return body, "queue"
    if mistake == "ttft":
        body["ttft"] = {"default": {"metrics": [metric]}}
        return body, "ttft"
    if mistake == "queue.maxDepth":
        body["queue"] = {"maxDepth": draw(bad_count)}
        return body, "queue.maxDepth"
    if mistake == "queue.promql":
        body["queue"] = {
            "promql": draw(st.one_of(st.just(""), st.text(" \t\n", min_size=1), st.integers()))
        }
        return body, "queue.promql"
    if mistake == "queue.null":
        body["queue"] = None
        return body, "queue"
    assert mistake == "max.type"
    body["minimumDeployment"] = {"type": "replica", "value": 1}
    body["maximumDeployment"] = {
        "type": draw(st.sampled_from(["pdengine", "concurrency"])),
        "value": 4,
    }
    return body, "maximumDeployment.type"


# -- the service -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def routes(
    admin: Admin, slo_api_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Live, str, str, str]]:
    namespace = f"props-{time.monotonic_ns() % 100000}"
    admin.ensure_namespace(namespace)
    llm, job = f"chat-{namespace}", f"render-{namespace}"
    admin.create(crs.llm(namespace, "chat", service_id=llm))
    admin.create(crs.job(namespace, "render", service_id=job))
    log = tmp_path_factory.mktemp("properties") / "slo-api.log"
    with live_service(slo_api_kubeconfig, log) as live:
        live.wait_for(llm)
        live.wait_for(job)
        yield live, namespace, llm, job


def read_field(body: Obj, path: str) -> Any:
    """The field at a dotted path; None when it is absent (unset fields are left out, never
    sent as null)."""
    value: Any = body
    for part in path.split("."):
        assert value.get(part, "unset") is not None, (path, body)
        value = value.get(part)
        if value is None:
            return None
    return value


def round_trip(live: Live, route: str, sent: Obj, expected: Obj) -> None:
    expected = dict(expected)
    stored = live.client.put(f"/routes/{route}", json={"priority": expected.pop(STORED)})
    assert stored.status_code == 200, stored.text
    written = live.client.put(f"/routes/{route}", json=sent)
    assert written.status_code == 200, (sent, written.text)
    read = live.client.get(f"/routes/{route}")
    assert read.status_code == 200
    for name, value in expected.items():
        assert read_field(read.json(), name) == value, (name, sent, read.json())
        assert read_field(written.json(), name) == value, (name, sent, written.json())


def disagreeing(admin: Admin, kind: tuple[str, str], namespace: str, name: str, body: Obj) -> None:
    """For a `highPriority: true` sent with a priority below 10: store a priority that differs
    from both, so both count as changed (one equal to the stored value would be an echo)."""
    if body.get("highPriority") is True and isinstance(body.get("priority"), int):
        stored = (body["priority"] + 1) % 10
        admin.merge_patch(*kind, namespace, name, {"spec": {"priority": stored}})


def refused(
    admin: Admin,
    live: Live,
    kind: tuple[str, str],
    namespace: str,
    name: str,
    route: str,
    body: Obj,
    field: str,
) -> None:
    before = admin.get(*kind, namespace, name)
    answer = live.client.put(f"/routes/{route}", json=body)
    assert answer.status_code == 400, (body, answer.text)
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    fields = {error.get("field")} | {c["field"] for c in error.get("causes") or []}
    # The named field, or a place inside it (`priority[0]` for a huge number in a list).
    assert any(f == field or f.startswith((f"{field}.", f"{field}[")) for f in fields if f), (
        body,
        error,
    )
    after = admin.get(*kind, namespace, name)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["spec"] == before["spec"]


@EXAMPLES
@given(data=st.data())
def test_any_valid_llm_body_round_trips(
    routes: tuple[Live, str, str, str], data: st.DataObject
) -> None:
    live, _, llm, _ = routes
    sent, expected = data.draw(llm_body(llm))
    round_trip(live, llm, sent, expected)


@EXAMPLES
@given(data=st.data())
def test_any_valid_job_body_round_trips(
    routes: tuple[Live, str, str, str], data: st.DataObject
) -> None:
    live, _, _, job = routes
    sent, expected = data.draw(job_body(job))
    round_trip(live, job, sent, expected)


@EXAMPLES
@given(data=st.data())
def test_any_invalid_llm_body_is_a_400_naming_the_field_and_changes_nothing(
    admin: Admin, routes: tuple[Live, str, str, str], data: st.DataObject
) -> None:
    live, namespace, llm, _ = routes
    body, field = data.draw(broken("llm", llm))
    disagreeing(admin, (crs.SLO, "LLMSLORequirement"), namespace, "chat", body)
    refused(admin, live, (crs.SLO, "LLMSLORequirement"), namespace, "chat", llm, body, field)


@EXAMPLES
@given(data=st.data())
def test_any_invalid_job_body_is_a_400_naming_the_field_and_changes_nothing(
    admin: Admin, routes: tuple[Live, str, str, str], data: st.DataObject
) -> None:
    live, namespace, _, job = routes
    body, field = data.draw(broken("job", job))
    disagreeing(admin, (crs.SLO, "JobSLORequirement"), namespace, "render", body)
    refused(admin, live, (crs.SLO, "JobSLORequirement"), namespace, "render", job, body, field)
