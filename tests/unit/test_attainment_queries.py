"""Which series are a route's, the query text sent for them, and how a failing Prometheus is
answered: the seam faked with httpx's MockTransport (the real one is in tests/integration)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from slo_api.attainment.cache import Attainment
from slo_api.attainment.prometheus import Prometheus
from slo_api.attainment.selectors import (
    ANNOTATION,
    parse_matchers,
    parse_route_labels,
    selector_of,
)
from slo_api.kinds import build_kinds
from slo_api.metrics import Metrics
from slo_api.service import Service
from slo_api.settings import Settings, unrecognised
from tests.unit.conftest import TOKEN, job_cr, llm_cr

ODD = 'x"} or up{a=~".+'
LABELS = parse_route_labels('model_name="{model}"')


def test_a_model_with_quotes_and_braces_stays_one_label_value() -> None:
    selector = selector_of(llm_cr("a", model=ODD), LABELS)
    assert selector.matchers == 'model_name="x\\"} or up{a=~\\".+"'
    shown = selector.shown()
    assert shown is not None
    assert shown == {"ttft": '{model_name="x\\"} or up{a=~\\".+"}', "otps": shown["ttft"]}
    # No model: the serviceId.
    assert selector_of(llm_cr("b"), LABELS).values == (("model_name", "b"),)


def test_the_label_template_and_annotations_are_checked() -> None:
    labels = parse_route_labels('model_name="{model}", namespace="{namespace}"')
    assert selector_of(llm_cr("a", model="m"), labels).matchers == ('model_name="m",namespace="ns"')
    for bad in ('model_name="{nope}"', "model_name={model}", 'le="{model}"', 'a="x",a="y"'):
        with pytest.raises(ValueError, match=r"\S"):
            parse_route_labels(bad)
    assert parse_matchers('{model_name="m", engine=~"0|1"}') == 'model_name="m",engine=~"0|1"'
    for bad in ('model_name="m"} or up{', '__name__="up"', 'a=~"("', "", 'a="b" b="c"'):
        with pytest.raises(ValueError, match=r"\S"):
            parse_matchers(bad)
    cr = llm_cr("a")
    cr["metadata"]["annotations"] = {ANNOTATION: 'x="y"} or up{'}
    selector = selector_of(cr, LABELS)
    assert selector.matchers is None
    assert selector.problem is not None
    assert ANNOTATION in selector.problem


def test_a_bad_label_template_or_url_stops_start_up() -> None:
    with pytest.raises(ValueError, match="PROMETHEUS_ROUTE_LABELS"):
        Settings(slo_api_token=TOKEN, prometheus_route_labels='model_name="{modle}"')
    with pytest.raises(ValueError, match="not an http"):
        Settings(slo_api_token=TOKEN, prometheus_url="prometheus:9090")
    assert Settings(slo_api_token=TOKEN, prometheus_url=" ").prometheus_url is None
    assert (
        Settings(slo_api_token=TOKEN, prometheus_url="http://p:9090/").prometheus_url
        == "http://p:9090"
    )
    # A misspelt attainment setting is said at start-up; prometheus_client's own is not ours.
    environ = {"PROMETHEUS_URLL": "x", "PROMETHEUS_MULTIPROC_DIR": "/m", "ATTAINMENT_REFRESH": "9"}
    assert unrecognised(environ) == ["ATTAINMENT_REFRESH", "PROMETHEUS_URLL"]


def _attainment(handler: Any, crs: list[dict[str, Any]]) -> Attainment:
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
        clock=lambda: 1_800_000_000.5,
    )


def _vector(*samples: tuple[dict[str, str], float]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": m, "value": [0, str(v)]} for m, v in samples],
        },
    }


TTFT_CR: dict[str, Any] = {"ttft": {"default": {"metrics": [{"type": "p90", "threshold": 0.5}]}}}


async def test_a_refresh_is_a_fixed_number_of_queries_and_failures_keep_the_last_answer() -> None:
    queries: list[str] = []
    failing: list[httpx.Response] = []

    def handler(request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode())
        queries.append(form["query"][0])
        if failing:
            return failing[0]
        if "_bucket" in form["query"][0]:
            return httpx.Response(
                200,
                json=_vector(
                    ({"model_name": ODD, "le": "0.5"}, 95),
                    ({"model_name": ODD, "le": "+Inf"}, 100),
                ),
            )
        return httpx.Response(200, json=_vector(({"model_name": ODD}, 30)))

    routes = [llm_cr(f"r{i}", model=ODD if i == 0 else f"m{i}", **TTFT_CR) for i in range(50)]
    attainment = _attainment(handler, routes)
    before = attainment.answer("r0", "llm", routes[0], "28d")
    assert before["source"] == {"status": "unavailable", "reason": "not queried yet", "asOf": None}
    assert before["objectives"] == []
    await attainment.refresh()
    # 7 windows x 2 metrics of buckets, and sums for the 4 answer windows, one query of the
    # recorded series per window, and what 5 minutes of each metric hold: not per route.
    assert len(queries) == 22 + 7 + 2
    # No route's name or model is in any of them.
    assert not any("m1" in q or "x\\" in q for q in queries)
    ok = attainment.answer("r0", "llm", routes[0], "28d")
    assert ok["source"] == {"status": "ok", "reason": None, "asOf": "2027-01-15T08:00:00Z"}
    (objective,) = ok["objectives"]
    assert objective["goodRatio"] == pytest.approx(0.95)
    assert objective["status"] == "met"
    # Another route's series are not this one's.
    assert attainment.answer("r1", "llm", routes[1], "28d")["objectives"][0]["status"] == "no_data"

    for response, reason in (
        (httpx.Response(503, text="overloaded"), "Prometheus answered HTTP 503"),
        (httpx.Response(200, text="<html>"), "Prometheus's answer is not its JSON"),
        (
            httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "x"}),
            "the query failed (bad_data: x)",
        ),
    ):
        failing[:] = [response]
        await attainment.refresh()
        kept = attainment.answer("r0", "llm", routes[0], "28d")
        assert kept["source"] == {
            "status": "unavailable",
            "reason": reason,
            "asOf": "2027-01-15T08:00:00Z",
        }
        assert kept["objectives"] == ok["objectives"]
    failing.clear()
    await attainment.refresh()
    assert attainment.answer("r0", "llm", routes[0], "28d")["source"]["status"] == "ok"


async def test_a_slow_prometheus_times_out_as_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    attainment = _attainment(handler, [llm_cr("a", **TTFT_CR)])
    await asyncio.wait_for(attainment.refresh(), 10)
    answer = attainment.answer("a", "llm", llm_cr("a", **TTFT_CR), "1h")
    assert answer["source"]["reason"] == "Prometheus did not answer within 5 s"
    assert json.loads(json.dumps(answer))["source"]["asOf"] is None


async def test_the_budget_order_follows_a_changed_threshold_under_the_same_list() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if "_bucket" in parse_qs(request.content.decode())["query"][0]:
            # 90% within 0.5 s, all within 1 s, for every model.
            return httpx.Response(
                200,
                json=_vector(
                    ({"model_name": "m", "le": "0.5"}, 90),
                    ({"model_name": "m", "le": "1"}, 100),
                    ({"model_name": "m", "le": "+Inf"}, 100),
                ),
            )
        return httpx.Response(200, json=_vector(({"model_name": "m"}, 30)))

    def cr(name: str, threshold: float) -> dict[str, Any]:
        metrics = [{"type": "p90", "threshold": threshold}]
        return llm_cr(name, model="m", ttft={"default": {"metrics": metrics}})

    attainment = _attainment(handler, [cr("a", 0.5), cr("b", 1.0)])
    await attainment.refresh()

    def render(routes: list[str], page: int, size: int, full: bool, line: Any) -> bytes:
        return b"[" + b",".join(line(r) for r in routes) + b"]"

    async def order() -> list[str]:
        body, _ = await attainment.page(["a", "b"], "the same list", "28d", True, 1, 20, render)
        return [item["route"] for item in json.loads(body)]

    assert await order() == ["a", "b"]  # a's budget is spent (0), b's whole (1)
    # b's target tightened to 0.25 s: 45% within, its budget overspent (-4.5): first now.
    attainment.index.upsert("llmslorequirements", cr("b", 0.25))
    assert await order() == ["b", "a"]


async def test_a_job_query_returning_too_many_series_is_that_routes_problem_alone() -> None:
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        sent.append(query)
        if query.startswith("count("):
            many = "wide" in query
            return httpx.Response(200, json=_vector(({}, 11 if many else 1)))
        if query.startswith("max("):
            return httpx.Response(200, json=_vector(({}, 4)))
        if query.startswith("avg_over_time("):
            return httpx.Response(200, json=_vector(({}, 0.75)))
        return httpx.Response(200, json=_vector())

    wide = job_cr("wide", queue={"maxDepth": 5, "promql": "wide_queue"})
    narrow = job_cr("narrow", queue={"maxDepth": 5, "promql": "narrow_queue"})
    attainment = _attainment(handler, [])
    for cr in (wide, narrow):
        attainment.index.upsert("jobslorequirements", cr)
    await attainment.refresh()
    refused = attainment.answer("wide", "job", wide, "7d")
    assert refused["source"]["status"] == "unavailable"
    assert refused["source"]["reason"] == (
        "queue.promql: it returns 11 series, more than ATTAINMENT_SERIES_LIMIT (10)"
    )
    assert refused["objectives"] == []
    # The wide query was counted, never evaluated.
    assert not any("wide_queue" in q and not q.startswith("count(") for q in sent)
    fine = attainment.answer("narrow", "job", narrow, "7d")
    assert fine["source"]["status"] == "ok"
    (objective,) = fine["objectives"]
    assert (objective["observed"], objective["goodRatio"], objective["status"]) == (4, 0.75, "met")
