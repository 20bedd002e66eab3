"""slo-api running in-process against the test control plane, driven through HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx

from controlplane.admin import Admin
from slo_api.app import create_app
from slo_api.runtime import Runtime
from slo_api.settings import Settings

TOKEN = "test-write-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
_barriers = itertools.count(1)


class RunningService:
    def __init__(self, app: Any, client: httpx.AsyncClient) -> None:
        self.app = app
        self.client = client

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    async def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.client.get(path, headers={**AUTH, **kwargs.pop("headers", {})}, **kwargs)

    async def put(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        return await self.client.put(
            path, json=body, headers={**AUTH, **kwargs.pop("headers", {})}, **kwargs
        )

    async def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return await self.client.delete(
            path, headers={**AUTH, **kwargs.pop("headers", {})}, **kwargs
        )

    async def eventually(
        self, check: Callable[[], Any], within: float = 15, what: str = "condition"
    ) -> Any:
        """Poll until `check()` is truthy (it may be async); the index follows watch events."""
        deadline = time.monotonic() + within
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)

    async def until_ready(self) -> None:
        """Until every kind has synced (what /readyz says 200 for)."""
        await self.eventually(self.runtime.ready, within=60, what="readiness")

    async def config_page_of(self, route: str, **params: Any) -> int:
        """The number of the /config page (pageSize 200) that lists `route`: the session's
        control plane holds whatever earlier tests created, so it may not be the first."""
        page = 1
        while True:
            body = (
                await self.get("/config", params={"pageSize": 200, "page": page, **params})
            ).json()
            if any(item["route"] == route for item in body["items"]):
                return page
            if page * 200 >= body["total"]:
                raise AssertionError(f"{route} is on no /config page")
            page += 1

    def indexed(self, route: str) -> list[Any]:
        return self.runtime.index.claims(route)

    async def barrier(
        self,
        admin: Admin,
        route: str,
        namespace: str,
        name: str,
        api_version: str = "inference.modelsphere.dev/v1alpha1",
        kind: str = "LLMSLORequirement",
    ) -> None:
        """A barrier write: a later change to the CR (an annotation, written around slo-api),
        waited for until the index holds it. A CR's watch events arrive in order, so whatever
        an earlier change would have sent has been seen by then: assert what must be absent
        after this, not after a sleep."""
        barrier = {"metadata": {"annotations": {"tests.slo-api/barrier": str(next(_barriers))}}}
        stored = admin.merge_patch(api_version, kind, namespace, name, barrier)
        version = stored["metadata"]["resourceVersion"]
        await self.eventually(
            lambda: any(
                o["metadata"]["resourceVersion"] == version for _, o in self.indexed(route)
            ),
            what="the barrier write in the index",
        )

    @contextlib.asynccontextmanager
    async def watches_held(self) -> AsyncIterator[None]:
        """The index stops following the API server, as while a watch backs off after an
        outage (what it holds stays); the watches start again (relisting) afterwards."""
        held = [(watch, key) for watch in self.runtime.informers for key in watch._tasks]
        tasks = [watch._tasks[key] for watch, key in held]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            yield
        finally:
            for watch, key in held:
                watch._start(*key)
            await self.until_ready()


@contextlib.asynccontextmanager
async def running(kubeconfig: Path, **overrides: Any) -> AsyncIterator[RunningService]:
    settings = Settings(
        kubeconfig=str(kubeconfig),
        **{
            "slo_api_token": TOKEN,
            "crd_recheck_seconds": 1,
            "upstream_timeout_seconds": 5,
            **overrides,
        },
    )
    async with serving(settings) as service:
        yield service


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[RunningService]:
    """slo-api in-process with exactly these settings, ready (every kind synced)."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://slo-api") as client:
            service = RunningService(app, client)
            await service.until_ready()
            yield service
