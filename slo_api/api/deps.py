"""FastAPI dependencies: the running service and the caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from slo_api.api.middleware import CALLER_SCOPE_KEY
from slo_api.errors import ApiError
from slo_api.identity import Caller
from slo_api.runtime import Runtime
from slo_api.service import Service


# The dependencies are `async def` although they never await: FastAPI runs a plain `def`
# dependency in a worker thread, and the hop there and back cost more than the request's work.
async def runtime(request: Request) -> Runtime:
    value: Runtime = request.app.state.runtime
    return value


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "send Authorization: Bearer <token>")
    return token.strip()


async def read_access(request: Request, rt: Annotated[Runtime, Depends(runtime)]) -> Caller:
    caller = await rt.gate.authenticate(_bearer(request))
    request.scope[CALLER_SCOPE_KEY] = caller.name
    return caller


async def write_access(request: Request, rt: Annotated[Runtime, Depends(runtime)]) -> Caller:
    caller = await read_access(request, rt)
    if caller.role == "read":
        raise ApiError(403, "this token may read but not change routes")
    # A Kubernetes identity is authorized on the CR the route resolves to, in the handler.
    return caller


async def service(rt: Annotated[Runtime, Depends(runtime)]) -> Service:
    return rt.service


ReadCaller = Annotated[Caller, Depends(read_access)]
WriteCaller = Annotated[Caller, Depends(write_access)]
ServiceDep = Annotated[Service, Depends(service)]
RuntimeDep = Annotated[Runtime, Depends(runtime)]
