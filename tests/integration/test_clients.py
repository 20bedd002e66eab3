"""What the decision generator and operators use: /config?view=full and sloctl, for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration.process import TOKEN, Process, start_process
from tests.integration.service import RunningService

pytestmark = pytest.mark.integration


async def test_config_full_view_carries_the_whole_bodies(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    llm_route, job_route, pool_route = (f"{n}-{namespace}" for n in ("fl", "fj", "fp"))
    ttft = {"default": {"metrics": [{"type": "p90", "threshold": 0.8}]}}
    admin.create(crs.llm(namespace, "fl", service_id=llm_route, ttft=ttft))
    admin.create(crs.job(namespace, "fj", service_id=job_route))
    admin.create(crs.pool(namespace, pool_route, [llm_route], default=llm_route))
    await service.eventually(
        lambda: all(service.indexed(r) for r in (llm_route, job_route, pool_route)),
        what="indexed",
    )
    seen: dict[str, Any] = {}
    page = 1
    while True:
        body = (
            await service.get("/config", params={"view": "full", "pageSize": 200, "page": page})
        ).json()
        seen.update({i["route"]: i for i in body["items"]})
        if page * 200 >= body["total"]:
            break
        page += 1
    for route in (llm_route, job_route, pool_route):
        assert seen[route] == (await service.get(f"/routes/{route}")).json()
    assert seen[llm_route]["pool"]["route"] == pool_route
    pools = (
        await service.get("/config", params={"view": "full", "kind": "pool", "pageSize": 200})
    ).json()
    assert all(i.get("kind") in ("pool", None) for i in pools["items"])


@pytest.fixture
async def process(slo_api_kubeconfig: Path, tmp_path: Path) -> AsyncIterator[Process]:
    started = await start_process(slo_api_kubeconfig, tmp_path)
    yield started
    started.proc.terminate()
    started.proc.wait(timeout=30)


def sloctl(
    process: Process, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLO_API_URL": process.url, "SLO_API_TOKEN": TOKEN}
    return subprocess.run(
        [sys.executable, "-m", "slo_api.cli", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_sloctl_against_the_real_service(
    admin: Admin, namespace: str, process: Process, tmp_path: Path
) -> None:
    route = f"ctl-{namespace}"
    admin.create(
        crs.llm(
            namespace,
            "ctl",
            service_id=route,
            ttft={"default": {"metrics": [{"type": "p90", "threshold": 0.8}]}},
        )
    )
    job_route = f"ctljob-{namespace}"
    admin.create(crs.job(namespace, "ctljob", service_id=job_route))

    def stored() -> dict[str, Any]:
        spec: dict[str, Any] = admin.get(crs.SLO, "LLMSLORequirement", namespace, "ctl")["spec"]
        return spec

    listed = sloctl(process, "list", "-o", "json")
    while route not in listed.stdout:  # the index follows the watch
        listed = sloctl(process, "list", "-o", "json")
    assert listed.returncode == 0
    assert any(i["route"] == route for i in json.loads(listed.stdout))
    # The table's columns are the summary fields the service's /openapi.json names (x-summary).
    table = sloctl(process, "list", "--kind", "llm")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()}
    assert rows["ROUTE"] == ["ROUTE", "KIND", "PRIORITY", "MIN", "MAX"]
    assert rows[route] == [route, "llm", "0", "replica:1", "-"]  # the CRD's defaults

    got = sloctl(process, "get", route, "-o", "json")
    assert got.returncode == 0
    assert json.loads(got.stdout)["ttft"]["default"]["metrics"][0]["threshold"] == 0.8

    dry = sloctl(process, "set", route, "ttft.default.p90=0.5", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert stored()["ttft"]["default"]["metrics"][0]["threshold"] == 0.8

    changed = sloctl(process, "set", route, "ttft.default.p90=0.5", "max=replica:4")
    assert changed.returncode == 0, changed.stderr
    assert stored()["ttft"]["default"]["metrics"] == [{"type": "p90", "threshold": 0.5}]
    assert stored()["maximumDeployment"] == {"type": "replica", "value": 4}

    body = tmp_path / "job.yaml"
    body.write_text(f"route: {job_route}\nqueue:\n  maxDepth: 42\npriority: 10\n")
    applied = sloctl(process, "apply", "-f", str(body))
    assert applied.returncode == 0, applied.stderr
    job_spec = admin.get(crs.SLO, "JobSLORequirement", namespace, "ctljob")["spec"]
    assert job_spec["queue"]["maxDepth"] == 42
    assert job_spec["priority"] == 10

    bad = sloctl(process, "set", route, "ttft.default.p90=-1")
    assert bad.returncode == 2
    assert "threshold" in bad.stderr
    assert "Traceback" not in bad.stderr

    reset = sloctl(process, "reset", route)
    assert reset.returncode == 0, reset.stderr
    assert "ttft" not in stored()
    assert stored()["priority"] == 0

    missing = sloctl(process, "get", f"nope-{namespace}")
    assert missing.returncode == 3
