"""The one rule for route names, shared by the index (which lists routes) and the API (which
addresses them): a route it could not address is not listed either.

The CRDs' `serviceId` carries the same rule (`maxLength` and `pattern`); pool routes are
metadata names, which Kubernetes already keeps within it.
"""

from __future__ import annotations

import re

MAX_ROUTE = 253
# `/routes/{route}/history` is a route's history, so no route name ends with it (route names
# may hold `/`: without this, `a/history` would be both a route and the history of `a`).
HISTORY = "/history"
# Likewise `/routes/{route}/attainment`: whether the route meets its SLO.
ATTAINMENT = "/attainment"
# One scan in C: a generator over the characters was 1.5% of a GET's CPU.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def route_problem(route: str) -> str | None:
    """Why `route` cannot be a route name, or None when it can."""
    if len(route) > MAX_ROUTE:
        return f"route names are at most {MAX_ROUTE} characters"
    if _CONTROL.search(route):
        return "route names cannot contain control characters"
    if route.endswith(HISTORY):
        return f"route names cannot end with {HISTORY!r} (that path is the route's history)"
    if route.endswith(ATTAINMENT):
        return f"route names cannot end with {ATTAINMENT!r} (that path is the route's attainment)"
    return None


def valid_route(route: str) -> bool:
    return bool(route) and route_problem(route) is None
