"""A route whose common request skips FastAPI's dependency solver.

FastAPI resolves an endpoint's parameters and dependencies anew for every request, and in a
py-spy profile of `GET /routes/{route}` that solver (dependency cache keys, unwrapping each
dependency's callable, the parameter checks) was an eighth of slo-api's CPU, for a request
whose only parameters are its path and a header or two. `LeanRoute` keeps the declared
endpoint, so the OpenAPI document and every answer of the general path stay as they are, and
calls a lean twin of it, given only the `Request`, when the request has no query string:
nothing FastAPI would have to parse or could refuse. A request with query parameters takes the
general path, and with it FastAPI's validation and its error answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

LeanEndpoint = Callable[[Request], Awaitable[Response]]
# The declared endpoint -> its lean twin (set by `twin_of` when the routes module loads).
_TWINS: dict[Callable[..., Any], LeanEndpoint] = {}


def twin_of(endpoint: Callable[..., Any]) -> Callable[[LeanEndpoint], LeanEndpoint]:
    """Declare the decorated function the lean twin of `endpoint`: it must answer a request
    without a query string exactly as `endpoint` would."""

    def register(lean: LeanEndpoint) -> LeanEndpoint:
        _TWINS[endpoint] = lean
        return lean

    return register


class LeanRoute(APIRoute):
    """An APIRoute that hands a request without a query string to its endpoint's lean twin."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        general = super().get_route_handler()
        lean = _TWINS.get(self.endpoint)
        if lean is None:
            return general

        async def handler(request: Request) -> Response:
            if request.scope["query_string"]:
                return await general(request)
            return await lean(request)

        return handler
