"""`python -m bench.watchers URL TOKEN N OUT`: hold N change streams open, note when changes land.

The fan-out driver starts a few of these. They stand in for clients on other machines, so they
must cost the two shared cores as little as they can: each stream is a bare asyncio protocol
on uvloop (no HTTP client library), which scans what arrives for the driver's marks and never
decodes a line. Each opens N `GET /config?watch=true&kind=llm` streams, touches a file named
OUT + ".ready" once every stream has passed its initial bookmark, and on SIGTERM writes OUT:
for every change (identified by the `maximumDeployment.value` the driver wrote) the time the
last of its streams received it (time.monotonic, comparable across processes) and how many of
its streams did.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

MARK = re.compile(rb'"maximumDeployment":\{"type":"replica","value":(\d+)\}')
INITIAL = b'"initial":true'
ERROR = b'{"type":"ERROR"'


class Tally:
    """What one process's streams saw."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.last: dict[int, float] = {}
        self.seen: dict[int, int] = {}
        self.opened = 0
        self.dropped = 0
        self.ended_early = 0
        self.failed: list[str] = []
        self.ready = asyncio.Event()


class Stream(asyncio.Protocol):
    """One change stream over HTTP/1.1 (chunked: a JSON line never spans two chunks, since
    slo-api writes whole lines, so the marks can be read straight off the bytes)."""

    def __init__(self, tally: Tally, request: bytes) -> None:
        self.tally = tally
        self.request = request
        self.transport: asyncio.WriteTransport | None = None
        self.started = False  # past the status line
        self.opened = False  # past the initial bookmark
        self.tail = b""
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.WriteTransport, transport)  # uvloop's are no subclass
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        data = self.tail + data
        if not self.started:
            if len(data) < 12:
                self.tail = data
                return
            if not data.startswith(b"HTTP/1.1 200"):
                self.tally.failed.append(data[:200].decode(errors="replace"))
                self._close()
                return
            self.started = True
        if not self.opened:
            at = data.find(INITIAL)
            if at < 0:
                self.tail = data[-64:]
                return
            self.opened = True
            self.tally.opened += 1
            if self.tally.opened == self.tally.count:
                self.tally.ready.set()
            data = data[at + len(INITIAL) :]
        end = data.rfind(b"\n")
        if end < 0:
            self.tail = data
            return
        complete, self.tail = data[: end + 1], data[end + 1 :]
        tally = self.tally
        for found in MARK.findall(complete):
            mark = int(found)
            tally.last[mark] = now
            tally.seen[mark] = tally.seen.get(mark, 0) + 1
        if ERROR in complete:
            tally.dropped += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:
            self.tally.ended_early += 1

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()


async def run(url: str, token: str, count: int, ready_file: Path) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = (
        f"GET /config?watch=true&kind=llm HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {token}\r\nAccept: application/x-ndjson\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    tally = Tally(count)
    streams: list[Stream] = []
    for _ in range(count):
        if stop.is_set():
            break
        stream = Stream(tally, request)
        connect = loop.create_connection(lambda s=stream: s, host, port)  # type: ignore[misc]
        await asyncio.wait_for(connect, 30)
        streams.append(stream)
        await asyncio.sleep(0.002)  # do not open a thousand connections in one instant
    ready = asyncio.create_task(tally.ready.wait())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([ready, stopped], return_when=asyncio.FIRST_COMPLETED)
    if tally.ready.is_set():
        await asyncio.to_thread(ready_file.touch)
    await stop.wait()
    ready.cancel()
    for stream in streams:
        stream._close()
    return {
        "last": tally.last,
        "seen": tally.seen,
        "dropped": tally.dropped,
        "ended_early": tally.ended_early,
        "failed": tally.failed[:5],
    }


def main() -> int:
    url, token, count, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    import uvloop

    result = uvloop.run(run(url, token, count, out.with_suffix(".ready")))
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
