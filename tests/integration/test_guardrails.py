"""The guardrails (config/guardrails) on the real API server: every writer held to the caps of
its namespace's SLOLimits `default`, the ratchet, exempt and unparameterised namespaces, what
slo-api shows and answers, and who may change the limits."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controlplane.admin import Admin, AdminError, load_yaml_dir
from controlplane.cluster import CONFIG, Cluster
from slo_api.limits import EXEMPT_LABEL
from tests.integration import crs
from tests.integration.service import RunningService
from tests.integration.test_groups_cluster import OLD, install, under, uninstall

pytestmark = pytest.mark.integration

ADMISSION = "admissionregistration.k8s.io/v1"
CAPS = {
    "maxPriority": 5,
    "maxReplicas": 8,
    "maxPDEngines": 4,
    "minTTFTSeconds": 0.2,
    "maxOTPS": 50,
    "maxQueueDepth": 100,
}


def _ttft(*thresholds: float) -> dict[str, Any]:
    return {"default": {"metrics": [{"type": "p90", "threshold": t} for t in thresholds]}}


def _otps(threshold: float) -> dict[str, Any]:
    return {"default": {"metrics": [{"type": "avg", "threshold": threshold}]}}


# Per cap: the kind of route, a body (the API's names) beyond it, the field slo-api names,
# and the same change as a merge patch of the CR's spec.
BEYOND: dict[str, tuple[str, dict[str, Any], str]] = {
    "maxPriority": ("llm", {"priority": 7}, "priority"),
    "maxReplicas": (
        "llm",
        {"maximumDeployment": {"type": "replica", "value": 20}},
        "maximumDeployment.value",
    ),
    "maxPDEngines": (
        "llm",
        {
            "minimumDeployment": {"type": "pdengine", "value": 2},
            "maximumDeployment": {"type": "pdengine", "value": 6},
        },
        "maximumDeployment.value",
    ),
    "minTTFTSeconds": ("llm", {"ttft": _ttft(0.5, 0.05)}, "ttft"),
    "maxOTPS": ("llm", {"otps": _otps(100)}, "otps"),
    "maxQueueDepth": ("job", {"queue": {"maxDepth": 500}}, "queue.maxDepth"),
}
KINDS = {"llm": "LLMSLORequirement", "job": "JobSLORequirement"}


def _limits(namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": crs.SLO,
        "kind": "SLOLimits",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def guardrails(admin: Admin) -> Iterator[None]:
    """config/guardrails installed as a platform admin would (they are opt-in)."""
    objs = load_yaml_dir(CONFIG / "guardrails")
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    admin.apply_all(crds)
    admin.wait_crds(crds)
    admin.apply_all(o for o in objs if o not in crds)
    try:
        yield
    finally:
        for obj in reversed(objs):
            if obj["kind"] != "CustomResourceDefinition":
                admin.delete(obj["apiVersion"], obj["kind"], None, obj["metadata"]["name"])


def _kubectl(cluster: Cluster, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    assert cluster.credentials is not None
    return subprocess.run(
        ["kubectl", f"--kubeconfig={cluster.credentials.admin_kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _dry_patch(admin: Admin, obj: crs.Obj, spec: dict[str, Any]) -> None:
    meta = obj["metadata"]
    path = admin.path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
    admin.request("PATCH", path, {"spec": spec}, "application/merge-patch+json", {"dryRun": "All"})


async def _over_limits(service: RunningService) -> float:
    """What /metrics says of the routes beyond their limits (this slo-api's, every namespace)."""
    text = (await service.client.get("/metrics")).text
    [line] = [x for x in text.splitlines() if x.startswith("slo_api_routes_over_limits ")]
    return float(line.split()[1])


def _indexed(service: RunningService, route: str) -> Callable[[], bool]:
    return lambda: bool(service.indexed(route))


async def _in_force(service: RunningService, admin: Admin, obj: crs.Obj) -> None:
    """A new policy or parameter takes effect once the API server has seen it: dry runs of a
    change beyond a cap until one is refused."""

    def refused() -> bool:
        try:
            _dry_patch(admin, obj, {"priority": 10})
        except AdminError:
            return True
        return False

    await service.eventually(refused, within=60, what="the guardrails in force")


def _spec_of(body: dict[str, Any]) -> dict[str, Any]:
    """The API's body as the CR's spec (the same names here), a copy."""
    spec: dict[str, Any] = json.loads(json.dumps(body))
    return spec


async def test_each_cap_refuses_kubectl_a_merge_patch_and_slo_api_alike(
    admin: Admin,
    cluster: Cluster,
    namespace: str,
    service: RunningService,
    guardrails: None,
) -> None:
    routes = {"llm": f"capped-llm-{namespace}", "job": f"capped-job-{namespace}"}
    objs = {
        "llm": admin.create(crs.llm(namespace, "llm", routes["llm"], priority=3)),
        "job": admin.create(crs.job(namespace, "job", routes["job"])),
    }
    admin.create(_limits(namespace, **CAPS))
    await _in_force(service, admin, objs["llm"])
    for route in routes.values():
        await service.eventually(_indexed(service, route), what=f"{route} indexed")
    await service.eventually(
        lambda: service.runtime.limits.capped() >= {namespace}, what="slo-api reads the limits"
    )

    for cap, (kind, body, field) in BEYOND.items():
        obj = objs[kind]
        name = obj["metadata"]["name"]
        # A merge patch from any client.
        with pytest.raises(AdminError) as patched:
            admin.merge_patch(crs.SLO, KINDS[kind], namespace, name, {"spec": _spec_of(body)})
        assert patched.value.status == 422, cap
        message = str(patched.value)
        assert "ValidatingAdmissionPolicy 'slo-limits' with binding 'slo-limits'" in message
        assert f"{cap} is {CAPS[cap]:g} in this namespace's SLOLimits default" in message
        # kubectl apply, client-side and server-side.
        current = admin.get(crs.SLO, KINDS[kind], namespace, name)
        manifest: dict[str, Any] = {
            "apiVersion": crs.SLO,
            "kind": KINDS[kind],
            "metadata": {"name": name, "namespace": namespace},
            "spec": {**current["spec"], **_spec_of(body)},
        }
        if kind == "job":
            manifest["spec"]["queue"] = {**current["spec"]["queue"], **body["queue"]}
        for mode in ((), ("--server-side", "--force-conflicts")):
            applied = _kubectl(cluster, "apply", *mode, "-f", "-", stdin=json.dumps(manifest))
            assert applied.returncode != 0, (cap, mode, applied.stdout)
            assert "denied request" in applied.stderr, applied.stderr
            assert cap in applied.stderr, applied.stderr
        # slo-api's write and its dry run.
        for params in ({}, {"dryRun": "true"}):
            response = await service.put(f"/routes/{routes[kind]}", body, params=params)
            assert response.status_code == 400, (cap, response.text)
            error = response.json()["error"]
            assert (error["code"], error["field"]) == ("limit_exceeded", field), cap
            assert (
                f"{cap} is {CAPS[cap]:g} in the namespace's SLOLimits `default`"
                in (error["message"])
            )
            assert name not in response.text.split()
            assert namespace not in response.text
        stored = admin.get(crs.SLO, KINDS[kind], namespace, name)
        assert stored["spec"] == current["spec"], cap

    # Within the caps, every writer goes through.
    ok = await service.put(f"/routes/{routes['llm']}", {"priority": 5, "ttft": _ttft(0.2)})
    assert ok.status_code == 200, ok.text
    assert ok.json()["limits"] == {k: v for k, v in CAPS.items() if k != "maxQueueDepth"}
    assert "overLimits" not in ok.json()
    job = (await service.get(f"/routes/{routes['job']}")).json()
    assert job["limits"] == {"maxPriority": 5, "maxReplicas": 8, "maxQueueDepth": 100}


async def test_the_ratchet_keeps_what_was_stored_and_allows_only_moves_toward_the_cap(
    admin: Admin,
    namespace: str,
    service: RunningService,
    guardrails: None,
) -> None:
    route = f"ratchet-{namespace}"
    path = f"/routes/{route}"
    # Stored before the limits existed: beyond two caps.
    obj = admin.create(crs.llm(namespace, "old", route, priority=9, ttft=_ttft(0.05)))
    admin.create(_limits(namespace, maxPriority=5, minTTFTSeconds=0.2))
    await _in_force(service, admin, obj)
    await service.eventually(
        lambda: service.runtime.limits.capped() >= {namespace}, what="slo-api reads the limits"
    )
    body = (await service.get(path)).json()
    assert body["overLimits"] == ["priority", "ttft"]
    assert await _over_limits(service) >= 1

    # An unrelated change goes through; the over-cap values stay as they are.
    unrelated = await service.put(path, {"otps": _otps(500)})
    assert unrelated.status_code == 200, unrelated.text
    assert (unrelated.json()["priority"], unrelated.json()["ttft"]) == (9, _ttft(0.05))
    labelled = admin.merge_patch(
        crs.SLO, "LLMSLORequirement", namespace, "old", {"metadata": {"labels": {"a": "b"}}}
    )
    assert labelled["spec"]["priority"] == 9
    # Away from the cap: refused, by slo-api's write and by a merge patch alike.
    away = await service.put(path, {"priority": 10})
    assert away.json()["error"]["code"] == "limit_exceeded"
    away = await service.put(path, {"ttft": _ttft(0.01)})
    assert away.json()["error"]["field"] == "ttft"
    with pytest.raises(AdminError):
        admin.merge_patch(
            crs.SLO, "LLMSLORequirement", namespace, "old", {"spec": {"priority": 10}}
        )
    # Toward it: accepted, still beyond, and from there no way back up.
    toward = await service.put(path, {"priority": 7, "ttft": _ttft(0.1, 1.0)})
    assert toward.status_code == 200, toward.text
    assert toward.json()["overLimits"] == ["priority", "ttft"]
    back = await service.put(path, {"priority": 8})
    assert back.status_code == 400
    back = await service.put(path, {"ttft": _ttft(0.07)})
    assert back.status_code == 400
    before = await _over_limits(service)
    within = await service.put(path, {"priority": 5, "ttft": _ttft(0.3)})
    assert within.status_code == 200, within.text
    assert "overLimits" not in within.json()
    assert await _over_limits(service) == before - 1


async def test_an_exempt_namespace_and_one_without_limits_are_not_capped(
    admin: Admin,
    service: RunningService,
    guardrails: None,
    namespace: str,
) -> None:
    free = f"{namespace}-free"
    admin.ensure_namespace(free)  # no SLOLimits at all
    exempt = f"{namespace}-exempt"
    admin.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": exempt, "labels": {EXEMPT_LABEL: "true"}},
        }
    )
    admin.create(_limits(exempt, maxPriority=0, maxReplicas=0))
    # A capped namespace beside them shows the policy is in force.
    capped = admin.create(crs.llm(namespace, "probe", f"probe-{namespace}"))
    admin.create(_limits(namespace, maxPriority=0))
    await _in_force(service, admin, capped)
    await service.eventually(
        lambda: service.runtime.limits.exempt(exempt), what="slo-api reads the exempt label"
    )
    for ns in (free, exempt):
        route = f"free-{ns}"
        admin.create(crs.llm(ns, "free", route, priority=10))
        await service.eventually(_indexed(service, route), what=f"{route} indexed")
        response = await service.put(
            f"/routes/{route}", {"maximumDeployment": {"type": "replica", "value": 500}}
        )
        assert response.status_code == 200, response.text
        assert "limits" not in response.json()
        admin.merge_patch(crs.SLO, "LLMSLORequirement", ns, "free", {"spec": {"priority": 9}})


def test_tenants_cannot_change_limits_and_slo_api_only_reads_them(
    admin: Admin, cluster: Cluster, namespace: str, guardrails: None
) -> None:
    for role in ("edit", "admin", "slo-api-edit"):
        admin.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"tenant-{role}", "namespace": namespace},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": role}
                ],
            }
        )

    def allowed(
        user: str, verb: str, resource: str = "slolimits", group: str = "inference.modelsphere.dev"
    ) -> bool:
        review = admin.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user,
                    "resourceAttributes": {
                        "group": group,
                        "resource": resource,
                        "verb": verb,
                        "namespace": namespace,
                    },
                },
            },
        )
        return bool(review["status"].get("allowed"))

    writes = ("create", "update", "patch", "delete", "deletecollection")
    for role in ("edit", "admin", "slo-api-edit"):
        # The binding works (the role may change SLOs), the limits stay out of reach.
        assert allowed(role, "patch", "llmslorequirements"), role
        assert not [v for v in writes if allowed(role, v)], role
    sa = "system:serviceaccount:llm-scaler:slo-api"
    assert all(allowed(sa, v) for v in ("get", "list", "watch"))
    assert not [v for v in writes if allowed(sa, v)]
    assert all(allowed(sa, v, "namespaces", "") for v in ("get", "list", "watch"))
    # And for real, with slo-api's own token: a read works, a write is 403.
    sa_client = cluster.slo_api_client()
    admin.create(_limits(namespace, maxPriority=3))
    assert sa_client.get(crs.SLO, "SLOLimits", namespace, "default")["spec"]["maxPriority"] == 3
    with pytest.raises(AdminError) as refused:
        sa_client.merge_patch(crs.SLO, "SLOLimits", namespace, "default", {"spec": {}})
    assert refused.value.status == 403


def test_the_slolimits_crd_validates_its_fields(
    admin: Admin, namespace: str, guardrails: None
) -> None:
    for spec in ({"maxPriority": 11}, {"maxReplicas": -1}, {"minTTFTSeconds": -0.5}):
        with pytest.raises(AdminError) as refused:
            admin.create(_limits(namespace, **spec))
        assert refused.value.status == 422, spec
    with pytest.raises(AdminError):
        admin.create({**_limits(namespace), "metadata": {"name": "x", "namespace": namespace}})


def test_the_caps_hold_under_the_older_api_group_too(
    admin: Admin, namespace: str, guardrails: None
) -> None:
    plurals = ("llmslorequirements",)
    install(admin, OLD, plurals)
    try:
        old = admin.create(under(OLD, crs.llm(namespace, "legacy", f"legacy-{namespace}")))
        admin.create(_limits(namespace, maxPriority=5))

        def refused() -> bool:
            try:
                _dry_patch(admin, old, {"priority": 9})
            except AdminError as exc:
                return "maxPriority is 5" in str(exc)
            return False

        deadline = time.monotonic() + 60
        while not refused():
            assert time.monotonic() < deadline, "the guardrails never held under the old group"
            time.sleep(0.2)
        with pytest.raises(AdminError) as patched:
            admin.merge_patch(
                old["apiVersion"],
                "LLMSLORequirement",
                namespace,
                "legacy",
                {"spec": {"priority": 9}},
            )
        assert patched.value.status == 422
        kept = admin.merge_patch(
            old["apiVersion"], "LLMSLORequirement", namespace, "legacy", {"spec": {"priority": 5}}
        )
        assert kept["spec"]["priority"] == 5
    finally:
        uninstall(admin, OLD, plurals)
