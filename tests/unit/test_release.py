"""`make release`'s fast parts: the bundle pinned and rendered, the SBOM from the lock, the sums,
the image archive's digest (the image build itself: tests/integration/test_image.py)."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from release import bundle, dist, sbom
from release.lock import RUNTIME
from release.version import version

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
DIGEST = "sha256:" + "ab" * 32


def _identity(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata", {})
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def _deployment_image(objs: list[dict[str, Any]]) -> str:
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return str(container["image"])


def test_the_bundle_pins_the_image_to_the_digest_and_changes_nothing_else(tmp_path: Path) -> None:
    pinned = bundle.pin(CONFIG, tmp_path / "config", DIGEST)
    changed = [
        str(p.relative_to(pinned))
        for p in sorted(pinned.rglob("*"))
        if p.is_file() and p.read_bytes() != (CONFIG / p.relative_to(pinned)).read_bytes()
    ]
    assert changed == ["manager/kustomization.yaml"]
    assert sorted(p.relative_to(pinned) for p in pinned.rglob("*")) == sorted(
        p.relative_to(CONFIG) for p in CONFIG.rglob("*")
    )
    images = yaml.safe_load((pinned / "manager" / "kustomization.yaml").read_text())["images"]
    assert images == [{"name": "slo-api", "digest": DIGEST}]
    assert _deployment_image(bundle.render_here(pinned)) == f"slo-api@{DIGEST}"


def test_the_python_rendering_is_kubectl_kustomizes(tmp_path: Path) -> None:
    pinned = bundle.pin(CONFIG, tmp_path / "config", DIGEST, "registry.example/team/slo-api")
    ours = bundle.render_here(pinned)
    theirs = bundle.render_with_kubectl(pinned)
    assert sorted(map(_identity, ours)) == sorted(map(_identity, theirs))
    assert sorted(ours, key=_identity) == sorted(theirs, key=_identity)
    # The same order too, where the order matters: what others need comes first.
    assert [o["kind"] for o in ours] == [o["kind"] for o in theirs]
    assert _deployment_image(ours) == f"registry.example/team/slo-api@{DIGEST}"
    # And the shipped tree, unpinned: the tag of the version.
    assert _deployment_image(bundle.render_here(CONFIG)) == f"slo-api:{version()}"


def test_what_the_python_rendering_does_not_know_is_refused() -> None:
    with pytest.raises(bundle.BundleError, match="patches"):
        bundle.render_here(CONFIG / "overlays" / "namespaced")
    with pytest.raises(bundle.BundleError, match="not an image digest"):
        bundle.pin(CONFIG, Path("/nonexistent"), "latest")


def test_the_sbom_lists_every_locked_pin_with_its_hashes() -> None:
    lock = RUNTIME.path.read_text()
    document = sbom.sbom("slo-api", version(), lock, "2026-12-04T00:00:00Z")
    assert (document["bomFormat"], document["specVersion"]) == ("CycloneDX", "1.5")
    subject = document["metadata"]["component"]
    assert (subject["name"], subject["version"]) == ("slo-api", version())
    assert subject["purl"] == f"pkg:pypi/slo-api@{version()}"
    components = {c["name"]: c for c in document["components"]}
    pins = dict(dist_pin for dist_pin in _pins(lock))
    assert {n: c["version"] for n, c in components.items()} == pins
    for name, component in components.items():
        assert component["purl"] == f"pkg:pypi/{name}@{pins[name]}"
        hashes = {h["content"] for h in component["hashes"]}
        assert hashes, name
        assert all(f"--hash=sha256:{h}" in lock for h in hashes)
    assert sum(len(c["hashes"]) for c in components.values()) == lock.count("--hash=sha256:")
    # The same lock and commit: the same document.
    assert sbom.sbom("slo-api", version(), lock, "2026-12-04T00:00:00Z") == document


def _pins(lock: str) -> list[tuple[str, str]]:
    """The lock's pins read as pip reads a requirements file's `name==version` lines."""
    found = []
    for line in lock.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            requirement = line.split(";")[0].split("\\")[0].strip()
            name, _, pinned = requirement.partition("==")
            found.append((sbom.canonical(name.split("[")[0]), pinned))
    return found


def test_a_pin_with_extras_or_markers_is_read() -> None:
    lock = (
        "uvicorn[standard]==0.38.0 ; python_version >= '3.11' \\\n"
        f"    --hash=sha256:{'1' * 64} \\\n    --hash=sha256:{'2' * 64}\n"
        f"Typing_Extensions==4.12.2 \\\n    --hash=sha256:{'3' * 64}\n"
    )
    assert [(p.name, p.version, len(p.hashes)) for p in sbom.pinned(lock)] == [
        ("uvicorn", "0.38.0", 2),
        ("typing-extensions", "4.12.2", 1),
    ]


def test_the_sums_are_what_sha256sum_checks(tmp_path: Path) -> None:
    (tmp_path / "a.whl").write_bytes(b"wheel")
    (tmp_path / "b.yaml").write_text("kind: x\n")
    (tmp_path / dist.SUMS).write_text("stale\n")
    sums = dist.write_sums(tmp_path)
    assert [line.split("  ")[1] for line in sums.read_text().splitlines()] == ["a.whl", "b.yaml"]
    checked = subprocess.run(
        ["sha256sum", "--check", "--strict", dist.SUMS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "a.whl").write_bytes(b"tampered")
    tampered = subprocess.run(
        ["sha256sum", "--check", dist.SUMS], cwd=tmp_path, capture_output=True, check=False
    )
    assert tampered.returncode != 0


def _oci_archive(path: Path, index: dict[str, Any]) -> Path:
    with tarfile.open(path, "w") as tar:
        data = json.dumps(index).encode()
        info = tarfile.TarInfo("index.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_the_image_digest_is_the_archives_manifest(tmp_path: Path) -> None:
    manifest = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": DIGEST}
    archive = _oci_archive(tmp_path / "one.tar", {"schemaVersion": 2, "manifests": [manifest]})
    assert dist.oci_digest(archive) == DIGEST
    two = _oci_archive(tmp_path / "two.tar", {"manifests": [manifest, manifest]})
    with pytest.raises(dist.ReleaseError, match="2 images"):
        dist.oci_digest(two)


def test_the_bundle_tarball_is_the_same_bytes_for_the_same_files(tmp_path: Path) -> None:
    pinned = bundle.pin(CONFIG, tmp_path / "config", DIGEST)
    dist.tarball(pinned, tmp_path / "one.tar.gz", 1764547200)
    # A file's time (a checkout's, a copy's) is not the release's.
    (pinned / "rbac" / "rbac.yaml").touch()
    (tmp_path / "again").mkdir()
    dist.tarball(pinned, tmp_path / "again" / "one.tar.gz", 1764547200)
    again = (tmp_path / "again" / "one.tar.gz").read_bytes()
    assert (tmp_path / "one.tar.gz").read_bytes() == again
    with tarfile.open(tmp_path / "one.tar.gz") as tar:
        names = tar.getnames()
    assert "config/manager/kustomization.yaml" in names
    assert "config/crd/kustomization.yaml" in names


def test_make_release_builds_into_the_versions_folder_on_the_base_asked_for() -> None:
    makefile = (REPO / "Makefile").read_text()
    target = makefile[makefile.index("\nrelease:") :].split("\n\n")[0]
    assert "-m release.dist" in target
    assert "--debian-base" in target
    assert "--base $(BASE)" in target
