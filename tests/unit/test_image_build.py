"""How `make image` and the image test call podman (the build itself is in test_image.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from release import image as images


def test_the_build_runs_where_podman_has_no_runtime_per_step_and_no_network_setup() -> None:
    argv = images.build_command("slo-api:x")
    assert argv[:2] == ["podman", "build"]
    assert "--isolation=chroot" in argv
    assert argv[argv.index("--network") + 1] == "host"
    assert argv[argv.index("--tag") + 1] == "slo-api:x"
    assert argv[-1] == str(images.REPO)
    assert not [a for a in argv if a.startswith("PYTHON_IMAGE=")]  # the Dockerfile's default


def test_a_base_and_a_ca_bundle_are_passed_as_build_arg_and_secret(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    argv = images.build_command("t", base="localhost/base:1", ca=ca)
    assert argv[argv.index("--build-arg") + 1] == "PYTHON_IMAGE=localhost/base:1"
    assert argv[argv.index("--secret") + 1] == f"id=ca-bundle,src={ca}"
    assert "--mount=type=secret,id=ca-bundle" in images.DOCKERFILE.read_text()


def test_the_ca_bundle_is_ssl_cert_file_else_the_distributions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine.pem"
    mine.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(mine))
    assert images.ca_bundle() == mine
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    monkeypatch.setattr(images, "CA_BUNDLES", (tmp_path / "none.pem", mine))
    assert images.ca_bundle() == mine
    monkeypatch.setattr(images, "CA_BUNDLES", ())
    assert images.ca_bundle() is None


def test_a_machine_without_podman_is_told_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = images.podman_problem()
    assert problem is not None
    assert "podman is not installed" in problem


def test_the_debian_base_packages_are_the_ones_the_dockerfile_names() -> None:
    packages = images.debian_packages()
    assert "python3" in packages
    assert "python3-venv" in packages  # `python3 -m venv` with pip, in the build stage


def test_the_oci_labels_are_build_arguments_from_the_checkout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764547200")
    found = images.labels("https://git.example.com/platform/slo-api")
    assert found["SOURCE"] == "https://git.example.com/platform/slo-api"
    assert found["CREATED"] == "2025-12-01T00:00:00Z"
    assert re.fullmatch(r"[0-9a-f]{40}", found["REVISION"])
    argv = images.build_command("t", build_args=found)
    assert f"REVISION={found['REVISION']}" in argv
    dockerfile = images.DOCKERFILE.read_text()
    for name, label in (("SOURCE", "source"), ("REVISION", "revision"), ("CREATED", "created")):
        assert f"ARG {name}=" in dockerfile
        assert f'org.opencontainers.image.{label}="${{{name}}}"' in dockerfile


@pytest.mark.parametrize(
    ("remote", "label"),
    [
        ("https://user:s3cret@github.com/acme/slo-api.git", "https://github.com/acme/slo-api.git"),
        ("git@github.com:acme/slo-api.git", "https://github.com/acme/slo-api.git"),
        ("ssh://git@git.example.com:2222/acme/slo-api", "https://git.example.com/acme/slo-api"),
        (
            "https://git.example.com:8443/acme/slo-api?x=1",
            "https://git.example.com:8443/acme/slo-api",
        ),
        ("/srv/git/slo-api", ""),
    ],
)
def test_a_remote_is_labelled_without_credentials(remote: str, label: str) -> None:
    assert images.without_credentials(remote) == label
