"""sloctl's key=value editing and rendering, without HTTP."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from slo_api.cli.errors import CliError, ExitCode
from slo_api.cli.keys import apply_assignment, changed_fields, parse_assignment
from slo_api.cli.output import dump, flatten
from tests.unit.test_sloctl import LLM, POOL


def edited(body: dict[str, Any], *assignments: str) -> dict[str, Any]:
    result = copy.deepcopy(body)
    for text in assignments:
        apply_assignment(result, parse_assignment(text))
    return result


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("priority=10", 10),
        ("x=0.8", 0.8),
        ("x=true", True),
        ("x=false", False),
        ("x=null", None),
        ("x=[]", []),
        ('x={"a": 1}', {"a": 1}),
        ('x="10"', "10"),  # quoting keeps a number-like text a string
        ("x=chat-7b", "chat-7b"),
        ("x=NaN", "NaN"),  # not JSON, so not a number either
        ("x=", ""),
        ("x=a=b", "a=b"),  # only the first = splits
    ],
)
def test_values_are_json_where_they_look_like_it(text: str, value: Any) -> None:
    assert parse_assignment(text).value == value


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("min=2", ("minimumDeployment",), {"type": "replica", "value": 2}),
        ("min=replica:2", ("minimumDeployment",), {"type": "replica", "value": 2}),
        ("max=pdengine:2", ("maximumDeployment",), {"type": "pdengine", "value": 2}),
        ("minimumDeployment=concurrency:0", ("minimumDeployment",), {"type": "concurrency",
                                                                     "value": 0}),
        ("max=null", ("maximumDeployment",), None),
        ("min.value=3", ("minimumDeployment", "value"), 3),
    ],
)  # fmt: skip
def test_bound_aliases_and_shorthand(text: str, path: tuple[str, ...], value: Any) -> None:
    assignment = parse_assignment(text)
    assert (assignment.path, assignment.value) == (path, value)


@pytest.mark.parametrize(
    "text",
    [
        "min=two",
        "max=replica:",
        "max=true",
        "max=1.5",
        "noequals",
        "min=replica:\u0661",
        "min=replica:²",
        "max=replica:" + "9" * 5000,
    ],
)
def test_bad_assignments_are_usage_errors(text: str) -> None:
    with pytest.raises(CliError) as caught:
        parse_assignment(text)
    assert caught.value.exit_code == ExitCode.USAGE


def test_string_fields_stay_strings() -> None:
    assert parse_assignment("pool.default=7").value == "7"
    assert parse_assignment("pool.swapBudget=90s").value == "90s"
    assert parse_assignment("pool.reclaimAfter=null").value is None
    promql = 'sum(jobs_pending{service="render"})'
    assert parse_assignment(f"queue.promql={promql}").value == promql
    assert parse_assignment('queue.promql="up"').value == "up"


def test_metric_threshold_is_replaced_added_and_removed() -> None:
    body = edited(LLM, "ttft.default.p90=0.6", "ttft.default.p99=2", "otps.default.avg=null")

    assert body["ttft"]["default"]["metrics"] == [
        {"type": "p90", "threshold": 0.6},
        {"type": "p99", "threshold": 2},
    ]
    assert body["otps"]["default"]["metrics"] == []
    assert body["ttft"]["ranges"] == LLM["ttft"]["ranges"]


def test_metric_in_a_range_and_a_new_section() -> None:
    body = edited({"route": "x"}, "otps.default.p50=12")
    assert body["otps"] == {"default": {"metrics": [{"type": "p50", "threshold": 12}]}}

    body = edited(LLM, "ttft.ranges.0.p99=1")
    assert body["ttft"]["ranges"][0]["metrics"][-1] == {"type": "p99", "threshold": 1}


def test_lists_are_indexed_and_can_be_appended_to() -> None:
    new_range = '{"contextLengthRangeLow": 4096, "metrics": [{"type": "p90", "threshold": 1}]}'
    body = edited(LLM, f"ttft.ranges.1={new_range}", "ttft.ranges.0.contextLengthRangeHigh=2048")

    assert len(body["ttft"]["ranges"]) == 2
    assert body["ttft"]["ranges"][0]["contextLengthRangeHigh"] == 2048

    assert edited(LLM, "ttft.ranges=[]")["ttft"]["ranges"] == []


@pytest.mark.parametrize(
    "text",
    [
        "ttft.ranges.5.p90=1",
        "ttft.ranges.x.p90=1",
        "ttft.ranges.3=1",
        "priority.value=1",
        # Digits int() refuses ("²" passes isdigit()), or reads though no user meant an index.
        "ttft.ranges.².p90=1",
        "ttft.ranges.²=1",
        "ttft.ranges.\u0661=1",
        "ttft.ranges.+1=1",
        "ttft.ranges." + "9" * 5000 + "=1",
    ],
)  # ranges has one entry: index 1 appends, 3 and 5 are holes
def test_bad_paths_are_usage_errors(text: str) -> None:
    with pytest.raises(CliError) as caught:
        edited(LLM, text)
    assert caught.value.exit_code == ExitCode.USAGE


def test_nested_keys_create_missing_sections() -> None:
    body = edited({"route": "job", "maximumDeployment": None}, "queue.maxDepth=20", "max.value=3")
    assert body["queue"] == {"maxDepth": 20}
    assert body["maximumDeployment"] == {"value": 3}
    # A segment after a missing one makes a list only where it is an index (ASCII digits).
    body = edited({"route": "x"}, "a.².b=1", "c.0=2")
    assert body["a"] == {"²": {"b": 1}}
    assert body["c"] == [2]


def test_changed_fields_compares_json_not_python_equality() -> None:
    before = {"route": "x", "priority": 1, "ttft": {"a": 1}, "highPriority": False}
    after = {"route": "x", "priority": 1.0, "ttft": {"a": 1}, "highPriority": 0, "queue": {}}
    assert changed_fields(before, after) == ["priority", "highPriority", "queue"]
    assert changed_fields(before, copy.deepcopy(before)) == []


@pytest.mark.parametrize(
    ("body", "settable"),
    [
        (
            LLM,
            ["highPriority", "priority", "minimumDeployment", "maximumDeployment", "ttft", "otps"],
        ),
        (POOL, ["pool"]),
    ],
)
def test_every_line_get_shows_can_be_set_back(body: dict[str, Any], settable: list[str]) -> None:
    """Pasting the lines of `sloctl get` into `sloctl set` rebuilds the same fields."""
    lines = [
        f"{key}={value}"
        for key, value in flatten(body)
        if key.split(".", 1)[0] in settable and key != "pool.members"  # members: a list, read-only
    ]
    rebuilt = edited({}, *lines)
    expected = {field: body[field] for field in settable}
    if body is POOL:
        expected["pool"] = {k: v for k, v in POOL["pool"].items() if k != "members"}
    assert rebuilt == expected


def test_ranges_can_be_built_from_nothing() -> None:
    body = edited({}, "ttft.ranges.0.contextLengthRangeLow=0", "ttft.ranges.0.p90=0.5")
    assert body == {
        "ttft": {
            "ranges": [{"contextLengthRangeLow": 0, "metrics": [{"type": "p90", "threshold": 0.5}]}]
        }
    }


def test_yaml_output_round_trips() -> None:
    assert yaml.safe_load(dump(LLM, "yaml")) == LLM
