"""Fields a GitOps tool owns (from managedFields) are not changed behind its back: 409
field_managed, force with a Warning, co-ownership, and `managed` in what GET answers."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from slo_api.ownership import LAST_APPLIED, Owner, Ownership
from tests.unit.conftest import AUTH, Started, llm_cr, pool_cr
from tests.unit.fakes import FakeKube

PLURAL = "llmslorequirements"
TRACKING = {
    "argocd.argoproj.io/tracking-id": "app:inference.modelsphere.dev/LLMSLORequirement:ns/a"
}


def applied_by(manager: str, *fields: str, operation: str = "Apply") -> dict[str, Any]:
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "time": "2026-12-01T10:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:serviceId": {}, **{f"f:{f}": {".": {}} for f in fields}}},
    }


def owned(obj: dict[str, Any], *entries: dict[str, Any], **annotations: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["managedFields"] = list(entries)
    if annotations:
        obj["metadata"]["annotations"] = annotations
    return obj


def test_only_gitops_managers_own_fields() -> None:
    rules = Ownership()
    obj = owned(
        llm_cr("a"),
        applied_by("argocd-controller", "priority", "ttft"),
        applied_by("kubectl-edit", "minimumDeployment", operation="Update"),
        applied_by("slo-api", "otps", operation="Update"),
    )
    owners = rules.owners(obj)
    assert sorted(owners) == ["priority", "ttft"]
    assert owners["priority"].manager == "argocd-controller"
    assert owners["priority"].operation == "Apply"


def test_client_side_apply_counts_only_with_a_marker_and_in_last_applied() -> None:
    rules = Ownership()
    last = json.dumps({"spec": {"serviceId": "a", "priority": 3}})
    entry = applied_by("kubectl-client-side-apply", "priority", "ttft", operation="Update")
    marked = owned(llm_cr("a"), entry, **{LAST_APPLIED: last}, **TRACKING)
    assert list(rules.owners(marked)) == ["priority"]
    assert rules.owners(owned(llm_cr("a"), entry, **{LAST_APPLIED: last})) == {}


def test_co_owned_cr_and_co_owner_managers_own_nothing() -> None:
    entry = applied_by("argocd-controller", "priority")
    annotated = owned(llm_cr("a"), entry, **{"slo-api.modelsphere.dev/co-owned": "true"})
    assert Ownership().owners(annotated) == {}
    co = Ownership(co_owners=frozenset({"argocd-controller"}))
    assert co.owners(owned(llm_cr("a"), entry)) == {}


def test_the_index_keeps_just_enough_of_managed_fields() -> None:
    rules = Ownership()
    status = applied_by("status-writer", operation="Update")
    status["fieldsV1"] = {"f:status": {"f:phase": {}}}
    obj = owned(
        llm_cr("a"),
        applied_by("argocd-controller", "priority"),
        applied_by("some-controller", "priority", operation="Update"),
        status,
    )
    trimmed = rules.trim(obj)
    # The tool's entry, and who else holds a client-owned field (a field taken from the
    # tool is remembered with its holder); nothing of the rest.
    assert trimmed["metadata"]["managedFields"] == [
        {
            "manager": "argocd-controller",
            "operation": "Apply",
            "time": "2026-12-01T10:00:00Z",
            "fieldsV1": {"f:spec": {"f:priority": {}}},
        },
        {
            "manager": "some-controller",
            "operation": "Update",
            "time": "2026-12-01T10:00:00Z",
            "fieldsV1": {"f:spec": {"f:priority": {}}},
        },
    ]
    assert rules.owners(trimmed) == rules.owners(obj)
    plain = rules.trim(owned(llm_cr("a"), applied_by("kubectl-create", "priority")))
    assert "managedFields" not in plain["metadata"]
    assert "managedFields" in obj["metadata"]  # the object given is not changed


async def test_a_change_to_an_owned_field_is_refused_and_nothing_is_written(
    start: Started,
) -> None:
    cr = owned(llm_cr("cr-1", route="a", priority=5), applied_by("argocd-controller", "priority"))
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube) as (client, _):
        for dry_run in ("false", "true"):
            put = await client.put(
                "/routes/a", params={"dryRun": dry_run}, json={"priority": 7}, headers=AUTH
            )
            assert put.status_code == 409
            error = put.json()["error"]
            assert error["code"] == "field_managed"
            assert "argocd-controller" in error["message"]
            assert "source it syncs from" in error["message"]
            assert error["causes"][0]["field"] == "priority"
            assert error["causes"][0]["manager"] == "argocd-controller"
        assert kube.patches == []
        reset = await client.delete("/routes/a", headers=AUTH)
        assert reset.status_code == 409
        assert reset.json()["error"]["code"] == "field_managed"
        assert kube.patches == []


async def test_an_echo_and_other_fields_go_through(start: Started) -> None:
    cr = owned(llm_cr("cr-1", route="a", priority=5), applied_by("argocd-controller", "priority"))
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube) as (client, _):
        body = (await client.get("/routes/a", headers=AUTH)).json()
        assert body["managed"] == {"priority": "argocd-controller"}
        body["minimumDeployment"] = {"type": "replica", "value": 3}
        put = await client.put("/routes/a", json=body, headers=AUTH)
        assert put.status_code == 200, put.text
        assert "Warning" not in put.headers
        assert kube.patches[-1][1]["spec"] == {"minimumDeployment": {"type": "replica", "value": 3}}


async def test_force_writes_with_a_warning_naming_the_tool(start: Started) -> None:
    cr = owned(llm_cr("cr-1", route="a"), applied_by("kustomize-controller", "priority"))
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube) as (client, _):
        dry = await client.put(
            "/routes/a",
            params={"force": "true", "dryRun": "true"},
            json={"priority": 7},
            headers=AUTH,
        )
        put = await client.put(
            "/routes/a", params={"force": "true"}, json={"priority": 7}, headers=AUTH
        )
        assert put.status_code == dry.status_code == 200
        assert put.headers["Warning"].startswith('299 - "')
        assert "kustomize-controller" in put.headers["Warning"]
        assert dry.headers["Warning"] == put.headers["Warning"]
        assert kube.objects[(PLURAL, "ns", "cr-1")]["spec"]["priority"] == 7


async def test_a_stale_index_cannot_allow_a_write(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    async with start(kube) as (client, _):
        # Argo CD takes the field over without the index hearing of it yet.
        obj = kube.objects[(PLURAL, "ns", "cr-1")]
        obj["metadata"]["managedFields"] = [applied_by("argocd-controller", "priority")]
        kube.rv += 1
        obj["metadata"]["resourceVersion"] = str(kube.rv)
        put = await client.put("/routes/a", json={"priority": 7}, headers=AUTH)
        assert put.status_code == 409
        assert put.json()["error"]["code"] == "field_managed"
        assert obj["spec"]["priority"] == 0


async def test_co_owner_setting_lets_writes_through(start: Started) -> None:
    cr = owned(llm_cr("cr-1", route="a"), applied_by("argocd-controller", "priority"))
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube, gitops_co_owners="argocd-controller") as (client, _):
        put = await client.put("/routes/a", json={"priority": 7}, headers=AUTH)
        assert put.status_code == 200
        assert "managed" not in put.json()


async def test_full_view_and_pool_fields_carry_managed(start: Started) -> None:
    pool = owned(pool_cr("gpu", ["a"]), applied_by("helm", "swapBudget", operation="Update"))
    kube = FakeKube({"modelpools": [pool]})
    async with start(kube) as (client, _):
        page = await client.get("/config", params={"view": "full"}, headers=AUTH)
        assert page.json()["items"][0]["managed"] == {"pool.swapBudget": "helm"}
        put = await client.put("/routes/gpu", json={"pool": {"swapBudget": "60s"}}, headers=AUTH)
        assert put.status_code == 409
        assert put.json()["error"]["causes"][0]["field"] == "pool.swapBudget"


async def test_a_stale_index_cannot_refuse_a_write_either(start: Started) -> None:
    cr = owned(llm_cr("cr-1", route="a"), applied_by("argocd-controller", "priority"))
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube) as (client, _):
        # The field was handed over (say, Argo CD stopped managing the CR): the index lags.
        obj = kube.objects[(PLURAL, "ns", "cr-1")]
        obj["metadata"]["managedFields"] = [applied_by("kubectl-edit", "priority")]
        kube.rv += 1
        obj["metadata"]["resourceVersion"] = str(kube.rv)
        put = await client.put("/routes/a", json={"priority": 7}, headers=AUTH)
        assert put.status_code == 200, put.text
        assert kube.objects[(PLURAL, "ns", "cr-1")]["spec"]["priority"] == 7


# -- markers, Flux's own annotations, and ownership that outlives one write ------------------

FLUX = {"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": "flux"}
FLUX_HELM = {"helm.toolkit.fluxcd.io/name": "slo", "helm.toolkit.fluxcd.io/namespace": "flux"}
HELM_ANNOTATIONS = {"meta.helm.sh/release-name": "slo", "meta.helm.sh/release-namespace": "ns"}
HELM_LABEL = {"app.kubernetes.io/managed-by": "Helm"}
INSTANCE = {"app.kubernetes.io/instance": "chat"}
LATER = "2026-12-01T10:05:00Z"


def marked(
    obj: dict[str, Any],
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    meta["labels"] = {**meta.get("labels", {}), **(labels or {})}
    meta["annotations"] = {**meta.get("annotations", {}), **(annotations or {})}
    return obj


def with_entries(obj: dict[str, Any], *entries: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["managedFields"] = list(entries)
    return obj


# (the tool's manager, its operation, the CR's labels, the CR's annotations)
TOOLS = {
    "argocd": ("argocd-controller", "Apply", {}, TRACKING),
    "flux": ("kustomize-controller", "Apply", FLUX, {}),
    "flux-helm": ("helm-controller", "Update", FLUX_HELM, {}),
    "helm": ("helm", "Update", HELM_LABEL, HELM_ANNOTATIONS),
    # Argo CD's default sync: client-side apply, the fields its source sets in last-applied.
    "argocd-client-side": (
        "kubectl-client-side-apply",
        "Update",
        {},
        {**TRACKING, LAST_APPLIED: json.dumps({"spec": {"priority": 0, "ttft": {}}})},
    ),
}


def _tool_cr(tool: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A CR whose priority and ttft the tool applied, and the tool's entry."""
    manager, operation, labels, annotations = TOOLS[tool]
    entry = applied_by(manager, "priority", "ttft", operation=operation)
    entry["fieldsV1"]["f:metadata"] = {"f:labels": {}, "f:annotations": {}}
    obj = with_entries(marked(llm_cr("a"), labels, annotations), entry)
    return obj, entry, manager


def _taken(obj: dict[str, Any], by: str, *fields: str) -> dict[str, Any]:
    """`obj` after `by` changed `fields` with an Update (a merge patch, kubectl edit): the
    fields move to `by`, out of every other entry (as the API server does)."""
    obj = copy.deepcopy(obj)
    for entry in obj["metadata"]["managedFields"]:
        for f in fields:
            entry["fieldsV1"].get("f:spec", {}).pop(f"f:{f}", None)
    obj["metadata"]["managedFields"].append(
        applied_by(by, *fields, operation="Update") | {"time": "2026-12-01T10:01:00Z"}
    )
    obj["metadata"]["resourceVersion"] = str(int(obj["metadata"].get("resourceVersion", "1")) + 1)
    return obj


def _reapplied(obj: dict[str, Any], manager: str, *fields: str) -> dict[str, Any]:
    """`obj` after the tool synced again, setting `fields` (the tool's entry gets a new time)."""
    obj = copy.deepcopy(obj)
    for entry in obj["metadata"]["managedFields"]:
        if entry["manager"] == manager:
            entry["time"] = LATER
            for f in fields:
                entry["fieldsV1"]["f:spec"][f"f:{f}"] = {}
        else:
            for f in fields:
                entry["fieldsV1"].get("f:spec", {}).pop(f"f:{f}", None)
    obj["metadata"]["resourceVersion"] = str(int(obj["metadata"].get("resourceVersion", "1")) + 1)
    return obj


def test_an_instance_label_alone_is_not_argo_cd_tracking() -> None:
    """`app.kubernetes.io/instance` is set by most Helm charts: a human's client-side apply
    of such a CR is not Argo CD's, unless Argo CD is said to track by that label."""
    last = json.dumps({"spec": {"serviceId": "a", "priority": 3}})
    entry = applied_by("kubectl-client-side-apply", "priority", operation="Update")
    obj = with_entries(marked(llm_cr("a"), INSTANCE, {LAST_APPLIED: last}), entry)
    assert Ownership().owners(obj) == {}
    tracking = Ownership(argocd_tracking_label="app.kubernetes.io/instance")
    assert tracking.owners(obj)["priority"].manager == "kubectl-client-side-apply"
    # Another label key configured: the instance label is still nothing.
    assert Ownership(argocd_tracking_label="argocd.argoproj.io/instance").owners(obj) == {}


def test_client_side_apply_is_argo_cds_only_and_never_flux_or_helm_marked() -> None:
    """Flux applies server-side (kustomize-controller) and Helm as `helm`: a client-side
    apply on a CR they mark is a person's, whose change the tool's own entry tells apart."""
    last = json.dumps({"spec": {"serviceId": "a", "priority": 3}})
    entry = applied_by("kubectl-client-side-apply", "priority", operation="Update")
    marks: list[tuple[dict[str, str], dict[str, str]]] = [
        (FLUX, {}),
        (FLUX_HELM, {}),
        (HELM_LABEL, HELM_ANNOTATIONS),
    ]
    for labels, notes in marks:
        obj = marked(llm_cr("a"), labels, {**notes, LAST_APPLIED: last})
        assert Ownership().owners(with_entries(obj, entry)) == {}


def test_markers_are_the_tools_real_ones() -> None:
    rules = Ownership()
    assert rules.markers(marked(llm_cr("a"), {}, TRACKING)) == {"argocd"}
    assert rules.markers(marked(llm_cr("a"), INSTANCE)) == set()
    assert rules.markers(marked(llm_cr("a"), FLUX)) == {"flux"}
    assert rules.markers(marked(llm_cr("a"), FLUX_HELM)) == {"flux-helm"}
    assert rules.markers(marked(llm_cr("a"), HELM_LABEL, HELM_ANNOTATIONS)) == {"helm"}
    # Half a marker is none: one Flux label, or Helm's annotations without its label.
    assert rules.markers(marked(llm_cr("a"), {"kustomize.toolkit.fluxcd.io/name": "x"})) == set()
    assert rules.markers(marked(llm_cr("a"), {}, HELM_ANNOTATIONS)) == set()
    assert rules.markers(marked(llm_cr("a"), {}, {"argocd.argoproj.io/tracking-id": ""})) == set()
    labelled = Ownership(argocd_tracking_label="app.kubernetes.io/instance")
    assert labelled.markers(marked(llm_cr("a"), INSTANCE)) == {"argocd"}


@pytest.mark.parametrize(
    ("key", "value", "honoured"),
    [
        ("kustomize.toolkit.fluxcd.io/ssa", "IfNotPresent", True),
        ("kustomize.toolkit.fluxcd.io/ssa", "ifnotpresent", True),
        ("kustomize.toolkit.fluxcd.io/ssa", "Ignore", True),
        ("kustomize.toolkit.fluxcd.io/reconcile", "disabled", True),
        ("kustomize.toolkit.fluxcd.io/ssa", "Merge", False),
        ("kustomize.toolkit.fluxcd.io/ssa", "Override", False),
        ("kustomize.toolkit.fluxcd.io/reconcile", "enabled", False),
    ],
)
def test_flux_leaves_a_cr_alone_when_its_annotations_say_so(
    key: str, value: str, honoured: bool
) -> None:
    """IfNotPresent: Flux creates the CR and never applies it again; Ignore and reconcile
    disabled: Flux does not apply it. Merge still overrides the fields in Git."""
    obj, _, _ = _tool_cr("flux")
    rules = Ownership()
    for where in ("annotations", "labels"):  # Flux reads either
        hinted = marked(obj, **{where: {key: value}})
        assert (rules.owners(hinted) == {}) is honoured
        forced = _taken(hinted, "slo-api", "priority")
        assert ("priority" in rules.carry(rules.owners(hinted), hinted, forced)) is not honoured
    # Flux's annotations are Flux's: Argo CD's fields stay Argo CD's.
    argo, _, _ = _tool_cr("argocd")
    assert rules.owners(marked(argo, annotations={key: value})) == rules.owners(argo)


@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize("by", ["slo-api", "kubectl-edit"])
def test_a_field_taken_from_the_tool_stays_the_tools(tool: str, by: str) -> None:
    """A forced write or a kubectl edit moves the field in managedFields, but the tool puts
    its value back at its next sync: it is remembered as the tool's."""
    obj, _, manager = _tool_cr(tool)
    rules = Ownership()
    before = rules.owners(obj)
    assert sorted(before) == ["priority", "ttft"]
    after = _taken(obj, by, "priority")
    assert list(rules.owners(after)) == ["ttft"]  # managedFields alone: the bug
    carried = rules.carry(before, obj, after)
    assert sorted(carried) == ["priority", "ttft"]
    remembered = carried["priority"]
    assert (remembered.manager, remembered.overridden_by) == (manager, by)
    assert remembered.remembered
    assert not carried["ttft"].remembered
    assert rules.owners(after, carried) == carried
    # It stays through more changes around the tool: another field, another person.
    later = _taken(_taken(after, "slo-api", "otps"), "kubectl-patch", "priority")
    again = rules.carry(carried, after, later)
    assert again["priority"].manager == manager
    assert again["priority"].overridden_by == "kubectl-patch"
    # Nothing known before (a first sight): the change from `old` to `new` says it all.
    assert rules.carry({}, obj, after) == carried


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_tool_applying_again_ends_the_memory(tool: str) -> None:
    obj, _, manager = _tool_cr(tool)
    rules = Ownership()
    after = _taken(obj, "slo-api", "priority")
    carried = rules.carry(rules.owners(obj), obj, after)
    # It set the field again: simply the tool's again, fresh.
    synced = _reapplied(after, manager, "priority")
    fresh = rules.carry(carried, after, synced)
    assert fresh["priority"] == Owner("priority", manager, TOOLS[tool][1], LATER)
    assert not fresh["priority"].remembered
    # It applied without the field (the source no longer sets it): released.
    dropped = _reapplied(after, manager)
    assert "priority" not in rules.carry(carried, after, dropped)
    assert "ttft" in rules.carry(carried, after, dropped)


def test_the_memory_ends_with_the_marker_co_ownership_or_a_co_owner() -> None:
    obj, _, _ = _tool_cr("argocd")
    rules = Ownership()
    after = _taken(obj, "slo-api", "priority")
    carried = rules.carry(rules.owners(obj), obj, after)
    unmarked = copy.deepcopy(after)
    unmarked["metadata"]["annotations"] = {}
    assert "priority" not in rules.carry(carried, after, unmarked)
    co_owned = marked(after, annotations={"slo-api.modelsphere.dev/co-owned": "true"})
    assert rules.carry(carried, after, co_owned) == {}
    co_owner = Ownership(co_owners=frozenset({"argocd-controller"}))
    assert co_owner.owners(after, carried) == {}


def test_a_field_removed_around_the_tool_is_remembered_too() -> None:
    """A DELETE reset or a kubectl edit that removes the field leaves no owner at all: the
    tool still adds it back."""
    obj, _, _ = _tool_cr("argocd")
    rules = Ownership()
    removed = copy.deepcopy(obj)
    del removed["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:priority"]
    del removed["spec"]["priority"]
    carried = rules.carry(rules.owners(obj), obj, removed)
    assert carried["priority"].overridden_by == ""
    assert carried["priority"].remembered


def test_the_tools_whole_entry_taken_is_still_remembered() -> None:
    """When the tool held nothing but the taken field, its entry goes with it."""
    entry = applied_by("argocd-controller", "priority")
    obj = with_entries(marked(llm_cr("a"), {}, TRACKING), entry)
    rules = Ownership()
    after = copy.deepcopy(obj)
    after["metadata"]["managedFields"] = [
        applied_by("kubectl-edit", "priority", operation="Update")
    ]
    carried = rules.carry(rules.owners(obj), obj, after)
    assert carried["priority"].overridden_by == "kubectl-edit"
    # And a relist that skipped states: the memory alone, re-checked on the CR now.
    assert rules.owners(after, carried) == carried


def test_owners_round_trip_through_json() -> None:
    owners = {
        "priority": Owner("priority", "argocd-controller", "Apply", "t1", overridden_by="slo-api"),
        "ttft": Owner("ttft", "helm", "Update", "t2"),
        "otps": Owner("otps", "helm", "Update", "t2", overridden_by=""),
    }
    text = json.dumps({f: o.to_json() for f, o in owners.items()})
    assert {f: Owner.from_json(v) for f, v in json.loads(text).items()} == owners
    assert owners["ttft"].to_json() == {
        "field": "ttft",
        "manager": "helm",
        "operation": "Update",
        "time": "t2",
    }
    assert owners["priority"].to_json()["overriddenBy"] == "slo-api"
    bad: Any
    for bad in ({}, {"field": 1, "manager": "m", "operation": "", "time": ""}, []):
        with pytest.raises(ValueError, match="an owner"):
            Owner.from_json(bad)


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_index_keeps_what_the_memory_reads(tool: str) -> None:
    """The index holds CRs trimmed: the memory computed on them is the one on full CRs."""
    obj, _, manager = _tool_cr(tool)
    rules = Ownership()
    noise = applied_by("some-controller", operation="Update")
    noise["fieldsV1"] = {"f:status": {}}
    obj["metadata"]["managedFields"].append(noise)
    steps = [obj, _taken(obj, "slo-api", "priority")]
    steps.append(_taken(steps[-1], "kubectl-edit", "ttft"))
    steps.append(_reapplied(steps[-1], manager, "ttft"))
    steps.append(_reapplied(steps[-1], manager))
    full: dict[str, Owner] = {}
    trimmed: dict[str, Owner] = {}
    previous: dict[str, Any] | None = None
    for step in steps:
        full = rules.carry(full, previous, step)
        trimmed = rules.carry(trimmed, rules.trim(previous) if previous else None, rules.trim(step))
        assert trimmed == full
        assert rules.owners(rules.trim(step), full) == rules.owners(step, full)
        previous = step
    assert sorted(full) == ["ttft"]
    kept = rules.trim(steps[1])["metadata"]["managedFields"]
    assert all(set(e) == {"manager", "operation", "time", "fieldsV1"} for e in kept)
    assert "some-controller" not in {e["manager"] for e in kept}


async def test_a_remembered_owner_is_shown_and_guards_writes(start: Started) -> None:
    """The service asks `remembered` (the history's memory) for the CR as it is now: a field
    slo-api holds in managedFields after a forced write is still Argo CD's."""
    cr = owned(
        llm_cr("cr-1", route="a", priority=9),
        applied_by("slo-api", "priority", operation="Update"),
        **TRACKING,
    )
    kube = FakeKube({PLURAL: [cr]})
    async with start(kube) as (client, app):
        assert "managed" not in (await client.get("/routes/a", headers=AUTH)).json()
        memory = {
            "priority": Owner(
                "priority", "argocd-controller", "Apply", "2026-12-01T10:00:00Z", "slo-api"
            )
        }
        app.state.runtime.service.remembered = lambda obj: memory
        read = await client.get("/routes/a", headers=AUTH)
        assert read.json()["managed"] == {"priority": "argocd-controller"}
        put = await client.put("/routes/a", json={"priority": 7}, headers=AUTH)
        assert put.status_code == 409
        cause = put.json()["error"]["causes"][0]
        assert cause["manager"] == "argocd-controller"
        assert "changed since by slo-api" in cause["message"]
        assert kube.patches == []
        forced = await client.put(
            "/routes/a", params={"force": "true"}, json={"priority": 7}, headers=AUTH
        )
        assert forced.status_code == 200
        assert "argocd-controller" in forced.headers["Warning"]
        # The CR declared co-owned: the memory is not in force any more.
        kube.objects[(PLURAL, "ns", "cr-1")]["metadata"]["annotations"][
            "slo-api.modelsphere.dev/co-owned"
        ] = "true"
        assert "managed" not in (await client.get("/routes/a", headers=AUTH)).json()
