"""The route history earlier versions kept in ConfigMaps, carried over on a real API server:
what that version wrote, and nothing a namespace editor made since.

A control plane of its own: an upgrade finds the ConfigMaps older than the RouteRevision CRD,
so the CRD is deleted and made again after them (which no test on the shared one may do).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from controlplane.admin import Admin, AdminError
from controlplane.cluster import Cluster
from tests.integration import crs
from tests.integration.own import own_control_plane
from tests.integration.service import RunningService, running

pytestmark = pytest.mark.integration

CRD = "routerevisions.slo-api.modelsphere.dev"
REVISIONS = "slo-api.modelsphere.dev/v1alpha1"
LABEL = "slo-api.modelsphere.dev/history-of"
_probes = itertools.count(1)


own, own_admin, kubeconfig = own_control_plane("history-migration")


def _entry(n: int, route: str, **extra: Any) -> dict[str, Any]:
    """An entry as the earlier version wrote it."""
    return {
        "id": str(n),
        # Later changes later, as a resourceVersion and the clock go (the history orders by
        # time, then by id).
        "time": f"2025-12-01T00:{n % 60:02d}:00Z",
        "actor": "bob",
        "via": "slo-api",
        "requestId": f"r{n}",
        "changes": [{"field": "priority", "from": n - 1, "to": n}],
        "after": {"route": route, "kind": "llm", "priority": n},
        **extra,
    }


def _history_map(admin: Admin, cr: dict[str, Any], entries: list[Any]) -> dict[str, Any]:
    """The ConfigMap the earlier version kept `cr`'s history in: its name, label and owner."""
    meta = cr["metadata"]
    created: dict[str, Any] = admin.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"slo-history.llm.{meta['name']}",
                "namespace": meta["namespace"],
                "labels": {"app.kubernetes.io/managed-by": "slo-api", LABEL: "llm"},
                "ownerReferences": [
                    {
                        "apiVersion": crs.SLO,
                        "kind": "LLMSLORequirement",
                        "name": meta["name"],
                        "uid": meta["uid"],
                    }
                ],
            },
            "data": {"entries": json.dumps(entries)},
        }
    )
    return created


def _created(obj: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(obj["metadata"]["creationTimestamp"])


def _until_the_clock_passes(admin: Admin, ns: str, stamp: datetime) -> None:
    """Until the API server stamps a new object later than `stamp` (its creationTimestamps
    have a second's resolution): then a CRD made next is younger than what came before."""
    while True:
        probe = admin.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"clock-{next(_probes)}", "namespace": ns},
            }
        )
        admin.delete("v1", "ConfigMap", ns, probe["metadata"]["name"])
        if _created(probe) > stamp:
            return
        time.sleep(0.1)


def _revisions(admin: Admin, ns: str, uid: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = admin.request(
        "GET",
        admin.path(REVISIONS, "RouteRevision", ns),
        params={"labelSelector": f"slo-api.modelsphere.dev/uid={uid}"},
    )["items"]
    return [json.loads(r["data"]) for r in found]


def _config_map(admin: Admin, ns: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = admin.get("v1", "ConfigMap", ns, name)
    except AdminError as exc:
        if exc.status == 404:
            return None
        raise
    return found


async def _history(service: RunningService, route: str) -> list[dict[str, Any]]:
    got = await service.get(f"/routes/{route}/history")
    assert got.status_code == 200, got.text
    items: list[dict[str, Any]] = got.json()["items"]
    return items


async def test_an_upgrade_carries_what_the_earlier_version_wrote_and_nothing_made_since(
    own: Cluster, own_admin: Admin, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    admin = own_admin
    ns = "migrating"
    admin.ensure_namespace(ns)
    # As an upgrade finds them: the earlier version's CRs and ConfigMaps, then the CRD.
    admin.delete_crd(CRD)
    chat = admin.create(crs.llm(ns, "chat", service_id="m-chat", priority=5))
    mixed = admin.create(crs.llm(ns, "mixed", service_id="m-mixed", priority=2))
    target = admin.create(crs.llm(ns, "target", service_id="m-target", priority=0))
    _history_map(admin, chat, [_entry(n, "m-chat") for n in range(1, 6)])
    later = str(int(mixed["metadata"]["resourceVersion"]) + 1000)
    kept = _history_map(
        admin,
        mixed,
        [
            _entry(1, "m-mixed"),
            {**_entry(2, "m-mixed"), "id": "¹"},  # one bad entry: skipped, never blocking
            {**_entry(3, "m-mixed"), "id": later},  # after the CR's resourceVersion
            _entry(2, "m-mixed"),
        ],
    )
    _until_the_clock_passes(admin, ns, _created(kept))
    own.install_crds(only={CRD})
    # A write an old pod made during the rollout: a new replica saw it, and could only leave
    # a placeholder; the old pod's ConfigMap names the caller.
    seen = {
        **_entry(4, "m-chat"),
        "actor": "unknown",
        "requestId": None,
        "clientRequestId": None,
        "owners": {},
        "time": "2025-12-01T00:04:30Z",  # when the watch saw it, not what the ConfigMap says
    }
    chat_uid = chat["metadata"]["uid"]
    admin.create(
        {
            "apiVersion": REVISIONS,
            "kind": "RouteRevision",
            "metadata": {
                "name": f"{chat_uid}.4",
                "namespace": ns,
                "labels": {
                    "app.kubernetes.io/managed-by": "slo-api",
                    "slo-api.modelsphere.dev/uid": chat_uid,
                    "slo-api.modelsphere.dev/kind": "llm",
                },
                "ownerReferences": [
                    {
                        "apiVersion": crs.SLO,
                        "kind": "LLMSLORequirement",
                        "name": "chat",
                        "uid": chat_uid,
                    }
                ],
            },
            "data": json.dumps(seen),
        }
    )
    # What a namespace editor can make today: the old name, label and owner, and ids that
    # would outrank every real revision (and have them pruned).
    forged = _history_map(
        admin,
        target,
        [_entry(n, "m-target", actor="mallory") for n in (99999990, 99999991, 99999992)],
    )
    caplog.set_level(logging.WARNING, "slo_api.history")
    async with (
        running(kubeconfig, route_history_entries=3) as one,
        running(kubeconfig, route_history_entries=3) as two,
    ):
        name = forged["metadata"]["name"]
        await one.eventually(
            lambda: _config_map(admin, ns, "slo-history.llm.chat") is None,
            within=60,
            what="the earlier version's ConfigMap carried and deleted",
        )
        # Both replicas decided on the forged one and on the one with bad entries.
        await one.eventually(
            lambda: (
                sum(f"{ns}/{name} left alone" in r.getMessage() for r in caplog.records) >= 2
                and sum("slo-history.llm.mixed kept" in r.getMessage() for r in caplog.records) >= 2
            ),
            within=60,
            what="both migrations done",
        )
        for replica in (one, two):
            carried = await _history(replica, "m-chat")
            assert [(e["id"], e["actor"], e["migrated"]) for e in carried] == [
                (str(n), "bob", True) for n in (5, 4, 3)
            ]
            # The placeholder gave way: the caller, with what the watch saw.
            assert (carried[1]["requestId"], carried[1]["time"]) == ("r4", seen["time"])
            assert [e["id"] for e in await _history(replica, "m-mixed")] == ["2", "1"]
            assert await _history(replica, "m-target") == []
        # The forged ConfigMap is left as it is, for whoever made it; the one with bad
        # entries too, its good entries carried.
        assert _config_map(admin, ns, name) == forged
        assert _config_map(admin, ns, "slo-history.llm.mixed") == kept
        assert _revisions(admin, ns, target["metadata"]["uid"]) == []
        # One revision per entry: the copy made while replacing the placeholder is gone.
        assert sorted(e["id"] for e in _revisions(admin, ns, chat_uid)) == ["1", "2", "3", "4", "5"]
        assert len(_revisions(admin, ns, mixed["metadata"]["uid"])) == 2
        # Real changes: none is pruned in favour of what the forged ConfigMap claims.
        for priority in (1, 2, 3, 4):
            put = await one.put("/routes/m-target", {"priority": priority})
            assert put.status_code == 200, put.text
        real = await _history(one, "m-target")
        assert [(e["after"]["priority"], e["migrated"]) for e in real] == [
            (4, False),
            (3, False),
            (2, False),
        ]
        assert all(e["actor"] != "mallory" for e in real)


def test_slo_api_may_read_the_revision_crd_s_age_and_no_other_crd_nor_a_config_map(
    own: Cluster, own_admin: Admin
) -> None:
    own_admin.ensure_namespace("grants")
    own_admin.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "someone-s", "namespace": "grants"},
            "data": {"secret": "not slo-api's"},
        }
    )
    slo_api = own.slo_api_client()
    try:
        crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        assert slo_api.request("GET", f"{crds}/{CRD}")["metadata"]["name"] == CRD
        for where in (
            f"{crds}/llmslorequirements.inference.modelsphere.dev",
            crds,
            "/api/v1/namespaces/grants/configmaps/someone-s",
        ):
            with pytest.raises(AdminError) as refused:
                slo_api.request("GET", where)
            assert refused.value.status == 403, where
    finally:
        slo_api.close()
