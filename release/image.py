"""`make image`: builds the Dockerfile with podman (no Docker daemon needed).

The same build is what the image test runs, on a base image made from Debian's packages with
mmdebstrap when no image registry is reachable (`--debian-base`).

- pip inside the build trusts only the CA bundle it is given: the host's bundle, when it has one,
  goes in as the build secret `ca-bundle` (trusted for the downloads, never stored in a layer).
- `--isolation=chroot` builds where podman cannot start an OCI runtime for each RUN step (inside
  a container, say); `--network host` needs no network setup of its own.
- The OCI labels `version`, `source`, `revision` and `created` are build arguments: the
  version (pyproject.toml's), the repository's URL (`--source`, else the git remote `origin`
  without any credentials in it), the commit, and the commit's time (`SOURCE_DATE_EPOCH` when
  set), so two builds of one commit label alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path

from release.version import version

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
DEFAULT_TAG = f"slo-api:{version()}"  # what config/manager's Deployment names
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "slo-api" / "image"
# Debian's release whose python3 is the 3.11 the lock was resolved for.
DEBIAN_SUITE = "bookworm"
DEBIAN_VARIANT = "minbase"  # Essential and Priority: required packages: passwd's useradd is in
DEBIAN_PACKAGES_LINE = re.compile(r"^# Debian packages: (.+)$", re.M)
# Where distributions keep the system CA bundle (Debian's, then Fedora's).
CA_BUNDLES = (Path("/etc/ssl/certs/ca-certificates.crt"), Path("/etc/pki/tls/certs/ca-bundle.crt"))


class ImageError(RuntimeError):
    pass


def _run(argv: list[str], timeout: float, what: str, show: bool = False) -> str:
    """Runs argv; its output is shown as it comes when `show`, else only in the error."""
    try:
        done = subprocess.run(
            argv,
            stdout=None if show else subprocess.PIPE,
            stderr=None if show else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise ImageError(f"{what}: {argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise ImageError(f"{what}: no result after {timeout:.0f}s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout or "").strip().splitlines()[-30:])
        raise ImageError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout or ""


def ca_bundle() -> Path | None:
    """The CA bundle this machine trusts: $SSL_CERT_FILE, else the distribution's."""
    candidates = [Path(p) for p in [os.environ.get("SSL_CERT_FILE")] if p] + list(CA_BUNDLES)
    return next((p for p in candidates if p.is_file() and p.stat().st_size > 0), None)


def podman_problem() -> str | None:
    """Why podman cannot work on this machine, or None."""
    try:
        _run(["podman", "info", "--format", "{{.Store.GraphDriverName}}"], 120, "podman info")
    except ImageError as exc:
        return str(exc)
    return None


def _git(*args: str) -> str:
    """git's answer in the repository, or "" outside a checkout (a source tarball, say)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def without_credentials(url: str) -> str:
    """A remote's URL as a label may show it: no user or token, https for scp-like remotes."""
    scp = re.fullmatch(r"[\w.-]+@([\w.-]+):(.+)", url)
    if scp:
        return f"https://{scp[1]}/{scp[2]}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https", "ssh", "git") or not parts.hostname:
        return ""
    web = parts.scheme in ("http", "https")
    host = parts.hostname + (f":{parts.port}" if parts.port and web else "")
    scheme = parts.scheme if web else "https"
    return urllib.parse.urlunsplit((scheme, host, parts.path, "", ""))


def commit_epoch() -> int | None:
    """`SOURCE_DATE_EPOCH`, else the commit's time: when a build of this checkout says it was
    made (None outside a checkout)."""
    found = os.environ.get("SOURCE_DATE_EPOCH") or _git("log", "-1", "--format=%ct")
    return int(found) if found else None


def labels(source: str | None = None) -> dict[str, str]:
    """The Dockerfile's VERSION, SOURCE, REVISION and CREATED build arguments; empty ones
    left out."""
    epoch = commit_epoch()
    created = (
        datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if epoch is not None
        else ""
    )
    found = {
        "VERSION": version(),
        "SOURCE": source
        if source is not None
        else without_credentials(_git("remote", "get-url", "origin")),
        "REVISION": _git("rev-parse", "HEAD"),
        "CREATED": created,
    }
    return {k: v for k, v in found.items() if v}


def build_command(
    tag: str,
    base: str | None = None,
    ca: Path | None = None,
    build_args: dict[str, str] | None = None,
) -> list[str]:
    argv = ["podman", "build", "--isolation=chroot", "--network", "host", "--tag", tag]
    if base:
        argv += ["--build-arg", f"PYTHON_IMAGE={base}"]
    for name, value in (build_args or {}).items():
        argv += ["--build-arg", f"{name}={value}"]
    if ca:
        argv += ["--secret", f"id=ca-bundle,src={ca}"]
    return [*argv, "--file", str(DOCKERFILE), str(REPO)]


def build(
    tag: str,
    base: str | None = None,
    timeout: float = 900,
    show: bool = False,
    source: str | None = None,
) -> None:
    argv = build_command(tag, base, ca_bundle(), labels(source))
    _run(argv, timeout, f"podman build of {tag}", show)


def save(tag: str, archive: Path, timeout: float = 900) -> None:
    """The image as an OCI archive: its manifest digest is the one a registry serves after
    a copy that preserves digests (`skopeo copy --preserve-digests`)."""
    argv = ["podman", "save", "--format", "oci-archive", "--output", str(archive), tag]
    _run(argv, timeout, f"podman save of {tag}")


def image_size(tag: str) -> int:
    """Bytes, as `podman images` reports them (the uncompressed layers)."""
    out = _run(["podman", "image", "inspect", "--format", "{{.Size}}", tag], 60, "inspect")
    return int(out.strip())


def debian_packages() -> list[str]:
    """The packages a Debian base needs for the Dockerfile's stages, as the Dockerfile says."""
    found = DEBIAN_PACKAGES_LINE.search(DOCKERFILE.read_text())
    if not found:
        raise ImageError("the Dockerfile has no '# Debian packages: ...' line")
    return sorted(found[1].split())


def debian_base(cache: Path = CACHE, timeout: float = 900, show: bool = False) -> str:
    """A base image of Debian's python3, made with mmdebstrap; returns its podman name.

    The root filesystem tarball is cached under `cache`, keyed by what goes into it, and is
    imported into podman only when podman does not hold that image yet.
    """
    recipe = {"suite": DEBIAN_SUITE, "variant": DEBIAN_VARIANT, "packages": debian_packages()}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    name = f"localhost/slo-api-base:{DEBIAN_SUITE}-{key}"
    exists = subprocess.run(
        ["podman", "image", "exists", name], capture_output=True, timeout=60, check=False
    )
    if exists.returncode == 0:
        return name
    tarball = cache / f"debian-{DEBIAN_SUITE}-{key}.tar"
    if not tarball.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        # Per process, so two test runs at once never write one file; the rename is atomic.
        partial = tarball.with_name(f"{tarball.stem}.{os.getpid()}.partial.tar")
        try:
            _run(
                [
                    "mmdebstrap",
                    f"--variant={DEBIAN_VARIANT}",
                    f"--include={','.join(recipe['packages'])}",
                    # Documentation, manuals and translations are of no use in an image.
                    "--dpkgopt=path-exclude=/usr/share/doc/*",
                    "--dpkgopt=path-exclude=/usr/share/man/*",
                    "--dpkgopt=path-exclude=/usr/share/locale/*",
                    DEBIAN_SUITE,
                    str(partial),
                ],
                timeout,
                "mmdebstrap",
                show,
            )
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.rename(tarball)
    _run(
        [
            "podman", "import",
            "--change", "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--change", 'CMD=["python3"]',
            str(tarball), name,
        ],
        timeout,
        "podman import",
    )  # fmt: skip
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m release.image", description=__doc__)
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"image name (default {DEFAULT_TAG})")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--base", help="base image (default: the Dockerfile's python:3.11-slim, by digest)"
    )
    where.add_argument(
        "--debian-base",
        action="store_true",
        help=f"build the base from Debian {DEBIAN_SUITE}'s packages with mmdebstrap "
        "(for machines that reach no image registry)",
    )
    parser.add_argument(
        "--source",
        help="the repository URL for the org.opencontainers.image.source label "
        "(default: the git remote origin)",
    )
    args = parser.parse_args(argv)
    try:
        base = debian_base(show=True) if args.debian_base else args.base
        build(args.tag, base, show=True, source=args.source)
        size = image_size(args.tag)
    except ImageError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"built {args.tag} ({size / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
