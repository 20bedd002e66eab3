"""What the index and the history keep of a CR is compact (managedFields as shared facts, the
history's last state the index's entry and a digest of its client-owned fields, owners
shared), and every answer read from it is the one the full objects give: the write guard's
owners, who made a change, what changed."""

from __future__ import annotations

import asyncio
import copy
import functools
import gc
import tracemalloc
from typing import Any, cast

import orjson

from slo_api.history import History
from slo_api.index import CRIndex
from slo_api.kinds.llm import LLMKind
from slo_api.kube import Resource
from slo_api.managed_fields import entry_of, facts
from slo_api.ownership import Owner, Ownership
from slo_api.service import Service
from tests.unit import vtime
from tests.unit.conftest import llm_cr, until
from tests.unit.fakes import FakeKube

PLURAL = "llmslorequirements"
GROUP = "inference.modelsphere.dev"
LLM = LLMKind(Resource(GROUP, "v1alpha1", PLURAL))
NAME = ("ns", "cr-1")
TRACKING = {"argocd.argoproj.io/tracking-id": "apps:inference.modelsphere.dev/x:ns/cr-1"}


def _entry(manager: str, operation: str, time: str, fields: dict[str, Any], **kw: Any) -> Any:
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": f"{GROUP}/v1alpha1",
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
        **kw,
    }


def _spec_fields(*names: str) -> dict[str, Any]:
    return {
        "f:metadata": {"f:annotations": {"f:argocd.argoproj.io/tracking-id": {}}},
        "f:spec": {f"f:{n}": {} for n in names},
    }


def states(uid: str = "u1") -> list[dict[str, Any]]:
    """A CR as the API server shows it: applied by Argo CD, its status written by an
    operator, then its priority changed with kubectl edit (three managers)."""
    applied = llm_cr("cr-1", route="a", priority=1, ttft={"default": {"metrics": []}})
    applied["metadata"].update(
        uid=uid, resourceVersion="10", generation=1, annotations=dict(TRACKING)
    )
    every = ("serviceId", "priority", "minimumDeployment", "ttft")
    argo = _entry("argocd-controller", "Apply", "2026-01-01T00:00:00Z", _spec_fields(*every))
    applied["metadata"]["managedFields"] = [argo]
    status = copy.deepcopy(applied)
    status["metadata"]["resourceVersion"] = "11"
    status["status"] = {"observedGeneration": 1, "conditions": [{"type": "Ready"}]}
    operator = _entry(
        "llm-operator",
        "Update",
        "2026-01-01T00:01:00Z",
        {"f:status": {"f:conditions": {}}},
        subresource="status",
    )
    status["metadata"]["managedFields"] = [argo, operator]
    edited = copy.deepcopy(status)
    edited["metadata"].update(resourceVersion="12", generation=2)
    edited["spec"]["priority"] = 7
    rest = ("serviceId", "minimumDeployment", "ttft")
    argo_after = _entry("argocd-controller", "Apply", "2026-01-01T00:00:00Z", _spec_fields(*rest))
    edit = _entry("kubectl-edit", "Update", "2026-01-01T00:02:00Z", {"f:spec": {"f:priority": {}}})
    edited["metadata"]["managedFields"] = [argo_after, operator, edit]
    return [applied, status, edited]


def reference_owners(ownership: Ownership, chain: list[dict[str, Any]]) -> dict[str, Owner]:
    """The ownership rule applied to the full objects, state after state."""
    owners: dict[str, Owner] = {}
    for obj in chain:
        owners = ownership.carry(owners, None, obj)
    return owners


def _index_with_history(kube: FakeKube, ownership: Ownership) -> tuple[CRIndex, History]:
    """An index and the history observing it, wired as the runtime wires them."""
    index = Service.index_for([LLM], ownership)
    history = History(kube, [LLM], 20, ownership=ownership, grace=5.0)  # type: ignore[arg-type]
    index.on_observed(history.observe)
    return index, history


def test_the_index_gives_back_the_managed_fields_its_trim_kept() -> None:
    ownership = Ownership()
    index = Service.index_for([LLM], ownership)
    for obj in states():
        index.upsert(PLURAL, obj)
        stored = index.get(PLURAL, *NAME)
        assert stored == ownership.trim(obj)
        assert stored is not None
        assert ownership.owners(stored) == ownership.owners(obj)


def test_a_change_of_kept_managed_fields_alone_is_a_change_and_a_relist_of_the_same_none() -> None:
    index = Service.index_for([LLM], Ownership())
    told: list[set[str]] = []
    index.subscribe(told.append)
    edited = states()[-1]
    index.upsert(PLURAL, edited)
    told.clear()
    index.replace(PLURAL, [copy.deepcopy(edited)], GROUP)
    assert told == []  # the same CR listed again: nothing changed
    applied_again = copy.deepcopy(edited)
    applied_again["metadata"]["resourceVersion"] = "13"
    applied_again["metadata"]["managedFields"][0]["time"] = "2026-01-01T00:03:00Z"
    index.upsert(PLURAL, applied_again)
    assert told == [{"a"}]  # only the tool's apply time moved: a new state all the same
    stored = index.get(PLURAL, *NAME)
    assert stored is not None
    assert stored["metadata"]["managedFields"][0]["time"] == "2026-01-01T00:03:00Z"


def test_the_history_kept_compactly_names_what_the_full_objects_name() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        ownership = Ownership()
        chain = states()
        expected = reference_owners(ownership, chain)
        assert expected["priority"].overridden_by == "kubectl-edit"
        index, watched = _index_with_history(kube, ownership)
        for obj in chain:
            index.upsert(PLURAL, obj)
        await watched.close()
        # The status update changed nothing a client owns: one revision, the edit's.
        (revision,) = [o for (p, _, _), o in kube.objects.items() if p == "routerevisions"]
        entry = orjson.loads(revision["data"])
        assert (entry["id"], entry["actor"], entry["via"]) == ("12", "kubectl-edit", "kubectl-edit")
        assert entry["changes"] == [{"field": "priority", "from": 1, "to": 7}]
        assert set(entry["owners"]) == set(expected)
        assert watched.remembered(chain[-1]) == expected
        assert watched.by("12") == {
            "actor": "kubectl-edit",
            "via": "kubectl-edit",
            "requestId": None,
            "clientRequestId": None,
        }
        # A replica started after lists the CR (the index's trimmed copy) and reads its
        # newest revision back: the same owners.
        fresh_index, started_after = _index_with_history(kube, ownership)
        fresh_index.replace(PLURAL, [fresh_index.entry(PLURAL, chain[-1])], GROUP)
        await until(lambda: bool(started_after.remembered(chain[-1])), "looked at")
        await started_after.close()  # its seed read back too
        assert started_after.remembered(chain[-1]) == expected

    vtime.run(scenario())


def _history_bytes_per_cr(ttft_thresholds: int) -> float:
    """What the history still holds per CR (allocated under it) once 100 plain CRs were each
    created and had their status updated (nothing client-owned changed: no revision)."""

    async def scenario() -> float:
        kube = FakeKube()
        ownership = Ownership()
        index, history = _index_with_history(kube, ownership)
        metrics = [{"type": "p90", "threshold": 0.5 + i / 1000} for i in range(ttft_thresholds)]
        crs = 100
        gc.collect()
        tracemalloc.start(64)
        before = tracemalloc.take_snapshot()
        for i in range(crs):
            created = llm_cr(f"cr-{i}", ttft={"default": {"metrics": metrics}})
            created["metadata"].update(uid=f"u{i}", resourceVersion=str(10 + 2 * i), generation=1)
            index.upsert(PLURAL, created)
            status = copy.deepcopy(created)
            status["metadata"]["resourceVersion"] = str(11 + 2 * i)
            status["status"] = {"observedGeneration": 1}
            index.upsert(PLURAL, status)
        await history.close()
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        mine = [tracemalloc.Filter(True, "*/slo_api/history/*", all_frames=True)]
        held = sum(
            s.size_diff
            for s in after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename")
        )
        assert not any(p == "routerevisions" for p, _, _ in kube.objects)
        return held / crs

    return vtime.run(scenario())


def test_the_history_holds_no_copy_of_what_the_index_holds() -> None:
    # The client-owned fields grow by about 1.5 KB per CR from one run to the other; the state
    # the history diffs with is the index's entry, shared: its own cost per CR does not grow.
    small, large = _history_bytes_per_cr(1), _history_bytes_per_cr(40)
    assert large - small < 64, (small, large)


def test_the_history_keeps_a_fifth_of_the_memory_goal_per_plain_cr() -> None:
    # The goal: 20 MiB per 10,000 CRs, 2,097 bytes each, for everything a replica keeps. The
    # history's share for a CR with one manager, watched through a status update: its last
    # state (the index's entry, shared, and a digest).
    per_cr = _history_bytes_per_cr(1)
    assert per_cr < 20 * 2**20 / 10_000 / 5, per_cr


def _edited(i: int, gitops: bool, override: bool) -> list[dict[str, Any]]:
    """`states`, of CR i: applied by Argo CD (or by `kubectl apply`, with no marker: a plain
    CR), its status updated, then a field changed with kubectl edit: `priority`, the applier's
    (with Argo CD an override: an owner the API server forgets at once), or without
    `override` `maximumDeployment`, a field nobody held."""
    chain = states(f"u{i}")
    _, status, edited = chain
    for n, obj in enumerate(chain):
        obj["metadata"].update(name=f"cr-{i}", resourceVersion=str(10 + 3 * i + n))
    if not override:
        edited["spec"]["priority"] = 1
        edited["spec"]["maximumDeployment"] = {"type": "replica", "value": 3}
        edit = _entry(
            "kubectl-edit",
            "Update",
            "2026-01-01T00:02:00Z",
            {"f:spec": {"f:maximumDeployment": {}}},
        )
        edited["metadata"]["managedFields"] = [*status["metadata"]["managedFields"], edit]
    if not gitops:
        for obj in chain:
            del obj["metadata"]["annotations"]
            for entry in obj["metadata"]["managedFields"]:
                if entry["manager"] == "argocd-controller":
                    entry["manager"] = "kubectl-client-side-apply"
    return chain


@functools.cache
def _history_bytes_per_edited_cr(gitops: bool, override: bool) -> float:
    """What the history holds per CR (allocated under it) for 50 CRs that went through
    `_edited`, after 50 others did (what grows in steps, as a dict's table, has grown)."""

    async def scenario() -> float:
        kube = FakeKube()
        ownership = Ownership()
        index, history = _index_with_history(kube, ownership)
        crs = 50
        tracemalloc.start(16)
        for i in range(2 * crs):
            if i == crs:
                await asyncio.sleep(10)  # the first ones recorded
                kube.objects.clear()
                gc.collect()
                before = tracemalloc.take_snapshot()
            for obj in _edited(i, gitops, override):
                index.upsert(PLURAL, obj)
        await history.close()
        recorded = sum(p == "routerevisions" for p, _, _ in kube.objects)
        kube.objects.clear()  # what was stored upstream is not the history's memory
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        mine = [tracemalloc.Filter(True, "*/slo_api/history/*", all_frames=True)]
        held = sum(t.size for t in after.filter_traces(mine).traces) - sum(
            t.size for t in before.filter_traces(mine).traces
        )
        assert recorded == crs
        owners = history.remembered(_edited(2 * crs - 1, gitops, override)[-1])
        assert ("priority" in owners) is gitops
        assert (gitops and owners["priority"].remembered) is (gitops and override)
        return held / crs

    return vtime.run(scenario())


def test_the_gitops_owners_a_crs_managed_fields_name_cost_the_history_nothing() -> None:
    # Owners the index's entry names (its GitOps managedFields) are read from it again when
    # asked: a CR Argo CD applied costs the history no more than a plain CR does (about 80 bytes
    # more when each CR kept its owners).
    plain = _history_bytes_per_edited_cr(gitops=False, override=False)
    gitops = _history_bytes_per_edited_cr(gitops=True, override=False)
    assert gitops - plain < 16, (plain, gitops)


def test_an_overridden_owner_is_kept_and_costs_the_history_a_shared_owner() -> None:
    # An owner whose field another manager took is named by no state: kept (the helper checks
    # that it is remembered), in a tuple per CR of owners shared among CRs.
    plain = _history_bytes_per_edited_cr(gitops=False, override=True)
    overridden = _history_bytes_per_edited_cr(gitops=True, override=True)
    assert overridden - plain < 128, (plain, overridden)


def _decoded(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as a watch event brings it: decoded anew, its strings its own."""
    return cast(dict[str, Any], orjson.loads(orjson.dumps(obj)))


def _applied_in_another_second(obj: dict[str, Any]) -> dict[str, Any]:
    other = copy.deepcopy(obj)
    for entry in other["metadata"]["managedFields"]:
        if entry["manager"] == "argocd-controller":
            entry["time"] = "2026-01-01T00:00:07Z"
    return other


def test_crs_applied_in_different_seconds_keep_one_copy_of_each_managers_name() -> None:
    # Each event decodes its own strings: the managedFields facts of CRs applied in different
    # seconds (not one shared tuple) name their managers and operations with one string each,
    # not ~60 bytes of copies per CR.
    entries = [
        entry_of("argocd-controller", "Apply", "2026-01-01T00:00:00Z", ["priority", "ttft"]),
        entry_of("kubectl-edit", "Update", "2026-01-01T00:02:00Z", ["maximumDeployment"]),
    ]
    first = facts(_decoded({"entries": entries})["entries"])
    entries[0]["time"] = "2026-01-01T00:00:07Z"
    second = facts(_decoded({"entries": entries})["entries"])
    assert first is not None
    assert second is not None
    assert first != second
    for a, b in zip(first, second, strict=True):
        assert a[0] is b[0]  # the manager
        assert a[1] is b[1]  # the operation


def test_crs_applied_in_different_seconds_remember_their_owners_with_one_copy_of_each_name() -> (
    None
):
    # The overridden owner the history keeps per CR (each second's CRs share one) holds
    # one string per manager, operation and field, whichever event brought it.
    async def scenario() -> None:
        index, history = _index_with_history(FakeKube(), Ownership())
        owners = []
        for i, shift in ((1, False), (2, True)):
            chain = _edited(i, gitops=True, override=True)
            if shift:
                chain = [_applied_in_another_second(obj) for obj in chain]
            for obj in chain:
                index.upsert(PLURAL, _decoded(obj))
            owners.append(history.remembered(chain[-1])["priority"])
        a, b = owners
        assert a != b
        assert a.remembered
        assert b.remembered
        assert a.manager is b.manager
        assert a.operation is b.operation
        assert a.field is b.field
        assert a.overridden_by is b.overridden_by
        await history.close()

    vtime.run(scenario())


def test_the_owners_asked_with_a_newer_copy_are_those_after_the_last_state_seen() -> None:
    # A write's answer can reach the index before its event reaches the history: the guard
    # then asks with a copy newer than the last state observed. The owners that state's
    # managedFields named are in effect still (a kubectl edit took priority from Argo CD in
    # the newer copy: the tool puts it back at its next sync).
    async def scenario() -> None:
        ownership = Ownership()
        applied, status, edited = states()
        index, history = _index_with_history(FakeKube(), ownership)
        for obj in (applied, status):
            index.upsert(PLURAL, obj)
        remembered = history.remembered(edited)
        assert remembered == reference_owners(ownership, [applied, status])
        guarded = ownership.owners(edited, remembered)
        assert guarded == reference_owners(ownership, [applied, status, edited])
        assert guarded["priority"].overridden_by == "kubectl-edit"
        await history.close()

    vtime.run(scenario())
