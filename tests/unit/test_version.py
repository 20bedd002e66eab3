"""One version: pyproject.toml's. The package, both programs' `--version`, the OpenAPI document,
the image's tag and label and the manifests all say it."""

from __future__ import annotations

import importlib.metadata
import re
import signal
from pathlib import Path

import pytest
import uvicorn
import yaml
from fastapi import FastAPI

import slo_api
from release import image as images
from release.version import version
from slo_api import __main__ as server
from slo_api.cli import __main__ as sloctl

REPO = Path(__file__).resolve().parents[2]
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")


def test_the_version_is_semantic_and_the_installed_packages() -> None:
    assert SEMVER.fullmatch(version())
    assert importlib.metadata.version("slo-api") == version()
    assert slo_api.__version__ == version()


@pytest.mark.parametrize("main", [server.main, sloctl.main], ids=["slo-api", "sloctl"])
def test_both_programs_say_it(main: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert callable(main)
    assert main(["--version"]) == 0
    out = capsys.readouterr().out.split()
    assert out[-1] == version()


def test_the_openapi_document_says_it() -> None:
    document = yaml.safe_load((REPO / "openapi.yaml").read_text())
    assert document["info"]["version"] == version()


def test_the_image_is_tagged_and_labelled_with_it() -> None:
    assert f"slo-api:{version()}" == images.DEFAULT_TAG
    assert images.labels("https://git.example.com/x")["VERSION"] == version()
    assert 'org.opencontainers.image.version="${VERSION}"' in images.DOCKERFILE.read_text()
    makefile = (REPO / "Makefile").read_text()
    assert "IMAGE ?= slo-api:$(VERSION)" in makefile


def test_the_manifests_name_it() -> None:
    manager = REPO / "config" / "manager"
    kustomization = yaml.safe_load((manager / "kustomization.yaml").read_text())
    assert [i.get("newTag") for i in kustomization["images"]] == [version()]
    deployment = next(
        d
        for d in yaml.safe_load_all((manager / "deployment.yaml").read_text())
        if d and d["kind"] == "Deployment"
    )
    assert deployment["metadata"]["labels"]["app.kubernetes.io/version"] == version()
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert container["image"] == f"slo-api:{version()}"


def test_the_upgrade_guide_names_it() -> None:
    assert f"**{version()}**" in (REPO / "docs" / "upgrade.md").read_text()


def _server(grace: float) -> server.Server:
    return server.Server(uvicorn.Config(FastAPI()), FastAPI(), grace_seconds=grace)


def test_a_sigterm_is_a_clean_stop_and_a_sigint_still_interrupts() -> None:
    """What `slo-api` exits with: 0 after a SIGTERM it drained (Kubernetes' stop), while a
    Ctrl-C (SIGINT) is raised again once the server stopped, as uvicorn does."""
    # Python's own handlers, as a process starts with (an earlier test may have left others).
    before = {
        sig: signal.signal(sig, handler)
        for sig, handler in (
            (signal.SIGINT, signal.default_int_handler),
            (signal.SIGTERM, signal.SIG_DFL),
        )
    }
    try:
        term = _server(0)
        with term.capture_signals():
            signal.raise_signal(signal.SIGTERM)
        assert term.should_exit
        interrupt = _server(0)
        with pytest.raises(KeyboardInterrupt), interrupt.capture_signals():
            signal.raise_signal(signal.SIGINT)
        assert interrupt.should_exit
        # The handlers in place before serving are back.
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
