"""A relist meets the index's newer copies: a write-through answered while the list was read is
not rolled back (and `/config` and the change stream do not flap)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from slo_api.index import CRIndex, IndexedKind

Obj = dict[str, Any]
LLM = "llmslorequirements"
GROUP = "inference.modelsphere.dev"


def make_index() -> CRIndex:
    return CRIndex([IndexedKind("llm", LLM, lambda o: str(o["spec"]["serviceId"]))])


def cr(name: str, rv: str, route: str, uid: str = "") -> Obj:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": uid or f"uid-{name}",
            "resourceVersion": rv,
        },
        "spec": {"serviceId": route},
    }


def routes_of(index: CRIndex) -> dict[str, str]:
    return {o["metadata"]["name"]: o["spec"]["serviceId"] for o in index.objects(LLM)}


def test_a_relist_keeps_a_newer_write_through() -> None:
    index = make_index()
    index.replace(LLM, [cr("a", "10", "a"), cr("b", "11", "b")])
    changes: list[set[str]] = []
    index.subscribe(changes.append)
    # A PATCH answered at resourceVersion 30 while a list (as of 20) was being read.
    assert index.write_through(LLM, cr("a", "30", "a-patched"))
    index.replace(LLM, [cr("a", "20", "a-listed"), cr("b", "21", "b-listed")])
    assert routes_of(index) == {"a": "a-patched", "b": "b-listed"}
    # Nothing flapped: the patched route was not changed back.
    assert all("a-listed" not in c for c in changes)


def test_resource_versions_compare_as_integers() -> None:
    index = make_index()
    index.replace(LLM, [cr("a", "9", "a")])
    assert index.write_through(LLM, cr("a", "10", "a-patched"))
    index.replace(LLM, [cr("a", "9", "a")])  # "9" > "10" as strings, not as numbers
    assert routes_of(index) == {"a": "a-patched"}


def test_a_relist_replaces_what_it_cannot_compare_or_what_is_another_cr() -> None:
    index = make_index()
    index.replace(LLM, [cr("a", "50", "a"), cr("b", "50", "b")])
    index.replace(LLM, [cr("a", "opaque", "a-listed"), cr("b", "20", "b-new", uid="other")])
    # Not comparable: the list wins; another UID (deleted and re-created): the list wins.
    assert routes_of(index) == {"a": "a-listed", "b": "b-new"}


def test_a_relist_still_drops_what_it_does_not_list() -> None:
    index = make_index()
    index.replace(LLM, [cr("a", "10", "a")])
    index.write_through(LLM, cr("a", "30", "a-patched"))
    index.replace(LLM, [])
    assert routes_of(index) == {}


async def test_a_relist_in_turns_leaves_every_turn_consistent_and_ends_as_one_replace() -> None:
    from slo_api import index as index_module

    many = 3 * index_module.REPLACE_TURN + 5
    index = make_index()
    index.reached(LLM, GROUP, None, "1")
    index.replace(LLM, [cr(f"c{i}", "1", f"old{i % 7}") for i in range(many)], GROUP)
    told: list[set[str]] = []
    index.subscribe(told.append)
    listed = [cr(f"c{i}", "2", f"r{i:05d}") for i in range(1, many)]  # c0 vanished
    turns = 0

    async def watch() -> None:
        nonlocal turns
        source = (LLM, GROUP, "")
        while index.replacing:
            turns += 1
            # Between turns: route lists and claims agree (a page never shows a route with
            # no CR), and the relist is marked as not done yet.
            assert all(index.claims(route) for route in index.routes())
            assert index.replacing == {source: 2}
            await asyncio.sleep(0)

    index.reached(LLM, GROUP, None, "2")
    relist = asyncio.create_task(index.replace_in_turns(LLM, listed, GROUP))
    await asyncio.sleep(0)  # its first turn
    await watch()
    await relist
    assert turns >= 3
    assert index.replacing == {}
    assert index.routes() == [f"r{i:05d}" for i in range(1, many)]
    assert index.get(LLM, "ns", "c0") is None
    assert len(told) >= 4  # told turn by turn
    assert index.counts[(LLM, GROUP, "")] == many - 1


async def test_a_relist_that_changes_few_crs_is_applied_in_one_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Compared over several turns, applied in one: a reader never sees part of it.
    from slo_api import index as index_module

    monkeypatch.setattr(index_module, "DIFF_TURN", 100)
    many = 3 * index_module.REPLACE_TURN
    index = make_index()
    index.reached(LLM, GROUP, None, "1")
    index.replace(LLM, [cr(f"c{i}", "1", f"r{i:04d}") for i in range(many)], GROUP)
    told: list[set[str]] = []
    index.subscribe(told.append)
    # c0 vanished; c1..c10 moved to other routes; the rest are listed as they were.
    listed = [
        cr(f"c{i}", "2" if i <= 10 else "1", f"new{i}" if i <= 10 else f"r{i:04d}")
        for i in range(1, many)
    ]
    before = index.routes()
    seen_between: list[list[str]] = []

    async def watch() -> None:
        while index.replacing:
            seen_between.append(index.routes())
            await asyncio.sleep(0)

    index.reached(LLM, GROUP, None, "2")
    relist = asyncio.create_task(index.replace_in_turns(LLM, listed, GROUP))
    await asyncio.sleep(0)
    await watch()
    await relist
    assert len(seen_between) >= 5  # it took several turns to compare
    assert all(routes == before for routes in seen_between)
    assert len(told) == 1
    assert told[0] == {
        "r0000",
        *(f"r{i:04d}" for i in range(1, 11)),
        *(f"new{i}" for i in range(1, 11)),
    }
    assert index.get(LLM, "ns", "c0") is None
    assert sorted(index.routes()) == sorted(
        [f"new{i}" for i in range(1, 11)] + [f"r{i:04d}" for i in range(11, many)]
    )
