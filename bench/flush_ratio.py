"""A change-stream flush through ASGI against its floor, in-process: `python -m bench.flush_ratio`.

For each stream count, in one process on one event loop (uvloop when installed, as slo-api
runs), the same change's bytes reach the same number of loopback sockets two ways:

- **the floor**: a bare asyncio server; the bytes written with `transport.write` to each of its
  connections, one call each (what no server can go below);
- **through ASGI**: slo-api's own app (`create_app`, its middleware, a static token, the index
  filled by the unit tests' fake API server) under uvicorn's httptools protocol, one
  `GET /config?watch=true` stream per connection; one change stored in the index is one flush:
  the feed's shared bytes handed to each stream's ASGI `send`, through every middleware, to
  uvicorn, which frames a chunk and writes it.

Timed: the flush itself (the flusher handing every stream its bytes, or the loop of writes),
on the loop thread's clock, the clients' reads left out (they run after it, in the same
process). Each rep waits until every client has what was written. The floor is measured
before and after the ASGI run (the two halves show the machine's drift), the ratio is the
ASGI median over the floor's. What the kernel does per write is in both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import uvicorn

from controlplane.server import free_port
from slo_api.app import create_app
from slo_api.settings import Settings
from tests.unit.fakes import FakeKube

TOKEN = "bench-token-not-a-secret"  # noqa: S105
ROUTES = 100
GOAL = 2.0  # a flush through ASGI costs at most this many times its floor
REPS = 30
CONNECT_BATCH = 200
clock = time.thread_time_ns


def _llm(i: int, maximum: int = 4, rv: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "kind": "LLMSLORequirement",
        "metadata": {
            "namespace": "bench",
            "name": f"svc-{i}",
            "uid": f"uid-{i}",
            "resourceVersion": str(rv),
        },
        "spec": {
            "serviceId": f"route-{i:04d}",
            "priority": 0,
            "minimumDeployment": {"type": "replica", "value": 1},
            "maximumDeployment": {"type": "replica", "value": maximum},
            "ttft": {"default": {"metrics": [{"type": "p90", "threshold": 0.8}]}},
        },
    }


class Reader(asyncio.Protocol):
    """A client that only counts what it reads (and keeps the last part)."""

    def __init__(self) -> None:
        self.received = 0
        self.last = b""
        self.buffer = b""
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        self.last = data
        if not self.opened.done():
            self.buffer += data
            if b'"initial":true' in self.buffer:
                self.buffer = b""
                self.opened.set_result(None)


class Sink(asyncio.Protocol):
    """The floor's server side: it keeps its transport."""

    transports: list[asyncio.Transport] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        Sink.transports.append(transport)  # type: ignore[arg-type]


async def _connect(port: int, count: int, request: bytes) -> list[Reader]:
    loop = asyncio.get_running_loop()
    readers: list[Reader] = []
    for start in range(0, count, CONNECT_BATCH):
        batch = await asyncio.gather(
            *(
                loop.create_connection(Reader, "127.0.0.1", port)
                for _ in range(min(CONNECT_BATCH, count - start))
            )
        )
        for transport, reader in batch:
            if request:
                transport.write(request)
            readers.append(reader)
        if request:
            await asyncio.gather(*(r.opened for r in readers[start:]))
    return readers


async def _until(check: Callable[[], bool], pause: float = 0.01) -> None:
    """Poll what nothing signals (a server's state, the clients' counts), for a minute at most."""
    async with asyncio.timeout(60):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(pause)


async def _all_read(readers: list[Reader], expected: list[int]) -> None:
    await _until(
        lambda: all(r.received >= e for r, e in zip(readers, expected, strict=True)), 0.002
    )


@contextlib.contextmanager
def _quiet_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def floor(streams: int, payload: bytes, reps: int) -> list[float]:
    """Microseconds per stream of each rep: `transport.write(payload)` to every connection."""
    Sink.transports = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Sink, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    readers = await _connect(port, streams, b"")
    await _until(lambda: len(Sink.transports) >= streams)
    transports = list(Sink.transports)
    per_stream: list[float] = []
    try:
        with _quiet_gc():
            for _ in range(reps):
                expected = [r.received + len(payload) for r in readers]
                began = clock()
                for transport in transports:
                    transport.write(payload)
                per_stream.append((clock() - began) / 1000 / streams)
                await _all_read(readers, expected)
    finally:
        for reader in readers:
            if reader.transport is not None:
                reader.transport.close()
        server.close()
        await server.wait_closed()
    return per_stream


async def through_asgi(streams: int, reps: int) -> tuple[list[float], bytes]:
    """Microseconds per stream of each flush through slo-api's app and uvicorn, and the bytes
    one change's event is (without the HTTP chunk's framing)."""
    kube = FakeKube({"llmslorequirements": [_llm(i) for i in range(ROUTES)]})

    async def factory(settings: Settings, metrics: Any) -> FakeKube:
        return kube

    settings = Settings(
        slo_api_token=TOKEN,
        max_watchers=streams + 10,
        watch_flush_seconds=0,  # a change is one flush, at once
        watch_bookmark_seconds=3600,
        watch_lifetime_seconds=3600,
        log_level="warning",
    )
    app = create_app(settings, kube_factory=factory)  # type: ignore[arg-type]
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http="httptools",
        log_config=None,
        access_log=False,
        backlog=4096,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    readers: list[Reader] = []
    try:
        await _until(lambda: server.started)
        runtime = app.state.runtime
        await _until(runtime.ready)
        request = (
            b"GET /config?watch=true HTTP/1.1\r\nHost: bench\r\n"
            b"Authorization: Bearer %b\r\n\r\n" % TOKEN.encode()
        )
        readers = await _connect(port, streams, request)
        feed = runtime.feed
        await _until(lambda: all(s.write is not None for s in feed.streams))
        timings: list[int] = []
        deliver: Callable[[Any], None] = feed.flusher.deliver

        def timed(batch: Any) -> None:
            began = clock()
            deliver(batch)
            timings.append(clock() - began)

        feed.flusher.deliver = timed
        per_stream: list[float] = []
        with _quiet_gc():
            for rep in range(reps + 1):  # the first: its framing is cached after it
                before = [r.received for r in readers]
                # A value never stored before: every rep is a change.
                changed = _llm(rep % ROUTES, maximum=1000 + rep, rv=1000 + rep)
                feed.index.upsert("llmslorequirements", changed)
                await _all_read(readers, [b + 1 for b in before])
                sizes = {r.received - b for r, b in zip(readers, before, strict=True)}
                assert len(sizes) == 1, f"the streams were given different bytes: {sizes}"
                if rep:
                    per_stream.append(timings[-1] / 1000 / streams)
                timings.clear()
        chunk = readers[0].last
        head, _, rest = chunk.partition(b"\r\n")
        event = rest[: int(head, 16)]
        return per_stream, event
    finally:
        app.state.runtime.feed.close_all()
        for reader in readers:
            if reader.transport is not None:
                reader.transport.close()
        server.should_exit = True
        await serving


class BareApp:
    """An ASGI app with no framework: each request starts a chunked response and keeps its
    `send`; `flush` steps one body message through each (no task, as the feed does)."""

    def __init__(self) -> None:
        self.sends: list[Callable[[Any], Any]] = []
        self.over = asyncio.get_running_loop().create_future()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'"initial":true\n', "more_body": True})
        self.sends.append(send)
        await self.over
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def flush(self, chunk: bytes) -> None:
        for send in self.sends:
            write = send({"type": "http.response.body", "body": chunk, "more_body": True})
            try:
                write.send(None)
            except StopIteration:
                continue
            raise RuntimeError("a loopback client's socket was full")


async def uvicorn_alone(streams: int, event: bytes, reps: int) -> list[float]:
    """Microseconds per stream of each flush of `event` through uvicorn's own `send`, from an
    app with no framework and no middleware: what uvicorn alone costs above the floor."""
    app = BareApp()
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http="httptools",
        lifespan="off",
        log_config=None,
        access_log=False,
        backlog=4096,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    readers: list[Reader] = []
    per_stream: list[float] = []
    try:
        await _until(lambda: server.started)
        readers = await _connect(port, streams, b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
        with _quiet_gc():
            for _ in range(reps):
                before = [r.received for r in readers]
                began = clock()
                app.flush(event)
                per_stream.append((clock() - began) / 1000 / streams)
                await _all_read(readers, [b + len(event) for b in before])
    finally:
        app.over.set_result(None)
        for reader in readers:
            if reader.transport is not None:
                reader.transport.close()
        server.should_exit = True
        await serving
    return per_stream


async def measure(streams: int, reps: int) -> dict[str, Any]:
    asgi, event = await through_asgi(streams, reps)
    first = await floor(streams, event, reps // 2)
    alone = await uvicorn_alone(streams, event, reps)
    second = await floor(streams, event, reps - reps // 2)
    bare = first + second
    ratio = statistics.median(asgi) / statistics.median(bare)
    return {
        # Context: uvicorn's `send` with nothing around it, against the same floor.
        "uvicorn_alone_us_per_stream": statistics.median(alone),
        "uvicorn_alone_ratio": statistics.median(alone) / statistics.median(bare),
        "streams": streams,
        "reps": reps,
        "event_bytes": len(event),
        "asgi_us_per_stream": statistics.median(asgi),
        "asgi_us_range": [min(asgi), max(asgi)],
        "floor_us_per_stream": statistics.median(bare),
        "floor_us_range": [min(bare), max(bare)],
        "floor_halves_us": [statistics.median(first), statistics.median(second)],
        "ratio": ratio,
        "goal": GOAL,
        "met": ratio <= GOAL,
    }


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(counts: list[int], reps: int) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    needed = 2 * max(counts) + 100  # one server at a time: its sockets and its clients
    if hard < needed:
        raise SystemExit(f"{max(counts)} streams need {needed} open files; the limit is {hard}")
    factory = _loop_factory()
    results: dict[str, Any] = {}
    try:
        for count in counts:
            with asyncio.Runner(loop_factory=factory) as runner:
                results[str(count)] = runner.run(measure(count, reps))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return {
        "runs": results,
        "loop": factory.__module__.split(".")[0],
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.flush_ratio", description=__doc__)
    parser.add_argument("--streams", default="1000,5000", help="stream counts, comma-separated")
    parser.add_argument("--reps", type=int, default=REPS)
    args = parser.parse_args()
    counts = [int(x) for x in args.streams.split(",") if x.strip()]
    print(json.dumps(run(counts, args.reps), indent=2))


if __name__ == "__main__":
    main()
