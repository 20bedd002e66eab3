"""Find, or build from the Go module proxy, the kube-apiserver, kube-controller-manager and etcd
binaries.

Prebuilt binaries win, as envtest users expect: TEST_ASSET_KUBE_APISERVER,
TEST_ASSET_KUBE_CONTROLLER_MANAGER and TEST_ASSET_ETCD, then KUBEBUILDER_ASSETS (envtest ships no
kube-controller-manager: it is built when missing). Otherwise the binaries are built from the two
Go modules under `controlplane/go/` and cached under the user's cache directory, keyed by their
versions, so a build happens once per machine and version.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GO_DIR = Path(__file__).parent / "go"


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path
    kube_controller_manager: Path


@dataclass(frozen=True)
class _Component:
    name: str
    module_dir: Path
    module: str
    package: str

    def version(self) -> str:
        text = (self.module_dir / "go.mod").read_text()
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(self.module)} (v\S+)", text, re.M)
        if not match:
            raise RuntimeError(f"{self.module} is not required in {self.module_dir}/go.mod")
        return match.group(1)


KUBE_APISERVER = _Component(
    "kube-apiserver",
    GO_DIR / "kube-apiserver",
    "k8s.io/kubernetes",
    "k8s.io/kubernetes/cmd/kube-apiserver",
)
# From the same Go module as kube-apiserver (so the same version, and a shared build cache).
KUBE_CONTROLLER_MANAGER = _Component(
    "kube-controller-manager",
    GO_DIR / "kube-apiserver",
    "k8s.io/kubernetes",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
)
ETCD = _Component("etcd", GO_DIR / "etcd", "go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/server/v3")
# Jaeger v2's all-in-one, the trace backend of the trace tests and of `make demo TRACING=1`
# (the Go module's versions are v1.x; v1.76.0 is Jaeger v2.13's build).
JAEGER = _Component(
    "jaeger",
    GO_DIR / "jaeger",
    "github.com/jaegertracing/jaeger",
    "github.com/jaegertracing/jaeger/cmd/jaeger",
)

# Toxiproxy's server: the TCP proxy the robustness harness puts between each slo-api replica
# and the API server for its network faults (latency, a stalled connection, resets).
TOXIPROXY = _Component(
    "toxiproxy",
    GO_DIR / "toxiproxy",
    "github.com/Shopify/toxiproxy/v2",
    "github.com/Shopify/toxiproxy/v2/cmd/server",
)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "slo-api" / "controlplane"


def cached_path(component: _Component) -> Path:
    return cache_dir() / f"{component.name}-{component.version()}" / component.name


def _prebuilt(env_name: str, binary: str) -> Path | None:
    explicit = os.environ.get(env_name)
    if explicit:
        return Path(explicit)
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and (Path(assets) / binary).is_file():
        return Path(assets) / binary
    return None


def _build(component: _Component, target: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(
            f"{component.name} is not cached and Go (>= 1.26) is not on PATH to build it; "
            "install Go or point TEST_ASSET_* / KUBEBUILDER_ASSETS at prebuilt binaries"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-mod=readonly -buildvcs=false",
    }
    print(
        f"building {component.name} {component.version()} from the Go module proxy "
        "(a cold build takes several minutes on 2 cores; it is cached afterwards)...",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    # -v prints each package as it compiles: the progress shown on a long cold build.
    subprocess.run(
        [
            go,
            "build",
            "-v",
            "-trimpath",
            "-ldflags",
            "-s -w",
            "-o",
            str(partial),
            component.package,
        ],
        cwd=component.module_dir,
        env=env,
        check=True,
    )
    partial.replace(target)
    print(
        f"built {component.name} in {time.monotonic() - started:.0f}s -> {target}",
        file=sys.stderr,
        flush=True,
    )


def ensure(component: _Component, env_name: str) -> Path:
    prebuilt = _prebuilt(env_name, component.name)
    if prebuilt is not None:
        if not prebuilt.is_file():
            raise RuntimeError(
                f"{env_name} / KUBEBUILDER_ASSETS names {prebuilt}, which is missing"
            )
        return prebuilt
    target = cached_path(component)
    if not target.is_file():
        _build(component, target)
    return target


def ensure_jaeger() -> Path:
    """Jaeger's all-in-one: TEST_ASSET_JAEGER names a prebuilt one, else it is built and cached."""
    return ensure(JAEGER, "TEST_ASSET_JAEGER")


def ensure_toxiproxy() -> Path:
    """Toxiproxy's server: TEST_ASSET_TOXIPROXY names a prebuilt one, else built and cached."""
    return ensure(TOXIPROXY, "TEST_ASSET_TOXIPROXY")


def ensure_all() -> Binaries:
    return Binaries(
        kube_apiserver=ensure(KUBE_APISERVER, "TEST_ASSET_KUBE_APISERVER"),
        etcd=ensure(ETCD, "TEST_ASSET_ETCD"),
        kube_controller_manager=ensure(
            KUBE_CONTROLLER_MANAGER, "TEST_ASSET_KUBE_CONTROLLER_MANAGER"
        ),
    )
