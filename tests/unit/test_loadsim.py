"""The demo's load simulator: its profiles give the sample routes one status each by the issue's
arithmetic, its history is OpenMetrics Prometheus can backfill, and it serves what it draws."""

from __future__ import annotations

from itertools import pairwise

import httpx
from prometheus_client.parser import text_string_to_metric_families

from controlplane.demo import load_samples
from controlplane.loadsim import (
    PROFILES,
    TTFT_BOUNDS,
    Histogram,
    Mixture,
    Simulator,
    cdf,
    history_openmetrics,
    models,
)
from slo_api.attainment.arithmetic import alerting, arms

DAY = 86400.0


def good_ratio(mixture: Mixture, threshold: float) -> float:
    """As slo-api computes it: linear inside the bucket the threshold falls in."""
    bounds = (0.0, *TTFT_BOUNDS)
    for low, high in pairwise(bounds):
        if low <= threshold <= high:
            a, b = cdf(mixture, low), cdf(mixture, high)
            return a + (b - a) * (threshold - low) / (high - low)
    raise AssertionError(threshold)


def status(route: str, threshold: float, objective: float) -> str:
    profile = PROFILES[route]
    bad_days = profile.bad_for_seconds / DAY
    now = good_ratio(profile.ttft_at(-1), threshold)
    before = good_ratio(profile.ttft_at(28 * DAY), threshold)
    month = (now * bad_days + before * (28 - bad_days)) / 28
    if month < objective:
        return "violated"
    burn = (1 - now) / (1 - objective)  # every window up to 6h lies in the recent part
    pages = [a["burnRate"] for a in arms(objective) if a["severity"] == "page"]
    return "at_risk" if burn > min(pages) else "met"


def test_the_samples_meet_are_at_risk_and_violate_their_ttft_targets() -> None:
    # The targets of config/samples/llm.yaml's ttft.default.
    assert status("chat-7b", 0.8, 0.90) == "met"
    assert status("code-13b", 1.2, 0.95) == "at_risk"
    assert status("reason-70b", 2.0, 0.90) == "violated"


def test_code_13b_otps_p50_burns_fast_enough_to_page_and_still_meets_the_month() -> None:
    """Its OTPS p50 >= 30 (time per output token at most 1/30 s) burns fast now; the page arm
    its rules count at (the server's bucket) fires, and the 28 days are still met."""
    profile = PROFILES["code-13b"]
    entry = alerting("otps", "p50", 30.0)
    assert entry is not None
    bound = entry["bucket"]["le"]
    page = next(a for a in entry["arms"] if a["severity"] == "page")
    missing_now = 1 - cdf(profile.tpot_at(-1), bound)
    assert missing_now > page["burnRate"] * (1 - 0.5)
    # The server's figure for the month (linear inside the bucket) stays above 50%.
    month_days = 28 - profile.bad_for_seconds / DAY
    within = (
        cdf(profile.tpot_at(-1), 1 / 30) * (28 - month_days)
        + cdf(profile.tpot_at(28 * DAY), 1 / 30) * month_days
    ) / 28
    assert within > 0.5
    # Its OTPS p99 >= 12 (at most 1/12 s per token, counted at 0.075) stays met now.
    assert cdf(profile.tpot_at(-1), 0.075) == 1.0


def test_the_profiled_routes_read_the_samples_model_names() -> None:
    assert models(load_samples()) == {
        "chat-7b": "chat-7b-instruct",
        "code-13b": "code-13b",
        "reason-70b": "reason-70b",
    }


def test_history_is_cumulative_per_series_and_parses_as_histograms() -> None:
    text = history_openmetrics({"chat-7b": 'odd"name'}, end=10 * 3600.0, seconds=3 * 3600)
    assert text.endswith("# EOF\n")
    # The text-format parser reads the same lines (promtool's backfill is exercised by the
    # browser tests), taking timestamps for milliseconds: OpenMetrics's are seconds.
    families = {f.name: f for f in text_string_to_metric_families(text.replace("# EOF\n", ""))}
    ttft = families["vllm:time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    counts = [s for s in ttft.samples if s.name.endswith("_count")]
    assert {s.labels["model_name"] for s in counts} == {'odd"name'}
    hours = (7, 7.5, 8, 8.5, 9, 9.5, 10)
    assert [round(float(s.timestamp or 0) * 1000) for s in counts] == [3600 * h for h in hours]
    values = [s.value for s in counts]
    assert values == sorted(values)
    assert values[0] == 0


def test_a_histogram_counts_each_request_in_every_bucket_at_or_above_it() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    lines = list(histogram.lines("m", 'model_name="x"'))
    assert lines[:3] == [
        'm_bucket{model_name="x",le="0.1"} 2',
        'm_bucket{model_name="x",le="1.0"} 3',
        'm_bucket{model_name="x",le="+Inf"} 4',
    ]


def test_the_simulator_serves_vllm_histograms_and_the_job_queues() -> None:
    simulator = Simulator({"chat-7b": "chat-7b-instruct"})
    simulator.last -= 10  # ten seconds of requests are due
    address = simulator.start()
    try:
        text = httpx.get(f"http://{address}/metrics", timeout=5).text
    finally:
        simulator.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    count = next(
        s
        for s in families["vllm:request_time_per_output_token_seconds"].samples
        if s.name.endswith("_count")
    )
    assert count.labels == {"model_name": "chat-7b-instruct"}
    assert count.value >= 50
    assert families["jobs_pending"].samples[0].value == 12
