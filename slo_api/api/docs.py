"""Swagger UI at /docs, its assets served from the fastapi-offline package, not a CDN.

The page runs in the origin that keeps the demo page's token, so nothing it loads may come from
elsewhere; and clusters without internet access get a working page. Every URL is relative, as
on the demo page, so a gateway's path prefix keeps working.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse

from slo_api.errors import ApiError

router = APIRouter()
ASSETS_PACKAGE = "fastapi_offline"
ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css"}


def _page() -> bytes:
    return bytes(
        get_swagger_ui_html(
            openapi_url="openapi.json",
            title="slo-api - Swagger UI",
            swagger_js_url="docs/swagger-ui-bundle.js",
            swagger_css_url="docs/swagger-ui.css",
            swagger_favicon_url="data:,",
            oauth2_redirect_url=None,
            # No badge fetched from the public validator.
            swagger_ui_parameters={"validatorUrl": None},
        ).body
    )


PAGE = _page()


@router.get("/docs", include_in_schema=False)
async def docs_page() -> Response:
    return Response(
        PAGE,
        media_type="text/html; charset=utf-8",
        headers={"Content-Security-Policy": "frame-ancestors 'none'"},
    )


@router.get("/docs/{asset}", include_in_schema=False)
async def docs_asset(asset: str) -> Response:
    if asset not in ASSETS:
        raise ApiError(404, f"no such asset: {asset}")
    path = resources.files(ASSETS_PACKAGE) / "static" / asset
    if not path.is_file():
        raise ApiError(404, f"the Swagger UI assets are not installed ({asset})")
    # The package version pins the assets; a day of caching is safe across restarts.
    return FileResponse(
        str(path), media_type=ASSETS[asset], headers={"Cache-Control": "max-age=86400"}
    )
