"""Fixtures on a real kube-apiserver and etcd, started once per test session."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from controlplane.admin import Admin
from controlplane.cluster import Cluster
from tests.integration.service import RunningService, running

_ids = itertools.count(1)


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


@pytest.fixture
def namespace(admin: Admin) -> str:
    """A fresh namespace: without a controller manager, deleted ones never finish terminating."""
    name = f"t{os.getpid() % 10000}-{next(_ids)}"
    admin.ensure_namespace(name)
    return name


@pytest.fixture
async def service(slo_api_kubeconfig: Path) -> AsyncIterator[RunningService]:
    """slo-api with the slo-api ServiceAccount's credentials, ready (every kind synced)."""
    async with running(slo_api_kubeconfig) as started:
        yield started
