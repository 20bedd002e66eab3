"""`python -m robustness run` (a run against the real control plane) and
`python -m robustness check RECORDING` (rerun the validators on a recording)."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from robustness.recording import FormatError, load
from robustness.validators import VALIDATORS, report, validate

RESULTS = Path(".robustness")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m robustness")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="rerun the validators on a recording")
    check.add_argument("recording", type=Path)
    check.add_argument(
        "--only", action="append", choices=sorted(VALIDATORS), default=[], help="one validator"
    )
    run = commands.add_parser("run", help="one run against the real control plane")
    run.add_argument("--seed", type=int, default=None, help="random when not given (printed)")
    run.add_argument("--duration", type=float, default=120.0, help="seconds of traffic")
    run.add_argument("--results", type=Path, default=RESULTS)
    run.add_argument("--routes", type=int, default=3, help="LLM and job CRs per namespace")
    run.add_argument("--workers", type=int, default=3, help="concurrent writers and readers")
    run.add_argument("--watchers", type=int, default=3, help="change-stream watchers")
    from robustness.faults import FAULTS

    for name in FAULTS:
        run.add_argument(f"--no-{name}", action="store_true", help=f"no {name} fault")
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args, FAULTS)
    try:
        recording = load(args.recording)
    except (OSError, FormatError) as exc:
        print(f"cannot read {args.recording}: {exc}", file=sys.stderr)
        return 2
    violations = validate(recording, tuple(args.only))
    sys.stdout.write(report(recording, violations))
    return 1 if violations else 0


def _run(args: argparse.Namespace, faults: tuple[str, ...]) -> int:
    from robustness.run import Options, run

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    off = [name for name in faults if getattr(args, f"no_{name}")]
    command = ["python", "-m", "robustness", "run", "--seed", str(seed)]
    command += ["--duration", f"{args.duration:g}", *(f"--no-{name}" for name in off)]
    for flag, default in (("routes", 3), ("workers", 3), ("watchers", 3)):
        if getattr(args, flag) != default:
            command += [f"--{flag}", str(getattr(args, flag))]
    print(f"seed {seed}: {' '.join(command)}", flush=True)
    options = Options(
        seed=seed,
        duration=args.duration,
        faults=tuple(name for name in faults if name not in off),
        results=args.results,
        routes=args.routes,
        workers=args.workers,
        watchers=args.watchers,
    )
    return run(options, command)


if __name__ == "__main__":
    sys.exit(main())
