"""The SLO arithmetic of attainment: pure functions of histogram counts, no I/O.

A histogram is its cumulative buckets, `(upper bound, observations at or below it)` sorted by
bound and ending with `+Inf`, as Prometheus's `_bucket{le}` series give them, plus `_sum`. The
rules are the SRE workbook's (chapter 5): an objective "pXX within T" is "XX% of requests
within T", its error budget `1 - XX/100`, a burn rate `(1 - good ratio) / (1 - XX/100)`, and a
route is at risk by the page arms of multiwindow, multi-burn-rate alerting. Those arms (`ARMS`,
`alerting`) are the one place `sloctl rules` takes its alerts from too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Obj = dict[str, Any]
Status = Literal["no_data", "violated", "at_risk", "met"]
# Why an objective is `no_data`: the selector matched no series in the window, its series
# counted no request, or fewer than the traffic floor.
Reason = Literal["no_series", "no_traffic", "insufficient_traffic"]
LatencyMetric = Literal["ttft", "otps"]

# The windows burn rates are over, whatever the window asked for.
BURN_WINDOWS = ("5m", "30m", "1h", "6h")
# The burn rates a forecast of the budget is made at.
FORECAST_WINDOWS = ("1h", "6h")
# The SLO window an error budget is spent over (the answers' default window).
SLO_WINDOW = "28d"
HOURS = {"5m": 5 / 60, "30m": 0.5, "1h": 1.0, "6h": 6.0, "3d": 72.0, "28d": 672.0}


@dataclass(frozen=True)
class Arm:
    """One arm of a multiwindow alert: both windows burn above the factor that spends
    `budget_share` of the SLO window's budget over `long`."""

    severity: Literal["page", "ticket"]
    long: str
    short: str
    budget_share: float


# The SRE workbook's arms by the budget share each spends (its 14.4, 6 and 1 are these shares
# for a 30-day window): the factors follow from SLO_WINDOW (13.44, 5.6 and 0.933 for 28 days).
ARMS = (
    Arm("page", "1h", "5m", 0.02),
    Arm("page", "6h", "30m", 0.05),
    Arm("ticket", "3d", "6h", 0.10),
)
# A burn rate cannot exceed 1 / (1 - objective) (2 for p50): a factor above it never fires.
# No arm asks more than this share of requests to miss the threshold; for p50 that is the
# percentile itself over target over both windows.
MAX_ERROR_RATIO = 0.5
# A threshold this close (relative) to a bucket bound is that bound: 0.1 written as 0.1000000001
# must not turn an exact count into an estimate.
SAME_BOUND = 1e-9
PERCENTILES = {"p50": 0.5, "p80": 0.8, "p90": 0.9, "p95": 0.95, "p99": 0.99}
# vLLM's bucket bounds (vllm/v1/metrics/loggers.py), in seconds: the bucket an objective is
# counted at in PromQL (`sloctl rules`) is one of these.
BOUNDS: dict[LatencyMetric, tuple[float, ...]] = {
    "ttft": (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ),
    "otps": (
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]
    sum: float | None = None

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0


def same_bound(value: float, bound: float) -> bool:
    if math.isinf(bound):
        return value == bound
    return value == bound or abs(value - bound) <= SAME_BOUND * abs(bound)


def fraction_within(histogram: Histogram, limit: float) -> tuple[float | None, bool]:
    """The fraction of observations at or below `limit`, and whether it is estimated (the
    limit falls inside a bucket: linear inside it, as histogram_quantile assumes). None when
    there are no observations."""
    total = histogram.count
    if total <= 0:
        return None, False
    if math.isinf(limit):
        return 1.0, False
    lower, below = 0.0, 0.0
    for bound, count in histogram.buckets:
        if same_bound(limit, bound):
            return min(count / total, 1.0), False
        if limit < bound:
            if math.isinf(bound):
                # Above the highest finite bound nothing is known: only what is below it
                # counts, an estimate unless nothing is above it.
                return below / total, count > below
            share = (limit - lower) / (bound - lower) if bound > lower else 1.0
            return min((below + (count - below) * max(share, 0.0)) / total, 1.0), True
        lower, below = bound, count
    return 1.0, False


def good_ratio_bounds(histogram: Histogram, limit: float) -> tuple[float, float] | None:
    """The fraction counted at the bucket bounds around `limit` (the same twice when it is a
    bound): what the interpolated good ratio is known to lie between. None when there are
    no observations."""
    total = histogram.count
    if total <= 0:
        return None
    if math.isinf(limit):
        return 1.0, 1.0
    below = 0.0
    for bound, count in histogram.buckets:
        if same_bound(limit, bound):
            share = min(count / total, 1.0)
            return share, share
        if limit < bound:
            return below / total, min(count / total, 1.0)
        below = count
    return 1.0, 1.0


def quantile(histogram: Histogram, q: float) -> float | None:
    """The q-quantile as Prometheus's histogram_quantile estimates it: linear inside the
    bucket that holds it, the lowest bucket from 0, the highest finite bound when it lies in
    `+Inf`'s bucket. None when there are no observations."""
    total = histogram.count
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for i, (bound, count) in enumerate(histogram.buckets):
        if count >= rank and count > below:
            if math.isinf(bound):
                return histogram.buckets[i - 1][0] if i > 0 else None
            if i == 0 and bound <= 0:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return histogram.buckets[-2][0] if len(histogram.buckets) > 1 else None


def burn_rate(good_ratio: float | None, objective: float) -> float | None:
    if good_ratio is None:
        return None
    return (1 - good_ratio) / (1 - objective)


def exhausts_in(
    budget_remaining: float | None, rate: float | None, window_hours: float
) -> float | None:
    """Hours until the window's budget is spent if `rate` goes on: what was spent leaves the
    window as it moves (evenly, as far as one number knows) while `rate` times the budget's
    pace comes in, so `spent (1 - h/W) + rate h/W = 1`. None when it never is (a rate at or
    below 1 never spends more than the budget over the window) or is spent already."""
    if budget_remaining is None or rate is None or budget_remaining <= 0 or rate <= 1:
        return None
    spent = 1 - budget_remaining
    return window_hours * budget_remaining / (rate - spent)


def workbook_factor(arm: Arm) -> float:
    return round(arm.budget_share * HOURS[SLO_WINDOW] / HOURS[arm.long], 6)


def burn_factor(arm: Arm, objective: float) -> float:
    """The burn rate above which `arm` fires for `objective`: the workbook's for the SLO
    window, capped where it would need more than MAX_ERROR_RATIO of requests to miss."""
    return min(workbook_factor(arm), round(MAX_ERROR_RATIO / (1 - objective), 6))


def arms(objective: float) -> list[Obj]:
    """The arms of an objective's alerts, with the burn rate each fires above and the share
    of the SLO window's budget that burn spends over its long window."""
    out = []
    for arm in ARMS:
        factor = burn_factor(arm, objective)
        out.append(
            {
                "severity": arm.severity,
                "long": arm.long,
                "short": arm.short,
                "burnRate": factor,
                "budgetShare": round(factor * HOURS[arm.long] / HOURS[SLO_WINDOW], 6),
                "capped": factor < workbook_factor(arm),
            }
        )
    return out


def at_risk(burn_rates: Mapping[str, float | None], objective: float) -> bool:
    """Whether a page arm fires: both its windows burn above its factor."""

    def above(window: str, factor: float) -> bool:
        rate = burn_rates.get(window)
        return rate is not None and rate > factor

    for arm in ARMS:
        factor = burn_factor(arm, objective)
        if arm.severity == "page" and above(arm.long, factor) and above(arm.short, factor):
            return True
    return False


def limit_of(metric: LatencyMetric, threshold: float) -> float:
    """A threshold in the histogram's unit: TTFT's seconds; OTPS at least T is time per output
    token at most 1/T (T = 0: every request is within)."""
    if metric == "ttft":
        return threshold
    return 1 / threshold if threshold > 0 else math.inf


def counted_bound(metric: LatencyMetric, threshold: float) -> tuple[float, bool] | None:
    """The bucket bound an objective is counted at in PromQL, and whether it is the
    threshold itself: the bound at or below the threshold (conservative: no request slower
    than it counts as good). None when no bound lies at or below it."""
    limit = limit_of(metric, threshold)
    bounds = BOUNDS[metric]
    for bound in bounds:
        if same_bound(limit, bound):
            return bound, True
    below = [b for b in bounds if b < limit]
    return (below[-1], False) if below and not math.isinf(limit) else None


def alerting(metric: LatencyMetric, type_: str, threshold: float) -> Obj | None:
    """What alerts on a percentile objective use: its bucket and its arms (None for `avg`)."""
    q = PERCENTILES.get(type_)
    if q is None:
        return None
    counted = counted_bound(metric, threshold)
    return {
        "metric": metric,
        "type": type_,
        "threshold": threshold,
        "objective": q,
        "bucket": None if counted is None else {"le": counted[0], "exact": counted[1]},
        "arms": arms(q),
    }


def latency_objective(
    metric: LatencyMetric,
    type_: str,
    threshold: float,
    window: Histogram | None,
    burn_windows: Mapping[str, Histogram | None],
    *,
    min_requests: float = 0,
    series: bool = True,
    window_hours: float = HOURS[SLO_WINDOW],
) -> Obj:
    """One objective of `ttft.default` or `otps.default` over the window.

    TTFT is measured in seconds per request; OTPS from each request's time per output token
    (tokens per second = 1 / it), so "OTPS at least T" is "time per output token at most 1/T".
    Fewer requests than `min_requests` is `no_data` (`insufficient_traffic`) with the figures
    kept; `series` False: the selector matched no series in the window (`no_series`).
    `window_hours`: the window's length, for the forecast (`exhaustsIn`, hours, at each of
    FORECAST_WINDOWS' burn rates).
    """
    answer: Obj = {
        "metric": metric,
        "type": type_,
        "threshold": threshold,
        "objective": None,
        "observed": None,
        "goodRatio": None,
        "budgetRemaining": None,
        "burnRates": None,
        "status": "no_data",
        "estimated": False,
        "requests": None,
        "reason": None,
        "goodRatioBounds": None,
        "coverage": None,
        "exhaustsIn": None,
    }
    requests = window.count if window is not None else None
    answer["requests"] = requests
    if requests is None or requests <= 0:
        answer["reason"] = "no_traffic" if series else "no_series"
    few = requests is not None and 0 < requests < min_requests
    if type_ == "avg":
        answer.update(_average(metric, threshold, window))
        if few:
            answer.update(status="no_data", reason="insufficient_traffic")
        return answer
    q = PERCENTILES[type_]
    answer["objective"] = q
    limit = limit_of(metric, threshold)
    rates: dict[str, float | None] = {}
    for name in BURN_WINDOWS:
        histogram = burn_windows.get(name)
        ratio = fraction_within(histogram, limit)[0] if histogram is not None else None
        rates[name] = burn_rate(ratio, q)
    answer["burnRates"] = rates
    answer["exhaustsIn"] = {name: None for name in FORECAST_WINDOWS}
    if window is None or window.count <= 0:
        return answer
    good, estimated = fraction_within(window, limit)
    assert good is not None
    bounds = good_ratio_bounds(window, limit)
    observed = quantile(window, q)
    if metric == "otps" and observed is not None:
        observed = 1 / observed if observed > 0 else None
    budget = 1 - (1 - good) / (1 - q)
    answer.update(
        observed=observed,
        goodRatio=good,
        goodRatioBounds=None if bounds is None else {"low": bounds[0], "high": bounds[1]},
        budgetRemaining=budget,
        estimated=estimated,
    )
    if few:
        # Too few requests to tell met from violated: the figures stay, the status does not
        # claim either, and nothing is forecast from them.
        answer.update(status="no_data", reason="insufficient_traffic")
        return answer
    answer["exhaustsIn"] = {
        name: exhausts_in(budget, rates.get(name), window_hours) for name in FORECAST_WINDOWS
    }
    if good < q:
        answer["status"] = "violated"
    elif at_risk(rates, q):
        answer["status"] = "at_risk"
    else:
        answer["status"] = "met"
    return answer


def _average(metric: LatencyMetric, threshold: float, window: Histogram | None) -> Obj:
    """`avg`: sum / count over the window (OTPS: count / sum of time per output token)."""
    if window is None or window.count <= 0 or window.sum is None:
        return {}
    if metric == "ttft":
        observed: float | None = window.sum / window.count
        met = observed is not None and observed <= threshold
    else:
        observed = window.count / window.sum if window.sum > 0 else None
        met = observed is None or observed >= threshold  # no time at all: infinitely fast
    return {"observed": observed, "status": "met" if met else "violated"}


def queue_objective(max_depth: int, now: float | None, good_steps: float | None) -> Obj:
    """A job route's one objective: the queue's depth now against `maxDepth`, and the share
    of the window's one-minute steps at or below it."""
    if now is None:
        status: Status = "no_data"
    else:
        status = "violated" if now > max_depth else "met"
    return {
        "metric": "queue",
        "type": "maxDepth",
        "threshold": max_depth,
        "objective": None,
        "observed": now,
        "goodRatio": good_steps,
        "budgetRemaining": None,
        "burnRates": None,
        "status": status,
        "estimated": False,
        "requests": None,
        "reason": None,
        "goodRatioBounds": None,
        "coverage": None,
        "exhaustsAt": None,
    }


def lowest_budget(objectives: Sequence[Obj]) -> float | None:
    """What `sort=budget` orders routes by: the lowest budget remaining among the objectives
    with data. One below the traffic floor keeps its figures but ranks as its status says, no
    data: a handful of requests must not put a route first."""
    budgets = [
        o["budgetRemaining"]
        for o in objectives
        if o.get("budgetRemaining") is not None and o.get("status") != "no_data"
    ]
    return min(budgets) if budgets else None
