"""A change stream outlives neither its token nor its RoleBinding (DESIGN §3 Auth)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controlplane.admin import Admin
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
