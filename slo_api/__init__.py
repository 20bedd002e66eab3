"""slo-api: a REST front door onto SLO custom resources."""
