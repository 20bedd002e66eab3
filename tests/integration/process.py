"""slo-api as a real process (uvicorn on a loopback port), as operators run it."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from controlplane.demo import start_service, wait_ready
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


def spawn(kubeconfig: Path, log: Path, token: str = TOKEN, **env: str) -> Process:
    """Start `python -m slo_api` on a free loopback port, logging JSON lines to `log`."""
    port = free_port()
    with log.open("wb") as out:
        proc = start_service(kubeconfig, port, token, log_format="json", stdout=out, extra_env=env)
    return Process(proc, f"http://127.0.0.1:{port}", log)


async def start_process(kubeconfig: Path, tmp: Path, **env: str) -> Process:
    """A ready process (every kind synced); the caller stops it."""
    process = spawn(kubeconfig, tmp / "slo-api.log", **env)
    try:
        await asyncio.to_thread(wait_ready, process.url, process.proc, 30)
    except Exception as exc:
        process.proc.kill()
        raise AssertionError(f"{exc}: {process.log.read_text()}") from None
    return process
