"""A change stream outlives neither its token nor its RoleBinding, and a namespace it may read
that gains its first CR joins it in place (DESIGN §3 Auth)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration import test_kubernetes_auth as kauth
from tests.integration.test_kubernetes_auth import RBAC, World, _wait_indexed
from tests.integration.test_watch_stream import WITHIN, Stream, initial, served

pytestmark = pytest.mark.integration
world = kauth.world  # the namespaces, routes and ServiceAccounts of the identity tests


async def test_a_deleted_service_account_or_removed_binding_ends_the_stream_with_an_error(
    admin: Admin, slo_api_kubeconfig: Path, world: World
) -> None:
    async with served(
        slo_api_kubeconfig,
        slo_api_kubernetes_auth=True,
        token_review_seconds=1,
        access_allowed_seconds=1,
        watch_access_seconds=1,
    ) as (service, client):
        await _wait_indexed(service, world)
        streams = {}
        for who in ("editor", "viewer"):
            response = await client.send(
                client.build_request(
                    "GET", "/config", params={"watch": "true"}, headers=world.auth(who)
                ),
                stream=True,
            )
            assert response.status_code == 200, await response.aread()
            streams[who] = Stream(response)
            routes = {e.get("route") for e in await streams[who].until(initial)}
            # Each sees its own namespace's routes, not the other's.
            mine, theirs = (world.a, world.b) if who == "editor" else (world.b, world.a)
            assert f"{mine}-llm" in routes
            assert f"{theirs}-llm" not in routes
        try:
            await asyncio.to_thread(admin.delete, RBAC, "RoleBinding", world.a, "editor")
            events = await streams["editor"].until(lambda e: e["type"] == "ERROR", WITHIN)
            assert events[-1]["error"]["code"] == "forbidden"
            await asyncio.to_thread(admin.delete, "v1", "ServiceAccount", world.people, "viewer")
            events = await streams["viewer"].until(lambda e: e["type"] == "ERROR", WITHIN)
            assert events[-1]["error"]["code"] == "unauthorized"
            for stream in streams.values():
                # The response is finished after the ERROR line.
                async with asyncio.timeout(WITHIN):
                    assert [line async for line in stream.lines if line] == []
        finally:
            for stream in streams.values():
                await stream.response.aclose()


async def test_a_full_view_stream_shows_a_members_pool_only_where_config_does(
    admin: Admin, slo_api_kubeconfig: Path, world: World
) -> None:
    """A caller who may list and watch LLM SLOs in a namespace but not its ModelPools."""
    a = world.a
    admin.create(
        {
            "apiVersion": RBAC,
            "kind": "Role",
            "metadata": {"name": "llm-reader", "namespace": a},
            "rules": [
                {
                    "apiGroups": ["inference.modelsphere.dev"],
                    "resources": ["llmslorequirements"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        }
    )
    admin.create(kauth._service_account(world.people, "llm-reader"))
    binding = kauth._binding(a, "llm-reader", "llm-reader", world.people, "llm-reader")
    binding["roleRef"]["kind"] = "Role"
    admin.create(binding)
    token = admin.service_account_token(world.people, "llm-reader")
    callers = {"llm-reader": {"Authorization": f"Bearer {token}"}, "editor": world.auth("editor")}
    async with served(slo_api_kubeconfig, slo_api_kubernetes_auth=True) as (service, client):
        await _wait_indexed(service, world)
        for who, auth in callers.items():
            params = {"view": "full", "kind": "llm"}
            page = (await client.get("/config", params=params, headers=auth)).json()
            [listed] = [i for i in page["items"] if i["route"] == f"{a}-llm"]
            request = client.build_request(
                "GET", "/config", params={**params, "watch": "true"}, headers=auth
            )
            response = await client.send(request, stream=True)
            try:
                assert response.status_code == 200, await response.aread()
                events = await Stream(response).until(initial)
            finally:
                await response.aclose()
            [streamed] = [e["object"] for e in events if e.get("route") == f"{a}-llm"]
            # The editor may list the namespace's ModelPools (slo-api-edit); the reader not.
            assert ("pool" in streamed) is ("pool" in listed) is (who == "editor"), who


async def test_a_namespace_that_gains_its_first_cr_joins_an_open_stream(
    admin: Admin, slo_api_kubeconfig: Path, world: World
) -> None:
    """`viewer` may also read a namespace with no CR yet: its first CR arrives on the open
    stream as an ADDED (no `expired`, no resync), re-checks going on meanwhile."""
    later = f"{world.a.removesuffix('-a')}-later"
    admin.ensure_namespace(later)
    admin.create(kauth._binding(later, "viewer", "slo-api-view", world.people, "viewer"))
    async with served(slo_api_kubeconfig, slo_api_kubernetes_auth=True, watch_access_seconds=1) as (
        service,
        client,
    ):
        await _wait_indexed(service, world)
        request = client.build_request(
            "GET", "/config", params={"watch": "true", "kind": "llm"}, headers=world.auth("viewer")
        )
        response = await client.send(request, stream=True)
        try:
            assert response.status_code == 200, await response.aread()
            stream = Stream(response)
            routes = {e.get("route") for e in await stream.until(initial)}
            assert f"{world.b}-llm" in routes
            await asyncio.to_thread(admin.create, crs.llm(later, f"{later}-llm"))
            events = await stream.until(lambda e: e.get("route") == f"{later}-llm", WITHIN)
            assert [e["type"] for e in events if e["type"] not in ("BOOKMARK",)] == ["ADDED"]
            # A barrier: a later change in the first namespace arrives on the same stream.
            await asyncio.to_thread(
                admin.merge_patch,
                crs.SLO,
                "LLMSLORequirement",
                world.b,
                f"{world.b}-llm",
                {"spec": {"priority": 4}},
            )
            events = await stream.until(lambda e: e.get("route") == f"{world.b}-llm", WITHIN)
            assert [e["type"] for e in events if e["type"] != "BOOKMARK"] == ["MODIFIED"]
        finally:
            await response.aclose()
