"""Writes land only on the CR that claims the route when they are applied, on the real API
server, while this replica's index has not seen the latest changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.admin import Admin, AdminError
from tests.integration import crs
from tests.integration.service import RunningService, running

pytestmark = pytest.mark.integration

KIND = "LLMSLORequirement"
TTFT = {
    "default": {"metrics": [{"type": "p90", "threshold": 0.8}]},
    "ranges": [{"contextLengthRangeLow": 0, "metrics": [{"type": "p90", "threshold": 0.5}]}],
}


async def _llm(admin: Admin, service: RunningService, namespace: str, route: str) -> None:
    admin.create(crs.llm(namespace, "cr", service_id=route, priority=2))
    await service.eventually(lambda: service.indexed(route), what=f"{route} indexed")


def _spec(admin: Admin, namespace: str) -> dict[str, Any]:
    spec: dict[str, Any] = admin.get(crs.SLO, KIND, namespace, "cr")["spec"]
    return spec


async def test_a_cr_whose_service_id_changed_behind_the_index_is_not_written(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route, other = f"a-{namespace}", f"b-{namespace}"
    await _llm(admin, service, namespace, route)
    async with service.watches_held():
        admin.merge_patch(crs.SLO, KIND, namespace, "cr", {"spec": {"serviceId": other}})
        assert service.indexed(route)  # the index still says route a
        put = await service.put(f"/routes/{route}", {"priority": 7})
        assert put.status_code == 404, put.text
        assert (await service.get(f"/routes/{route}")).status_code == 404
        assert (await service.delete(f"/routes/{route}")).status_code == 404
        assert _spec(admin, namespace)["priority"] == 2
        assert _spec(admin, namespace)["serviceId"] == other


async def test_a_cr_recreated_for_another_service_behind_the_index_is_not_written(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route, other = f"a-{namespace}", f"b-{namespace}"
    await _llm(admin, service, namespace, route)
    async with service.watches_held():
        admin.delete(crs.SLO, KIND, namespace, "cr")
        admin.create(crs.llm(namespace, "cr", service_id=other, priority=2))
        put = await service.put(f"/routes/{route}", {"priority": 7})
        assert put.status_code == 404, put.text
        assert _spec(admin, namespace)["priority"] == 2


async def test_a_cr_recreated_for_the_same_service_is_the_one_written(
    admin: Admin, namespace: str, service: RunningService
) -> None:
    route = f"a-{namespace}"
    await _llm(admin, service, namespace, route)
    async with service.watches_held():
        admin.delete(crs.SLO, KIND, namespace, "cr")
        recreated = admin.create(crs.llm(namespace, "cr", service_id=route, priority=2))
        put = await service.put(f"/routes/{route}", {"priority": 7})
        assert put.status_code == 200, put.text
        stored = admin.get(crs.SLO, KIND, namespace, "cr")
        assert stored["metadata"]["uid"] == recreated["metadata"]["uid"]
        assert stored["spec"]["priority"] == 7
        assert put.headers["etag"] == f'"{stored["metadata"]["resourceVersion"]}"'


async def test_a_patch_for_another_uid_is_refused_by_the_api_server(
    admin: Admin, namespace: str
) -> None:
    """The preconditions the write path relies on, straight against the API server: another
    CR's version is a 409 Conflict; another uid alone is a 422 on metadata.uid."""
    created = admin.create(crs.llm(namespace, "cr", service_id=f"a-{namespace}", priority=2))
    meta = created["metadata"]
    other_uid = "00000000-0000-0000-0000-000000000000"
    for precondition, status in (
        ({"uid": other_uid, "resourceVersion": str(int(meta["resourceVersion"]) - 1)}, 409),
        ({"uid": other_uid, "resourceVersion": meta["resourceVersion"]}, 422),
    ):
        with pytest.raises(AdminError) as caught:
            admin.merge_patch(
                crs.SLO, KIND, namespace, "cr", {"metadata": precondition, "spec": {"priority": 7}}
            )
        assert caught.value.status == status
        if status == 422:
            causes = caught.value.body["details"]["causes"]
            assert {c["field"] for c in causes} == {"metadata.uid"}
    assert _spec(admin, namespace)["priority"] == 2


async def test_a_section_replaces_ranges_another_replica_added(
    admin: Admin, namespace: str, service: RunningService, slo_api_kubeconfig: Path
) -> None:
    route = f"a-{namespace}"
    await _llm(admin, service, namespace, route)
    async with running(slo_api_kubeconfig) as other:
        await other.eventually(lambda: other.indexed(route), what="indexed by the other")
        async with service.watches_held():
            added = await other.put(f"/routes/{route}", {"ttft": TTFT})
            assert added.status_code == 200, added.text
            section = {"default": {"metrics": [{"type": "p50", "threshold": 0.3}]}}
            current_etag = added.headers["etag"]
            put = await service.put(
                f"/routes/{route}", {"ttft": section}, headers={"If-Match": current_etag}
            )
            assert put.status_code == 200, put.text
            assert _spec(admin, namespace)["ttft"] == section
            # And without If-Match the same holds.
            await other.put(f"/routes/{route}", {"ttft": TTFT})
            put = await service.put(f"/routes/{route}", {"ttft": section})
            assert put.status_code == 200, put.text
            assert _spec(admin, namespace)["ttft"] == section
