"""slo-api as a real process (uvicorn on a loopback port), as operators run it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from controlplane.server import free_port

TOKEN = "ops-token-do-not-log"


class Process:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log

    def lines(self) -> list[dict[str, object]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"unparsed": line})
        return out


async def start_process(kubeconfig: Path, tmp: Path, **env: str) -> Process:
    port = free_port()
    log = tmp / "slo-api.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "slo_api"],
        env={
            **os.environ,
            "SLO_API_TOKEN": TOKEN,
            "KUBECONFIG": str(kubeconfig),
            "PORT": str(port),
            "HOST": "127.0.0.1",
            "LOG_FORMAT": "json",
            **env,
        },
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"slo-api exited: {log.read_text()}")
            try:
                if (await client.get(f"{url}/readyz")).status_code == 200:
                    return Process(proc, url, log)
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    proc.kill()
    raise AssertionError(f"slo-api never ready: {log.read_text()}")
