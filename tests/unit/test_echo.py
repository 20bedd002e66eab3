"""Bodies as clients send them back: read, change one field, send everything (issue: echoes).

A body read with GET and sent back whole, with one field changed, must do exactly what that one
change means: the priority pair, fields that change on their own (status, pool), unset fields.
"""

from __future__ import annotations

from typing import Any

import pytest

from slo_api.errors import ApiError
from slo_api.kinds import build_kinds
from slo_api.kinds.base import spec, without_unchanged
from slo_api.settings import Settings
from tests.unit.conftest import job_cr, llm_cr, pool_cr

KINDS = {k.name: k for k in build_kinds(Settings(slo_api_token="x" * 16))}


def in_pool(namespace: str, member: str) -> dict[str, Any]:
    return {"route": "gpu-slot-a", "resident": True, "phase": "Ready"}


def no_pool(namespace: str, member: str) -> None:
    return None


def changes(kind: str, body: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    k = KINDS[kind]
    # What the write path sends: the kind's patch, less what it leaves as stored.
    return without_unchanged(k.spec_patch(k.parse(body), current, no_pool), spec(current))


def echoed(kind: str, current: dict[str, Any], **changed: Any) -> dict[str, Any]:
    """What GET shows for `current`, with `changed` applied on top."""
    body = KINDS[kind].project(current, in_pool)
    body.update(changed)
    return body


# -- priority ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "sent", "written"),
    [
        (0, True, 10),
        (5, True, 10),
        (10, True, None),  # already high
        (10, False, 0),
        (5, False, None),  # a tier nobody asked to change stays
        (1, False, None),
        (0, False, None),
    ],
)
def test_high_priority_alone(stored: int, sent: bool, written: int | None) -> None:
    patch = changes("llm", {"highPriority": sent}, llm_cr("a", priority=stored))
    assert patch.get("priority") == written
    assert set(patch) <= {"priority"}


@pytest.mark.parametrize(("stored", "sent"), [(0, 7), (10, 0), (3, 10), (7, 7)])
def test_priority_alone_is_written_as_sent(stored: int, sent: int) -> None:
    patch = changes("job", {"priority": sent}, job_cr("j", priority=stored))
    assert patch.get("priority") == (None if sent == stored else sent)


@pytest.mark.parametrize(
    ("stored", "high", "priority", "written"),
    [
        # the whole body echoed, highPriority flipped: the flip wins
        (0, True, 0, 10),
        (7, True, 7, 10),
        (10, False, 10, 0),
        # the whole body echoed, priority changed: the new priority wins
        (0, False, 5, 5),
        (10, True, 3, 3),
        (3, False, 10, 10),
        # both echoed: nothing changes
        (4, False, 4, None),
        (10, True, 10, None),
        # both changed and agreeing
        (3, True, 10, 10),
        (10, False, 4, 4),
    ],
)
def test_both_sent_one_equal_to_the_stored_value_counts_as_echoed(
    stored: int, high: bool, priority: int, written: int | None
) -> None:
    body = echoed("llm", llm_cr("a", priority=stored), highPriority=high, priority=priority)
    assert changes("llm", body, llm_cr("a", priority=stored)).get("priority") == written


@pytest.mark.parametrize(("stored", "high", "priority"), [(0, True, 5), (3, True, 7)])
def test_both_changed_and_disagreeing_is_400_naming_both(
    stored: int, high: bool, priority: int
) -> None:
    with pytest.raises(ApiError) as caught:
        changes("llm", {"highPriority": high, "priority": priority}, llm_cr("a", priority=stored))
    assert caught.value.status == 400
    assert caught.value.field == "highPriority"
    assert f"priority {priority}" in caught.value.message
    assert {c["field"] for c in caught.value.causes or []} == {"highPriority", "priority"}


# -- unset fields are left out ----------------------------------------------------------------


def test_unset_optional_fields_are_left_out_of_bodies_and_summaries() -> None:
    llm = KINDS["llm"].project(llm_cr("a"), no_pool)
    for key in ("maximumDeployment", "ttft", "otps", "pool"):
        assert key not in llm
    assert "maximumDeployment" not in KINDS["llm"].summary(llm_cr("a"))
    job = KINDS["job"].project(job_cr("j"), no_pool)
    assert "maximumDeployment" not in job
    assert "pool" not in job
    pool = KINDS["pool"].project(pool_cr("p", ["a"]), no_pool)
    assert "default" not in pool["pool"]
    assert "reclaimAfter" not in pool["pool"]
    assert "residentMember" not in KINDS["pool"].summary(pool_cr("p", ["a"]))


def test_set_optional_fields_are_shown() -> None:
    cr = llm_cr("a", maximumDeployment={"type": "replica", "value": 3})
    assert KINDS["llm"].project(cr, in_pool)["maximumDeployment"] == {
        "type": "replica",
        "value": 3,
    }
    assert KINDS["llm"].project(cr, in_pool)["pool"]["route"] == "gpu-slot-a"


# -- fields that change on their own ----------------------------------------------------------


def test_an_echoed_pool_view_is_ignored_even_when_stale() -> None:
    current = llm_cr("a", priority=0)
    body = echoed("llm", current, highPriority=True)
    body["pool"] = {"route": "gpu-slot-a", "resident": False, "phase": "Swapping"}
    assert changes("llm", body, current) == {"priority": 10}
    job = job_cr("j")
    assert changes("job", {**echoed("job", job), "pool": body["pool"]}, job) == {}


def test_an_echoed_pool_status_is_ignored_even_when_stale() -> None:
    current = pool_cr(
        "p", ["a", "b"], default="a", status={"phase": "Ready", "residentMember": "a"}
    )
    body = echoed("pool", current)
    body["status"] = {"phase": "Swapping", "residentMember": "b", "pendingMember": None}
    body["pool"]["swapBudget"] = "45s"
    assert changes("pool", body, current) == {"swapBudget": "45s"}


def test_changed_members_or_gpu_stay_400() -> None:
    current = pool_cr("p", ["a", "b"], gpu=1)
    for name, value in (("members", ["a"]), ("gpu", 2)):
        body = echoed("pool", current)
        body["pool"][name] = value
        with pytest.raises(ApiError) as caught:
            changes("pool", body, current)
        assert caught.value.field == f"pool.{name}"


def test_an_echoed_default_that_stopped_being_a_member_is_not_refused() -> None:
    # The deployer removed member b after the client read the pool with default b.
    current = pool_cr("p", ["a"], default="b")
    body = echoed("pool", current)
    body["pool"]["swapPolicy"] = "sticky"
    body["pool"]["swapBudget"] = "90s"
    assert changes("pool", body, current) == {"swapBudget": "90s"}
    with pytest.raises(ApiError):
        changes("pool", {"pool": {"default": "c"}}, current)


# -- every field: read, change it, send the whole body back -----------------------------------

LLM_FULL = llm_cr(
    "a",
    priority=3,
    maximumDeployment={"type": "replica", "value": 4},
    ttft={
        "default": {"metrics": [{"type": "p90", "threshold": 0.8}]},
        "ranges": [
            {
                "contextLengthRangeLow": 0,
                "contextLengthRangeHigh": 4096,
                "metrics": [{"type": "p90", "threshold": 0.5}],
            }
        ],
    },
    otps={"default": {"metrics": [{"type": "avg", "threshold": 20}]}},
)

LLM_EDITS: list[tuple[str, Any, dict[str, Any]]] = [
    ("highPriority", True, {"priority": 10}),
    ("priority", 6, {"priority": 6}),
    ("minimumDeployment", {"type": "concurrency", "value": 2}, {}),
    ("maximumDeployment", {"type": "replica", "value": 6}, {}),
    ("maximumDeployment", None, {}),
    ("ttft", {"default": {"metrics": [{"type": "p50", "threshold": 0.3}]}}, {}),
    ("otps", None, {}),
]


@pytest.mark.parametrize(("field", "value", "expected"), LLM_EDITS)
def test_each_llm_field_changed_alone_in_an_echoed_body(
    field: str, value: Any, expected: dict[str, Any]
) -> None:
    body = echoed("llm", LLM_FULL, **{field: value})
    patch = changes("llm", body, LLM_FULL)
    assert set(patch) == {field if field != "highPriority" else "priority"}
    if expected:
        assert patch == expected


def test_an_unchanged_echo_changes_nothing() -> None:
    assert changes("llm", echoed("llm", LLM_FULL), LLM_FULL) == {}
    job = job_cr("j", maximumDeployment={"type": "replica", "value": 2})
    assert changes("job", echoed("job", job), job) == {}
    pool = pool_cr("p", ["a", "b"], default="a", reclaimAfter="10m")
    assert changes("pool", echoed("pool", pool), pool) == {}
