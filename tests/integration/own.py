"""A control plane of a test module's own, for the modules that stop the API server, compact
etcd, delete CRDs or write where other modules read: each says

    own, own_admin, kubeconfig = own_control_plane("faults")

(a module that needs only some binds only those: an unbound one is no fixture).
and its tests (and the shared fixtures that take `kubeconfig`) run against that one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from controlplane.admin import Admin
from controlplane.cluster import Cluster
from tests.conftest import control_plane


class Own(NamedTuple):
    cluster: Any
    admin: Any
    kubeconfig: Any


def own_control_plane(label: str, kubeconfig: str = "kubeconfig") -> Own:
    """The module's fixtures: its cluster (`own`), that cluster's admin (`own_admin`), and
    slo-api's kubeconfig onto it, named `kubeconfig` (or as given)."""

    @pytest.fixture(scope="module", name="own")
    def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
        with control_plane(tmp_path_factory, label) as started:
            yield started

    @pytest.fixture(scope="module", name="own_admin")
    def own_admin(own: Cluster) -> Admin:
        assert own.admin is not None
        return own.admin

    def slo_api_kubeconfig(own: Cluster) -> Path:
        assert own.credentials is not None
        return own.credentials.slo_api_kubeconfig

    fixture: Callable[..., Any] = pytest.fixture(scope="module", name=kubeconfig)
    return Own(own, own_admin, fixture(slo_api_kubeconfig))
