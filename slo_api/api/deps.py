"""FastAPI dependencies: the running service and the caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from slo_api.access import Caller
from slo_api.api.middleware import CALLER_SCOPE_KEY
from slo_api.errors import ApiError
from slo_api.runtime import Runtime
from slo_api.service import Service


# The dependencies are `async def` although they never await: FastAPI runs a plain `def`
# dependency in a worker thread, and the hop there and back cost more than the request's work.
async def runtime(request: Request) -> Runtime:
    value: Runtime = request.app.state.runtime
    return value


async def bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "send Authorization: Bearer <token>")
    return token.strip()


async def caller(
    request: Request,
    rt: Annotated[Runtime, Depends(runtime)],
    token: Annotated[str, Depends(bearer)],
) -> Caller:
    """Who is calling; what they may do is the Authorizer's to say, per request, in the route."""
    who = await rt.access.authenticate(token)
    request.scope[CALLER_SCOPE_KEY] = who.name
    return who


async def authenticated(request: Request) -> tuple[Runtime, Caller]:
    """The running service and the caller, as the dependencies above give them, for an
    endpoint's lean twin (slo_api.api.lean): the same checks in the same order."""
    rt = await runtime(request)
    return rt, await caller(request, rt, await bearer(request))


async def service(rt: Annotated[Runtime, Depends(runtime)]) -> Service:
    return rt.service


CallerDep = Annotated[Caller, Depends(caller)]
BearerDep = Annotated[str, Depends(bearer)]
ServiceDep = Annotated[Service, Depends(service)]
RuntimeDep = Annotated[Runtime, Depends(runtime)]
