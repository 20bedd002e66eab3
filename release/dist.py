"""`make release`: every artifact of a release in one folder, `dist/<version>/`.

- the wheel and the sdist, built with the backend pinned in requirements-build.lock (`uv build`);
- the image (`make image`'s build, tagged `slo-api:<version>`) saved as an OCI archive, and its
  manifest digest beside it: the digest a registry serves once the archive is copied there with
  its digests preserved (`skopeo copy --preserve-digests`);
- the kustomize bundle: config/ with the image pinned to that digest (a tarball to apply with
  `kubectl apply -k`), and what its top level installs, rendered into one YAML file;
- the SBOM of the locked runtime dependencies (CycloneDX JSON, release/sbom.py);
- SHA256SUMS over all of them (`sha256sum -c SHA256SUMS` checks them).

The version is pyproject.toml's (release/version.py); file times come from the commit
(`SOURCE_DATE_EPOCH` when set), so two runs on one commit make the same files but the image.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from release import bundle, sbom
from release import image as images
from release.lock import BUILD
from release.version import version

REPO = Path(__file__).resolve().parent.parent
SUMS = "SHA256SUMS"
NAME = "slo-api"


class ReleaseError(RuntimeError):
    pass


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_sums(directory: Path) -> Path:
    """SHA256SUMS over every file of `directory` (sha256sum's format, by name)."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != SUMS)
    path = directory / SUMS
    path.write_text("".join(f"{sha256(p)}  {p.name}\n" for p in files))
    return path


def oci_digest(archive: Path) -> str:
    """The manifest digest of the one image in an OCI archive (its index.json names it)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ReleaseError(f"{archive} has no index.json: not an OCI archive")
        index = json.load(member)
    manifests = index.get("manifests") or []
    if len(manifests) != 1:
        raise ReleaseError(f"{archive} holds {len(manifests)} images, not one")
    digest = str(manifests[0].get("digest", ""))
    if not bundle.DIGEST.fullmatch(digest):
        raise ReleaseError(f"{archive}: not a sha256 digest: {digest!r}")
    return digest


def tarball(directory: Path, path: Path, mtime: int) -> None:
    """`directory` as a .tar.gz under its own name, the same bytes for the same files."""

    def normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
        info.mode = 0o755 if info.isdir() else 0o644
        return info

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in [directory, *sorted(directory.rglob("*"))]:
            tar.add(
                entry,
                arcname=str(entry.relative_to(directory.parent)),
                recursive=False,
                filter=normalized,
            )
    with path.open("wb") as out, gzip.GzipFile("", "wb", fileobj=out, mtime=mtime) as gz:
        gz.write(raw.getvalue())


def python_dists(out: Path, mtime: int) -> list[Path]:
    """The sdist, and the wheel built from it, with the locked build backend."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                sys.executable, "-m", "uv", "build", "--sdist", "--wheel",
                "--out-dir", tmp,
                "--build-constraint", str(BUILD.path), "--require-hashes",
                str(REPO),
            ],
            env={**os.environ, "SOURCE_DATE_EPOCH": str(mtime)},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise ReleaseError(f"uv build failed:\n{done.stdout}{done.stderr}")
        built = sorted(Path(tmp).glob("*.whl")) + sorted(Path(tmp).glob("*.tar.gz"))
        if len(built) != 2:
            raise ReleaseError(f"uv build made {[p.name for p in built]}, not a wheel and sdist")
        return [Path(shutil.copy2(p, out / p.name)) for p in built]


def image_archive(out: Path, tag: str, base: str | None, source: str | None) -> tuple[Path, str]:
    """`make image`'s build of `tag`, saved as an OCI archive; and its manifest digest."""
    images.build(tag, base, show=True, source=source)
    archive = out / f"{NAME}-{version()}.oci.tar"
    images.save(tag, archive)
    digest = oci_digest(archive)
    (out / f"{archive.name}.digest").write_text(digest + "\n")
    return archive, digest


def kustomize_bundle(out: Path, digest: str, repository: str, mtime: int) -> list[Path]:
    """config/ pinned to `digest` (a tarball), and its top level rendered (one YAML file)."""
    with tempfile.TemporaryDirectory() as tmp:
        name = f"{NAME}-{version()}-config"
        pinned = bundle.pin(REPO / "config", Path(tmp) / name, digest, repository)
        objs, renderer = bundle.render(pinned)
        archive = out / f"{name}.tar.gz"
        tarball(pinned, archive, mtime)
    rendered = out / f"{NAME}-{version()}.yaml"
    rendered.write_text(
        f"# slo-api {version()}: what `kubectl apply -k config/` installs, the image pinned\n"
        f"# by digest (rendered by {renderer}). The CRDs and the namespace, installed apart,\n"
        f"# are in {archive.name}.\n" + bundle.dump(objs)
    )
    return [archive, rendered]


def release(
    out: Path,
    base: str | None = None,
    repository: str = bundle.IMAGE,
    source: str | None = None,
) -> Path:
    folder = out / version()
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    mtime = images.commit_epoch() or 0
    python_dists(folder, mtime)
    _, digest = image_archive(folder, f"{NAME}:{version()}", base, source)
    kustomize_bundle(folder, digest, repository, mtime)
    created = datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sbom.write(folder / f"{NAME}-{version()}.cdx.json", NAME, version(), created)
    write_sums(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m release.dist", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="default: dist/")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--base", help="the image's base (default: the Dockerfile's python:3.11-slim, by digest)"
    )
    where.add_argument(
        "--debian-base",
        action="store_true",
        help="build the image's base from Debian's packages with mmdebstrap "
        "(for machines that reach no image registry)",
    )
    parser.add_argument(
        "--repository",
        default=bundle.IMAGE,
        help="where the image will be pushed, as the bundle names it "
        f"(default {bundle.IMAGE}: set it with kustomize's `images` in an overlay)",
    )
    parser.add_argument("--source", help="the image's source label (default: git remote origin)")
    args = parser.parse_args(argv)
    try:
        base = images.debian_base(show=True) if args.debian_base else args.base
        folder = release(args.out, base, args.repository, args.source)
    except (ReleaseError, images.ImageError, bundle.BundleError) as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"released {version()} into {folder}:")
    print((folder / SUMS).read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
