"""Attainment: is each route meeting its SLO, from Prometheus (see docs/api.md#attainment)."""
