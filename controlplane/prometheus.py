"""Debian's Prometheus (server and promtool) on a free loopback port, on a TSDB backfilled
from OpenMetrics text: the attainment tests' and the demo's Prometheus.

`backfill` writes blocks with `promtool tsdb create-blocks-from openmetrics` (samples may be
weeks old: retention is set far beyond them), then `start` serves that storage. Nothing is
scraped unless a scrape config is given. The process dies with its parent.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx

from controlplane.server import die_with_parent, free_port

RETENTION = "3650d"


def binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin")
    if found is None:
        raise RuntimeError(f"{name} not found: install Debian's prometheus (make test-tools)")
    return found


class Prometheus:
    def __init__(self, workdir: Path, scrape_config: str = "") -> None:
        self.workdir = workdir
        self.storage = workdir / "data"
        self.port = free_port()
        self.scrape_config = scrape_config
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def backfill(self, openmetrics: str, max_block_duration: str = "24h") -> None:
        """Store `openmetrics` (ending `# EOF`, timestamps in seconds) as TSDB blocks."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        source = self.workdir / "backfill.om"
        source.write_text(openmetrics)
        done = subprocess.run(
            [
                binary("promtool"),
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                f"--max-block-duration={max_block_duration}",
                str(source),
                str(self.storage),
            ],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"promtool failed: {done.stderr.decode(errors='replace')[-2000:]}")
        source.unlink()

    def start(self, timeout: float = 60) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 15s\n" + self.scrape_config)
        log = (self.workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.storage}",
                f"--storage.tsdb.retention.time={RETENTION}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        log.close()
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2) as http:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"prometheus exited: {self.log_text()[-2000:]}")
                try:
                    if http.get(f"{self.url}/-/ready").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"prometheus not ready in {timeout:g}s: {self.log_text()}")
                time.sleep(0.1)

    def log_text(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
