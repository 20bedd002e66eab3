"""What a route's numbers rest on, against a real Prometheus (Debian's) on backfilled vLLM
series: the window Prometheus holds for a route whose series start partway through it, a
selector matching no series told apart from series that counted no request, and the traffic
floor's bounds against the bucket shares Prometheus itself computes."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from controlplane.prometheus import Prometheus
from slo_api.attainment import prometheus as client
from slo_api.attainment.cache import Attainment
from slo_api.attainment.selectors import parse_route_labels
from slo_api.kinds import build_kinds
from slo_api.metrics import Metrics
from slo_api.service import Service
from slo_api.settings import Settings
from tests.integration.crs import llm
from tests.integration.prometheus_stats import Recording

pytestmark = pytest.mark.integration

TTFT = "vllm:time_to_first_token_seconds"
STEP = 600
DAY = 86400
# The series of `late` begin this long before the end: a quarter of the day's window.
LATE = 6 * 3600
BOUNDS = (0.25, 0.5, math.inf)
FLOOR = 10


def _histogram(model: str, start: int, end: int, per_step: tuple[int, ...]) -> list[str]:
    """A model's buckets and count every STEP from `start` to `end`, each step adding
    `per_step` requests to the buckets of BOUNDS (non-cumulative)."""
    lines = []
    for n, t in enumerate(range(start, end + 1, STEP)):
        cumulative = 0
        for bound, each in zip(BOUNDS, per_step, strict=True):
            cumulative += each * n
            le = "+Inf" if math.isinf(bound) else repr(bound)
            labels = f'model_name="{model}",le="{le}"'
            lines.append(f"{TTFT}_bucket{{{labels}}} {cumulative} {t}\n")
        lines.append(f'{TTFT}_count{{model_name="{model}"}} {cumulative} {t}\n')
        lines.append(f'{TTFT}_sum{{model_name="{model}"}} {cumulative * 0.3} {t}\n')
    return lines


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, int]]:
    end = int(time.time()) // 60 * 60
    start = end - DAY + STEP
    lines = [f"# TYPE {TTFT} histogram\n"]
    lines += _histogram("late", end - LATE, end, (3, 5, 2))  # 10 a step, from 6 h ago
    lines += _histogram("idle", start, end, (0, 0, 0))  # there all day, never asked
    # A request a step in each bucket: the threshold (0.3 s) lies between a third and two.
    few = _histogram("few", start, end, (1, 1, 1))
    lines += few[-10:]  # its last two steps only (five lines each): 3 requests
    prometheus = Prometheus(tmp_path_factory.mktemp("coverage"))
    prometheus.backfill("".join(lines) + "# EOF\n")
    prometheus.start()
    yield prometheus, end
    prometheus.stop()


def _route(name: str) -> dict[str, Any]:
    return llm("ns", name, model=name, ttft={"default": {"metrics": [
        {"type": "p90", "threshold": 0.3}]}})  # fmt: skip


async def _answers(
    prometheus: Prometheus,
    end: int,
    window: str,
    max_samples: int = 50_000_000,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, dict[str, Any]]:
    settings = Settings(slo_api_token="t" * 32)
    kinds = build_kinds(settings)
    index = Service.index_for(kinds)
    names = ("late", "idle", "few", "absent")
    for name in names:
        index.upsert("llmslorequirements", _route(name))
    attainment = Attainment(
        index,
        {k.resource.plural: k.name for k in kinds},
        Metrics(),
        client.Prometheus(prometheus.url, 60, transport=transport),
        labels=parse_route_labels('model_name="{model}"'),
        refresh_seconds=60,
        series_limit=10,
        max_samples=max_samples,
        min_requests=FLOOR,
        clock=lambda: float(end),
    )
    try:
        await attainment.refresh()
        assert attainment.reason is None, attainment.reason
        return {
            n: attainment.answer(f"ns/{n}", "llm", _route(n), window)["objectives"][0]
            for n in names
        }
    finally:
        await attainment.stop()


async def test_coverage_no_series_no_traffic_and_the_floor(
    backfilled: tuple[Prometheus, int],
) -> None:
    prometheus, end = backfilled
    day = await _answers(prometheus, end, "1d")
    late = day["late"]
    # Prometheus holds the last 6 hours of the day for it: its coverage says so (to within
    # the coverage query's resolution, a thousandth of the window).
    assert late["coverage"]["fraction"] == pytest.approx(LATE / DAY, abs=2 / 1000)
    assert late["status"] in ("met", "violated")
    assert late["reason"] is None
    # Its first sample is a step after the window begins.
    assert day["idle"]["coverage"]["fraction"] == pytest.approx((DAY - STEP) / DAY, abs=2 / 1000)
    assert (day["idle"]["status"], day["idle"]["reason"]) == ("no_data", "no_traffic")
    assert (day["absent"]["status"], day["absent"]["reason"]) == ("no_data", "no_series")
    assert day["absent"]["coverage"] is None
    few = day["few"]
    assert (few["status"], few["reason"]) == ("no_data", "insufficient_traffic")
    assert 0 < few["requests"] < FLOOR
    # Its bounds are the shares Prometheus counts at 0.25 s and at 0.5 s.
    ask = client.Prometheus(prometheus.url, 60)
    try:
        shares = {}
        for le in ("0.25", "0.5"):
            found = await ask.query(
                f'sum(increase({TTFT}_bucket{{model_name="few",le="{le}"}}[1d])) / '
                f'sum(increase({TTFT}_bucket{{model_name="few",le="+Inf"}}[1d]))',
                end,
            )
            shares[le] = found[0].value
    finally:
        await ask.close()
    assert few["goodRatioBounds"] == {
        "low": pytest.approx(shares["0.25"], rel=1e-9),
        "high": pytest.approx(shares["0.5"], rel=1e-9),
    }
    assert few["goodRatioBounds"]["low"] <= few["goodRatio"] <= few["goodRatioBounds"]["high"]
    # Over the last hour the late route's series cover all of it.
    hour = await _answers(prometheus, end, "1h")
    assert hour["late"]["coverage"]["fraction"] == pytest.approx(1.0, abs=2 / 1000)


async def test_a_coverage_query_holding_more_than_max_samples_looks_at_a_coarser_step(
    backfilled: tuple[Prometheus, int],
) -> None:
    prometheus, end = backfilled
    # Three histograms (late, idle, few) at the day's 1,005 steps: Prometheus would hold up to
    # 4,020 samples at once (each histogram's steps, and one's again as they are reduced).
    limit = 1000
    sent = Recording()
    day = await _answers(prometheus, end, "1d", max_samples=limit, transport=sent)
    coverage = {q: n for q, n in sent.peak.items() if "timestamp(" in q}
    assert coverage
    # Prometheus's own count: no coverage subquery held more than the limit at once.
    assert max(coverage.values()) <= limit, coverage
    # The day's coverage was looked for every 6 minutes instead of every 86 s, and says so;
    # what it finds is as right, to within that step.
    late = day["late"]["coverage"]
    assert late["resolution"] == "6m"
    assert late["fraction"] == pytest.approx(LATE / DAY, abs=2 * 360 / DAY)
    hour = await _answers(prometheus, end, "1h", max_samples=limit)
    assert hour["late"]["coverage"]["resolution"] == "1m"
