"""ETags, conditional requests, dry runs and two replicas, against the real API server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from controlplane.admin import Admin
from tests.integration import crs
from tests.integration.service import RunningService, running

pytestmark = pytest.mark.integration


async def _llm(admin: Admin, service: RunningService, namespace: str, **spec: Any) -> str:
    route = f"safe-{namespace}"
    admin.create(crs.llm(namespace, "safe", service_id=route, **spec))
    await service.eventually(lambda: service.indexed(route), what="indexed")
    return route


def _stored(admin: Admin, namespace: str) -> dict[str, Any]:
    obj: dict[str, Any] = admin.get(crs.SLO, "LLMSLORequirement", namespace, "safe")
    return obj


async def test_stale_if_match_is_412_and_changes_nothing(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(admin, service, namespace)
    etag = (await service.get(f"/routes/{route}")).headers["etag"]
    admin.merge_patch(crs.SLO, "LLMSLORequirement", namespace, "safe", {"spec": {"priority": 3}})
    response = await service.put(f"/routes/{route}", {"priority": 9}, headers={"If-Match": etag})
    assert response.status_code == 412
    assert response.json()["error"]["code"] == "precondition_failed"
    assert "read it again" in response.json()["error"]["message"]
    assert _stored(admin, namespace)["spec"]["priority"] == 3
    stale_delete = await service.delete(f"/routes/{route}", headers={"If-Match": etag})
    assert stale_delete.status_code == 412
    assert _stored(admin, namespace)["spec"]["priority"] == 3


async def test_current_if_match_succeeds_and_returns_the_new_etag(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(admin, service, namespace)
    etag = (await service.get(f"/routes/{route}")).headers["etag"]
    response = await service.put(f"/routes/{route}", {"priority": 9}, headers={"If-Match": etag})
    assert response.status_code == 200
    new = response.headers["etag"]
    assert new != etag
    assert new == f'"{_stored(admin, namespace)["metadata"]["resourceVersion"]}"'
    again = await service.put(f"/routes/{route}", {"priority": 8}, headers={"If-Match": new})
    assert again.status_code == 200
    star = await service.delete(f"/routes/{route}", headers={"If-Match": "*"})
    assert star.status_code == 204


async def test_if_match_star_on_a_missing_route_is_404(
    service: RunningService, namespace: str
) -> None:
    response = await service.put(
        f"/routes/none-{namespace}", {"priority": 1}, headers={"If-Match": "*"}
    )
    assert response.status_code == 404


async def test_malformed_if_match_is_400(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(admin, service, namespace)
    response = await service.put(f"/routes/{route}", {"priority": 1}, headers={"If-Match": "12345"})
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "If-Match"


async def test_if_none_match_on_a_route_and_on_config(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(admin, service, namespace)
    first = await service.get(f"/routes/{route}")
    unchanged = await service.get(
        f"/routes/{route}", headers={"If-None-Match": first.headers["etag"]}
    )
    assert unchanged.status_code == 304
    assert unchanged.content == b""
    listing = {"pageSize": 200, "page": await service.config_page_of(route)}
    page = await service.get("/config", params=listing)
    etag = page.headers["etag"]
    assert etag.startswith('W/"')
    assert (
        await service.get("/config", params=listing, headers={"If-None-Match": etag})
    ).status_code == 304

    assert (await service.put(f"/routes/{route}", {"priority": 4})).status_code == 200
    changed = await service.get(
        f"/routes/{route}", headers={"If-None-Match": first.headers["etag"]}
    )
    assert changed.status_code == 200
    assert changed.json()["priority"] == 4
    after = await service.get("/config", params=listing, headers={"If-None-Match": etag})
    assert after.status_code == 200


async def test_dry_run_validates_fully_and_stores_nothing(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(admin, service, namespace)
    before = _stored(admin, namespace)
    bad = await service.put(
        f"/routes/{route}?dryRun=true", {"maximumDeployment": {"type": "pdengine", "value": 1}}
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["field"].startswith("maximumDeployment")
    good = await service.put(
        f"/routes/{route}?dryRun=true", {"priority": 10, "maximumDeployment": {"value": 7}}
    )
    assert good.status_code == 200
    assert good.json()["priority"] == 10
    assert good.json()["maximumDeployment"] == {"type": "replica", "value": 7}
    reset = await service.delete(f"/routes/{route}?dryRun=true")
    assert reset.status_code == 200
    assert reset.json()["priority"] == 0
    after = _stored(admin, namespace)
    assert after["spec"] == before["spec"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    # Nothing of the dry run was written through to the index...
    ((_, indexed),) = service.indexed(route)
    assert indexed["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    # ...nor arrives later: once a later write is seen, the index and a read hold the spec of
    # before the dry runs.
    await service.barrier(admin, route, namespace, "safe")
    ((_, indexed),) = service.indexed(route)
    assert indexed["spec"] == before["spec"]
    assert (await service.get(f"/routes/{route}")).json()["priority"] == before["spec"]["priority"]


async def test_two_writers_of_different_fields_both_land(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(admin, service, namespace)
    results = await asyncio.gather(
        *[
            service.put(f"/routes/{route}", body)
            for body in (
                {"priority": 6},
                {"maximumDeployment": {"value": 9}},
                {"ttft": {"default": {"metrics": [{"type": "p50", "threshold": 0.3}]}}},
                {"otps": {"default": {"metrics": [{"type": "avg", "threshold": 15}]}}},
            )
        ]
    )
    assert [r.status_code for r in results] == [200, 200, 200, 200]
    spec = _stored(admin, namespace)["spec"]
    assert spec["priority"] == 6
    assert spec["maximumDeployment"]["value"] == 9
    assert spec["ttft"]["default"]["metrics"][0]["type"] == "p50"
    assert spec["otps"]["default"]["metrics"][0]["threshold"] == 15


async def test_write_through_one_replica_reads_through_another(
    admin: Admin, namespace: str, service: RunningService, slo_api_kubeconfig: Path
) -> None:
    route = await _llm(admin, service, namespace)
    async with running(slo_api_kubeconfig) as other:
        await other.eventually(lambda: other.indexed(route), what="indexed on B")
        written = await service.put(
            f"/routes/{route}", {"priority": 7, "maximumDeployment": {"value": 2}}
        )
        assert written.status_code == 200
        read = await other.get(f"/routes/{route}")
        assert read.json()["priority"] == 7
        assert read.headers["etag"] == written.headers["etag"]

        listing = {"pageSize": 200, "page": await other.config_page_of(route)}

        async def listed() -> bool:
            page = (await other.get("/config", params=listing)).json()
            return any(i["route"] == route and i["priority"] == 7 for i in page["items"])

        await other.eventually(listed, what="B's /config follows the watch")


async def test_the_writer_reads_its_own_write_in_config_at_once(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = await _llm(admin, service, namespace)
    listing = {"pageSize": 200, "page": await service.config_page_of(route)}
    assert (await service.put(f"/routes/{route}", {"priority": 5})).status_code == 200
    page = (await service.get("/config", params=listing)).json()
    assert [i["priority"] for i in page["items"] if i["route"] == route] == [5]
