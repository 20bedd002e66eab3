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


@pytest.mark.parametrize("odd", ["¹²", "\u0661\u0662", "012", "0"])
def test_a_listed_version_that_does_not_compare_replaces_the_held_copy(odd: str) -> None:
    index = make_index()
    index.replace(LLM, [cr("a", "50", "a")])
    assert index.write_through(LLM, cr("a", "60", "a-patched"))
    # Not read as 12 (older than the write) nor refused: the list, newer by arrival, wins.
    index.replace(LLM, [cr("a", odd, "a-listed")])
    assert routes_of(index) == {"a": "a-listed"}


def test_a_relist_still_drops_what_it_does_not_list() -> None:
    index = make_index()
    index.replace(LLM, [cr("a", "10", "a")])
    index.write_through(LLM, cr("a", "30", "a-patched"))
    index.replace(LLM, [])
    assert routes_of(index) == {}


JOB = "jobslorequirements"


def two_kinds() -> CRIndex:
    route = lambda o: str(o["spec"]["serviceId"])  # noqa: E731
    return CRIndex([IndexedKind("llm", LLM, route), IndexedKind("job", JOB, route)])


async def during(relist: asyncio.Task[None], index: CRIndex, each_turn: Any) -> int:
    """Call `each_turn()` between the turns of a relist being applied; how many turns."""
    turns = 0
    await asyncio.sleep(0)  # its first turn
    while index.replacing:
        turns += 1
        each_turn()
        await asyncio.sleep(0)
    await relist
    return turns


async def test_a_large_relist_is_seen_as_it_was_until_it_is_applied_at_once() -> None:
    from slo_api import index as index_module

    many = 3 * index_module.REPLACE_TURN + 5
    index = make_index()
    index.reached(LLM, GROUP, None, "1")
    index.replace(LLM, [cr(f"c{i}", "1", f"old{i % 7}") for i in range(many)], GROUP)
    told: list[set[str]] = []
    index.subscribe(told.append)
    listed = [cr(f"c{i}", "2", f"r{i:05d}") for i in range(1, many)]  # c0 vanished
    before = index.routes()
    source = (LLM, GROUP, "")

    def as_it_was() -> None:
        # Not a part of it: every route and CR as before the relist, which is not done yet.
        assert index.routes() == before
        assert routes_of(index)["c1"] == "old1"
        assert index.get(LLM, "ns", "c0") is not None
        assert index.replacing == {source: 2}

    index.reached(LLM, GROUP, None, "2")
    turns = await during(
        asyncio.create_task(index.replace_in_turns(LLM, listed, GROUP)), index, as_it_was
    )
    assert turns >= 3
    assert index.replacing == {}
    assert index.routes() == [f"r{i:05d}" for i in range(1, many)]
    assert all(index.claims(route) for route in index.routes())
    assert index.get(LLM, "ns", "c0") is None
    assert told == [{f"old{i}" for i in range(7)} | set(index.routes())]  # told once, of all
    assert index.counts[(LLM, GROUP, "")] == many - 1


async def test_what_changes_while_a_large_relist_is_applied_is_kept() -> None:
    from slo_api import index as index_module

    many = 2 * index_module.REPLACE_TURN
    index = two_kinds()
    index.reached(LLM, GROUP, None, "10")
    index.replace(LLM, [cr(f"c{i}", "10", f"r{i}") for i in range(many)], GROUP)
    index.replace(JOB, [cr("j", "10", "job-route")], GROUP)
    assert index.rendered("v", "job-route", lambda route: "job-before") == "job-before"
    rendered: list[str] = []
    index.subscribe(lambda routes: rendered.extend(sorted(routes)))
    index.reached(LLM, GROUP, None, "20")
    listed = [cr(f"c{i}", "20", f"new{i}") for i in range(many) if i != 2]
    done: list[str] = []

    def meanwhile() -> None:
        if done:
            return
        done.append("once")
        # Another kind's event, a PATCH answered after the list's version (kept), and one
        # answered before it, of a CR the list no longer has (not brought back).
        assert index.upsert(JOB, cr("j", "30", "job-moved"))
        assert index.write_through(LLM, cr("c1", "25", "patched"))
        assert index.write_through(LLM, cr("c2", "15", "ghost"))
        assert routes_of(index)["c1"] == "patched"  # seen at once, as ever
        # A render cached now, of the state before the swap, is not served after it.
        assert index.rendered("v", "r3", lambda route: f"{route}-before") == "r3-before"

    relist = asyncio.create_task(index.replace_in_turns(LLM, listed, GROUP))
    assert await during(relist, index, meanwhile) >= 2
    assert done
    assert index.routes("job") == ["job-moved"]
    # Cached before the relist, dropped by the event made on the copy too: not served stale.
    assert index.rendered("v", "job-route", lambda route: "job-after") == "job-after"
    assert routes_of(index)["c1"] == "patched"
    assert index.get(LLM, "ns", "c2") is None
    assert routes_of(index)["c3"] == "new3"
    assert index.rendered("v", "r3", lambda route: f"{route}-after") == "r3-after"
    assert index.counts[(LLM, GROUP, "")] == many - 1
    assert "new3" in rendered
    assert "job-moved" in rendered


async def test_two_large_relists_at_once_are_both_applied_and_a_cancelled_one_not_at_all() -> None:
    from slo_api import index as index_module

    many = 2 * index_module.REPLACE_TURN
    index = two_kinds()
    for plural in (LLM, JOB):
        index.reached(plural, GROUP, None, "1")
        index.replace(plural, [cr(f"{plural}{i}", "1", f"{plural}-{i}") for i in range(many)])
        index.reached(plural, GROUP, None, "2")
    llm = [cr(f"{LLM}{i}", "2", f"llm-new-{i}") for i in range(many)]
    job = [cr(f"{JOB}{i}", "2", f"job-new-{i}") for i in range(many)]
    await asyncio.gather(
        index.replace_in_turns(LLM, llm, GROUP), index.replace_in_turns(JOB, job, GROUP)
    )
    assert index.routes("llm") == sorted(f"llm-new-{i}" for i in range(many))
    assert index.routes("job") == sorted(f"job-new-{i}" for i in range(many))

    before = index.routes()
    relist = asyncio.create_task(
        index.replace_in_turns(LLM, [cr(f"{LLM}{i}", "3", f"x{i}") for i in range(many)], GROUP)
    )
    await asyncio.sleep(0)  # its first turn
    assert index.replacing
    relist.cancel()
    with pytest.raises(asyncio.CancelledError):
        await relist
    assert index.routes() == before
    assert index.replacing == {}
    await index.replace_in_turns(LLM, [cr(f"{LLM}{i}", "3", f"y{i}") for i in range(many)], GROUP)
    assert index.routes("llm") == sorted(f"y{i}" for i in range(many))


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


async def test_a_refresh_while_a_large_relist_is_applied_is_not_lost_in_the_swap() -> None:
    from slo_api import index as index_module

    many = 2 * index_module.REPLACE_TURN
    index = two_kinds()
    index.replace(LLM, [cr(f"c{i}", "10", f"r{i}") for i in range(many)], GROUP)
    index.replace(JOB, [cr("j", "10", "job-route")], GROUP)
    assert index.rendered("v", "job-route", lambda route: "limits-before") == "limits-before"
    told: list[str] = []
    index.subscribe(lambda routes: told.extend(routes))
    listed = [cr(f"c{i}", "20", f"r{i}") for i in range(many)]

    def meanwhile() -> None:
        if not told:
            # The namespace's limits change while the copy is built aside.
            index.refresh({"ns"})

    relist = asyncio.create_task(index.replace_in_turns(LLM, listed, GROUP))
    assert await during(relist, index, meanwhile) >= 2
    assert "job-route" in told
    # The copy swapped in does not serve the render from before the refresh.
    assert index.rendered("v", "job-route", lambda route: "limits-after") == "limits-after"
