"""Running it as operators do: the real process, its logs, metrics and SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration.process import TOKEN, start_process
from tests.integration.service import RunningService
from tests.integration.tcpproxy import TcpProxy

pytestmark = pytest.mark.integration


async def _until(check: Callable[[], bool], what: str, within: float = 30) -> None:
    """Let the loop run until `check()` is true; the limit only turns a hang into a failure."""
    deadline = asyncio.get_running_loop().time() + within
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"never {what}"
        await asyncio.sleep(0.01)


@pytest.fixture
async def proxy(cluster: object) -> AsyncIterator[TcpProxy]:
    plane = cluster.plane  # type: ignore[attr-defined]
    async with TcpProxy("127.0.0.1", plane.port) as started:
        yield started


async def test_sigterm_lets_a_slow_request_finish_and_exits_cleanly(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path, tmp_path: Path, proxy: TcpProxy
) -> None:
    route = f"slow-{namespace}"
    admin.create(crs.llm(namespace, "slow", service_id=route))
    kubeconfig = proxy.kubeconfig(slo_api_kubeconfig, tmp_path / "proxied.kubeconfig")
    process = await start_process(kubeconfig, tmp_path, SHUTDOWN_GRACE_SECONDS="1")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=process.url, timeout=30) as client:
        proxy.delay = 2.0  # the API server now answers slowly
        slow = asyncio.create_task(client.get(f"/routes/{route}", headers=auth))
        # SIGTERM once the API server's answer to the read is being held back.
        await _until(lambda: proxy.delayed > 0, "the read's answer held by the proxy")
        process.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            during = await client.get("/readyz")
            while during.status_code == 200:  # until the signal has been handled
                during = await client.get("/readyz")
        assert during.status_code == 503
        assert during.json()["reason"] == "shutting down"
        finished = await slow
        assert finished.status_code == 200
        assert finished.json()["route"] == route
    assert process.proc.wait(timeout=30) == 0
    text = process.log.read_text()
    assert "Unclosed client session" not in text
    assert "Unclosed connector" not in text
    assert TOKEN not in text


async def test_json_logs_carry_request_ids_and_one_audit_line_per_write(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path, tmp_path: Path
) -> None:
    route = f"logged-{namespace}"
    admin.create(
        crs.llm(
            namespace, "logged", service_id=route, maximumDeployment={"type": "replica", "value": 3}
        )
    )
    process = await start_process(slo_api_kubeconfig, tmp_path)
    try:
        auth = {"Authorization": f"Bearer {TOKEN}", "X-Request-Id": "req-42"}
        async with httpx.AsyncClient(base_url=process.url) as client:
            for _ in range(100):
                if (await client.get(f"/routes/{route}", headers=auth)).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            written = await client.put(
                f"/routes/{route}", json={"priority": 3, "maximumDeployment": None}, headers=auth
            )
            assert written.status_code == 200
            dry = await client.put(
                f"/routes/{route}?dryRun=true", json={"priority": 4}, headers=auth
            )
            assert dry.status_code == 200
    finally:
        process.proc.terminate()
        process.proc.wait(timeout=30)
    lines = process.lines()
    assert all("unparsed" not in line for line in lines), lines
    audits = [line for line in lines if line.get("audit")]
    assert [(a["dry_run"], a["fields"], a["role"], a["outcome"]) for a in audits] == [
        (False, ["maximumDeployment", "priority"], "write", 200),
        (True, ["priority"], "write", 200),
    ]
    # The caller's id beside slo-api's own, which is unique per request.
    assert all(a["client_request_id"] == "req-42" and a["route"] == route for a in audits)
    assert len({a["request_id"] for a in audits}) == len(audits)
    assert any(str(line.get("logger", "")).startswith("uvicorn") for line in lines)
    assert TOKEN not in process.log.read_text()


async def test_metrics_move_with_requests_and_watch_events(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    def sample(text: str, name: str, **labels: str) -> float:
        for line in text.splitlines():
            if line.startswith((name + "{", name + " ")) and all(
                f'{k}="{v}"' in line for k, v in labels.items()
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = (await service.client.get("/metrics")).text
    route = f"metered-{namespace}"
    admin.create(crs.llm(namespace, "metered", service_id=route))
    await service.eventually(lambda: service.indexed(route), what="indexed")
    assert (await service.get(f"/routes/{route}")).status_code == 200
    after = (await service.client.get("/metrics")).text
    assert sample(after, "slo_api_watch_events_total", kind="llm", type="added") > sample(
        before, "slo_api_watch_events_total", kind="llm", type="added"
    )
    assert (
        sample(
            after,
            "slo_api_http_requests_total",
            method="GET",
            route="/routes/{route:path}",
            status="200",
        )
        >= 1
    )
    assert sample(after, "slo_api_upstream_requests_total", verb="get", code="200") >= 1
    assert sample(after, "slo_api_kind_synced", kind="pool") == 1
    assert (await service.put(f"/routes/{route}", {"priority": 2})).status_code == 200
    written = (await service.client.get("/metrics")).text
    assert sample(written, "slo_api_writes_total", kind="llm", outcome="200") >= 1
    assert sample(after, "slo_api_index_objects", kind="llm") >= 1
    # The index's size estimate follows what it holds: at least the encoded CRs.
    assert sample(after, "slo_api_index_estimated_bytes") >= 400 * sample(
        after, "slo_api_index_objects", kind="llm"
    )
    assert route not in after
    assert TOKEN not in after


def test_the_process_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLO_API_")}
    result = subprocess.run(
        [sys.executable, "-m", "slo_api"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "SLO_API_TOKEN" in result.stderr
