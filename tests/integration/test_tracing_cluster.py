"""Traces, against a real backend: Jaeger's all-in-one (built from the Go module proxy, cached),
receiving OTLP/HTTP from a real slo-api process and queried through its HTTP query API."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.admin import Admin
from controlplane.jaeger import Jaeger
from tests.integration import crs
from tests.integration.process import TOKEN, Process, start_process

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    backend = Jaeger(tmp_path_factory.mktemp("jaeger")).start()
    yield backend
    backend.stop()


def _otel(endpoint: str, service: str, ratio: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_TRACES_SAMPLER_ARG": ratio,
        # Batches leave every 100 ms, so a test waits on the backend, not on the batch timer.
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


async def _traced(kubeconfig: Path, tmp: Path, env: dict[str, str]) -> Process:
    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        env.setdefault(name, "")  # nothing from the test runner's own environment
    return await start_process(kubeconfig, tmp, **env)


@pytest.fixture
async def stop_after() -> AsyncIterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.proc.terminate()
        process.proc.wait(timeout=30)


async def _until(found: Callable[[], Awaitable[Any]], what: str, seconds: float = 60) -> Any:
    """Poll until `found()` is truthy: spans reach the backend in batches, in their own time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        result = await found()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not seen in {seconds:g}s")
        await asyncio.sleep(0.2)


def _tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags") or []}


def _parent(span: dict[str, Any]) -> str | None:
    for ref in span.get("references") or []:
        if ref.get("refType") == "CHILD_OF":
            return str(ref["spanID"])
    return None


def _traceparent(sampled: bool = True) -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


async def _put(process: Process, route: str, headers: dict[str, str], priority: int) -> int:
    async with httpx.AsyncClient(base_url=process.url, timeout=10) as http:
        response = await http.put(
            f"/routes/{route}",
            headers={**AUTH, **headers, "Content-Type": "application/json"},
            content=f'{{"priority": {priority}}}',
        )
    return response.status_code


async def test_a_puts_trace_holds_the_request_and_its_api_server_calls(
    admin: Admin,
    namespace: str,
    jaeger: Jaeger,
    slo_api_kubeconfig: Path,
    tmp_path: Path,
    stop_after: list[Process],
) -> None:
    route = f"traced-{namespace}"
    admin.create(crs.llm(namespace, "traced", service_id=route))
    # Ratio 0: only the caller's sampled traceparent makes this request traced (parent-based).
    process = await _traced(
        slo_api_kubeconfig, tmp_path, _otel(jaeger.otlp_endpoint, f"slo-api-{namespace}", "0")
    )
    stop_after.append(process)
    trace_id, caller_span, traceparent = _traceparent()
    assert await _put(process, route, {"traceparent": traceparent}, 3) == 200

    async def spans() -> list[dict[str, Any]] | None:
        found = await asyncio.to_thread(jaeger.trace, trace_id)
        names = {s["operationName"] for s in found or []}
        return (
            found
            if "PUT /routes/{route:path}" in names and "patch llmslorequirements" in (names)
            else None
        )

    try:
        found = await _until(spans, "the PUT's trace")
    except AssertionError:
        seen = await asyncio.to_thread(jaeger.trace, trace_id)
        raise AssertionError(f"spans: {seen}; log: {process.log.read_text()[-3000:]}") from None
    by_name = {s["operationName"]: s for s in found}
    request = by_name["PUT /routes/{route:path}"]
    assert _parent(request) == caller_span
    assert _tags(request)["http.response.status_code"] == 200
    assert _tags(request)["http.route"] == "/routes/{route:path}"
    upstream = [s for s in found if s is not request]
    assert upstream, found
    for span in upstream:
        assert _parent(span) == request["spanID"], span
        tags = _tags(span)
        assert tags["k8s.resource"] in span["operationName"]
        assert tags.get("k8s.audit_id"), span  # the API server's Audit-ID: its audit log's key
        # Namespace-free: no attribute names the namespace (nor the CR).
        assert not any(namespace in str(v) for v in tags.values()), tags
    patch = by_name["patch llmslorequirements"]
    assert _tags(patch)["http.response.status_code"] == 200
    # The Event recorded for the write is a child of the request too, when it is sent in time
    # to be in the trace by now (it is sent after the answer).
    if "event events" in by_name:
        assert _tags(by_name["event events"])["http.response.status_code"] == 201

    # The request's log lines and its audit line carry the trace's ids.
    lines = [line for line in process.lines() if line.get("trace_id") == trace_id]
    assert any(line.get("audit") for line in lines), process.lines()
    assert any(line.get("logger") == "slo_api.request" for line in lines), lines
    assert {line["span_id"] for line in lines if line.get("audit")} == {request["spanID"]}

    # The latency histograms carry the trace id as an exemplar, in OpenMetrics only.
    async with httpx.AsyncClient(base_url=process.url, timeout=10) as http:
        scraped = await http.get("/metrics", headers={"Accept": "application/openmetrics-text"})
        plain = await http.get("/metrics")
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    assert f'trace_id="{trace_id}"' in scraped.text
    assert "slo_api_upstream_request_duration_seconds_bucket" in scraped.text
    assert plain.headers["content-type"].startswith("text/plain")
    assert "trace_id" not in plain.text


async def test_sampled_out_requests_send_nothing(
    admin: Admin,
    namespace: str,
    jaeger: Jaeger,
    slo_api_kubeconfig: Path,
    tmp_path: Path,
    stop_after: list[Process],
) -> None:
    route = f"unsampled-{namespace}"
    admin.create(crs.llm(namespace, "unsampled", service_id=route))
    service = f"slo-api-{namespace}"
    process = await _traced(slo_api_kubeconfig, tmp_path, _otel(jaeger.otlp_endpoint, service, "0"))
    stop_after.append(process)
    for n in range(5):
        assert await _put(process, route, {}, n) == 200  # ratio 0, no parent: not sampled
        _, _, unsampled = _traceparent(sampled=False)
        assert await _put(process, route, {"traceparent": unsampled}, n) == 200
    # Then one sampled request: spans leave in order, so once it is stored, anything the
    # requests before it had sent would be stored too.
    trace_id, _, traceparent = _traceparent()
    assert await _put(process, route, {"traceparent": traceparent}, 9) == 200

    async def stored() -> list[dict[str, Any]]:
        return await asyncio.to_thread(jaeger.traces, service)

    traces = await _until(stored, "the sampled request's trace")
    assert [t["traceID"] for t in traces] == [trace_id]
    lines = process.lines()
    unsampled_lines = [
        x for x in lines if x.get("logger") == "slo_api.request" and "trace_id" not in x
    ]
    assert len(unsampled_lines) >= 10  # sampled-out requests log no trace ids


async def test_a_backend_that_is_down_never_fails_or_holds_a_request(
    admin: Admin,
    namespace: str,
    slo_api_kubeconfig: Path,
    tmp_path: Path,
    stop_after: list[Process],
) -> None:
    route = f"nobackend-{namespace}"
    admin.create(crs.llm(namespace, "nobackend", service_id=route))
    # A backend that accepts connections and never answers: the worst kind of down.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    port = silent.getsockname()[1]
    try:
        env = _otel(f"http://127.0.0.1:{port}", f"slo-api-{namespace}", "1.0")
        env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "60"  # an export would hold a request for a minute
        process = await _traced(slo_api_kubeconfig, tmp_path, env)
        stop_after.append(process)
        # Each request has 10 s (the client's timeout), far less than one export's 60 s.
        for n in range(20):
            assert await _put(process, route, {}, n % 10) == 200
            async with httpx.AsyncClient(base_url=process.url, timeout=10) as http:
                assert (await http.get(f"/routes/{route}", headers=AUTH)).status_code == 200
    finally:
        silent.close()


async def test_review_misses_are_spans_of_the_request_and_hits_are_not(
    admin: Admin,
    namespace: str,
    jaeger: Jaeger,
    slo_api_kubeconfig: Path,
    tmp_path: Path,
    stop_after: list[Process],
) -> None:
    route = f"reviewed-{namespace}"
    admin.create(crs.llm(namespace, "reviewed", service_id=route))
    admin.create(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "tracer", "namespace": namespace},
        }
    )
    admin.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tracer", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "tracer", "namespace": namespace}],
        }
    )
    user = {"Authorization": f"Bearer {admin.service_account_token(namespace, 'tracer')}"}
    env = _otel(jaeger.otlp_endpoint, f"slo-api-{namespace}", "0")
    env["SLO_API_KUBERNETES_AUTH"] = "true"
    process = await _traced(slo_api_kubeconfig, tmp_path, env)
    stop_after.append(process)

    async def put(traceparent: str, priority: int) -> int:
        async with httpx.AsyncClient(base_url=process.url, timeout=10) as http:
            response = await http.put(
                f"/routes/{route}",
                headers={**user, "traceparent": traceparent, "Content-Type": "application/json"},
                content=f'{{"priority": {priority}}}',  # a change: no change sends no patch
            )
        return response.status_code

    first, _, first_parent = _traceparent()
    assert await put(first_parent, 4) == 200
    second, _, second_parent = _traceparent()
    assert await put(second_parent, 5) == 200

    async def names_of(trace_id: str) -> Callable[[], Awaitable[set[str] | None]]:
        async def found() -> set[str] | None:
            spans = await asyncio.to_thread(jaeger.trace, trace_id)
            names = {s["operationName"] for s in spans or []}
            return names if "patch llmslorequirements" in names else None

        return found

    missed = await _until(await names_of(first), "the first request's trace")
    assert {"tokenreview tokenreviews", "subjectaccessreview subjectaccessreviews"} <= missed
    # The same caller again: both answers come from the review caches, no call, no span.
    hit = await _until(await names_of(second), "the second request's trace")
    assert not {"tokenreview tokenreviews", "subjectaccessreview subjectaccessreviews"} & hit
