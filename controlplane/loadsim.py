"""A load simulator for the demo: vLLM-shaped histograms for the sample routes, for Prometheus.

It exposes what vLLM's engines export (`vllm:time_to_first_token_seconds` and
`vllm:request_time_per_output_token_seconds`, vLLM's bucket bounds, labelled `model_name`)
for the LLM sample routes with TTFT/OTPS targets, and the queue gauges the job samples'
`queue.promql` reads. Each route's requests follow a profile chosen so slo-api shows one of
each status: `chat-7b` meets its SLO, `code-13b` is at risk (a good month, a bad last few
hours: its budget is not spent but burns fast), `reason-70b` is violated.

The month before the demo starts is written as OpenMetrics (`history_openmetrics`) for
`promtool tsdb create-blocks-from openmetrics`; from then on requests are drawn at random from
the same profiles on every scrape. The server listens on loopback only.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from controlplane.admin import Obj

TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
# vllm/v1/metrics/loggers.py
TTFT_BOUNDS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TPOT_BOUNDS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip

# A latency distribution: (share of requests, low, high) pieces, each uniform on [low, high].
Mixture = tuple[tuple[float, float, float], ...]


@dataclass(frozen=True)
class Profile:
    ttft: Mixture
    tpot: Mixture
    # Since how long before the demo started requests follow `ttft_now` and `tpot_now` (None:
    # always `ttft`, `tpot`).
    bad_for_seconds: float = 0.0
    ttft_now: Mixture | None = None
    tpot_now: Mixture | None = None

    def ttft_at(self, age: float) -> Mixture:
        """The TTFT mixture `age` seconds before the demo started (negative: after)."""
        if self.ttft_now is not None and age < self.bad_for_seconds:
            return self.ttft_now
        return self.ttft

    def tpot_at(self, age: float) -> Mixture:
        if self.tpot_now is not None and age < self.bad_for_seconds:
            return self.tpot_now
        return self.tpot


# The samples' targets (config/samples/llm.yaml): chat-7b ttft p90 <= 0.8 s, otps avg >= 20;
# code-13b ttft p95 <= 1.2 s, otps p50 >= 30 and p99 >= 12; reason-70b ttft p90 <= 2 s.
PROFILES = {
    # 97.75% within 0.75 s; about 31 tokens/s on average.
    "chat-7b": Profile(ttft=((0.97, 0.05, 0.5), (0.03, 0.5, 1.5)), tpot=((1.0, 0.02, 0.045),)),
    # A month at 99.5% within 1.2 s, then 6 hours at about 16%: a burn rate near 17 over
    # every window up to 6h while 28 days still hold three quarters of the budget. Its OTPS
    # slows down with it: 90% of requests below 30 tokens/s (but above 12), so the p50's page
    # arm (more than half of requests missing) fires while the month is met.
    "code-13b": Profile(
        ttft=((0.995, 0.1, 1.0), (0.005, 1.2, 3.0)),
        tpot=((0.8, 0.015, 0.03), (0.2, 0.03, 0.05)),
        bad_for_seconds=6 * 3600,
        ttft_now=((0.1, 0.1, 1.0), (0.9, 1.2, 4.0)),
        tpot_now=((0.1, 0.015, 0.03), (0.9, 0.04, 0.07)),
    ),
    # 75% within 2 s (all of them within 0.9 s) against an objective of 90%, all month: a
    # burn rate of 2.5, violated but nowhere near a page.
    "reason-70b": Profile(ttft=((0.75, 0.2, 0.9), (0.25, 2.6, 6.0)), tpot=((1.0, 0.03, 0.07),)),
}
# The job samples' queue.promql, answered: batch-render within its maxDepth 20, nightly-eval over 5.
GAUGES = (
    ("jobs_pending", "service", "batch-render", 12.0),
    ("eval_jobs_queued", "suite", "nightly", 8.0),
)
REQUESTS_PER_SECOND = 5.0
HISTORY_SECONDS = 28 * 86400
HISTORY_STEP_SECONDS = 1800


def models(samples: Iterable[Obj]) -> dict[str, str]:
    """The `model_name` of each profiled route, as slo-api picks it by default (spec.model,
    else spec.serviceId)."""
    found: dict[str, str] = {}
    for obj in samples:
        spec = obj.get("spec") or {}
        name = obj.get("metadata", {}).get("name")
        if obj.get("kind") == "LLMSLORequirement" and name in PROFILES:
            found[name] = spec.get("model") or spec.get("serviceId") or name
    return found


def cdf(mixture: Mixture, x: float) -> float:
    """The share of requests at or below `x`."""
    return sum(share * min(1.0, max(0.0, (x - lo) / (hi - lo))) for share, lo, hi in mixture)


def mean(mixture: Mixture) -> float:
    return sum(share * (lo + hi) / 2 for share, lo, hi in mixture)


def draw(mixture: Mixture, rng: random.Random) -> float:
    pick = rng.random()
    for share, lo, hi in mixture:
        if pick < share:
            return rng.uniform(lo, hi)
        pick -= share
    _, lo, hi = mixture[-1]
    return rng.uniform(lo, hi)


def le(bound: float) -> str:
    """A bound as Python's prometheus_client (so vLLM) spells it: 1.0, 0.25, +Inf."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


@dataclass
class Histogram:
    bounds: Sequence[float]
    buckets: list[float] = field(default_factory=list)  # cumulative, one per bound
    count: float = 0.0
    total: float = 0.0

    def __post_init__(self) -> None:
        self.buckets = [0.0] * len(self.bounds)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.buckets[i] += 1
        self.count += 1
        self.total += value

    def add_expected(self, mixture: Mixture, requests: float) -> None:
        """`requests` requests of the mixture, as expected counts (for the history)."""
        for i, bound in enumerate(self.bounds):
            self.buckets[i] += requests * cdf(mixture, bound)
        self.count += requests
        self.total += requests * mean(mixture)

    def lines(self, name: str, labels: str, suffix: str = "") -> Iterator[str]:
        for bound, value in zip(self.bounds, self.buckets, strict=True):
            yield f'{name}_bucket{{{labels},le="{le(bound)}"}} {round(value)}{suffix}'
        yield f'{name}_bucket{{{labels},le="+Inf"}} {round(self.count)}{suffix}'
        yield f"{name}_count{{{labels}}} {round(self.count)}{suffix}"
        yield f"{name}_sum{{{labels}}} {self.total:.6f}{suffix}"


def _labels(model: str) -> str:
    escaped = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'model_name="{escaped}"'


def history_openmetrics(
    model_names: dict[str, str], end: float, seconds: float = HISTORY_SECONDS
) -> str:
    """The month before `end`, as OpenMetrics for promtool's backfill (`instance="history"`,
    so these series never meet the live ones, which start again from zero)."""
    steps = int(seconds // HISTORY_STEP_SECONDS)
    start = end - steps * HISTORY_STEP_SECONDS
    out: list[str] = []
    for name, bounds, pick in ((TTFT, TTFT_BOUNDS, "ttft"), (TPOT, TPOT_BOUNDS, "tpot")):
        out.append(f"# TYPE {name} histogram")
        for route, model in model_names.items():
            profile = PROFILES[route]
            histogram = Histogram(bounds)
            labels = _labels(model) + ',instance="history"'
            for step in range(steps + 1):
                at = start + step * HISTORY_STEP_SECONDS
                if step:
                    age = end - at
                    mixture = profile.ttft_at(age) if pick == "ttft" else profile.tpot_at(age)
                    histogram.add_expected(mixture, REQUESTS_PER_SECOND * HISTORY_STEP_SECONDS)
                out.extend(histogram.lines(name, labels, f" {at:.0f}"))
    out.append("# EOF")
    return "\n".join(out) + "\n"


class Simulator:
    """The live side: requests drawn on every scrape for the time since the last one."""

    def __init__(self, model_names: dict[str, str], seed: int = 37) -> None:
        self.model_names = model_names
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.started = time.time()
        self.last = self.started
        self.carry = 0.0
        self.ttft = {route: Histogram(TTFT_BOUNDS) for route in model_names}
        self.tpot = {route: Histogram(TPOT_BOUNDS) for route in model_names}
        self.server: ThreadingHTTPServer | None = None

    def advance(self, now: float) -> None:
        with self.lock:
            due = (now - self.last) * REQUESTS_PER_SECOND + self.carry
            self.last = now
            requests = int(due)
            self.carry = due - requests
            for route in self.model_names:
                profile = PROFILES[route]
                age = self.started - now
                for _ in range(requests):
                    self.ttft[route].observe(draw(profile.ttft_at(age), self.rng))
                    self.tpot[route].observe(draw(profile.tpot_at(age), self.rng))

    def exposition(self) -> str:
        self.advance(time.time())
        out: list[str] = []
        with self.lock:
            for name, histograms in ((TTFT, self.ttft), (TPOT, self.tpot)):
                out.append(f"# TYPE {name} histogram")
                for route, histogram in histograms.items():
                    out.extend(histogram.lines(name, _labels(self.model_names[route])))
        for gauge, label, value, depth in GAUGES:
            out.append(f"# TYPE {gauge} gauge")
            out.append(f'{gauge}{{{label}="{value}"}} {depth}')
        return "\n".join(out) + "\n"

    def start(self) -> str:
        """Serve /metrics on a free loopback port; returns host:port."""
        simulator = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = simulator.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
