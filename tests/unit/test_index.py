"""CRIndex: route bookkeeping, UID and resourceVersion rules, per-kind relists."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_api.index import CRIndex, IndexedKind, slim

Obj = dict[str, Any]
LLM, JOB, POOL = "llmslorequirements", "jobslorequirements", "modelpools"


def service_id(obj: Obj) -> str:
    value = obj.get("spec", {}).get("serviceId")
    return value if isinstance(value, str) else ""


def pool_name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def pool_members(obj: Obj) -> list[str]:
    return [str(m) for m in obj.get("spec", {}).get("members", [])]


def make_index() -> CRIndex:
    return CRIndex(
        [
            IndexedKind("llm", LLM, service_id),
            IndexedKind("job", JOB, service_id),
            IndexedKind("pool", POOL, pool_name, pool_members),
        ]
    )


def cr(
    namespace: str,
    name: str,
    route: str | None = None,
    *,
    uid: str | None = None,
    rv: int = 1,
    **spec: Any,
) -> Obj:
    if route is not None:
        spec["serviceId"] = route
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": uid or f"uid-{namespace}-{name}",
            "resourceVersion": str(rv),
        },
        "spec": spec,
    }


def claimants(index: CRIndex, route: str) -> list[tuple[str, str, str]]:
    return [
        (plural, obj["metadata"]["namespace"], obj["metadata"]["name"])
        for plural, obj in index.claims(route)
    ]


# -- routes --------------------------------------------------------------------------------


def test_route_lists_are_sorted_whatever_the_order_of_arrival() -> None:
    index = make_index()
    for n, route in enumerate(["m", "b", "z", "a", "k"]):
        index.upsert(LLM, cr("ns", f"llm{n}", route))
    index.upsert(JOB, cr("ns", "job", "c"))
    index.upsert(POOL, cr("ns", "pool-y"))
    assert index.routes() == ["a", "b", "c", "k", "m", "pool-y", "z"]
    assert index.routes("llm") == ["a", "b", "k", "m", "z"]
    assert index.routes("job") == ["c"]
    assert index.routes("pool") == ["pool-y"]


def test_a_cr_without_a_route_is_stored_but_claims_nothing() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "blank", ""))
    assert index.count(LLM) == 1
    assert index.routes() == []
    assert index.claims("") == []


def test_a_service_id_change_moves_the_cr_to_the_new_route() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "svc", "old", rv=1))
    index.upsert(LLM, cr("ns", "svc", "new", rv=2))
    assert index.claims("old") == []
    assert claimants(index, "new") == [(LLM, "ns", "svc")]
    assert index.routes() == ["new"]
    assert index.routes("llm") == ["new"]


def test_ambiguous_claims_are_all_returned_in_a_stable_order() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns2", "b", "shared"))
    index.upsert(JOB, cr("ns1", "j", "shared"))
    index.upsert(LLM, cr("ns1", "a", "shared"))
    assert claimants(index, "shared") == [
        (JOB, "ns1", "j"),
        (LLM, "ns1", "a"),
        (LLM, "ns2", "b"),
    ]
    assert index.routes() == ["shared"]
    assert index.routes("llm") == ["shared"]
    assert index.routes("job") == ["shared"]


def test_per_kind_route_lists_drop_a_route_only_when_that_kind_stops_claiming_it() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns1", "a", "shared"))
    index.upsert(LLM, cr("ns2", "b", "shared"))
    index.upsert(JOB, cr("ns1", "j", "shared"))

    index.delete(LLM, cr("ns1", "a"))
    assert index.routes("llm") == ["shared"]  # ns2/b still claims it
    index.delete(JOB, cr("ns1", "j"))
    assert index.routes("job") == []
    assert index.routes("llm") == ["shared"]
    assert claimants(index, "shared") == [(LLM, "ns2", "b")]
    index.delete(LLM, cr("ns2", "b"))
    assert index.routes() == []
    assert index.routes("llm") == []


def test_pool_members_follow_changes() -> None:
    index = make_index()
    index.upsert(POOL, cr("ns", "pool", members=["a", "b"], rv=1))
    assert [o["metadata"]["name"] for _, o in index.groups_with_member("ns", "a")] == ["pool"]
    index.upsert(POOL, cr("ns", "pool", members=["b"], rv=2))
    assert index.groups_with_member("ns", "a") == []
    assert len(index.groups_with_member("ns", "b")) == 1
    assert index.groups_with_member("other", "b") == []
    index.delete(POOL, cr("ns", "pool"))
    assert index.groups_with_member("ns", "b") == []


# -- UIDs and resourceVersions -------------------------------------------------------------


def test_an_older_event_for_the_same_cr_is_ignored() -> None:
    index = make_index()
    assert index.upsert(LLM, cr("ns", "svc", "new", rv=5))
    assert not index.upsert(LLM, cr("ns", "svc", "old", rv=4))
    assert claimants(index, "new") == [(LLM, "ns", "svc")]
    assert index.claims("old") == []


def test_resource_versions_compare_as_numbers_not_strings() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "svc", "a", rv=9))
    assert index.upsert(LLM, cr("ns", "svc", "b", rv=10))  # "10" < "9" as strings
    assert claimants(index, "b") == [(LLM, "ns", "svc")]


def test_a_recreated_cr_replaces_the_old_one_by_uid() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "svc", "first", uid="old", rv=5))
    # A new UID is a new object: its resourceVersion is not compared with the old one's.
    assert index.upsert(LLM, cr("ns", "svc", "second", uid="new", rv=3))
    stored = index.get(LLM, "ns", "svc")
    assert stored is not None
    assert stored["metadata"]["uid"] == "new"
    assert index.routes() == ["second"]


def test_a_delete_of_the_old_uid_leaves_the_recreated_cr() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "svc", "r", uid="new", rv=7))
    assert not index.delete(LLM, cr("ns", "svc", "r", uid="old", rv=6))
    assert claimants(index, "r") == [(LLM, "ns", "svc")]
    assert index.delete(LLM, cr("ns", "svc", "r", uid="new", rv=8))
    assert index.get(LLM, "ns", "svc") is None
    assert not index.delete(LLM, cr("ns", "svc", "r", uid="new", rv=8))  # already gone


def test_a_delete_without_a_uid_removes_whatever_has_the_name() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "svc", "r"))
    assert index.delete(LLM, {"metadata": {"namespace": "ns", "name": "svc"}})
    assert index.routes() == []


def test_write_through_does_not_resurrect_a_deleted_cr() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "svc", "r", rv=1))
    index.delete(LLM, cr("ns", "svc", "r", rv=2))
    # A PUT's answer arrives after the watch has delivered the delete.
    assert not index.write_through(LLM, cr("ns", "svc", "r", rv=2))
    assert index.get(LLM, "ns", "svc") is None
    assert index.routes() == []


def test_write_through_does_not_roll_back_a_newer_cr() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "svc", "r", rv=1))
    index.upsert(LLM, cr("ns", "svc", "r", rv=9, priority=2))  # the watch moved past the write
    assert not index.write_through(LLM, cr("ns", "svc", "r", rv=5, priority=1))
    stored = index.get(LLM, "ns", "svc")
    assert stored is not None
    assert stored["spec"]["priority"] == 2


def test_write_through_does_not_touch_a_cr_recreated_meanwhile() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "svc", "r", uid="new", rv=3))
    assert not index.write_through(LLM, cr("ns", "svc", "elsewhere", uid="old", rv=9))
    stored = index.get(LLM, "ns", "svc")
    assert stored is not None
    assert stored["metadata"]["uid"] == "new"
    assert index.routes() == ["r"]


def test_write_through_stores_a_newer_version_of_the_same_cr() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "svc", "r", rv=1))
    assert index.write_through(LLM, cr("ns", "svc", "moved", rv=2))
    assert index.routes() == ["moved"]
    # The watch's own event for that version, arriving later, changes nothing.
    assert index.upsert(LLM, cr("ns", "svc", "moved", rv=2))
    assert index.routes() == ["moved"]
    assert not index.upsert(LLM, cr("ns", "svc", "r", rv=1))


def test_write_through_skips_versions_it_cannot_compare() -> None:
    index = make_index()
    stored = cr("ns", "svc", "r", rv=5, priority=2)
    index.upsert(LLM, stored)
    unknown = cr("ns", "svc", "r", priority=1)
    unknown["metadata"]["resourceVersion"] = "not-a-number"
    # The watch delivers that version anyway; a guess could roll the index back.
    assert not index.write_through(LLM, unknown)
    assert index.get(LLM, "ns", "svc") == stored
    index.upsert(LLM, unknown)  # from the watch, it is taken as it comes
    odd = cr("ns", "svc", "r", rv=7, priority=3)
    assert not index.write_through(LLM, odd)
    assert index.get(LLM, "ns", "svc") == unknown


# Not comparable under KEP-5504: "¹²" passes isdigit() but not int(), Arabic-Indic digits
# are decimal in another script, "012" has a leading zero, "0" is a list's "any".
ODD_VERSIONS = ["¹²", "\u0661\u0662", "012", "0", "a1b2"]


@pytest.mark.parametrize("odd", ODD_VERSIONS)
def test_a_version_that_does_not_compare_is_taken_in_the_order_it_arrives(odd: str) -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "svc", "first", rv=20))
    later = cr("ns", "svc", "second")
    later["metadata"]["resourceVersion"] = odd
    # Not compared with 20 (as 12, say): the watch's newest event is the newest state.
    assert index.upsert(LLM, later)
    assert index.routes() == ["second"]
    assert index.upsert(LLM, cr("ns", "svc", "third", rv=3))
    assert index.routes() == ["third"]
    # A write's answer it cannot place is left to the watch, which delivers it anyway.
    answer = cr("ns", "svc", "fourth")
    answer["metadata"]["resourceVersion"] = odd
    assert not index.write_through(LLM, answer)
    assert index.routes() == ["third"]


# -- relists -------------------------------------------------------------------------------


def test_replace_drops_what_vanished_and_keeps_other_kinds() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "a", "a"))
    index.upsert(LLM, cr("ns", "b", "b"))
    index.upsert(JOB, cr("ns", "j", "j"))
    index.upsert(JOB, cr("ns", "both", "b"))
    index.upsert(POOL, cr("ns", "p", members=["a"]))

    index.replace(LLM, [cr("ns", "a", "a2", rv=2), cr("ns", "c", "c")])
    assert sorted(o["metadata"]["name"] for o in index.objects(LLM)) == ["a", "c"]
    assert index.routes("llm") == ["a2", "c"]
    assert index.routes("job") == ["b", "j"]
    assert index.routes() == ["a2", "b", "c", "j", "p"]
    assert claimants(index, "b") == [(JOB, "ns", "both")]
    assert index.count(JOB) == 2
    assert index.count(POOL) == 1


def test_clear_empties_one_kind_only() -> None:
    index = make_index()
    index.upsert(LLM, cr("ns", "a", "shared"))
    index.upsert(JOB, cr("ns", "j", "shared"))
    index.clear(JOB)
    assert index.count(JOB) == 0
    assert index.routes("job") == []
    assert index.routes() == ["shared"]
    assert claimants(index, "shared") == [(LLM, "ns", "a")]


# -- what is stored ------------------------------------------------------------------------


def with_managed_fields(obj: Obj) -> Obj:
    obj["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    return obj


def test_managed_fields_are_dropped_on_every_way_in() -> None:
    index = make_index()
    index.upsert(LLM, with_managed_fields(cr("ns", "a", "a", rv=1)))
    index.replace(JOB, [with_managed_fields(cr("ns", "j", "j"))])
    index.write_through(LLM, with_managed_fields(cr("ns", "a", "a", rv=2)))
    for plural in (LLM, JOB):
        for obj in index.objects(plural):
            assert "managedFields" not in obj["metadata"]
            assert obj["metadata"]["uid"]


def test_slim_does_not_change_the_object_it_was_given() -> None:
    given_obj = with_managed_fields(cr("ns", "a", "a"))
    slimmed = slim(given_obj)
    assert "managedFields" in given_obj["metadata"]
    assert "managedFields" not in slimmed["metadata"]
    plain = cr("ns", "b", "b")
    assert slim(plain) is plain  # nothing to drop: no copy


def test_every_change_is_told_and_an_ignored_one_is_not() -> None:
    # What the change log (and so the /config pages) hears: the one change signal.
    index = make_index()
    told: list[set[str]] = []
    index.subscribe(told.append)
    index.upsert(LLM, cr("ns", "a", "a", rv=2))
    assert told == [{"a"}]
    index.upsert(LLM, cr("ns", "a", "a", rv=1))  # ignored: older
    assert told == [{"a"}]
    index.delete(LLM, cr("ns", "a"))
    assert told == [{"a"}, {"a"}]


# -- the bookkeeping always matches the stored objects --------------------------------------

KINDS = [(LLM, "llm"), (JOB, "job")]
operation = st.one_of(
    st.tuples(
        st.just("upsert"),
        st.sampled_from(KINDS),
        st.sampled_from(["n1", "n2"]),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["", "r1", "r2", "r3"]),
        st.sampled_from(["u1", "u2"]),
        st.integers(1, 6),
    ),
    st.tuples(
        st.just("delete"),
        st.sampled_from(KINDS),
        st.sampled_from(["n1", "n2"]),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from([None, "u1", "u2"]),
    ),
    st.tuples(
        st.just("replace"),
        st.sampled_from(KINDS),
        st.lists(
            st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["", "r1", "r2", "r3"])),
            max_size=3,
        ),
    ),
)


def check_consistent(index: CRIndex) -> None:
    claims: dict[str, list[tuple[str, str, str]]] = {}
    by_kind: dict[str, set[str]] = {"llm": set(), "job": set()}
    for plural, kind in KINDS:
        for obj in index.objects(plural):
            route = service_id(obj)
            if route:
                meta = obj["metadata"]
                claims.setdefault(route, []).append((plural, meta["namespace"], meta["name"]))
                by_kind[kind].add(route)
    assert index.routes() == sorted(claims)
    for kind, routes in by_kind.items():
        assert index.routes(kind) == sorted(routes)
    for route, expected in claims.items():
        assert claimants(index, route) == sorted(expected)
    for route in ("", "r1", "r2", "r3"):
        if route not in claims:
            assert index.claims(route) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=25))
def test_routes_and_claims_always_match_the_stored_objects(ops: list[tuple[Any, ...]]) -> None:
    index = make_index()
    for op in ops:
        if op[0] == "upsert":
            _, (plural, _), ns, name, route, uid, rv = op
            index.upsert(plural, cr(ns, name, route, uid=uid, rv=rv))
        elif op[0] == "delete":
            _, (plural, _), ns, name, uid = op
            obj = cr(ns, name, uid=uid)
            if uid is None:
                del obj["metadata"]["uid"]
            index.delete(plural, obj)
        else:
            _, (plural, _), items = op
            fresh = {name: cr("n1", name, route) for name, route in items}
            index.replace(plural, fresh.values())
        check_consistent(index)


def test_unaddressable_routes_are_neither_listed_nor_claimed() -> None:
    index = make_index()
    unaddressable = ["r" * 254, "tab\there", "line\nbreak", "del\x7f"]
    for number, route in enumerate(unaddressable):
        index.upsert(LLM, cr("ns", f"bad-{number}", route, rv=number + 1))
    index.upsert(JOB, cr("ns", "job-bad", "x" * 300))
    index.upsert(LLM, cr("ns", "longest", "r" * 253))
    assert index.routes() == ["r" * 253]
    assert index.routes("llm") == ["r" * 253]
    assert index.routes("job") == []
    for route in [*unaddressable, "x" * 300]:
        assert index.claims(route) == []
    # A CR that changes to an addressable serviceId is listed; back again, it is not.
    index.upsert(LLM, cr("ns", "bad-1", "fixed", rv=10))
    assert index.routes() == ["fixed", "r" * 253]
    index.upsert(LLM, cr("ns", "bad-1", "tab\tagain", rv=11))
    assert index.routes() == ["r" * 253]
    assert index.claims("fixed") == []
    index.replace(LLM, [cr("ns", "bad-0", "r" * 254, rv=12), cr("ns", "ok", "ok", rv=13)])
    assert index.routes() == ["ok"]


def test_changes_from_one_informer_name_it_with_one_shared_tuple() -> None:
    index = make_index()
    causes: list[Any] = []
    index.subscribe(lambda routes: causes.append(index.cause))
    index.reached(LLM, "", None, "5")
    for i in range(3):
        index.upsert(LLM, cr("ns", f"n{i}", f"r{i}", rv=6 + i), "")
    sources = [cause[0] for cause in causes]
    assert sources == [(LLM, "", "")] * 3
    # The change log keeps each change's source: one tuple for all, not one per change.
    assert sources[1] is sources[0]
    assert sources[2] is sources[0]
