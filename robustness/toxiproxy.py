"""Toxiproxy, started and stopped by a run: one TCP proxy between each slo-api replica and the
API server, and the network faults as its toxics (added for seconds, then removed).

The server is built from its Go module and cached as the control plane's binaries are
(controlplane/binaries.py, controlplane/go/toxiproxy); this module speaks its HTTP API."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from controlplane.binaries import ensure_toxiproxy
from controlplane.server import free_port

# Each network fault: Toxiproxy's toxic type, on the data coming back from the API server.
# latency: every answer and watch event delayed; stall (`timeout` 0): data dropped and the
# connection held open until the toxic goes, as a half-dead connection does; reset
# (`reset_peer` 0): connections reset by peer.
TOXICS = {"latency": "latency", "stall": "timeout", "reset": "reset_peer"}


class Toxiproxy:
    def __init__(self, folder: Path, seed: int) -> None:
        self.folder = folder
        self.seed = seed
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.api = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)

    def start(self) -> None:
        binary = ensure_toxiproxy()
        with (self.folder / "toxiproxy.log").open("ab") as out:
            self.proc = subprocess.Popen(
                [binary, "-host", "127.0.0.1", "-port", str(self.port), "-seed", str(self.seed)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.api.get("/version").raise_for_status()
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("toxiproxy did not start (toxiproxy.log)") from None
                time.sleep(0.1)

    def proxy(self, name: str, upstream: str) -> int:
        """A proxy to `upstream` (host:port); returns the port it listens on."""
        port = free_port()
        self.api.post(
            "/proxies",
            json={"name": name, "listen": f"127.0.0.1:{port}", "upstream": upstream},
        ).raise_for_status()
        return port

    def add(self, proxy: str, fault: str, attributes: dict[str, Any]) -> None:
        self.api.post(
            f"/proxies/{proxy}/toxics",
            json={
                "name": fault,
                "type": TOXICS[fault],
                "stream": "downstream",
                "toxicity": 1.0,
                "attributes": attributes,
            },
        ).raise_for_status()

    def remove(self, proxy: str, fault: str) -> None:
        self.api.delete(f"/proxies/{proxy}/toxics/{fault}").raise_for_status()

    def stop(self) -> None:
        self.api.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
