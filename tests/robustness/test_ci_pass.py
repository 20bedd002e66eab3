"""The CI pass of the robustness harness (docs/development.md): two fixed seeds, a short run
each with every fault kind at least once, against a control plane and slo-api replicas of the
run's own; any violation of slo-api's promises fails the suite with its seed, the command
that replays it and the report."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from robustness.faults import FAULTS
from robustness.run import Options, Run

pytestmark = pytest.mark.integration

# Seconds of traffic per seed: long enough for every fault kind and a minute of traffic
# around them, short enough for a suite run.
DURATION = 60.0
SEEDS = (11, 2026)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_short_robustness_run_finds_no_violation(seed: int) -> None:
    command = ["python", "-m", "robustness", "run", "--seed", str(seed)]
    command += ["--duration", f"{DURATION:g}"]
    run = Run(
        Options(seed=seed, duration=DURATION, faults=FAULTS, results=Path(".robustness")),
        command,
    )
    asyncio.run(run.main())
    faults = {f.name for f in run.outcome.faults}
    assert faults == set(FAULTS), f"seed {seed}: faults that ran: {sorted(faults)}"
    assert not run.outcome.violations, (
        f"seed {seed} broke slo-api's promises; replay: {' '.join(command)}\n"
        f"recording and report: {run.folder}\n{run.outcome.report}"
    )
