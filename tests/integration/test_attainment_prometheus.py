"""Attainment on a real Prometheus (Debian's) holding four weeks of backfilled vLLM histograms
and a job queue, for CRs on the real API server: the figures match what was generated, for
every window; a model with quotes and braces neither breaks nor widens a query; Prometheus
stopped, stalled or answering garbage changes nothing else; and attainment is read under the
route's access rule."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.admin import Admin
from controlplane.prometheus import Prometheus
from tests.integration import crs
from tests.integration.attainment_data import (
    CHAT_TPOT,
    CHAT_TTFT,
    DAY,
    ODD_TPOT,
    ODD_TTFT,
    TPOT,
    TPOT_BOUNDS,
    TTFT,
    TTFT_BOUNDS,
    WINDOWS,
    Histories,
    Shape,
    at_bound,
    between,
    percentile,
)
from tests.integration.service import RunningService, running

pytestmark = pytest.mark.integration

# A model name that would end the string and add its own selector if it were not escaped.
ODD = 'x"} or vllm:time_to_first_token_seconds_bucket{model_name=~".+'
# Engine 1 of chat-7b is faster than engine 0: the route sums both, an annotation takes one.
ENGINE_1_TTFT = Shape(old={0.1: 60, 0.25: 40}, day={0.1: 60, 0.25: 40}, hour={0.25: 100})
QUEUE_NOW, QUEUE_BURST, QUEUE_CALM, MAX_DEPTH = 12, 50, 3, 10
ANNOTATION = "slo-api.modelsphere.dev/prometheus-matchers"


def _queue_depth(age: float) -> float:
    if age <= 600:
        return QUEUE_NOW
    if 2 * DAY < age <= 2 * DAY + 6 * 3600:
        return QUEUE_BURST
    return QUEUE_CALM


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Histories, Prometheus]]:
    # Samples run a little past now, so the queue's "now" stays in Prometheus's 5-minute
    # lookback however long the module takes; what is after a query's time is never read.
    now = int(time.time()) // 60 * 60 + 30
    data = Histories(now + 15 * 60, now)
    data.add_histogram(TTFT, TTFT_BOUNDS, CHAT_TTFT, model_name="chat-7b", engine="0")
    data.add_histogram(TTFT, TTFT_BOUNDS, ENGINE_1_TTFT, model_name="chat-7b", engine="1")
    for engine in ("0", "1"):
        data.add_histogram(TPOT, TPOT_BOUNDS, CHAT_TPOT, model_name="chat-7b", engine=engine)
    data.add_histogram(TTFT, TTFT_BOUNDS, ODD_TTFT, model_name=ODD, engine="0")
    data.add_histogram(TPOT, TPOT_BOUNDS, ODD_TPOT, model_name=ODD, engine="0")
    data.add_queue(_queue_depth)
    prometheus = Prometheus(tmp_path_factory.mktemp("prometheus"))
    prometheus.backfill(data.openmetrics())
    prometheus.start()
    yield data, prometheus
    prometheus.stop()


def _count(prometheus: Prometheus, selector: str) -> int:
    """How many series a selector selects now, asked of Prometheus directly."""
    answer = httpx.post(
        f"{prometheus.url}/api/v1/query", data={"query": f"count({selector})"}, timeout=10
    ).json()
    assert answer["status"] == "success", answer
    return int(answer["data"]["result"][0]["value"][1])


def _status(good: float, objective: float, burn: dict[str, float]) -> str:
    if good < objective:
        return "violated"
    # 2% of a 28-day budget in 1h, 5% in 6h; no arm asks more than half the requests to miss.
    fast, slow = (min(f, 0.5 / (1 - objective)) for f in (13.44, 5.6))
    page = (burn["1h"] > fast and burn["5m"] > fast) or (burn["6h"] > slow and burn["30m"] > slow)
    return "at_risk" if page else "met"


def _run() -> str:
    return f"a{os.getpid() % 10000}-{int(time.monotonic() * 1000) % 100000}"


def _objective(answer: dict[str, Any], metric: str, type_: str, threshold: float) -> Any:
    return next(
        o
        for o in answer["objectives"]
        if (o["metric"], o["type"], o["threshold"]) == (metric, type_, threshold)
    )


def _as_of(answer: dict[str, Any]) -> int:
    assert answer["source"]["status"] == "ok", answer["source"]
    return int(datetime.fromisoformat(answer["source"]["asOf"]).timestamp())


async def _attainment(service: RunningService, route: str, window: str) -> dict[str, Any]:
    got = await service.get(f"/routes/{route}/attainment?window={window}")
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body


async def _refreshed(service: RunningService, *routes: str) -> None:
    for route in routes:

        def indexed(route: str = route) -> bool:
            return bool(service.indexed(route))

        await service.eventually(indexed, what=f"{route} indexed")
    await service.runtime.attainment.refresh()


async def test_llm_figures_match_the_generated_distributions_in_every_window(
    admin: Admin, slo_api_kubeconfig: Path, history: tuple[Histories, Prometheus]
) -> None:
    data, prometheus = history
    ns = _run()
    admin.ensure_namespace(ns)
    chat, own, odd, bad = f"{ns}-chat", f"{ns}-own", f"{ns}-odd", f"{ns}-bad"
    sections = {
        "ttft": {
            "default": {
                "metrics": [
                    {"type": "p90", "threshold": 0.5},  # a bucket bound
                    {"type": "p90", "threshold": 0.3},  # inside (0.25, 0.5]
                    {"type": "avg", "threshold": 0.4},
                ]
            },
            "ranges": [
                {
                    "contextLengthRangeLow": 0,
                    "contextLengthRangeHigh": 4096,
                    "metrics": [{"type": "p90", "threshold": 0.25}],
                }
            ],
        },
        "otps": {
            "default": {
                "metrics": [
                    {"type": "p90", "threshold": 20},  # time per token 0.05: a bound
                    {"type": "p50", "threshold": 30},  # 0.0333...: inside (0.025, 0.05]
                    {"type": "avg", "threshold": 20},
                ]
            }
        },
    }
    admin.create(crs.llm(ns, "chat", service_id=chat, model="chat-7b", **sections))
    annotated = crs.llm(ns, "own", service_id=own, model="chat-7b", ttft=sections["ttft"])
    annotated["metadata"]["annotations"] = {ANNOTATION: '{model_name="chat-7b", engine="0"}'}
    admin.create(annotated)
    admin.create(crs.llm(ns, "odd", service_id=odd, model=ODD, ttft=sections["ttft"]))
    wrong = crs.llm(ns, "bad", service_id=bad, model="chat-7b", ttft=sections["ttft"])
    wrong["metadata"]["annotations"] = {ANNOTATION: 'model_name="chat-7b"} or up{'}
    admin.create(wrong)
    # A tenant's annotation reaching for every model's series: refused, not widened.
    wide = crs.llm(ns, "wide", service_id=f"{ns}-wide", model=ODD, ttft=sections["ttft"])
    wide["metadata"]["annotations"] = {ANNOTATION: '{model_name!=""}'}
    admin.create(wide)
    async with running(slo_api_kubeconfig, prometheus_url=prometheus.url) as service:
        await _refreshed(service, chat, own, odd, bad, f"{ns}-wide")
        for window in ("1h", "1d", "7d", "28d"):
            answer = await _attainment(service, chat, window)
            at = _as_of(answer)
            assert answer["selectors"] == {
                "ttft": '{model_name="chat-7b"}',
                "otps": '{model_name="chat-7b"}',
            }
            ttft = data.counts(TTFT, TTFT_BOUNDS, at, WINDOWS[window], model_name="chat-7b")
            tpot = data.counts(TPOT, TPOT_BOUNDS, at, WINDOWS[window], model_name="chat-7b")
            burn_ttft = {
                w: at_bound(
                    data.counts(TTFT, TTFT_BOUNDS, at, WINDOWS[w], model_name="chat-7b"), 0.5
                )
                for w in ("5m", "30m", "1h", "6h")
            }

            exact = _objective(answer, "ttft", "p90", 0.5)
            good = at_bound(ttft, 0.5)
            assert exact["goodRatio"] == pytest.approx(good, rel=1e-9), window
            assert exact["estimated"] is False
            assert exact["objective"] == 0.9
            assert exact["observed"] == pytest.approx(percentile(ttft, 0.9), rel=1e-9)
            assert exact["budgetRemaining"] == pytest.approx(1 - (1 - good) / 0.1, rel=1e-9)
            assert exact["burnRates"] == pytest.approx(
                {w: (1 - g) / 0.1 for w, g in burn_ttft.items()}, rel=1e-9
            )
            assert exact["status"] == _status(good, 0.9, exact["burnRates"])
            assert len(exact["series"]) <= 200

            inside = _objective(answer, "ttft", "p90", 0.3)
            low, high, linear = between(ttft, 0.3)
            assert inside["estimated"] is True
            assert low <= inside["goodRatio"] <= high
            assert inside["goodRatio"] == pytest.approx(linear, rel=1e-9)

            mean = _objective(answer, "ttft", "avg", 0.4)
            sums = data.delta(
                f"{TTFT}_sum", {"model_name": "chat-7b", "engine": "0"}, at, WINDOWS[window]
            )
            sums1 = data.delta(
                f"{TTFT}_sum", {"model_name": "chat-7b", "engine": "1"}, at, WINDOWS[window]
            )
            assert sums is not None
            assert sums1 is not None
            assert mean["observed"] == pytest.approx((sums + sums1) / ttft[-1][1], rel=1e-9)
            assert (mean["goodRatio"], mean["budgetRemaining"], mean["burnRates"]) == (
                None,
                None,
                None,
            )

            otps = _objective(answer, "otps", "p90", 20)
            assert otps["goodRatio"] == pytest.approx(at_bound(tpot, 0.05), rel=1e-9)
            assert otps["estimated"] is False
            assert otps["observed"] == pytest.approx(1 / percentile(tpot, 0.9), rel=1e-9)
            median = _objective(answer, "otps", "p50", 30)
            low, high, linear = between(tpot, 1 / 30)
            assert median["estimated"] is True
            assert median["goodRatio"] == pytest.approx(linear, rel=1e-9)
            assert median["observed"] == pytest.approx(1 / percentile(tpot, 0.5), rel=1e-9)
            otps_mean = _objective(answer, "otps", "avg", 20)
            tpot_sums = sum(
                data.delta(
                    f"{TPOT}_sum", {"model_name": "chat-7b", "engine": e}, at, WINDOWS[window]
                )
                or 0
                for e in ("0", "1")
            )
            assert otps_mean["observed"] == pytest.approx(tpot[-1][1] / tpot_sums, rel=1e-9)
            assert answer["unmeasured"] == [
                {
                    "metric": "ttft",
                    "range": {"contextLengthRangeLow": 0, "contextLengthRangeHigh": 4096},
                    "reason": "vLLM's histograms carry no context length: a range's targets "
                    "cannot be measured",
                }
            ]

            # The annotation's matchers: engine 0 only.
            mine = _objective(await _attainment(service, own, window), "ttft", "p90", 0.5)
            engine0 = data.counts(
                TTFT, TTFT_BOUNDS, at, WINDOWS[window], model_name="chat-7b", engine="0"
            )
            assert mine["goodRatio"] == pytest.approx(at_bound(engine0, 0.5), rel=1e-9)

            # Quotes and braces in the model: its own series, nothing more, and no error.
            odd_answer = await _attainment(service, odd, window)
            assert odd_answer["source"]["status"] == "ok"
            odd_counts = data.counts(TTFT, TTFT_BOUNDS, at, WINDOWS[window], model_name=ODD)
            odd_p90 = _objective(odd_answer, "ttft", "p90", 0.5)
            # The route's chart query selects its series alone.
            odd_last_t, odd_last = odd_p90["series"][-1]
            step = max(WINDOWS[window] // 200, 300)
            odd_step = data.counts(TTFT, TTFT_BOUNDS, int(odd_last_t), step, model_name=ODD)
            assert odd_last == pytest.approx(percentile(odd_step, 0.9), rel=1e-6)
            assert odd_p90["goodRatio"] == pytest.approx(at_bound(odd_counts, 0.5)) == 0.0
            assert odd_p90["observed"] == pytest.approx(percentile(odd_counts, 0.9), rel=1e-9)

        # The burn rates do not depend on the window.
        rates = {
            w: _objective(await _attainment(service, chat, w), "ttft", "p90", 0.5)["burnRates"]
            for w in ("1h", "28d")
        }
        assert rates["1h"] == rates["28d"]

        # Its selectors, as `sloctl rules` would use them, select exactly its series.
        selector = (await _attainment(service, odd, "1d"))["selectors"]["ttft"]
        assert _count(prometheus, f"{TTFT}_bucket{selector}") == len(TTFT_BOUNDS)
        assert _count(prometheus, f'{TTFT}_bucket{{model_name="chat-7b"}}') == 2 * len(TTFT_BOUNDS)

        widened = await _attainment(service, f"{ns}-wide", "1d")
        assert widened["source"]["status"] == "unavailable"
        assert "can only narrow" in widened["source"]["reason"]
        assert (widened["selectors"], widened["objectives"]) == (None, [])

        broken = await _attainment(service, bad, "1d")
        assert broken["source"]["status"] == "unavailable"
        assert ANNOTATION in broken["source"]["reason"]
        assert broken["objectives"] == []
        assert broken["selectors"] is None

        # A chart point is the percentile over the step ending at its time.
        series = _objective(await _attainment(service, chat, "1d"), "ttft", "p90", 0.5)["series"]
        assert 0 < len(series) <= 200
        last_t, last_v = series[-1]
        step = 432
        recent = data.counts(TTFT, TTFT_BOUNDS, int(last_t), step, model_name="chat-7b")
        assert last_v == pytest.approx(percentile(recent, 0.9), rel=1e-6)

        # Every route at once, lowest budget first.
        page = await service.get("/config?view=attainment&sort=budget&window=28d&pageSize=200")
        assert page.status_code == 200
        ours = [i for i in page.json()["items"] if i["route"].startswith(ns)]
        assert all("series" not in o for i in ours for o in i["objectives"])
        lowest: dict[str, float | None] = {}
        for route in (chat, own, odd, bad):
            budgets = [
                o["budgetRemaining"]
                for o in (await _attainment(service, route, "28d"))["objectives"]
                if o["budgetRemaining"] is not None
            ]
            lowest[route] = min(budgets) if budgets else None
        assert lowest[odd] == pytest.approx(-9.0)  # nothing within 0.5 s: 1 - 1 / 0.1
        assert lowest[bad] is None
        known = {r: b for r, b in lowest.items() if b is not None}
        by_budget = sorted(known, key=lambda r: known[r])
        assert [i["route"] for i in ours] == [*by_budget, bad, f"{ns}-wide"]


async def test_job_figures_match_the_generated_queue_in_every_window(
    admin: Admin, slo_api_kubeconfig: Path, history: tuple[Histories, Prometheus]
) -> None:
    data, prometheus = history
    ns = _run()
    admin.ensure_namespace(ns)
    job, idle = f"{ns}-job", f"{ns}-idle"
    # A comment in the job's own query ends with it.
    queue = {"maxDepth": MAX_DEPTH, "promql": 'max(job_queue_depth{queue="q1"}) # the depth'}
    admin.create(crs.job(ns, "job", service_id=job, queue=queue))
    admin.create(crs.job(ns, "idle", service_id=idle, queue={"maxDepth": 0, "promql": "up"}))
    async with running(slo_api_kubeconfig, prometheus_url=prometheus.url) as service:
        await _refreshed(service, job, idle)
        for window in ("1h", "1d", "7d", "28d"):
            answer = await _attainment(service, job, window)
            at = _as_of(answer)
            assert answer["selectors"] is None
            (objective,) = answer["objectives"]
            low, high = data.queue_steps(at, WINDOWS[window], MAX_DEPTH)
            assert low - 1e-9 <= objective["goodRatio"] <= high + 1e-9, (window, low, high)
            assert objective == {
                **objective,
                "metric": "queue",
                "type": "maxDepth",
                "threshold": MAX_DEPTH,
                "objective": None,
                "observed": QUEUE_NOW,
                "budgetRemaining": None,
                "burnRates": None,
                "status": "violated",
            }
            assert 0 < len(objective["series"]) <= 200
        # The burst two days ago is in the week, not in the last day.
        week = (await _attainment(service, job, "7d"))["objectives"][0]["goodRatio"]
        day = (await _attainment(service, job, "1d"))["objectives"][0]["goodRatio"]
        assert week < day
        idle_answer = await _attainment(service, idle, "28d")
        assert idle_answer["objectives"] == []
        assert idle_answer["unmeasured"] == [
            {"metric": "queue", "range": None, "reason": "queue.maxDepth is 0: not configured"}
        ]


class Garbage:
    """A tiny HTTP server in Prometheus's place: answers every request with `answer`, after
    `release` is set when `held`."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.held = False
        self.asked = asyncio.Event()
        self.release = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> Garbage:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self.release.set()
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                self.asked.set()
                if self.held:
                    await self.release.wait()
                writer.write(self.answer)
                await writer.drain()


def _http(status: str, content_type: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


GARBAGE = {
    "html": (_http("200 OK", "text/html", b"<html>login</html>"), "not its JSON"),
    "5xx": (_http("503 Service Unavailable", "text/plain", b"overloaded"), "HTTP 503"),
    "error": (
        _http(
            "422 Unprocessable Entity",
            "application/json",
            b'{"status":"error","errorType":"execution","error":"query timed out"}',
        ),
        "query timed out",
    ),
}


async def _unchanged(service: RunningService, route: str, before: tuple[Any, Any]) -> None:
    """The route and /config answer as they did, without waiting for Prometheus."""
    got = await service.get(f"/routes/{route}")
    assert got.status_code == 200
    page = await service.get("/config?pageSize=200")
    assert page.status_code == 200
    assert (got.json(), [i for i in page.json()["items"] if i["route"] == route]) == before


async def _before(service: RunningService, route: str) -> tuple[Any, Any]:
    got = (await service.get(f"/routes/{route}")).json()
    page = (await service.get("/config?pageSize=200")).json()
    return got, [i for i in page["items"] if i["route"] == route]


@pytest.mark.parametrize("kind", sorted(GARBAGE))
async def test_garbage_from_prometheus_leaves_routes_alone_and_says_unavailable(
    admin: Admin, slo_api_kubeconfig: Path, kind: str
) -> None:
    answer, reason = GARBAGE[kind]
    ns = _run()
    admin.ensure_namespace(ns)
    route = f"{ns}-chat"
    admin.create(
        crs.llm(
            ns,
            "chat",
            service_id=route,
            ttft={"default": {"metrics": [{"type": "p90", "threshold": 0.5}]}},
        )
    )
    async with (
        Garbage(answer) as garbage,
        running(slo_api_kubeconfig, prometheus_url=garbage.url) as service,
    ):
        await service.eventually(lambda: service.indexed(route), what="indexed")
        before = await _before(service, route)
        # Held: the refresh waits on Prometheus; nothing else does.
        garbage.held = True
        garbage.asked.clear()
        refresh = asyncio.create_task(service.runtime.attainment.refresh())
        await garbage.asked.wait()
        await _unchanged(service, route, before)
        put = await service.put(f"/routes/{route}", {"priority": 3})
        assert put.status_code == 200
        assert not refresh.done()
        garbage.release.set()
        await refresh
        got = await _attainment(service, route, "28d")
        # Never a good answer: no time, no objectives.
        assert got["source"]["status"] == "unavailable"
        assert reason in got["source"]["reason"]
        assert got["source"]["asOf"] is None
        assert got["objectives"] == []
        metrics = (await service.client.get("/metrics")).text
        assert "slo_api_attainment_refreshes_total{result=" in metrics


async def test_prometheus_stopped_keeps_the_last_figures_with_their_time(
    admin: Admin, slo_api_kubeconfig: Path, tmp_path: Path
) -> None:
    now = int(time.time()) // 60 * 60 + 30
    data = Histories(now, now)
    data.add_histogram(TTFT, TTFT_BOUNDS, CHAT_TTFT, model_name="small")
    prometheus = Prometheus(tmp_path)
    prometheus.backfill(data.openmetrics())
    prometheus.start()
    ns = _run()
    admin.ensure_namespace(ns)
    route = f"{ns}-small"
    ttft = {"default": {"metrics": [{"type": "p90", "threshold": 0.5}]}}
    admin.create(crs.llm(ns, "small", service_id=route, model="small", ttft=ttft))
    try:
        async with running(slo_api_kubeconfig, prometheus_url=prometheus.url) as service:
            await _refreshed(service, route)
            good = await _attainment(service, route, "28d")
            assert good["source"]["status"] == "ok"
            before = await _before(service, route)
            prometheus.stop()
            await service.runtime.attainment.refresh()
            kept = await _attainment(service, route, "28d")
            assert kept["source"]["status"] == "unavailable"
            assert "cannot reach Prometheus" in kept["source"]["reason"]
            assert kept["source"]["asOf"] == good["source"]["asOf"]
            # The last figures, without a chart (the series needs Prometheus), at once.
            assert all(o["series"] for o in good["objectives"])
            assert all(o["series"] == [] for o in kept["objectives"])
            assert [{**o, "series": []} for o in kept["objectives"]] == [
                {**o, "series": []} for o in good["objectives"]
            ]
            await _unchanged(service, route, before)
    finally:
        prometheus.stop()


async def test_attainment_is_read_under_the_routes_access_rule(
    admin: Admin, slo_api_kubeconfig: Path
) -> None:
    ns, people = _run(), f"{_run()}-people"
    for name in (ns, people):
        admin.ensure_namespace(name)
    route = f"{ns}-chat"
    admin.create(crs.llm(ns, "chat", service_id=route))
    for who in ("viewer", "nobody"):
        admin.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": who, "namespace": people},
            }
        )
    admin.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "viewer", "namespace": ns},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "slo-api-view",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": people}],
        }
    )
    tokens = {w: admin.service_account_token(people, w) for w in ("viewer", "nobody")}
    async with running(slo_api_kubeconfig, slo_api_kubernetes_auth=True) as service:
        await service.eventually(lambda: service.indexed(route), what="indexed")

        async def as_(who: str, path: str) -> Any:
            got = await service.client.get(path, headers={"Authorization": f"Bearer {tokens[who]}"})
            return got.status_code, got.json()

        assert (await as_("viewer", f"/routes/{route}/attainment"))[0] == 200
        for path in (f"/routes/{route}/attainment", f"/config/{route}/attainment"):
            assert await as_("nobody", path) == await as_("nobody", f"/routes/{route}")
            assert (await as_("nobody", path))[0] == 404
        listed = await as_("nobody", "/config?view=attainment&pageSize=200")
        assert route not in [i["route"] for i in listed[1].get("items", [])]
