"""slo-api for the benchmark: the production app plus a baseline route, served as `slo_api` is.

`python -m bench.launcher` builds `slo_api.app.create_app(settings)` from the environment,
adds two routes that exist only here, and serves it with the same uvicorn configuration and
Server class as `python -m slo_api`:

- `PUT /bench/baseline/{key}` stores response bytes (captured by the driver from a real
  `GET /config` answer); `GET /bench/baseline/{key}` returns them as they are, with the same
  headers. The same middleware runs, nothing else: what it costs is the framework's ceiling.
- `GET /bench/info` says which event loop and HTTP protocol uvicorn picked, and the pid.
- `GET /bench/heap`, when started with `PYTHONTRACEMALLOC` set: what the live Python objects
  take, by the line of slo-api that allocated them (the innermost slo-api frame of each
  allocation's traceback) and by the line that did (any module).

With SLO_API_BENCH_HIDE_TRACING set, the OpenTelemetry SDK cannot be imported: tracing absent.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import sys
import tracemalloc

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
    app.add_api_route("/bench/heap", heap, methods=["GET"])


def _where(frame: tracemalloc.Frame) -> str:
    name = frame.filename
    for root in ("/slo_api/", "/site-packages/", "/lib/python3"):
        if root in name:
            name = name[name.index(root) + 1 :]
            break
    return f"{name}:{frame.lineno}"


def heap(top: int = 40) -> dict[str, object]:
    """The traced Python heap, grouped by the innermost slo-api line of each allocation
    (the allocation's own line when no slo-api frame is on it) and by its own line."""
    if not tracemalloc.is_tracing():
        return {"tracing": False}
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    by_ours: dict[str, list[int]] = {}
    by_line: dict[str, list[int]] = {}
    total = 0
    for stat in snapshot.statistics("traceback"):
        total += stat.size
        frames = list(stat.traceback)  # oldest first
        ours = next((f for f in reversed(frames) if "/slo_api/" in f.filename), frames[-1])
        for table, where in ((by_ours, _where(ours)), (by_line, _where(frames[-1]))):
            held = table.setdefault(where, [0, 0])
            held[0] += stat.size
            held[1] += stat.count

    def best(table: dict[str, list[int]]) -> list[list[object]]:
        ranked = sorted(table.items(), key=lambda item: -item[1][0])[:top]
        return [[where, size, count] for where, (size, count) in ranked]

    return {
        "tracing": True,
        "total": total,
        "by_slo_api_line": best(by_ours),
        "by_line": best(by_line),
    }


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
