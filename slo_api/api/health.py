"""Probes, metrics and the demo page: no token needed."""

from __future__ import annotations

from importlib import resources

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse
from prometheus_client.exposition import choose_encoder

from slo_api.api.deps import RuntimeDep
from slo_api.errors import ApiError

router = APIRouter()
STATIC = resources.files("slo_api") / "static"
# The page's ES modules import each other by relative URL, so each is an asset of its own: every
# one in the folder, so a new module is served without a list here to keep.
MODULES = tuple(sorted(p.name for p in STATIC.iterdir() if p.name.endswith(".js")))
ASSETS = {"style.css": "text/css", **dict.fromkeys(MODULES, "text/javascript")}
# As a header, not only the page's <meta> tag: frame-ancestors is honoured only here.
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@router.get("/healthz", tags=["operations"], operation_id="healthz", summary="Liveness")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    tags=["operations"],
    operation_id="readyz",
    summary="Readiness: 200 once every kind has synced, 503 while loading or stopping",
    responses={503: {"description": "Not ready; `reason` says why."}},
)
async def readyz(rt: RuntimeDep) -> Response:
    kinds = {
        state.kind: {
            "synced": state.synced,
            "present": state.present,
            "stale": state.stale,
            "objects": state.objects,
            "groups": list(state.groups),
            "served": list(state.served),
            "watched": list(state.watched),
            "leftovers": sum(state.leftovers.values()),
        }
        for state in rt.kind_states()
    }
    reason = rt.not_ready_reason()
    body: dict[str, object] = {
        "status": "ok" if reason is None else "not_ready",
        "kinds": kinds,
        "scope": rt.scope(),
    }
    if reason is not None:
        body["reason"] = reason
    if rt.tokens.has_file():
        # Detail for an alert, not a readiness condition: the process still serves.
        problem = rt.tokens.file_problem()
        body["tokensFile"] = {"ok": True} if problem is None else {"ok": False, "problem": problem}
    return Response(
        orjson.dumps(body),
        status_code=200 if reason is None else 503,
        media_type="application/json",
    )


@router.get(
    "/metrics",
    tags=["operations"],
    operation_id="metrics",
    summary="Prometheus metrics",
    response_class=Response,
)
async def metrics(rt: RuntimeDep, request: Request) -> Response:
    # OpenMetrics when the scraper asks for it (Prometheus does): only that format carries the
    # exemplars (trace ids) on the latency histograms; the classic text format otherwise.
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encode(rt.metrics.registry), media_type=content_type)


@router.get(
    "/demo-webui",
    tags=["operations"],
    operation_id="demoPage",
    summary="The demo page",
    response_class=Response,
)
async def demo_page() -> Response:
    response = _static("index.html", "text/html; charset=utf-8")
    response.headers["Content-Security-Policy"] = PAGE_CSP
    return response


@router.get("/demo-webui/", include_in_schema=False)
async def demo_page_slash() -> Response:
    # A relative redirect: the page's relative links only work without the slash, and an
    # absolute one would drop a gateway's path prefix.
    return Response(status_code=307, headers={"Location": "../demo-webui"})


@router.get(
    "/demo-webui/{asset}", tags=["operations"], operation_id="demoAsset", include_in_schema=False
)
async def demo_asset(asset: str) -> Response:
    if asset not in ASSETS:
        raise ApiError(404, f"no such asset: {asset}")
    return _static(asset, ASSETS[asset])


def _static(name: str, media_type: str) -> Response:
    path = STATIC / name
    if not path.is_file():
        raise ApiError(404, f"the demo page is not installed ({name})")
    return FileResponse(str(path), media_type=media_type, headers={"Cache-Control": "no-cache"})
