"""`sloctl rules`: a PrometheusRule recording each route's error ratios and alerting on burn.

Built from what the server says of each route in its attainment listing: each percentile
target's bucket bound and alert arms (`alerting`: the server's at_risk uses the same arms), and
the vector selector of its vLLM series (`selectors`), so neither the bucket, nor the burn-rate
factors, nor which series belong to a route has a second copy here. Only percentile objectives
have an error budget: `avg` objectives and job routes get no rules (slo-api's attainment shows
them).

Names follow Sloth's (`slo:sli_error:ratio_rate<window>`), each series labelled `route`,
`metric`, `type` and `threshold`; the alerts are the SRE workbook's multiwindow, multi-burn-rate
ones, plus one that fires when the bucket the rules count at is missing.

A group per route records, every 5 minutes, the 5-minute increases of the route's buckets and
sum, summed over its series (`slo_api:bucket:increase5m` and `slo_api:sum:increase5m`, labelled
`route` and `metric`, `le` on the buckets): slo-api's attainment sums those over its windows
instead of reading every raw series, as Pyrra does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

# The one module of the server sloctl imports: the names of the series the server reads.
from slo_api.attainment import recorded

# vLLM's histograms (vllm/v1/metrics/loggers.py).
TTFT_METRIC = "vllm:time_to_first_token_seconds"
TPOT_METRIC = "vllm:request_time_per_output_token_seconds"
HISTOGRAMS = {"ttft": TTFT_METRIC, "otps": TPOT_METRIC}

ALERT_NAMES = {"page": "SLOErrorBudgetBurnFast", "ticket": "SLOErrorBudgetBurnSlow"}
SUMMARIES = {"page": "spends its error budget fast", "ticket": "spends its error budget"}
BUCKET_ALERT = "SLOThresholdBucketMissing"
# How long the bucket must be missing before its alert fires: the page's long window.
BUCKET_ABSENT_FOR = "1h"

_DURATION = re.compile(r"^(\d+)([mhd])$")
_SECONDS = {"m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Arm:
    severity: str
    long: str
    short: str
    factor: float  # both windows burn above it
    budget_share: float  # of the SLO window's budget, spent over `long` at that burn
    capped: bool


@dataclass(frozen=True)
class Bucket:
    """The histogram bucket standing for a threshold, as the server names it."""

    metric: str
    bound: float
    # The threshold in the histogram's unit (seconds; 1/T for OTPS).
    limit: float
    exact: bool

    @property
    def note(self) -> str:
        unit = "s" if self.metric == TTFT_METRIC else "s per output token"
        if self.exact:
            return f"good = requests in bucket le={_le(self.bound)} ({self.bound:g}{unit})"
        return (
            f"the threshold ({self.limit:.6g}{unit}) falls between bucket bounds: good = "
            f"requests at or below the bound under it, le={_le(self.bound)}, so the error "
            "ratio is overstated (never understated) by the requests between the two"
        )


@dataclass(frozen=True)
class Objective:
    route: str
    metric: str  # ttft | otps
    type: str  # pXX
    threshold: float  # seconds (ttft) or tokens per second (otps)
    objective: float  # the fraction of requests that must be within the threshold
    selector: str  # the server's vector selector, `vllm:...{model_name="..."}`
    bucket: Bucket
    arms: tuple[Arm, ...]


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else str(int(bound))


def _le_matcher(bound: float) -> str:
    # Exposition libraries spell a whole bound as "1" (Go) or "1.0" (Python, vLLM): match both.
    # ([.] rather than an escaped dot: PromQL strings know no "\." escape.)
    text = _le(bound)
    if bound == int(bound):
        return f'le=~"{text}|{text}[.]0"'
    return f'le="{text}"'


_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def parse_selector(selector: str, default_name: str) -> tuple[str, str]:
    """A vector selector's metric name (the histogram's, when it names none) and its matchers.

    A metric name holds no `{`, so the first one opens the matchers, whatever their values hold.
    """
    text = selector.strip()
    name, brace, rest = text.partition("{")
    name = name.strip() or default_name
    if not brace or not rest.endswith("}") or not _METRIC_NAME.match(name):
        raise ValueError(f"not a vector selector: {selector!r}")
    return name, rest[:-1].strip().rstrip(",").strip()


def _matchers(inner: str, *extra: str) -> str:
    return "{" + ", ".join(p for p in (inner, *extra) if p) + "}"


def objectives(
    attainment: Iterable[dict[str, Any]],
) -> tuple[list[Objective], list[str], list[str]]:
    """The percentile objectives rules can be made for, why others are left out, and
    warnings about the rules made (an arm that cannot fire).

    Everything comes from the attainment listing, which names each target's bucket and arms
    whether or not slo-api reaches Prometheus.
    """
    found: list[Objective] = []
    skipped: list[str] = []
    warnings: list[str] = []
    for item in attainment:
        if not isinstance(item, dict):
            continue
        route = str(item.get("route"))
        if item.get("ambiguous"):
            skipped.append(f"{route}: claimed by more than one CR")
            continue
        if item.get("kind") != "llm":
            continue  # job routes: their own queue.promql, no histogram to record
        selectors = item.get("selectors")
        targets = item.get("alerting")
        if not isinstance(targets, list):
            skipped.append(f"{route}: the server named no alerting for it (an older slo-api)")
            continue
        for target in targets:
            obj = _objective(route, target, selectors, skipped)
            if obj is None:
                continue
            if any(_labels(o) == _labels(obj) for o in found):
                skipped.append(f"{_what(obj)}: the same target twice")
                continue
            warnings.extend(_cannot_fire(obj))
            found.append(obj)
        for item_objective in item.get("objectives") or []:
            if isinstance(item_objective, dict) and item_objective.get("type") == "avg":
                metric = item_objective.get("metric")
                skipped.append(f"{route} {metric} avg: an average has no error budget")
    return found, skipped, warnings


def _what(obj: Objective) -> str:
    return f"{obj.route} {obj.metric} {obj.type} {obj.threshold:g}"


def _objective(route: str, target: Any, selectors: Any, skipped: list[str]) -> Objective | None:
    if not isinstance(target, dict):
        return None
    metric, kind = str(target.get("metric")), str(target.get("type"))
    threshold, objective = target.get("threshold"), target.get("objective")
    what = f"{route} {metric} {kind}"
    histogram = HISTOGRAMS.get(metric)
    if histogram is None or not (_number(threshold) and _number(objective) and objective < 1):
        skipped.append(f"{what}: no threshold or objective")
        return None
    selector = selectors.get(metric) if isinstance(selectors, dict) else None
    if not isinstance(selector, str):
        skipped.append(f"{what}: the server named no series selector for it")
        return None
    bucket = target.get("bucket")
    if not isinstance(bucket, dict) or not _number(bucket.get("le")):
        skipped.append(
            f"{what} {threshold:g}: no bucket bound of {histogram} lies at or below the "
            "threshold, so no bucket can count it"
        )
        return None
    arms = tuple(_arm(a) for a in target.get("arms") or [])
    bad = [a for a in arms if a is None]
    if not arms or bad:
        skipped.append(f"{what}: the server named no usable alert arms")
        return None
    try:
        parse_selector(selector, histogram)
    except ValueError as exc:
        skipped.append(f"{what}: {exc}")
        return None
    usable = tuple(a for a in arms if a is not None)
    limit = threshold if metric == "ttft" else 1 / threshold
    return Objective(
        route,
        metric,
        kind,
        threshold,
        objective,
        selector,
        Bucket(histogram, float(bucket["le"]), limit, bucket.get("exact") is True),
        usable,
    )


def _arm(arm: Any) -> Arm | None:
    """One of the server's arms; None unless its severity, windows and factor are usable."""
    if not isinstance(arm, dict):
        return None
    severity, long, short = arm.get("severity"), arm.get("long"), arm.get("short")
    factor, share = arm.get("burnRate"), arm.get("budgetShare")
    if (
        severity not in ALERT_NAMES
        or not (isinstance(long, str) and isinstance(short, str))
        or not (_window(long) and _window(short))
        or not _number(factor)
    ):
        return None
    return Arm(
        str(severity),
        long,
        short,
        factor,
        share if _number(share) else 0.0,
        arm.get("capped") is True,
    )


def _cannot_fire(obj: Objective) -> list[str]:
    """An arm above the highest burn rate an objective allows, 1 / (1 - objective), stays
    silent even when every request misses: say so rather than hand over a dead alert."""
    most = 1 / (1 - obj.objective)
    return [
        f"{_what(obj)}: the {a.severity} arm over {a.long} and {a.short} cannot fire (it needs a "
        f"burn rate above {a.factor:g}; {obj.type} burns at most {most:.4g})"
        for a in obj.arms
        if a.factor * (1 - obj.objective) >= 1
    ]


def _window(text: str) -> int:
    match = _DURATION.match(text)
    return int(match.group(1)) * _SECONDS[match.group(2)] if match else 0


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _labels(obj: Objective) -> dict[str, str]:
    # Two targets of one type on one metric differ by their threshold.
    return {
        "route": obj.route,
        "metric": obj.metric,
        "type": obj.type,
        "threshold": f"{obj.threshold:.12g}",
    }


def _promql_labels(obj: Objective) -> str:
    # Route names are DNS labels and metrics/types fixed words, but quote them properly anyway.
    return "{" + ", ".join(f'{k}="{_escape(v)}"' for k, v in _labels(obj).items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def error_ratio(obj: Objective, window: str) -> str:
    """1 - the fraction of requests within the objective's threshold over `window`."""
    bucket = obj.bucket
    name, inner = parse_selector(obj.selector, bucket.metric)
    good = f"{name}_bucket{_matchers(inner, _le_matcher(bucket.bound))}"
    total = f"{name}_count{_matchers(inner)}"
    return f"1 - (sum(rate({good}[{window}])) / sum(rate({total}[{window}])))"


def _absent_bucket(obj: Objective) -> str:
    bucket = obj.bucket
    name, inner = parse_selector(obj.selector, bucket.metric)
    series = f"{name}_bucket{_matchers(inner, _le_matcher(bucket.bound))}"
    return f"absent_over_time({series}[{BUCKET_ABSENT_FOR}])"


def _group(obj: Objective) -> dict[str, Any]:
    bucket = obj.bucket
    labels = _labels(obj)
    windows = sorted({w for a in obj.arms for w in (a.long, a.short)}, key=_window)
    rules: list[dict[str, Any]] = [
        # A dict of its own each: a shared one would be written as a YAML anchor and aliases.
        {
            "record": f"slo:sli_error:ratio_rate{w}",
            "expr": error_ratio(obj, w),
            "labels": {**labels},
        }
        for w in windows
    ]
    rules.append(
        {
            "record": "slo:objective:ratio",
            "expr": f"vector({obj.objective:g})",
            "labels": {**labels},
        }
    )
    budget = 1 - obj.objective
    sign = "<=" if obj.metric == "ttft" else ">="
    unit = "s" if obj.metric == "ttft" else " tokens/s"
    target = f"{obj.type} {obj.metric} {sign} {obj.threshold:g}{unit}"
    for severity, alert_name in ALERT_NAMES.items():
        arms = [a for a in obj.arms if a.severity == severity]
        if not arms:
            continue
        selected = _promql_labels(obj)
        exprs = [
            f"(slo:sli_error:ratio_rate{a.long}{selected} > {a.factor * budget:.6g}"
            f" and slo:sli_error:ratio_rate{a.short}{selected} > {a.factor * budget:.6g})"
            for a in arms
        ]
        meaning = " or ".join(
            f"{a.factor:g}x over {a.long} and {a.short} ({a.budget_share:.3g} of the budget "
            f"in {a.long}{'; capped: at most half the requests need miss' if a.capped else ''})"
            for a in arms
        )
        rules.append(
            {
                "alert": alert_name,
                "expr": "\n or\n".join(exprs),
                "labels": {**labels, "severity": severity},
                "annotations": {
                    "summary": f"{obj.route} {SUMMARIES[severity]} ({target})",
                    "description": (
                        f"Route {obj.route} burns the error budget of {target} "
                        f"(objective {obj.objective:.6g}) at more than {meaning}."
                    ),
                    "threshold_bucket": bucket.note,
                },
            }
        )
    rules.append(
        {
            "alert": BUCKET_ALERT,
            "expr": _absent_bucket(obj),
            "labels": {**labels, "severity": "ticket"},
            "annotations": {
                "summary": f"{obj.route}: no series of bucket le={_le(bucket.bound)} ({target})",
                "description": (
                    f"No series of {bucket.metric}_bucket le={_le(bucket.bound)} for route "
                    f"{obj.route} over {BUCKET_ABSENT_FOR}: its burn-rate alerts cannot fire. "
                    "The exporter lacks that bound, or the route's selector matches no series."
                ),
            },
        }
    )
    name = f"slo-api.{obj.route}.{obj.metric}.{obj.type}.{labels['threshold']}"
    return {"name": name, "rules": rules}


def _recording(route: str, found: Sequence[Objective]) -> dict[str, Any]:
    """A route's 5-minute increases of each metric it has objectives on, summed over its series."""
    rules: list[dict[str, Any]] = []
    for metric in sorted({o.metric for o in found}):
        obj = next(o for o in found if o.metric == metric)
        name, inner = parse_selector(obj.selector, obj.bucket.metric)
        labels = {"route": route, "metric": metric}
        rules.append(
            {
                "record": recorded.BUCKETS,
                "expr": f"sum by (le) (increase({name}_bucket{_matchers(inner)}[{recorded.STEP}]))",
                "labels": {**labels},
            }
        )
        rules.append(
            {
                "record": recorded.SUMS,
                "expr": f"sum(increase({name}_sum{_matchers(inner)}[{recorded.STEP}]))",
                "labels": {**labels},
            }
        )
    return {
        "name": recorded.group(route),
        "interval": recorded.STEP,
        "rules": rules,
    }


def prometheus_rule(found: Sequence[Objective], name: str, namespace: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = {"app.kubernetes.io/managed-by": "sloctl"}
    routes = sorted({obj.route for obj in found})
    groups = [_group(obj) for obj in found] + [
        _recording(route, [o for o in found if o.route == route]) for route in routes
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": {"groups": groups},
    }
