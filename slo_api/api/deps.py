"""FastAPI dependencies: the running service and the caller's role."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from slo_api.auth import Role, TokenStore
from slo_api.errors import ApiError
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


def _role(request: Request, tokens: TokenStore) -> Role:
    role = tokens.role_of(_bearer(request))
    if role is None:
        raise ApiError(401, "the token is not valid")
    return role


async def read_access(request: Request, rt: Annotated[Runtime, Depends(runtime)]) -> Role:
    return _role(request, rt.tokens)


async def write_access(request: Request, rt: Annotated[Runtime, Depends(runtime)]) -> Role:
    role = _role(request, rt.tokens)
    if role != "write":
        raise ApiError(403, "this token may read but not change routes")
    return role


async def service(rt: Annotated[Runtime, Depends(runtime)]) -> Service:
    return rt.service


ReadRole = Annotated[Role, Depends(read_access)]
WriteRole = Annotated[Role, Depends(write_access)]
ServiceDep = Annotated[Service, Depends(service)]
RuntimeDep = Annotated[Runtime, Depends(runtime)]
