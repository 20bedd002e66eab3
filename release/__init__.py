"""Release tooling: the dependency locks (`make lock`) and the container image (`make image`)."""
