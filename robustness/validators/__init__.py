"""The validators: each a named function of a recording (and its ground truth, indexed) that
returns the violations of one promise, each with a readable report."""

from __future__ import annotations

from robustness.model import build
from robustness.recording import Recording
from robustness.validators.base import Validator, Violation
from robustness.validators.history import history
from robustness.validators.state import convergence, guardrails, liveness, readiness, reads
from robustness.validators.streams import streams
from robustness.validators.writes import acknowledged_writes, conditional_writes, gitops

VALIDATORS: dict[str, Validator] = {
    "convergence": convergence,
    "acknowledged_writes": acknowledged_writes,
    "history": history,
    "streams": streams,
    "conditional_writes": conditional_writes,
    "gitops": gitops,
    "guardrails": guardrails,
    "liveness": liveness,
    "readiness": readiness,
    "reads": reads,
}

__all__ = ["VALIDATORS", "Violation", "report", "validate"]


def validate(recording: Recording, only: tuple[str, ...] = ()) -> list[Violation]:
    ground = build(recording)
    found: list[Violation] = []
    for name, check in VALIDATORS.items():
        if not only or name in only:
            found += check(recording, ground)
    return found


def report(recording: Recording, violations: list[Violation]) -> str:
    """The report a failing run prints: the seed, how to replay it, each violation."""
    meta = recording.meta
    lines = [
        f"seed {meta.seed}: {len(violations)} violation(s) of slo-api's promises"
        if violations
        else f"seed {meta.seed}: every validator passed",
    ]
    if violations and meta.command:
        lines.append("replay: " + " ".join(meta.command))
    counts: dict[str, int] = {}
    for v in violations:
        counts[v.validator] = counts.get(v.validator, 0) + 1
    for name in VALIDATORS:
        lines.append(f"  {name}: {counts.get(name, 0)} violation(s)")
    lines += ["", *(v.render() + "\n" for v in violations)]
    return "\n".join(lines).rstrip() + "\n"
