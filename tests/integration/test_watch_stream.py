"""`GET /config?watch=true` against the real control plane, over a real socket.

slo-api runs in-process (so a test can reach its index) behind uvicorn on a loopback port:
httpx's in-process transport would buffer a stream that never ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from controlplane.admin import Admin
from controlplane.server import free_port
from tests.integration import crs
from tests.integration.process import TOKEN as PROCESS_TOKEN
from tests.integration.process import start_process
from tests.integration.service import AUTH, RunningService, running
from tests.integration.tcpproxy import TcpProxy

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
LLM = (crs.SLO, "LLMSLORequirement")
JOB = (crs.SLO, "JobSLORequirement")
WITHIN = 20.0  # generous: arrival is asserted, speed is measured in the bench


@contextlib.asynccontextmanager
async def served(
    kubeconfig: Path, **overrides: Any
) -> AsyncIterator[tuple[RunningService, httpx.AsyncClient]]:
    async with running(kubeconfig, **overrides) as service:
        port = free_port()
        config = uvicorn.Config(
            service.app,
            host="127.0.0.1",
            port=port,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        try:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=WITHIN
            ) as client:
                yield service, client
        finally:
            service.runtime.feed.close_all()
            server.should_exit = True
            await task


class Stream:
    """One open watch, read line by line."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()

    async def next(self, within: float = WITHIN) -> Obj:
        async with asyncio.timeout(within):
            while True:
                line = await anext(self.lines)
                if line:
                    event: Obj = json.loads(line)
                    return event

    async def until(self, check: Any, within: float = WITHIN) -> list[Obj]:
        """Events up to and including the first for which `check(event)` holds."""
        seen = []
        async with asyncio.timeout(within):
            while True:
                event = await self.next(within)
                seen.append(event)
                if check(event):
                    return seen


@contextlib.asynccontextmanager
async def watch(client: httpx.AsyncClient, **params: str) -> AsyncIterator[Stream]:
    async with client.stream("GET", "/config", params={"watch": "true", **params}) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("application/x-ndjson")
        yield Stream(response)


def initial(event: Obj) -> bool:
    return event["type"] == "BOOKMARK" and bool(event.get("initial"))


async def config_items(client: httpx.AsyncClient, view: str = "summary") -> dict[str, Obj]:
    items: dict[str, Obj] = {}
    page = 1
    while True:
        body = (
            await client.get("/config", params={"page": page, "pageSize": 200, "view": view})
        ).json()
        items.update({item["route"]: item for item in body["items"]})
        if page * 200 >= body["total"]:
            return items
        page += 1


async def test_an_admin_change_reaches_a_watcher(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    route = f"live-{namespace}"
    admin.create(crs.llm(namespace, "live", service_id=route, priority=1))
    async with served(slo_api_kubeconfig) as (_, client), watch(client, view="full") as stream:
        start = await stream.until(initial)
        [added] = [e for e in start if e.get("route") == route]
        assert added["type"] == "ADDED"
        assert added["object"]["priority"] == 1
        assert added["object"] == (await client.get(f"/config/{route}")).json()
        await asyncio.to_thread(
            admin.merge_patch, *LLM, namespace, "live", {"spec": {"priority": 7}}
        )
        [changed] = [
            e
            for e in await stream.until(lambda e: e.get("route") == route)
            if e.get("route") == route
        ]
        assert changed["type"] == "MODIFIED"
        assert changed["object"]["priority"] == 7
        await asyncio.to_thread(admin.delete, *LLM, namespace, "live")
        gone = (await stream.until(lambda e: e.get("route") == route))[-1]
        assert gone["type"] == "DELETED"
        assert gone["route"] == route


async def test_a_watcher_resuming_with_since_through_churn_ends_with_what_config_shows(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    names = [f"churn{i}" for i in range(6)]
    rng = random.Random(15)

    cycles = 0

    def churn(rounds: int) -> None:
        # At least `rounds` changes, and on until ten streams have been cut and resumed while
        # it goes on (a loaded machine may take longer for each).
        live: set[str] = set()
        step = -1
        while (step := step + 1) < rounds or cycles < 10:
            name = rng.choice(names)
            if name in live and rng.random() < 0.3:
                admin.delete(*LLM, namespace, name)
                live.discard(name)
            else:
                route = f"{name}-{namespace}"
                admin.apply(crs.llm(namespace, name, service_id=route, priority=step % 11))
                live.add(name)

    # More routes than one connection reads (1 to 12 events): some streams are cut inside
    # their initial state, which must never become a place to resume from.
    for i in range(30):
        admin.create(crs.llm(namespace, f"standing{i}", service_id=f"standing{i}-{namespace}"))
    # A short flush, so many streams are cut and resumed while the churn is still going.
    async with served(slo_api_kubeconfig, watch_flush_seconds=0.1) as (service, client):
        state: dict[str, Obj] = {}
        last_revision: str | None = None
        last_seq = -1
        worker = asyncio.create_task(asyncio.to_thread(churn, 120))
        while not worker.done() or last_revision is None:
            cycles += 1
            params = {"since": last_revision} if last_revision else {}
            # Without `since` the stream starts over with the whole state: one cut inside
            # it is no place to resume from, so what it had given is dropped with it.
            resumable = last_revision is not None
            if not resumable:
                state.clear()
                last_seq = -1
            async with watch(client, **params) as stream:
                # Read a few events (or, while idle, a bookmark), then drop the connection;
                # a stream starting over is sometimes cut inside its initial state, and
                # otherwise read through it (however many routes the cluster holds).
                reads = rng.randint(1, 12)
                cut_inside = not resumable and rng.random() < 0.5
                while reads > 0 or not (resumable or cut_inside):
                    reads -= 1
                    try:
                        event = await stream.next(within=1.0)
                    except TimeoutError:
                        break
                    if event["type"] == "BOOKMARK":
                        if resumable or event.get("initial"):
                            resumable = True
                            last_revision = event["revision"]
                        continue
                    if resumable:
                        seq = service.runtime.feed.log.sequence(event["revision"])
                        assert seq > last_seq, f"repeated or out of order: {event}"
                        last_seq = seq
                        last_revision = event["revision"]
                    else:
                        # Inside the initial state: no place to resume from is offered.
                        assert "revision" not in event, event
                    route = event["route"]
                    if event["type"] == "ADDED":
                        assert route not in state, f"ADDED twice: {event}"
                        state[route] = event["object"]
                    elif event["type"] == "MODIFIED":
                        assert route in state, f"MODIFIED before ADDED: {event}"
                        assert state[route] != event["object"], f"no real change: {event}"
                        state[route] = event["object"]
                    else:
                        assert event["type"] == "DELETED", event
                        assert state.pop(route, None) is not None, f"DELETED twice: {event}"
        await worker
        # Let the index take the last change, then read to the feed's head.
        expected = await _settled(admin, service, client, namespace)
        feed = service.runtime.feed
        if last_revision != feed.revision(feed.head):
            async with watch(client, since=str(last_revision)) as stream:
                for event in await stream.until(
                    lambda e: e["revision"] == feed.revision(feed.head)
                ):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        state[event["route"]] = event["object"]
                    elif event["type"] == "DELETED":
                        del state[event["route"]]
        assert state == expected


async def _settled(
    admin: Admin, service: RunningService, client: httpx.AsyncClient, namespace: str
) -> Obj:
    listed = {
        o["spec"]["serviceId"]: o["metadata"]["resourceVersion"]
        for o in await asyncio.to_thread(admin.list, *LLM, namespace)
    }

    def caught_up() -> bool:
        ours = {
            route: obj["metadata"]["resourceVersion"]
            for route in service.runtime.index.routes("llm")
            if route.endswith(namespace)
            for _, obj in service.indexed(route)
        }
        return ours == listed

    await service.eventually(caught_up, what="the index to take the last change")
    return await config_items(client)


def indexed_in(service: RunningService, namespace: str) -> list[Obj]:
    items = service.runtime.index.objects("llmslorequirements")
    return [o for o in items if o["metadata"]["namespace"] == namespace]


async def test_a_revision_older_than_the_history_is_410(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    async with served(slo_api_kubeconfig, watch_history_bytes=8000) as (service, client):
        async with watch(client) as stream:
            first = (await stream.until(initial))[-1]["revision"]
        # The watcher is gone: 40 changes later its place has left a history of 8,000 bytes.
        for i in range(40):
            route = f"old{i}-{namespace}"
            await asyncio.to_thread(admin.create, crs.llm(namespace, f"old{i}", service_id=route))
        await service.eventually(lambda: service.indexed(f"old39-{namespace}"))
        gone = await client.get("/config", params={"watch": "true", "since": first})
        assert gone.status_code == 410
        assert gone.json()["error"]["code"] == "expired"
        # Starting over works.
        async with watch(client) as stream:
            routes = {e.get("route") for e in await stream.until(initial)}
            assert f"old39-{namespace}" in routes


async def test_a_stalled_reader_is_dropped_while_other_watchers_and_the_index_keep_up(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    route = f"busy-{namespace}"
    created = admin.create(crs.job(namespace, "busy", service_id=route))
    burst = 2000
    async with served(slo_api_kubeconfig, watch_history_bytes=2 << 20) as (service, client):
        url, token = str(client.base_url), AUTH["Authorization"]
        stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", client.base_url.port))
        stalled.sendall(
            f"GET /config?watch=true&view=full HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {token}\r\n\r\n".encode()
        )
        feed = service.runtime.feed
        await service.eventually(lambda: len(feed.streams) == 1, what="the stalled watcher")
        opened = asyncio.Event()
        loop = asyncio.get_running_loop()
        prefix = f"{route}-"

        def read_healthy() -> list[Obj]:
            """A reader on a thread of its own, as a separate client would be."""
            seen = []
            with (
                httpx.Client(base_url=url, headers=AUTH, timeout=WITHIN) as sync,
                sync.stream("GET", "/config", params={"watch": "true", "view": "full"}) as r,
            ):
                for line in r.iter_lines():
                    event = json.loads(line)
                    if initial(event):
                        loop.call_soon_threadsafe(opened.set)
                    if event.get("route", "").startswith(prefix) or event["type"] == "ERROR":
                        seen.append(event)
                    if len(seen) >= burst or event["type"] == "ERROR":
                        return seen
            return seen

        healthy = asyncio.create_task(asyncio.to_thread(read_healthy))
        await asyncio.wait_for(opened.wait(), WITHIN)
        # A burst of new routes as a busy cluster's watch would deliver it, ~4 kB an event in
        # full view: more than the history's 2 MiB and the stalled reader's socket buffers.
        index = service.runtime.index
        queue = {"maxDepth": 1, "promql": "x" * 4000}
        for n in range(burst):
            meta = {
                **created["metadata"],
                "name": f"busy-{n}",
                "uid": f"uid-{n}",
                "resourceVersion": str(10**9 + n),
            }
            spec = {**created["spec"], "serviceId": f"{prefix}{n}", "queue": queue}
            assert index.upsert("jobslorequirements", {**created, "metadata": meta, "spec": spec})
            if n % 5 == 0:
                await asyncio.sleep(0.002)
        dropped = service.runtime.metrics.watchers_dropped.labels("too_slow")
        await service.eventually(lambda: dropped._value.get() >= 1, what="the drop")
        received = await asyncio.wait_for(healthy, 60)
        # The healthy watcher saw every change and was not dropped.
        assert [e["type"] for e in received] == ["ADDED"] * burst
        assert {e["route"] for e in received} == {f"{prefix}{n}" for n in range(burst)}
        await service.eventually(lambda: len(feed.streams) <= 1, what="the stalled stream ended")
        stalled.close()
        await service.eventually(lambda: not feed.streams, what="both streams to close")


async def test_a_forced_relist_sends_only_the_real_differences(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    for i in range(5):
        admin.create(crs.llm(namespace, f"rl{i}", service_id=f"rl{i}-{namespace}"))
    async with served(slo_api_kubeconfig, watch_bookmark_seconds=0.3) as (service, client):
        runtime = service.runtime
        plural = "llmslorequirements"
        resource = runtime.service.kinds[plural].resource
        await service.eventually(lambda: len(indexed_in(service, namespace)) == 5)
        async with watch(client) as stream:
            await stream.until(initial)
            before = runtime.feed.head
            listed = (await runtime.kube.list(resource))["items"]
            runtime.index.replace(plural, listed)  # what a relist after a 410 does
            bookmark = await stream.next()
            assert bookmark["type"] == "BOOKMARK"
            assert bookmark["revision"] == runtime.feed.revision(before)
            # A relist that finds one CR gone and one changed: two events, no more.
            mine = [o for o in listed if o["metadata"]["namespace"] == namespace]
            changed = {**mine[1], "spec": {**mine[1]["spec"], "priority": 9}}
            fewer = [o for o in listed if o not in (mine[0], mine[1])] + [changed]
            runtime.index.replace(plural, fewer)
            events = await stream.until(lambda e: e["type"] == "BOOKMARK")
            assert sorted((e["type"], e["route"]) for e in events[:-1]) == [
                ("DELETED", f"rl0-{namespace}"),
                ("MODIFIED", f"rl1-{namespace}"),
            ]
            # Back in line with the API server for the tests that follow.
            runtime.index.replace(plural, (await runtime.kube.list(resource))["items"])


async def test_sse_carries_the_revision_as_id_and_last_event_id_resumes(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    route = f"sse-{namespace}"
    admin.create(crs.llm(namespace, "sse", service_id=route))
    async with served(slo_api_kubeconfig) as (service, client):
        sse = {"Accept": "text/event-stream"}
        async with client.stream("GET", "/config?watch=true", headers=sse) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            frames = _sse_frames(response)
            while True:
                event_id, data = await anext(frames)
                if initial(data):
                    assert data["revision"] == event_id
                    resume_at = event_id
                    break
                # Nothing inside the initial state is a place to resume from.
                assert event_id == ""
                assert "revision" not in data
        await asyncio.to_thread(
            admin.merge_patch, *LLM, namespace, "sse", {"spec": {"priority": 3}}
        )
        async with client.stream(
            "GET", "/config?watch=true", headers={**sse, "Last-Event-ID": resume_at}
        ) as response:
            async with asyncio.timeout(WITHIN):
                event_id, data = await anext(_sse_frames(response))
        assert data["type"] == "MODIFIED"
        assert data["route"] == route
        assert data["object"]["priority"] == 3
        # Streams are counted under a label of their own, apart from /config's page latencies.
        registry = service.runtime.metrics.registry
        labels = {"method": "GET", "route": "/config?watch=true", "status": "200"}
        await service.eventually(
            lambda: registry.get_sample_value("slo_api_http_requests_total", labels) == 2,
            what="both streams counted",
        )
        page = {"method": "GET", "route": "/config", "status": "200"}
        assert registry.get_sample_value("slo_api_http_requests_total", page) is None


async def _sse_frames(response: httpx.Response) -> AsyncIterator[tuple[str, Obj]]:
    """(id, data) of each SSE event; id "" when the event has none."""
    event_id = ""
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            yield event_id, json.loads(line[6:])
            event_id = ""


# Characters JSON may carry raw that Python's line readers (str.splitlines, httpx's
# aiter_lines) end a line at: NEL, LINE SEPARATOR, PARAGRAPH SEPARATOR.
LINE_BREAKERS = "\u0085\u2028\u2029"


async def test_a_field_holding_unicode_line_breaks_arrives_as_one_line_in_both_framings(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    route = f"breaks-{namespace}"
    promql = f'sum(jobs_pending{{note="a{LINE_BREAKERS}b"}})'
    admin.create(
        crs.job(namespace, "breaks", service_id=route, queue={"maxDepth": 20, "promql": promql})
    )
    async with served(slo_api_kubeconfig) as (service, client):
        await service.eventually(lambda: service.indexed(route), what=f"{route} indexed")
        async with watch(client, view="full") as stream:
            start = await stream.until(initial)
            [added] = [e for e in start if e.get("route") == route]
            assert added["object"]["queue"]["promql"] == promql
            changed = promql.replace("a", "c", 1)
            await asyncio.to_thread(
                admin.merge_patch,
                *JOB,
                namespace,
                "breaks",
                {"spec": {"queue": {"promql": changed}}},
            )
            modified = (await stream.until(lambda e: e.get("route") == route))[-1]
            assert modified["type"] == "MODIFIED"
            assert modified["object"]["queue"]["promql"] == changed
        sse = {"Accept": "text/event-stream"}
        params = {"watch": "true", "view": "full"}
        async with client.stream("GET", "/config", params=params, headers=sse) as response:
            async with asyncio.timeout(WITHIN):
                async for _, data in _sse_frames(response):
                    if data.get("route") == route:
                        assert data["object"]["queue"]["promql"] == changed
                        break


async def test_sigterm_ends_every_stream_and_exits_though_a_client_stopped_reading(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path, tmp_path: Path
) -> None:
    # Big routes: the full view's initial state (~6 MB) is far more than socket buffers hold.
    for i in range(60):
        queue = {"maxDepth": 1, "promql": f"q{i}" + "x" * 100_000}
        admin.create(crs.job(namespace, f"big{i}", service_id=f"big{i}-{namespace}", queue=queue))
    process = await start_process(slo_api_kubeconfig, tmp_path, SHUTDOWN_GRACE_SECONDS="0.5")
    stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        auth = {"Authorization": f"Bearer {PROCESS_TOKEN}"}
        host, port = process.url.removeprefix("http://").split(":")
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((host, int(port)))
        stalled.sendall(
            f"GET /config?watch=true&view=full HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {auth['Authorization']}\r\n\r\n".encode()
        )
        async with (
            httpx.AsyncClient(base_url=process.url, headers=auth, timeout=WITHIN) as client,
            contextlib.AsyncExitStack() as stack,
        ):
            streams = [
                Stream(
                    await stack.enter_async_context(
                        client.stream("GET", "/config", params={"watch": "true"})
                    )
                )
                for _ in range(3)
            ]
            for stream in streams:
                await stream.until(initial)
            stalled.recv(1)  # its response has started: it is stuck writing the rest
            process.proc.send_signal(signal.SIGTERM)
            for stream in streams:
                # The stream ends (the chunked body is finished), not an error.
                async with asyncio.timeout(WITHIN):
                    rest = [line async for line in stream.lines]
                assert all(json.loads(x)["type"] == "BOOKMARK" for x in rest if x)
        # Well inside a pod's 30 s grace period, whatever the stalled client does.
        assert await asyncio.to_thread(process.proc.wait, 15) == 0
        logged = process.log.read_text()
        assert "Traceback" not in logged
        assert "Unclosed" not in logged
    finally:
        stalled.close()
        if process.proc.poll() is None:
            process.proc.kill()
        for i in range(60):
            await asyncio.to_thread(admin.delete, *JOB, namespace, f"big{i}")


async def test_an_sse_client_cut_inside_the_initial_state_gets_all_of_it_again(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path, tmp_path: Path
) -> None:
    for i in range(3):
        admin.create(crs.llm(namespace, f"cut{i}", service_id=f"cut{i}-{namespace}"))
    process = await start_process(slo_api_kubeconfig, tmp_path)
    try:
        auth = {"Authorization": f"Bearer {PROCESS_TOKEN}", "Accept": "text/event-stream"}
        async with httpx.AsyncClient(base_url=process.url, headers=auth, timeout=WITHIN) as c:
            # What an EventSource does: remember the last id seen; reconnect with it.
            last_event_id = None
            async with c.stream("GET", "/config?watch=true") as response:
                assert response.headers["cache-control"] == "no-cache, no-transform"
                async for line in response.aiter_lines():
                    if line.startswith("id: "):
                        last_event_id = line[4:]
                    if line.startswith("data: ") and '"ADDED"' in line:
                        break  # cut inside the initial state
            assert last_event_id is None
            routes = set()
            async with c.stream("GET", "/config?watch=true") as response:
                async for _, data in _sse_frames(response):
                    if initial(data):
                        break
                    routes.add(data["route"])
            assert {f"cut{i}-{namespace}" for i in range(3)} <= routes
    finally:
        process.proc.terminate()
        await asyncio.to_thread(process.proc.wait, 30)


async def test_sloctl_watch_resumes_after_a_dropped_connection_without_missing_or_repeating(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    route = f"ctl-{namespace}"
    admin.create(crs.llm(namespace, "ctl", service_id=route, priority=1))
    async with served(slo_api_kubeconfig) as (_, client):
        proxy = await TcpProxy("127.0.0.1", client.base_url.port or 80).start()
        env = {
            **os.environ,
            "SLO_API_URL": f"http://127.0.0.1:{proxy.port}",
            "SLO_API_TOKEN": AUTH["Authorization"].split()[1],
        }
        sloctl = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "slo_api.cli",
            "watch",
            "--kind",
            "llm",
            "-o",
            "json",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert sloctl.stdout is not None
        assert sloctl.stderr is not None

        async def next_of_route() -> Obj:
            assert sloctl.stdout is not None
            async with asyncio.timeout(WITHIN):
                while True:
                    event: Obj = json.loads(await sloctl.stdout.readline())
                    if event["route"] == route:
                        return event

        try:
            assert (await next_of_route())["object"]["priority"] == 1
            await asyncio.to_thread(
                admin.merge_patch, *LLM, namespace, "ctl", {"spec": {"priority": 2}}
            )
            assert (await next_of_route())["object"]["priority"] == 2
            proxy.cut()  # the connection drops; the change below happens while it is down
            await asyncio.to_thread(
                admin.merge_patch, *LLM, namespace, "ctl", {"spec": {"priority": 3}}
            )
            resumed = await next_of_route()
            assert (resumed["type"], resumed["object"]["priority"]) == ("MODIFIED", 3)
            async with asyncio.timeout(WITHIN):
                assert "resuming" in (await sloctl.stderr.readline()).decode()
            await asyncio.to_thread(admin.delete, *LLM, namespace, "ctl")
            assert (await next_of_route())["type"] == "DELETED"
        finally:
            sloctl.terminate()
            await sloctl.wait()
            await proxy.stop()


async def test_a_pools_membership_reaches_its_members_stream_and_ambiguity_shows(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path
) -> None:
    member = f"member-{namespace}"
    admin.create(crs.llm(namespace, "member", service_id=member))
    async with (
        served(slo_api_kubeconfig) as (_, client),
        watch(client, view="full") as stream,
    ):
        await stream.until(initial)
        pool = f"pool-{namespace}"
        await asyncio.to_thread(admin.create, crs.pool(namespace, pool, [member]))
        changed = (await stream.until(lambda e: e.get("route") == member))[-1]
        assert changed["type"] == "MODIFIED"
        assert changed["object"]["pool"]["route"] == pool
        # A second CR claiming the route makes it ambiguous: the line says so.
        await asyncio.to_thread(admin.create, crs.job(namespace, "member-job", service_id=member))
        ambiguous = (await stream.until(lambda e: e.get("route") == member))[-1]
        assert ambiguous["type"] == "MODIFIED"
        assert ambiguous["object"]["ambiguous"] is True
        assert ambiguous["object"]["kinds"] == ["job", "llm"]
