"""A route's history: what is recorded, by whom, once, within its bound, and who may read it."""

from __future__ import annotations

import copy
from typing import Any

import orjson

from slo_api.history import History, changed_by, changes_between, history_name, owned_body
from slo_api.kinds.llm import LLMKind
from slo_api.kinds.pool import PoolKind
from slo_api.kube import KubeError, Resource
from slo_api.service import Service, Target
from tests.unit.conftest import AUTH, Started, llm_cr, pool_cr
from tests.unit.fakes import FakeKube, fail
from tests.unit.test_feed import Reader

PLURAL = "llmslorequirements"
LLM = LLMKind(Resource("inference.modelsphere.dev", "v1alpha1", PLURAL))
POOL = PoolKind(Resource("inference.llmkube.dev", "v1alpha1", "modelpools"))


def _managed(*entries: tuple[str, str, list[str]]) -> list[dict[str, Any]]:
    return [
        {
            "manager": manager,
            "operation": "Update",
            "time": time,
            "fieldsV1": {"f:spec": {f"f:{f}": {} for f in fields}},
        }
        for manager, time, fields in entries
    ]


def test_changes_name_the_api_fields_with_their_values_before_and_after() -> None:
    before = llm_cr("a", priority=1)
    after = llm_cr("a", priority=6, maximumDeployment={"type": "replica", "value": 3})
    assert changes_between(LLM, before, after) == [
        {"field": "priority", "from": 1, "to": 6},
        {"field": "maximumDeployment", "from": None, "to": {"type": "replica", "value": 3}},
    ]
    pool_before = pool_cr("p", ["a"])
    pool_after = pool_cr("p", ["a", "b"], swapBudget="90s")
    # Members are the deployer's: not a client change.
    assert changes_between(POOL, pool_before, pool_after) == [
        {"field": "pool.swapBudget", "from": "300s", "to": "90s"}
    ]
    assert owned_body(POOL, pool_after) == {
        "route": "p",
        "kind": "pool",
        "pool": {"swapPolicy": "sticky", "swapBudget": "90s"},
    }


def test_the_manager_of_a_change_is_the_one_now_owning_a_changed_field() -> None:
    obj = llm_cr("a")
    obj["metadata"]["managedFields"] = _managed(
        ("kubectl-create", "2026-01-01T00:00:00Z", ["serviceId", "priority"]),
        ("slo-api", "2026-01-02T00:00:00Z", ["minimumDeployment"]),
        ("argocd-controller", "2026-01-03T00:00:00Z", ["ttft"]),
    )
    assert changed_by(obj, ["priority"]) == ("kubectl-create", "2026-01-01T00:00:00Z")
    # A removed field has no owner: the manager touched last made the change.
    assert changed_by(obj, ["maximumDeployment"])[0] == "argocd-controller"


def test_history_names_stay_valid_for_the_longest_cr_names() -> None:
    assert history_name(LLM, "chat") == "slo-history.llm.chat"
    long = history_name(LLM, "x" * 253)
    assert len(long) <= 253
    assert long != history_name(LLM, "x" * 252 + "y")


async def test_a_write_through_slo_api_is_recorded_once_with_its_caller(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=1)]})
    async with start(kube) as (client, _):
        assert (await client.get("/routes/a/history", headers=AUTH)).json() == {
            "items": [],
            "total": 0,
            "page": 1,
            "pageSize": 20,
        }
        # A route that never changed costs nothing: no ConfigMap.
        assert kube.config_maps == {}
        put = await client.put(
            "/routes/a", json={"priority": 6}, headers={**AUTH, "X-Request-Id": "req-1"}
        )
        assert put.status_code == 200
        # An unchanged write records nothing.
        assert (await client.put("/routes/a", json={"priority": 6}, headers=AUTH)).is_success
        history = (await client.get("/routes/a/history", headers=AUTH)).json()
        assert history["total"] == 1
        (entry,) = history["items"]
        assert entry["actor"] == "token:write"
        assert entry["via"] == "slo-api"
        assert entry["requestId"] == "req-1"
        assert entry["changes"] == [{"field": "priority", "from": 1, "to": 6}]
        assert entry["after"]["priority"] == 6
        assert entry["id"] == put.headers["ETag"].strip('"')
        assert (await client.get("/config/a/history", headers=AUTH)).json() == history
        ((_, name), cm) = next(iter(kube.config_maps.items()))
        assert name == "slo-history.llm.cr-1"
        assert cm["metadata"]["ownerReferences"][0]["uid"] == "uid-cr-1"


async def test_the_history_is_bounded_newest_first_and_paginated(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    async with start(kube, route_history_entries=3) as (client, _):
        for priority in range(1, 6):
            assert (
                await client.put("/routes/a", json={"priority": priority}, headers=AUTH)
            ).is_success
        history = (await client.get("/routes/a/history?pageSize=2", headers=AUTH)).json()
        assert history["total"] == 3
        assert [e["after"]["priority"] for e in history["items"]] == [5, 4]
        second = (await client.get("/routes/a/history?pageSize=2&page=2", headers=AUTH)).json()
        assert [e["after"]["priority"] for e in second["items"]] == [3]


async def test_an_unknown_route_has_no_history_and_history_ends_no_route(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    async with start(kube) as (client, _):
        missing = await client.get("/routes/nope/history", headers=AUTH)
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        assert (await client.get("/routes/a/history")).status_code == 401
        reserved = await client.get("/routes/x/history/history", headers=AUTH)
        assert reserved.status_code == 400


async def test_two_replicas_seeing_a_change_around_slo_api_record_it_once() -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=1)]})
    before = copy.deepcopy(kube.objects[(PLURAL, "ns", "cr-1")])
    after = copy.deepcopy(before)
    after["spec"]["priority"] = 4
    after["metadata"]["resourceVersion"] = "500"
    after["metadata"]["managedFields"] = _managed(
        ("kubectl-patch", "2026-01-03T00:00:00Z", ["priority"])
    )
    replicas = [History(kube, [LLM], 20), History(kube, [LLM], 20)]  # type: ignore[arg-type]
    for replica in replicas:
        replica.observe(PLURAL, lambda: before, after)
    for replica in replicas:
        await replica.close()
    cm = kube.config_maps[("ns", "slo-history.llm.cr-1")]
    entries = orjson.loads(cm["data"]["entries"])
    assert len(entries) == 1
    counted = [
        {o: r.metrics.history_entries.labels(o)._value.get() for o in ("stored", "already")}
        for r in replicas
    ]
    assert sorted(counted, key=lambda c: c["stored"]) == [
        {"stored": 0, "already": 1},
        {"stored": 1, "already": 0},
    ]
    assert entries[0]["actor"] == entries[0]["via"] == "kubectl-patch"
    assert entries[0]["time"] == "2026-01-03T00:00:00Z"
    assert entries[0]["changes"] == [{"field": "priority", "from": 1, "to": 4}]
    # Made by slo-api: left to the replica that wrote it (it knows the caller).
    mine = copy.deepcopy(after)
    mine["metadata"]["resourceVersion"] = "501"
    mine["spec"]["priority"] = 5
    mine["metadata"]["managedFields"] = _managed(("slo-api", "2026-01-04T00:00:00Z", ["priority"]))
    replicas[0].observe(PLURAL, lambda: after, mine)
    await replicas[0].close()
    target = Target.of("a", LLM, after)
    assert [e["id"] for e in await replicas[1].read(target)] == ["500"]


async def test_a_history_the_api_server_will_not_give_is_502_naming_nothing(
    start: Started,
) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    async with start(kube) as (client, _):
        forbidden = KubeError(403, "Forbidden", "configmaps is forbidden", is_status=True)
        kube.error_callback = fail(forbidden, "get_config_map")
        got = await client.get("/routes/a/history", headers=AUTH)
        assert got.status_code == 502
        assert got.json()["error"]["code"] == "upstream_error"
        assert "cr-1" not in got.text


def test_the_index_tells_updates_of_a_held_cr_only() -> None:
    index = Service.index_for([LLM])
    seen: list[tuple[int, int]] = []
    index.on_update(
        lambda plural, old, new: seen.append((old()["spec"]["priority"], new["spec"]["priority"]))
    )
    first = llm_cr("cr-1", priority=1)
    first["metadata"].update(uid="u1", resourceVersion="5")
    index.upsert(PLURAL, first)
    assert seen == []  # an add is not a change of the client's fields
    second = copy.deepcopy(first)
    second["spec"]["priority"] = 2
    second["metadata"]["resourceVersion"] = "6"
    index.upsert(PLURAL, second)
    assert seen == [(1, 2)]
    other = copy.deepcopy(second)
    other["metadata"].update(uid="u2", resourceVersion="7")
    index.upsert(PLURAL, other)  # re-created: a new CR, not an update
    assert seen == [(1, 2)]


async def test_a_reset_is_recorded_with_what_it_removed(start: Started) -> None:
    bound = {"type": "replica", "value": 4}
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=3, maximumDeployment=bound)]})
    async with start(kube) as (client, _):
        assert (await client.delete("/routes/a?dryRun=true", headers=AUTH)).is_success
        assert (await client.get("/routes/a/history", headers=AUTH)).json()["total"] == 0
        assert (await client.delete("/routes/a", headers=AUTH)).status_code == 204
        (entry,) = (await client.get("/routes/a/history", headers=AUTH)).json()["items"]
        assert entry["changes"] == [
            {"field": "priority", "from": 3, "to": 0},
            {"field": "maximumDeployment", "from": bound, "to": None},
        ]
        assert "maximumDeployment" not in entry["after"]


async def test_stream_events_name_the_caller_of_a_write_and_the_manager_of_a_change(
    start: Started,
) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=1)]})
    async with start(kube, watch_flush_seconds=0) as (client, app):
        rt = app.state.runtime
        reader = Reader(rt.feed, rt.feed.open("summary", None))
        await reader.settle()
        put = await client.put(
            "/routes/a", json={"priority": 6}, headers={**AUTH, "X-Request-Id": "req-1"}
        )
        assert put.status_code == 200
        # A change made around slo-api, as the informer stores it.
        around = copy.deepcopy(rt.index.get(PLURAL, "ns", "cr-1"))
        around["spec"]["priority"] = 4
        around["metadata"]["resourceVersion"] = "900"
        around["metadata"]["managedFields"] = _managed(
            ("kubectl-patch", "2026-01-03T00:00:00Z", ["priority"])
        )
        rt.index.upsert(PLURAL, around)
        await reader.settle()
        modified = [e for e in reader.events if e["type"] == "MODIFIED"]
        await reader.stop()
    assert [e["object"]["priority"] for e in modified][:2] == [6, 4]
    assert modified[0]["by"] == {"actor": "token:write", "via": "slo-api", "requestId": "req-1"}
    assert modified[1]["by"] == {
        "actor": "kubectl-patch",
        "via": "kubectl-patch",
        "requestId": None,
    }
    assert len(modified) == 2
    assert all("by" not in e for e in reader.events if e["type"] == "ADDED")


def test_a_writes_event_stored_before_its_result_still_names_the_caller() -> None:
    history = History(FakeKube({}), [LLM], 20)  # type: ignore[arg-type]
    before = llm_cr("cr-1", route="a", priority=1)
    after = copy.deepcopy(before)
    after["spec"]["priority"] = 2
    after["metadata"]["resourceVersion"] = "600"
    after["metadata"]["managedFields"] = _managed(("slo-api", "2026-01-04T00:00:00Z", ["priority"]))
    with history.writing(Target.of("a", LLM, before), "token:write", "rq-3"):
        history.observe(PLURAL, lambda: before, after)
    assert history.by(600) == {"actor": "token:write", "via": "slo-api", "requestId": "rq-3"}
    # Seen as another replica sees it: only the field manager.
    other = History(FakeKube({}), [LLM], 20)  # type: ignore[arg-type]
    other.observe(PLURAL, lambda: before, after)
    assert other.by(600) == {"actor": None, "via": "slo-api", "requestId": None}
