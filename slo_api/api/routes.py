"""`/routes/{route}`, its `/config/{route}` twin, and the paginated `/config` list."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Header, Path, Query, Request, Response

from slo_api.api.deps import ReadCaller, RuntimeDep, ServiceDep, WriteCaller
from slo_api.api.schema import (
    CONFIG_RESPONSES,
    DELETE_RESPONSES,
    GET_RESPONSES,
    PUT_BODY,
    PUT_RESPONSES,
)
from slo_api.api.watch import open_stream
from slo_api.errors import ApiError, invalid
from slo_api.feed import Allowed
from slo_api.identity import Caller
from slo_api.jsonbody import parse_object
from slo_api.route_names import route_problem
from slo_api.runtime import Runtime
from slo_api.service import Result, Service, parse_if_match

router = APIRouter()
audit = logging.getLogger("slo_api.audit")

RouteName = Annotated[str, Path(description="The route: an LLM or job serviceId, or a pool name.")]
DryRun = Annotated[bool, Query(alias="dryRun", description="Validate fully; store nothing.")]
IfMatch = Annotated[str | None, Header(alias="If-Match", description="A strong ETag, or *.")]
IfNoneMatch = Annotated[str | None, Header(alias="If-None-Match")]


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def _check_route(route: str) -> None:
    problem = route_problem(route)
    if problem is not None:
        raise invalid(problem, field="route")


def _matches(if_none_match: str | None, etag: str) -> bool:
    if if_none_match is None:
        return False
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return "*" in tags or etag.removeprefix("W/") in tags


@dataclass
class _Write:
    """What one write did, for its audit line and the writes metric."""

    result: Result | None = None
    outcome: int = 500


async def _authorized(svc: Service, route: str, caller: Caller, verb: str) -> None:
    """Raise 403 unless the caller may `verb` the CR the route resolves to."""
    target = svc.resolve(route)
    await caller.require(verb, target.kind, target.namespace, target.name)


def _record_event(
    request: Request, svc: Service, route: str, caller: Caller, write: _Write
) -> None:
    if write.result is None:
        return
    try:
        target = svc.resolve(route)
    except ApiError:  # gone from the index meanwhile: nothing to attach the Event to
        return
    reason = "SLOReset" if request.method == "DELETE" else "SLOUpdated"
    regarding = {**target.obj, "metadata": {**target.obj["metadata"]}}
    regarding["metadata"]["resourceVersion"] = write.result.etag.strip('"')
    request.app.state.runtime.events.record(regarding, reason, write.result.changed, caller.name)


@contextlib.contextmanager
def _audited(
    request: Request, svc: Service, route: str, caller: Caller, dry_run: bool
) -> Iterator[_Write]:
    write = _Write()
    kind = svc.kind_of(route)
    try:
        yield write
    except ApiError as exc:
        write.outcome = exc.status
        raise
    finally:
        audit.info(
            "%s %s",
            request.method,
            "dry run" if dry_run else "write",
            extra={
                "audit": True,
                "route": route,
                "kind": kind,
                "method": request.method,
                "fields": write.result.changed if write.result else None,
                "dry_run": dry_run,
                "role": caller.role,
                "user": caller.name,
                "outcome": write.outcome,
            },
        )
        label = "dry_run" if dry_run and write.outcome < 300 else str(write.outcome)
        request.app.state.runtime.metrics.writes.labels(kind or "unknown", label).inc()


async def get_route(
    route: RouteName, svc: ServiceDep, caller: ReadCaller, if_none_match: IfNoneMatch = None
) -> Response:
    _check_route(route)
    if not caller.static:
        await _authorized(svc, route, caller, "get")
    result = await svc.read(route)
    if _matches(if_none_match, result.etag):
        return Response(status_code=304, headers={"ETag": result.etag})
    return _json(result.body, headers={"ETag": result.etag})


async def put_route(
    route: RouteName,
    request: Request,
    svc: ServiceDep,
    caller: WriteCaller,
    dry_run: DryRun = False,
    if_match: IfMatch = None,
) -> Response:
    _check_route(route)
    with _audited(request, svc, route, caller, dry_run) as write:
        if not caller.static:
            await _authorized(svc, route, caller, "patch")
        content_type = request.headers.get("content-type")
        if content_type and content_type.split(";")[0].strip().lower() not in (
            "application/json",
            "application/merge-patch+json",
        ):
            raise ApiError(415, "send the body as application/json")
        data = parse_object(await request.body())
        write.result = await svc.write(
            route, data, if_match=parse_if_match(if_match), dry_run=dry_run
        )
        write.outcome = 200
        if not dry_run:
            _record_event(request, svc, route, caller, write)
        return _json(write.result.body, headers={"ETag": write.result.etag})


async def delete_route(
    route: RouteName,
    request: Request,
    svc: ServiceDep,
    caller: WriteCaller,
    dry_run: DryRun = False,
    if_match: IfMatch = None,
) -> Response:
    _check_route(route)
    with _audited(request, svc, route, caller, dry_run) as write:
        if not caller.static:
            await _authorized(svc, route, caller, "patch")
        write.result = await svc.reset(route, if_match=parse_if_match(if_match), dry_run=dry_run)
        if dry_run:
            write.outcome = 200
            return _json(write.result.body, headers={"ETag": write.result.etag})
        write.outcome = 204
        _record_event(request, svc, route, caller, write)
        return Response(status_code=204, headers={"ETag": write.result.etag})


for prefix, tag, suffix in (
    ("/routes", "routes", ""),
    ("/config", "config (compatible)", "Config"),
):
    path = prefix + "/{route:path}"
    router.add_api_route(
        path,
        get_route,
        methods=["GET"],
        tags=[tag],
        operation_id=f"getRoute{suffix}",
        responses=GET_RESPONSES,
        summary="Read one route, fresh from the API server",
    )
    router.add_api_route(
        path,
        put_route,
        methods=["PUT"],
        tags=[tag],
        operation_id=f"putRoute{suffix}",
        responses=PUT_RESPONSES,
        openapi_extra=PUT_BODY,
        summary="Merge the body's fields into the route's CR",
    )
    router.add_api_route(
        path,
        delete_route,
        methods=["DELETE"],
        tags=[tag],
        operation_id=f"deleteRoute{suffix}",
        responses=DELETE_RESPONSES,
        status_code=204,
        summary="Reset the client-owned fields to the CRD defaults",
    )


class _StreamAccess:
    """A change stream's caller, asked again while the stream is open (StreamAccess)."""

    def __init__(self, rt: Runtime, caller: Caller, request: Request) -> None:
        self.rt = rt
        self.static = caller.static
        self.holder = None if caller.static else caller.name
        header = request.headers.get("authorization", "")
        self._token = header.partition(" ")[2].strip()

    async def allowed(self) -> Allowed | None:
        if self.static:
            return None
        # The token again (revoked or expired: 401), then what it may list now.
        caller = await self.rt.gate.authenticate(self._token)
        allowed = await caller.listable(self.rt.visible.namespaces())
        if not allowed:
            raise ApiError(403, "this identity may not list any routes", code="forbidden")
        return allowed


@router.get(
    "/config",
    tags=["config (compatible)"],
    operation_id="listRoutes",
    responses=CONFIG_RESPONSES,
    summary="Every route, paginated, from the index",
)
async def list_routes(
    request: Request,
    rt: RuntimeDep,
    caller: ReadCaller,
    page: Annotated[int, Query(ge=1, le=10_000_000)] = 1,
    page_size: Annotated[int, Query(alias="pageSize", ge=1, le=200)] = 20,
    kind: Annotated[Literal["llm", "job", "pool"] | None, Query()] = None,
    view: Annotated[Literal["summary", "full"], Query()] = "summary",
    watch: Annotated[
        bool, Query(description="Stream changes instead of a page (see the 200 response).")
    ] = False,
    since: Annotated[
        str | None,
        Query(
            max_length=1024,
            description="With watch: resume after this revision (from an event or bookmark).",
        ),
    ] = None,
    if_none_match: IfNoneMatch = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", max_length=1024, description="SSE's resume: as since."),
    ] = None,
) -> Response:
    if not rt.ready():
        raise ApiError(503, "the index is still loading", code="not_ready")
    if watch:
        access = _StreamAccess(rt, caller, request)
        return await open_stream(
            rt.feed,
            view=view,
            kind=kind,
            since=since,
            accept=accept,
            last_event_id=last_event_id,
            access=access,
            allowed=await access.allowed(),
        )
    if since is not None:
        raise ApiError(400, "since needs watch=true", field="since")
    if caller.static:
        body, etag = rt.service.page(page, page_size, kind, full=view == "full")
    else:
        allowed = await caller.listable(rt.visible.namespaces())
        body, etag = rt.visible.page(allowed, page, page_size, kind, view == "full")
    if _matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    return Response(body, media_type="application/json", headers={"ETag": etag})
