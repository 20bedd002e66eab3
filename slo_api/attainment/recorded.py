"""The series `sloctl rules` records for each route and slo-api's attainment reads in place of
the raw ones: one home for their names, imported by both (this module imports nothing, so
sloctl, which imports nothing else of the server, stays a client of the HTTP API).

Each route's 5-minute increases of its buckets and sum, summed over its series, labelled
`route` and `metric` (`le` on the buckets), in a group of its own evaluated every step.
"""

from __future__ import annotations

BUCKETS = "slo_api:bucket:increase5m"
SUMS = "slo_api:sum:increase5m"
# The recording groups' interval and the increase's range: the server sums one point per step.
STEP_SECONDS = 300
STEP = "5m"


def group(route: str) -> str:
    """The name of the group recording `route`'s series."""
    return f"slo-api.{route}.increase{STEP}"
