"""The attainment arithmetic, apart from any I/O: counts in, the documented figures out."""

from __future__ import annotations

import math

import pytest

from slo_api.attainment.arithmetic import (
    Histogram,
    alerting,
    at_risk,
    counted_bound,
    exhausts_in,
    fraction_within,
    good_ratio_bounds,
    latency_objective,
    lowest_budget,
    quantile,
    queue_objective,
)

INF = math.inf
# 100 requests: 10 at or below 0.1 s, 50 at or below 0.25, 90 at or below 0.5, all below 1.
TTFT = Histogram(((0.1, 10.0), (0.25, 50.0), (0.5, 90.0), (1.0, 100.0), (INF, 100.0)), 30.0)


def test_a_threshold_on_a_bucket_bound_counts_exactly() -> None:
    assert fraction_within(TTFT, 0.25) == (0.5, False)
    # Within one part in a billion of a bound is that bound.
    assert fraction_within(TTFT, 0.25 * (1 + 5e-10)) == (0.5, False)
    assert fraction_within(TTFT, 0.5 * (1 - 5e-10)) == (0.9, False)


def test_a_threshold_between_bounds_is_linear_inside_the_bucket_and_estimated() -> None:
    # 0.3 is a fifth of the way from 0.25 to 0.5: 50 + 40/5 = 58 of 100.
    ratio, estimated = fraction_within(TTFT, 0.3)
    assert estimated
    assert ratio == pytest.approx(0.58)
    # Below the first bound: linear from 0.
    assert fraction_within(TTFT, 0.05)[0] == pytest.approx(0.05)
    # Above the highest finite bound nothing more is known.
    assert fraction_within(TTFT, 5.0) == (1.0, False)
    assert fraction_within(Histogram(((1.0, 50.0), (INF, 100.0))), 5.0) == (0.5, True)
    assert fraction_within(Histogram(((1.0, 0.0), (INF, 0.0))), 0.5) == (None, False)


def test_quantiles_follow_histogram_quantile() -> None:
    assert quantile(TTFT, 0.9) == pytest.approx(0.5)
    assert quantile(TTFT, 0.5) == pytest.approx(0.25)
    # 0.7 -> rank 70, in (0.25, 0.5] holding 50..90: 0.25 + 0.25 * 20/40.
    assert quantile(TTFT, 0.7) == pytest.approx(0.375)
    tail = Histogram(((1.0, 50.0), (INF, 100.0)))
    assert quantile(tail, 0.99) == 1.0  # in +Inf's bucket: the highest finite bound


def test_a_percentile_objective_has_budget_burn_rates_and_status() -> None:
    burn = {"5m": TTFT, "30m": TTFT, "1h": TTFT, "6h": TTFT}
    met = latency_objective("ttft", "p90", 0.5, TTFT, burn)
    assert met["objective"] == 0.9
    assert met["goodRatio"] == pytest.approx(0.9)
    assert met["budgetRemaining"] == pytest.approx(0.0)
    assert met["burnRates"] == pytest.approx({"5m": 1.0, "30m": 1.0, "1h": 1.0, "6h": 1.0})
    assert met["status"] == "met"
    assert met["observed"] == pytest.approx(0.5)
    assert not met["estimated"]
    violated = latency_objective("ttft", "p90", 0.25, TTFT, burn)
    assert violated["status"] == "violated"
    # 1 - (1 - 0.5) / 0.1 = -4: overspent.
    assert violated["budgetRemaining"] == pytest.approx(-4.0)


def test_at_risk_takes_both_windows_of_a_page_rule() -> None:
    assert at_risk({"1h": 14.0, "5m": 14.0}, 0.99)
    assert not at_risk({"1h": 14.0, "5m": 13.0}, 0.99)
    assert at_risk({"6h": 6.0, "30m": 5.7}, 0.99)
    assert not at_risk({"6h": 7.0, "30m": None}, 0.99)
    all_good = Histogram(((0.5, 100.0), (INF, 100.0)))
    # 20% slow in the last hour: (1 - 0.8) / (1 - 0.99) = 20 > 14.4, over 1h and 5m.
    burning = Histogram(((0.5, 80.0), (INF, 100.0)))
    windows = {"5m": burning, "30m": all_good, "1h": burning, "6h": all_good}
    p99 = latency_objective("ttft", "p99", 0.5, all_good, windows)
    assert p99["burnRates"]["1h"] == pytest.approx(20.0)
    assert p99["status"] == "at_risk"
    # For p90 the same hour burns at 2: met.
    assert latency_objective("ttft", "p90", 0.5, all_good, windows)["status"] == "met"


def test_otps_is_measured_from_time_per_output_token() -> None:
    # Time per output token: 40% at or below 0.01 s (>= 100 tok/s), all below 0.05 s.
    tpot = Histogram(((0.01, 40.0), (0.025, 80.0), (0.05, 100.0), (INF, 100.0)), 2.0)
    p80 = latency_objective("otps", "p80", 40.0, tpot, {})
    # At least 40 tok/s is at most 0.025 s per token: a bound, 80 of 100.
    assert p80["goodRatio"] == pytest.approx(0.8)
    assert p80["observed"] == pytest.approx(40.0)  # 1 / p80 of tpot (0.025)
    assert p80["status"] == "met"
    avg = latency_objective("otps", "avg", 60.0, tpot, {})
    assert avg["observed"] == pytest.approx(50.0)  # 100 requests / 2 s
    assert avg["status"] == "violated"
    assert avg["goodRatio"] is None
    assert avg["burnRates"] is None
    assert avg["objective"] is None


def test_no_requests_is_no_data() -> None:
    empty = Histogram(((0.5, 0.0), (INF, 0.0)), 0.0)
    assert latency_objective("ttft", "p90", 0.5, empty, {})["status"] == "no_data"
    assert latency_objective("ttft", "avg", 0.5, None, {})["status"] == "no_data"


def test_a_queue_objective_compares_the_depth_now() -> None:
    over = queue_objective(10, 12.0, 0.75)
    assert over["status"] == "violated"
    assert over["goodRatio"] == 0.75
    assert over["objective"] is None
    assert over["budgetRemaining"] is None
    assert queue_objective(10, 10.0, 1.0)["status"] == "met"
    assert queue_objective(10, None, None)["status"] == "no_data"


def test_the_lowest_budget_orders_routes() -> None:
    assert lowest_budget([{"budgetRemaining": 0.5}, {"budgetRemaining": -1.0}]) == -1.0
    assert lowest_budget([{"budgetRemaining": None}]) is None


def _now_bad(good_now: float) -> dict[str, Histogram]:
    """Burn windows whose every request misses 0.5 s except `good_now` of 100."""
    now = Histogram(((0.5, good_now), (INF, 100.0)))
    return {"5m": now, "30m": now, "1h": now, "6h": now}


@pytest.mark.parametrize("kind", ["p50", "p80", "p90", "p95", "p99"])
def test_every_percentile_is_at_risk_when_every_request_misses_now(kind: str) -> None:
    # A good month (99.9% within) and a last 6 hours where nothing is: a burn rate of at most
    # 1 / (1 - objective), 2 for p50, far below the workbook's 14.4 and 6.
    month = Histogram(((0.5, 999.0), (INF, 1000.0)))
    answer = latency_objective("ttft", kind, 0.5, month, _now_bad(0.0))
    assert answer["status"] == "at_risk"


def test_a_loose_objective_pages_only_when_more_than_half_miss() -> None:
    month = Histogram(((0.5, 999.0), (INF, 1000.0)))
    # p80 with 40% missing now: burn rate 2, within its budget's pace for a page.
    assert latency_objective("ttft", "p80", 0.5, month, _now_bad(60.0))["status"] == "met"
    # p50 with 51% missing: the percentile itself is over target over 1h and 5m.
    assert latency_objective("ttft", "p50", 0.5, month, _now_bad(49.0))["status"] == "at_risk"
    assert latency_objective("ttft", "p50", 0.5, month, _now_bad(51.0))["status"] == "met"


def test_the_page_factors_are_for_a_28_day_window() -> None:
    month = Histogram(((0.5, 9999.0), (INF, 10000.0)))
    # 86% within over the last hour against p99: a burn rate of 14, above 13.44 (2% of a
    # 28-day budget in an hour) though below the workbook's 14.4 (2% of 30 days).
    hour = Histogram(((0.5, 86.0), (INF, 100.0)))
    windows = {"5m": hour, "1h": hour}
    assert latency_objective("ttft", "p99", 0.5, month, windows)["status"] == "at_risk"
    # 5.7 over 6h and 30m: above 5.6 (5% of 28 days in 6 hours).
    slow = Histogram(((0.5, 943.0), (INF, 1000.0)))
    assert latency_objective("ttft", "p99", 0.5, month, {"6h": slow, "30m": slow})["status"] == (
        "at_risk"
    )


def test_the_bucket_counted_at_is_exact_near_a_bound_and_the_bound_below_between() -> None:
    assert counted_bound("ttft", 0.5 * (1 + 1e-12)) == (0.5, True)
    assert counted_bound("ttft", 2.0) == (1.0, False)
    assert counted_bound("otps", 10) == (0.1, True)  # 1/10 s per token exactly
    assert counted_bound("otps", 12) == (0.075, False)  # 1/12 = 0.083
    assert counted_bound("ttft", 0.0005) is None  # below the smallest bound
    assert counted_bound("otps", 0) is None  # every request is within


def test_the_arms_spend_the_workbooks_budget_shares_of_28_days_or_are_capped() -> None:
    p99 = alerting("ttft", "p99", 0.5)
    assert p99 is not None
    assert [(a["long"], a["short"], a["burnRate"], a["capped"]) for a in p99["arms"]] == [
        ("1h", "5m", 13.44, False),
        ("6h", "30m", 5.6, False),
        ("3d", "6h", 0.933333, False),
    ]
    assert [a["budgetShare"] for a in p99["arms"]] == [0.02, 0.05, 0.1]
    p50 = alerting("otps", "p50", 30)
    assert p50 is not None
    # 0.5 / (1 - 0.5): the percentile itself over target; 1h of it is 1/672 of the budget.
    assert [(a["burnRate"], a["capped"]) for a in p50["arms"]] == [
        (1.0, True),
        (1.0, True),
        (0.933333, False),
    ]
    assert p50["arms"][0]["budgetShare"] == pytest.approx(1 / 672, abs=1e-6)
    assert p50["bucket"] == {"le": 0.025, "exact": False}
    assert alerting("ttft", "avg", 0.5) is None


def test_the_good_ratio_carries_the_bounds_of_the_bucket_around_the_threshold() -> None:
    # 0.3 lies in (0.25, 0.5]: at 0.25 half are counted, at 0.5 nine in ten.
    assert good_ratio_bounds(TTFT, 0.3) == (0.5, 0.9)
    # On a bound there is nothing to bracket.
    assert good_ratio_bounds(TTFT, 0.25) == (0.5, 0.5)
    # Below the first bound: from none to the first bucket's.
    assert good_ratio_bounds(TTFT, 0.05) == (0.0, 0.1)
    # In +Inf's bucket: from what is below the highest finite bound to all of them.
    assert good_ratio_bounds(Histogram(((1.0, 50.0), (INF, 100.0))), 5.0) == (0.5, 1.0)
    assert good_ratio_bounds(Histogram(((1.0, 0.0), (INF, 0.0))), 0.5) is None
    answer = latency_objective("ttft", "p90", 0.3, TTFT, {})
    assert answer["goodRatioBounds"] == {"low": 0.5, "high": 0.9}
    assert answer["requests"] == 100.0


def test_below_the_traffic_floor_an_objective_is_no_data_with_its_figures() -> None:
    few = latency_objective("ttft", "p90", 0.3, TTFT, {}, min_requests=101)
    assert few["status"] == "no_data"
    assert few["reason"] == "insufficient_traffic"
    assert few["goodRatio"] == pytest.approx(0.58)
    assert few["goodRatioBounds"] == {"low": 0.5, "high": 0.9}
    enough = latency_objective("ttft", "p90", 0.3, TTFT, {}, min_requests=100)
    assert enough["status"] == "violated"
    assert enough["reason"] is None
    avg = latency_objective("ttft", "avg", 0.5, TTFT, {}, min_requests=101)
    assert (avg["status"], avg["reason"]) == ("no_data", "insufficient_traffic")


def test_no_series_is_told_apart_from_no_traffic() -> None:
    empty = Histogram(((0.5, 0.0), (INF, 0.0)), 0.0)
    assert latency_objective("ttft", "p90", 0.5, empty, {})["reason"] == "no_traffic"
    assert latency_objective("ttft", "p90", 0.5, None, {})["reason"] == "no_traffic"
    unmatched = latency_objective("ttft", "p90", 0.5, None, {}, series=False)
    assert (unmatched["status"], unmatched["reason"]) == ("no_data", "no_series")


def test_the_budget_runs_out_where_the_burn_outpaces_what_leaves_the_window() -> None:
    # Half the budget left of a 28-day window, burning at 2: the spent half leaves the
    # window as it moves (evenly, assumed) while twice the budget's pace comes in:
    # 0.5 * (1 - h/672) + 2 * h/672 = 1 at h = 672 * 0.5 / 1.5 = 224 hours.
    assert exhausts_in(0.5, 2.0, 672.0) == pytest.approx(224.0)
    # A full budget at 14.4 lasts 672 / 14.4 hours.
    assert exhausts_in(1.0, 14.4, 672.0) == pytest.approx(672 / 14.4)
    # At or below 1 the window never spends more than its budget.
    assert exhausts_in(0.5, 1.0, 672.0) is None
    assert exhausts_in(0.5, 0.0, 672.0) is None
    # Already spent, or unknown: no forecast.
    assert exhausts_in(0.0, 5.0, 672.0) is None
    assert exhausts_in(-1.0, 5.0, 672.0) is None
    assert exhausts_in(None, 5.0, 672.0) is None
    assert exhausts_in(0.5, None, 672.0) is None


def test_an_objective_forecasts_at_its_1h_and_6h_burn_rates() -> None:
    # The window: 100 requests, 99 within 0.5 s (p90: 0.1 budget, 0.01 spent, 0.9 left).
    window = Histogram(((0.5, 99.0), (INF, 100.0)))
    hot = Histogram(((0.5, 60.0), (INF, 100.0)))  # burn 4
    cool = Histogram(((0.5, 95.0), (INF, 100.0)))  # burn 0.5
    answer = latency_objective(
        "ttft", "p90", 0.5, window, {"1h": hot, "6h": cool}, window_hours=672.0
    )
    assert answer["exhaustsIn"]["1h"] == pytest.approx(672 * 0.9 / (4 - 0.1))
    assert answer["exhaustsIn"]["6h"] is None
    few = latency_objective(
        "ttft", "p90", 0.5, window, {"1h": hot}, window_hours=672.0, min_requests=1000
    )
    assert few["exhaustsIn"] == {"1h": None, "6h": None}
