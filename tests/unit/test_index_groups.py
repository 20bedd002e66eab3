"""CRIndex across API groups: one visible copy per CR, from the most preferred group present.

During a migration a CR can exist under the new group and the old one with the same namespace
and name. The index shows the preferred copy; the other is a leftover: never listed, never a
claim (so never a 409), counted per group.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from slo_api.index import CRIndex, IndexedKind, group_of

Obj = dict[str, Any]
LLM, JOB, POOL = "llmslorequirements", "jobslorequirements", "modelpools"
NEW, OLD = "inference.modelsphere.dev", "inference.x-k8s.io"


def service_id(obj: Obj) -> str:
    value = obj.get("spec", {}).get("serviceId")
    return value if isinstance(value, str) else ""


def pool_members(obj: Obj) -> list[str]:
    return [str(m) for m in obj.get("spec", {}).get("members", [])]


def make_index() -> CRIndex:
    return CRIndex(
        [
            IndexedKind("llm", LLM, service_id, groups=(NEW, OLD)),
            IndexedKind("job", JOB, service_id, groups=(NEW, OLD)),
            IndexedKind(
                "pool", POOL, lambda o: str(o["metadata"]["name"]), pool_members, groups=(NEW, OLD)
            ),
        ]
    )


def cr(group: str, ns: str, name: str, route: str = "", *, rv: int = 1, **spec: Any) -> Obj:
    if route:
        spec["serviceId"] = route
    return {
        "apiVersion": f"{group}/v1alpha1",
        "metadata": {
            "namespace": ns,
            "name": name,
            # A copy is a different object in the API server: its own UID.
            "uid": f"uid-{group}-{ns}-{name}",
            "resourceVersion": str(rv),
        },
        "spec": spec,
    }


def shown(index: CRIndex, route: str) -> list[tuple[str, str]]:
    """(group, name) of each CR claiming the route."""
    return [(group_of(obj), obj["metadata"]["name"]) for _, obj in index.claims(route)]


def test_group_of_reads_the_api_version() -> None:
    assert group_of({"apiVersion": f"{NEW}/v1alpha1"}) == NEW
    assert group_of({"apiVersion": "v1"}) == ""
    assert group_of({}) == ""


def test_a_cr_under_both_groups_is_one_route_shown_from_the_preferred_group() -> None:
    index = make_index()
    index.upsert(LLM, cr(OLD, "ns", "svc", "chat", priority=3), OLD)
    index.upsert(LLM, cr(NEW, "ns", "svc", "chat", priority=7), NEW)
    assert shown(index, "chat") == [(NEW, "svc")]
    assert index.routes() == ["chat"]
    assert index.routes("llm") == ["chat"]
    assert index.count(LLM) == 1
    assert index.leftovers(LLM) == {OLD: 1}
    got = index.get(LLM, "ns", "svc")
    assert got is not None
    assert got["spec"]["priority"] == 7
    assert got["apiVersion"] == f"{NEW}/v1alpha1"


def test_the_order_of_arrival_does_not_matter() -> None:
    index = make_index()
    index.upsert(LLM, cr(NEW, "ns", "svc", "chat"), NEW)
    index.upsert(LLM, cr(OLD, "ns", "svc", "chat"), OLD)
    assert shown(index, "chat") == [(NEW, "svc")]
    assert index.leftovers(LLM) == {OLD: 1}


def test_a_cr_only_under_the_old_group_is_shown_from_it() -> None:
    index = make_index()
    index.upsert(LLM, cr(OLD, "ns", "legacy", "legacy"), OLD)
    assert shown(index, "legacy") == [(OLD, "legacy")]
    assert index.leftovers(LLM) == {}


def test_deleting_the_preferred_copy_shows_the_leftover_and_back() -> None:
    index = make_index()
    index.upsert(LLM, cr(OLD, "ns", "svc", "chat"), OLD)
    index.upsert(LLM, cr(NEW, "ns", "svc", "chat"), NEW)
    assert index.delete(LLM, cr(NEW, "ns", "svc"), NEW)
    assert shown(index, "chat") == [(OLD, "svc")]
    assert index.leftovers(LLM) == {}
    index.upsert(LLM, cr(NEW, "ns", "svc", "chat"), NEW)
    assert shown(index, "chat") == [(NEW, "svc")]
    # And the other way round: the leftover going leaves the preferred copy alone.
    assert index.delete(LLM, cr(OLD, "ns", "svc"), OLD)
    assert shown(index, "chat") == [(NEW, "svc")]
    assert index.leftovers(LLM) == {}


def test_a_delete_names_the_group_of_the_copy() -> None:
    index = make_index()
    index.upsert(LLM, cr(OLD, "ns", "svc", "chat"), OLD)
    # The old copy's UID sent as a delete under the new group removes nothing.
    assert not index.delete(LLM, cr(OLD, "ns", "svc"), NEW)
    assert shown(index, "chat") == [(OLD, "svc")]


def test_a_leftover_with_another_route_claims_nothing() -> None:
    index = make_index()
    index.upsert(LLM, cr(NEW, "ns", "svc", "renamed"), NEW)
    index.upsert(LLM, cr(OLD, "ns", "svc", "original"), OLD)
    assert index.claims("original") == []
    assert index.routes() == ["renamed"]
    index.delete(LLM, cr(NEW, "ns", "svc"), NEW)
    assert index.routes() == ["original"]
    assert shown(index, "original") == [(OLD, "svc")]


def test_two_different_crs_claiming_a_route_conflict_whatever_their_groups() -> None:
    index = make_index()
    index.upsert(LLM, cr(NEW, "ns", "a", "chat"), NEW)
    index.upsert(LLM, cr(OLD, "ns", "b", "chat"), OLD)
    index.upsert(LLM, cr(OLD, "other", "a", "chat"), OLD)  # same name, another namespace
    assert sorted(shown(index, "chat")) == [(NEW, "a"), (OLD, "a"), (OLD, "b")]
    assert index.leftovers(LLM) == {}


def test_a_relist_of_one_group_leaves_the_other_group_alone() -> None:
    index = make_index()
    index.upsert(LLM, cr(NEW, "ns", "both", "both"), NEW)
    index.upsert(LLM, cr(OLD, "ns", "both", "both"), OLD)
    index.upsert(LLM, cr(OLD, "ns", "old-only", "old-only"), OLD)
    index.replace(LLM, [cr(OLD, "ns", "both", "both", rv=2)], OLD)
    assert index.routes() == ["both"]
    assert shown(index, "both") == [(NEW, "both")]
    assert index.leftovers(LLM) == {OLD: 1}
    # The preferred group vanishing (its CRD deleted) reveals the old copies.
    index.clear(LLM, NEW)
    assert shown(index, "both") == [(OLD, "both")]
    got = index.get(LLM, "ns", "both")
    assert got is not None
    assert got["metadata"]["resourceVersion"] == "2"
    index.clear(LLM, OLD)
    assert index.routes() == []
    assert index.count(LLM) == 0


def test_write_through_updates_the_copy_of_the_written_group() -> None:
    index = make_index()
    index.upsert(LLM, cr(NEW, "ns", "svc", "chat", rv=1, priority=0), NEW)
    index.upsert(LLM, cr(OLD, "ns", "svc", "chat", rv=1, priority=0), OLD)
    # A write answered from the old group changes the leftover, not what is shown.
    assert index.write_through(LLM, cr(OLD, "ns", "svc", "chat", rv=5, priority=9))
    got = index.get(LLM, "ns", "svc")
    assert got is not None
    assert got["spec"]["priority"] == 0
    assert index.write_through(LLM, cr(NEW, "ns", "svc", "chat", rv=6, priority=4))
    got = index.get(LLM, "ns", "svc")
    assert got is not None
    assert got["spec"]["priority"] == 4
    # An older event for one group's copy is ignored like any other.
    assert not index.upsert(LLM, cr(NEW, "ns", "svc", "chat", rv=2, priority=1), NEW)


def test_rendered_values_follow_the_copy_shown_and_ignore_leftovers() -> None:
    index = make_index()
    calls: list[str] = []

    def render(route: str) -> Any:
        calls.append(route)
        return [group_of(o) for _, o in index.claims(route)]

    index.upsert(LLM, cr(OLD, "ns", "svc", "chat"), OLD)
    assert index.rendered("v", "chat", render) == [OLD]
    index.upsert(LLM, cr(NEW, "ns", "svc", "chat"), NEW)
    assert index.rendered("v", "chat", render) == [NEW]
    told: list[set[str]] = []
    index.subscribe(told.append)
    index.upsert(LLM, cr(OLD, "ns", "svc", "chat", rv=2), OLD)  # a change to the leftover
    assert index.rendered("v", "chat", render) == [NEW]
    assert calls == ["chat", "chat"]
    assert told == []  # the change log hears nothing: /config pages stay cached too
    index.clear(LLM, NEW)
    assert index.rendered("v", "chat", render) == [OLD]


def test_pool_members_come_from_the_pool_shown() -> None:
    index = make_index()
    index.upsert(POOL, cr(OLD, "ns", "slot", members=["a"]), OLD)
    index.upsert(POOL, cr(NEW, "ns", "slot", members=["b"]), NEW)
    assert index.groups_with_member("ns", "a") == []
    assert [group_of(o) for _, o in index.groups_with_member("ns", "b")] == [NEW]
    index.delete(POOL, cr(NEW, "ns", "slot"), NEW)
    assert [group_of(o) for _, o in index.groups_with_member("ns", "a")] == [OLD]


def test_a_group_outside_the_preference_list_ranks_last() -> None:
    index = make_index()
    index.upsert(LLM, cr("example.com", "ns", "svc", "chat"), "example.com")
    index.upsert(LLM, cr(OLD, "ns", "svc", "chat"), OLD)
    assert shown(index, "chat") == [(OLD, "svc")]


# -- always exactly the preferred copy ------------------------------------------------------

GROUPS = [NEW, OLD]
NAMES = [("n1", "a"), ("n1", "b"), ("n2", "a")]
op = st.one_of(
    st.tuples(
        st.just("upsert"),
        st.sampled_from(GROUPS),
        st.sampled_from(NAMES),
        st.sampled_from(["", "r1", "r2"]),
        st.integers(1, 4),
    ),
    st.tuples(st.just("delete"), st.sampled_from(GROUPS), st.sampled_from(NAMES)),
    st.tuples(
        st.just("replace"),
        st.sampled_from(GROUPS),
        st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(["", "r1", "r2"])), max_size=3),
    ),
    st.tuples(st.just("clear"), st.sampled_from(GROUPS)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=25))
def test_what_is_shown_is_always_the_preferred_copy(ops: list[tuple[Any, ...]]) -> None:
    index = make_index()
    copies: dict[str, dict[tuple[str, str], Obj]] = {g: {} for g in GROUPS}  # the model
    for o in ops:
        if o[0] == "upsert":
            _, group, (ns, name), route, rv = o
            obj = cr(group, ns, name, route, rv=rv)
            held = copies[group].get((ns, name))
            if held is None or int(held["metadata"]["resourceVersion"]) <= rv:
                copies[group][(ns, name)] = obj
            index.upsert(LLM, obj, group)
        elif o[0] == "delete":
            _, group, (ns, name) = o
            copies[group].pop((ns, name), None)
            index.delete(LLM, cr(group, ns, name), group)
        elif o[0] == "replace":
            _, group, items = o
            fresh = {(ns, name): cr(group, ns, name, route) for (ns, name), route in items}
            # A copy held at a later resourceVersion than the list's (a write-through) stays.
            copies[group] = {
                key: held
                if (held := copies[group].get(key)) is not None
                and int(held["metadata"]["resourceVersion"])
                > int(obj["metadata"]["resourceVersion"])
                else obj
                for key, obj in fresh.items()
            }
            index.replace(LLM, fresh.values(), group)
        else:
            copies[o[1]] = {}
            index.clear(LLM, o[1])

        expected: dict[tuple[str, str], Obj] = {}
        for group in reversed(GROUPS):  # the preferred group last, so it wins
            expected.update(copies[group])
        assert index.count(LLM) == len(expected)
        for (ns, name), obj in expected.items():
            assert index.get(LLM, ns, name) == obj
        claims: dict[str, list[tuple[str, str]]] = {}
        for obj in expected.values():
            if service_id(obj):
                claims.setdefault(service_id(obj), []).append(
                    (group_of(obj), obj["metadata"]["name"])
                )
        assert index.routes() == sorted(claims)
        for route in ("r1", "r2"):
            assert sorted(shown(index, route)) == sorted(claims.get(route, []))
        hidden = sum(len(c) for c in copies.values()) - len(expected)
        assert sum(index.leftovers(LLM).values()) == hidden
