"""`python -m bench.watchers URL TOKEN N OUT`: hold N change streams open, note when changes land.

The fan-out driver starts a few of these (one process cannot read 1,000 streams at 100 changes/s
and stay out of the way). Each opens N `GET /config?watch=true&kind=llm` streams with aiohttp,
touches a file named OUT + ".ready" once every stream has passed its initial bookmark, and on
SIGTERM writes OUT: for every change (identified by the `maximumDeployment.value` the driver
wrote) the time the last of its streams received it (time.monotonic, comparable across
processes) and how many of its streams did.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import time
from pathlib import Path

import aiohttp

MARK = re.compile(rb'"maximumDeployment":\{"type":"replica","value":(\d+)\}')


async def run(url: str, token: str, count: int, ready_file: Path) -> dict[str, object]:
    last: dict[int, float] = {}
    seen: dict[int, int] = {}
    dropped = 0
    opened = 0
    ready = asyncio.Event()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None, sock_connect=30)
    connector = aiohttp.TCPConnector(limit=0)

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal opened, dropped
        async with session.get(f"{url}/config?watch=true&kind=llm", headers=headers) as response:
            response.raise_for_status()
            # Read in chunks, not lines: a line-by-line reader of 1,000 streams would spend
            # more CPU than slo-api does, on the same machine.
            buffer = b""
            while b'"initial":true' not in buffer:
                chunk = await response.content.readany()
                if not chunk:
                    return
                buffer = buffer[-64:] + chunk
            opened += 1
            if opened == count:
                ready.set()
            tail = buffer[buffer.rfind(b"\n") + 1 :]
            while True:
                chunk = await response.content.readany()
                if not chunk:
                    return
                now = time.monotonic()
                end = chunk.rfind(b"\n")
                if end < 0:
                    tail += chunk
                    continue
                complete, tail = tail + chunk[: end + 1], chunk[end + 1 :]
                for found in MARK.findall(complete):
                    mark = int(found)
                    last[mark] = now
                    seen[mark] = seen.get(mark, 0) + 1
                if b'{"type":"ERROR"' in complete:
                    dropped += 1

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = []
        for _ in range(count):
            tasks.append(asyncio.create_task(one(session)))
            await asyncio.sleep(0.002)  # do not open a thousand connections in one instant
        await ready.wait()
        await asyncio.to_thread(ready_file.touch)
        await stop.wait()
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    ended = sum(1 for r in results if not isinstance(r, asyncio.CancelledError))
    return {"last": last, "seen": seen, "dropped": dropped, "ended_early": ended}


def main() -> int:
    url, token, count, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    import uvloop

    result = uvloop.run(run(url, token, count, out.with_suffix(".ready")))
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
