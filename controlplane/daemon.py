"""A helper server the tests and the demo run beside the control plane (Jaeger, Prometheus):
started with its output in a log file, waited for until an HTTP endpoint answers 200, stopped
with SIGTERM (then SIGKILL). Every such server dies with its parent."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from controlplane.server import die_with_parent


class Daemon:
    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def log_text(self) -> str:
        path = self.log_path
        return path.read_text(errors="replace") if path.exists() else ""

    def run(self, command: list[str], ready_url: str, timeout: float) -> None:
        """Start `command`, then wait until `ready_url` answers 200 (or fail with its log)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2) as http:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: {self.log_text()[-2000:]}")
                try:
                    if http.get(ready_url).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.name} not ready in {timeout:g}s: {self.log_text()}")
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
