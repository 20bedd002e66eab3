"""ModelPool routes through HTTP, against the real API server (status via the subresource)."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration.service import RunningService

pytestmark = pytest.mark.integration

STATUS = {
    "phase": "Ready",
    "residentMember": "chat",
    "pendingMember": "",
    "members": [
        {"name": "chat", "phase": "Ready", "resident": True},
        {"name": "code", "phase": "Idle", "resident": False},
    ],
}


async def _pool(
    admin: Admin,
    service: RunningService,
    namespace: str,
    name: str = "slot",
    members: tuple[str, ...] = ("chat", "code"),
    **spec: Any,
) -> str:
    route = f"{name}-{namespace}"
    admin.create(crs.pool(namespace, route, list(members), nodeSelector={"gpu": "a100"}, **spec))
    admin.merge_patch(
        crs.POOL, "ModelPool", namespace, route, {"status": STATUS}, subresource="status"
    )
    await service.eventually(
        lambda: any(o.get("status") for _, o in service.indexed(route)), what="pool status"
    )
    return route


def _stored(admin: Admin, namespace: str, route: str) -> dict[str, Any]:
    obj: dict[str, Any] = admin.get(crs.POOL, "ModelPool", namespace, route)
    return obj


async def test_pool_get_shape_with_status(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _pool(admin, service, namespace, default="chat")
    response = await service.get(f"/routes/{route}")
    assert response.status_code == 200
    assert response.json() == {
        "route": route,
        "kind": "pool",
        "pool": {
            "members": ["chat", "code"],
            "default": "chat",
            "swapPolicy": "sticky",
            "swapBudget": "300s",
            "gpu": 1,
        },
        "status": {
            "phase": "Ready",
            "residentMember": "chat",
            "pendingMember": None,
            "members": [
                {"name": "chat", "phase": "Ready", "resident": True},
                {"name": "code", "phase": "Idle", "resident": False},
            ],
        },
    }
    assert response.headers["etag"].startswith('"')


async def test_each_writable_field_round_trips_and_the_rest_survives(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _pool(admin, service, namespace)
    for settings in (
        {"default": "code"},
        {"swapBudget": "1h30m"},
        {"reclaimAfter": "45s"},
        {"swapPolicy": "sticky"},
        {"default": None},
        {"reclaimAfter": None},
    ):
        response = await service.put(f"/routes/{route}", {"route": route, "pool": settings})
        assert response.status_code == 200, response.text
        for key, value in settings.items():
            # An unset optional field is left out of the body.
            assert response.json()["pool"].get(key) == value
            assert (await service.get(f"/routes/{route}")).json()["pool"].get(key) == value
    stored = _stored(admin, namespace, route)
    assert stored["spec"]["nodeSelector"] == {"gpu": "a100"}
    assert [m["inferenceServiceRef"]["name"] for m in stored["spec"]["members"]] == ["chat", "code"]
    assert stored["status"]["residentMember"] == "chat"


async def test_a_get_body_echoed_back_is_accepted(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _pool(admin, service, namespace)
    body = (await service.get(f"/routes/{route}")).json()
    body["pool"]["swapBudget"] = "90s"
    response = await service.put(f"/routes/{route}", body)
    assert response.status_code == 200, response.text
    assert response.json()["pool"]["swapBudget"] == "90s"


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"swapBudget": "5 minutes"}, "pool.swapBudget"),
        ({"swapBudget": "0s"}, "pool.swapBudget"),
        ({"swapBudget": "-5m"}, "pool.swapBudget"),
        ({"swapBudget": 300}, "pool.swapBudget"),
        ({"reclaimAfter": "soon"}, "pool.reclaimAfter"),
        ({"default": "not-a-member"}, "pool.default"),
        ({"members": ["chat"]}, "pool.members"),
        ({"gpu": 2}, "pool.gpu"),
        ({"swapPolicy": "fifo"}, "pool.swapPolicy"),
        ({"swapPolicy": None}, "pool.swapPolicy"),
        ({"nodeSelector": {"gpu": "h100"}}, "pool.nodeSelector"),
    ],
)
async def test_bad_pool_settings_are_400_with_the_field(
    admin: Admin, namespace: str, service: RunningService, settings: dict[str, Any], field: str
) -> None:
    route = await _pool(admin, service, namespace, name="bad")
    before = _stored(admin, namespace, route)["spec"]
    response = await service.put(f"/routes/{route}", {"pool": settings})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field
    assert _stored(admin, namespace, route)["spec"] == before


async def test_a_stale_status_is_ignored_and_a_changed_kind_refused(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _pool(admin, service, namespace, name="ro")
    body = (await service.get(f"/routes/{route}")).json()
    # status changes on its own (swaps): an echoed copy, stale or not, is never written.
    changed = {**body, "status": {**body["status"], "residentMember": "code"}}
    response = await service.put(f"/routes/{route}", changed)
    assert response.status_code == 200, response.text
    assert response.json()["status"]["residentMember"] == "chat"
    assert _stored(admin, namespace, route)["status"]["residentMember"] == "chat"
    wrong_kind = await service.put(f"/routes/{route}", {"kind": "llm"})
    assert wrong_kind.status_code == 400
    assert wrong_kind.json()["error"]["field"] == "kind"


async def test_reclaim_refused_by_the_crd_is_400_with_its_reason_and_no_names(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _pool(admin, service, namespace, name="policy")
    response = await service.put(f"/routes/{route}", {"pool": {"swapPolicy": "reclaim"}})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["field"] == "pool.swapPolicy"
    assert "sticky" in error["message"]  # the API server's reason: the supported values
    assert "ModelPool" not in response.text
    assert namespace not in response.text.replace(route, "<route>")


async def test_delete_resets_pool_settings(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _pool(
        admin,
        service,
        namespace,
        name="reset",
        default="code",
        swapBudget="20m",
        reclaimAfter="10m",
        gpu=2,
    )
    response = await service.delete(f"/routes/{route}")
    assert response.status_code == 204
    spec = _stored(admin, namespace, route)["spec"]
    assert spec["swapPolicy"] == "sticky"
    assert spec["swapBudget"] == "300s"
    assert "default" not in spec
    assert "reclaimAfter" not in spec
    assert spec["gpu"] == 2
    assert spec["nodeSelector"] == {"gpu": "a100"}
    assert _stored(admin, namespace, route)["status"]["phase"] == "Ready"


async def test_pool_in_config_and_on_its_members_routes(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    chat, code = f"chat-{namespace}", f"code-{namespace}"
    admin.create(crs.llm(namespace, "chat", service_id=chat))
    admin.create(crs.job(namespace, "code", service_id=code))
    route = await _pool(admin, service, namespace, members=(chat, code))
    admin.merge_patch(
        crs.POOL,
        "ModelPool",
        namespace,
        route,
        {"status": {"residentMember": chat}},
        subresource="status",
    )
    await service.eventually(lambda: service.indexed(code), what="job indexed")

    async def resident_shown() -> bool:
        body = (await service.get(f"/routes/{chat}")).json()
        return bool(body["pool"] == {"route": route, "resident": True, "phase": "Ready"})

    await service.eventually(resident_shown, what="pool on the member's route")
    job_body = (await service.get(f"/routes/{code}")).json()
    assert job_body["pool"] == {"route": route, "resident": False, "phase": "Ready"}
    pools = (await service.get("/config", params={"kind": "pool", "pageSize": 200})).json()
    mine = [i for i in pools["items"] if i["route"] == route]
    assert mine == [
        {
            "route": route,
            "kind": "pool",
            "swapPolicy": "sticky",
            "swapBudget": "300s",
            "residentMember": chat,
        }
    ]
    # A member route's body echoed back (with its read-only pool) is accepted.
    echoed = await service.put(f"/routes/{code}", job_body)
    assert echoed.status_code == 200, echoed.text


async def test_a_pool_and_an_llm_cr_with_the_same_name_are_409(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _pool(admin, service, namespace, name="clash")
    admin.create(crs.llm(namespace, "clash-llm", service_id=route))
    await service.eventually(lambda: len(service.indexed(route)) == 2, what="two claims")
    response = await service.get(f"/routes/{route}")
    assert response.status_code == 409
    assert "llm" in response.json()["error"]["message"]
    assert "pool" in response.json()["error"]["message"]
