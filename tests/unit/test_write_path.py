"""Writes land only on the CR that claims the route when they are applied, computed from what
the API server holds, even while the index lags behind (a watch backing off, another replica)."""

from __future__ import annotations

from typing import Any

from tests.unit.conftest import AUTH, Started, llm_cr, pool_cr
from tests.unit.fakes import FakeKube

PLURAL = "llmslorequirements"


def behind_the_index(kube: FakeKube, name: str, **changes: Any) -> dict[str, Any]:
    """Change a CR in the 'API server' without a watch event (the fake's watch is idle)."""
    obj = kube.objects[(PLURAL, "ns", name)]
    kube.rv += 1
    obj["spec"].update(changes)
    obj["metadata"]["resourceVersion"] = str(kube.rv)
    return obj


async def test_a_cr_that_moved_to_another_route_is_neither_written_nor_read(
    start: Started,
) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    async with start(kube) as (client, _):
        behind_the_index(kube, "cr-1", serviceId="b")
        put = await client.put("/routes/a", json={"priority": 7}, headers=AUTH)
        assert put.status_code == 404
        assert put.json()["error"]["code"] == "not_found"
        assert kube.objects[(PLURAL, "ns", "cr-1")]["spec"]["priority"] == 0
        assert (await client.get("/routes/a", headers=AUTH)).status_code == 404
        assert (await client.delete("/routes/a", headers=AUTH)).status_code == 404


async def test_a_cr_recreated_for_another_service_is_not_written(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    async with start(kube) as (client, _):
        del kube.objects[(PLURAL, "ns", "cr-1")]
        kube.add(PLURAL, {**llm_cr("cr-1", route="b"), "metadata": {"name": "cr-1", "uid": "u2"}})
        put = await client.put("/routes/a", json={"priority": 7}, headers=AUTH)
        assert put.status_code == 404
        assert kube.objects[(PLURAL, "ns", "cr-1")]["spec"]["priority"] == 0


async def test_a_write_to_a_cr_recreated_behind_the_index_is_conditional_on_its_uid(
    start: Started,
) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    async with start(kube) as (client, _):
        del kube.objects[(PLURAL, "ns", "cr-1")]
        kube.add(PLURAL, {**llm_cr("cr-1", route="a"), "metadata": {"name": "cr-1", "uid": "u2"}})
        put = await client.put("/routes/a", json={"priority": 7}, headers=AUTH)
        assert put.status_code == 200
        assert put.json()["priority"] == 7
        assert kube.objects[(PLURAL, "ns", "cr-1")]["spec"]["priority"] == 7
        # The write that landed was conditional on the new CR's uid.
        assert kube.patches[-1][1]["metadata"]["uid"] == "u2"


async def test_every_write_is_conditional_on_the_uid_and_version_it_was_computed_from(
    start: Started,
) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    async with start(kube) as (client, _):
        stored = dict(kube.objects[(PLURAL, "ns", "cr-1")]["metadata"])
        assert (await client.put("/routes/a", json={"priority": 7}, headers=AUTH)).is_success
        assert kube.patches[-1][1]["metadata"] == {
            "uid": stored["uid"],
            "resourceVersion": stored["resourceVersion"],
        }


async def test_a_section_replaces_ranges_the_index_has_not_seen(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    ranges = [{"contextLengthRangeLow": 0, "metrics": [{"type": "p90", "threshold": 1}]}]
    async with start(kube) as (client, _):
        # Another replica added ranges; this replica's index has not seen them.
        behind_the_index(
            kube,
            "cr-1",
            ttft={"default": {"metrics": [{"type": "p90", "threshold": 2}]}, "ranges": ranges},
        )
        section = {"default": {"metrics": [{"type": "p50", "threshold": 0.5}]}}
        put = await client.put("/routes/a", json={"ttft": section}, headers=AUTH)
        assert put.status_code == 200
        assert kube.objects[(PLURAL, "ns", "cr-1")]["spec"]["ttft"] == section
        assert "ranges" not in put.json()["ttft"]


async def test_high_priority_false_reads_the_stored_tier_not_the_index(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a", priority=10)]})
    async with start(kube) as (client, _):
        behind_the_index(kube, "cr-1", priority=4)
        put = await client.put("/routes/a", json={"highPriority": False}, headers=AUTH)
        assert put.status_code == 200
        assert kube.objects[(PLURAL, "ns", "cr-1")]["spec"]["priority"] == 4


async def test_if_match_against_a_lagging_index(start: Started) -> None:
    kube = FakeKube({PLURAL: [llm_cr("cr-1", route="a")]})
    async with start(kube) as (client, _):
        old = (await client.get("/routes/a", headers=AUTH)).headers["etag"]
        behind_the_index(kube, "cr-1", priority=3)
        # The client read fresh (newer than the index): its ETag is current, the write lands.
        fresh = (await client.get("/routes/a", headers=AUTH)).headers["etag"]
        ok = await client.put(
            "/routes/a", json={"priority": 5}, headers={**AUTH, "If-Match": fresh}
        )
        assert ok.status_code == 200
        stale = await client.put(
            "/routes/a", json={"priority": 6}, headers={**AUTH, "If-Match": old}
        )
        assert stale.status_code == 412
        assert kube.objects[(PLURAL, "ns", "cr-1")]["spec"]["priority"] == 5


async def test_a_pool_default_is_checked_against_the_members_held_now(start: Started) -> None:
    kube = FakeKube({"modelpools": [pool_cr("p", ["a", "b"])]})
    async with start(kube) as (client, _):
        obj = kube.objects[("modelpools", "ns", "p")]
        obj["spec"]["members"] = [{"inferenceServiceRef": {"name": "a"}}]
        kube.rv += 1
        obj["metadata"]["resourceVersion"] = str(kube.rv)
        put = await client.put("/routes/p", json={"pool": {"default": "b"}}, headers=AUTH)
        assert put.status_code == 400
        assert put.json()["error"]["field"] == "pool.default"
