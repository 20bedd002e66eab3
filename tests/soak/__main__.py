"""`python -m tests.soak [--duration 300] [--clients 16]`: the long soak on a control plane of
its own; prints the figures as JSON and exits non-zero when a check failed."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from controlplane.cluster import Cluster
from tests.soak.soak import Figures, run


def failures(figures: Figures, rss_growth_kib: int) -> list[str]:
    problems = []
    if figures.unexpected:
        problems.append(f"{figures.unexpected} unexpected answers (5xx or impossible 4xx)")
    if figures.writes_lost:
        problems.append(f"{figures.writes_lost} acknowledged writes lost")
    if figures.stale_reads:
        problems.append(f"{figures.stale_reads} reads did not show the client's own write")
    if not figures.index_matches_cluster:
        problems.append(f"index differs from a fresh list: {figures.index_mismatch}")
    if figures.tasks_left or figures.sessions_left:
        problems.append(f"left behind: {figures.tasks_left}, {figures.sessions_left} sessions")
    growth = figures.rss_kib_at_end - figures.rss_kib_after_first_relists
    if growth > rss_growth_kib:
        problems.append(f"RSS grew by {growth} KiB")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--duration", type=float, default=300, help="seconds (default 300)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (16)")
    parser.add_argument("--churn-rate", type=float, default=60, help="admin changes/s (60)")
    parser.add_argument("--max-rss-growth-mib", type=float, default=64)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    async def soak() -> Figures:
        with Cluster() as cluster:
            return await run(
                args.duration, args.clients, cluster=cluster, churn_rate=args.churn_rate
            )

    figures = asyncio.run(soak())
    problems = failures(figures, int(args.max_rss_growth_mib * 1024))
    print(json.dumps({**figures.as_dict(), "problems": problems}, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
