"""Debian's Prometheus on a free loopback port, scraping given targets, optionally backfilled.

`make demo` (and the browser tests) run it: history written as OpenMetrics is turned into
blocks with `promtool tsdb create-blocks-from openmetrics` before the server starts, so a
month of data is there at once. Its data directory is its own and goes with it.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx

from controlplane.server import StartError, die_with_parent, free_port

SCRAPE_SECONDS = 5

CONFIG = """\
global:
  scrape_interval: {interval}s
  evaluation_interval: {interval}s
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: [{targets}]
"""


def find(command: str) -> str:
    # Debian installs them in /usr/bin; look in the sbin directories too, as make does.
    found = shutil.which(command) or shutil.which(command, path="/usr/sbin:/sbin:/usr/bin")
    if found is None:
        raise StartError(
            f"{command} is missing: Debian's prometheus package provides it "
            "(make demo installs it when run as root; else sudo apt-get install -y prometheus)"
        )
    return found


class Prometheus:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def backfill(self, openmetrics: str) -> None:
        """Blocks from OpenMetrics text (timestamps in seconds, ending in `# EOF`)."""
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        source = self.workdir / "history.om"
        source.write_text(openmetrics)
        done = subprocess.run(
            # Blocks as long as the history (not promtool's default 2h, hundreds of them).
            [
                find("promtool"),
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "--max-block-duration=720h",
                str(source),
                str(data),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        source.unlink()
        if done.returncode != 0:
            raise StartError(f"promtool could not backfill: {done.stderr[-2000:]}")

    def start(self, targets: list[str], timeout: float = 60) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        quoted = ", ".join(f'"{t}"' for t in targets)
        config.write_text(CONFIG.format(interval=SCRAPE_SECONDS, targets=quoted))
        log = (self.workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                find("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                "--storage.tsdb.retention.time=60d",
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
                    raise StartError(f"prometheus exited: {self.log_text()[-2000:]}")
                try:
                    if http.get(f"{self.url}/-/ready").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise StartError(f"prometheus not ready in {timeout:g}s: {self.log_text()}")
                time.sleep(0.2)

    def wait_for_scrape(self, query: str = "up", timeout: float = 30) -> None:
        """Until every target has been scraped once (`up` is 1 for each)."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5) as http:
            while time.monotonic() < deadline:
                answer = http.get(f"{self.url}/api/v1/query", params={"query": query}).json()
                results = answer.get("data", {}).get("result", [])
                if results and all(r["value"][1] == "1" for r in results):
                    return
                time.sleep(0.5)
        raise StartError(f"prometheus did not scrape its targets in {timeout:g}s")

    def log_text(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
