"""OpenTelemetry traces, opt-in with the standard OTEL_* environment (docs/tracing.md).

Off unless an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), and `OTEL_SDK_DISABLED=true` or
`OTEL_TRACES_EXPORTER=none` turn it off again. Off, nothing of the OpenTelemetry SDK is imported
and every hook below is one `is None` test: `_active` stays None.

On, one span per HTTP request (the middleware), a child span per call to the API server made on
its behalf (the Kubernetes seam: TokenReview and SubjectAccessReview misses, reads, patches and
Event writes included) with the W3C `traceparent` sent along, and the trace and span ids in the
request's log lines and as exemplars on the latency histograms. Calls made for no request (the
informers' lists and watches) get no span: a trace is a request's picture.

The sampler is parent-based: a caller's sampled `traceparent` is followed; a request without one
is sampled at `OTEL_TRACES_SAMPLER_ARG` (default 0.1), unless `OTEL_TRACES_SAMPLER` names
another sampler. Spans leave in batches from a background thread over OTLP/HTTP: a slow or
absent backend drops spans, never delays a request.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger("slo_api.tracing")

DEFAULT_RATIO = 0.1
# The one context-free dict handed to calls when there is nothing to send: never mutated (the
# Kubernetes client copies the headers it is given).
NO_HEADERS: Mapping[str, str] = {}


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces (the OpenTelemetry variables' own meaning)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


class _Tracing:
    """The SDK, imported and set up only when traces are wanted."""

    def __init__(self, environ: Mapping[str, str], version: str) -> None:
        from opentelemetry import context, trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        attributes: dict[str, str] = {"service.version": version}
        named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        if not named:
            attributes["service.name"] = "slo-api"
        sampler: Sampler | None = None  # None: the SDK reads OTEL_TRACES_SAMPLER itself
        if not environ.get("OTEL_TRACES_SAMPLER"):
            ratio = float(environ.get("OTEL_TRACES_SAMPLER_ARG") or DEFAULT_RATIO)
            sampler = ParentBased(TraceIdRatioBased(ratio))
        # No exit hook of the SDK's own: `shutdown` below bounds how long stopping takes.
        self.provider: TracerProvider = TracerProvider(
            sampler=sampler, resource=Resource.create(attributes), shutdown_on_exit=False
        )
        # Queue size, batch size and delay come from OTEL_BSP_*; a full queue drops spans.
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer: Tracer = self.provider.get_tracer("slo_api", version)
        self._trace = trace
        self._context = context
        self._propagator = TraceContextTextMapPropagator()
        self._server = trace.SpanKind.SERVER
        self._client = trace.SpanKind.CLIENT
        self._error = trace.StatusCode.ERROR

    def sampled(self) -> Any:
        """The current span's context when it is sampled, else None."""
        ctx = self._trace.get_current_span().get_span_context()
        return ctx if ctx.is_valid and ctx.trace_flags.sampled else None

    def start_request(self, method: str, headers: Mapping[bytes, bytes]) -> tuple[Span, object]:
        carrier = {}
        for key in (b"traceparent", b"tracestate"):
            if key in headers:
                carrier[key.decode()] = headers[key].decode("latin-1")
        parent = self._propagator.extract(carrier) if carrier else None
        span = self.tracer.start_span(method, context=parent, kind=self._server)
        return span, self._context.attach(self._trace.set_span_in_context(span))

    def end_request(self, span: Span, token: object, route: str, status: int) -> None:
        self._context.detach(token)  # type: ignore[arg-type]
        if span.is_recording():
            method = span.name  # type: ignore[attr-defined]
            span.update_name(f"{method} {route}")
            span.set_attribute("http.request.method", method)
            span.set_attribute("http.route", route)
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(self._error, str(status))
        span.end()

    @contextmanager
    def upstream(
        self, verb: str, resource: str, headers: MutableMapping[str, str]
    ) -> Iterator[Span | None]:
        if self.sampled() is None:
            yield None
            return
        span = self.tracer.start_span(
            f"{verb} {resource}",
            kind=self._client,
            attributes={"k8s.verb": verb, "k8s.resource": resource},
        )
        token = self._context.attach(self._trace.set_span_in_context(span))
        try:
            self._propagator.inject(headers)
            yield span
        finally:
            self._context.detach(token)
            span.end()

    def note(self, status: int | str, headers: Any) -> None:
        span = self._trace.get_current_span()
        if not span.is_recording():
            return
        if isinstance(status, int):
            span.set_attribute("http.response.status_code", status)
        audit_id = headers.get("Audit-Id") if headers else None
        if audit_id:
            span.set_attribute("k8s.audit_id", str(audit_id))
        if not isinstance(status, int) or status >= 400:
            span.set_status(self._error, str(status))


_active: _Tracing | None = None


def configure(version: str, environ: Mapping[str, str] | None = None) -> bool:
    """Set tracing up once per process when the environment asks for it; True when on."""
    global _active
    env = os.environ if environ is None else environ
    if _active is None and wanted(env):
        _active = _Tracing(env, version)
        log.info("tracing on: OTLP/HTTP to %s", _endpoint(env))
    return _active is not None


def _endpoint(environ: Mapping[str, str]) -> str:
    return environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or (
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").rstrip("/") + "/v1/traces"
    )


def shutdown(timeout_seconds: float = 2.0) -> None:
    """Send what is queued, for at most `timeout_seconds`, and stop.

    The SDK's own shutdown waits for an export in flight as long as the exporter's timeout
    allows (10 s by default, per try): a backend that does not answer must not hold the
    process's stop, so it runs in a thread that is waited for only so long.
    """
    global _active
    tracing, _active = _active, None
    if tracing is not None:
        stopping = threading.Thread(
            target=tracing.provider.shutdown, name="tracing-shutdown", daemon=True
        )
        stopping.start()
        stopping.join(timeout_seconds)


def active() -> _Tracing | None:
    return _active


# Not traced: probes and scrapes (noise) and the change stream (it lasts minutes).
UNTRACED_PATHS = frozenset(("/healthz", "/readyz", "/metrics"))
_FALSE = frozenset(("", "0", "false", "no", "off"))


def traced(path: str, query: bytes) -> bool:
    """Whether a request to `path` gets a span."""
    if path in UNTRACED_PATHS:
        return False
    if path == "/config" and b"watch" in query:
        from urllib.parse import parse_qsl

        watch = dict(parse_qsl(query.decode("latin-1"))).get("watch")
        return watch is None or watch.lower() in _FALSE
    return True


def upstream_span(verb: str, resource: str) -> tuple[Any, Mapping[str, str]]:
    """A child span for one API-server call and the headers that carry it (traceparent), or
    (None, NO_HEADERS) when off or outside a sampled request."""
    if _active is None or _active.sampled() is None:
        return None, NO_HEADERS
    headers: dict[str, str] = {}
    return _active.upstream(verb, resource, headers), headers


def note_response(status: int | str, headers: Any = None) -> None:
    """Put an API-server answer on the current span (the call's own): its code, whether it
    failed, and the Audit-ID the API server logged it under."""
    if _active is not None:
        _active.note(status, headers)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current sampled span, for log lines; None when off."""
    if _active is None:
        return None
    ctx = _active.sampled()
    if ctx is None:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def exemplar() -> dict[str, str] | None:
    """The exemplar labels naming the current sampled trace, or None."""
    ids = current_ids()
    return None if ids is None else {"trace_id": ids[0], "span_id": ids[1]}
