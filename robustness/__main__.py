"""`python -m robustness check RECORDING`: rerun the validators on a recording."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from robustness.recording import FormatError, load
from robustness.validators import VALIDATORS, report, validate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m robustness")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="rerun the validators on a recording")
    check.add_argument("recording", type=Path)
    check.add_argument(
        "--only", action="append", choices=sorted(VALIDATORS), default=[], help="one validator"
    )
    args = parser.parse_args(argv)
    try:
        recording = load(args.recording)
    except (OSError, FormatError) as exc:
        print(f"cannot read {args.recording}: {exc}", file=sys.stderr)
        return 2
    violations = validate(recording, tuple(args.only))
    sys.stdout.write(report(recording, violations))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
