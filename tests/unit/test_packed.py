"""The index keeps each CR's JSON packed against a dictionary learned per kind (see
slo_api/packed.py): a typical CR costs a fraction of its JSON, every read gives back exactly
what was stored whatever the kind's first object was, and two copies of one CR are told alike or
apart whatever dictionaries they were packed with."""

from __future__ import annotations

import asyncio
import copy
import gc
import os
import tracemalloc
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_api import index as index_module
from slo_api.index import CRIndex, IndexedKind, slim
from slo_api.packed import DICTIONARY_BYTES
from tests.unit.test_index_memory import served

Obj = dict[str, Any]
LLM = "llmslorequirements"
GROUP = "inference.modelsphere.dev"


def make_index() -> CRIndex:
    return CRIndex([IndexedKind("llm", LLM, lambda o: str(o["metadata"]["name"]))])


def cr(name: str, payload: Any = None, *, rv: int = 1, **meta: Any) -> Obj:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "LLMSLORequirement",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": str(rv),
            **meta,
        },
        "spec": {"serviceId": name, "payload": payload},
    }


def typical(i: int) -> Obj:
    """An LLM CR as the API server returns it, without managedFields."""
    return slim(served(i))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=40,
)
names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(first=json_values, payload=json_values, name=names, labels=st.dictionaries(names, names))
def test_every_object_reads_back_as_stored_whatever_the_kinds_first_was(
    first: Any, payload: Any, name: str, labels: dict[str, str]
) -> None:
    index = make_index()
    first_obj = cr("first", first)
    index.upsert(LLM, first_obj)
    obj = cr(name, payload, labels=labels)
    assert index.entry(LLM, obj).obj() == slim(obj)
    index.upsert(LLM, copy.deepcopy(obj))
    assert index.get(LLM, "ns", name) == slim(obj)
    assert index.get(LLM, "ns", "first") == slim(first_obj) or name == "first"


def test_a_typical_cr_is_held_in_a_fraction_of_its_json() -> None:
    index = make_index()
    objs = [typical(i) for i in range(200)]
    for obj in objs:
        index.upsert(LLM, obj)
    json_bytes = sum(len(orjson.dumps(slim(o))) for o in objs)
    assert index.encoded_bytes < json_bytes / 4, (index.encoded_bytes, json_bytes)
    assert [index.get(LLM, "bench", o["metadata"]["name"]) for o in objs] == [slim(o) for o in objs]


def test_a_huge_first_object_is_not_held_once_it_is_gone() -> None:
    huge = cr("huge", None, annotations={"note": os.urandom(64 * 1024).hex()})
    gc.collect()
    tracemalloc.start()
    try:
        index = make_index()
        index.upsert(LLM, huge)
        for i in range(10):
            index.upsert(LLM, typical(i))
        assert index.delete(LLM, huge)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # What its kind learned of it is at most DICTIONARY_BYTES, not its 128 KiB.
    assert held < 24 * 1024 + DICTIONARY_BYTES, held
    for i in range(10):
        assert index.get(LLM, "bench", typical(i)["metadata"]["name"]) == slim(typical(i))


def test_an_object_packing_cannot_shrink_is_held_as_it_is_and_reads_back() -> None:
    index = make_index()
    index.upsert(LLM, typical(0))
    before = index.encoded_bytes
    noise = cr("noise", os.urandom(3000).decode("latin-1"))
    index.upsert(LLM, noise)
    assert index.get(LLM, "ns", "noise") == slim(noise)
    # An object unlike the kind's first costs no more than its JSON.
    assert index.encoded_bytes - before <= len(orjson.dumps(slim(noise)))


def _two_dictionaries() -> tuple[CRIndex, CRIndex]:
    """Two indexes whose kind learned different dictionaries (their first objects differ)."""
    a, b = make_index(), make_index()
    a.upsert(LLM, typical(0))
    b.upsert(LLM, cr("other", {"something": ["else", 1, 2.5]}, labels={"x": "y"}))
    return a, b


def test_copies_packed_with_different_dictionaries_are_the_same_object_when_equal() -> None:
    a, b = _two_dictionaries()
    obj = typical(5)
    in_a, in_b = a.entry(LLM, obj), b.entry(LLM, obj)
    assert in_a.data != in_b.data  # packed differently: what `same` must see through
    assert in_a.same(in_b)
    assert in_b.same(in_a)
    changed = copy.deepcopy(obj)
    changed["spec"]["priority"] += 1
    assert not a.entry(LLM, changed).same(in_b)
    assert not in_b.same(a.entry(LLM, changed))


@settings(max_examples=150, deadline=None)
@given(p=json_values, q=json_values, equal=st.booleans())
def test_same_is_equality_of_the_json_whatever_the_dictionaries(
    p: Any, q: Any, equal: bool
) -> None:
    a, b = _two_dictionaries()
    x, y = cr("x", p), cr("x", p if equal else q)
    expected = orjson.dumps(slim(x)) == orjson.dumps(slim(y))
    for one in (a, b):
        for other in (a, b):
            assert one.entry(LLM, x).same(other.entry(LLM, y)) is expected


def test_a_relist_applied_aside_tells_changes_only_where_there_are_some() -> None:
    async def scenario() -> None:
        index = make_index()
        many = 2 * index_module.REPLACE_TURN + 7
        objs = [typical(i) for i in range(many)]
        index.upsert(LLM, objs[0])
        told: list[set[str]] = []
        index.subscribe(told.append)
        # Large enough to be applied to a copy built aside, and swapped in.
        await index.replace_in_turns(LLM, [index.entry(LLM, o) for o in objs], GROUP)
        assert {r for routes in told for r in routes} == {o["metadata"]["name"] for o in objs[1:]}
        told.clear()
        again = [copy.deepcopy(o) for o in objs]
        again[3]["spec"]["priority"] += 1
        again[3]["metadata"]["resourceVersion"] = "999999"
        await index.replace_in_turns(LLM, [index.entry(LLM, o) for o in again], GROUP)
        assert {r for routes in told for r in routes} == {again[3]["metadata"]["name"]}
        for o in again:
            assert index.get(LLM, "bench", o["metadata"]["name"]) == slim(o)

    asyncio.run(scenario())


def test_a_cr_listed_again_as_held_shares_the_held_bytes() -> None:
    index = make_index()
    obj = typical(1)
    index.upsert(LLM, obj)
    held = index._held(LLM, ("bench", obj["metadata"]["name"]))[GROUP]
    again = index.entry(LLM, copy.deepcopy(obj))
    assert again.data is held.data  # not packed anew
    assert again.same(held)
    changed = copy.deepcopy(obj)
    changed["spec"]["priority"] += 1  # the same version said otherwise: packed anew
    assert index.entry(LLM, changed).obj() == slim(changed)


def test_a_kind_first_seen_without_a_status_packs_crs_with_one_as_well() -> None:
    index = make_index()
    created = typical(0)
    index.upsert(LLM, created)  # the first of its kind: just created, no status yet
    objs = []
    for i in range(1, 101):
        obj = typical(i)
        obj["status"] = {
            "observedGeneration": 1,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Reconciled",
                    "lastTransitionTime": f"2026-12-04T16:{i % 60:02d}:00Z",
                },
            ],
            "replicas": i % 7,
        }
        objs.append(obj)
        index.upsert(LLM, obj)
    index.delete(LLM, created)
    json_bytes = sum(len(orjson.dumps(slim(o))) for o in objs)
    assert index.encoded_bytes < json_bytes / 8, (index.encoded_bytes, json_bytes)
    assert [index.get(LLM, "bench", o["metadata"]["name"]) for o in objs] == [slim(o) for o in objs]
