"""A real kube-apiserver and etcd on loopback, for tests, `make cluster` and `make demo`.

Not part of the slo-api package: it is development tooling that the test suite and the
Makefile import from the repository root.
"""
