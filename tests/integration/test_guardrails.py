"""The guardrails (config/guardrails) on the real API server: every writer held to the caps of
its namespace's SLOLimits `default`, the ratchet, exempt and unparameterised namespaces, what
slo-api shows and answers, and who may change the limits."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from controlplane.admin import Admin, AdminError, load_kustomization
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
    "minQueueDepth": 100,
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
    "minQueueDepth": ("job", {"queue": {"maxDepth": 5}}, "queue.maxDepth"),
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
    objs = load_kustomization(CONFIG / "guardrails")
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    admin.apply_all(crds)
    admin.wait_crds(crds)
    admin.apply_all(o for o in objs if o not in crds)
    # Until the API server has synced the parameter kind, the policy refuses every SLO write.
    probe = crs.llm("default", "guardrails-probe")
    path = admin.path(probe["apiVersion"], probe["kind"], "default")

    def writable() -> bool:
        try:
            admin.request("POST", path, probe, params={"dryRun": "All"})
        except AdminError:
            return False
        return True

    wait_until(writable, "the guardrails' parameter kind synced")
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


def wait_until(check: Callable[[], bool], what: str, within: float = 60) -> None:
    """Wait for a condition of the API server (a policy or parameter taking effect)."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


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
    assert ok.json()["limits"] == {k: v for k, v in CAPS.items() if k != "minQueueDepth"}
    assert "overLimits" not in ok.json()
    job = (await service.get(f"/routes/{routes['job']}")).json()
    assert job["limits"] == {"maxPriority": 5, "maxReplicas": 8, "minQueueDepth": 100}


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

        wait_until(refused, "the guardrails hold under the old group")
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


def _section(default: dict[str, float], **ranges: dict[str, float]) -> dict[str, Any]:
    """A TTFT or OTPS section: the default's thresholds and each range's, by metric type
    (`ranges` by their low bound, `r4096=...`)."""

    def metrics(values: dict[str, float]) -> list[dict[str, Any]]:
        return [{"type": t, "threshold": v} for t, v in values.items()]

    section: dict[str, Any] = {"default": {"metrics": metrics(default)}}
    if ranges:
        section["ranges"] = [
            {"contextLengthRangeLow": int(low[1:]), "metrics": metrics(values)}
            for low, values in ranges.items()
        ]
    return section


async def test_the_ratchet_holds_each_value_by_range_and_metric_type(
    admin: Admin,
    namespace: str,
    service: RunningService,
    guardrails: None,
) -> None:
    route = f"per-value-{namespace}"
    path = f"/routes/{route}"
    ttft = _section({"p90": 0.05, "p99": 0.5}, r0={"p90": 0.5}, r4096={"p90": 0.5, "avg": 0.05})
    otps = _section({"avg": 100, "p50": 10})
    # Stored before the limits existed: one TTFT value beyond the cap in the default, one in
    # the range from 4096, one OTPS value beyond it.
    obj = admin.create(crs.llm(namespace, "grand", route, ttft=ttft, otps=otps))
    admin.create(_limits(namespace, minTTFTSeconds=0.2, maxOTPS=50, maxPriority=5))
    await _in_force(service, admin, obj)
    await service.eventually(
        lambda: service.runtime.limits.capped() >= {namespace}, what="slo-api reads the limits"
    )
    assert (await service.get(path)).json()["overLimits"] == ["ttft", "otps"]

    refused = {
        "the grandfathered value spread to another metric": {
            "ttft": _section(
                {"p90": 0.05, "p99": 0.05}, r0={"p90": 0.5}, r4096={"p90": 0.5, "avg": 0.05}
            )
        },
        "spread to another range": {
            "ttft": _section(
                {"p90": 0.05, "p99": 0.5}, r0={"p90": 0.05}, r4096={"p90": 0.5, "avg": 0.05}
            )
        },
        "spread to a new range": {
            "ttft": _section(
                {"p90": 0.05, "p99": 0.5},
                r0={"p90": 0.5},
                r4096={"p90": 0.5, "avg": 0.05},
                r8192={"p90": 0.1},
            )
        },
        "two thresholds swapped, one moving away from the cap": {
            "ttft": _section(
                {"p90": 0.5, "p99": 0.05}, r0={"p90": 0.5}, r4096={"p90": 0.5, "avg": 0.05}
            )
        },
        "an OTPS value spread to another metric": {"otps": _section({"avg": 100, "p50": 100})},
    }
    for what, spec in refused.items():
        with pytest.raises(AdminError) as patched:
            admin.merge_patch(crs.SLO, "LLMSLORequirement", namespace, "grand", {"spec": spec})
        assert patched.value.status == 422, what
        response = await service.put(path, spec)
        assert response.status_code == 400, (what, response.text)
        assert response.json()["error"]["code"] == "limit_exceeded", what
    stored = admin.get(crs.SLO, "LLMSLORequirement", namespace, "grand")
    assert (stored["spec"]["ttft"], stored["spec"]["otps"]) == (ttft, otps)

    # Lowering one over-cap value while the others stay: accepted, the rest still beyond.
    toward = {
        "ttft": _section(
            {"p90": 0.1, "p99": 0.5}, r0={"p90": 0.5}, r4096={"p90": 0.5, "avg": 0.05}
        ),
        "otps": _section({"avg": 80, "p50": 10}),
    }
    response = await service.put(path, toward)
    assert response.status_code == 200, response.text
    assert response.json()["overLimits"] == ["ttft", "otps"]
    # A range's values are matched by its low bound, not its place in the list.
    reordered = _section({"p90": 0.1, "p99": 0.5}, r4096={"avg": 0.05, "p90": 0.5}, r0={"p90": 1})
    kept = admin.merge_patch(
        crs.SLO, "LLMSLORequirement", namespace, "grand", {"spec": {"ttft": reordered}}
    )
    assert kept["spec"]["ttft"] == reordered


async def test_queue_depth_is_a_floor_with_the_same_ratchet(
    admin: Admin,
    namespace: str,
    service: RunningService,
    guardrails: None,
) -> None:
    # The old name is refused by the CRD, naming the new one.
    with pytest.raises(AdminError) as old_name:
        admin.create(_limits(namespace, maxQueueDepth=100))
    assert old_name.value.status == 422
    assert "minQueueDepth" in str(old_name.value)
    route = f"depth-{namespace}"
    path = f"/routes/{route}"
    # Stored before the limits existed: a depth of 10, below the floor to come.
    queue = {"maxDepth": 10, "promql": "sum(jobs_pending)"}
    obj = admin.create(crs.job(namespace, "deep", route, queue=queue))
    admin.create(_limits(namespace, minQueueDepth=100, maxPriority=5))
    await _in_force(service, admin, obj)
    await service.eventually(
        lambda: service.runtime.limits.capped() >= {namespace}, what="slo-api reads the limits"
    )
    body = (await service.get(path)).json()
    assert body["limits"] == {"maxPriority": 5, "minQueueDepth": 100}
    assert body["overLimits"] == ["queue.maxDepth"]
    # Lower demands more replicas: refused, by any writer.
    with pytest.raises(AdminError) as patched:
        admin.merge_patch(
            crs.SLO, "JobSLORequirement", namespace, "deep", {"spec": {"queue": {"maxDepth": 5}}}
        )
    assert "minQueueDepth is 100 in this namespace's SLOLimits default" in str(patched.value)
    response = await service.put(path, {"queue": {"maxDepth": 5}})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("limit_exceeded", "queue.maxDepth")
    assert error["message"].startswith("may be at least 100 ")
    # Toward the floor, then above it: accepted.
    response = await service.put(path, {"queue": {"maxDepth": 50}})
    assert response.status_code == 200, response.text
    assert response.json()["overLimits"] == ["queue.maxDepth"]
    response = await service.put(path, {"queue": {"maxDepth": 500}})
    assert response.status_code == 200, response.text
    assert "overLimits" not in response.json()
    # And once above, a depth below the floor is refused again (nothing left to grandfather).
    response = await service.put(path, {"queue": {"maxDepth": 50}})
    assert response.status_code == 400, response.text
    # A new route is held to it from the start.
    with pytest.raises(AdminError):
        admin.create(crs.job(namespace, "shallow", f"shallow-{namespace}", queue=queue))


async def test_a_refusal_states_the_cap_exactly_and_a_retry_at_it_is_accepted(
    admin: Admin,
    namespace: str,
    service: RunningService,
    guardrails: None,
) -> None:
    route = f"exact-{namespace}"
    path = f"/routes/{route}"
    obj = admin.create(crs.llm(namespace, "exact", route, ttft=_ttft(1), otps=_otps(10)))
    admin.create(_limits(namespace, maxPriority=5, maxOTPS=1234567, minTTFTSeconds=0.2500001))
    await _in_force(service, admin, obj)
    await service.eventually(
        lambda: service.runtime.limits.capped() >= {namespace}, what="slo-api reads the limits"
    )
    cases = (
        ("otps", _otps(1234568), "maxOTPS is 1234567 in", r"may be at most (\S+)"),
        ("ttft", _ttft(0.25), "minTTFTSeconds is 0.2500001 in", r"may be at least (\S+) s"),
    )
    for field, body, policy_says, bound in cases:
        with pytest.raises(AdminError) as patched:
            admin.merge_patch(
                crs.SLO, "LLMSLORequirement", namespace, "exact", {"spec": {field: body}}
            )
        assert policy_says in str(patched.value), patched.value
        response = await service.put(path, {field: body})
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert "e+06" not in message, message
        assert "0.25 " not in message, message
        found = re.search(bound, message)
        assert found is not None, message
        # A client retries at the bound it was told.
        retried = await service.put(
            path,
            {
                field: {
                    "default": {
                        "metrics": [{**body["default"]["metrics"][0], "threshold": float(found[1])}]
                    }
                }
            },
        )
        assert retried.status_code == 200, (message, retried.text)
        assert retried.json()[field]["default"]["metrics"][0]["threshold"] == float(found[1])
    assert found is not None
    assert found[1] == "0.2500001"


async def test_pdengines_fall_back_to_max_replicas_when_max_pdengines_is_unset(
    admin: Admin,
    namespace: str,
    service: RunningService,
    guardrails: None,
) -> None:
    route = f"pd-{namespace}"
    path = f"/routes/{route}"
    obj = admin.create(crs.llm(namespace, "pd", route))
    admin.create(_limits(namespace, maxReplicas=8, maxPriority=5))
    await _in_force(service, admin, obj)
    await service.eventually(
        lambda: service.runtime.limits.capped() >= {namespace}, what="slo-api reads the limits"
    )
    assert (await service.get(path)).json()["limits"] == {
        "maxPriority": 5,
        "maxReplicas": 8,
        "maxPDEngines": 8,
    }
    pd = {
        "minimumDeployment": {"type": "pdengine", "value": 2},
        "maximumDeployment": {"type": "pdengine", "value": 20},
    }
    with pytest.raises(AdminError) as patched:
        admin.merge_patch(crs.SLO, "LLMSLORequirement", namespace, "pd", {"spec": pd})
    assert "maxReplicas is 8 in this namespace's SLOLimits default" in str(patched.value)
    response = await service.put(path, pd)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("limit_exceeded", "maximumDeployment.value")
    assert "a pdengine maximumDeployment.value may be at most 8" in error["message"]
    assert error["causes"][0]["limit"] == "maxReplicas"
    within = {**pd, "maximumDeployment": {"type": "pdengine", "value": 8}}
    response = await service.put(path, within)
    assert response.status_code == 200, response.text


def _bind(admin: Admin, namespace: str, role: str, user: str) -> None:
    admin.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )


def _allowed(admin: Admin, user: str, verb: str, namespace: str) -> bool:
    review = admin.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "resourceAttributes": {
                    "group": "inference.modelsphere.dev",
                    "resource": "slolimits",
                    "verb": verb,
                    "namespace": namespace,
                },
            },
        },
    )
    return bool(review["status"].get("allowed"))


def test_tenants_may_read_their_limits_through_the_user_roles(
    admin: Admin, cluster: Cluster, namespace: str, guardrails: None
) -> None:
    # slo-api-view bound directly, and the built-in roles it and slo-api-edit aggregate into
    # (kube-controller-manager fills them, as in a real cluster).
    roles = ("slo-api-view", "slo-api-edit", "view", "edit", "admin")
    for role in roles:
        _bind(admin, namespace, role, f"reader-{role}")
    reads, writes = ("get", "list", "watch"), ("create", "update", "patch", "delete")

    def may_read() -> bool:
        return all(_allowed(admin, f"reader-{r}", v, namespace) for r in roles for v in reads)

    wait_until(may_read, "the user roles grant reading slolimits")
    for role in roles:
        user = f"reader-{role}"
        assert not [v for v in writes if _allowed(admin, user, v, namespace)], role
        # Only in the namespace bound.
        assert not _allowed(admin, user, "get", f"{namespace}-elsewhere"), role
    # And for real: a reader's own request.
    admin.create(_limits(namespace, maxPriority=3))
    read = _kubectl(
        cluster,
        "-n",
        namespace,
        "get",
        "slolimits",
        "default",
        "-o",
        "json",
        "--as=reader-view",
    )
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["spec"] == {"maxPriority": 3}
    listed = _kubectl(cluster, "-n", namespace, "get", "slolimits", "--as=reader-slo-api-view")
    assert listed.returncode == 0, listed.stderr
    assert "default" in listed.stdout
    changed = _kubectl(
        cluster,
        "-n",
        namespace,
        "patch",
        "slolimits",
        "default",
        "--type=merge",
        "-p",
        '{"spec":{"maxPriority":10}}',
        "--as=reader-edit",
    )
    assert changed.returncode != 0
    assert "forbidden" in changed.stderr, changed.stderr


def test_the_optional_policy_lets_only_the_named_group_exempt_a_namespace(
    admin: Admin, cluster: Cluster, namespace: str, guardrails: None
) -> None:
    path = CONFIG / "guardrails" / "exempt-label.yaml"
    objs = [o for o in yaml.safe_load_all(path.read_text()) if o]
    admin.apply_all(objs)
    # system:masters passes RBAC, not admission: only the policy can refuse these.
    tenant = ("--as=tenant", "--as-group=system:masters")
    platform = ("--as=platform", "--as-group=system:masters", "--as-group=platform-admins")
    label = f"{EXEMPT_LABEL}=true"
    try:

        def refused() -> bool:
            probe = _kubectl(
                cluster, "label", "namespace", namespace, label, "--dry-run=server", *tenant
            )
            return probe.returncode != 0

        wait_until(refused, "the exempt-label policy in effect")
        setting = _kubectl(cluster, "label", "namespace", namespace, label, *tenant)
        assert setting.returncode != 0
        assert "only members of the group platform-admins" in setting.stderr, setting.stderr
        created = _kubectl(
            cluster,
            "create",
            "-f",
            "-",
            *tenant,
            stdin=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": f"{namespace}-x", "labels": {EXEMPT_LABEL: "true"}},
                }
            ),
        )
        assert created.returncode != 0, created.stdout
        # Any other label is anyone's; the named group may set and remove this one.
        other = _kubectl(cluster, "label", "namespace", namespace, "team=a", *tenant)
        assert other.returncode == 0, other.stderr
        assert _kubectl(cluster, "label", "namespace", namespace, label, *platform).returncode == 0
        removed = _kubectl(cluster, "label", "namespace", namespace, f"{EXEMPT_LABEL}-", *tenant)
        assert removed.returncode != 0, removed.stdout
        ns = admin.get("v1", "Namespace", None, namespace)
        assert ns["metadata"]["labels"][EXEMPT_LABEL] == "true"
        removed = _kubectl(cluster, "label", "namespace", namespace, f"{EXEMPT_LABEL}-", *platform)
        assert removed.returncode == 0, removed.stderr
    finally:
        for obj in reversed(objs):
            admin.delete(obj["apiVersion"], obj["kind"], None, obj["metadata"]["name"])


async def test_a_copy_to_the_new_api_group_is_held_to_the_caps_and_the_guide_gets_it_through(
    admin: Admin,
    cluster: Cluster,
    namespace: str,
    service: RunningService,
    guardrails: None,
) -> None:
    """docs/upgrade.md, re-creating CRs: a create has no old object, so the copy of a CR stored
    beyond a cap is refused; labelling the namespace exempt for the copy gets it through, and the
    ratchet holds the copy from then on."""
    plurals = ("llmslorequirements",)
    install(admin, OLD, plurals)
    try:
        route = f"moved-{namespace}"
        # Stored under the old group before the limits existed: beyond two caps.
        old = admin.create(
            under(OLD, crs.llm(namespace, "moved", route, priority=9, ttft=_ttft(0.05)))
        )
        admin.create(_limits(namespace, maxPriority=5, minTTFTSeconds=0.2))

        def refused(obj: crs.Obj) -> bool:
            try:
                _dry_patch(admin, obj, {"priority": 10})
            except AdminError:
                return True
            return False

        await service.eventually(lambda: refused(old), within=60, what="the caps in force")
        # The guide's copy: the same namespace, name and spec under the new group.
        copy = {
            "apiVersion": crs.SLO,
            "kind": "LLMSLORequirement",
            "metadata": {"name": "moved", "namespace": namespace},
            "spec": old["spec"],
        }
        manifest = json.dumps(copy)
        refusal = _kubectl(cluster, "create", "-f", "-", stdin=manifest)
        assert refusal.returncode != 0
        assert "maxPriority is 5 in this namespace's SLOLimits default" in refusal.stderr
        # The guide: label the namespace exempt for the copy, check with a server-side dry run,
        # copy, remove the label.
        labelled = _kubectl(cluster, "label", "namespace", namespace, f"{EXEMPT_LABEL}=true")
        assert labelled.returncode == 0, labelled.stderr

        def accepted() -> bool:
            dry = _kubectl(cluster, "create", "--dry-run=server", "-f", "-", stdin=manifest)
            return dry.returncode == 0

        await service.eventually(accepted, within=60, what="the namespace exempt")
        created = _kubectl(cluster, "create", "-f", "-", stdin=manifest)
        assert created.returncode == 0, created.stderr
        unlabelled = _kubectl(cluster, "label", "namespace", namespace, f"{EXEMPT_LABEL}-")
        assert unlabelled.returncode == 0, unlabelled.stderr
        stored = admin.get(crs.SLO, "LLMSLORequirement", namespace, "moved")
        assert (stored["spec"]["priority"], stored["spec"]["ttft"]) == (9, _ttft(0.05))
        # From then on the ratchet holds the copy: away refused, toward accepted.
        await service.eventually(lambda: refused(stored), within=60, what="the caps back")
        await service.eventually(
            lambda: (
                not service.runtime.limits.exempt(namespace)
                and service.runtime.limits.capped() >= {namespace}
            ),
            what="slo-api reads the limits",
        )
        await service.eventually(_indexed(service, route), what=f"{route} indexed")

        async def over() -> Any:
            return (await service.get(f"/routes/{route}")).json().get("overLimits")

        assert await over() == ["priority", "ttft"]
        toward = await service.put(f"/routes/{route}", {"priority": 7})
        assert toward.status_code == 200, toward.text
        away = await service.put(f"/routes/{route}", {"ttft": _ttft(0.01)})
        assert away.status_code == 400, away.text
    finally:
        uninstall(admin, OLD, plurals)
