"""Fleet scale: `sloctl rules` records each route's 5-minute increases, the server reads those
recorded series in place of the raw ones (falling back to the raw ones for routes without), and
a raw query that would load more samples than ATTAINMENT_MAX_SAMPLES is narrowed and said so.
Prometheus is faked here; tests/integration/test_attainment_recorded.py checks the figures on a
real one."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from slo_api.attainment import selectors
from slo_api.attainment.cache import Attainment
from slo_api.attainment.prometheus import Prometheus
from slo_api.attainment.selectors import ANNOTATION, parse_route_labels
from slo_api.cli import rules
from slo_api.kinds import build_kinds
from slo_api.metrics import Metrics
from slo_api.service import Service
from slo_api.settings import Settings
from tests.unit.conftest import TOKEN, llm_cr

LABELS = parse_route_labels('model_name="{model}"')
TTFT_CR: dict[str, Any] = {"ttft": {"default": {"metrics": [{"type": "p90", "threshold": 0.5}]}}}
Handler = Any


def _attainment(handler: Handler, crs: list[dict[str, Any]], max_samples: int) -> Attainment:
    settings = Settings(slo_api_token=TOKEN)
    kinds = build_kinds(settings)
    index = Service.index_for(kinds)
    for cr in crs:
        index.upsert("llmslorequirements", cr)
    prometheus = Prometheus("http://prometheus.invalid", 5, transport=httpx.MockTransport(handler))
    return Attainment(
        index,
        {k.resource.plural: k.name for k in kinds},
        Metrics(),
        prometheus,
        labels=LABELS,
        refresh_seconds=60,
        series_limit=10,
        max_samples=max_samples,
        clock=lambda: 1_800_000_000.5,
    )


def _vector(*samples: tuple[dict[str, str], float]) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [{"metric": m, "value": [0, str(v)]} for m, v in samples],
            },
        },
    )


def _histogram(labels: dict[str, str], within: float, total: float) -> list[Any]:
    return [({**labels, "le": "0.5"}, within), ({**labels, "le": "+Inf"}, total)]


def test_sloctl_rules_record_each_routes_increases_every_5_minutes() -> None:
    listing = []
    for route, annotation in (("chat", None), ("own", '{model_name="m", engine="1"}')):
        cr = llm_cr(route, model="m", **TTFT_CR)
        if annotation:
            cr["metadata"]["annotations"] = {ANNOTATION: annotation}
        shown = selectors.selector_of(cr, LABELS).shown()
        assert shown is not None
        listing.append(
            {
                "route": route,
                "kind": "llm",
                "selectors": {m: selectors.METRICS[m] + s for m, s in shown.items()},
                "alerting": [
                    {
                        "metric": "ttft",
                        "type": "p90",
                        "threshold": 0.5,
                        "objective": 0.9,
                        "bucket": {"le": 0.5, "exact": True},
                        "arms": [
                            {
                                "severity": "page",
                                "long": "1h",
                                "short": "5m",
                                "burnRate": 5,
                                "budgetShare": 0.007,
                                "capped": True,
                            }
                        ],
                    }
                ],
            }
        )
    found, skipped, _ = rules.objectives(listing)
    assert not skipped
    document = rules.prometheus_rule(found, "slo-api", None)
    recording = {
        g["name"]: g for g in document["spec"]["groups"] if g["name"].endswith(".increase5m")
    }
    assert sorted(recording) == ["slo-api.chat.increase5m", "slo-api.own.increase5m"]
    chat = recording["slo-api.chat.increase5m"]
    # One point per 5 minutes: the server sums them over its windows.
    assert chat["interval"] == "5m"
    assert chat["rules"] == [
        {
            "record": "slo_api:bucket:increase5m",
            "expr": "sum by (le) (increase("
            'vllm:time_to_first_token_seconds_bucket{model_name="m"}[5m]))',
            "labels": {"route": "chat", "metric": "ttft"},
        },
        {
            "record": "slo_api:sum:increase5m",
            "expr": 'sum(increase(vllm:time_to_first_token_seconds_sum{model_name="m"}[5m]))',
            "labels": {"route": "chat", "metric": "ttft"},
        },
    ]
    own = recording["slo-api.own.increase5m"]["rules"][0]["expr"]
    assert 'model_name="m",engine="1"' in own


async def test_recorded_routes_are_read_from_their_recorded_series_and_left_out_of_raw_ones() -> (
    None
):
    queries: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        queries.append(query)
        if query.startswith("sum by (route, metric, le)"):
            # Route r0 is recorded: 80% within 0.5 s (its raw series would say 95%).
            return _vector(*_histogram({"route": "r0", "metric": "ttft"}, 80, 100))
        if "count_over_time" in query:
            return _vector(({}, 10))
        if "_bucket" in query:
            return _vector(
                *_histogram({"model_name": "m0"}, 95, 100),
                *_histogram({"model_name": "m1"}, 70, 100),
            )
        return _vector()

    crs = [llm_cr(f"r{i}", model=f"m{i}", **TTFT_CR) for i in range(2)]
    attainment = _attainment(handler, crs, 50_000_000)
    await attainment.refresh()
    r0 = attainment.answer("r0", "llm", crs[0], "28d")
    r1 = attainment.answer("r1", "llm", crs[1], "28d")
    assert r0["objectives"][0]["goodRatio"] == pytest.approx(0.8)
    # r1 has no recorded series: its raw ones.
    assert r1["objectives"][0]["goodRatio"] == pytest.approx(0.7)
    raw = [q for q in queries if "increase(vllm:time_to_first_token_seconds_bucket" in q]
    assert raw
    # The raw queries select r1's model alone, not r0's.
    assert all('model_name=~"m1"' in q for q in raw)
    assert r0["narrowed"] == r1["narrowed"] == []


async def test_without_recorded_series_every_raw_series_is_queried() -> None:
    queries: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        queries.append(parse_qs(request.content.decode())["query"][0])
        return _vector()

    attainment = _attainment(handler, [llm_cr("r0", model="m0", **TTFT_CR)], 50_000_000)
    await attainment.refresh()
    raw = [q for q in queries if "increase(vllm:time_to_first_token_seconds_bucket[28d])" in q]
    assert len(raw) == 1


async def test_a_raw_query_past_max_samples_is_narrowed_and_the_answer_says_so() -> None:
    queries: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        queries.append(query)
        if "count_over_time" in query:
            # 1,000 samples in 5 minutes: 28 days hold 8,064,000; a day 288,000. One histogram.
            return _vector(({"slo_api_route": "0"}, 1000), ({"slo_api_route": "1"}, 1))
        if "_bucket" in query and "increase(vllm" in query:
            return _vector(*_histogram({"model_name": "m0"}, 95, 100))
        return _vector()

    cr = llm_cr("r0", model="m0", **TTFT_CR)
    attainment = _attainment(handler, [cr], 1_000_000)
    await attainment.refresh()
    sent = [q for q in queries if "increase(vllm:time_to_first_token_seconds_bucket" in q]
    # 28d and 7d are narrowed to the 1,000 five-minute steps that fit: 3d11h20m.
    assert not any("[28d]" in q or "[7d]" in q for q in sent)
    assert sum("[300000s]" in q for q in sent) == 2
    assert any("[1d]" in q for q in sent)
    answer = attainment.answer("r0", "llm", cr, "28d")
    (narrowed,) = answer["narrowed"]
    assert (narrowed["metric"], narrowed["window"]) == ("ttft", "28d")
    assert narrowed["to"] == "3d11h20m"
    assert "ATTAINMENT_MAX_SAMPLES (1000000)" in narrowed["reason"]
    # The figures are over what was queried.
    assert answer["objectives"][0]["goodRatio"] == pytest.approx(0.95)
    assert attainment.answer("r0", "llm", cr, "1d")["narrowed"] == []


async def test_a_raw_query_past_max_samples_even_over_5_minutes_is_not_sent() -> None:
    queries: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        queries.append(query)
        if "count_over_time" in query:
            return _vector(({"slo_api_route": "0"}, 2000), ({"slo_api_route": "1"}, 1))
        return _vector()

    cr = llm_cr("r0", model="m0", **TTFT_CR)
    attainment = _attainment(handler, [cr], 1000)
    await attainment.refresh()
    assert not [q for q in queries if "increase(vllm" in q]
    narrowed = attainment.answer("r0", "llm", cr, "1h")["narrowed"]
    # The answer's window and every burn rate's: none could be read.
    assert [n["window"] for n in narrowed] == ["1h", "5m", "30m", "6h"]
    assert all(n["to"] is None and "not queried" in n["reason"] for n in narrowed)


async def test_a_recorded_routes_coverage_is_of_its_recorded_series_not_its_raw_ones() -> None:
    queries: list[str] = []
    # The rules began 7 days ago; the raw series go back further.
    began = 1_800_000_000 - 7 * 86400

    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        queries.append(query)
        if query.startswith("sum by (route, metric, le)"):
            return _vector(*_histogram({"route": "r0", "metric": "ttft"}, 80, 100))
        if query.startswith("min by (route, metric)"):
            return _vector(({"route": "r0", "metric": "ttft"}, began))
        return _vector()

    cr = llm_cr("r0", model="m0", **TTFT_CR)
    attainment = _attainment(handler, [cr], 50_000_000)
    await attainment.refresh()
    (objective,) = attainment.answer("r0", "llm", cr, "28d")["objectives"]
    # The 28-day figures rest on the 7 days recorded: the coverage says so.
    assert objective["coverage"] == {
        "since": "2027-01-08T08:00:00Z",
        "fraction": pytest.approx(0.25),
        "resolution": "40m19s",
    }
    coverage = [q for q in queries if "timestamp(" in q]
    assert any("slo_api:sum:increase5m" in q for q in coverage)
    # Every route with TTFT targets is recorded: no raw TTFT series is asked for, coverage
    # included.
    assert not any("vllm:time_to_first_token_seconds" in q for q in queries)


async def test_a_coverage_query_past_max_samples_looks_at_a_coarser_step_and_says_so() -> None:
    queries: list[str] = []
    histograms = [3000]

    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        queries.append(query)
        if "count_over_time" in query:
            tags = ({"slo_api_route": "0"}, {"slo_api_route": "1"})
            return _vector((tags[0], 10), (tags[1], histograms[0]))
        if query.startswith("min by (model_name)"):
            return _vector(({"model_name": "m0"}, 1_800_000_000 - 30 * 86400))
        if "_bucket" in query:
            return _vector(*_histogram({"model_name": "m0"}, 95, 100))
        return _vector()

    cr = llm_cr("r0", model="m0", **TTFT_CR)
    # 3,000 histograms x 1,001 steps of 28 days hold about 3,003,000 samples at once (and one
    # histogram's steps more as they are reduced): past 1,000,000.
    attainment = _attainment(handler, [cr], 1_000_000)
    await attainment.refresh()
    (objective,) = attainment.answer("r0", "llm", cr, "28d")["objectives"]
    # 332 steps fit: every 2h2m (whole minutes), and the answer says at which step.
    assert objective["coverage"]["resolution"] == "2h2m"
    assert any("[28d:7320s]" in q for q in queries)
    assert objective["coverage"]["fraction"] == 1.0
    # The 1-hour window's 61 steps fit: a minute.
    (hour,) = attainment.answer("r0", "llm", cr, "1h")["objectives"]
    assert hour["coverage"]["resolution"] == "1m"
    # More histograms than fit even at one step a window: not asked, coverage unknown (the
    # figures stand).
    histograms[0] = 600_000
    queries.clear()
    await attainment.refresh()
    assert not any("timestamp(" in q for q in queries)
    (objective,) = attainment.answer("r0", "llm", cr, "28d")["objectives"]
    assert objective["coverage"] is None
    assert objective["goodRatio"] == pytest.approx(0.95)


async def test_no_raw_series_are_read_for_a_metric_no_route_has_targets_on() -> None:
    queries: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        queries.append(query)
        if query.startswith("sum by (route, metric, le)"):
            return _vector(*_histogram({"route": "r0", "metric": "ttft"}, 80, 100))
        return _vector()

    # Every route has TTFT targets only, and is recorded: the raw OTPS series are nobody's
    # figures, so reading them would cost a refresh about as much as no rules at all.
    cr = llm_cr("r0", model="m0", **TTFT_CR)
    attainment = _attainment(handler, [cr], 50_000_000)
    await attainment.refresh()
    assert not [q for q in queries if "vllm:" in q]
    assert attainment.answer("r0", "llm", cr, "28d")["objectives"][0]["goodRatio"] == (
        pytest.approx(0.8)
    )
