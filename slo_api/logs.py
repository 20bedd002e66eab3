"""Logging: JSON lines (or console lines) carrying the request id, for us and for uvicorn."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

from slo_api import tracing

# slo-api's own id of the request being served, and the X-Request-Id its caller sent (kept
# beside it, never in its place: a caller's id is not unique, slo-api's is).
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
client_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "client_request_id", default=None
)

# Attributes every record has, and uvicorn's ANSI-coloured copy of its message: not extras.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        record.client_request_id = client_request_id.get()
        # The ids of the request's trace (when it is traced and sampled): the same on every
        # line of one request, the audit line included.
        ids = tracing.current_ids()
        if ids is not None:
            record.trace_id, record.span_id = ids
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and value is not None:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extras = {k: v for k, v in record.__dict__.items() if k not in _STANDARD and v is not None}
        return base + ("  " + json.dumps(extras, default=str) if extras else "")


# Libraries that log a line per request, connection or call (httpx: each Prometheus query;
# aiohttp's access log, which our own request line makes a repeat): only their warnings and
# errors are shown, unless LOG_LEVEL=debug asks for everything.
CHATTY = ("httpx", "httpcore", "aiohttp", "kubernetes_asyncio", "urllib3", "hpack")


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestIdFilter())
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else ConsoleFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # One line per request comes from our own middleware; uvicorn's access log would repeat it.
    logging.getLogger("uvicorn.access").disabled = True
    debug = root.level <= logging.DEBUG
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET if debug else logging.WARNING)
