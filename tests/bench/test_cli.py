"""`make bench` starts: its command line is built before anything is measured.

A check of the benchmark tool, kept apart from the tests of slo-api: it runs bench as a
process, as `make bench` does, and imports none of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_bench_command_line_parses() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--only {fanout,kubernetes,history,attainment,flush,fleet,memory}" in done.stdout
