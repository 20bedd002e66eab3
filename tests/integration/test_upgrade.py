"""The upgrade from the original slo-api (docs/upgrade.md), step by step, on a real API server.

A control plane of its own (the session's already holds this project's install) is left as the
original's install leaves it, then docs/upgrade.md's steps are applied to it with what
`kubectl kustomize` renders from config/, by server-side apply with forced conflicts (as
`kubectl apply --server-side --force-conflicts -k`), and slo-api is started with the settings
the applied Deployment gives it and the token the original's Secret holds.

What the original's install is, as far as its published clients and this project's references
say (clients.md: namespace llm-scaler, ServiceAccount and Secret `slo-api` key `token`, a Service
on port 80 in front of port 8080, requests 50m/64Mi and limits 200m/256Mi, probes /readyz and
/healthz), and what is assumed beyond that:
- the ClusterRole `slo-api` grants get, list, watch, patch and update on llmslorequirements and
  jobslorequirements of inference.modelsphere.dev only, bound to the ServiceAccount;
- the Deployment selects, and its pods are labelled, `app: slo-api` (the Service too); it sets
  `LOG_LEVEL=INFO`;
- it was applied with client-side `kubectl apply` (its field manager), and the SLO CRDs were
  installed beside it (here: this project's, standing in for the chart's).
No kubelet or workload controllers run here, so the original's running pod is a Pod object that
stays Pending: enough to check which selectors find it.
"""

from __future__ import annotations

import base64
import copy
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from controlplane.admin import Admin, AdminError, Obj, kubeconfig, load_yaml_dir
from controlplane.server import ControlPlane
from slo_api.settings import Settings
from tests.integration import crs
from tests.integration.service import serving

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
NAMESPACE = "llm-scaler"
NAME = "slo-api"
# Long enough (docs/upgrade.md, step 0, is for shorter ones).
OLD_TOKEN = "0f3c9a7d51e24b8c"
OLD_LABELS = {"app": NAME}
CLIENT_SIDE = "kubectl-client-side-apply"
TEAM = "team-a"
ROUTE = "chat-7b"


def _original() -> list[Obj]:
    container = {
        "name": NAME,
        "image": "modelsphere/slo-api:latest",
        "ports": [{"name": "http", "containerPort": 8080}],
        "env": [
            {
                "name": "SLO_API_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": NAME, "key": "token"}},
            },
            {"name": "LOG_LEVEL", "value": "INFO"},
        ],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}},
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "200m", "memory": "256Mi"},
        },
    }
    meta = {"name": NAME, "namespace": NAMESPACE, "labels": OLD_LABELS}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "Opaque",
            "stringData": {"token": OLD_TOKEN},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NAME},
            "rules": [
                {
                    "apiGroups": ["inference.modelsphere.dev"],
                    "resources": ["llmslorequirements", "jobslorequirements"],
                    "verbs": ["get", "list", "watch", "patch", "update"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": NAME,
            },
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": OLD_LABELS},
                "template": {
                    "metadata": {"labels": OLD_LABELS},
                    "spec": {"serviceAccountName": NAME, "containers": [container]},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "selector": OLD_LABELS,
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
            },
        },
    ]


def _rendered(directory: Path) -> list[Obj]:
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _create_as_kubectl(admin: Admin, obj: Obj) -> None:
    admin.request(
        "POST",
        admin.path(obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace")),
        obj,
        params={"fieldManager": CLIENT_SIDE},
    )


@dataclass
class Plane:
    admin: Admin
    url: str
    ca_cert: Path


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """A control plane of its own, holding the original's install and one SLO."""
    plane = ControlPlane(tmp_path_factory.mktemp("upgrade")).start()
    own = Admin(plane.url, plane.pki.ca_cert, cert=(plane.pki.admin_cert, plane.pki.admin_key))
    try:
        crds = load_yaml_dir(CONFIG / "crd")
        own.apply_all(crds)
        own.wait_crds(crds)
        for obj in _original():
            _create_as_kubectl(own, obj)
        # The original's running pod, as its ReplicaSet made it.
        _create_as_kubectl(
            own,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{NAME}-5d8f7c9b4-x2x7q",
                    "namespace": NAMESPACE,
                    "labels": {**OLD_LABELS, "pod-template-hash": "5d8f7c9b4"},
                },
                "spec": _original()[-2]["spec"]["template"]["spec"],
            },
        )
        own.ensure_namespace(TEAM)
        own.create(crs.llm(TEAM, "chat", service_id=ROUTE, priority=3))
        yield Plane(own, plane.url, plane.pki.ca_cert)
    finally:
        own.close()
        plane.stop()


def _get(admin: Admin, kind: str, name: str, api: str = "v1", ns: str | None = NAMESPACE) -> Obj:
    return admin.get(api, kind, ns, name)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def _secret_value(admin: Admin, name: str, key: str) -> str:
    return base64.b64decode(_get(admin, "Secret", name)["data"][key]).decode()


@asynccontextmanager
async def _serving(plane: Plane, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """slo-api as the applied Deployment runs it: its literal settings, SLO_API_TOKEN from the
    Secret it names, the ServiceAccount's credentials; ready."""
    admin = plane.admin
    deployment = _get(admin, "Deployment", NAME, api="apps/v1")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    settings: dict[str, Any] = {}
    for env in container["env"]:
        if "value" in env:
            settings[env["name"].lower()] = env["value"]
        elif "secretKeyRef" in env.get("valueFrom", {}):
            ref = env["valueFrom"]["secretKeyRef"]
            settings[env["name"].lower()] = _secret_value(admin, ref["name"], ref["key"])
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    token = admin.service_account_token(NAMESPACE, account)
    path = tmp_path / "slo-api.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(plane.url, plane.ca_cert, user=NAME, token=token)))
    async with serving(Settings(**settings, kubeconfig=str(path), crd_recheck_seconds=1)) as svc:
        yield svc.client


async def test_the_upgrade_keeps_the_service_the_secret_and_the_old_token(
    plane: Plane, tmp_path: Path
) -> None:
    admin = plane.admin
    app = _rendered(CONFIG)
    new_deployment = next(o for o in app if o["kind"] == "Deployment")

    # Step 2: the CRDs, applied apart.
    admin.apply_all(_rendered(CONFIG / "crd"))

    # Why step 3 exists: a Deployment's selector cannot change in place.
    with pytest.raises(AdminError) as refused:
        admin.apply(copy.deepcopy(new_deployment))
    assert refused.value.status == 422
    assert "immutable" in str(refused.value.body)

    # Step 3: the Deployment goes, its pods stay, relabelled for the new Service selector.
    admin.request(
        "DELETE",
        admin.path("apps/v1", "Deployment", NAMESPACE, NAME),
        {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Orphan"},
    )
    # The garbage collector orphans the ReplicaSets (there are none here) and drops the
    # `orphan` finalizer; the test drops it too, unless the collector was first.
    try:
        gone = admin.merge_patch(
            "apps/v1", "Deployment", NAMESPACE, NAME, {"metadata": {"finalizers": None}}
        )
        assert gone["metadata"].get("deletionTimestamp")
    except AdminError as exc:
        if exc.status != 404:
            raise
    with pytest.raises(AdminError) as deleted:
        _get(admin, "Deployment", NAME, api="apps/v1")
    assert deleted.value.status == 404
    [old_pod] = [
        p
        for p in admin.list("v1", "Pod", NAMESPACE)
        if _selects(OLD_LABELS, p["metadata"]["labels"])
    ]
    admin.merge_patch(
        "v1",
        "Pod",
        NAMESPACE,
        old_pod["metadata"]["name"],
        {"metadata": {"labels": new_deployment["spec"]["selector"]["matchLabels"]}},
    )

    # Step 4: the app.
    admin.apply_all(copy.deepcopy(app))

    deployment = _get(admin, "Deployment", NAME, api="apps/v1")
    assert deployment["spec"]["selector"] == new_deployment["spec"]["selector"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = _get(admin, "Service", NAME)
    # Same name and port; the selector finds the new pods and, relabelled, the original's.
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(80, "http")]
    assert _selects(service["spec"]["selector"], pod_labels)
    old_labels = _get(admin, "Pod", old_pod["metadata"]["name"])["metadata"]["labels"]
    assert _selects(service["spec"]["selector"], old_labels)
    # Whatever key of the original's selector a server-side apply leaves, the pods carry it.
    assert _selects(OLD_LABELS, pod_labels)

    # The Secret was never applied over.
    assert _secret_value(admin, NAME, "token") == OLD_TOKEN
    # The ClusterRole is this project's as a whole: no `update` left from the original.
    role = _get(admin, "ClusterRole", NAME, api="rbac.authorization.k8s.io/v1", ns=None)
    shipped = next(o for o in app if o["kind"] == "ClusterRole" and o["metadata"]["name"] == NAME)
    assert role["rules"] == shipped["rules"]
    assert not [r for r in role["rules"] if "update" in r["verbs"]]
    for binding in ("slo-api", "slo-api:auth-delegator", "slo-api:events", "slo-api:history"):
        _get(admin, "ClusterRoleBinding", binding, api="rbac.authorization.k8s.io/v1", ns=None)

    # Step 5 and 6: the original's pod gone, the namespace's Pod Security labels.
    admin.delete("v1", "Pod", NAMESPACE, old_pod["metadata"]["name"])
    admin.apply_all(_rendered(CONFIG / "namespace"))
    labels = _get(admin, "Namespace", NAMESPACE, ns=None)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"

    # Step 7: the old token, as a client of the original sends it.
    auth = {"Authorization": f"Bearer {OLD_TOKEN}"}
    async with _serving(plane, tmp_path) as client:
        read = await client.get(f"/config/{ROUTE}", headers=auth)
        assert read.status_code == 200, read.text
        assert read.json()["priority"] == 3
        written = await client.put(
            f"/config/{ROUTE}", json={"route": ROUTE, "priority": 7}, headers=auth
        )
        assert written.status_code == 200, written.text
    stored = admin.get(crs.SLO, "LLMSLORequirement", TEAM, "chat")
    assert stored["spec"]["priority"] == 7
