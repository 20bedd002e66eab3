"""slo-api for the benchmark: the production app plus a baseline route, served as `slo_api` is.

`python -m bench.launcher` builds `slo_api.app.create_app(settings)` from the environment,
adds two routes that exist only here, and serves it with the same uvicorn configuration and
Server class as `python -m slo_api`:

- `PUT /bench/baseline/{key}` stores response bytes (captured by the driver from a real
  `GET /config` answer); `GET /bench/baseline/{key}` returns them as they are, with the same
  headers. The same middleware runs, nothing else: what it costs is the framework's ceiling.
- `GET /bench/info` says which event loop and HTTP protocol uvicorn picked, and the pid.

With SLO_API_BENCH_HIDE_TRACING set, the OpenTelemetry SDK cannot be imported: tracing absent.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys

import uvicorn
from fastapi import FastAPI, Request, Response

from slo_api.__main__ import make_server
from slo_api.app import create_app
from slo_api.logs import setup_logging
from slo_api.settings import Settings

_baselines: dict[str, tuple[bytes, str]] = {}
_server: list[uvicorn.Server] = []


def add_bench_routes(app: FastAPI) -> None:
    async def put_baseline(key: str, request: Request) -> Response:
        body = await request.body()
        etag = 'W/"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
        _baselines[key] = (body, etag)
        return Response(status_code=204)

    async def get_baseline(key: str) -> Response:
        body, etag = _baselines[key]
        return Response(body, media_type="application/json", headers={"ETag": etag})

    async def info() -> dict[str, object]:
        config = _server[0].config if _server else None
        return {
            "pid": os.getpid(),
            "loop": type(asyncio.get_running_loop()).__module__,
            "http": getattr(config, "http_protocol_class", type(None)).__module__,
            "loop_setting": getattr(config, "loop", None),
            "http_setting": str(getattr(config, "http", None)),
        }

    app.add_api_route("/bench/baseline/{key}", put_baseline, methods=["PUT"])
    app.add_api_route("/bench/baseline/{key}", get_baseline, methods=["GET"])
    app.add_api_route("/bench/info", info, methods=["GET"])


class _HideTracing:
    """An import hook that says the tracing extra is not installed (the bench's "absent")."""

    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def main() -> int:
    if os.environ.get("SLO_API_BENCH_HIDE_TRACING"):
        sys.meta_path.insert(0, _HideTracing)
    settings = Settings()
    setup_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    add_bench_routes(app)
    # Served exactly as `python -m slo_api` serves the app.
    server = make_server(app, settings)
    _server.append(server)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
