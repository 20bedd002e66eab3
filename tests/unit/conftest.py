"""slo-api in-process over a FakeKube: fast tests of the HTTP layer and of faults."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from slo_api.app import create_app
from slo_api.metrics import Metrics
from slo_api.settings import Settings
from tests.unit.fakes import FakeKube

TOKEN = "unit-write-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@functools.cache
def served_openapi() -> dict[str, Any]:
    """What slo-api serves at /openapi.json (openapi.yaml is that: test_openapi.py says so)."""
    doc: dict[str, Any] = yaml.safe_load((Path(__file__).parents[2] / "openapi.yaml").read_text())
    return doc


def llm_cr(name: str, route: str | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "kind": "LLMSLORequirement",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "serviceId": route or name,
            "priority": 0,
            "minimumDeployment": {"type": "replica", "value": 1},
            **spec,
        },
    }


def job_cr(name: str, route: str | None = None, **spec: Any) -> dict[str, Any]:
    spec.setdefault("queue", {"maxDepth": 0, "promql": "up"})
    return {
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "kind": "JobSLORequirement",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "serviceId": route or name,
            "priority": 0,
            "minimumDeployment": {"type": "replica", "value": 1},
            **spec,
        },
    }


def pool_cr(name: str, members: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "inference.llmkube.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "members": [{"inferenceServiceRef": {"name": m}} for m in members],
            "swapPolicy": "sticky",
            "swapBudget": "300s",
            "gpu": 1,
            **spec,
        },
    }


Started = Callable[..., contextlib.AbstractAsyncContextManager[tuple[httpx.AsyncClient, Any]]]


@pytest.fixture
def start() -> Started:
    """start(kube, **settings) -> async context of (client, app), ready once lifespan ran."""

    @contextlib.asynccontextmanager
    async def _start(
        kube: FakeKube | None = None, **overrides: Any
    ) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
        fake = kube or FakeKube()

        async def factory(settings: Settings, metrics: Metrics) -> FakeKube:
            return fake

        settings = Settings(**{"slo_api_token": TOKEN, **overrides})
        app = create_app(settings, kube_factory=factory)  # type: ignore[arg-type]
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                yield client, app

    return _start
