"""Four weeks of vLLM-shaped histograms and a job queue, generated from known distributions as
OpenMetrics text for `promtool tsdb create-blocks-from openmetrics`, and the figures a window
of them must give, worked out here from what was generated (never from slo-api's code).

Counters start high (`BASE`) so Prometheus's `increase()` extrapolates every bucket of a route
alike (a counter near zero is extrapolated less): a ratio of increases is then exactly the ratio
of the raw deltas between the first and last samples in the window, which `delta` computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5,
               7.5, 10, 20, 40, 80, 160, 640, 2560, math.inf)  # fmt: skip
TPOT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5,
               10, 20, 40, 80, math.inf)  # fmt: skip
QUEUE = "job_queue_depth"
BASE = 1_000_000
DAY = 86400
SPAN = 28 * DAY + 3600  # a little more than the longest window
COARSE = 1800  # one sample per 30 minutes...
FINE = 60  # ...and per minute over the last two hours (5m and 30m burn rates need samples)
FINE_SPAN = 2 * 3600
WINDOWS = {"5m": 300, "30m": 1800, "1h": 3600, "6h": 21600, "1d": DAY, "7d": 7 * DAY,
           "28d": 28 * DAY}  # fmt: skip

# Requests per sample interval, by bucket upper bound (not cumulative), by age of the sample:
# a good month, a degraded last day, a bad last hour.
Phase = dict[float, int]


@dataclass(frozen=True)
class Shape:
    old: Phase
    day: Phase
    hour: Phase

    def at(self, age: float) -> Phase:
        if age <= 3600:
            return self.hour
        if age <= DAY:
            return self.day
        return self.old


CHAT_TTFT = Shape(
    old={0.1: 20, 0.25: 40, 0.5: 35, 1: 4, 2.5: 1},
    day={0.25: 30, 0.5: 50, 1: 15, 2.5: 5},
    hour={0.5: 50, 1: 30, 5: 20},
)
CHAT_TPOT = Shape(
    old={0.025: 50, 0.05: 45, 0.1: 5},
    day={0.05: 60, 0.1: 40},
    hour={0.05: 30, 0.1: 70},
)
# The route whose model holds quotes and braces: its own, very different, figures.
ODD_TTFT = Shape(old={5: 10}, day={5: 10}, hour={5: 10})
ODD_TPOT = Shape(old={1: 10}, day={1: 10}, hour={1: 10})


def timestamps(end: int) -> list[int]:
    coarse = list(range(end - SPAN, end - FINE_SPAN, COARSE))
    return coarse + list(range(end - FINE_SPAN, end + 1, FINE))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())


@dataclass
class Histories:
    """Every generated counter value, by series (name, labels) and timestamp."""

    end: int  # the last sample's time
    now: int  # what the phases' ages count from (samples after it are in the newest phase)
    values: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float]] = field(
        default_factory=dict
    )
    queue: dict[int, float] = field(default_factory=dict)

    def add_histogram(
        self, name: str, bounds: tuple[float, ...], shape: Shape, **labels: str
    ) -> None:
        times = timestamps(self.end)
        cumulative = dict.fromkeys(bounds, float(BASE))
        total_sum = 1000.0
        series: dict[float, dict[int, float]] = {b: {} for b in bounds}
        sums: dict[int, float] = {}
        for t in times:
            phase = shape.at(self.now - t)
            below = 0
            for bound in bounds:
                below += phase.get(bound, 0)
                cumulative[bound] += below
                series[bound][t] = cumulative[bound]
            # Each request observed at 80% of its bucket's bound.
            total_sum += sum(n * bound * 0.8 for bound, n in phase.items())
            sums[t] = total_sum
        key = tuple(labels.items())
        for bound in bounds:
            le = f"{bound:g}" if not math.isinf(bound) else "+Inf"
            self.values[(f"{name}_bucket", (*key, ("le", le)))] = series[bound]
        self.values[(f"{name}_count", key)] = series[bounds[-1]]
        self.values[(f"{name}_sum", key)] = sums

    def add_queue(self, depth: Callable[[float], float]) -> None:
        for t in range(self.end - SPAN, self.end + 1, FINE):
            self.queue[t] = depth(self.now - t)

    def openmetrics(self) -> str:
        return "".join(self._lines()) + "# EOF\n"

    def _lines(self) -> Iterator[str]:
        families: dict[str, list[tuple[str, tuple[tuple[str, str], ...]]]] = {}
        for name, labels in self.values:
            family = name.rsplit("_", 1)[0]
            families.setdefault(family, []).append((name, labels))
        for family, members in families.items():
            yield f"# TYPE {family} histogram\n"
            for name, labels in members:
                text = _labels(dict(labels))
                for t, v in self.values[(name, labels)].items():
                    yield f"{name}{{{text}}} {v:.12g} {t}\n"
        yield f"# TYPE {QUEUE} gauge\n"
        for t, v in self.queue.items():
            yield f'{QUEUE}{{queue="q1"}} {v:g} {t}\n'

    # -- the oracle ----------------------------------------------------------------------

    def delta(self, name: str, labels: dict[str, str], at: int, window: int) -> float | None:
        """What the window's increase() is proportional to: last - first sample in
        [at - window, at]; None with fewer than two samples."""
        series = self.values[(name, tuple(labels.items()))]
        inside = [t for t in series if at - window <= t <= at]
        if len(inside) < 2:
            return None
        return series[max(inside)] - series[min(inside)]

    def counts(
        self, name: str, bounds: tuple[float, ...], at: int, window: int, **labels: str
    ) -> list[tuple[float, float]]:
        """Cumulative (bound, delta) over the window, summed over series differing only in
        labels not given (engines)."""
        out = []
        for bound in bounds:
            le = f"{bound:g}" if not math.isinf(bound) else "+Inf"
            total = 0.0
            for (n, key), _ in self.values.items():
                have = dict(key)
                if n != f"{name}_bucket" or have.get("le") != le:
                    continue
                if any(have.get(k) != v for k, v in labels.items()):
                    continue
                d = self.delta(n, have, at, window)
                total += d or 0.0
            out.append((bound, total))
        return out

    def queue_steps(self, at: int, window: int, max_depth: int) -> tuple[float, float]:
        """The share of the window's one-minute steps (on whole minutes) at or below
        `max_depth`, each step's depth the latest sample at most 5 minutes before it; with the
        step on the window's start counted and not (an edge Prometheus may treat either way)."""

        def value(t: int) -> float | None:
            latest = t - (t - 30) % 60  # samples are at 30 s past each minute
            return self.queue.get(latest if t - latest <= 300 else -1)

        results = []
        for first in (at - window, at - window + 1):
            steps = [t for t in range(first + (-first) % 60, at + 1, 60)]
            values = [v for t in steps if (v := value(t)) is not None]
            results.append(sum(1 for v in values if v <= max_depth) / len(values))
        return min(results), max(results)


def between(counts: list[tuple[float, float]], threshold: float) -> tuple[float, float, float]:
    """For a threshold inside a bucket: the good ratios at its lower and upper bounds and the
    linear estimate between them."""
    total = counts[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in counts:
        if threshold <= bound:
            share = (threshold - lower) / (bound - lower)
            return below / total, count / total, (below + (count - below) * share) / total
        lower, below = bound, count
    raise AssertionError("threshold beyond the buckets")


def at_bound(counts: list[tuple[float, float]], bound: float) -> float:
    total = counts[-1][1]
    return next(c for b, c in counts if b == bound) / total


def percentile(counts: list[tuple[float, float]], q: float) -> float:
    """The q-quantile, linear inside its bucket (what histogram_quantile estimates)."""
    rank = q * counts[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in counts:
        if count >= rank and count > below:
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    raise AssertionError("no quantile")
