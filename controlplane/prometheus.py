"""Debian's Prometheus (server and promtool) on a free loopback port, on a TSDB backfilled
from OpenMetrics text: the attainment tests' and the demo's Prometheus.

`backfill` writes blocks with `promtool tsdb create-blocks-from openmetrics` (samples may be
weeks old: retention is set far beyond them), then `start` serves that storage. Nothing is
scraped unless a scrape config is given. The process dies with its parent.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from controlplane.daemon import Daemon
from controlplane.server import free_port

RETENTION = "3650d"


def binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin")
    if found is None:
        raise RuntimeError(f"{name} not found: install Debian's prometheus (make test-tools)")
    return found


class Prometheus(Daemon):
    def __init__(self, workdir: Path, scrape_config: str = "") -> None:
        super().__init__("prometheus", workdir)
        self.storage = workdir / "data"
        self.port = free_port()
        self.scrape_config = scrape_config

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
        self.run(
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.storage}",
                f"--storage.tsdb.retention.time={RETENTION}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            f"{self.url}/-/ready",
            timeout,
        )
        return self
