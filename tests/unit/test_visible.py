"""The /config pages kept by the change log: built once per change, never stale."""

from __future__ import annotations

from typing import Any

import orjson

from slo_api.feed.history import ChangeLog
from slo_api.visible import VisiblePages
from tests.unit.test_index_cache import JOB, LLM, cr, make_service, pool

NEW, OLD = "inference.modelsphere.dev", "inference.x-k8s.io"
Obj = dict[str, Any]


def make_pages() -> tuple[VisiblePages, ChangeLog]:
    service = make_service()
    log = ChangeLog(service, 1 << 20)
    log.follow("summary")
    return VisiblePages(service, service.index, log), log


def test_a_page_is_rebuilt_only_when_the_change_log_moves() -> None:
    pages, log = make_pages()
    index = pages.index
    index.upsert(LLM, cr("ns", "a", "a"))
    first = pages.page(None, 1, 10, None, False)
    assert pages.page(None, 1, 10, None, False) is first
    seq = log.seq
    index.upsert(LLM, cr("ns", "a", "a", rv=2))  # a new version, the same /config item
    assert log.seq == seq
    assert pages.page(None, 1, 10, None, False) is first
    index.upsert(LLM, cr("ns", "a", "a", rv=3, priority=10))
    assert log.seq > seq
    second = pages.page(None, 1, 10, None, False)
    assert second[1] != first[1]
    assert b'"priority":10' in second[0]


def test_a_change_only_the_full_view_shows_moves_its_pages() -> None:
    # The log follows the full view from its first page on: a pool's phase is in a member's
    # full item only, and its change must reach a full page kept from before it.
    pages, _ = make_pages()
    index = pages.index
    index.upsert(LLM, cr("ns", "chat", "chat"))
    index.upsert("modelpools", pool("ns", "slot", ["chat"], phase="Ready"))
    before = pages.page(None, 1, 10, "llm", True)
    summary = pages.page(None, 1, 10, "llm", False)
    index.upsert("modelpools", pool("ns", "slot", ["chat"], rv=2, phase="Swapping"))
    assert pages.page(None, 1, 10, "llm", False)[1] == summary[1]  # same content, same ETag
    after = pages.page(None, 1, 10, "llm", True)
    assert after[1] != before[1]
    assert b'"phase":"Swapping"' in after[0]


def test_a_copy_moving_to_another_api_group_moves_what_access_is_asked_about() -> None:
    # The same bytes in every view, but the caller's `list` is now asked of the other group.
    pages, log = make_pages()
    index = pages.index
    old = {**cr("ns", "chat", "chat"), "apiVersion": f"{OLD}/v1alpha1"}
    index.upsert(LLM, old)
    assert pages.held()["llm"] == {"ns": frozenset({OLD})}
    seq = log.seq
    new = {**cr("ns", "chat", "chat"), "apiVersion": f"{NEW}/v1alpha1"}
    new["metadata"] = {**new["metadata"], "uid": "uid-new"}
    index.upsert(LLM, new)
    assert log.seq > seq
    assert pages.held()["llm"] == {"ns": frozenset({NEW})}


def new_cr(ns: str, name: str, route: str, **kw: Any) -> Obj:
    return {**cr(ns, name, route, **kw), "apiVersion": f"{NEW}/v1alpha1"}


async def test_what_access_is_asked_about_follows_namespaces_that_gain_or_lose_their_crs() -> None:
    from slo_api import index as index_module

    pages, log = make_pages()
    index = pages.index
    index.upsert(LLM, new_cr("a", "one", "one"))
    held = pages.held()
    assert held["llm"] == {"a": frozenset({NEW})}
    # More CRs where there are some already, and changes to them: a read finds the same
    # namespaces it did, without looking at every CR again.
    seq = log.seq
    index.upsert(LLM, new_cr("a", "two", "two"))
    index.upsert(LLM, new_cr("a", "one", "one", rv=2, priority=5))
    assert log.seq > seq
    assert pages.held() is held
    index.upsert(LLM, new_cr("b", "three", "three"))
    assert pages.held()["llm"] == {"a": frozenset({NEW}), "b": frozenset({NEW})}
    index.delete(LLM, new_cr("a", "one", "one"))
    assert set(pages.held()["llm"]) == {"a", "b"}
    index.delete(LLM, new_cr("a", "two", "two"))
    assert pages.held()["llm"] == {"b": frozenset({NEW})}
    assert pages.held()["job"] == {}
    # A relist large enough to be applied to a copy built aside, moving every CR to "c".
    many = index_module.REPLACE_TURN + 1
    listed = [new_cr("c", f"n{i}", f"r{i}", rv=3) for i in range(many)]
    await index.replace_in_turns(LLM, listed, NEW)
    assert pages.held()["llm"] == {"c": frozenset({NEW})}
    index.delete(LLM, listed[0])
    assert pages.held()["llm"] == {"c": frozenset({NEW})}


def test_a_scoped_callers_routes_stay_what_its_namespaces_hold_through_every_change() -> None:
    import random

    from slo_api import visible

    pages, _ = make_pages()
    index = pages.index
    rng = random.Random(7)
    spaces, routes = ["a", "b", "c"], [f"r{i}" for i in range(12)]
    callers = [
        frozenset({("llm", "a", NEW)}),
        frozenset({("llm", "b", NEW), ("job", "c", NEW)}),
    ]

    def expected(allowed: frozenset[tuple[str, str, str]], kind: str | None) -> list[str]:
        # From the claims as they are now: a route shows where one of its CRs may be listed.
        out = []
        for route in index.routes(kind):
            claims = [("llm" if p == LLM else "job", ns, g) for p, ns, g in index.claimed_in(route)]
            if any(place in allowed for place in claims):
                out.append(route)
        return out

    rebuilt, kept = 0, None
    for step in range(300):
        plural = rng.choice([LLM, JOB])
        obj = new_cr(rng.choice(spaces), f"n{rng.randrange(15)}", rng.choice(routes), rv=step + 2)
        if plural == JOB:
            obj["spec"]["queue"] = {"maxDepth": 1, "promql": "up"}
        if rng.random() < 0.3:
            index.delete(plural, obj)
        else:
            index.upsert(plural, obj)
        if step == 150:  # a change touching more than the kept lists take in place
            visible.MOVES, saved = 0, visible.MOVES
            index.upsert(LLM, new_cr("a", "extra", "r0", rv=10_000))
            visible.MOVES = saved
        for allowed in callers:
            for kind in (None, "llm", "job"):
                body = pages.page(allowed, 1, 100, kind, False)[0]
                shown = [item["route"] for item in orjson.loads(body)["items"]]
                assert shown == expected(allowed, kind), (step, allowed, kind)
        now = pages._visible(callers[0], None)
        rebuilt += now is not kept
        kept = now
    # Kept and brought up to date by each change, built again only after the large one.
    assert rebuilt == 2
