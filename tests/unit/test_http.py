"""The HTTP contract that needs no API server: auth, the error envelope, limits, probes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from slo_api.kube import KubeError
from tests.unit.conftest import AUTH, TOKEN, Started, llm_cr, until, until_ready
from tests.unit.fakes import FakeKube, fail

READ_TOKEN, WRITE_TOKEN = "read-token-000001", "write-token-00001"


async def test_routes_and_config_need_a_bearer_token(start: Started) -> None:
    async with start(FakeKube({"llmslorequirements": [llm_cr("a")]})) as (client, _):
        for path in ("/routes/a", "/config", "/config/a"):
            missing = await client.get(path)
            assert missing.status_code == 401
            assert missing.headers["www-authenticate"].startswith("Bearer")
            assert missing.json()["error"]["code"] == "unauthorized"
            wrong = await client.get(path, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            basic = await client.get(path, headers={"Authorization": f"Basic {TOKEN}"})
            assert basic.status_code == 401
        assert (await client.get("/routes/a", headers=AUTH)).status_code == 200
        for open_path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
            assert (await client.get(open_path)).status_code == 200


async def test_unknown_paths_and_methods_use_the_envelope(start: Started) -> None:
    async with start() as (client, _):
        missing = await client.get("/nowhere", headers=AUTH)
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        wrong = await client.post("/routes/x", headers=AUTH)
        assert wrong.status_code == 405
        assert wrong.json()["error"]["code"] == "method_not_allowed"
        assert set(wrong.headers["allow"].replace(" ", "").split(",")) == {"GET", "PUT", "DELETE"}


async def test_query_validation_errors_are_400_with_the_field(start: Started) -> None:
    async with start() as (client, _):
        for params, field in (
            ({"pageSize": 0}, "pageSize"),
            ({"pageSize": 201}, "pageSize"),
            ({"page": "x"}, "page"),
            ({"kind": "gpu"}, "kind"),
        ):
            response = await client.get("/config", params=params, headers=AUTH)
            assert response.status_code == 400, params
            assert response.json()["error"]["code"] == "invalid_request"
            assert response.json()["error"]["field"] == field
            # The same causes as a body's: named by the parameter, not by where it was sent.
            (cause,) = response.json()["error"]["causes"]
            assert cause["field"] == field
            assert not cause["message"].startswith(field), cause


async def test_request_id_is_echoed_or_generated(start: Started) -> None:
    async with start() as (client, _):
        echoed = await client.get("/healthz", headers={"X-Request-Id": "abc-123"})
        assert echoed.headers["x-request-id"] == "abc-123"
        generated = await client.get("/nowhere")
        assert len(generated.headers["x-request-id"]) == 32
        hostile = await client.get("/healthz", headers={"X-Request-Id": "a\tb<script>"})
        assert hostile.headers["x-request-id"] != "a\tb<script>"


async def test_readyz_is_503_with_a_reason_until_every_kind_synced(start: Started) -> None:
    gate = asyncio.Event()

    async def slow_jobs(method: str, *args: Any) -> None:
        if method == "list" and args[0].plural == "jobslorequirements":
            await gate.wait()

    kube = FakeKube(error_callback=slow_jobs)
    async with start(kube, ready=False) as (client, app):
        informers = {i.kind.name: i for i in app.state.runtime.informers}
        await until(lambda: informers["llm"].synced, "the llm kind synced")
        waiting = await client.get("/readyz")
        assert waiting.status_code == 503
        assert waiting.json()["status"] == "not_ready"
        assert "job" in waiting.json()["reason"]
        assert waiting.json()["kinds"]["llm"]["synced"] is True
        assert waiting.json()["kinds"]["job"]["synced"] is False
        listing = await client.get("/config", headers=AUTH)
        assert listing.status_code == 503
        assert listing.json()["error"]["code"] == "not_ready"
        gate.set()
        await until_ready(app)
        assert (await client.get("/readyz")).status_code == 200


async def test_readyz_is_503_until_the_guardrails_are_listed_too(start: Started) -> None:
    # A ready replica must serve each route's limits: a full view read before the SLOLimits
    # were listed showed none (found by the robustness harness's readiness validator).
    gate = asyncio.Event()

    async def slow_limits(method: str, *args: Any) -> None:
        if method == "list" and args[0].plural == "slolimits":
            await gate.wait()

    limits = {
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "kind": "SLOLimits",
        "metadata": {"name": "default", "namespace": "ns", "resourceVersion": "1"},
        "spec": {"maxPriority": 8},
    }
    kube = FakeKube(
        {"llmslorequirements": [llm_cr("a")], "slolimits": [limits]}, error_callback=slow_limits
    )
    async with start(kube, ready=False) as (client, app):
        informers = app.state.runtime.informers
        await until(lambda: all(i.synced for i in informers), "every kind synced")
        waiting = await client.get("/readyz")
        assert waiting.status_code == 503
        assert "slolimits" in waiting.json()["reason"]
        assert (await client.get("/config", headers=AUTH)).status_code == 503
        gate.set()
        await until_ready(app)
        assert (await client.get("/readyz")).status_code == 200
        route = (await client.get("/routes/a", headers=AUTH)).json()
        assert route["limits"] == {"maxPriority": 8}


async def test_readyz_reports_a_missing_crd_as_synced_and_absent(start: Started) -> None:
    kube = FakeKube()
    kube.missing.add("jobslorequirements")
    async with start(kube) as (client, _):
        body = (await client.get("/readyz")).json()
        assert body["kinds"]["job"] == {
            "synced": True,
            "present": False,
            "stale": False,
            "objects": 0,
            "groups": ["inference.modelsphere.dev", "inference.x-k8s.io"],
            "served": [],
            "watched": [],
            "leftovers": 0,
        }


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"priority": 1, "priority": 2}', "duplicate"),
        (b'{"ttft": {"default": {"metrics": [{"type": "p90", "threshold": NaN}]}}}', "NaN"),
        (
            b'{"ttft": {"default": {"metrics": [{"type": "p90", "threshold": Infinity}]}}}',
            "Infinity",
        ),
        (b'{"priority": 99999999999999999999}', "too large"),
        (b"[1, 2]", "JSON object"),
        (b"{not json", "not valid JSON"),
        (b"", "empty"),
        (b"[" * 5000 + b"]" * 5000, "nested"),
        (b'{"a": ' + b'{"b": ' * 40 + b"1" + b"}" * 41, "nested"),
    ],
)
async def test_bad_json_is_400_and_never_reaches_the_api_server(
    start: Started, raw: bytes, says: str
) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a")]})
    async with start(kube) as (client, _):
        response = await client.put(
            "/routes/a", content=raw, headers={**AUTH, "Content-Type": "application/json"}
        )
        assert response.status_code == 400
        assert says in response.json()["error"]["message"]
        assert kube.patches == []


async def test_body_limits_413_and_415(start: Started) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a")]})
    async with start(kube, max_body_bytes=2048) as (client, _):
        big = b'{"x": "' + b"a" * 4000 + b'"}'
        declared = await client.put(
            "/routes/a", content=big, headers={**AUTH, "Content-Type": "application/json"}
        )
        assert declared.status_code == 413
        assert declared.json()["error"]["code"] == "payload_too_large"

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b"a" * 1000

        chunked = await client.put(
            "/routes/a", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}
        )
        assert chunked.status_code == 413
        # Refused before the body is read, or while it is: one encoder, one envelope.
        assert declared.content == chunked.content
        for header in ("content-type", "x-request-id", "x-content-type-options"):
            assert header in declared.headers, header
            assert header in chunked.headers, header
        assert declared.headers["content-type"] == chunked.headers["content-type"]
        assert declared.headers["connection"] == "close"  # the unread body ends the connection
        text = await client.put(
            "/routes/a", content=b"priority=1", headers={**AUTH, "Content-Type": "text/plain"}
        )
        assert text.status_code == 415
        assert text.json()["error"]["code"] == "unsupported_media_type"
        assert kube.patches == []


@pytest.mark.parametrize("route", ["a" * 254, "bad%01name", "tab%09name"])
async def test_hostile_route_names_are_400(start: Started, route: str) -> None:
    async with start() as (client, _):
        response = await client.get(f"/routes/{route}", headers=AUTH)
        assert response.status_code == 400
        assert response.json()["error"]["field"] == "route"


async def test_route_names_are_percent_decoded_once_and_case_sensitive(start: Started) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a", route="team/chat 7b")]})
    async with start(kube) as (client, _):
        assert (await client.get("/routes/team%2Fchat%207b", headers=AUTH)).status_code == 200
        assert (await client.get("/routes/team%252Fchat%207b", headers=AUTH)).status_code == 404
        assert (await client.get("/routes/TEAM%2Fchat%207b", headers=AUTH)).status_code == 404


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (
            KubeError(403, "Forbidden", "llmslorequirements is forbidden", is_status=True),
            502,
            "upstream_error",
        ),
        (KubeError(500, "InternalError", "etcd", is_status=True), 502, "upstream_error"),
        (KubeError(404, "NotFound", "gone", is_status=True), 404, "not_found"),
    ],
)
async def test_api_server_failures_map_to_clear_errors(
    start: Started, caplog: pytest.LogCaptureFixture, error: KubeError, status: int, code: str
) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a")]})
    async with start(kube) as (client, _):
        kube.error_callback = fail(error, "get", "patch")
        with caplog.at_level(logging.ERROR):
            response = await client.put("/routes/a", json={"priority": 1}, headers=AUTH)
        assert response.status_code == status
        assert response.json()["error"]["code"] == code
        if error.status == 403:
            assert any("RBAC" in r.getMessage() for r in caplog.records)


async def test_timeouts_are_504(start: Started) -> None:
    from slo_api.kube import KubeTimeout

    kube = FakeKube({"llmslorequirements": [llm_cr("a")]})
    async with start(kube) as (client, _):
        kube.error_callback = fail(KubeTimeout(0, "Timeout", "slow"), "get")
        response = await client.get("/routes/a", headers=AUTH)
        assert response.status_code == 504
        assert response.json()["error"]["code"] == "upstream_timeout"


async def test_tokens_never_reach_the_logs(
    start: Started, caplog: pytest.LogCaptureFixture
) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a")]})
    with caplog.at_level(logging.DEBUG):
        async with start(kube) as (client, _):
            await client.put("/routes/a", json={"priority": 3}, headers=AUTH)
            await client.get("/routes/a", headers={"Authorization": "Bearer wrong-secret"})
    text = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert TOKEN not in text
    assert "wrong-secret" not in text
    audits = [r for r in caplog.records if r.name == "slo_api.audit"]
    assert len(audits) == 1
    assert audits[0].__dict__["fields"] == ["priority"]
    assert audits[0].__dict__["role"] == "write"
    assert audits[0].__dict__["outcome"] == 200


async def test_a_read_token_reads_but_gets_403_on_writes(start: Started, tmp_path: object) -> None:
    from pathlib import Path

    tokens = Path(str(tmp_path)) / "tokens"
    tokens.write_text(f"{READ_TOKEN} read\n{WRITE_TOKEN} write\n")
    kube = FakeKube({"llmslorequirements": [llm_cr("a")]})
    async with start(kube, slo_api_token=None, slo_api_tokens_file=tokens) as (client, _):
        read = {"Authorization": f"Bearer {READ_TOKEN}"}
        assert (await client.get("/routes/a", headers=read)).status_code == 200
        put = await client.put("/routes/a", json={"priority": 1}, headers=read)
        assert put.status_code == 403
        assert put.json()["error"]["code"] == "forbidden"
        assert (await client.delete("/routes/a", headers=read)).status_code == 403
        assert kube.patches == []
        write = {"Authorization": f"Bearer {WRITE_TOKEN}"}
        assert (
            await client.put("/routes/a", json={"priority": 1}, headers=write)
        ).status_code == 200


async def test_the_demo_page_and_its_assets_are_served_without_a_token(start: Started) -> None:
    async with start() as (client, _):
        page = await client.get("/demo-webui")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert (await client.get("/demo-webui/app.js")).status_code == 200
        assert (await client.get("/demo-webui/secrets.txt")).status_code == 404
        slash = await client.get("/demo-webui/")
        assert slash.status_code == 307
        assert slash.headers["location"] == "../demo-webui"


async def test_a_broken_tokens_file_shows_in_readyz_and_metrics_and_is_never_a_500(
    start: Started, tmp_path: object
) -> None:
    import os
    import time
    from pathlib import Path

    tokens = Path(str(tmp_path)) / "tokens"
    tokens.write_text(f"{READ_TOKEN} read\n")
    async with start(slo_api_tokens_file=tokens) as (client, _):
        ready = (await client.get("/readyz")).json()
        assert ready["tokensFile"] == {"ok": True}
        assert "slo_api_tokens_file_ok 1.0" in (await client.get("/metrics")).text
        tokens.write_bytes(b"\xff not utf-8\n")
        os.utime(tokens, (time.time() + 5, time.time() + 5))
        read = {"Authorization": f"Bearer {READ_TOKEN}"}
        assert (await client.get("/routes/a", headers=read)).status_code == 404
        assert (await client.get("/routes/a", headers=AUTH)).status_code == 404
        ready = (await client.get("/readyz")).json()
        assert ready["tokensFile"]["ok"] is False
        assert "UTF-8" in ready["tokensFile"]["problem"]
        metrics = (await client.get("/metrics")).text
        assert "slo_api_tokens_file_ok 0.0" in metrics
        assert 'slo_api_tokens_file_reload_failures_total{reason="invalid"} 1.0' in metrics
        tokens.unlink()
        assert (await client.get("/routes/a", headers=read)).status_code == 401
        metrics = (await client.get("/metrics")).text
        assert 'slo_api_tokens_file_reload_failures_total{reason="unreadable"} 1.0' in metrics
