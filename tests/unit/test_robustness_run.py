"""What the robustness runner records of an API server object (the ground truth's shape)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

from hypothesis import given
from hypothesis import strategies as st

from robustness.faults import FAULTS, LEAST_GAP, Schedule
from robustness.model import build
from robustness.recording import Meta, Obj, Recording, Truth
from robustness.run import sse_events, trim


def test_the_truth_keeps_each_managers_spec_fields_and_drops_the_rest() -> None:
    obj = {
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "kind": "LLMSLORequirement",
        "metadata": {
            "name": "chat",
            "namespace": "a",
            "uid": "u-1",
            "resourceVersion": "42",
            "annotations": {"argocd.argoproj.io/tracking-id": "x"},
            "generation": 3,
            "managedFields": [
                {
                    "manager": "argocd-controller",
                    "operation": "Apply",
                    "time": "2026-12-01T00:00:00Z",
                    "fieldsV1": {"f:spec": {"f:priority": {}, "f:serviceId": {}}},
                },
                {"manager": "ctl", "operation": "Update", "subresource": "status", "fieldsV1": {}},
            ],
        },
        "spec": {"serviceId": "chat", "priority": 3},
        "status": {"phase": "Ready"},
    }
    kept = trim(obj)
    assert kept["managers"] == [
        {
            "manager": "argocd-controller",
            "operation": "Apply",
            "time": "2026-12-01T00:00:00Z",
            "fields": ["priority", "serviceId"],
        }
    ]
    assert "status" not in kept
    assert "generation" not in kept["metadata"]
    recording = Recording(Meta(seed=1, command=[]))
    recording.add(Truth(1.0, "llmslorequirements", "ADDED", kept))
    [state] = build(recording).states["u-1"]
    assert (state.route, state.rv, state.owned) == ("chat", 42, {"priority": 3})


@given(
    seed=st.integers(0, 2**32),
    faults=st.lists(st.sampled_from(FAULTS), min_size=1, unique=True),
    duration=st.floats(10, 600),
    length=st.floats(0, 15),
)
def test_the_schedule_runs_every_enabled_fault_first_and_in_the_time_left(
    seed: int, faults: list[str], duration: float, length: float
) -> None:
    """Each enabled kind once before any twice, however long each lasts (a run waits for the
    last one when the faults outlast `--duration`)."""
    schedule = Schedule(random.Random(seed), tuple(faults))
    now, chosen = 0.0, []
    while not schedule.complete:
        now += schedule.gap(duration - now)
        chosen.append(schedule.next())
        now += length
    assert sorted(chosen) == sorted(faults)
    assert all(schedule.next() in faults for _ in range(20))


@given(seed=st.integers(0, 2**32), duration=st.floats((len(FAULTS) + 1) * LEAST_GAP, 600))
def test_instant_faults_all_start_before_the_traffic_ends(seed: int, duration: float) -> None:
    """The pauses shrink so the remaining kinds fit in the time left (a minute's CI run has
    four kinds, not the four to five a minute the unhurried pauses give)."""
    schedule = Schedule(random.Random(seed), FAULTS)
    now = 0.0
    while not schedule.complete:
        now += schedule.gap(duration - now)
        schedule.next()
    assert now < duration


def test_the_same_seed_schedules_the_same_faults() -> None:
    def plan(seed: int) -> list[tuple[float, str]]:
        schedule = Schedule(random.Random(seed), FAULTS)
        return [(schedule.gap(60.0), schedule.next()) for _ in range(8)]

    assert plan(7) == plan(7)
    assert plan(7) != plan(8)


def test_a_server_sent_event_is_read_as_its_ndjson_line_with_its_id_as_revision() -> None:
    async def lines() -> AsyncIterator[str]:
        for line in [
            'data: {"type":"ADDED","route":"a"}',
            "",
            "retry: 3000",
            "",
            "id: r2",
            'data: {"type":"MODIFIED",',
            'data: "route":"a"}',
            "",
            'data: {"type":"BOOKMARK","revision":"r3"}',
            "id: r3",
            "",
        ]:
            yield line

    async def read() -> list[Obj]:
        return [event async for event in sse_events(lines())]

    assert asyncio.run(read()) == [
        {"type": "ADDED", "route": "a"},
        {"type": "MODIFIED", "route": "a", "revision": "r2"},
        {"type": "BOOKMARK", "revision": "r3"},
    ]
