"""The deployment recipe: config/ and the Dockerfile, read as files (no cluster).

That the API server accepts every manifest (a server-side dry run, which also refuses unknown
fields) is tests/integration/test_manifests_accepted.py, on the objects loaded here. Every
kustomization lists exactly the files beside it so `kubectl apply -k`
cannot silently miss one, each shipped kustomization is rendered and checked for what it must
and must not install (no CRD or Namespace with the app, CRDs and the namespace kept from pruning,
user roles opt-in, the NetworkPolicy), and the Deployment, Service and image keep the operational
checklist (non-root, read-only root filesystem, probes, preStop, resources from the sizing
table in docs/operating.md, topology spread, a grace period covering the drain, token from the
Secret).
The checklist is checked by functions that return problems; each is also shown to catch the
edit that would break it.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.admin import Obj, load_yaml_dir
from slo_api.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
NAMESPACE = "llm-scaler"
NAME = "slo-api"
USER_ID = 10001
PORT = 8080
READ = ["get", "list", "watch"]

# Kept beside the manifests but never applied by `kubectl apply -k`: applying the example
# Secret would overwrite the real token with a published placeholder; the policy on who may
# exempt a namespace is applied on its own, once its group is chosen.
NOT_APPLIED = {Path("manager/secret.example.yaml"), Path("guardrails/exempt-label.yaml")}
# Directories the top-level kustomization leaves out on purpose (sample CRs are for deployers;
# overlays are applied instead of config/, not with it).
NOT_INSTALLED = {Path("samples"), Path("overlays")}
NAMESPACED = CONFIG / "overlays" / "namespaced"
# Optional kustomize Components a deployer adds from an overlay, never from config/ itself.
OPTIONAL_COMPONENTS = {Path("monitoring"), Path("user-roles")}
# Kustomizations applied on their own, once, and never pruned or deleted with the app: deleting
# a CRD deletes its CRs, deleting a namespace everything in it (the opt-in guardrails: their CRD
# holds every namespace's limits).
APART = {Path("crd"), Path("crd/modelpool"), Path("namespace"), Path("guardrails")}
# Argo CD's and Flux's ways of saying "never prune or delete this".
KEPT = {
    "argocd.argoproj.io/sync-options": "Prune=false,Delete=false",
    "kustomize.toolkit.fluxcd.io/prune": "disabled",
}
# The kustomizations config/ ships, and what an overlay adds with each optional component.
SHIPPED = [CONFIG, NAMESPACED, *(CONFIG / p for p in sorted(APART))]
APP_BUILDS = [CONFIG, NAMESPACED]
# Objects of CRDs the test control plane does not serve (the Prometheus Operator's PrometheusRule
# and ServiceMonitor): the API server cannot dry-run them, so test_alerts.py checks them with
# promtool and against the Service instead.
NOT_DRY_RUN = {Path("monitoring")}
# What `kubectl apply -k config/` installs: the app, nothing cluster-wide that holds data.
INSTALLED = {Path("rbac"), Path("manager")}

# After the drain, the lifespan shutdown closes the watches and the Kubernetes client.
LIFESPAN_SHUTDOWN_SECONDS = 5
OPERATING = REPO / "docs" / "operating.md"


# -- reading config/ ---------------------------------------------------------------------------


def _manifest_dirs() -> list[Path]:
    """The directories directly under config/ that hold manifests the API server can dry-run."""
    return sorted(
        p
        for p in CONFIG.iterdir()
        if p.is_dir() and any(p.rglob("*.yaml")) and p.relative_to(CONFIG) not in NOT_DRY_RUN
    )


def _objects() -> list[tuple[str, Obj]]:
    found: list[tuple[str, Obj]] = []
    for directory in _manifest_dirs():
        for obj in load_yaml_dir(directory):
            meta = obj.get("metadata", {})
            where = "/".join(filter(None, [meta.get("namespace"), meta.get("name")]))
            found.append((f"{directory.name}:{obj.get('kind')}/{where}", obj))
    return found


OBJECTS = _objects()


def _load(relative: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all((CONFIG / relative).read_text()) if d]


def _one(relative: str, kind: str) -> Obj:
    found = [d for d in _load(relative) if d.get("kind") == kind]
    assert len(found) == 1, f"{relative}: expected one {kind}, found {len(found)}"
    return found[0]


def _deployment() -> Obj:
    return _one("manager/deployment.yaml", "Deployment")


def _service() -> Obj:
    return _one("manager/service.yaml", "Service")


def _yaml_files(directory: Path) -> set[Path]:
    return {p for p in directory.glob("*.yaml") if p.name != "kustomization.yaml"}


# -- what config/ holds ---------------------------------------------------------------------------


def test_the_manifests_hold_the_expected_objects() -> None:
    """Guards the dry run of these objects (test_manifests_accepted.py) against passing
    because it found nothing."""
    kinds = {(label.split(":")[0], obj["kind"], obj["metadata"]["name"]) for label, obj in OBJECTS}
    assert {k for d, k, _ in kinds if d == "crd"} == {"CustomResourceDefinition"}
    # The three kinds, and slo-api's route revisions.
    assert len([k for k in kinds if k[0] == "crd"]) == 4
    assert ("crd", "CustomResourceDefinition", "routerevisions.slo-api.modelsphere.dev") in kinds
    for expected in [
        ("namespace", "Namespace", NAMESPACE),
        ("rbac", "ServiceAccount", NAME),
        ("rbac", "ClusterRole", NAME),
        ("rbac", "ClusterRoleBinding", NAME),
        ("rbac", "ClusterRoleBinding", f"{NAME}:auth-delegator"),
        ("rbac", "ClusterRole", f"{NAME}:events"),
        ("rbac", "ClusterRole", f"{NAME}:history"),
        ("user-roles", "ClusterRole", f"{NAME}-edit"),
        ("user-roles", "ClusterRole", f"{NAME}-view"),
        ("manager", "Deployment", NAME),
        ("manager", "Service", NAME),
        ("manager", "Secret", NAME),
        ("manager", "NetworkPolicy", NAME),
    ]:
        assert expected in kinds


def test_namespaced_objects_that_are_installed_live_in_the_service_namespace() -> None:
    """llm-scaler is created by config/namespace; nothing installed may depend on another one."""
    for label, obj in OBJECTS:
        if Path(label.split(":")[0]) in INSTALLED and "namespace" in obj["metadata"]:
            assert obj["metadata"]["namespace"] == NAMESPACE, label
    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        for label, obj in OBJECTS:
            if label.startswith("manager:") and obj["kind"] == kind:
                assert obj["metadata"].get("namespace") == NAMESPACE, label


# -- kustomize cannot miss a file --------------------------------------------------------------


def _kustomization(directory: Path) -> Obj:
    path = directory / "kustomization.yaml"
    assert path.is_file(), f"{path.relative_to(REPO)} is missing"
    loaded: Obj = yaml.safe_load(path.read_text())
    return loaded


def _kustomized_dirs() -> list[Path]:
    dirs = [CONFIG]
    dirs += [d for d in sorted(CONFIG.rglob("*")) if d.is_dir() and any(d.rglob("*.yaml"))]
    return [
        d for d in dirs if not any(d.relative_to(CONFIG).is_relative_to(x) for x in NOT_INSTALLED)
    ]


@pytest.mark.parametrize("directory", _kustomized_dirs(), ids=lambda d: str(d.relative_to(REPO)))
def test_each_kustomization_lists_exactly_its_directory(directory: Path) -> None:
    listed = _kustomization(directory).get("resources", [])
    expected = {p.name for p in _yaml_files(directory)}
    expected -= {(CONFIG / p).name for p in NOT_APPLIED if (CONFIG / p).parent == directory}
    expected |= {
        d.name
        for d in directory.iterdir()
        if d.is_dir()
        and any(d.rglob("*.yaml"))
        and d.relative_to(CONFIG) not in NOT_INSTALLED | OPTIONAL_COMPONENTS | APART
    }
    assert sorted(listed) == sorted(expected), f"{directory.relative_to(REPO)}/kustomization.yaml"
    for entry in listed:
        target = directory / entry
        assert target.exists(), entry
        if target.is_dir():
            assert (target / "kustomization.yaml").is_file(), entry


def test_apply_k_installs_the_app_only() -> None:
    listed = {Path(p) for p in _kustomization(CONFIG).get("resources", [])}
    assert listed == INSTALLED
    assert not {Path(p) for p in _kustomization(CONFIG).get("components", [])} & OPTIONAL_COMPONENTS
    for component in OPTIONAL_COMPONENTS:
        assert _kustomization(CONFIG / component)["kind"] == "Component", component
    for apart in APART:
        assert _kustomization(CONFIG / apart)["kind"] == "Kustomization", apart
    assert (CONFIG / "manager" / "secret.example.yaml").is_file()


def _identities(objs: list[Obj]) -> set[tuple[str, str, str]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_build_renders_every_installed_object_and_no_secret() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    built = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    expected = [
        obj
        for directory in sorted(INSTALLED)
        for path in sorted((CONFIG / directory).rglob("*.yaml"))
        if path.name != "kustomization.yaml" and path.relative_to(CONFIG) not in NOT_APPLIED
        for obj in yaml.safe_load_all(path.read_text())
        if obj
    ]
    assert _identities(built) == _identities(expected)
    assert not [o for o in built if o["kind"] == "Secret"]
    deployment = next(o for o in built if o["kind"] == "Deployment")
    assert deployment_problems(deployment) == []


def _rendered(directory: Path) -> list[Obj]:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def _overlay(tmp_path: Path, components: list[Path]) -> Path:
    """An operator's overlay: config/ with the given optional components."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(CONFIG, overlay)],
                "components": [os.path.relpath(CONFIG / c, overlay) for c in components],
            }
        )
    )
    return overlay


def _aggregated(obj: Obj) -> bool:
    labels = obj["metadata"].get("labels", {})
    return any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in labels)


def app_build_problems(built: list[Obj]) -> list[str]:
    """What an app's build (config/ or an overlay of it) must and must not hold."""
    problems: list[str] = []
    kinds = [o["kind"] for o in built]
    if "CustomResourceDefinition" in kinds:
        problems.append("a CRD in the app: pruning or deleting the app deletes every CR")
    if "Namespace" in kinds:
        problems.append("a Namespace in the app: deleting the app deletes the namespace")
    if [o for o in built if o["kind"] == "ClusterRole" and _aggregated(o)]:
        problems.append("an aggregated ClusterRole: every namespace editor gains it unasked")
    if [o for o in built if o["kind"] == "Secret"]:
        problems.append("a Secret: an apply would reset the real token")
    deployments = [o for o in built if o["kind"] == "Deployment"]
    if len(deployments) != 1:
        return [*problems, f"{len(deployments)} Deployments"]
    problems += deployment_problems(deployments[0])
    policies = [o for o in built if o["kind"] == "NetworkPolicy"]
    if len(policies) != 1:
        problems.append("no NetworkPolicy")
    else:
        problems += network_policy_problems(policies[0], deployments[0])
    return problems


def network_policy_problems(policy: Obj, deployment: Obj) -> list[str]:
    problems: list[str] = []
    spec = policy.get("spec", {})
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selected = spec.get("podSelector", {}).get("matchLabels", {})
    if policy["metadata"].get("namespace") != deployment["metadata"].get("namespace"):
        problems.append("the NetworkPolicy is in another namespace")
    if not selected or not selected.items() <= labels.items():
        problems.append("the NetworkPolicy does not select slo-api's pods")
    if sorted(spec.get("policyTypes", [])) != ["Egress", "Ingress"]:
        problems.append("the NetworkPolicy does not restrict both ingress and egress")
    http = {"http", _named_port(_container(deployment), "http")}
    ingress = spec.get("ingress", [])
    if len(ingress) < 2 or any(
        not r.get("from") or {p.get("port") for p in r.get("ports", [])} - http for r in ingress
    ):
        problems.append("ingress is not from clients and monitoring to the http port only")
    egress = {
        (p.get("protocol", "TCP"), p.get("port"))
        for r in spec.get("egress", [])
        for p in r["ports"]
    }
    if not {("TCP", 443), ("UDP", 53), ("TCP", 53)} <= egress or egress - {
        ("TCP", 443),
        ("TCP", 6443),
        ("UDP", 53),
        ("TCP", 53),
    }:
        problems.append("egress is not the API server and DNS only")
    return problems


def _kept(obj: Obj) -> bool:
    annotations = obj["metadata"].get("annotations", {})
    return all(annotations.get(k) == v for k, v in KEPT.items())


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("directory", SHIPPED, ids=lambda d: str(d.relative_to(REPO)))
def test_each_shipped_kustomization_renders_what_it_is_for(directory: Path) -> None:
    built = _rendered(directory)
    assert built
    where = directory.relative_to(CONFIG)
    if directory in APP_BUILDS:
        assert app_build_problems(built) == []
        return
    # Applied apart, once, and never pruned or deleted with the app.
    assert [o["metadata"]["name"] for o in built if not _kept(o)] == []
    names = {o["metadata"]["name"] for o in built}
    if where == Path("crd"):
        assert {o["kind"] for o in built} == {"CustomResourceDefinition"}
        # llmkube's CRD, which a newer llmkube controller would not survive, is optional.
        assert names == {
            "llmslorequirements.inference.modelsphere.dev",
            "jobslorequirements.inference.modelsphere.dev",
            "routerevisions.slo-api.modelsphere.dev",
        }
    elif where == Path("crd/modelpool"):
        assert names == {"modelpools.inference.llmkube.dev"}
    elif where == Path("guardrails"):
        assert {(o["kind"], o["metadata"]["name"]) for o in built} == {
            ("CustomResourceDefinition", "slolimits.inference.modelsphere.dev"),
            ("ValidatingAdmissionPolicy", "slo-limits"),
            ("ValidatingAdmissionPolicyBinding", "slo-limits"),
        }
    else:
        [namespace] = built
        assert namespace["kind"] == "Namespace"
        assert namespace["metadata"]["name"] == NAMESPACE
        labels = namespace["metadata"]["labels"]
        for mode in ("enforce", "warn", "audit"):
            assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted", mode


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_user_roles_are_added_only_by_their_component(tmp_path: Path) -> None:
    plain = [o for o in _rendered(CONFIG) if o["kind"] == "ClusterRole"]
    with_roles = _rendered(_overlay(tmp_path, [Path("user-roles")]))
    added = [o for o in with_roles if o["kind"] == "ClusterRole" and o not in plain]
    assert sorted(o["metadata"]["name"] for o in added) == [f"{NAME}-edit", f"{NAME}-view"]
    assert all(_aggregated(o) for o in added)
    # Otherwise the overlay is the app as it was.
    assert app_build_problems([o for o in with_roles if o not in added]) == []


@pytest.mark.parametrize(
    "breakage",
    ["crd", "namespace", "aggregated role", "no policy", "policy on another port", "open egress"],
)
def test_the_app_build_check_catches(breakage: str) -> None:
    built = copy.deepcopy(_rendered(CONFIG))
    policy = next(o for o in built if o["kind"] == "NetworkPolicy")
    if breakage == "crd":
        built += load_yaml_dir(CONFIG / "crd")
    elif breakage == "namespace":
        built += load_yaml_dir(CONFIG / "namespace")
    elif breakage == "aggregated role":
        built += load_yaml_dir(CONFIG / "user-roles")
    elif breakage == "no policy":
        built.remove(policy)
    elif breakage == "policy on another port":
        policy["spec"]["ingress"][0]["ports"] = [{"port": 9090}]
    else:
        policy["spec"]["egress"].append({"ports": [{"port": 80}]})
    assert app_build_problems(built) != []


def _watch_namespaces(deployment: Obj) -> list[str]:
    env = {e["name"]: e.get("value") for e in _container(deployment).get("env", [])}
    return str(env.get("WATCH_NAMESPACES") or "").split(",")


# Until the history of earlier versions is carried over (slo-api:history-migration): when the
# RouteRevision CRD was made, and list and delete (never get, create or update) on ConfigMaps.
REVISIONS_CRD_AGE = {
    "apiGroups": ["apiextensions.k8s.io"],
    "resources": ["customresourcedefinitions"],
    "resourceNames": ["routerevisions.slo-api.modelsphere.dev"],
    "verbs": ["get"],
}
CARRY_CONFIG_MAPS = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "delete"]}


def test_only_the_temporary_migration_role_touches_config_maps_and_names_its_end() -> None:
    roles = {o["metadata"]["name"]: o for o in _load("rbac/rbac.yaml") if "rules" in o}
    on_config_maps = {
        name
        for name, role in roles.items()
        for rule in role["rules"]
        if "configmaps" in rule["resources"]
    }
    assert on_config_maps == {"slo-api:history-migration"}
    assert roles["slo-api:history-migration"]["rules"] == [CARRY_CONFIG_MAPS, REVISIONS_CRD_AGE]
    # Its own binding, so that removing it is deleting two objects and touches no other grant.
    bindings = [o for o in _load("rbac/rbac.yaml") if o["kind"] == "ClusterRoleBinding"]
    assert [b["roleRef"]["name"] for b in bindings].count("slo-api:history-migration") == 1
    upgrade = (REPO / "docs" / "upgrade.md").read_text()
    assert "slo-api:history-migration" in upgrade


def test_the_namespaced_overlay_lists_its_directory_and_the_base() -> None:
    listed = _kustomization(NAMESPACED)["resources"]
    assert sorted(listed) == sorted(["../../manager", *(p.name for p in _yaml_files(NAMESPACED))])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_namespaced_overlay_grants_roles_in_exactly_the_watched_namespaces() -> None:
    built = _rendered(NAMESPACED)
    # Cluster-wide only reading namespaces (which are labelled exempt from the guardrails: no
    # Role can grant that) and the binding that lets it review callers (TokenReview and
    # SubjectAccessReview are not namespaced), to the built-in role.
    read_namespaces = [{"apiGroups": [""], "resources": ["namespaces"], "verbs": READ}]
    # And, until the history of earlier versions is carried over, reading when the
    # RouteRevision CRD was made (a CRD is cluster-wide too).
    cluster_wide = [o["rules"] for o in built if o["kind"] == "ClusterRole"]
    assert sorted(cluster_wide, key=str) == sorted([read_namespaces, [REVISIONS_CRD_AGE]], key=str)
    assert sorted(o["roleRef"]["name"] for o in built if o["kind"] == "ClusterRoleBinding") == [
        "slo-api:history-migration",
        "slo-api:namespaces",
        "system:auth-delegator",
    ]
    assert not [o for o in built if o["kind"] == "Secret"]
    deployment = next(o for o in built if o["kind"] == "Deployment")
    assert deployment_problems(deployment) == []
    watched = _watch_namespaces(deployment)
    assert watched
    cluster_roles = {
        o["metadata"]["name"]: o for o in _load("rbac/rbac.yaml") if o["kind"] == "ClusterRole"
    }
    # What the cluster-wide deployment grants on the kinds, Events and histories, per namespace.
    granted = (
        [r for r in cluster_roles["slo-api"]["rules"] if r != read_namespaces[0]]
        + cluster_roles["slo-api:events"]["rules"]
        + cluster_roles["slo-api:history"]["rules"]
        + [r for r in cluster_roles["slo-api:history-migration"]["rules"] if r != REVISIONS_CRD_AGE]
    )
    roles = {o["metadata"]["namespace"]: o for o in built if o["kind"] == "Role"}
    bindings = {o["metadata"]["namespace"]: o for o in built if o["kind"] == "RoleBinding"}
    assert sorted(roles) == sorted(watched)
    assert sorted(bindings) == sorted(watched)
    for namespace in watched:
        # The same grants as the ClusterRoles, in each watched namespace only.
        assert roles[namespace]["rules"] == granted, namespace
        binding = bindings[namespace]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[namespace]["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}
        ]


# -- the operational checklist -----------------------------------------------------------------


def _container(deployment: Obj) -> Obj:
    containers: list[Obj] = deployment["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if c.get("name") == NAME]
    assert len(found) == 1, "one container named slo-api"
    return found[0]


def _named_port(container: Obj, name: str) -> int | None:
    for port in container.get("ports", []):
        if port.get("name") == name:
            number: int = port["containerPort"]
            return number
    return None


def deployment_problems(deployment: Obj) -> list[str]:
    problems: list[str] = []
    spec = deployment.get("spec", {})
    pod = spec.get("template", {}).get("spec", {})
    container = _container(deployment)

    if spec.get("replicas", 1) < 2:
        problems.append("fewer than 2 replicas")
    if pod.get("serviceAccountName") != NAME:
        problems.append("serviceAccountName is not slo-api")
    if pod.get("automountServiceAccountToken") is not True:
        problems.append("the ServiceAccount token is not mounted (in-cluster config needs it)")

    # The container's securityContext overrides the pod's, field by field.
    effective = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    own = container.get("securityContext", {})
    if effective.get("runAsNonRoot") is not True:
        problems.append("runAsNonRoot is not set")
    for key in ("runAsUser", "runAsGroup"):
        if effective.get(key) != USER_ID:
            problems.append(f"{key} is not {USER_ID}")
    if own.get("readOnlyRootFilesystem") is not True:
        problems.append("the root filesystem is writable")
    if own.get("allowPrivilegeEscalation") is not False:
        problems.append("privilege escalation is allowed")
    if own.get("privileged"):
        problems.append("the container is privileged")
    if own.get("capabilities", {}).get("drop") != ["ALL"]:
        problems.append("capabilities are not all dropped")
    if own.get("capabilities", {}).get("add"):
        problems.append("capabilities are added")
    if effective.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append("seccompProfile is not RuntimeDefault")

    if _named_port(container, "http") != PORT:
        problems.append(f"no container port {PORT} named http")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") not in ("http", PORT):
            problems.append(f"{probe} is not GET {path} on the http port")

    sleep = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    if sleep <= 0:
        problems.append("no preStop sleep action")
    stop = sleep + sum(float(_setting(deployment, s)) for s in STOP_SETTINGS)
    if pod.get("terminationGracePeriodSeconds", 30) < stop + LIFESPAN_SHUTDOWN_SECONDS:
        problems.append(
            "terminationGracePeriodSeconds does not cover preStop, the readiness grace, "
            "the drain and the lifespan shutdown"
        )

    problems += sizing_problems(container.get("resources", {}))
    problems += spread_problems(deployment)
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    if any(k.startswith("prometheus.io/") for k in annotations):
        problems.append("prometheus.io annotations beside the ServiceMonitor: scraped twice")

    env = {e.get("name"): e for e in container.get("env", [])}
    token = env.get("SLO_API_TOKEN", {})
    if token.get("valueFrom", {}).get("secretKeyRef", {}) != {"name": NAME, "key": "token"}:
        problems.append("SLO_API_TOKEN does not come from Secret slo-api key token")
    if "value" in token or any(
        "TOKEN" in str(name) and name != "SLO_API_TOKEN_AUDIENCES" and "value" in e
        for name, e in env.items()
    ):
        problems.append("a token is written into the manifest")
    if env.get("SLO_API_KUBERNETES_AUTH", {}).get("value") == "true" and (
        env.get("SLO_API_TOKEN_AUDIENCES", {}).get("value") != "slo-api"
    ):
        # Without an audience, users' API-server tokens would cross the plain-HTTP Service.
        problems.append("Kubernetes identities are on without the token audience slo-api")
    if env.get("LOG_FORMAT", {}).get("value") != "json":
        problems.append("LOG_FORMAT is not json")

    mounts = {m.get("mountPath"): m.get("name") for m in container.get("volumeMounts", [])}
    volumes = {v.get("name"): v for v in pod.get("volumes", [])}
    if "emptyDir" not in volumes.get(mounts.get("/tmp"), {}):
        problems.append("no emptyDir at /tmp (the root filesystem is read-only)")
    return problems


# The settings the stop takes, after preStop, in order.
STOP_SETTINGS = ("shutdown_grace_seconds", "shutdown_drain_seconds")


def _setting(deployment: Obj, name: str) -> Any:
    """A setting as the Deployment sets it, else its default."""
    for e in _container(deployment).get("env", []):
        if e.get("name") == name.upper() and "value" in e:
            return e["value"]
    return Settings.model_fields[name].default


# -- docs/operating.md's sizing: the formula, its table, and the manifests that follow it -------

_FORMULA = re.compile(
    r"1\.25 \u00d7 \((\d+) MiB \+ (\d+) MiB \u00d7 CRs / 10,000 \+ (\d+) MiB"
    r" \+ (\d+) KiB \u00d7 MAX_WATCHERS\)"
)
_ROW = re.compile(r"^\|\s*up to ([\d,]+)\s*\|\s*(\d+)Mi\s*\|\s*(\w+)\s*\|\s*(\w+)\s*\|$")
ROUND_MIB = 64


def sizing_formula() -> Callable[[int], float]:
    """The sizing's memory limit in MiB for a number of CRs, at the default MAX_WATCHERS."""
    found = _FORMULA.search(OPERATING.read_text())
    assert found, "docs/operating.md has no sizing formula"
    empty, per_10k, history, per_stream_kib = (int(g) for g in found.groups())
    # Three histories (both views and one kind followed alone), each at its default bound.
    assert history == 3 * Settings.model_fields["watch_history_bytes"].default // 2**20
    streams = Settings.model_fields["max_watchers"].default * per_stream_kib / 1024
    return lambda crs: 1.25 * (empty + per_10k * crs / 10_000 + history + streams)


def sizing_table() -> list[tuple[int, Obj]]:
    """The sizing table: (CRs, the resources it sizes them with), smallest first."""
    rows = []
    for line in OPERATING.read_text().splitlines():
        found = _ROW.match(line.strip())
        if found:
            crs, memory, cpu_request, cpu_limit = found.groups()
            resources = {
                "requests": {"cpu": cpu_request, "memory": f"{memory}Mi"},
                "limits": {"cpu": cpu_limit, "memory": f"{memory}Mi"},
            }
            rows.append((int(crs.replace(",", "")), resources))
    assert len(rows) >= 3, "docs/operating.md's sizing table was not found"
    return sorted(rows, key=lambda r: r[0])


def sizing_problems(resources: Obj) -> list[str]:
    if resources.get("requests", {}).get("memory") != resources.get("limits", {}).get("memory"):
        # Every replica holds the same index: overcommitted, they would be killed together.
        return ["the memory request is not the limit"]
    if resources not in [r for _, r in sizing_table()]:
        return [f"resources {resources} are no row of the sizing table in docs/operating.md"]
    return []


def test_the_sizing_table_follows_its_formula() -> None:
    limit = sizing_formula()
    for crs, resources in sizing_table():
        memory = int(resources["limits"]["memory"].removesuffix("Mi"))
        assert memory == math.ceil(limit(crs) / ROUND_MIB) * ROUND_MIB, crs


def spread_problems(deployment: Obj) -> list[str]:
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    keys = []
    for constraint in pod.get("topologySpreadConstraints", []):
        selector = constraint.get("labelSelector", {}).get("matchLabels", {})
        if selector and selector.items() <= labels.items() and constraint.get("maxSkew") == 1:
            keys.append(constraint.get("topologyKey"))
    if keys != ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]:
        return ["replicas are not spread across zones, then hosts"]
    return []


def service_problems(service: Obj, deployment: Obj) -> list[str]:
    problems: list[str] = []
    spec = service.get("spec", {})
    ports = spec.get("ports", [])
    if len(ports) != 1 or ports[0].get("port") != 80:
        problems.append("the Service does not expose port 80")
    elif (
        ports[0].get("targetPort") not in ("http", PORT)
        or _named_port(_container(deployment), "http") != PORT
    ):
        problems.append("port 80 does not target the container's http port")
    selector = spec.get("selector") or {}
    labels = deployment["spec"]["template"]["metadata"].get("labels", {})
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        problems.append("the Service selector does not select the Deployment's pods")
    if deployment["spec"].get("selector", {}).get("matchLabels") != selector:
        problems.append("the Service and the Deployment select differently")
    return problems


def test_the_deployment_keeps_the_operational_checklist() -> None:
    assert deployment_problems(_deployment()) == []


def test_the_deployments_settings_are_valid_together() -> None:
    literal = {
        e["name"].lower(): e["value"] for e in _container(_deployment())["env"] if "value" in e
    }
    literal.pop("pod_name", None)
    settings = Settings(**literal, slo_api_token="x" * 16)
    assert settings.shutdown_drain_seconds >= settings.upstream_timeout_seconds


def test_the_service_fronts_the_pods_on_port_80() -> None:
    assert service_problems(_service(), _deployment()) == []


def test_the_example_secret_is_a_marked_placeholder() -> None:
    secret = _one("manager/secret.example.yaml", "Secret")
    assert secret["metadata"] == secret["metadata"] | {"name": NAME, "namespace": NAMESPACE}
    token = secret["stringData"]["token"]
    assert "REPLACE" in token.upper()
    assert "example" in (CONFIG / "manager" / "secret.example.yaml").read_text().lower()


def _pod(d: Obj) -> Obj:
    pod: Obj = d["spec"]["template"]["spec"]
    return pod


def _sc(d: Obj) -> Obj:
    sc: Obj = _container(d)["securityContext"]
    return sc


def _env(d: Obj, name: str) -> Obj:
    return next(e for e in _container(d)["env"] if e["name"] == name)


BREAKAGES: dict[str, Callable[[Obj], Any]] = {
    "one replica": lambda d: d["spec"].update(replicas=1),
    "runs as root": lambda d: _sc(d).update(runAsUser=0),
    "pod root, container unset": lambda d: (
        _sc(d).pop("runAsUser"),
        _pod(d)["securityContext"].update(runAsUser=0),
    ),
    "runAsNonRoot dropped": lambda d: (
        _sc(d).pop("runAsNonRoot"),
        _pod(d)["securityContext"].pop("runAsNonRoot"),
    ),
    "writable root fs": lambda d: _sc(d).pop("readOnlyRootFilesystem"),
    "privilege escalation": lambda d: _sc(d).update(allowPrivilegeEscalation=True),
    "capabilities kept": lambda d: _sc(d).pop("capabilities"),
    "capability added": lambda d: _sc(d)["capabilities"].update(add=["NET_ADMIN"]),
    "no seccomp": lambda d: (_sc(d).pop("seccompProfile"), _pod(d)["securityContext"].clear()),
    "no readiness probe": lambda d: _container(d).pop("readinessProbe"),
    "liveness on /readyz": lambda d: _container(d)["livenessProbe"]["httpGet"].update(
        path="/readyz"
    ),
    "no preStop": lambda d: _container(d).pop("lifecycle"),
    "preStop needing a shell": lambda d: _container(d)["lifecycle"].update(
        preStop={"exec": {"command": ["sleep", "5"]}}
    ),
    "short grace period": lambda d: _pod(d).update(terminationGracePeriodSeconds=10),
    "drain past the grace period": lambda d: _env(d, "SHUTDOWN_DRAIN_SECONDS").update(value="60"),
    "no limits": lambda d: _container(d)["resources"].pop("limits"),
    "bigger requests": lambda d: _container(d)["resources"]["requests"].update(cpu="1"),
    "memory overcommitted": lambda d: _container(d)["resources"]["requests"].update(memory="256Mi"),
    "memory off the table": lambda d: [
        _container(d)["resources"][k].update(memory="300Mi") for k in ("requests", "limits")
    ],
    "the original's sizing": lambda d: _container(d).update(
        resources={
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "200m", "memory": "256Mi"},
        }
    ),
    "no spread": lambda d: _pod(d).pop("topologySpreadConstraints"),
    "hosts only": lambda d: _pod(d)["topologySpreadConstraints"].pop(0),
    "scrape annotations": lambda d: d["spec"]["template"]["metadata"].update(
        annotations={"prometheus.io/scrape": "true"}
    ),
    "literal token": lambda d: _env(d, "SLO_API_TOKEN").update(value="s3cret"),
    "token from another key": lambda d: _env(d, "SLO_API_TOKEN")["valueFrom"][
        "secretKeyRef"
    ].update(key="password"),
    "console logs": lambda d: _env(d, "LOG_FORMAT").update(value="console"),
    "no /tmp": lambda d: _container(d).pop("volumeMounts"),
    "other port": lambda d: _container(d)["ports"][0].update(containerPort=80),
    "no token mount": lambda d: _pod(d).update(automountServiceAccountToken=False),
    "default ServiceAccount": lambda d: _pod(d).pop("serviceAccountName"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_the_checklist_catches(breakage: str) -> None:
    deployment = copy.deepcopy(_deployment())
    BREAKAGES[breakage](deployment)
    assert deployment_problems(deployment) != []


@pytest.mark.parametrize(
    "breakage",
    ["port 8080", "target 8080 by a missing name", "selector", "no selector"],
)
def test_the_service_check_catches(breakage: str) -> None:
    service, deployment = copy.deepcopy(_service()), _deployment()
    spec = service["spec"]
    if breakage == "port 8080":
        spec["ports"][0]["port"] = 8080
    elif breakage == "target 8080 by a missing name":
        spec["ports"][0]["targetPort"] = "web"
    elif breakage == "selector":
        spec["selector"] = {"app.kubernetes.io/name": "other"}
    else:
        spec.pop("selector")
    assert service_problems(service, deployment) != []


# -- the image -------------------------------------------------------------------------------


def _dockerfile() -> list[str]:
    """Instructions, with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text())
    stripped = (line.strip() for line in text.splitlines())
    return [line for line in stripped if line and not line.startswith("#")]


def _final_stage(lines: list[str]) -> list[str]:
    starts = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")]
    assert starts, "no FROM"
    return lines[starts[-1] :]


def _instruction(lines: list[str], name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in lines if line.split()[0].upper() == name]


def test_the_image_is_slim_non_root_and_runs_the_console_script_as_pid_1() -> None:
    lines = _dockerfile()
    final = _final_stage(lines)

    users = _instruction(final, "USER")
    assert users, "the final stage sets no USER"
    assert users[-1].split(":")[0] == str(USER_ID), "USER must be numeric (runAsNonRoot checks it)"
    assert users[-1] == f"{USER_ID}:{USER_ID}"
    assert _instruction(final, "EXPOSE") == [str(PORT)]

    entrypoint = _instruction(final, "ENTRYPOINT")
    assert len(entrypoint) == 1
    argv = json.loads(entrypoint[0])  # exec form: a JSON array, so no shell sits at PID 1
    assert isinstance(argv, list)
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert argv == [NAME]
    assert NAME in scripts

    env = " ".join(_instruction(final, "ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "PYTHONUNBUFFERED=1" in env


def test_the_default_base_is_python_3_11_slim_pinned_by_digest() -> None:
    [default] = [a for a in _instruction(_dockerfile(), "ARG") if a.startswith("PYTHON_IMAGE=")]
    image = default.removeprefix("PYTHON_IMAGE=")
    assert re.fullmatch(
        r"(docker\.io/library/)?python:3\.11[.\d]*-slim[\w-]*@sha256:[0-9a-f]{64}", image
    )


def test_the_final_stage_removes_every_installer_the_base_ships_before_adding_the_venv() -> None:
    final = _final_stage(_dockerfile())
    runs = [i for i, line in enumerate(final) if line.startswith("RUN ")]
    removal = [i for i in runs if "rm -rf" in final[i]]
    assert len(removal) == 1
    step = final[removal[0]]
    for name in ("'pip'", "'pip3'", "'setuptools'", "'wheel'", "'ensurepip'", "'pip-*'"):
        assert name in step, name
    # Whatever the base: python:*-slim's /usr/local and Debian's /usr/lib and python-wheels.
    for where in ("/usr/local/lib/python3*", "/usr/lib/python3*", "/usr/share/python-wheels"):
        assert where in step, where
    copy_venv = next(i for i, line in enumerate(final) if line.startswith("COPY --from=build"))
    assert removal[0] < copy_venv


def test_the_license_label_is_the_projects_and_its_text_ships() -> None:
    license_id = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]
    labels = " ".join(_instruction(_final_stage(_dockerfile()), "LABEL"))
    assert f'org.opencontainers.image.licenses="{license_id}"' in labels
    assert license_id == "Apache-2.0"
    assert "Apache License" in (REPO / "LICENSE").read_text()
    assert re.search(r"^COPY\s+.*\bLICENSE\b", "\n".join(_dockerfile()), re.M)


def test_the_image_installs_locked_dependencies_before_copying_the_code() -> None:
    lines = _dockerfile()

    def first(pattern: str) -> int:
        found = [i for i, line in enumerate(lines) if re.search(pattern, line)]
        assert found, pattern
        return found[0]

    # Exact versions with hashes from the lock, never a floating resolution.
    copy_lock = first(r"^COPY\s+.*\brequirements\.lock\b")
    install_deps = first(r"^RUN\b.*install --require-hashes\b.* -r requirements\.lock\b")
    copy_code = first(r"^COPY\s+slo_api/?\s")
    build_package = first(r"^RUN\b.*pip wheel --no-build-isolation --no-deps\b")
    install_package = first(r"^RUN\b.*install --no-deps --no-index\b")
    assert copy_lock < install_deps < copy_code <= build_package <= install_package
    for line in lines:
        if re.search(r"\binstall\b.* -r ", line):
            assert "--require-hashes" in line, line
    # hatchling reads pyproject.toml and the README it names, so they must be in the build.
    assert first(r"^COPY\s+.*\bpyproject\.toml\b") < build_package
    readme = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("readme")
    if readme:
        assert first(rf"^COPY\s+.*\b{re.escape(readme)}\b") < build_package
    # The final stage takes only the virtual environment from the build stage.
    copied = _instruction(_final_stage(lines), "COPY")
    assert copied == ["--from=build /opt/venv /opt/venv"]


def _dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_the_build_context_keeps_what_the_build_copies_and_drops_the_rest() -> None:
    patterns = _dockerignore()
    built_from = ("pyproject.toml", "README.md", "LICENSE", "slo_api")
    for needed in (*built_from, "requirements.lock", "requirements-build.lock"):
        assert needed not in patterns, needed
        assert not any(re.fullmatch(p.replace("*", ".*"), needed) for p in patterns), needed
    for dropped in (".git", ".venv", "tests", "robustness", ".cluster", ".demo", "**/__pycache__"):
        assert dropped in patterns, dropped
    assert "controlplane" in patterns or "controlplane/go" in patterns
