"""`/routes/{route}/attainment` and `/config?view=attainment`: their shape, who sees them, and
how they answer without Prometheus or with one that fails."""

from __future__ import annotations

from typing import Any

from tests.unit.conftest import AUTH, Started, job_cr, llm_cr, pool_cr
from tests.unit.fakes import FakeKube

LLM = "llmslorequirements"
JOB = "jobslorequirements"
POOL = "modelpools"

TTFT = {
    "default": {"metrics": [{"type": "p90", "threshold": 0.8}]},
    "ranges": [
        {
            "contextLengthRangeLow": 0,
            "contextLengthRangeHigh": 4096,
            "metrics": [{"type": "p90", "threshold": 0.5}],
        }
    ],
}


def _kube() -> FakeKube:
    return FakeKube(
        {
            LLM: [llm_cr("chat", ttft=TTFT, model="chat-7b")],
            JOB: [
                job_cr("batch", queue={"maxDepth": 0, "promql": "up"}),
                job_cr("nightly", queue={"maxDepth": 5, "promql": "queue_depth"}),
            ],
            POOL: [pool_cr("pool-a", ["chat"])],
        }
    )


async def test_without_prometheus_every_route_says_not_configured(start: Started) -> None:
    async with start(_kube()) as (client, _):
        chat = await client.get("/routes/chat/attainment", headers=AUTH)
        assert chat.status_code == 200
        assert chat.json() == {
            "route": "chat",
            "kind": "llm",
            "window": "28d",
            "source": {"status": "not_configured", "reason": None, "asOf": None},
            "selectors": {"ttft": '{model_name="chat-7b"}', "otps": '{model_name="chat-7b"}'},
            "objectives": [],
            "unmeasured": [
                {
                    "metric": "ttft",
                    "range": {"contextLengthRangeLow": 0, "contextLengthRangeHigh": 4096},
                    "reason": "vLLM's histograms carry no context length: a range's targets "
                    "cannot be measured",
                }
            ],
            "narrowed": [],
            # What alerts on the objective count and fire on, known without any figures.
            "alerting": [
                {
                    "metric": "ttft",
                    "type": "p90",
                    "threshold": 0.8,
                    "objective": 0.9,
                    "bucket": {"le": 0.75, "exact": False},
                    "arms": [
                        {
                            "severity": "page",
                            "long": "1h",
                            "short": "5m",
                            "burnRate": 5.0,
                            "budgetShare": 0.00744,
                            "capped": True,
                        },
                        {
                            "severity": "page",
                            "long": "6h",
                            "short": "30m",
                            "burnRate": 5.0,
                            "budgetShare": 0.044643,
                            "capped": True,
                        },
                        {
                            "severity": "ticket",
                            "long": "3d",
                            "short": "6h",
                            "burnRate": 0.933333,
                            "budgetShare": 0.1,
                            "capped": False,
                        },
                    ],
                }
            ],
        }
        batch = (await client.get("/config/batch/attainment?window=1h", headers=AUTH)).json()
        assert batch["window"] == "1h"
        assert batch["selectors"] is None
        assert batch["alerting"] == []
        assert batch["unmeasured"] == [
            {"metric": "queue", "range": None, "reason": "queue.maxDepth is 0: not configured"}
        ]
        # The route itself is as before.
        assert (await client.get("/routes/chat", headers=AUTH)).json()["ttft"] == TTFT


async def test_attainment_is_checked_like_the_route(start: Started) -> None:
    async with start(_kube()) as (client, _):
        missing = await client.get("/routes/nope/attainment", headers=AUTH)
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        assert (await client.get("/routes/chat/attainment")).status_code == 401
        bad = await client.get("/routes/chat/attainment?window=2d", headers=AUTH)
        assert bad.status_code == 400
        # A route name cannot end with the attainment's path.
        assert (
            await client.get("/routes/x/attainment/attainment", headers=AUTH)
        ).status_code == 400


async def test_the_attainment_view_pages_every_route(start: Started) -> None:
    async with start(_kube()) as (client, _):
        page = await client.get("/config?view=attainment&pageSize=2&window=7d", headers=AUTH)
        assert page.status_code == 200
        body: dict[str, Any] = page.json()
        assert body["total"] == 4
        assert [i["route"] for i in body["items"]] == ["batch", "chat"]
        assert {i["window"] for i in body["items"]} == {"7d"}
        assert all("series" not in o for i in body["items"] for o in i["objectives"])
        again = await client.get(
            "/config?view=attainment&pageSize=2&window=7d",
            headers={**AUTH, "If-None-Match": page.headers["ETag"]},
        )
        assert again.status_code == 304
        jobs = (await client.get("/config?view=attainment&kind=job", headers=AUTH)).json()
        assert [i["route"] for i in jobs["items"]] == ["batch", "nightly"]
        watch = await client.get("/config?view=attainment&watch=true", headers=AUTH)
        assert watch.status_code == 400


async def test_the_attainment_view_follows_a_changed_route(start: Started) -> None:
    async with start(_kube()) as (client, _):

        async def chat() -> Any:
            page = (await client.get("/config?view=attainment&kind=llm", headers=AUTH)).json()
            return page["items"][0]

        assert len((await chat())["unmeasured"]) == 1
        no_ranges = {"default": {"metrics": [{"type": "p90", "threshold": 0.8}]}}
        assert (await client.put("/routes/chat", json={"ttft": no_ranges}, headers=AUTH)).is_success
        assert (await chat())["unmeasured"] == []
