"""Faults slo-api must survive (DESIGN §3 Writes, §4): the API server going away, a network path
that goes silent, a slow API server, and RBAC taken away.

Everything here runs on a control plane of this module's own (stopping its API server or
revoking RBAC must not disturb the session cluster the other modules share).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from controlplane.admin import Admin, load_yaml_dir
from controlplane.cluster import CONFIG, Cluster
from tests.integration import crs
from tests.integration.own import own_control_plane
from tests.integration.service import RunningService, running
from tests.integration.tcpproxy import TcpProxy

pytestmark = pytest.mark.integration

LLM = (crs.SLO, "LLMSLORequirement")
TIMEOUT = 1.5  # upstream_timeout_seconds of the services started here
SLACK = 1.0  # what a test allows on top of the timeout for its own scheduling
BINDING = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/slo-api"
_ids = itertools.count(1)


own, own_admin, kubeconfig = own_control_plane("faults")


@pytest.fixture
def ns(own_admin: Admin) -> str:
    name = f"faults-{next(_ids)}"
    own_admin.ensure_namespace(name)
    return name


@pytest.fixture
async def proxy(own: Cluster) -> AsyncIterator[TcpProxy]:
    async with TcpProxy("127.0.0.1", own.plane.port) as started:
        yield started


def sample(service: RunningService, name: str, **labels: str) -> float:
    return service.runtime.metrics.registry.get_sample_value(name, labels) or 0.0


def error_code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


async def timed_put(
    service: RunningService, route: str, body: object
) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await service.put(f"/routes/{route}", body)
    return response, time.monotonic() - started


async def listed(service: RunningService, route: str) -> bool:
    page = await service.get("/config", params={"pageSize": 200})
    return page.status_code == 200 and route in {i["route"] for i in page.json()["items"]}


async def test_api_server_outage_fails_fast_serves_the_index_and_recovers(
    own: Cluster, own_admin: Admin, kubeconfig: Path, ns: str
) -> None:
    route = f"outage-{ns}"
    own_admin.create(crs.llm(ns, "outage", service_id=route))
    async with running(kubeconfig, upstream_timeout_seconds=TIMEOUT) as service:
        await service.eventually(lambda: service.indexed(route), what="indexed")
        readiness: list[int] = []
        done = asyncio.Event()

        async def traffic() -> None:
            # Readers keep coming through the outage; every /readyz answer is recorded.
            while not done.is_set():
                readiness.append((await service.client.get("/readyz")).status_code)
                await service.get("/config")
                await asyncio.sleep(0.05)

        reader = asyncio.create_task(traffic())
        try:
            assert (await service.put(f"/routes/{route}", {"priority": 1})).status_code == 200
            await asyncio.to_thread(own.plane.stop_apiserver)

            written, took = await timed_put(service, route, {"priority": 2})
            assert written.status_code in (502, 504), written.text
            assert error_code(written) in ("upstream_error", "upstream_timeout")
            assert took < TIMEOUT + SLACK
            assert ns not in written.text
            assert "outage" not in written.json()["error"]["message"]
            started = time.monotonic()
            read = await service.get(f"/routes/{route}")
            assert read.status_code in (502, 504)
            assert time.monotonic() - started < TIMEOUT + SLACK
            page = await service.get("/config", params={"pageSize": 200})
            assert page.status_code == 200
            mine = [i for i in page.json()["items"] if i["route"] == route]
            assert [i["priority"] for i in mine] == [1]

            await asyncio.to_thread(own.plane.start_apiserver)

            async def writes() -> bool:
                return (await service.put(f"/routes/{route}", {"priority": 3})).status_code == 200

            await service.eventually(writes, within=30, what="a write after the restart")
            stored = own_admin.get(*LLM, ns, "outage")
            assert stored["spec"]["priority"] == 3
            later = f"later-{ns}"
            own_admin.create(crs.llm(ns, "later", service_id=later))
            await service.eventually(
                lambda: listed(service, later), within=40, what="a CR created after the restart"
            )
        finally:
            done.set()
            await reader
        assert readiness.count(200) == len(readiness) > 10
        assert all(not t.done() for t in service.runtime._tasks)


async def test_a_silently_dead_connection_heals_by_the_inactivity_timeout(
    own_admin: Admin, kubeconfig: Path, ns: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    proxied = proxy.kubeconfig(kubeconfig, tmp_path / "proxied.kubeconfig")
    async with running(
        proxied, watch_inactivity_seconds=2, upstream_timeout_seconds=TIMEOUT
    ) as service:

        def watching() -> bool:
            # A streamed list is a watch request too: a watch after each list, of the three
            # kinds and of what the guardrails read (namespaces; SLOLimits where served).
            if not all(i.synced for i in service.runtime.informers):
                return False
            if not all(i.synced for i in service.runtime.limit_informers):
                return False
            opened = 3 + sum(i.present for i in service.runtime.limit_informers)
            watches = sample(service, "slo_api_upstream_requests_total", verb="watch", code="200")
            paged = sample(service, "slo_api_upstream_requests_total", verb="list", code="200")
            return watches >= opened + max(0.0, opened - paged)

        await service.eventually(watching, what="every watch open")
        before = sample(service, "slo_api_watch_restarts_total", kind="llm", reason="inactive")
        # Every open connection (the three watches among them) now goes silent without closing,
        # as when a NAT or load balancer drops a flow; only new connections get through.
        assert proxy.freeze() >= 3
        route = f"silent-{ns}"
        own_admin.create(crs.llm(ns, "silent", service_id=route))
        await service.eventually(
            lambda: service.indexed(route), within=20, what="the change behind the dead watch"
        )
        after = sample(service, "slo_api_watch_restarts_total", kind="llm", reason="inactive")
        assert after > before
        assert (await service.client.get("/readyz")).status_code == 200


async def test_a_slow_api_server_is_a_timely_504(
    own_admin: Admin, kubeconfig: Path, ns: str, proxy: TcpProxy, tmp_path: Path
) -> None:
    route = f"slow-{ns}"
    own_admin.create(crs.llm(ns, "slow", service_id=route))
    proxied = proxy.kubeconfig(kubeconfig, tmp_path / "proxied.kubeconfig")
    async with running(proxied, upstream_timeout_seconds=TIMEOUT) as service:
        await service.eventually(lambda: service.indexed(route), what="indexed")
        proxy.delay = TIMEOUT * 3
        written, took = await timed_put(service, route, {"priority": 4})
        assert written.status_code == 504
        assert error_code(written) == "upstream_timeout"
        assert took < TIMEOUT + SLACK
        started = time.monotonic()
        read = await service.get(f"/routes/{route}")
        assert read.status_code == 504
        assert time.monotonic() - started < TIMEOUT + SLACK
        assert (await service.get("/config")).status_code == 200
        proxy.delay = 0

        async def writes() -> bool:
            return (await service.put(f"/routes/{route}", {"priority": 5})).status_code == 200

        await service.eventually(writes, within=15, what="a write once the delay is gone")
        assert own_admin.get(*LLM, ns, "slow")["spec"]["priority"] == 5


async def test_revoked_rbac_is_a_loud_502_and_restoring_it_heals(
    own_admin: Admin, kubeconfig: Path, ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    route = f"rbac-{ns}"
    own_admin.create(crs.llm(ns, "rbac", service_id=route))
    binding = next(o for o in load_yaml_dir(CONFIG / "rbac") if o["kind"] == "ClusterRoleBinding")
    caplog.set_level(logging.ERROR, logger="slo_api")
    async with running(kubeconfig, upstream_timeout_seconds=TIMEOUT) as service:
        await service.eventually(lambda: service.indexed(route), what="indexed")
        own_admin.request("DELETE", BINDING)
        try:

            async def refused() -> httpx.Response | None:
                response = await service.put(f"/routes/{route}", {"priority": 6})
                return response if response.status_code != 200 else None

            written = await service.eventually(refused, what="RBAC revocation to take effect")
            assert written.status_code == 502
            assert error_code(written) == "upstream_error"
            assert ns not in written.text
            assert "rbac" not in written.json()["error"]["message"]
            loud = [
                r for r in caplog.records if r.levelno >= logging.ERROR and "RBAC" in r.getMessage()
            ]
            assert loud, [r.getMessage() for r in caplog.records]
            # No crash: the process keeps serving what it has.
            assert (await service.client.get("/readyz")).status_code == 200
            assert await listed(service, route)
            assert all(not t.done() for t in service.runtime._tasks)
        finally:
            own_admin.apply(binding)

        async def writes() -> bool:
            return (await service.put(f"/routes/{route}", {"priority": 7})).status_code == 200

        await service.eventually(writes, what="writes once the binding is back")
        assert own_admin.get(*LLM, ns, "rbac")["spec"]["priority"] == 7
