"""The demo page's guardrails (slo_api/static/limits.js), run in Node: each capped input holds
to exactly the server's rule (slo_api/limits.py, itself checked against the real policy in
tests/integration/test_guardrails.py), read from the route's body, not restated.

A value stored beyond its cap may stay or move toward it; every other value and every new
range or metric is held to the cap; the queue depth is a floor; pdengines are capped by what
`limits` says."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slo_api.api.health import MODULES, STATIC
from slo_api.limits import Limits
from tests.unit.conftest import job_cr, llm_cr
from tests.unit.test_limits import limits_cr

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node (the page's modules run in it)")

# Each case: a draft as the form holds it and the route's body as the server sent it; out:
# the refusals the page would show before a save.
DRIVER = """
import { readFileSync } from "node:fs";
const cases = JSON.parse(readFileSync(0, "utf8"));
const { limitErrors, inputBounds } = await import("./limits.js");
console.log(JSON.stringify(cases.map(([draft, original]) => ({
  errors: limitErrors(draft, original),
  bounds: Object.fromEntries(inputBounds(draft, original).map((b) => [b.field, [b.attr, b.bound]])),
}))));
"""

Obj = dict[str, Any]


def run_page(tmp_path: Path, cases: list[tuple[Obj, Obj]]) -> list[Obj]:
    assert NODE is not None
    for name in MODULES:
        (tmp_path / name).write_text((STATIC / name).read_text())
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "driver.js").write_text(DRIVER)
    done = subprocess.run(
        [NODE, "driver.js"],
        cwd=tmp_path,
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: list[Obj] = json.loads(done.stdout)
    return result


def body(kind: str, cr: Obj, **caps: Any) -> Obj:
    """The route's body as the server reads it: its limits' part (what the page reads)."""
    limits = Limits()
    limits.upsert("slolimits", limits_cr(**caps))
    return limits.view(kind, cr)


def draft(kind: str, spec: Obj) -> Obj:
    """The form's draft of a spec: every value a string, as typed."""

    def metrics(ms: list[Obj]) -> list[Obj]:
        return [{**m, "threshold": str(m["threshold"])} for m in ms]

    def section(s: Obj | None) -> Obj | None:
        return s and {
            "default": {"metrics": metrics(s["default"]["metrics"])},
            "ranges": [
                {
                    "contextLengthRangeLow": str(r["contextLengthRangeLow"]),
                    "contextLengthRangeHigh": "",
                    "metrics": metrics(r["metrics"]),
                }
                for r in s.get("ranges", [])
            ],
        }

    out: Obj = {"kind": kind, "priority": str(spec.get("priority", 0))}
    bound = spec.get("maximumDeployment")
    out["maximumDeployment"] = bound and {"type": bound["type"], "value": str(bound["value"])}
    if kind == "llm":
        out["ttft"] = section(spec.get("ttft"))
        out["otps"] = section(spec.get("otps"))
    else:
        out["queue"] = {"maxDepth": str(spec["queue"]["maxDepth"]), "promql": "up"}
    return out


def ttft(default: list[tuple[str, float]], **ranges: list[tuple[str, float]]) -> Obj:
    def metrics(ms: list[tuple[str, float]]) -> list[Obj]:
        return [{"type": t, "threshold": v} for t, v in ms]

    return {
        "default": {"metrics": metrics(default)},
        "ranges": [
            {"contextLengthRangeLow": int(low[1:]), "metrics": metrics(ms)}
            for low, ms in ranges.items()
        ],
    }


def test_a_grandfathered_threshold_holds_only_for_its_own_range_and_metric(
    tmp_path: Path,
) -> None:
    # Stored before the cap of 0.2 s: the default p90 at 0.1 s.
    stored = llm_cr("chat", ttft=ttft([("p90", 0.1)], r4096=[("p90", 0.5)]))
    original = body("llm", stored, minTTFTSeconds=0.2)
    assert original["overLimitBounds"] == [
        {"limit": "minTTFTSeconds", "field": "ttft", "bound": 0.1, "type": "p90"}
    ]
    cases = {
        "kept": ttft([("p90", 0.1)], r4096=[("p90", 0.5)]),
        "toward the cap": ttft([("p90", 0.15)], r4096=[("p90", 0.5)]),
        "away from it": ttft([("p90", 0.05)], r4096=[("p90", 0.5)]),
        "to another metric": ttft([("p90", 0.1), ("p50", 0.1)], r4096=[("p90", 0.5)]),
        "to another range": ttft([("p90", 0.1)], r4096=[("p90", 0.1)]),
        "to a new range": ttft([("p90", 0.1)], r4096=[("p90", 0.5)], r0=[("p90", 0.15)]),
    }
    out = run_page(
        tmp_path, [(draft("llm", {**stored["spec"], "ttft": t}), original) for t in cases.values()]
    )
    got = dict(zip(cases, out, strict=True))
    assert got["kept"]["errors"] == got["toward the cap"]["errors"] == []
    away = got["away from it"]["errors"]
    assert [e["field"] for e in away] == ["ttft.default.metrics.0.threshold"]
    assert "may stay or move toward it" in got["away from it"]["errors"][0]["message"]
    spread = {
        "to another metric": "ttft.default.metrics.1.threshold",
        "to another range": "ttft.ranges.0.metrics.0.threshold",
        "to a new range": "ttft.ranges.1.metrics.0.threshold",
    }
    for case, field in spread.items():
        assert [e["field"] for e in got[case]["errors"]] == [field], case
        message = got[case]["errors"][0]["message"]
        assert "at least 0.2 s" in message
        assert "minTTFTSeconds" in message
        assert "only for its own range and metric type" in message
        # The input itself is bounded by the cap, the grandfathered one by its stored value.
        assert got[case]["bounds"][field] == ["min", 0.2]
        assert got[case]["bounds"]["ttft.default.metrics.0.threshold"] == ["min", 0.1]


def test_the_queue_depth_is_a_floor_and_pdengines_are_capped_as_limits_say(
    tmp_path: Path,
) -> None:
    job = job_cr("render", queue={"maxDepth": 150, "promql": "up"})
    job_body = body("job", job, minQueueDepth=100)
    llm = llm_cr("chat", maximumDeployment={"type": "pdengine", "value": 4})
    # maxPDEngines unset: maxReplicas caps pdengines, and `limits` says so.
    llm_body = body("llm", llm, maxReplicas=8)
    assert llm_body["limits"] == {"maxReplicas": 8, "maxPDEngines": 8}

    def queue(depth: int) -> Obj:
        return draft("job", {"queue": {"maxDepth": depth}})

    def pd(value: int) -> Obj:
        return draft("llm", {"maximumDeployment": {"type": "pdengine", "value": value}})

    out = run_page(
        tmp_path,
        [
            (queue(50), job_body),
            (queue(0), job_body),
            (queue(100), job_body),
            (pd(9), llm_body),
            (pd(8), llm_body),
        ],
    )
    fields = [[e["field"] for e in o["errors"]] for o in out]
    assert fields == [["queue.maxDepth"], [], [], ["maximumDeployment.value"], []]
    assert "At least 100" in out[0]["errors"][0]["message"]
    assert "8 pdengines" in out[3]["errors"][0]["message"]


# Generated routes, stored and written: few values, so that keys and caps meet often.
TYPES = st.sampled_from(["p50", "p90", "p99"])
LOWS = st.sampled_from([0, 1024, 4096])


def metrics(values: list[float]) -> st.SearchStrategy[list[Obj]]:
    return st.lists(
        st.tuples(TYPES, st.sampled_from(values)), min_size=1, max_size=3, unique_by=lambda m: m[0]
    ).map(lambda ms: [{"type": t, "threshold": v} for t, v in ms])


def section(values: list[float]) -> st.SearchStrategy[Obj | None]:
    ranges = st.lists(st.tuples(LOWS, metrics(values)), max_size=2, unique_by=lambda r: r[0]).map(
        lambda rs: [{"contextLengthRangeLow": low, "metrics": ms} for low, ms in rs]
    )
    return st.none() | st.builds(
        lambda d, r: {"default": {"metrics": d}, "ranges": r}, metrics(values), ranges
    )


LLM_SPEC = st.fixed_dictionaries(
    {
        "priority": st.integers(0, 10),
        "maximumDeployment": st.fixed_dictionaries(
            {"type": st.sampled_from(["replica", "pdengine"]), "value": st.integers(1, 12)}
        ),
        "ttft": section([0.05, 0.1, 0.15, 0.2, 0.3]),
        "otps": section([20, 40, 50, 60, 80]),
    }
)
JOB_SPEC = st.fixed_dictionaries(
    {
        "priority": st.integers(0, 10),
        "queue": st.fixed_dictionaries(
            {"maxDepth": st.sampled_from([0, 50, 90, 100, 120, 150]), "promql": st.just("up")}
        ),
    }
)
CAPS = st.fixed_dictionaries(
    {"maxPriority": st.just(5), "maxReplicas": st.just(8), "minTTFTSeconds": st.just(0.2)},
    optional={"maxPDEngines": st.just(4), "maxOTPS": st.just(50), "minQueueDepth": st.just(100)},
)
CASES = st.lists(
    st.one_of(
        st.tuples(st.just("llm"), LLM_SPEC, LLM_SPEC), st.tuples(st.just("job"), JOB_SPEC, JOB_SPEC)
    ),
    min_size=20,
    max_size=20,
)


def section_of(field: str) -> str:
    return field.split(".")[0] if field.endswith(".threshold") else field


def cr(kind: str, spec: Obj) -> Obj:
    return (llm_cr if kind == "llm" else job_cr)("r", **{k: v for k, v in spec.items() if v})


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(caps=CAPS, cases=CASES)
def test_the_page_refuses_exactly_what_the_server_refuses(
    tmp_path: Path, caps: Obj, cases: list[tuple[str, Obj, Obj]]
) -> None:
    inputs = []
    expected = []
    for kind, old, new in cases:
        stored, written = cr(kind, old), cr(kind, new)
        original = body(kind, stored, **caps)
        inputs.append((draft(kind, written["spec"]), original))
        expected.append(set(Limits.over(written, original["limits"], stored)))
    out = run_page(tmp_path, inputs)
    # A threshold's refusal is beside its input; the server names its section.
    got = [{section_of(e["field"]) for e in o["errors"]} for o in out]
    assert got == expected
