"""A control plane with slo-api's CRDs and RBAC installed, and kubeconfigs to reach it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from controlplane.admin import Admin, Obj, kubeconfig, load_yaml_dir
from controlplane.server import ControlPlane

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "config"
SERVICE_NAMESPACE = "llm-scaler"
SERVICE_ACCOUNT = "slo-api"


def crds() -> list[Obj]:
    """Every CRD config/ ships, the optional ModelPool one included (no llmkube here)."""
    return load_yaml_dir(CONFIG / "crd")


def installed() -> list[Obj]:
    """What the tests' cluster has beside the CRDs: the namespace, slo-api's RBAC, and the
    opt-in user roles (the Kubernetes-identity tests bind them)."""
    return [
        *load_yaml_dir(CONFIG / "namespace"),
        *load_yaml_dir(CONFIG / "rbac"),
        *load_yaml_dir(CONFIG / "user-roles"),
    ]


@dataclass
class Credentials:
    admin_kubeconfig: Path
    slo_api_kubeconfig: Path
    slo_api_token: str


class Cluster:
    """Starts the control plane, installs config/crd and config/rbac (see `installed`), mints
    slo-api's token."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.plane = ControlPlane(workdir)
        self.admin: Admin | None = None
        self.credentials: Credentials | None = None

    def start(self, kubeconfig_dir: Path | None = None) -> Cluster:
        self.plane.start()
        try:
            self.admin = Admin(
                self.plane.url,
                self.plane.pki.ca_cert,
                cert=(self.plane.pki.admin_cert, self.plane.pki.admin_key),
            )
            self.install_crds()
            self.admin.apply_all(installed())
            self.credentials = self.write_kubeconfigs(kubeconfig_dir or self.plane.workdir)
        except BaseException:
            self.stop()
            raise
        return self

    def install_crds(self, only: set[str] | None = None) -> None:
        assert self.admin is not None
        wanted = [c for c in crds() if only is None or c["metadata"]["name"] in only]
        self.admin.apply_all(wanted)
        self.admin.wait_crds(wanted)

    def write_kubeconfigs(self, directory: Path) -> Credentials:
        assert self.admin is not None
        directory.mkdir(parents=True, exist_ok=True)
        pki = self.plane.pki
        token = self.admin.service_account_token(SERVICE_NAMESPACE, SERVICE_ACCOUNT)
        admin_path = directory / "admin.kubeconfig"
        slo_path = directory / "slo-api.kubeconfig"
        for path, config in (
            (
                admin_path,
                kubeconfig(
                    self.plane.url, pki.ca_cert, user="admin", cert=(pki.admin_cert, pki.admin_key)
                ),
            ),
            (
                slo_path,
                kubeconfig(
                    self.plane.url,
                    pki.ca_cert,
                    user="slo-api",
                    token=token,
                    namespace=SERVICE_NAMESPACE,
                ),
            ),
        ):
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            path.chmod(0o600)
        return Credentials(admin_path, slo_path, token)

    def slo_api_client(self) -> Admin:
        """A plain REST client with slo-api's own ServiceAccount token (for RBAC checks)."""
        assert self.credentials is not None
        return Admin(self.plane.url, self.plane.pki.ca_cert, token=self.credentials.slo_api_token)

    def stop(self) -> None:
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        self.plane.stop()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
