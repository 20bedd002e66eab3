"""The kustomize bundle of a release: config/ with the image pinned to the release's digest.

`pin` copies config/ and points its `images` entry for `slo-api` at `<repository>@<digest>`
(the tag goes: a digest names one image for good); the copy stays a kustomization a deployer
overlays or applies with `kubectl apply -k`. `render` builds its top level (what
`kubectl apply -k config/` installs) into one YAML stream: with `kubectl kustomize` where kubectl
is installed, else here, in Python, for the part of kustomize that config/ uses (resources and
images). Anything else in a kustomization is refused rather than rendered wrong; a unit test
holds the Python rendering to kubectl's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

IMAGE = "slo-api"  # the name config/manager's Deployment gives the image
KUSTOMIZATION = "kustomization.yaml"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# The fields of a kustomization `render_here` knows; any other is refused.
KNOWN = {"apiVersion", "kind", "resources", "images"}
# kustomize's "legacy" order: the kinds others depend on first, webhooks last.
ORDER_FIRST = (
    "Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
    "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap",
    "Secret", "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume",
    "PersistentVolumeClaim", "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget",
)  # fmt: skip
ORDER_LAST = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")

Obj = dict[str, Any]


class BundleError(RuntimeError):
    pass


def _kustomization(directory: Path) -> Obj:
    path = directory / KUSTOMIZATION
    if not path.is_file():
        raise BundleError(f"{directory} has no {KUSTOMIZATION}")
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise BundleError(f"{path} is not a mapping")
    return loaded


def pin(config: Path, into: Path, digest: str, repository: str = IMAGE) -> Path:
    """A copy of `config` at `into` whose `slo-api` image is `repository@digest`."""
    if not DIGEST.fullmatch(digest):
        raise BundleError(f"not an image digest: {digest!r}")
    shutil.copytree(config, into)
    pinned = 0
    for path in sorted(into.rglob(KUSTOMIZATION)):
        loaded = yaml.safe_load(path.read_text())
        entries = loaded.get("images") if isinstance(loaded, dict) else None
        for entry in entries or []:
            if entry.get("name") == IMAGE:
                entry.pop("newTag", None)
                entry["digest"] = digest
                if repository != IMAGE:
                    entry["newName"] = repository
                pinned += 1
        if entries:
            path.write_text(
                "# The release's image, pinned by digest (`make release`).\n"
                + yaml.safe_dump(loaded, sort_keys=False)
            )
    if pinned != 1:
        raise BundleError(f"expected one `images` entry for {IMAGE} in {config}, found {pinned}")
    return into


def _documents(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _with_images(obj: Obj, images: list[Obj]) -> Obj:
    """`obj` with kustomize's `images` applied to the containers of its pod template."""
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec.get("jobTemplate", {}).get("spec", {}))
    for container in [*pod.get("containers", []), *pod.get("initContainers", [])]:
        name, tag = _split(container["image"])
        for entry in images:
            if entry.get("name") != name:
                continue
            new = entry.get("newName", name)
            if entry.get("digest"):
                tag = "@" + entry["digest"]
            elif entry.get("newTag"):
                tag = ":" + str(entry["newTag"])
            container["image"] = new + tag
            break
    return obj


def _split(image: str) -> tuple[str, str]:
    """`repo/name:tag` -> (`repo/name`, `:tag`); `name@sha256:..` -> (`name`, `@sha256:..`)."""
    if "@" in image:
        name, digest = image.split("@", 1)
        return name, "@" + digest
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = image.rsplit(":", 1)
        return name, ":" + tag
    return image, ""


def _build(directory: Path) -> list[Obj]:
    kustomization = _kustomization(directory)
    unknown = set(kustomization) - KNOWN
    if unknown or kustomization.get("kind", "Kustomization") != "Kustomization":
        raise BundleError(
            f"{directory / KUSTOMIZATION}: {', '.join(sorted(unknown)) or 'a Component'} "
            "is beyond what the Python rendering knows; install kubectl to render it"
        )
    objs: list[Obj] = []
    for entry in kustomization.get("resources", []):
        target = (directory / entry).resolve()
        objs += _build(target) if target.is_dir() else _documents(target)
    images = kustomization.get("images", [])
    return [_with_images(obj, images) for obj in objs]


def _rank(obj: Obj) -> tuple[int, str]:
    kind = str(obj.get("kind"))
    if kind in ORDER_FIRST:
        return ORDER_FIRST.index(kind), ""
    if kind in ORDER_LAST:
        return len(ORDER_FIRST) + 1 + ORDER_LAST.index(kind), ""
    return len(ORDER_FIRST), kind


def render_here(directory: Path) -> list[Obj]:
    """What `kustomize build directory` makes of config/'s kustomizations, without kustomize."""
    objs = _build(directory)
    return sorted(
        objs,
        key=lambda o: (
            _rank(o),
            o.get("metadata", {}).get("namespace", ""),
            o.get("metadata", {}).get("name", ""),
        ),
    )


def render_with_kubectl(directory: Path) -> list[Obj]:
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise BundleError(f"kubectl kustomize {directory}: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def render(directory: Path) -> tuple[list[Obj], str]:
    """The objects `kubectl apply -k directory` would apply, and what rendered them."""
    if shutil.which("kubectl"):
        return render_with_kubectl(directory), "kubectl kustomize"
    return render_here(directory), "release.bundle"


def dump(objs: list[Obj]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False, explicit_start=True)
