"""Body rules and patch building, without an API server (which checks the merged object)."""

from __future__ import annotations

from typing import Any

import pytest

from slo_api.errors import ApiError
from slo_api.kinds import build_kinds
from slo_api.kinds.base import replacing
from slo_api.settings import Settings
from tests.unit.conftest import job_cr, llm_cr, pool_cr

KINDS = {k.name: k for k in build_kinds(Settings(slo_api_token="unit-write-token"))}


def no_pool(namespace: str, member: str) -> None:
    return None


def patch(kind: str, body: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    k = KINDS[kind]
    return k.spec_patch(k.parse(body), current, no_pool)


def refused(kind: str, body: dict[str, Any], current: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        patch(kind, body, current)
    assert caught.value.status == 400
    return caught.value


def test_high_priority_maps_to_10_and_0() -> None:
    current = llm_cr("a")
    assert patch("llm", {"highPriority": True}, current) == {"priority": 10}
    assert patch("llm", {"highPriority": False}, llm_cr("a", priority=10)) == {"priority": 0}
    assert patch("llm", {"highPriority": False, "priority": 9}, current) == {"priority": 9}
    assert patch("llm", {"highPriority": True, "priority": 10}, current) == {"priority": 10}
    assert refused("llm", {"highPriority": True, "priority": 9}, current).field == "highPriority"


def test_a_read_says_high_priority_only_for_10() -> None:
    for priority, high in ((10, True), (9, False), (0, False)):
        body = KINDS["llm"].project(llm_cr("a", priority=priority), no_pool)
        assert body["highPriority"] is high


def test_bound_type_defaults_to_replica_and_null_max_removes_it() -> None:
    current = llm_cr("a", maximumDeployment={"type": "pdengine", "value": 4})
    assert patch("llm", {"maximumDeployment": {"value": 3}}, current) == {
        "maximumDeployment": {"type": "replica", "value": 3}
    }
    assert patch("llm", {"maximumDeployment": None}, current) == {"maximumDeployment": None}


def test_a_section_replaces_the_stored_one() -> None:
    current = llm_cr(
        "a",
        ttft={
            "default": {"metrics": [{"type": "p90", "threshold": 1}]},
            "ranges": [{"contextLengthRangeLow": 0, "metrics": [{"type": "p90", "threshold": 1}]}],
        },
    )
    new = {"default": {"metrics": [{"type": "p50", "threshold": 0.2}]}}
    assert patch("llm", {"ttft": new}, current) == {"ttft": {**new, "ranges": None}}


def test_replacing_nulls_what_the_new_value_lacks_at_every_level() -> None:
    assert replacing({"a": {"b": 1}}, {"a": {"b": 2, "c": 3}, "d": 4}) == {
        "a": {"b": 1, "c": None},
        "d": None,
    }
    assert replacing([1], {"x": 1}) == [1]


def test_job_queue_keeps_promql_when_left_out() -> None:
    assert patch("job", {"queue": {"maxDepth": 5}}, job_cr("j")) == {"queue": {"maxDepth": 5}}
    assert refused("job", {"queue": {"maxDepth": 5, "promql": "  "}}, job_cr("j")).field == (
        "queue.promql"
    )


def test_llm_sections_on_a_job_route_name_the_field() -> None:
    error = refused("job", {"ttft": {"default": {"metrics": []}}}, job_cr("j"))
    assert error.field == "ttft"
    assert "not a field of job routes" in error.message


@pytest.mark.parametrize("value", ["1ns", "1.5ns", "45s", "+5m", "2562047h47m16.854775807s"])
def test_pool_durations_go_accepts_from_1ns(value: str) -> None:
    current = pool_cr("p", ["a", "b"])
    for field in ("swapBudget", "reclaimAfter"):
        assert patch("pool", {"pool": {field: value}}, current)[field] == value


@pytest.mark.parametrize(
    "value",
    [
        "0s",
        "0",
        "0.5ns",
        "-5m",
        "\u0663s",
        "\uff13s",
        "2562047h47m16.854775808s",
        "9999999h",
        "5",
        "1d",
    ],
)
def test_pool_durations_go_refuses_or_below_1ns_are_400(value: str) -> None:
    current = pool_cr("p", ["a", "b"])
    for field in ("swapBudget", "reclaimAfter"):
        error = refused("pool", {"pool": {field: value}}, current)
        assert error.field == f"pool.{field}"


def test_pool_default_must_be_a_current_member() -> None:
    current = pool_cr("p", ["a", "b"])
    assert patch("pool", {"pool": {"default": "b"}}, current) == {"default": "b"}
    error = refused("pool", {"pool": {"default": "c"}}, current)
    assert error.field == "pool.default"
    assert "a, b" in error.message


@pytest.mark.parametrize(
    ("default", "says"),
    [("a\x07", "control characters"), ("a" * 254, "at most 253"), ("a/history", "history")],
)
def test_a_pool_default_keeps_the_route_name_rule(default: str, says: str) -> None:
    # Even one the CR lists as a member: no route of that name can be addressed.
    current = pool_cr("p", ["a", default])
    error = refused("pool", {"pool": {"default": default}}, current)
    assert error.field == "pool.default"
    assert says in error.message


def test_pool_read_only_fields_accepted_unchanged() -> None:
    current = pool_cr("p", ["a", "b"], gpu=2)
    body = KINDS["pool"].project(current, no_pool)
    body["pool"]["swapBudget"] = "45s"
    # Echoed values are in the kind's patch; the write path leaves out what is unchanged.
    assert patch("pool", body, current) == {"swapBudget": "45s", "swapPolicy": "sticky"}
    body["pool"]["gpu"] = 3
    assert refused("pool", body, current).field == "pool.gpu"


def test_reset_patches() -> None:
    assert KINDS["llm"].reset_patch(llm_cr("a")) == {
        "priority": 0,
        "minimumDeployment": {"type": "replica", "value": 1},
        "maximumDeployment": None,
        "ttft": None,
        "otps": None,
    }
    assert "queue" not in KINDS["job"].reset_patch(job_cr("j"))
    assert KINDS["pool"].reset_patch(pool_cr("p", ["a"])) == {
        "swapPolicy": "sticky",
        "swapBudget": "300s",
        "default": None,
        "reclaimAfter": None,
    }


def test_summaries_are_the_kinds_fields_of_the_body_with_unset_ones_left_out() -> None:
    llm = llm_cr("a", maximumDeployment={"value": 4}, ttft={"default": {"metrics": []}})
    assert KINDS["llm"].summary(llm) == {
        "route": "a",
        "kind": "llm",
        "highPriority": False,
        "priority": 0,
        "minimumDeployment": {"type": "replica", "value": 1},
        "maximumDeployment": {"type": "replica", "value": 4},
    }
    assert KINDS["job"].summary(job_cr("j", priority=10)) == {
        "route": "j",
        "kind": "job",
        "highPriority": True,
        "priority": 10,
        "minimumDeployment": {"type": "replica", "value": 1},
    }
    pool = pool_cr("p", ["a"])
    assert KINDS["pool"].summary(pool) == {
        "route": "p",
        "kind": "pool",
        "swapPolicy": "sticky",
        "swapBudget": "300s",
    }
    pool["status"] = {"residentMember": "a", "phase": "Ready"}
    assert KINDS["pool"].summary(pool)["residentMember"] == "a"


def test_field_translation_from_api_server_causes() -> None:
    assert KINDS["llm"].translate_field("spec.priority") == "priority"
    assert KINDS["llm"].translate_field("spec.ttft.default.metrics[0].threshold") == (
        "ttft.default.metrics[0].threshold"
    )
    assert KINDS["pool"].translate_field("spec.swapBudget") == "pool.swapBudget"
    assert KINDS["pool"].translate_field("spec.members[0].inferenceServiceRef.name") == (
        "pool.members"
    )
