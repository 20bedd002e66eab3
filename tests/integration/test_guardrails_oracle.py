"""slo-api's over-limit verdict against the real guardrails policy, on generated inputs.

Hypothesis draws an SLOLimits `default`, a route's stored CR (or none: a create) and the CR a
write would make of it; the API server's ValidatingAdmissionPolicy (config/guardrails) decides
it by a server-side dry run (nothing stored), and slo-api's `Limits.over` of the new object over
the old one must say the same: over some cap exactly when the policy refuses. Values are drawn
from small pools around the caps (below, at and above each), so ties, the ratchet's keys
(context-length range low bound and metric type) and the pdengine fallback come up often.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from controlplane.admin import Admin, AdminError
from slo_api.limits import Limits, effective
from tests.integration import crs
from tests.integration.test_guardrails import guardrails, wait_until

pytestmark = pytest.mark.integration

__all__ = ["guardrails"]

Obj = dict[str, Any]
METRIC_TYPES = ("avg", "p50", "p80", "p90", "p95", "p99")
LOWS = (0, 1024, 4096)
# Each pool holds values on both sides of, and exactly at, the caps drawn from it.
TTFT = (0, 0.01, 0.05, 0.1, 0.2, 0.25, 0.2500001, 0.5, 1)
OTPS = (0, 5, 10, 49.5, 50, 50.5, 100, 1234567, 1234568)
PRIORITY = tuple(range(11))
REPLICAS = (0, 1, 2, 4, 8, 9, 20)
PDENGINES = (0, 2, 4, 5, 8, 9, 20)  # a pdengine maximum of 1 is invalid
DEPTHS = (0, 1, 5, 20, 100, 150)

_names = itertools.count(1)


def _optional(values: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """A cap, set three times in four."""
    return st.sampled_from((None, *values, *values, *values))


caps = st.fixed_dictionaries(
    {
        "maxPriority": _optional(PRIORITY),
        "maxReplicas": _optional(REPLICAS),
        "maxPDEngines": _optional(PDENGINES),
        "minTTFTSeconds": _optional(TTFT),
        "maxOTPS": _optional(OTPS),
        "minQueueDepth": _optional(DEPTHS),
    }
).map(lambda c: {k: v for k, v in c.items() if v is not None})


def _metrics(pool: tuple[float, ...]) -> st.SearchStrategy[list[Obj]]:
    metric = st.fixed_dictionaries(
        {"type": st.sampled_from(METRIC_TYPES), "threshold": st.sampled_from(pool)}
    )
    return st.lists(metric, min_size=1, max_size=3)


@st.composite
def _section(draw: st.DrawFn, pool: tuple[float, ...]) -> Obj:
    """A TTFT or OTPS section: its default, and ranges three times in four."""
    found: Obj = {"default": {"metrics": draw(_metrics(pool))}}
    if draw(st.sampled_from((True, True, True, False))):
        found["ranges"] = [
            {"contextLengthRangeLow": draw(st.sampled_from(LOWS)), "metrics": draw(_metrics(pool))}
            for _ in range(draw(st.integers(1, 3)))
        ]
    return found


@st.composite
def _deployment(draw: st.DrawFn, kind: str) -> Obj:
    """A maximumDeployment (and the minimum it needs to be valid), or none."""
    types = ["none", "replica"] + (["pdengine"] if kind == "llm" else [])
    chosen = draw(st.sampled_from(types))
    if chosen == "none":
        return {}
    value = draw(st.sampled_from(REPLICAS if chosen == "replica" else PDENGINES))
    return {
        "minimumDeployment": {"type": chosen, "value": 0},
        "maximumDeployment": {"type": chosen, "value": value},
    }


@st.composite
def spec(draw: st.DrawFn, kind: str) -> Obj:
    found: Obj = {"priority": draw(st.sampled_from(PRIORITY)), **draw(_deployment(kind))}
    if kind == "llm":
        for name, pool in (("ttft", TTFT), ("otps", OTPS)):
            if draw(st.sampled_from((True, True, True, False))):
                found[name] = draw(_section(pool))
    else:
        found["queue"] = {"maxDepth": draw(st.sampled_from(DEPTHS)), "promql": "up"}
    return found


@st.composite
def _tweaked(draw: st.DrawFn, section: Obj, pool: tuple[float, ...]) -> Obj:
    """The same section with one or two values moved: a threshold redrawn, a metric's type or a
    range's low bound changed, a threshold copied to another metric or a new range, or two
    swapped: what would spread a grandfathered value or move it away from the cap."""
    changed = copy.deepcopy(section)
    for _ in range(draw(st.integers(1, 2))):
        sets = [changed["default"], *changed.get("ranges", [])]
        metrics = [m for s in sets for m in s["metrics"]]
        metric = draw(st.sampled_from(metrics))
        how = draw(st.sampled_from(("threshold", "type", "low", "low", "copy", "range", "swap")))
        if how == "threshold":
            metric["threshold"] = draw(st.sampled_from(pool))
        elif how == "type":
            metric["type"] = draw(st.sampled_from(METRIC_TYPES))
        elif how == "low" and len(sets) > 1:
            draw(st.sampled_from(sets[1:]))["contextLengthRangeLow"] = draw(st.sampled_from(LOWS))
        elif how == "copy":
            target = draw(st.sampled_from(sets))
            kind = draw(st.sampled_from(METRIC_TYPES))
            target["metrics"].append({"type": kind, "threshold": metric["threshold"]})
        elif how == "range":
            low = draw(st.sampled_from(LOWS))
            changed.setdefault("ranges", []).append(
                {"contextLengthRangeLow": low, "metrics": [dict(metric)]}
            )
        elif how == "swap" and len(metrics) > 1:
            other = draw(st.sampled_from(metrics))
            metric["threshold"], other["threshold"] = other["threshold"], metric["threshold"]
    return changed


@st.composite
def written(draw: st.DrawFn, kind: str, old: Obj) -> Obj:
    """What a write makes of `old`: mostly one part changed (redrawn, or a section tweaked) and
    the rest kept, so that a disagreement on one value is not hidden by a refusal of another;
    sometimes each part changed or not."""
    fresh = draw(spec(kind))
    new: Obj = {}
    parts = ["priority", "deployment", *(("ttft", "otps") if kind == "llm" else ("queue",))]
    one = draw(st.sampled_from((*parts, *parts, *parts, None)))
    for part in parts:
        keys = ("minimumDeployment", "maximumDeployment") if part == "deployment" else (part,)
        if one is None:
            how = draw(st.sampled_from(("keep", "fresh", "tweak")))
        else:
            how = draw(st.sampled_from(("fresh", "tweak", "tweak"))) if part == one else "keep"
        source = fresh if how == "fresh" else old
        for key in keys:
            if key in source:
                new[key] = copy.deepcopy(source[key])
        pool = {"ttft": TTFT, "otps": OTPS}.get(part)
        if how == "tweak" and pool is not None and part in old:
            new[part] = draw(_tweaked(old[part], pool))
        elif how == "tweak" and part == "queue":
            new[part] = {**old[part], "maxDepth": draw(st.sampled_from(DEPTHS))}
    return new


def _cr(kind: str, namespace: str, body: Obj) -> Obj:
    build = crs.llm if kind == "llm" else crs.job
    return build(namespace, "oracle", f"oracle-{namespace}", **copy.deepcopy(body))


def _probe(kind_caps: dict[str, dict[str, Any]], namespace: str) -> Obj | None:
    """A new CR the caps refuse, to know when the policy sees them (None: they refuse none,
    and the policy, whether it sees them yet or not, allows everything)."""
    llm, job = kind_caps["llm"], kind_caps["job"]
    if llm.get("maxPriority", 10) < 10:
        return _cr("llm", namespace, {"priority": llm["maxPriority"] + 1})
    if "maxReplicas" in llm:
        value = llm["maxReplicas"] + 1
        return _cr("llm", namespace, {"maximumDeployment": {"type": "replica", "value": value}})
    if "maxPDEngines" in llm:
        value = max(llm["maxPDEngines"] + 1, 2)
        return _cr(
            "llm",
            namespace,
            {
                "minimumDeployment": {"type": "pdengine", "value": 0},
                "maximumDeployment": {"type": "pdengine", "value": value},
            },
        )
    if llm.get("minTTFTSeconds", 0) > 0:
        return _cr("llm", namespace, {"ttft": {"default": {"metrics": [_at(0)]}}})
    if "maxOTPS" in llm:
        return _cr("llm", namespace, {"otps": {"default": {"metrics": [_at(llm["maxOTPS"] + 1)]}}})
    if job.get("minQueueDepth", 0) > 1:
        return _cr("job", namespace, {"queue": {"maxDepth": 1, "promql": "up"}})
    return None


def _at(threshold: float) -> Obj:
    return {"type": "p90", "threshold": threshold}


def _refused(admin: Admin, obj: Obj, update: bool) -> bool:
    """The policy's decision on a write of `obj`, by a dry run (any other refusal fails)."""
    meta = obj["metadata"]
    try:
        if update:
            path = admin.path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
            admin.request("PUT", path, obj, params={"dryRun": "All"})
        else:
            path = admin.path(obj["apiVersion"], obj["kind"], meta["namespace"])
            admin.request("POST", path, obj, params={"dryRun": "All"})
    except AdminError as exc:
        if exc.status == 422 and "ValidatingAdmissionPolicy 'slo-limits'" in str(exc):
            return True
        raise  # an invalid object drawn, or a failure: not a decision of the policy
    return False


@pytest.fixture
def namespaces(admin: Admin) -> Callable[[], str]:
    """A fresh namespace per example: its SLOLimits are set once, after the stored CR."""

    def make() -> str:
        name = f"o{os.getpid() % 10000}-{next(_names)}"
        admin.ensure_namespace(name)
        return name

    return make


# No shrinking: each step would redo the API calls; the assertion shows the whole example.
@settings(
    max_examples=40,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_slo_api_says_over_limits_exactly_when_the_policy_refuses(
    admin: Admin, guardrails: None, namespaces: Callable[[], str], data: st.DataObject
) -> None:
    kind = data.draw(st.sampled_from(("llm", "llm", "job")), label="kind")
    limits = data.draw(caps, label="limits")
    stored = data.draw(st.sampled_from((True, True, True, False)), label="stored")
    old_spec = data.draw(spec(kind), label="old") if stored else None
    # Several writes per stored CR and limits: each a dry run, so they cost little.
    writes = data.draw(
        st.lists(
            spec(kind) if old_spec is None else written(kind, old_spec), min_size=4, max_size=12
        ),
        label="writes",
    )
    namespace = namespaces()
    old = None
    if old_spec is not None:
        # Stored before the namespace has limits: anything valid goes.
        old = admin.create(_cr(kind, namespace, old_spec))
    admin.create(
        {
            "apiVersion": crs.SLO,
            "kind": "SLOLimits",
            "metadata": {"name": "default", "namespace": namespace},
            "spec": limits,
        }
    )
    probe = _probe({k: effective(limits, k) for k in ("llm", "job")}, namespace)
    if probe is not None:
        wait_until(lambda: _refused(admin, probe, update=False), "the limits in force")
    in_effect = effective(limits, kind)
    for new_spec in writes:
        new = _cr(kind, namespace, new_spec)
        # As an update of the stored CR (where there is one) and as a create (a re-create).
        for before in ([old] if old is not None else []) + [None]:
            if before is not None:
                new["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"]
            else:
                new["metadata"].pop("resourceVersion", None)
                new["metadata"]["name"] = "oracle-new"
                new["spec"]["serviceId"] = f"oracle-new-{namespace}"
            refused = _refused(admin, new, update=before is not None)
            over = Limits.over(new, in_effect, before)
            event(f"{kind} {'update' if before else 'create'} refused={refused}")
            assert refused == bool(over), (limits, old_spec, new_spec, before is not None, over)
