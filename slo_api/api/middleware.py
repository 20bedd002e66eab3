"""The application's outer layer: request ids, the body-size limit, request metrics and one
log line."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from slo_api import tracing
from slo_api.api.errors import error_response
from slo_api.errors import ApiError
from slo_api.logs import client_request_id, request_id
from slo_api.metrics import Metrics

log = logging.getLogger("slo_api.request")
_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
STREAM_LABEL = "slo_api.metrics_route"  # a scope key: the route label for the request metrics
# Any other method is counted as "other": a client must not mint label values at will.
_METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH")
)
_NOSNIFF = (b"x-content-type-options", b"nosniff")
# HTTP's Content-Length: 1*DIGIT, ASCII only.
_LENGTH = re.compile(rb"[0-9]+")
# Where the auth dependency leaves who called, for the request log line: the scope outlives
# the endpoint, while a context variable set in a dependency would not reach this middleware.
CALLER_SCOPE_KEY = "slo_api.caller"


class RequestMiddleware:
    """Outermost layer: tags each request with an id and records how it went."""

    def __init__(self, app: ASGIApp, metrics: Metrics, max_body_bytes: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        sent_id = headers.get(b"x-request-id", b"").decode("latin-1")
        # slo-api's own id: 32 random hex digits, as uuid4().hex was, without building a UUID
        # per request. The caller's, when safe to log, is kept beside it and echoed.
        own = os.urandom(16).hex()
        client = sent_id if _SAFE_ID.fullmatch(sent_id) else None
        rid = client or own
        token = request_id.set(own)
        client_token = client_request_id.set(client)
        started = time.perf_counter()
        status = 500
        tracer = tracing.active()
        span = None
        if tracer is not None and tracing.traced(scope["path"], scope["query_string"]):
            span, span_token = tracer.start_request(scope["method"], headers)

        # Not a coroutine of its own: a body message (a change stream's write, thousands per
        # flush) goes on as the server's own `send` awaitable, with no frame added here.
        def send_with_id(message: Message) -> Awaitable[None]:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", ()),
                    (b"x-request-id", rid.encode()),
                    _NOSNIFF,
                ]
            return send(message)

        try:
            declared = headers.get(b"content-length")
            if declared is not None and not _LENGTH.fullmatch(declared):
                # uvicorn answers 400 itself before a request gets here; another server may
                # not. Refused before reading a byte, as a body too large is.
                malformed = ApiError(
                    400,
                    "the Content-Length header is not a decimal number of bytes",
                    headers={"Connection": "close"},
                )
                await error_response(malformed)(scope, receive, send_with_id)
                return
            if declared is not None and _longer(declared, self.max_body_bytes):
                # Refused before reading a byte of it: the connection cannot carry another
                # request after a body nobody read.
                refused = ApiError(413, self._too_large(), headers={"Connection": "close"})
                await error_response(refused)(scope, receive, send_with_id)
                return
            # Only a request that says it has a body gets its reads counted (a GET has none).
            has_body = declared is not None or b"transfer-encoding" in headers
            await self.app(scope, self._limited(receive) if has_body else receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = scope.get("route")
            # A change stream lasts minutes: its own label keeps /config's latencies meaningful.
            template = scope.get(STREAM_LABEL) or getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.metrics.count_request(method, template, status, elapsed, span is not None)
            if template not in ("/healthz", "/readyz", "/metrics"):
                log.info(
                    "%s %s -> %d",
                    method,
                    template,
                    status,
                    extra={
                        "status": status,
                        "duration_ms": round(elapsed * 1000, 1),
                        "user": scope.get(CALLER_SCOPE_KEY),
                    },
                )
            if span is not None:
                tracer.end_request(span, span_token, template, status)  # type: ignore[union-attr]
            request_id.reset(token)
            client_request_id.reset(client_token)

    def _too_large(self) -> str:
        return f"the request body is larger than {self.max_body_bytes} bytes"

    def _limited(self, receive: Receive) -> Receive:
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    # Raised into the endpoint's body read; the error handler answers 413.
                    raise ApiError(413, self._too_large())
            return message

        return limited


def _longer(declared: bytes, limit: int) -> bool:
    """Whether a Content-Length (ASCII digits) is over `limit`, with no int() of a length
    past its digits (int() refuses over 4300 of them)."""
    digits = declared.lstrip(b"0") or b"0"
    bound = str(limit).encode()
    return (len(digits), digits) > (len(bound), bound)
