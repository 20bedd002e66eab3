"""The read caches: per-route rendered values in the index and built /config pages.

Every way a CR enters or leaves the index (upsert, write-through, delete, relist, clear) must
drop what was rendered from it, or /config would serve stale lines; and every change a page
may show must move the change log the pages are kept by.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_api.feed.history import ChangeLog
from slo_api.index import CRIndex
from slo_api.kinds import build_kinds
from slo_api.service import Service
from slo_api.settings import Settings
from slo_api.visible import VisiblePages

Obj = dict[str, Any]
LLM, JOB, POOL = "llmslorequirements", "jobslorequirements", "modelpools"


def make_service() -> Service:
    kinds = build_kinds(Settings(slo_api_token="unit-write-token"))
    return Service(None, kinds, Service.index_for(kinds))  # type: ignore[arg-type]


class Reader:
    """What serves GET /config: the service, and pages kept by the change log (as wired in
    the runtime, the log following the summary view from the start)."""

    def __init__(self) -> None:
        self.service = make_service()
        self.index = self.service.index
        self.log = ChangeLog(self.service, 1 << 20)
        self.log.follow("summary")
        self.pages = VisiblePages(self.service, self.index, self.log)

    def page(self, page: int, size: int, kind: str | None, full: bool = False) -> tuple[bytes, str]:
        return self.pages.page(None, page, size, kind, full)


def cr(ns: str, name: str, route: str, *, rv: int = 1, uid: str | None = None, **spec: Any) -> Obj:
    return {
        "metadata": {
            "namespace": ns,
            "name": name,
            "uid": uid or f"uid-{ns}-{name}",
            "resourceVersion": str(rv),
        },
        "spec": {"serviceId": route, "priority": 0, **spec},
    }


def pool(ns: str, name: str, members: list[str], *, rv: int = 1, phase: str = "Ready") -> Obj:
    return {
        "metadata": {
            "namespace": ns,
            "name": name,
            "uid": f"uid-{ns}-{name}",
            "resourceVersion": str(rv),
        },
        "spec": {"members": [{"inferenceServiceRef": {"name": m}} for m in members]},
        "status": {"phase": phase, "residentMember": members[0] if members else None},
    }


class Counting:
    """A render function that counts its calls and says what the index holds now."""

    def __init__(self, index: CRIndex) -> None:
        self.index = index
        self.calls = 0

    def __call__(self, route: str) -> Any:
        self.calls += 1
        return [(p, o["metadata"]["resourceVersion"]) for p, o in self.index.claims(route)]


def test_a_rendered_value_is_computed_once_while_nothing_changes() -> None:
    index = make_service().index
    index.upsert(LLM, cr("ns", "a", "a"))
    render = Counting(index)
    first = index.rendered("v", "a", render)
    assert index.rendered("v", "a", render) is first
    assert render.calls == 1


def test_every_store_and_removal_forgets_the_route() -> None:
    index = make_service().index
    render = Counting(index)

    def fresh(route: str) -> Any:
        before = render.calls
        value = index.rendered("v", route, render)
        assert render.calls == before + 1, "expected a re-render"
        return value

    index.upsert(LLM, cr("ns", "a", "a", rv=1))
    assert fresh("a") == [(LLM, "1")]
    index.upsert(LLM, cr("ns", "a", "a", rv=2))  # a watch MODIFIED
    assert fresh("a") == [(LLM, "2")]
    index.write_through(LLM, cr("ns", "a", "a", rv=3))  # a write's answer
    assert fresh("a") == [(LLM, "3")]
    index.upsert(JOB, cr("ns", "j", "a", rv=4))  # a second claimant: ambiguous
    assert fresh("a") == [(JOB, "4"), (LLM, "3")]
    index.delete(JOB, cr("ns", "j", "a"))
    assert fresh("a") == [(LLM, "3")]
    index.replace(LLM, [cr("ns", "a", "a", rv=5)])  # a relist that changed it
    assert fresh("a") == [(LLM, "5")]
    index.replace(LLM, [])  # a relist where it vanished
    assert fresh("a") == []
    index.upsert(LLM, cr("ns", "a", "a", rv=6))
    assert fresh("a") == [(LLM, "6")]
    index.clear(LLM)  # the CRD went away
    assert fresh("a") == []


def test_an_ignored_event_keeps_the_rendered_value() -> None:
    index = make_service().index
    index.upsert(LLM, cr("ns", "a", "a", rv=5))
    render = Counting(index)
    index.rendered("v", "a", render)
    index.upsert(LLM, cr("ns", "a", "a", rv=4))  # older: not stored
    index.write_through(LLM, cr("ns", "gone", "a", rv=9))  # not in the index: not stored
    index.rendered("v", "a", render)
    assert render.calls == 1


def test_a_service_id_change_forgets_both_routes() -> None:
    index = make_service().index
    index.upsert(LLM, cr("ns", "svc", "old", rv=1))
    render = Counting(index)
    assert index.rendered("v", "old", render) == [(LLM, "1")]
    assert index.rendered("v", "new", render) == []
    index.upsert(LLM, cr("ns", "svc", "new", rv=2))
    assert index.rendered("v", "old", render) == []
    assert index.rendered("v", "new", render) == [(LLM, "2")]


def test_pool_changes_forget_the_member_routes() -> None:
    service = make_service()
    index = service.index
    index.upsert(LLM, cr("ns", "chat", "chat"))
    seen = []

    def render(route: str) -> Any:
        seen.append(route)
        return service.pool_of("ns", route)

    assert index.rendered("full", "chat", render) is None
    index.upsert(POOL, pool("ns", "slot", ["chat"], rv=2))  # now a member
    assert index.rendered("full", "chat", render) == {
        "route": "slot",
        "resident": True,
        "phase": "Ready",
    }
    index.upsert(POOL, pool("ns", "slot", ["chat"], rv=3, phase="Swapping"))  # status moved
    assert index.rendered("full", "chat", render)["phase"] == "Swapping"
    index.upsert(POOL, pool("ns", "slot", ["other"], rv=4))  # no longer a member
    assert index.rendered("full", "chat", render) is None
    assert seen == ["chat"] * 4


def old_page(reader: Reader, page: int, size: int, kind: str | None, full: bool) -> bytes:
    """What GET /config sent before the caches: the reference the cached bytes must equal."""
    service = reader.service
    routes = service.index.routes(kind)
    start = (page - 1) * size
    render = service.full if full else service.summary
    items = [render(r) for r in routes[start : start + size]]
    return orjson.dumps({"items": items, "total": len(routes), "page": page, "pageSize": size})


def filled() -> Reader:
    service = Reader()
    index = service.index
    for n in range(30):
        index.upsert(LLM, cr("ns", f"l{n}", f"r{n:02d}", priority=n % 11))
    index.upsert(JOB, cr("ns", "j", "r05", queue={"maxDepth": 1, "promql": "up"}))  # ambiguous
    index.upsert(JOB, cr("ns", "j2", "jobonly", queue={"maxDepth": 2, "promql": "up"}))
    index.upsert(POOL, pool("ns", "slot", ["r01", "r02"]))
    return service


def test_pages_are_byte_for_byte_what_orjson_made_of_the_old_lists() -> None:
    service = filled()
    for kind in (None, "llm", "job", "pool"):
        for full in (False, True):
            for page, size in ((1, 7), (2, 7), (5, 7), (1, 200), (99, 10)):
                body, etag = service.page(page, size, kind, full)
                assert body == old_page(service, page, size, kind, full)
                assert etag == 'W/"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


def test_a_built_page_is_reused_until_the_index_changes() -> None:
    service = filled()
    first = service.page(1, 10, None)
    assert service.page(1, 10, None) is first
    service.index.upsert(LLM, cr("ns", "l0", "r00", rv=2, priority=10))
    second = service.page(1, 10, None)
    assert second is not first
    assert second[0] == old_page(service, 1, 10, None, False)
    assert b'"priority":10' in second[0]


def test_a_relist_of_many_keeps_the_route_lists_sorted() -> None:
    service = filled()
    index = service.index
    fresh = [cr("ns", f"m{n}", f"z{(n * 7919) % 500:03d}") for n in range(500)]
    index.replace(LLM, fresh)
    expected_llm = sorted({o["spec"]["serviceId"] for o in fresh})
    assert index.routes("llm") == expected_llm
    assert index.routes("job") == ["jobonly", "r05"]
    assert index.routes() == sorted({*expected_llm, "jobonly", "r05", "slot"})
    index.replace(LLM, fresh[:3])
    assert index.routes("llm") == sorted(o["spec"]["serviceId"] for o in fresh[:3])
    assert service.page(1, 200, None)[0] == old_page(service, 1, 200, None, False)


operation = st.one_of(
    st.tuples(
        st.just("upsert"),
        st.sampled_from([LLM, JOB]),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["r1", "r2", "p1"]),
        st.integers(0, 10),
    ),
    st.tuples(st.just("delete"), st.sampled_from([LLM, JOB]), st.sampled_from(["a", "b", "c"])),
    st.tuples(
        st.just("pool"),
        st.sampled_from(["p1", "p2"]),
        st.lists(st.sampled_from(["r1", "r2"]), max_size=2, unique=True),
        st.sampled_from(["Ready", "Swapping"]),
    ),
    st.tuples(
        st.just("replace"),
        st.sampled_from([LLM, JOB]),
        st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["r1", "r3"])), max_size=2),
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=20))
def test_cached_pages_always_equal_freshly_built_ones(ops: list[tuple[Any, ...]]) -> None:
    service = Reader()
    index = service.index
    for rv, op in enumerate(ops, 1):
        if op[0] == "upsert":
            _, plural, name, route, priority = op
            index.upsert(plural, cr("ns", name, route, rv=rv, priority=priority))
        elif op[0] == "delete":
            index.delete(op[1], cr("ns", op[2], ""))
        elif op[0] == "pool":
            _, name, members, phase = op
            index.upsert(POOL, pool("ns", name, members, rv=rv, phase=phase))
        else:
            _, plural, items = op
            index.replace(plural, [cr("ns", n, r, rv=rv) for n, r in dict(items).items()])
        for full in (False, True):
            for kind in (None, "llm"):
                assert service.page(1, 200, kind, full)[0] == old_page(service, 1, 200, kind, full)


def test_cached_lines_hold_only_their_own_bytes() -> None:
    """Every route's /config lines stay cached; each must cost about its length, not the
    encoder's working buffer (orjson's output keeps a 4 KiB allocation)."""
    import tracemalloc

    svc = Reader()
    routes = 2000
    for i in range(routes):
        svc.index.upsert(LLM, cr("ns", f"cr-{i}", f"route-{i:05d}"))
    tracemalloc.start()
    try:
        svc.page(1, 200, None)
        for page in range(1, routes // 200 + 1):
            svc.page(page, 200, None)
            svc.page(page, 200, None, full=True)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    line = len(svc.service._summary_json("route-00001")) + len(
        svc.service._full_json("route-00001")
    )
    # Two lines per route plus the built pages and their cache entries.
    assert held < routes * (3 * line + 400), (held, line)
