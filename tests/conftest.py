"""The real kube-apiserver and etcd, started once per test session for whichever tests ask."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.admin import Admin
from controlplane.cluster import Cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = Cluster().start(kubeconfig_dir=tmp_path_factory.mktemp("kubeconfigs"))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="session")
def admin(cluster: Cluster) -> Admin:
    assert cluster.admin is not None
    return cluster.admin


@pytest.fixture(scope="session")
def slo_api_kubeconfig(cluster: Cluster) -> Path:
    assert cluster.credentials is not None
    return cluster.credentials.slo_api_kubeconfig
