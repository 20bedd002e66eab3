"""Release tooling: the dependency locks (`make lock`), the container image (`make image`) and
the generated settings table in docs/operating.md (`make docs`)."""
