"""`/routes/{route}`, its `/config/{route}` twin, and the paginated `/config` list."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Header, Path, Query, Request, Response

from slo_api.access import Caller
from slo_api.api.deps import BearerDep, CallerDep, RuntimeDep, authenticated
from slo_api.api.lean import LeanRoute, twin_of
from slo_api.api.schema import (
    ATTAINMENT_RESPONSES,
    CONFIG_RESPONSES,
    DELETE_RESPONSES,
    GET_RESPONSES,
    HISTORY_RESPONSES,
    PUT_BODY,
    PUT_RESPONSES,
)
from slo_api.api.watch import open_stream
from slo_api.errors import ApiError, invalid
from slo_api.events import EventRecorder, regarding
from slo_api.history import writer
from slo_api.jsonbody import parse_object
from slo_api.logs import client_request_id, request_id
from slo_api.route_names import ATTAINMENT, HISTORY, route_problem
from slo_api.runtime import Runtime
from slo_api.service import Result, Target, parse_if_match

router = APIRouter()
audit = logging.getLogger("slo_api.audit")

RouteName = Annotated[str, Path(description="The route: an LLM or job serviceId, or a pool name.")]
DryRun = Annotated[bool, Query(alias="dryRun", description="Validate fully; store nothing.")]
Force = Annotated[
    bool,
    Query(
        description="Write even fields a GitOps tool owns (409 field_managed without it); "
        "the answer's Warning header names the tool that will revert the change."
    ),
]
IfMatch = Annotated[str | None, Header(alias="If-Match", description="A strong ETag, or *.")]
IfNoneMatch = Annotated[str | None, Header(alias="If-None-Match")]
Page = Annotated[int, Query(ge=1, le=10_000_000)]
PageSize = Annotated[int, Query(alias="pageSize", ge=1, le=200)]
Window = Annotated[
    Literal["1h", "1d", "7d", "28d"],
    Query(description="The window attainment is over (burn rates do not depend on it)."),
]


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

    target: Target | None = None
    result: Result | None = None
    outcome: int = 500


def _warning(result: Result) -> dict[str, str]:
    """A forced write's `Warning` header, in the API server's form (RFC 7234: 299 - "text")."""
    if not result.forced:
        return {}
    text = (
        f"forced over {result.forced_over()}: it will revert this change at its next sync "
        "unless the change is made in the source it syncs from"
    )
    # A header is Latin-1 and the text is quoted: nothing else may pass.
    text = text.encode("ascii", "replace").decode().replace("\\", "\\\\").replace('"', '\\"')
    return {"Warning": f'299 - "{text}"'}


def _record(request: Request, caller: Caller, write: _Write) -> None:
    """A stored write, in an Event on the CR (a no-op in none). Its place in the route's
    history is recorded when the watch brings the change (see slo_api/history/)."""
    _record_event(request, caller, write)


def _record_event(request: Request, caller: Caller, write: _Write) -> None:
    """An Event on the CR written, naming who changed which fields (none for a no-op)."""
    if write.target is None or write.result is None or not write.result.changed:
        return
    reason = "SLOReset" if request.method == "DELETE" else "SLOUpdated"
    events: EventRecorder = request.app.state.runtime.events
    events.record(
        regarding(write.target, write.result.stored),
        reason,
        write.result.changed,
        caller.name,
        forced=write.result.forced_over(),
    )


@contextlib.contextmanager
def _audited(request: Request, route: str, caller: Caller, dry_run: bool) -> Iterator[_Write]:
    write = _Write()
    # What the index stores from this write (its result) is attributed to this caller.
    writing = writer.set((caller.name, request_id.get(), client_request_id.get()))
    try:
        yield write
    except ApiError as exc:
        write.outcome = exc.status
        raise
    finally:
        writer.reset(writing)
        target = write.target
        kind = target.kind.name if target is not None else None
        audit.info(
            "%s %s",
            request.method,
            "dry run" if dry_run else "write",
            extra={
                "audit": True,
                "route": route,
                "kind": kind,
                # The CR resolved, as the review and the write saw it (None: not resolved).
                "group": target.group if target is not None else None,
                "namespace": target.namespace if target is not None else None,
                "object": target.name if target is not None else None,
                "uid": target.uid if target is not None else None,
                "method": request.method,
                "fields": write.result.changed if write.result else None,
                # A forced write: the GitOps tools (and fields) it overrode, who will revert it.
                "forced": write.result.forced_over() or None if write.result else None,
                "dry_run": dry_run,
                "role": caller.role,
                "user": caller.name,
                "outcome": write.outcome,
            },
        )
        label = "dry_run" if dry_run and write.outcome < 300 else str(write.outcome)
        request.app.state.runtime.metrics.writes.labels(kind or "unknown", label).inc()


async def get_route(
    route: RouteName, rt: RuntimeDep, caller: CallerDep, if_none_match: IfNoneMatch = None
) -> Response:
    return await _read(rt, caller, route, if_none_match)


async def _read(rt: Runtime, caller: Caller, route: str, if_none_match: str | None) -> Response:
    _check_route(route)
    target = await rt.access.resolve(caller, route)
    result = await rt.service.read(target, await rt.access.pools(caller, target))
    if _matches(if_none_match, result.etag):
        return Response(status_code=304, headers={"ETag": result.etag})
    return _json(result.body, headers={"ETag": result.etag})


@twin_of(get_route)
async def _get_route_lean(request: Request) -> Response:
    rt, caller = await authenticated(request)
    return await _read(
        rt, caller, request.path_params["route"], request.headers.get("if-none-match")
    )


async def put_route(
    route: RouteName,
    request: Request,
    rt: RuntimeDep,
    caller: CallerDep,
    dry_run: DryRun = False,
    if_match: IfMatch = None,
    force: Force = False,
) -> Response:
    return await _put(request, rt, caller, route, dry_run, if_match, force)


async def _put(
    request: Request,
    rt: Runtime,
    caller: Caller,
    route: str,
    dry_run: bool,
    if_match: str | None,
    force: bool,
) -> Response:
    _check_route(route)
    with _audited(request, route, caller, dry_run) as write:
        target = write.target = await rt.access.resolve(caller, route)
        await rt.access.require(caller, "patch", target)
        content_type = request.headers.get("content-type")
        if content_type and content_type.split(";")[0].strip().lower() not in (
            "application/json",
            "application/merge-patch+json",
        ):
            raise ApiError(415, "send the body as application/json")
        data = parse_object(await request.body())
        pools = await rt.access.pools(caller, target)
        write.result = await rt.service.write(
            target,
            data,
            if_match=parse_if_match(if_match),
            dry_run=dry_run,
            pools=pools,
            force=force,
        )
        write.outcome = 200
        if not dry_run:
            _record(request, caller, write)
        return _json(
            write.result.body, headers={"ETag": write.result.etag, **_warning(write.result)}
        )


async def delete_route(
    route: RouteName,
    request: Request,
    rt: RuntimeDep,
    caller: CallerDep,
    dry_run: DryRun = False,
    if_match: IfMatch = None,
    force: Force = False,
) -> Response:
    return await _delete(request, rt, caller, route, dry_run, if_match, force)


async def _delete(
    request: Request,
    rt: Runtime,
    caller: Caller,
    route: str,
    dry_run: bool,
    if_match: str | None,
    force: bool,
) -> Response:
    _check_route(route)
    with _audited(request, route, caller, dry_run) as write:
        target = write.target = await rt.access.resolve(caller, route)
        await rt.access.require(caller, "patch", target)
        pools = await rt.access.pools(caller, target)
        write.result = await rt.service.reset(
            target,
            if_match=parse_if_match(if_match),
            dry_run=dry_run,
            pools=pools,
            force=force,
        )
        headers = {"ETag": write.result.etag, **_warning(write.result)}
        if dry_run:
            write.outcome = 200
            return _json(write.result.body, headers=headers)
        write.outcome = 204
        _record(request, caller, write)
        return Response(status_code=204, headers=headers)


@twin_of(put_route)
async def _put_route_lean(request: Request) -> Response:
    rt, caller = await authenticated(request)
    route = request.path_params["route"]
    return await _put(request, rt, caller, route, False, request.headers.get("if-match"), False)


@twin_of(delete_route)
async def _delete_route_lean(request: Request) -> Response:
    rt, caller = await authenticated(request)
    route = request.path_params["route"]
    return await _delete(request, rt, caller, route, False, request.headers.get("if-match"), False)


async def get_history(
    route: RouteName,
    rt: RuntimeDep,
    caller: CallerDep,
    page: Page = 1,
    page_size: PageSize = 20,
) -> Response:
    _check_route(route)
    # The same rule as reading the route: a caller who may not read it sees a missing route.
    target = await rt.access.resolve(caller, route)
    entries = await rt.history.read(target)
    start = (page - 1) * page_size
    return _json(
        {
            "items": entries[start : start + page_size],
            "total": len(entries),
            "page": page,
            "pageSize": page_size,
        }
    )


async def get_attainment(
    route: RouteName, rt: RuntimeDep, caller: CallerDep, window: Window = "28d"
) -> Response:
    _check_route(route)
    # The same rule as reading the route: a caller who may not read it sees a missing route.
    target = await rt.access.resolve(caller, route)
    body = await rt.attainment.with_series(route, target.kind.name, target.obj, window)
    return _json(body)


# Each operation of a route, under `/routes` and again under `/config` (the compatible twin).
# `/history` first: it ends no route name (route_names reserves it), so it is matched before
# the route itself.
_OPERATIONS: tuple[tuple[str, str, Any, str, dict[str, Any]], ...] = (
    (
        HISTORY,
        "GET",
        get_history,
        "getRouteHistory",
        {
            "responses": HISTORY_RESPONSES,
            "summary": "Who changed the route, when, and from what: newest first",
        },
    ),
    (
        ATTAINMENT,
        "GET",
        get_attainment,
        "getRouteAttainment",
        {
            "responses": ATTAINMENT_RESPONSES,
            "summary": "Is the route meeting its SLO: observed against target, error budget, "
            "burn rates (from Prometheus)",
        },
    ),
    (
        "",
        "GET",
        get_route,
        "getRoute",
        {
            "responses": GET_RESPONSES,
            "summary": "Read one route, fresh from the API server",
            "route_class_override": LeanRoute,
        },
    ),
    (
        "",
        "PUT",
        put_route,
        "putRoute",
        {
            "responses": PUT_RESPONSES,
            "openapi_extra": PUT_BODY,
            "summary": "Merge the body's fields into the route's CR",
            "route_class_override": LeanRoute,
        },
    ),
    (
        "",
        "DELETE",
        delete_route,
        "deleteRoute",
        {
            "responses": DELETE_RESPONSES,
            "status_code": 204,
            "summary": "Reset the client-owned fields to the CRD defaults",
            "route_class_override": LeanRoute,
        },
    ),
)
for prefix, tag, suffix in (
    ("/routes", "routes", ""),
    ("/config", "config (compatible)", "Config"),
):
    for tail, method, endpoint, operation, options in _OPERATIONS:
        router.add_api_route(
            prefix + "/{route:path}" + tail,
            endpoint,
            methods=[method],
            tags=[tag],
            operation_id=operation + suffix,
            **options,
        )


@router.get(
    "/config",
    tags=["config (compatible)"],
    operation_id="listRoutes",
    responses=CONFIG_RESPONSES,
    summary="Every route, paginated, from the index",
)
async def list_routes(
    rt: RuntimeDep,
    caller: CallerDep,
    token: BearerDep,
    page: Page = 1,
    page_size: PageSize = 20,
    kind: Annotated[Literal["llm", "job", "pool"] | None, Query()] = None,
    view: Annotated[
        Literal["summary", "full", "attainment"],
        Query(description="attainment: each route's attainment over `window`, without series."),
    ] = "summary",
    window: Window = "28d",
    sort: Annotated[
        Literal["route", "budget"],
        Query(
            description="view=attainment: by route name, or by each route's lowest "
            "budgetRemaining, ascending (routes without a budget last)."
        ),
    ] = "route",
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
        raise ApiError(503, "the index is still loading")
    if view == "attainment":
        if watch:
            raise ApiError(400, "view=attainment cannot be watched", field="watch")
        return await _attainment_page(
            rt, caller, page, page_size, kind, window, sort, if_none_match
        )
    if watch:
        access = rt.access.stream(token, caller, kind, rt.visible.held, pools=view == "full")
        # Asked once before the stream opens, so a caller without list and watch anywhere
        # gets a plain 403 (and a revoked token a 401) instead of a stream.
        allowed = await access.allowed()
        return await open_stream(
            rt.feed,
            view=view,
            kind=kind,
            since=since,
            accept=accept,
            last_event_id=last_event_id,
            access=access,
            allowed=allowed,
        )
    if since is not None:
        raise ApiError(400, "since needs watch=true", field="since")
    held = rt.visible.held()
    if kind is not None:
        # A full item shows a member's pool only where the caller may list pools: ask that too.
        held = {k: held[k] for k in (kind, "pool") if k == kind or view == "full"}
    allowed = await rt.access.visible(caller, held)
    body, etag = rt.visible.page(allowed, page, page_size, kind, view == "full")
    if _matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    return Response(body, media_type="application/json", headers={"ETag": etag})


async def _attainment_page(
    rt: Runtime,
    caller: Caller,
    page: int,
    page_size: int,
    kind: str | None,
    window: str,
    sort: str,
    if_none_match: str | None,
) -> Response:
    held = rt.visible.held()
    if kind is not None:
        held = {kind: held[kind]}
    allowed = await rt.access.visible(caller, held)
    routes, key = rt.visible.routes(allowed, kind)
    body, etag = await rt.attainment.page(
        routes, key, window, sort == "budget", page, page_size, rt.service.render_page
    )
    if _matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    return Response(body, media_type="application/json", headers={"ETag": etag})
