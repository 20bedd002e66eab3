"""slo-api: a REST front door onto the Kubernetes custom resources that hold inference SLOs."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# pyproject.toml's, as installed: the one place the version is written.
try:
    __version__ = version("slo-api")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
