"""A small synchronous admin client for arranging objects on the test control plane.

Tests use it to create, change and delete CRs behind slo-api's back; the harness uses it to
install CRDs and RBAC. It speaks plain REST with the admin client certificate, so it shares no
code with the service under test.
"""

from __future__ import annotations

import builtins
import ssl
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import yaml

Obj = dict[str, Any]


class AdminError(RuntimeError):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class Admin:
    def __init__(
        self,
        url: str,
        ca_cert: Path,
        cert: tuple[Path, Path] | None = None,
        token: str | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url
        context = ssl.create_default_context(cafile=str(ca_cert))
        if cert:
            context.load_cert_chain(str(cert[0]), str(cert[1]))
        self._http = httpx.Client(base_url=url, verify=context, headers=headers, timeout=30)
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}

    def close(self) -> None:
        self._http.close()

    # -- raw requests ----------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Any:
        content = None if body is None else httpx.Request("X", "/", json=body).content
        response = self._http.request(
            method,
            path,
            content=content,
            params=params,
            headers={"Content-Type": content_type} if content is not None else {},
        )
        try:
            payload = response.json()
        except ValueError:
            payload = response.text
        if response.status_code >= 400:
            raise AdminError(response.status_code, payload)
        return payload

    # -- discovery -------------------------------------------------------------------------

    def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            for resource in self.request("GET", base)["resources"]:
                if "/" not in resource["name"]:
                    self._resources[(api_version, resource["kind"])] = (
                        resource["name"],
                        bool(resource["namespaced"]),
                    )
        if key not in self._resources:
            raise AdminError(404, f"{kind} is not served at {api_version}")
        return self._resources[key]

    def path(
        self, api_version: str, kind: str, namespace: str | None = None, name: str | None = None
    ) -> str:
        plural, namespaced = self._resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{plural}"
        return f"{base}/{name}" if name else base

    def _obj_path(self, obj: Obj, named: bool = True) -> str:
        meta = obj.get("metadata", {})
        return self.path(
            obj["apiVersion"],
            obj["kind"],
            meta.get("namespace"),
            meta.get("name") if named else None,
        )

    # -- objects ---------------------------------------------------------------------------

    def apply(self, obj: Obj, dry_run: bool = False, field_manager: str = "slo-api-harness") -> Obj:
        """Server-side apply: creates or updates, idempotently. `field_manager` is who
        `managedFields` says applied it (a GitOps tool, in the field-ownership tests)."""
        params = {"fieldManager": field_manager, "force": "true"}
        if dry_run:
            params["dryRun"] = "All"
        result: Obj = self.request(
            "PATCH", self._obj_path(obj), obj, "application/apply-patch+yaml", params
        )
        return result

    def apply_all(self, objs: Iterable[Obj], dry_run: bool = False) -> list[Obj]:
        return [self.apply(obj, dry_run=dry_run) for obj in objs]

    def create(self, obj: Obj, field_manager: str | None = None) -> Obj:
        params = {"fieldManager": field_manager} if field_manager else None
        result: Obj = self.request("POST", self._obj_path(obj, named=False), obj, params=params)
        return result

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj:
        result: Obj = self.request("GET", self.path(api_version, kind, namespace, name))
        return result

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        items: list[Obj] = self.request("GET", self.path(api_version, kind, namespace))["items"]
        return items

    def merge_patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Obj,
        subresource: str = "",
    ) -> Obj:
        path = self.path(api_version, kind, namespace, name)
        if subresource:
            path += f"/{subresource}"
        result: Obj = self.request("PATCH", path, patch, "application/merge-patch+json")
        return result

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        self.request("DELETE", self.path(api_version, kind, namespace, name))

    def ensure_namespace(self, name: str) -> None:
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # -- CRDs and credentials --------------------------------------------------------------

    def wait_crds(self, crds: Iterable[Obj], timeout: float = 60) -> None:
        """Wait until each CRD is Established and its plural is in discovery."""
        deadline = time.monotonic() + timeout
        for crd in crds:
            name = crd["metadata"]["name"]
            group = crd["spec"]["group"]
            plural = crd["spec"]["names"]["plural"]
            versions = [v["name"] for v in crd["spec"]["versions"] if v.get("served", True)]
            while True:
                current = self.request(
                    "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                )
                conditions = {
                    c["type"]: c["status"]
                    for c in (current.get("status") or {}).get("conditions") or []
                }
                if conditions.get("Established") == "True" and self._discoverable(
                    group, versions, plural
                ):
                    break
                if time.monotonic() > deadline:
                    raise AdminError(504, f"CRD {name} not established: {conditions}")
                time.sleep(0.1)
        self._resources.clear()

    def _discoverable(self, group: str, versions: builtins.list[str], plural: str) -> bool:
        for version in versions:
            try:
                found = self.request("GET", f"/apis/{group}/{version}")
            except AdminError:
                return False
            if plural not in {r["name"] for r in found.get("resources", [])}:
                return False
        return True

    def delete_crd(self, name: str, wait: float = 60) -> None:
        self.request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                self.request(
                    "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                )
            except AdminError as exc:
                if exc.status == 404:
                    self._resources.clear()
                    return
                raise
            time.sleep(0.1)
        raise AdminError(504, f"CRD {name} still present after {wait}s")

    def service_account_token(
        self,
        namespace: str,
        name: str,
        seconds: int = 86400,
        audiences: builtins.list[str] | None = None,
    ) -> str:
        spec: Obj = {"expirationSeconds": seconds}
        if audiences:
            spec["audiences"] = audiences
        result = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        token: str = result["status"]["token"]
        return token


def load_yaml_dir(directory: Path) -> list[Obj]:
    """Every object in a directory's YAML files (sorted, recursive), but kustomizations."""
    objs: list[Obj] = []
    for path in sorted(directory.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        objs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return objs


def load_kustomization(directory: Path) -> list[Obj]:
    """The objects of the YAML files a directory's kustomization.yaml lists, in its order."""
    listed = yaml.safe_load((directory / "kustomization.yaml").read_text()).get("resources", [])
    objs: list[Obj] = []
    for name in listed:
        objs.extend(doc for doc in yaml.safe_load_all((directory / name).read_text()) if doc)
    return objs


def kubeconfig(
    url: str,
    ca_cert: Path,
    *,
    user: str,
    token: str | None = None,
    cert: tuple[Path, Path] | None = None,
    namespace: str | None = None,
) -> Obj:
    creds: Obj = {"token": token} if token else {}
    if cert:
        creds = {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
    context: Obj = {"cluster": "slo-api-test", "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "slo-api-test",
                "cluster": {"server": url, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": user, "context": context}],
        "current-context": user,
    }
