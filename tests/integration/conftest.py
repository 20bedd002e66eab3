"""Per-test fixtures on the session's control plane (see tests/conftest.py)."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.admin import Admin
from tests.integration.service import RunningService, running

_ids = itertools.count(1)


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
