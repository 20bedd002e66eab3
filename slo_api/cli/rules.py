"""`sloctl rules`: a PrometheusRule recording each route's error ratios and alerting on burn.

Built from what the server says of each route: its percentile targets (`GET /config?view=full`;
`pXX` is the objective XX/100) and, in the attainment listing's `selectors`, the vector
selector of its vLLM series (`name{matchers}`), so the rule of which series belong to a route
lives in one place (the server). Only percentile
objectives have an error budget: `avg` objectives and job routes get no rules (slo-api's
attainment shows them).

Names follow Sloth's (`slo:sli_error:ratio_rate<window>`), each series labelled `route`,
`metric` and `type`; the alerts are the SRE workbook's multiwindow, multi-burn-rate ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

# vLLM's histograms (vllm/v1/metrics/loggers.py) and their bucket bounds, in seconds. A
# threshold can only be placed on one of these in PromQL: a bucket is one series.
TTFT_METRIC = "vllm:time_to_first_token_seconds"
TPOT_METRIC = "vllm:request_time_per_output_token_seconds"
TTFT_BOUNDS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TPOT_BOUNDS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
# A threshold this close (relatively) to a bound is that bound: 1/T for OTPS rarely lands exactly.
BOUND_TOLERANCE = 1e-9

# The windows the recording rules cover: those of the page and ticket alerts.
WINDOWS = ("5m", "30m", "1h", "6h", "3d")


@dataclass(frozen=True)
class BurnAlert:
    name: str
    severity: str
    # Each pair (long window, short window, factor): both windows must burn above the factor.
    conditions: tuple[tuple[str, str, float], ...]
    summary: str


ALERTS = (
    BurnAlert(
        "SLOErrorBudgetBurnFast",
        "page",
        (("1h", "5m", 14.4), ("6h", "30m", 6.0)),
        "spends its error budget fast",
    ),
    BurnAlert("SLOErrorBudgetBurnSlow", "ticket", (("3d", "6h", 1.0),), "spends its error budget"),
)

_PERCENTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


@dataclass(frozen=True)
class Bucket:
    """The histogram bucket standing for a threshold."""

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


def bucket_for(metric: str, threshold: float) -> Bucket:
    """The bucket at or below a threshold (conservative: no request slower than it is good)."""
    bounds: tuple[float, ...]
    if metric == "ttft":
        name, bounds, limit = TTFT_METRIC, TTFT_BOUNDS, threshold
    else:
        name, bounds, limit = TPOT_METRIC, TPOT_BOUNDS, 1 / threshold
    for bound in bounds:
        if math.isclose(bound, limit, rel_tol=BOUND_TOLERANCE, abs_tol=0):
            return Bucket(name, bound, limit, exact=True)
    below = [b for b in bounds if b < limit]
    if not below:
        raise ValueError(
            f"{limit:g}s is below the smallest bucket bound of {name} ({bounds[0]:g}s)"
        )
    return Bucket(name, below[-1], limit, exact=False)


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
    bodies: Iterable[dict[str, Any]], attainment: Iterable[dict[str, Any]]
) -> tuple[list[Objective], list[str]]:
    """The percentile objectives rules can be made for, and why others are left out.

    The targets are the routes' own (`/config?view=full`), so rules can be made whether or not
    slo-api reaches Prometheus; the series are the ones the attainment listing names.
    """
    selectors_of = {
        item.get("route"): item.get("selectors") for item in attainment if isinstance(item, dict)
    }
    found: list[Objective] = []
    skipped: list[str] = []
    for body in bodies:
        route = str(body.get("route"))
        if body.get("ambiguous"):
            skipped.append(f"{route}: claimed by more than one CR")
            continue
        if body.get("kind") != "llm":
            continue  # job routes: their own queue.promql, no histogram to record
        selectors = selectors_of.get(route)
        for metric in ("ttft", "otps"):
            section = body.get(metric) or {}
            for target in (section.get("default") or {}).get("metrics") or []:
                kind, threshold = str(target.get("type")), target.get("threshold")
                what = f"{route} {metric} {kind}"
                percentile = _PERCENTILE.match(kind)
                if not percentile:
                    skipped.append(f"{what}: an average has no error budget")
                    continue
                objective = float(percentile.group(1)) / 100
                selector = selectors.get(metric) if isinstance(selectors, dict) else None
                if not isinstance(selector, str):
                    skipped.append(f"{what}: the server named no series selector for it")
                    continue
                if not (_number(threshold) and 0 < objective < 1):
                    skipped.append(f"{what}: no threshold or objective")
                    continue
                try:
                    parse_selector(selector, TTFT_METRIC)
                    bucket = bucket_for(metric, threshold)
                except ValueError as exc:
                    skipped.append(f"{what}: {exc}")
                    continue
                found.append(Objective(route, metric, kind, threshold, objective, selector, bucket))
    return found, skipped


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _labels(obj: Objective) -> dict[str, str]:
    return {"route": obj.route, "metric": obj.metric, "type": obj.type}


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


def _group(obj: Objective) -> dict[str, Any]:
    bucket = obj.bucket
    labels = _labels(obj)
    rules: list[dict[str, Any]] = [
        # A dict of its own each: a shared one would be written as a YAML anchor and aliases.
        {
            "record": f"slo:sli_error:ratio_rate{w}",
            "expr": error_ratio(obj, w),
            "labels": {**labels},
        }
        for w in WINDOWS
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
    for alert in ALERTS:
        arms = [
            f"(slo:sli_error:ratio_rate{long}{_promql_labels(obj)} > {factor * budget:.6g}"
            f" and slo:sli_error:ratio_rate{short}{_promql_labels(obj)} > {factor * budget:.6g})"
            for long, short, factor in alert.conditions
        ]
        windows = " or ".join(
            f"{factor:g}x over {long} and {short}" for long, short, factor in alert.conditions
        )
        rules.append(
            {
                "alert": alert.name,
                "expr": "\n or\n".join(arms),
                "labels": {**labels, "severity": alert.severity},
                "annotations": {
                    "summary": f"{obj.route} {alert.summary} ({target})",
                    "description": (
                        f"Route {obj.route} burns the error budget of {target} "
                        f"(objective {obj.objective:.6g}) at more than {windows}."
                    ),
                    "threshold_bucket": bucket.note,
                },
            }
        )
    return {"name": f"slo-api.{obj.route}.{obj.metric}.{obj.type}", "rules": rules}


def prometheus_rule(found: Sequence[Objective], name: str, namespace: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = {"app.kubernetes.io/managed-by": "sloctl"}
    groups = [_group(obj) for obj in found]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": {"groups": groups},
    }
