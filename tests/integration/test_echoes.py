"""Clients that read a route, change one field and send back everything they read, on the real
API server: the CR holds exactly that one change, even when a pool swap changed `status` (and
the members' `pool` view) between the read and the write."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration.service import RunningService
from tests.unit.fakes import merge  # RFC 7386, as the API server applies a merge patch

pytestmark = pytest.mark.integration

SECTION = {
    "default": {"metrics": [{"type": "p90", "threshold": 0.8}]},
    "ranges": [
        {
            "contextLengthRangeLow": 0,
            "contextLengthRangeHigh": 4096,
            "metrics": [{"type": "p90", "threshold": 0.5}],
        }
    ],
}
BOUNDS = {
    "minimumDeployment": {"type": "replica", "value": 1},
    "maximumDeployment": {"type": "replica", "value": 4},
}


def _status(resident: str, other: str) -> dict[str, Any]:
    return {
        "phase": "Ready",
        "residentMember": resident,
        "members": [
            {"name": resident, "phase": "Ready", "resident": True},
            {"name": other, "phase": "Idle", "resident": False},
        ],
    }


class Setup:
    """An LLM and a job route sharing a pool, all with every optional field set."""

    def __init__(self, admin: Admin, namespace: str) -> None:
        self.admin = admin
        self.ns = namespace
        self.llm, self.job, self.pool = (f"{n}-{namespace}" for n in ("chat", "render", "slot"))

    async def create(self, service: RunningService) -> None:
        self.admin.create(
            crs.llm(self.ns, "chat", service_id=self.llm, priority=3, ttft=SECTION, **BOUNDS)
        )
        self.admin.merge_patch(
            crs.SLO,
            "LLMSLORequirement",
            self.ns,
            "chat",
            {"spec": {"otps": {"default": {"metrics": [{"type": "avg", "threshold": 20}]}}}},
        )
        self.admin.create(crs.job(self.ns, "render", service_id=self.job, priority=3, **BOUNDS))
        self.admin.create(
            crs.pool(
                self.ns,
                self.pool,
                [self.llm, self.job],
                default=self.llm,
                reclaimAfter="10m",
                nodeSelector={"gpu": "a100"},
            )
        )
        self.swap(self.llm, self.job)
        for route in (self.llm, self.job, self.pool):
            await service.eventually(partial(service.indexed, route), what=route)
        await service.eventually(
            lambda: service.runtime.service.pool_of(self.ns, self.llm) is not None,
            what="membership",
        )

    def swap(self, resident: str, other: str) -> None:
        self.admin.merge_patch(
            crs.POOL,
            "ModelPool",
            self.ns,
            self.pool,
            {"status": _status(resident, other)},
            subresource="status",
        )

    def stored(self, route: str) -> dict[str, Any]:
        if route == self.pool:
            obj = self.admin.get(crs.POOL, "ModelPool", self.ns, self.pool)
        elif route == self.llm:
            obj = self.admin.get(crs.SLO, "LLMSLORequirement", self.ns, "chat")
        else:
            obj = self.admin.get(crs.SLO, "JobSLORequirement", self.ns, "render")
        return obj


# (route attribute, where in the body, new value, the spec patch it means)
EDITS: list[tuple[str, tuple[str, ...], Any, dict[str, Any]]] = [
    ("llm", ("highPriority",), True, {"priority": 10}),
    ("llm", ("priority",), 6, {"priority": 6}),
    (
        "llm",
        ("minimumDeployment",),
        {"type": "concurrency", "value": 2},
        {"minimumDeployment": {"type": "concurrency", "value": 2}},
    ),
    (
        "llm",
        ("maximumDeployment",),
        {"type": "replica", "value": 6},
        {"maximumDeployment": {"value": 6}},
    ),
    ("llm", ("maximumDeployment",), None, {"maximumDeployment": None}),
    (
        "llm",
        ("ttft",),
        {"default": SECTION["default"]},
        {"ttft": {"ranges": None}},
    ),
    (
        "llm",
        ("otps", "default", "metrics"),
        [{"type": "p50", "threshold": 30}],
        {"otps": {"default": {"metrics": [{"type": "p50", "threshold": 30}]}}},
    ),
    ("llm", ("otps",), None, {"otps": None}),
    ("job", ("highPriority",), True, {"priority": 10}),
    ("job", ("priority",), 0, {"priority": 0}),
    (
        "job",
        ("minimumDeployment",),
        {"type": "concurrency", "value": 3},
        {"minimumDeployment": {"type": "concurrency", "value": 3}},
    ),
    ("job", ("maximumDeployment",), None, {"maximumDeployment": None}),
    ("job", ("queue", "maxDepth"), 7, {"queue": {"maxDepth": 7}}),
    ("job", ("queue", "promql"), "sum(q)", {"queue": {"promql": "sum(q)"}}),
    ("pool", ("pool", "default"), "JOB", {"default": "JOB"}),
    ("pool", ("pool", "default"), None, {"default": None}),
    ("pool", ("pool", "swapBudget"), "90s", {"swapBudget": "90s"}),
    ("pool", ("pool", "reclaimAfter"), "1h30m", {"reclaimAfter": "1h30m"}),
    ("pool", ("pool", "reclaimAfter"), None, {"reclaimAfter": None}),
]


@pytest.mark.parametrize("swap_between", [False, True], ids=["steady", "swap-between"])
@pytest.mark.parametrize(
    ("which", "path", "value", "meaning"),
    EDITS,
    ids=[f"{e[0]}-{'.'.join(e[1])}-{'null' if e[2] is None else 'set'}" for e in EDITS],
)
async def test_one_field_changed_in_a_whole_echoed_body(
    admin: Admin,
    namespace: str,
    service: RunningService,
    which: str,
    path: tuple[str, ...],
    value: Any,
    meaning: dict[str, Any],
    swap_between: bool,
) -> None:
    setup = Setup(admin, namespace)
    await setup.create(service)
    route = getattr(setup, which)
    if value == "JOB":
        value, meaning = setup.job, {"default": setup.job}
    before = setup.stored(route)
    body = (await service.get(f"/routes/{route}")).json()
    assert ("pool" in body) is True  # members show their pool; the pool its settings
    if swap_between:
        setup.swap(setup.job, setup.llm)
        await service.eventually(
            lambda: (
                not (service.runtime.service.pool_of(namespace, setup.llm) or {}).get(
                    "resident", True
                )
            ),
            what="the swap seen by the index",
        )
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    response = await service.put(f"/routes/{route}", body)
    assert response.status_code == 200, response.text
    after = setup.stored(route)
    assert after["spec"] == merge(before["spec"], meaning)
    if which == "pool":
        expected_resident = setup.job if swap_between else setup.llm
        assert after["status"]["residentMember"] == expected_resident


@pytest.mark.parametrize(
    ("stored", "sent", "written"),
    [
        (5, {"highPriority": False}, 5),
        (10, {"highPriority": False}, 0),
        (5, {"highPriority": True}, 10),
        (5, {"priority": 8}, 8),
        (5, {"highPriority": False, "priority": 5}, 5),
        (0, {"highPriority": True, "priority": 0}, 10),
        (10, {"highPriority": True, "priority": 4}, 4),
        (3, {"highPriority": True, "priority": 10}, 10),
    ],
)
async def test_priority_as_the_client_meant_it(
    admin: Admin,
    namespace: str,
    service: RunningService,
    stored: int,
    sent: dict[str, Any],
    written: int,
) -> None:
    route = f"p-{namespace}"
    admin.create(crs.llm(namespace, "p", service_id=route, priority=stored))
    await service.eventually(lambda: service.indexed(route), what="indexed")
    response = await service.put(f"/routes/{route}", sent)
    assert response.status_code == 200, response.text
    assert admin.get(crs.SLO, "LLMSLORequirement", namespace, "p")["spec"]["priority"] == written
    assert response.json()["highPriority"] is (written == 10)


async def test_both_changed_and_disagreeing_is_400_and_changes_nothing(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = f"p-{namespace}"
    admin.create(crs.llm(namespace, "p", service_id=route, priority=3))
    await service.eventually(lambda: service.indexed(route), what="indexed")
    response = await service.put(f"/routes/{route}", {"highPriority": True, "priority": 5})
    assert response.status_code == 400
    error = response.json()["error"]
    assert {c["field"] for c in error["causes"]} == {"highPriority", "priority"}
    assert admin.get(crs.SLO, "LLMSLORequirement", namespace, "p")["spec"]["priority"] == 3


async def test_unset_fields_are_left_out_everywhere(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = f"bare-{namespace}"
    admin.create(crs.llm(namespace, "bare", service_id=route))
    await service.eventually(lambda: service.indexed(route), what="indexed")
    got = (await service.get(f"/routes/{route}")).json()
    put = (await service.put(f"/routes/{route}", {"priority": 1})).json()
    page = await service.config_page_of(route)
    listed = (
        await service.get("/config", params={"pageSize": 200, "page": page, "view": "full"})
    ).json()
    summary = (await service.get("/config", params={"pageSize": 200, "page": page})).json()
    full_item = next(i for i in listed["items"] if i["route"] == route)
    summary_item = next(i for i in summary["items"] if i["route"] == route)
    for body in (got, put, full_item):
        assert set(body) == {
            "route",
            "kind",
            "highPriority",
            "priority",
            "minimumDeployment",
        }, body
    assert "maximumDeployment" not in summary_item


# Merge patches of the shapes slo-api sends (a section replaced, a list replaced, a nested key
# removed by null, a whole field removed), applied one after another.
ORACLE_PATCHES: list[dict[str, Any]] = [
    {"ttft": SECTION, "maximumDeployment": {"type": "replica", "value": 4}},
    {"ttft": {"ranges": None}},
    {"ttft": {"default": {"metrics": [{"type": "avg", "threshold": 0.3}]}}, "priority": 4},
    {"otps": {"default": {"metrics": [{"type": "p50", "threshold": 9}]}}},
    {"maximumDeployment": None, "otps": None},
]


def test_the_oracle_merges_as_the_api_server_does(admin: Admin, namespace: str) -> None:
    """The fake's merge patch, used as the oracle above and in the unit tests, gives what the
    API server stores for the same patch."""
    admin.create(crs.llm(namespace, "oracle", None, priority=1, **BOUNDS))
    for patch in ORACLE_PATCHES:
        before = admin.get(crs.SLO, "LLMSLORequirement", namespace, "oracle")["spec"]
        after = admin.merge_patch(
            crs.SLO, "LLMSLORequirement", namespace, "oracle", {"spec": patch}
        )["spec"]
        assert after == merge(before, patch), patch
