"""Which series are a route's, the query text sent for them, and how a failing Prometheus is
answered: the seam faked with httpx's MockTransport (the real one is in tests/integration)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
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


def _attainment(
    handler: Any,
    crs: list[dict[str, Any]],
    clock: Callable[[], float] = lambda: 1_800_000_000.5,
    timeout: float = 5,
) -> Attainment:
    settings = Settings(slo_api_token=TOKEN)
    kinds = build_kinds(settings)
    index = Service.index_for(kinds)
    for cr in crs:
        index.upsert("llmslorequirements", cr)
    prometheus = Prometheus(
        "http://prometheus.invalid", timeout, transport=httpx.MockTransport(handler)
    )
    return Attainment(
        index,
        {k.resource.plural: k.name for k in kinds},
        Metrics(),
        prometheus,
        labels=LABELS,
        refresh_seconds=60,
        series_limit=10,
        clock=clock,
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
    # 7 windows of buckets, sums and earliest samples for the 4 answer windows, one query of
    # the recorded series per window, and what 5 minutes hold: not per route. (TTFT alone: no
    # route has OTPS targets, so no query reads its series.)
    assert len(queries) == 15 + 7 + 1
    assert not any("vllm:request_time_per_output_token" in q for q in queries)
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


def test_an_annotation_takes_prometheus_regexes_and_refuses_what_re2_lacks() -> None:
    # Python's `re` takes these; Prometheus (RE2) refuses them.
    for pattern in ("(?=0)", "(?<!a)b", "(a)\\1", "a*+", "(?>a)", "a\\Z", "(?P=x)"):
        with pytest.raises(ValueError, match="not a regular expression"):
            parse_matchers(f'engine=~"{json.dumps(pattern)[1:-1]}"')
    # Python's `re` refuses these; Prometheus takes them.
    for pattern in ("\\pL+", "[[:digit:]]+", "\\p{Greek}|x", "[\\d-z]"):
        value = json.dumps(pattern)
        assert parse_matchers(f"engine=~{value}") == f"engine=~{value}"


def test_an_annotation_can_only_narrow_the_routes_own_series() -> None:
    own = (("model_name", "chat-7b"),)
    assert parse_matchers('{engine="0"}', own) == 'model_name="chat-7b",engine="0"'
    assert parse_matchers('{model_name="chat-7b", engine!="1"}', own) == (
        'model_name="chat-7b",engine!="1"'
    )
    # Matchers, not a program: a long annotation is refused before it is parsed.
    with pytest.raises(ValueError, match="longer than 4096"):
        parse_matchers('engine=~"' + "[:" * 3000 + '"', own)
    for wider in ('model_name!=""', 'model_name=~".+"', 'model_name="other"', 'model_name!~"x"'):
        with pytest.raises(ValueError, match="can only narrow"):
            parse_matchers(f"{{{wider}}}", own)
    cr = llm_cr("a", model="chat-7b")
    cr["metadata"]["annotations"] = {ANNOTATION: '{model_name!=""}'}
    selector = selector_of(cr, LABELS)
    assert selector.matchers is None
    assert selector.problem is not None
    assert "can only narrow" in selector.problem


def _buckets(query: str, *buckets: tuple[str, float]) -> httpx.Response:
    """Every model's buckets (or sums) for `query`: `(le, count)` pairs."""
    if "_bucket" in query:
        return httpx.Response(
            200, json=_vector(*(({"model_name": "m", "le": le}, n) for le, n in buckets))
        )
    return httpx.Response(200, json=_vector(({"model_name": "m"}, 30)))


async def test_one_routes_failing_query_leaves_every_other_routes_figures() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        if 'engine="slow"' in query:
            # Say its regex is too costly: Prometheus gives up on any query holding it.
            return httpx.Response(
                422, json={"status": "error", "errorType": "timeout", "error": "query timed out"}
            )
        if "slo_api_route" in query:
            tag = {"slo_api_route": "0"}
            return httpx.Response(
                200,
                json=_vector(({**tag, "le": "0.5"}, 80), ({**tag, "le": "+Inf"}, 100))
                if "_bucket" in query
                else _vector((tag, 30)),
            )
        return _buckets(query, ("0.5", 95), ("+Inf", 100))

    plain = llm_cr("plain", model="m", **TTFT_CR)
    fine, slow = (llm_cr(n, model="m", **TTFT_CR) for n in ("fine", "slow"))
    fine["metadata"]["annotations"] = {ANNOTATION: '{engine="fine"}'}
    slow["metadata"]["annotations"] = {ANNOTATION: '{engine="slow"}'}
    attainment = _attainment(handler, [plain, fine, slow])
    await attainment.refresh()
    others = attainment.answer("plain", "llm", plain, "28d")
    assert others["source"]["status"] == "ok"
    # The joined coverage query of the routes with their own matchers failed too: theirs is
    # unknown (not "no series"), the other routes' is still known.
    assert others["objectives"][0]["coverage"] == {
        "since": "2026-12-18T08:00:00Z",
        "fraction": 1.0,
        "resolution": "40m19s",
    }
    mine = attainment.answer("fine", "llm", fine, "28d")
    assert mine["source"]["status"] == "ok"
    assert mine["objectives"][0]["goodRatio"] == pytest.approx(0.8)
    assert (mine["objectives"][0]["coverage"], mine["objectives"][0]["reason"]) == (None, None)
    failed = attainment.answer("slow", "llm", slow, "28d")
    assert failed["source"]["status"] == "unavailable"
    assert "query timed out" in failed["source"]["reason"]
    assert failed["objectives"] == []


async def test_a_bucket_bound_spelt_two_ways_is_one_bucket() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        # Two exporters: one writes le="1", the other le="1.0" (and +Inf as +inf).
        return _buckets(query, ("0.5", 40), ("1", 50), ("1.0", 40), ("+Inf", 60), ("+inf", 40))

    cr = llm_cr("a", model="m", ttft={"default": {"metrics": [{"type": "p90", "threshold": 1}]}})
    attainment = _attainment(handler, [cr])
    await attainment.refresh()
    (objective,) = attainment.answer("a", "llm", cr, "28d")["objectives"]
    assert objective["goodRatio"] == pytest.approx(0.9)
    assert objective["estimated"] is False


async def test_figures_no_refresh_has_renewed_for_long_are_stale_never_ok() -> None:
    now = [1_800_000_000.0]

    def handler(request: httpx.Request) -> httpx.Response:
        return _buckets(parse_qs(request.content.decode())["query"][0], ("0.5", 95), ("+Inf", 100))

    cr = llm_cr("a", model="m", **TTFT_CR)
    attainment = _attainment(handler, [cr], clock=lambda: now[0])
    await attainment.refresh()
    rendered = attainment.line("28d")
    assert json.loads(rendered("a"))["source"]["status"] == "ok"
    # Refreshes every 60 s with a 5 s timeout: three missed and more is a stuck refresh.
    now[0] += 3 * 60 + 5 + 1
    for answer in (attainment.answer("a", "llm", cr, "28d"), json.loads(rendered("a"))):
        assert answer["source"]["status"] == "stale"
        assert answer["source"]["asOf"] == "2027-01-15T08:00:00Z"
        assert answer["source"]["reason"]
        assert answer["objectives"][0]["goodRatio"] == pytest.approx(0.95)
    assert (await attainment.with_series("a", "llm", cr, "28d"))["objectives"][0]["series"] == []
    await attainment.refresh()
    assert attainment.answer("a", "llm", cr, "28d")["source"]["status"] == "ok"


async def test_a_query_that_never_ends_meets_its_deadline() -> None:
    never = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        await never.wait()  # headers never come; httpx's per-read timeout never starts
        raise AssertionError("unreachable")

    cr = llm_cr("a", model="m", **TTFT_CR)
    attainment = _attainment(handler, [cr], timeout=0.2)
    await asyncio.wait_for(attainment.refresh(), 60)
    source = attainment.answer("a", "llm", cr, "28d")["source"]
    assert source == {
        "status": "unavailable",
        "reason": "Prometheus did not answer within 0.2 s",
        "asOf": None,
    }


async def test_routes_below_the_traffic_floor_sort_with_no_data_not_by_their_budget() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        if "_bucket" not in query:
            return httpx.Response(200, json=_vector(({"model_name": "busy"}, 30)))
        # busy: 950 of 1,000 within 0.5 s (budget 0.5 left); quiet: 5 of 10 (budget -4).
        return httpx.Response(
            200,
            json=_vector(
                ({"model_name": "busy", "le": "0.5"}, 950),
                ({"model_name": "busy", "le": "+Inf"}, 1000),
                ({"model_name": "quiet", "le": "0.5"}, 5),
                ({"model_name": "quiet", "le": "+Inf"}, 10),
            ),
        )

    crs = [llm_cr(n, model=n, **TTFT_CR) for n in ("busy", "quiet", "absent")]
    attainment = _attainment(handler, crs)
    attainment.min_requests = 100
    await attainment.refresh()
    quiet = attainment.answer("quiet", "llm", crs[1], "28d")["objectives"][0]
    assert (quiet["status"], quiet["reason"]) == ("no_data", "insufficient_traffic")
    assert quiet["budgetRemaining"] == pytest.approx(-4)  # its figures are still shown

    def render(routes: list[str], page: int, size: int, full: bool, line: Any) -> bytes:
        return b"[" + b",".join(line(r) for r in routes) + b"]"

    body, _ = await attainment.page(["absent", "busy", "quiet"], "all", "28d", True, 1, 20, render)
    # No data below the floor ranks with the routes without data (by name), after busy.
    assert [item["route"] for item in json.loads(body)] == ["busy", "absent", "quiet"]


async def test_a_tag_that_is_a_digit_but_not_a_number_is_ignored() -> None:
    # "²" is a digit to str.isdigit() but no int(): an answer carrying one (a relabelling, a
    # proxy) must not fail the refresh nor a chart, only be left out.
    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        tags = ({"slo_api_route": "0"}, {"slo_api_route": "²"})
        if request.url.path.endswith("/query_range"):
            points = [[1_800_000_000 - 300, "0.4"], [1_800_000_000, "0.45"]]
            result = [{"metric": t, "values": points} for t in tags]
            return httpx.Response(
                200, json={"status": "success", "data": {"resultType": "matrix", "result": result}}
            )
        if "slo_api_route" not in query:
            return _buckets(query, ("0.5", 95), ("+Inf", 100))
        if "_bucket" in query:
            return httpx.Response(
                200,
                json=_vector(
                    *(
                        (({**t, "le": "0.5"}, 80), ({**t, "le": "+Inf"}, 100))[i]
                        for t in tags
                        for i in (0, 1)
                    )
                ),
            )
        return httpx.Response(200, json=_vector(*((t, 30) for t in tags)))

    cr = llm_cr("own", model="m", **TTFT_CR)
    cr["metadata"]["annotations"] = {ANNOTATION: '{engine="0"}'}
    attainment = _attainment(handler, [cr])
    await attainment.refresh()
    answer = attainment.answer("own", "llm", cr, "28d")
    assert answer["source"]["status"] == "ok", answer["source"]
    assert answer["objectives"][0]["goodRatio"] == pytest.approx(0.8)
    charted = await attainment.with_series("own", "llm", cr, "1h")
    assert [p for _, p in charted["objectives"][0]["series"]] == [0.4, 0.45]


async def test_a_refresh_asked_for_while_one_runs_leaves_the_newer_figures() -> None:
    """`make test` once: a test's own refresh overlapped the service's first one, which had
    started earlier and finished later, so the figures went back to the older refresh's."""
    now = [1_800_000_000.0]
    gate, entered = asyncio.Event(), asyncio.Event()

    firsts: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode())
        if float(form["time"][0]) == 1_800_000_000.0:
            firsts.append(form["query"][0])
            if len(firsts) == 10:  # one query of the first refresh is slow
                entered.set()
                await gate.wait()
        return _buckets(form["query"][0], ("0.5", 95), ("+Inf", 100))

    cr = llm_cr("a", model="m", **TTFT_CR)
    attainment = _attainment(handler, [cr], clock=lambda: now[0])
    first = asyncio.create_task(attainment.refresh())
    await entered.wait()
    now[0] += 1
    second = asyncio.create_task(attainment.refresh())
    for _ in range(1000):  # turns of the loop for the second to run as far as it may
        if second.done():
            break
        await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, second)
    source = attainment.answer("a", "llm", cr, "28d")["source"]
    assert source["status"] == "ok"
    assert source["asOf"] == "2027-01-15T08:00:01Z"
