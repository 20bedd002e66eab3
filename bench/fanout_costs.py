"""The change feed's fan-out over real sockets, no control plane: `python -m bench.fanout_costs`.

One server process (uvicorn as slo-api runs it, the feed over an index of N routes, a driver
storing `--rate` changes a second straight into the index) and one client process holding
`--streams` streams. Each change writes the wall-clock millisecond into a route's
`maximumDeployment.value`; the client notes when each change reached each stream. Reported:

- delivery p50/p99: from the index storing a change to the last stream having it;
- the server's CPU (cores) over the window, and the event loop's lag (a 10 ms timer's lateness,
  p50/p99): what a `GET /config` answered meanwhile waits for at least;
- the same server with no stream open, measured the same way just before (the ratio is what
  the goals are about on a shared machine).

This isolates what the feed and the ASGI write path cost per stream; `python -m bench --only
fanout` measures the whole path against a real API server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from typing import Any

from bench.stream_costs import GROUP, LLM, feed, llm, service

MARK = re.compile(rb'"maximumDeployment":\{"type":"replica","value":(\d+)\}')


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# -- the server ----------------------------------------------------------------------------


def serve(port: int, routes: int, rate: float, flush: float, window: float, warm: float) -> None:
    import uvicorn

    from slo_api.api.watch import WatchResponse

    svc = service(routes)
    f = feed(svc)
    f.flusher.flush_seconds = flush
    stats: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    asyncio.get_running_loop().create_task(drive())
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/stats":
            body = json.dumps(stats).encode()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        await WatchResponse(f, f.open("summary", None))(scope, receive, send)

    async def drive() -> None:
        loop = asyncio.get_running_loop()
        n = 0
        while True:
            # Each phase: `warm` s for the streams to settle, then `window` s measured.
            await asyncio.sleep(warm)
            lags: list[float] = []
            cpu = time.process_time()
            began = loop.time()
            next_change = began
            tick = began
            while loop.time() - began < window:
                await asyncio.sleep(0.01)
                now = loop.time()
                lags.append(max(0.0, now - tick - 0.01))
                tick = now
                while next_change <= now:
                    n += 1
                    value = int(time.time() * 1000)
                    obj = llm(n % routes, 10 + n)
                    obj["spec"]["maximumDeployment"]["value"] = value
                    svc.index.reached(LLM, GROUP, None, str(10 + n))
                    svc.index.upsert(LLM, obj, GROUP)
                    next_change += 1 / rate
            spent = time.process_time() - cpu
            stats[str(len(f.streams))] = {
                "streams": len(f.streams),
                "cores": spent / window,
                "lag_p50_ms": 1000 * _percentile(lags, 50),
                "lag_p99_ms": 1000 * _percentile(lags, 99),
                "dropped": sum(1 for s in f.streams if s.ended is not None),
            }

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    uvicorn.Server(config).run()


# -- the client ----------------------------------------------------------------------------


async def hold(port: int, streams: int, seconds: float) -> dict[str, Any]:
    arrivals: dict[int, list[float]] = {}
    opened = 0

    async def one() -> None:
        nonlocal opened
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        writer.write(b"GET /watch HTTP/1.1\r\nhost: bench\r\n\r\n")
        await writer.drain()
        seen_initial = False
        buffer = b""
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    return
                now = time.time() * 1000
                if not seen_initial:
                    buffer += data
                    if b'"initial":true' not in buffer:
                        continue
                    seen_initial = True
                    opened += 1
                    data = buffer[buffer.index(b'"initial":true') :]
                    buffer = b""
                for match in MARK.finditer(data):
                    value = int(match.group(1))
                    if value > 1_000_000_000:
                        arrivals.setdefault(value, []).append(now - value)
        finally:
            writer.close()

    tasks = [asyncio.create_task(one()) for _ in range(streams)]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    complete = [max(v) for v in arrivals.values() if len(v) >= streams]
    return {
        "opened": opened,
        "changes_seen": len(arrivals),
        "changes_reaching_all": len(complete),
        "delivery_p50_ms": _percentile(complete, 50),
        "delivery_p99_ms": _percentile(complete, 99),
    }


def _stats(port: int) -> dict[str, Any]:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /stats HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    body = data.split(b"\r\n\r\n", 1)[1]
    if b"\r\n" in body:  # chunked
        body = body.split(b"\r\n", 1)[1].rsplit(b"\r\n0\r\n", 1)[0]
    result: dict[str, Any] = json.loads(body)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fanout_costs", description=__doc__)
    parser.add_argument("--routes", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--flush", type=float, default=0.1)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    warm = 5.0
    if args.serve:
        serve(args.port, args.routes, args.rate, args.flush, args.window, warm)
        return
    command = [sys.executable, "-m", "bench.fanout_costs", "--serve", *sys.argv[1:]]
    server = subprocess.Popen(command)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", args.port)).close()
                break
            except OSError:
                time.sleep(0.1)
        # Phase one runs with no stream; the streams open during phase two's warm-up.
        time.sleep(warm + args.window + 1)
        os.nice(5)  # the client stands in for other machines
        client = asyncio.run(hold(args.port, args.streams, warm + args.window))
        time.sleep(0.5)
        stats = _stats(args.port)
    finally:
        server.terminate()
        server.wait()
    alone = stats.get("0", {})
    loaded = max((v for v in stats.values() if v["streams"]), key=lambda v: v["streams"])
    out = {
        "routes": args.routes,
        "streams": args.streams,
        "rate": args.rate,
        "flush": args.flush,
        "window_s": args.window,
        "without_streams": alone,
        "with_streams": loaded,
        "client": client,
        "cpu_ratio": loaded["cores"] / alone["cores"] if alone.get("cores") else None,
        "lag_p99_ratio": (
            loaded["lag_p99_ms"] / alone["lag_p99_ms"] if alone.get("lag_p99_ms") else None
        ),
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg": " ".join(open("/proc/loadavg").read().split()[:3]),  # noqa: SIM115
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
