"""A short soak in every test run: 16 clients for ~20 s while CRs churn (tests/soak/soak.py)."""

from __future__ import annotations

import pytest

from controlplane.cluster import Cluster
from tests.soak.__main__ import failures
from tests.soak.soak import run

pytestmark = pytest.mark.integration


async def test_a_short_soak_loses_nothing_and_leaves_nothing_behind(cluster: Cluster) -> None:
    figures = await run(20, 16, cluster=cluster, churn_rate=40)
    print(figures.as_dict())
    assert failures(figures, rss_growth_kib=48 * 1024) == [], figures
    # That the soak exercised the service, not how fast: a loaded machine serves a quarter of a
    # quiet one's requests (throughput is the bench's business).
    assert figures.requests > 400, figures
    assert figures.puts_acknowledged > 200, figures
    assert figures.watch_events > 300, figures
    assert figures.relists >= 4, figures
    assert figures.statuses.get("404", 0) < figures.requests, figures
