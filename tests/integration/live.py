"""slo-api as its own process on a loopback port, driven synchronously (fuzzing, properties)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from controlplane.demo import ServiceError, stop_service, wait_ready
from tests.integration.process import spawn

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
    process = spawn(kubeconfig, log, TOKEN, LOG_LEVEL="warning", SHUTDOWN_GRACE_SECONDS="0", **env)
    try:
        try:
            wait_ready(process.url, process.proc, 30)
        except ServiceError as exc:
            raise AssertionError(f"{exc}: {log.read_text()}") from None
        with httpx.Client(base_url=process.url, headers=AUTH, timeout=30) as client:
            yield Live(process.url, client, process.proc, log)
    finally:
        stop_service(process.proc, timeout=30)
