"""slo-api as its own process on a loopback port, driven synchronously (fuzzing, properties)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from controlplane.server import free_port

TOKEN = "live-write-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Live:
    url: str
    client: httpx.Client
    proc: subprocess.Popen[bytes]
    log: Path

    def wait_for(self, route: str, within: float = 15) -> None:
        """Poll until the process's index has the route (a GET of it is no longer 404)."""
        deadline = time.monotonic() + within
        while self.client.get(f"/routes/{route}").status_code == 404:
            if time.monotonic() > deadline:
                raise AssertionError(f"{route} never indexed")
            time.sleep(0.05)


@contextlib.contextmanager
def live_service(kubeconfig: Path, log: Path, **env: str) -> Iterator[Live]:
    """`python -m slo_api` on 127.0.0.1, ready (every kind synced); SIGTERM on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slo_api"],
            env={
                **os.environ,
                "SLO_API_TOKEN": TOKEN,
                "KUBECONFIG": str(kubeconfig),
                "PORT": str(port),
                "HOST": "127.0.0.1",
                "LOG_FORMAT": "json",
                "LOG_LEVEL": "warning",
                "SHUTDOWN_GRACE_SECONDS": "0",
                **env,
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:
            deadline = time.monotonic() + 30
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"slo-api exited: {log.read_text()}")
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/readyz").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise AssertionError(f"slo-api never ready: {log.read_text()}")
                time.sleep(0.1)
            yield Live(url, client, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
