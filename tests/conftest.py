"""The real kube-apiserver and etcd, started once per test session for whichever tests ask."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.admin import Admin
from controlplane.cluster import Cluster


@contextlib.contextmanager
def control_plane(tmp_path_factory: pytest.TempPathFactory, label: str) -> Iterator[Cluster]:
    """A control plane started for its caller, kubeconfigs in a fresh temp directory; stopped
    on exit. Modules that stop the API server, compact etcd or delete CRDs start their own."""
    started = Cluster().start(kubeconfig_dir=tmp_path_factory.mktemp(label))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with control_plane(tmp_path_factory, "kubeconfigs") as started:
        yield started


@pytest.fixture(scope="session")
def admin(cluster: Cluster) -> Admin:
    assert cluster.admin is not None
    return cluster.admin


@pytest.fixture(scope="session")
def slo_api_kubeconfig(cluster: Cluster) -> Path:
    assert cluster.credentials is not None
    return cluster.credentials.slo_api_kubeconfig
