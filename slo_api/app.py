"""The FastAPI application: its lifespan runs one watch loop per kind."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from slo_api import __version__, tracing
from slo_api.api import docs, errors, health, routes
from slo_api.api.middleware import RequestMiddleware
from slo_api.api.schema import add_components
from slo_api.api.watch import quiet_cut_streams
from slo_api.auth import TokenStore
from slo_api.metrics import Metrics
from slo_api.runtime import KubeFactory, Runtime, connect_kube
from slo_api.settings import Settings

DESCRIPTION = (
    "A REST front door onto the Kubernetes custom resources that hold the SLOs of LLM and job "
    "inference services and the GPU-slot pools they share. Routes are addressed by name; "
    "writes are JSON merge patches of the client-owned fields only."
)


def create_app(
    settings: Settings | None = None, kube_factory: KubeFactory | None = None
) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()
    token = settings.slo_api_token.get_secret_value() if settings.slo_api_token else None
    # Built here, not in the lifespan, so a bad tokens file stops the process before it serves.
    tokens = TokenStore(token, settings.slo_api_tokens_file)
    tokens.register_metrics(metrics.registry)
    connect = kube_factory or connect_kube
    # Once per process, from the OTEL_* environment; off, nothing of OpenTelemetry is loaded.
    tracing.configure(__version__)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(settings, await connect(settings, metrics), metrics, tokens)
        app.state.runtime = runtime
        runtime.start()
        try:
            yield
        finally:
            await runtime.stop()
            tracing.shutdown()

    app = FastAPI(
        title="slo-api",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        # Starlette's slash redirects build an absolute URL from the request's Host header.
        redirect_slashes=False,
        # slo-api's own spans (slo_api.tracing) are the request's trace. FastAPI's native
        # telemetry would add a second server span wherever a global provider is set, and asks
        # the global providers whether one is on every request (3% of a GET's CPU).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    errors.install(app)
    app.include_router(routes.router)
    app.include_router(health.router)
    if settings.docs_enabled:
        app.include_router(docs.router)
    app.add_middleware(RequestMiddleware, metrics=metrics, max_body_bytes=settings.max_body_bytes)
    quiet_cut_streams()

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_components(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
