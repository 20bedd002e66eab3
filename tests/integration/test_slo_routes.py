"""LLM and job routes through HTTP, against the real API server."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration.service import RunningService

pytestmark = pytest.mark.integration

TTFT = {
    "default": {"metrics": [{"type": "p90", "threshold": 0.8}]},
    "ranges": [
        {
            "contextLengthRangeLow": 0,
            "contextLengthRangeHigh": 4096,
            "metrics": [{"type": "p90", "threshold": 0.5}],
        }
    ],
}


async def _llm(
    admin: Admin, service: RunningService, namespace: str, name: str = "chat", **spec: Any
) -> str:
    route = f"{name}-{namespace}"
    admin.create(crs.llm(namespace, name, service_id=route, **spec))
    await service.eventually(lambda: service.indexed(route), what=f"{route} indexed")
    return route


async def _job(
    admin: Admin, service: RunningService, namespace: str, name: str = "render", **spec: Any
) -> str:
    route = f"{name}-{namespace}"
    admin.create(crs.job(namespace, name, service_id=route, **spec))
    await service.eventually(lambda: service.indexed(route), what=f"{route} indexed")
    return route


def _spec(admin: Admin, kind: str, namespace: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = admin.get(crs.SLO, kind, namespace, name)["spec"]
    return spec


async def _assert_refused(
    admin: Admin,
    service: RunningService,
    kind: str,
    namespace: str,
    name: str,
    route: str,
    body: dict[str, Any],
    field: str,
) -> None:
    """A PUT of `body` is 400 naming `field`, and the CR's spec is left as it was."""
    before = _spec(admin, kind, namespace, name)
    response = await service.put(f"/routes/{route}", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field
    assert _spec(admin, kind, namespace, name) == before


async def test_llm_get_shows_the_body_and_an_etag(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(
        admin,
        service,
        namespace,
        priority=10,
        ttft=TTFT,
        maximumDeployment={"type": "replica", "value": 4},
    )
    response = await service.get(f"/routes/{route}")
    assert response.status_code == 200
    stored = admin.get(crs.SLO, "LLMSLORequirement", namespace, "chat")
    assert response.headers["etag"] == f'"{stored["metadata"]["resourceVersion"]}"'
    assert response.json() == {
        "route": route,
        "kind": "llm",
        "highPriority": True,
        "priority": 10,
        "minimumDeployment": {"type": "replica", "value": 1},
        "maximumDeployment": {"type": "replica", "value": 4},
        "ttft": TTFT,
    }
    legacy = await service.get(f"/config/{route}")
    assert legacy.json() == response.json()


async def test_llm_put_merges_owned_fields_and_keeps_the_rest(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(
        admin,
        service,
        namespace,
        ttft=TTFT,
        model="llama-7b",
        targetRef={"kind": "InferenceService", "name": "chat"},
    )
    response = await service.put(
        f"/config/{route}",
        {
            "route": route,
            "highPriority": True,
            "maximumDeployment": {"value": 6},
            "otps": {"default": {"metrics": [{"type": "avg", "threshold": 20}]}},
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["priority"] == 10
    assert body["highPriority"] is True
    assert body["maximumDeployment"] == {"type": "replica", "value": 6}
    assert body["ttft"] == TTFT  # not sent: kept
    spec = _spec(admin, "LLMSLORequirement", namespace, "chat")
    assert spec["model"] == "llama-7b"
    assert spec["targetRef"] == {"kind": "InferenceService", "name": "chat"}
    assert spec["otps"] == {"default": {"metrics": [{"type": "avg", "threshold": 20}]}}
    assert response.headers["etag"] != ""


async def test_a_section_without_ranges_removes_stored_ranges(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(admin, service, namespace, ttft=TTFT)
    new = {"default": {"metrics": [{"type": "p99", "threshold": 2}]}}
    response = await service.put(f"/routes/{route}", {"ttft": new})
    assert response.status_code == 200
    assert response.json()["ttft"] == {"default": {"metrics": [{"type": "p99", "threshold": 2}]}}
    assert "ranges" not in _spec(admin, "LLMSLORequirement", namespace, "chat")["ttft"]


async def test_priority_rules(admin: Admin, namespace: str, service: RunningService) -> None:
    route = await _llm(admin, service, namespace)
    ok = await service.put(f"/routes/{route}", {"highPriority": False, "priority": 7})
    assert ok.status_code == 200
    assert ok.json()["priority"] == 7
    assert ok.json()["highPriority"] is False
    for body, field in (
        # both changed from the stored 7, and disagreeing
        ({"highPriority": True, "priority": 5}, "highPriority"),
        ({"priority": 11}, "priority"),
        ({"priority": 4.0}, "priority"),
        ({"priority": True}, "priority"),
        ({"highPriority": 1}, "highPriority"),
    ):
        response = await service.put(f"/routes/{route}", body)
        assert response.status_code == 400, body
        assert response.json()["error"]["field"] == field
    assert _spec(admin, "LLMSLORequirement", namespace, "chat")["priority"] == 7


async def test_pdengine_and_zero_bounds_round_trip(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(admin, service, namespace)
    response = await service.put(
        f"/routes/{route}",
        {
            "minimumDeployment": {"type": "pdengine", "value": 0},
            "maximumDeployment": {"type": "pdengine", "value": 2},
        },
    )
    assert response.status_code == 200, response.text
    read = (await service.get(f"/routes/{route}")).json()
    assert read["minimumDeployment"] == {"type": "pdengine", "value": 0}
    assert read["maximumDeployment"] == {"type": "pdengine", "value": 2}
    zero = await service.put(
        f"/routes/{route}", {"minimumDeployment": {"value": 0}, "maximumDeployment": {"value": 0}}
    )
    assert zero.status_code == 200
    assert zero.json()["minimumDeployment"] == {"type": "replica", "value": 0}
    assert zero.json()["maximumDeployment"] == {"type": "replica", "value": 0}


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        (
            {"maximumDeployment": {"type": "pdengine", "value": 4}},
            "maximumDeployment",
            "both be pdengine",
        ),
        (
            {
                "minimumDeployment": {"type": "pdengine", "value": 1},
                "maximumDeployment": {"type": "pdengine", "value": 1},
            },
            "maximumDeployment.value",
            "must not be 1",
        ),
        (
            {"minimumDeployment": {"value": 5}, "maximumDeployment": {"value": 2}},
            "maximumDeployment.value",
            "not be below",
        ),
    ],
)
async def test_cel_rules_come_back_as_400_with_the_field_and_no_names(
    admin: Admin,
    namespace: str,
    service: RunningService,
    body: dict[str, Any],
    field: str,
    says: str,
) -> None:
    route = await _llm(admin, service, namespace, name="celcheck")
    before = _spec(admin, "LLMSLORequirement", namespace, "celcheck")
    response = await service.put(f"/routes/{route}", body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["field"] == field
    assert says in error["message"]
    assert any(c["field"] == field for c in error["causes"])
    # Said of the field, without it: a client shows `field: message`.
    for said in [error, *error["causes"]]:
        assert not said["message"].startswith(said["field"]), said
    others = response.text.replace(route, "<route>")
    assert "celcheck" not in others
    assert namespace not in others
    assert "LLMSLORequirement" not in response.text
    assert _spec(admin, "LLMSLORequirement", namespace, "celcheck") == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"queue": {"maxDepth": 3}}, "queue"),
        ({"unknown": 1}, "unknown"),
        ({"minimumDeployment": {"type": "gpu", "value": 1}}, "minimumDeployment.type"),
        ({"maximumDeployment": {"type": "concurrency", "value": 1}}, "maximumDeployment.type"),
        ({"minimumDeployment": {"value": -1}}, "minimumDeployment.value"),
        ({"minimumDeployment": {"value": 1.5}}, "minimumDeployment.value"),
        ({"minimumDeployment": None}, "minimumDeployment"),
        ({"ttft": {"default": {"metrics": []}}}, "ttft.default.metrics"),
        (
            {"ttft": {"default": {"metrics": [{"type": "p42", "threshold": 1}]}}},
            "ttft.default.metrics[0].type",
        ),
        (
            {"ttft": {"default": {"metrics": [{"type": "p90", "threshold": -1}]}}},
            "ttft.default.metrics[0].threshold",
        ),
        (
            {
                "otps": {
                    "default": {"metrics": [{"type": "avg", "threshold": 1}]},
                    "ranges": [
                        {"contextLengthRangeLow": -1, "metrics": [{"type": "avg", "threshold": 1}]}
                    ],
                }
            },
            "otps.ranges[0].contextLengthRangeLow",
        ),
        ({"otps": {"ranges": []}}, "otps.default"),
        ({"route": "someone-else"}, "route"),
        ({"kind": "job"}, "kind"),
    ],
)
async def test_llm_field_errors_are_400_with_the_field_and_change_nothing(
    admin: Admin, namespace: str, service: RunningService, body: dict[str, Any], field: str
) -> None:
    route = await _llm(admin, service, namespace, name="bad", ttft=TTFT)
    await _assert_refused(admin, service, "LLMSLORequirement", namespace, "bad", route, body, field)


async def test_llm_delete_resets_to_defaults_and_keeps_other_fields(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(
        admin,
        service,
        namespace,
        priority=10,
        ttft=TTFT,
        otps=TTFT,
        model="llama",
        maximumDeployment={"type": "replica", "value": 5},
        minimumDeployment={"type": "concurrency", "value": 3},
    )
    response = await service.delete(f"/routes/{route}")
    assert response.status_code == 204
    spec = _spec(admin, "LLMSLORequirement", namespace, "chat")
    assert spec == {
        "serviceId": route,
        "model": "llama",
        "priority": 0,
        "minimumDeployment": {"type": "replica", "value": 1},
    }
    assert admin.get(crs.SLO, "LLMSLORequirement", namespace, "chat")  # the CR stays


async def test_job_get_put_keeps_promql_and_delete_keeps_queue(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _job(
        admin,
        service,
        namespace,
        priority=10,
        queue={"maxDepth": 20, "promql": "sum(jobs_pending)"},
        targetRef={"kind": "Deployment", "name": "render"},
    )
    read = await service.get(f"/routes/{route}")
    assert read.json() == {
        "route": route,
        "kind": "job",
        "highPriority": True,
        "priority": 10,
        "minimumDeployment": {"type": "replica", "value": 1},
        "queue": {"maxDepth": 20, "promql": "sum(jobs_pending)"},
    }
    response = await service.put(
        f"/routes/{route}",
        {
            "route": route,
            "queue": {"maxDepth": 50},
            "minimumDeployment": {"type": "concurrency", "value": 2},
            "maximumDeployment": {"value": 8},
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["queue"] == {"maxDepth": 50, "promql": "sum(jobs_pending)"}
    deleted = await service.delete(f"/routes/{route}")
    assert deleted.status_code == 204
    spec = _spec(admin, "JobSLORequirement", namespace, "render")
    assert spec["queue"] == {"maxDepth": 50, "promql": "sum(jobs_pending)"}
    assert spec["targetRef"] == {"kind": "Deployment", "name": "render"}
    assert spec["priority"] == 0
    assert "maximumDeployment" not in spec


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"ttft": {"default": {"metrics": [{"type": "p90", "threshold": 1}]}}}, "ttft"),
        ({"otps": None}, "otps"),
        ({"minimumDeployment": {"type": "pdengine", "value": 1}}, "minimumDeployment.type"),
        ({"maximumDeployment": {"type": "pdengine", "value": 2}}, "maximumDeployment.type"),
        ({"queue": {"promql": ""}}, "queue.promql"),
        ({"queue": {"maxDepth": -1}}, "queue.maxDepth"),
        ({"queue": None}, "queue"),
        ({"queue": {"promql": None}}, "queue.promql"),
    ],
)
async def test_job_field_errors(
    admin: Admin, namespace: str, service: RunningService, body: dict[str, Any], field: str
) -> None:
    route = await _job(admin, service, namespace, name="jobbad")
    await _assert_refused(
        admin, service, "JobSLORequirement", namespace, "jobbad", route, body, field
    )


async def test_config_lists_both_kinds_and_an_ambiguous_route(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    llm_route = await _llm(
        admin, service, namespace, priority=10, maximumDeployment={"type": "replica", "value": 3}
    )
    job_route = await _job(admin, service, namespace)
    shared = f"shared-{namespace}"
    admin.create(crs.llm(namespace, "shared-llm", service_id=shared))
    admin.create(crs.job(namespace, "shared-job", service_id=shared))
    await service.eventually(lambda: len(service.indexed(shared)) == 2, what="both claims")

    items: dict[str, Any] = {}
    page = 1
    while True:
        body = (await service.get("/config", params={"page": page, "pageSize": 200})).json()
        items.update({i["route"]: i for i in body["items"]})
        if page * 200 >= body["total"]:
            break
        page += 1
    assert len(items) == body["total"]
    assert items[llm_route] == {
        "route": llm_route,
        "kind": "llm",
        "highPriority": True,
        "priority": 10,
        "minimumDeployment": {"type": "replica", "value": 1},
        "maximumDeployment": {"type": "replica", "value": 3},
    }
    assert items[job_route]["kind"] == "job"
    assert items[shared] == {
        "route": shared,
        "ambiguous": True,
        "kinds": ["job", "llm"],
        "count": 2,
    }
    listing = {"kind": "job", "pageSize": 200}
    listing["page"] = await service.config_page_of(job_route, kind="job")
    jobs = (await service.get("/config", params=listing)).json()
    kinds = {i.get("kind") for i in jobs["items"]}
    assert kinds <= {"job", None}
    assert job_route in {i["route"] for i in jobs["items"]}


async def test_a_route_claimed_by_an_llm_and_a_job_cr_is_409_everywhere(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    shared = f"twice-{namespace}"
    admin.create(crs.llm(namespace, "secret-llm-name", service_id=shared))
    admin.create(crs.job(namespace, "secret-job-name", service_id=shared))
    await service.eventually(lambda: len(service.indexed(shared)) == 2, what="both claims")
    for response in (
        await service.get(f"/routes/{shared}"),
        await service.put(f"/routes/{shared}", {"priority": 1}),
        await service.delete(f"/config/{shared}"),
    ):
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["code"] == "conflict"
        assert "2 CRs" in error["message"]
        assert "job" in error["message"]
        others = response.text.replace(shared, "<route>")
        assert "secret-" not in others
        assert namespace not in others


async def test_two_namespaces_claiming_a_route_is_409(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    other = f"{namespace}-b"
    admin.ensure_namespace(other)
    shared = f"twons-{namespace}"
    admin.create(crs.llm(namespace, "a", service_id=shared))
    admin.create(crs.llm(other, "a", service_id=shared))
    await service.eventually(lambda: len(service.indexed(shared)) == 2, what="both claims")
    response = await service.get(f"/routes/{shared}")
    assert response.status_code == 409
    assert other not in response.text.replace(shared, "<route>")


async def test_unknown_route_is_404_and_empty_service_id_is_not_listed(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    admin.create(crs.llm(namespace, "anon", service_id=""))
    marker = await _llm(admin, service, namespace, name="marker")
    missing = await service.get(f"/routes/nothing-{namespace}")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    listed = (await service.get("/config", params={"pageSize": 200})).json()
    assert "" not in {i["route"] for i in listed["items"]}
    assert (await service.get(f"/routes/{marker}")).status_code == 200


async def test_a_cr_deleted_behind_the_index_answers_404(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(admin, service, namespace, name="vanished")
    admin.delete(crs.SLO, "LLMSLORequirement", namespace, "vanished")
    response = await service.put(f"/routes/{route}", {"priority": 2})
    assert response.status_code == 404
    assert "vanished" not in response.json()["error"]["message"].replace(route, "")
