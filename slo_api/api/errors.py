"""Exception handlers: every error, FastAPI's and Starlette's included, in one envelope."""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from slo_api.errors import ApiError, invalid_fields

log = logging.getLogger("slo_api.api")
_SOURCES = ("query", "path", "header", "body")


def _whole_characters(value: Any) -> Any:
    """`value` with every lone surrogate (which no encoder takes) replaced by U+FFFD."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {_whole_characters(k): _whole_characters(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_characters(v) for v in value]
    return value


def _encode(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        # An error must always be answerable, whatever text from the request it quotes.
        return orjson.dumps(_whole_characters(body), default=str)


def error_response(exc: ApiError) -> Response:
    """The response of every error: its envelope, its headers, a challenge with a 401."""
    headers = dict(exc.headers)
    if exc.status == 401:
        headers.setdefault("WWW-Authenticate", 'Bearer realm="slo-api"')
    return Response(
        _encode(exc.body()),
        status_code=exc.status,
        headers=headers,
        media_type="application/json",
    )


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        message = f"no such path: {request.url.path}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
        return error_response(ApiError(405, message, headers={"Allow": _allowed(request)}))
    else:
        message = str(exc.detail)
    return error_response(ApiError(exc.status_code, message, headers=dict(exc.headers or {})))


def _allowed(request: Request) -> str:
    # Each method is its own route here, so Starlette's Allow would name only the first
    # match; the OpenAPI paths list every method a path takes.
    methods: set[str] = set()
    for template, operations in request.app.openapi()["paths"].items():
        pattern = re.sub(r"\\\{[^/]+?\\\}", ".+", re.escape(template))
        if re.fullmatch(pattern, request.url.path):
            methods |= {m.upper() for m in operations}
    return ", ".join(sorted(methods))


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(invalid_fields(map(_unplaced, exc.errors()), "the request"))


def _unplaced(error: Any) -> Any:
    """The error without the first `loc` item when it says where a parameter is (the query,
    a header...): the client knows where it sent it."""
    loc = tuple(error.get("loc", ()))
    return {**error, "loc": loc[1:]} if loc and loc[0] in _SOURCES else error


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error")
    return error_response(ApiError(500, "internal error; the request id is in the logs"))


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
