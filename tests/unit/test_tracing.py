"""Tracing's switch: the OTEL_* environment's meaning, and off costing no import of the SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from slo_api import tracing


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "slo-api"}, False),  # a name alone sends nowhere
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
    ],
)
def test_the_environment_turns_tracing_on(environ: dict[str, str], on: bool) -> None:
    assert tracing.wanted(environ) is on


@pytest.mark.parametrize(
    ("path", "query", "traced"),
    [
        ("/routes/a", b"", True),
        ("/config", b"page=2", True),
        ("/config", b"watch=false", True),
        ("/config", b"watch=true", False),  # the change stream lasts minutes
        ("/config", b"page=1&watch=1", False),
        ("/healthz", b"", False),
        ("/readyz", b"", False),
        ("/metrics", b"", False),
    ],
)
def test_probes_scrapes_and_the_change_stream_get_no_span(
    path: str, query: bytes, traced: bool
) -> None:
    assert tracing.traced(path, query) is traced


def test_off_nothing_of_the_sdk_is_imported_and_the_hooks_are_inert() -> None:
    # A fresh interpreter: what an untraced slo-api loads, serving a request end to end.
    script = """
import asyncio, json, sys
import httpx
from slo_api import tracing
from slo_api.app import create_app
from tests.unit.fakes import FakeKube

async def main():
    fake = FakeKube()
    async def factory(settings, metrics):
        return fake
    app = create_app(kube_factory=factory)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            auth = {"Authorization": "Bearer " + "t" * 20}
            await client.get("/routes/nothing-here", headers=auth)
            await client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    wanted = ("opentelemetry.sdk", "opentelemetry.exporter")
    print(json.dumps({
        "loaded": sorted(m for m in sys.modules if m.startswith(wanted)),
        "active": tracing.active() is not None,
        "ids": tracing.current_ids(),
        "exemplar": tracing.exemplar(),
    }))

asyncio.run(main())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["SLO_API_TOKEN"] = "t" * 20
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.splitlines()[-1])
    assert seen == {"loaded": [], "active": False, "ids": None, "exemplar": None}


def test_a_global_tracer_provider_gets_no_second_request_span_from_fastapi() -> None:
    # A fresh interpreter: the global provider, once set, stays for the process. Set by
    # something else (an auto-instrumentation, say) while slo-api's own tracing is off, it must
    # not make FastAPI trace requests on its own (slo-api's spans are the one trace).
    script = """
import asyncio
import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from slo_api.app import create_app
from tests.unit.fakes import FakeKube

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def main():
    fake = FakeKube()
    async def factory(settings, metrics):
        return fake
    app = create_app(kube_factory=factory)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            auth = {"Authorization": "Bearer " + "t" * 20}
            assert (await client.get("/routes/nothing-here", headers=auth)).status_code == 404
            assert (await client.get("/nowhere")).status_code == 404
    with trace.get_tracer("probe").start_as_current_span("probe"):
        pass  # the provider records spans: only this one may be there
    print(sorted(s.name for s in exporter.get_finished_spans()))

asyncio.run(main())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["SLO_API_TOKEN"] = "t" * 20
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "['probe']"
