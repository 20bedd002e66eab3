"""Change-stream revisions mean the same on every replica (two slo-api processes on one
control plane), and nothing partial survives a restart."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration.process import TOKEN, Process, start_process
from tests.integration.tcpproxy import TcpProxy

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
LLM = (crs.SLO, "LLMSLORequirement")
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WITHIN = 30.0


@contextlib.asynccontextmanager
async def processes(kubeconfig: Path, tmp: Path, count: int) -> AsyncIterator[list[Process]]:
    started: list[Process] = []
    try:
        for i in range(count):
            (tmp / str(i)).mkdir()
            started.append(await start_process(kubeconfig, tmp / str(i)))
        yield started
    finally:
        for process in started:
            if process.proc.poll() is None:
                process.proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(process.proc.wait, 30)


async def config_items(client: httpx.AsyncClient) -> dict[str, Obj]:
    items: dict[str, Obj] = {}
    page = 1
    while True:
        body = (await client.get("/config", params={"page": page, "pageSize": 200})).json()
        items.update({item["route"]: item for item in body["items"]})
        if page * 200 >= body["total"]:
            return items
        page += 1


def apply(state: dict[str, Obj], event: Obj) -> None:
    # At-least-once after a move: an event may repeat what the client already has.
    if event["type"] in ("ADDED", "MODIFIED"):
        state[event["route"]] = event["object"]
    elif event["type"] == "DELETED":
        state.pop(event["route"], None)


async def lines(response: httpx.Response) -> AsyncIterator[Obj]:
    async for line in response.aiter_lines():
        if line:
            yield json.loads(line)


async def test_a_stream_moved_to_another_replica_ends_equal_to_config(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path, tmp_path: Path
) -> None:
    for i in range(4):
        admin.create(crs.llm(namespace, f"mv{i}", service_id=f"mv{i}-{namespace}"))
    async with (
        processes(slo_api_kubeconfig, tmp_path, 2) as (one, two),
        httpx.AsyncClient(base_url=one.url, headers=AUTH, timeout=WITHIN) as a,
        httpx.AsyncClient(base_url=two.url, headers=AUTH, timeout=WITHIN) as b,
    ):
        # Every kind moves on after both replicas listed it (in a running cluster, events and
        # the API server's bookmarks do that): the second replica's history then reaches back
        # to where the first one's watches are. Right after it listed, it knows nothing
        # earlier, and a revision naming a kind not seen moving since is 410 there.
        moved = {f"mvjob-{namespace}", f"mvpool-{namespace}"}
        await asyncio.to_thread(
            admin.create, crs.job(namespace, "mvjob", service_id=f"mvjob-{namespace}")
        )
        await asyncio.to_thread(
            admin.create, crs.pool(namespace, f"mvpool-{namespace}", [f"mv3-{namespace}"])
        )
        state: dict[str, Obj] = {}
        revision = None
        async with a.stream("GET", "/config", params={"watch": "true"}) as response:
            events = lines(response)
            async with asyncio.timeout(WITHIN):
                async for event in events:
                    if event["type"] == "BOOKMARK" and event.get("initial"):
                        revision = event["revision"]
                        if moved <= state.keys():
                            break
                        continue
                    apply(state, event)
                    if revision is not None and moved <= state.keys():
                        revision = event["revision"]
                        break
            await asyncio.to_thread(
                admin.merge_patch, *LLM, namespace, "mv0", {"spec": {"priority": 5}}
            )
            async with asyncio.timeout(WITHIN):
                async for event in events:
                    if event["type"] == "BOOKMARK":
                        continue
                    apply(state, event)
                    revision = event["revision"]
                    if event["route"] == f"mv0-{namespace}":
                        break
        # The client moves to the other replica; the routes change meanwhile.
        await asyncio.to_thread(
            admin.merge_patch, *LLM, namespace, "mv1", {"spec": {"priority": 7}}
        )
        await asyncio.to_thread(admin.delete, *LLM, namespace, "mv2")
        await asyncio.to_thread(
            admin.create, crs.llm(namespace, "mv9", service_id=f"mv9-{namespace}")
        )
        expected_routes = {f"mv{i}-{namespace}" for i in (0, 1, 3, 9)} | moved

        async def settled() -> dict[str, Obj]:
            while True:
                items = await config_items(b)
                mine = {r for r in items if r.endswith(namespace) and r.startswith("mv")}
                if mine == expected_routes and items[f"mv1-{namespace}"]["priority"] == 7:
                    return items
                await asyncio.sleep(0.1)

        async with asyncio.timeout(WITHIN):
            expected = await settled()
        assert revision is not None
        async with b.stream(
            "GET", "/config", params={"watch": "true", "since": revision}
        ) as response:
            assert response.status_code == 200, await response.aread()
            async with asyncio.timeout(WITHIN):
                async for event in lines(response):
                    assert not event.get("initial"), "a resume, not a new initial state"
                    assert event["type"] != "ERROR", event
                    apply(state, event)
                    if state == expected:
                        break
        assert state == expected


async def test_a_resume_after_a_restart_is_410_and_nothing_partial(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path, tmp_path: Path
) -> None:
    admin.create(crs.llm(namespace, "rs", service_id=f"rs-{namespace}"))
    (tmp_path / "first").mkdir()
    first = await start_process(slo_api_kubeconfig, tmp_path / "first")
    try:
        async with (
            httpx.AsyncClient(base_url=first.url, headers=AUTH, timeout=WITHIN) as client,
            client.stream("GET", "/config", params={"watch": "true"}) as response,
        ):
            async with asyncio.timeout(WITHIN):
                async for event in lines(response):
                    if event["type"] == "BOOKMARK" and event.get("initial"):
                        revision = event["revision"]
                        break
    finally:
        first.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(first.proc.wait, 30)
    # A route goes away while no replica runs.
    await asyncio.to_thread(admin.delete, *LLM, namespace, "rs")
    async with (
        processes(slo_api_kubeconfig, tmp_path, 1) as (second,),
        httpx.AsyncClient(base_url=second.url, headers=AUTH, timeout=WITHIN) as client,
    ):
        gone = await client.get("/config", params={"watch": "true", "since": revision})
        assert gone.status_code == 410, gone.text
        assert gone.json()["error"]["code"] == "expired"


async def test_sloctl_watch_prints_deletions_missed_across_a_restart(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path, tmp_path: Path
) -> None:
    keep, gone = f"keep-{namespace}", f"gone-{namespace}"
    admin.create(crs.llm(namespace, "keep", service_id=keep))
    admin.create(crs.llm(namespace, "gone", service_id=gone))
    (tmp_path / "first").mkdir()
    first = await start_process(slo_api_kubeconfig, tmp_path / "first")
    host, port = first.url.removeprefix("http://").split(":")
    proxy = await TcpProxy(host, int(port)).start()
    env = {**os.environ, "SLO_API_URL": f"http://127.0.0.1:{proxy.port}", "SLO_API_TOKEN": TOKEN}
    sloctl = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "slo_api.cli",
        "watch",
        "-o",
        "json",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    second: Process | None = None

    async def mine() -> Obj:
        assert sloctl.stdout is not None
        async with asyncio.timeout(WITHIN):
            while True:
                event: Obj = json.loads(await sloctl.stdout.readline())
                if event["type"] == "RESYNC" or event.get("route") in (keep, gone):
                    return event

    try:
        assert {(await mine())["route"] for _ in range(2)} == {keep, gone}
        first.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(first.proc.wait, 30)
        # While no replica runs: one route goes, the other changes.
        await asyncio.to_thread(admin.delete, *LLM, namespace, "gone")
        await asyncio.to_thread(
            admin.merge_patch, *LLM, namespace, "keep", {"spec": {"priority": 6}}
        )
        (tmp_path / "second").mkdir()
        second = await start_process(slo_api_kubeconfig, tmp_path / "second")
        host, port = second.url.removeprefix("http://").split(":")
        proxy.target = (host, int(port))
        # The old place is 410 on the new process: sloctl takes the whole state again and
        # prints what differs from what it had printed.
        assert (await mine())["type"] == "RESYNC"
        after = [await mine(), await mine()]
        assert sorted((e["type"], e["route"]) for e in after) == [
            ("DELETED", gone),
            ("MODIFIED", keep),
        ]
    finally:
        sloctl.terminate()
        await sloctl.wait()
        await proxy.stop()
        for process in (first, second):
            if process is not None and process.proc.poll() is None:
                process.proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(process.proc.wait, 30)


async def test_a_replica_started_later_resumes_where_nothing_moved_since(
    admin: Admin, namespace: str, slo_api_kubeconfig: Path, tmp_path: Path
) -> None:
    # Both watch this namespace only: what other tests leave behind elsewhere may move.
    env = {"WATCH_NAMESPACES": namespace}
    admin.create(crs.llm(namespace, "still", service_id=f"still-{namespace}"))
    (tmp_path / "first").mkdir()
    first = await start_process(slo_api_kubeconfig, tmp_path / "first", **env)
    try:
        async with (
            httpx.AsyncClient(base_url=first.url, headers=AUTH, timeout=WITHIN) as client,
            client.stream("GET", "/config", params={"watch": "true"}) as response,
        ):
            state: dict[str, Obj] = {}
            async with asyncio.timeout(WITHIN):
                async for event in lines(response):
                    if event["type"] == "BOOKMARK" and event.get("initial"):
                        revision = event["revision"]
                        break
                    apply(state, event)
    finally:
        first.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(first.proc.wait, 30)
    # The cluster moves on (other namespaces, other resources), these routes do not.
    (tmp_path / "second").mkdir()
    second = await start_process(slo_api_kubeconfig, tmp_path / "second", **env)
    try:
        async with (
            httpx.AsyncClient(base_url=second.url, headers=AUTH, timeout=WITHIN) as client,
            client.stream(
                "GET", "/config", params={"watch": "true", "since": revision}
            ) as response,
        ):
            assert response.status_code == 200, await response.aread()
            await asyncio.to_thread(
                admin.merge_patch, *LLM, namespace, "still", {"spec": {"priority": 4}}
            )
            async with asyncio.timeout(WITHIN):
                async for event in lines(response):
                    assert not event.get("initial"), "a resume, not a new initial state"
                    assert event["type"] != "ERROR", event
                    apply(state, event)
                    if state.get(f"still-{namespace}", {}).get("priority") == 4:
                        break
            assert state == await config_items(client)
    finally:
        second.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(second.proc.wait, 30)
