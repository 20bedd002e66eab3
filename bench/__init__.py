"""`python -m bench`: slo-api's benchmarks against side-by-side baselines (not shipped)."""
