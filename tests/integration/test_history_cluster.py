"""A route's history on the real API server: attribution, once per change, shared by replicas,
durable across restarts, bounded, gone with its CR, read under the route's access rule, and
sloctl's revert."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from controlplane.admin import Admin, AdminError
from controlplane.cluster import Cluster
from slo_api.cli import commands
from slo_api.cli.client import SloClient
from slo_api.cli.errors import CliError, ExitCode
from tests.integration import crs
from tests.integration.process import TOKEN as PROCESS_TOKEN
from tests.integration.process import start_process
from tests.integration.service import RunningService, running
from tests.integration.tcpproxy import TcpProxy
from tests.integration.test_watch_stream import Stream, initial, served

pytestmark = pytest.mark.integration

RBAC = "rbac.authorization.k8s.io/v1"
REVISIONS = "slo-api.modelsphere.dev/v1alpha1"
_ids = itertools.count(1)


def _setup(admin: Admin) -> tuple[str, str, dict[str, str]]:
    """A namespace with one LLM route, and tokens of an editor (slo-api-edit there) and of an
    identity with no grant at all."""
    run = f"h{os.getpid() % 10000}-{next(_ids)}"
    ns, people = run, f"{run}-people"
    for name in (ns, people):
        admin.ensure_namespace(name)
    admin.create(crs.llm(ns, "chat", service_id=f"{run}-chat", priority=1))
    for who in ("editor", "nobody"):
        admin.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": who, "namespace": people},
            }
        )
    admin.create(
        {
            "apiVersion": RBAC,
            "kind": "RoleBinding",
            "metadata": {"name": "editor", "namespace": ns},
            "roleRef": {
                "apiGroup": RBAC.split("/")[0],
                "kind": "ClusterRole",
                "name": "slo-api-edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "editor", "namespace": people}],
        }
    )
    tokens = {w: admin.service_account_token(people, w) for w in ("editor", "nobody")}
    return ns, f"{run}-chat", tokens


def _patch_around(admin: Admin, ns: str, patch: dict[str, Any], manager: str) -> None:
    """A direct merge patch by another field manager (as kubectl or a GitOps tool would)."""
    admin.request(
        "PATCH",
        admin.path(crs.SLO, "LLMSLORequirement", ns, "chat"),
        patch,
        "application/merge-patch+json",
        params={"fieldManager": manager},
    )


def _revisions(admin: Admin, ns: str, uid: str) -> list[dict[str, Any]]:
    """The RouteRevisions of a CR, read as the cluster admin."""
    found: list[dict[str, Any]] = admin.request(
        "GET",
        admin.path(REVISIONS, "RouteRevision", ns),
        params={"labelSelector": f"slo-api.modelsphere.dev/uid={uid}"},
    )["items"]
    return found


def _indexed(service: RunningService, route: str) -> Any:
    return lambda: service.indexed(route)


async def _history(service: RunningService, route: str, **kwargs: Any) -> dict[str, Any]:
    got = await service.get(f"/routes/{route}/history", **kwargs)
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body


async def test_every_change_is_recorded_once_with_who_made_it(
    admin: Admin, slo_api_kubeconfig: Path
) -> None:
    ns, route, tokens = _setup(admin)
    async with (
        running(slo_api_kubeconfig, slo_api_kubernetes_auth=True) as one,
        running(slo_api_kubeconfig, slo_api_kubernetes_auth=True) as two,
    ):
        for replica in (one, two):
            await replica.eventually(_indexed(replica, route), what="indexed")
        put = await one.put(f"/routes/{route}", {"priority": 3}, headers={"X-Request-Id": "rq-1"})
        assert put.status_code == 200, put.text
        editor = {"Authorization": f"Bearer {tokens['editor']}"}
        put = await two.client.put(
            f"/routes/{route}",
            json={"maximumDeployment": {"type": "replica", "value": 4}},
            headers={**editor, "X-Request-Id": "rq-2"},
        )
        assert put.status_code == 200, put.text
        _patch_around(admin, ns, {"spec": {"priority": 7}}, "kubectl-patch")

        async def three_recorded() -> bool:
            return bool((await _history(one, route))["total"] >= 3)

        await one.eventually(three_recorded, what="three entries")
        history = await _history(one, route)
        assert history["total"] == 3, history
        around, by_editor, by_token = history["items"]
        assert (by_token["actor"], by_token["via"], by_token["clientRequestId"]) == (
            "token:write",
            "slo-api",
            "rq-1",
        )
        assert len(by_token["requestId"]) == 32  # slo-api's own id of the request
        assert by_token["changes"] == [{"field": "priority", "from": 1, "to": 3}]
        assert by_editor["actor"] == f"system:serviceaccount:{ns}-people:editor"
        assert (by_editor["via"], by_editor["clientRequestId"]) == ("slo-api", "rq-2")
        assert by_editor["changes"] == [
            {"field": "maximumDeployment", "from": None, "to": {"type": "replica", "value": 4}}
        ]
        assert (around["actor"], around["via"], around["requestId"]) == (
            "kubectl-patch",
            "kubectl-patch",
            None,
        )
        assert around["changes"] == [{"field": "priority", "from": 3, "to": 7}]
        assert around["after"]["priority"] == 7
        assert around["after"]["maximumDeployment"] == {"type": "replica", "value": 4}

        # Both replicas saw the change around slo-api: once in the history, the same on each.
        # (Both have stored or skipped it once their informers moved past it.)
        def two_current() -> bool:
            held = two.runtime.index.get("llmslorequirements", ns, "chat")
            return held is not None and held["spec"]["priority"] == 7

        await two.eventually(two_current, what="second replica current")
        await two.runtime.history.close()
        await one.runtime.history.close()
        assert await _history(two, route) == await _history(one, route)
        assert (await _history(two, route))["total"] == 3
        # A caller who may not read the route gets what it gets for the route itself.
        nobody = {"Authorization": f"Bearer {tokens['nobody']}"}
        as_route = await one.client.get(f"/routes/{route}", headers=nobody)
        as_history = await one.client.get(f"/routes/{route}/history", headers=nobody)
        assert as_route.status_code == as_history.status_code == 404
        assert as_history.json() == as_route.json()
        # Stored where docs/api.md says: one RouteRevision per change in the CR's namespace,
        # named by its uid and version, owned by the CR.
        cr = admin.get(crs.SLO, "LLMSLORequirement", ns, "chat")
        uid = cr["metadata"]["uid"]
        revisions = _revisions(admin, ns, uid)
        assert sorted(r["metadata"]["name"] for r in revisions) == sorted(
            f"{uid}.{e['id']}" for e in history["items"]
        )
        assert all(r["metadata"]["ownerReferences"][0]["uid"] == uid for r in revisions)
    # Durable: a fresh process reads the same history.
    async with running(slo_api_kubeconfig) as again:
        await again.eventually(_indexed(again, route), what="indexed")
        assert (await _history(again, route)) == history | {"total": 3}


async def test_the_bound_holds_and_the_history_goes_with_its_cr(
    admin: Admin, slo_api_kubeconfig: Path
) -> None:
    ns, route, _ = _setup(admin)
    async with running(slo_api_kubeconfig, route_history_entries=3) as service:
        await service.eventually(_indexed(service, route), what="indexed")
        for priority in range(2, 8):
            assert (await service.put(f"/routes/{route}", {"priority": priority})).is_success
        history = await _history(service, route)
        assert history["total"] == 3
        assert [e["after"]["priority"] for e in history["items"]] == [7, 6, 5]
        uid = admin.get(crs.SLO, "LLMSLORequirement", ns, "chat")["metadata"]["uid"]
        await service.runtime.history.close()
        # Pruned in the store too: past generation 4 (the bound + 1), each revision stored
        # is followed by a prune to the bound.
        assert len(_revisions(admin, ns, uid)) == 3
        # A route that never changed has no revision at all.
        admin.create(crs.llm(ns, "quiet", service_id=f"{route}-quiet"))
        await service.eventually(lambda: service.indexed(f"{route}-quiet"), what="quiet")
        assert (await _history(service, f"{route}-quiet"))["total"] == 0
    admin.delete(crs.SLO, "LLMSLORequirement", ns, "chat")

    def collected() -> bool:
        # The garbage collector (kube-controller-manager) removes them with their CR.
        return not _revisions(admin, ns, uid)

    async with running(slo_api_kubeconfig) as service:
        await service.eventually(collected, within=60, what="the history collected with its CR")


async def test_with_two_replicas_a_reset_names_its_caller_and_the_bound_holds(
    admin: Admin, slo_api_kubeconfig: Path, cluster: Cluster, tmp_path: Path
) -> None:
    ns, route, _ = _setup(admin)
    settings = {"route_history_entries": 3, "upstream_timeout_seconds": 3}
    async with TcpProxy("127.0.0.1", cluster.plane.port) as proxy:
        lagging = proxy.kubeconfig(slo_api_kubeconfig, tmp_path / "lagging.kubeconfig")
        async with (
            running(slo_api_kubeconfig, **settings) as one,
            running(lagging, **settings) as two,
        ):
            await _reset_through_the_lagging_one(admin, ns, route, one, two, proxy)


async def _reset_through_the_lagging_one(
    admin: Admin, ns: str, route: str, one: RunningService, two: RunningService, proxy: TcpProxy
) -> None:
    for replica in (one, two):
        await replica.eventually(_indexed(replica, route), what="indexed")
    # Changes through either replica in turn, each stored by its writer; then one around
    # slo-api that leaves what a reset sets (and takes priority from slo-api).
    for priority, replica in zip((2, 3, 4, 5, 6), itertools.cycle((one, two)), strict=False):
        assert (await replica.put(f"/routes/{route}", {"priority": priority})).is_success
    reset_values = {"priority": 0, "minimumDeployment": {"type": "replica", "value": 1}}
    _patch_around(admin, ns, {"spec": reset_values}, "kubectl-patch")
    ttft = {"default": {"metrics": [{"type": "p90", "threshold": 0.5}]}}
    assert (await one.put(f"/routes/{route}", {"ttft": ttft})).is_success
    # The reset sets to null the only field slo-api held: its managedFields entry goes,
    # and the change names no manager.
    # Made through the replica whose API server answers and events come late: the other
    # sees the change first.
    proxy.delay = 0.5
    reset = await two.delete(f"/routes/{route}", headers={"X-Request-Id": "reset-1"})
    assert reset.status_code == 204, reset.text
    cr = admin.get(crs.SLO, "LLMSLORequirement", ns, "chat")
    assert "slo-api" not in [m.get("manager") for m in cr["metadata"]["managedFields"]]
    version = cr["metadata"]["resourceVersion"]

    async def reset_seen() -> bool:
        items = (await _history(two, route))["items"]
        return bool(items) and items[0]["id"] == version

    await two.eventually(reset_seen, within=60, what="the reset recorded")
    proxy.delay = 0
    for replica in (one, two):  # every recording under way, grace included, is over
        await replica.runtime.history.close()
    history = await _history(one, route)
    assert await _history(two, route) == history
    newest = history["items"][0]
    assert (newest["actor"], newest["via"], newest["clientRequestId"]) == (
        "token:write",
        "slo-api",
        "reset-1",
    )
    assert newest["changes"] == [{"field": "ttft", "from": ttft, "to": None}]
    # Eight changes, recorded by either replica: the store holds the newest 3, no more.
    uid = cr["metadata"]["uid"]
    assert len(_revisions(admin, ns, uid)) == history["total"] == 3


class _Racing(SloClient):
    """A client whose read is followed at once by someone else's change (a concurrent edit)."""

    def __init__(self, admin: Admin, ns: str, *args: Any) -> None:
        super().__init__(*args)
        self.admin, self.ns, self.race = admin, ns, False

    def get(self, route: str) -> tuple[dict[str, Any], str | None]:
        answer = super().get(route)
        if self.race:
            _patch_around(self.admin, self.ns, {"spec": {"priority": 9}}, "kubectl-edit")
        return answer


async def test_sloctl_revert_restores_an_entry_and_refuses_on_a_concurrent_change(
    admin: Admin, slo_api_kubeconfig: Path, tmp_path: Path
) -> None:
    ns, route, _ = _setup(admin)
    process = await start_process(slo_api_kubeconfig, tmp_path)
    try:
        with SloClient(process.url, PROCESS_TOKEN, 10.0) as plain:
            assert plain.put(route, {"priority": 2})["priority"] == 2
            first = plain.history(route)[0]["id"]
            ttft = {"default": {"metrics": [{"type": "p90", "threshold": 1}]}}
            assert plain.put(route, {"priority": 5, "ttft": ttft})["priority"] == 5
            args = argparse.Namespace(route=route, entry=first, dry_run=False, output="json")
            assert commands.cmd_revert(plain, args) == ExitCode.OK
            restored, _ = plain.get(route)
            assert restored["priority"] == 2
            assert "ttft" not in restored
            # The revert is itself a change in the history, by its caller.
            assert plain.history(route)[0]["changes"][0] == {
                "field": "priority",
                "from": 5,
                "to": 2,
            }
            plain.put(route, {"priority": 6})
        racing = _Racing(admin, ns, process.url, PROCESS_TOKEN, 10.0)
        try:
            racing.race = True
            # A change between revert's read and its write: a clear refusal, nothing written.
            with pytest.raises(CliError) as refused:
                commands.cmd_revert(racing, args)
            assert refused.value.exit_code == ExitCode.CONFLICT
            assert refused.value.status == 412
            racing.race = False
            assert racing.get(route)[0]["priority"] == 9
        finally:
            racing.close()
    finally:
        process.proc.terminate()
        process.proc.wait(timeout=30)


async def test_stream_events_of_a_recorded_change_say_who_made_it(
    admin: Admin, slo_api_kubeconfig: Path
) -> None:
    ns, route, _ = _setup(admin)
    async with served(slo_api_kubeconfig) as (service, client):
        await service.eventually(_indexed(service, route), what="indexed")
        request = client.build_request("GET", "/config", params={"watch": "true"})
        response = await client.send(request, stream=True)
        try:
            assert response.status_code == 200, await response.aread()
            stream = Stream(response)
            await stream.until(initial)
            put = await client.put(
                f"/routes/{route}", json={"priority": 3}, headers={"X-Request-Id": "rq-9"}
            )
            assert put.status_code == 200, put.text

            def priority(value: int) -> Any:
                return lambda e: e["type"] == "MODIFIED" and e["object"]["priority"] == value

            mine = (await stream.until(priority(3)))[-1]
            _patch_around(admin, ns, {"spec": {"priority": 7}}, "kubectl-patch")
            around = (await stream.until(priority(7)))[-1]
        finally:
            await response.aclose()
    assert mine["by"]["clientRequestId"] == "rq-9"
    assert (mine["by"]["actor"], mine["by"]["via"]) == ("token:write", "slo-api")
    assert around["by"] == {
        "actor": "kubectl-patch",
        "via": "kubectl-patch",
        "requestId": None,
        "clientRequestId": None,
    }


async def _recorded(service: RunningService, route: str, total: int) -> dict[str, Any]:
    """The route's history once it holds `total` entries, after every recording under way
    (grace periods included) has ended: what is there then is all there will be."""

    async def enough() -> bool:
        return bool((await _history(service, route))["total"] >= total)

    await service.eventually(enough, within=60, what=f"{total} entries")
    await service.runtime.history.close()
    return await _history(service, route)


async def test_a_kubectl_edit_just_before_a_put_is_two_entries_with_their_actors(
    admin: Admin, slo_api_kubeconfig: Path
) -> None:
    ns, route, _ = _setup(admin)
    async with running(slo_api_kubeconfig) as service:
        await service.eventually(_indexed(service, route), what="indexed")
        _patch_around(admin, ns, {"spec": {"priority": 4}}, "kubectl-edit")
        ttft = {"default": {"metrics": [{"type": "p90", "threshold": 0.5}]}}
        put = await service.put(f"/routes/{route}", {"ttft": ttft}, headers={"X-Request-Id": "x"})
        assert put.status_code == 200, put.text
        history = await _recorded(service, route, 2)
    put_entry, edit_entry = history["items"]
    assert history["total"] == 2, history
    assert (edit_entry["actor"], edit_entry["via"]) == ("kubectl-edit", "kubectl-edit")
    assert edit_entry["changes"] == [{"field": "priority", "from": 1, "to": 4}]
    assert (put_entry["actor"], put_entry["clientRequestId"]) == ("token:write", "x")
    assert put_entry["changes"] == [{"field": "ttft", "from": None, "to": ttft}]
    assert put_entry["after"]["priority"] == 4
    assert put_entry["id"] == put.headers["ETag"].strip('"')


async def test_a_removal_around_slo_api_is_unknown_and_a_claimed_slo_api_change_is_kept(
    admin: Admin, slo_api_kubeconfig: Path
) -> None:
    ns, route, _ = _setup(admin)
    bound = {"type": "replica", "value": 4}
    _patch_around(admin, ns, {"spec": {"maximumDeployment": bound}}, "helm")
    async with running(slo_api_kubeconfig, upstream_timeout_seconds=3) as service:
        await service.eventually(_indexed(service, route), what="indexed")
        # kubectl edit removes it: helm owned nothing else (its entry goes), kubectl keeps none.
        _patch_around(admin, ns, {"spec": {"maximumDeployment": None}}, "kubectl-edit")
        # A write claiming to be slo-api's that no replica made.
        _patch_around(admin, ns, {"spec": {"priority": 8}}, "slo-api")
        history = await _recorded(service, route, 2)
    claimed, removed, *earlier = history["items"]
    # Another replica watching the cluster (another test's slo-api) may have seen helm's
    # change, made before this one started: one entry more, and only that one.
    assert [(e["via"], [c["field"] for c in e["changes"]]) for e in earlier] in (
        [],
        [("helm", ["maximumDeployment"])],
    ), history
    assert history["total"] == 2 + len(earlier), history
    assert (removed["actor"], removed["via"]) == ("unknown", "unknown")
    assert removed["changes"] == [{"field": "maximumDeployment", "from": bound, "to": None}]
    assert (claimed["actor"], claimed["via"], claimed["requestId"]) == ("unknown", "slo-api", None)
    assert claimed["changes"] == [{"field": "priority", "from": 1, "to": 8}]


async def test_a_recreated_cr_starts_a_fresh_history(
    admin: Admin, slo_api_kubeconfig: Path
) -> None:
    ns, route, _ = _setup(admin)
    async with running(slo_api_kubeconfig) as service:
        await service.eventually(_indexed(service, route), what="indexed")
        assert (await service.put(f"/routes/{route}", {"priority": 2})).is_success
        await _recorded(service, route, 1)
        old = admin.get(crs.SLO, "LLMSLORequirement", ns, "chat")["metadata"]["uid"]
        admin.delete(crs.SLO, "LLMSLORequirement", ns, "chat")
        admin.create(crs.llm(ns, "chat", service_id=route, priority=1))
        new = admin.get(crs.SLO, "LLMSLORequirement", ns, "chat")["metadata"]["uid"]

        def recreated() -> bool:
            claims = service.indexed(route)
            return bool(claims) and claims[0][1]["metadata"]["uid"] == new

        await service.eventually(recreated, what="the new CR indexed")
        assert (await _history(service, route))["total"] == 0
        assert (await service.put(f"/routes/{route}", {"priority": 6})).is_success
        history = await _recorded(service, route, 1)
    assert history["total"] == 1
    assert history["items"][0]["changes"] == [{"field": "priority", "from": 1, "to": 6}]
    assert all(
        r["metadata"]["ownerReferences"][0]["uid"] == new for r in _revisions(admin, ns, new)
    )
    assert old != new


def _big_ttft(seed: int) -> dict[str, Any]:
    """A legal ttft section of about 20 KiB."""
    types = ("avg", "p50", "p80", "p90", "p95", "p99")
    ranges = [
        {
            "contextLengthRangeLow": i * 100,
            "contextLengthRangeHigh": i * 100 + 100,
            "metrics": [
                {"type": t, "threshold": round(seed + i / 64 + k / 7.0, 12)}
                for k, t in enumerate(types)
            ],
        }
        for i in range(64)
    ]
    return {"default": {"metrics": [{"type": "p90", "threshold": seed}]}, "ranges": ranges}


async def test_a_megabyte_of_values_over_time_never_freezes_the_history(
    admin: Admin, slo_api_kubeconfig: Path
) -> None:
    _, route, _ = _setup(admin)
    async with running(slo_api_kubeconfig) as service:
        await service.eventually(_indexed(service, route), what="indexed")
        sent = 0
        seed = 0
        while sent < 1024 * 1024:
            seed += 1
            ttft = _big_ttft(seed)
            put = await service.put(f"/routes/{route}", {"ttft": ttft})
            assert put.status_code == 200, put.text
            sent += len(json.dumps(ttft))
        assert (await service.put(f"/routes/{route}", {"priority": 2})).is_success
        history = await _recorded(service, route, 20)
    newest = history["items"][0]
    assert newest["changes"] == [{"field": "priority", "from": 1, "to": 2}]
    assert newest["after"]["ttft"]["digest"].startswith("sha256:")


async def test_no_user_role_may_write_a_revision_and_none_may_be_rewritten(
    admin: Admin, slo_api_kubeconfig: Path, cluster: Cluster
) -> None:
    ns, route, _ = _setup(admin)
    async with running(slo_api_kubeconfig) as service:
        await service.eventually(_indexed(service, route), what="indexed")
        assert (await service.put(f"/routes/{route}", {"priority": 2})).is_success
        await _recorded(service, route, 1)
    uid = admin.get(crs.SLO, "LLMSLORequirement", ns, "chat")["metadata"]["uid"]
    (revision,) = _revisions(admin, ns, uid)
    name = revision["metadata"]["name"]
    path = admin.path(REVISIONS, "RouteRevision", ns)
    forged = {
        "apiVersion": REVISIONS,
        "kind": "RouteRevision",
        "metadata": {"name": f"{uid}.1", "namespace": ns},
        "data": "{}",
    }
    for role in ("view", "edit", "admin"):
        admin.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": role, "namespace": ns},
            }
        )
        admin.create(
            {
                "apiVersion": RBAC,
                "kind": "RoleBinding",
                "metadata": {"name": f"built-in-{role}", "namespace": ns},
                "roleRef": {"apiGroup": RBAC.split("/")[0], "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": role, "namespace": ns}],
            }
        )
        user = Admin(
            cluster.plane.url,
            cluster.plane.pki.ca_cert,
            token=admin.service_account_token(ns, role),
        )
        try:
            for method, where, body in (
                ("POST", path, forged),
                ("PATCH", f"{path}/{name}", {"data": '{"actor": "admin"}'}),
                ("DELETE", f"{path}/{name}", None),
                ("GET", f"{path}/{name}", None),
            ):
                content_type = (
                    "application/merge-patch+json" if method == "PATCH" else "application/json"
                )
                with pytest.raises(AdminError) as refused:
                    user.request(method, where, body, content_type)
                assert refused.value.status == 403, (role, method)
        finally:
            user.close()
    # Not even with every right: a revision is immutable.
    with pytest.raises(AdminError) as immutable:
        admin.request(
            "PATCH",
            f"{path}/{name}",
            {"data": '{"actor": "admin"}'},
            "application/merge-patch+json",
        )
    assert immutable.value.status == 422
    assert "immutable" in str(immutable.value.body)


async def test_a_replica_whose_watch_lags_records_nothing_twice(
    admin: Admin, slo_api_kubeconfig: Path, cluster: Cluster, tmp_path: Path
) -> None:
    ns, route, _ = _setup(admin)
    async with TcpProxy("127.0.0.1", cluster.plane.port) as proxy:
        lagging = proxy.kubeconfig(slo_api_kubeconfig, tmp_path / "lagging.kubeconfig")
        async with (
            running(slo_api_kubeconfig, upstream_timeout_seconds=3) as fast,
            running(lagging) as slow,
        ):
            for replica in (fast, slow):
                await replica.eventually(_indexed(replica, route), what="indexed")
            # The slow replica hears nothing while a write through the other and a kubectl
            # change are made and recorded, then all of it at once, seconds late.
            proxy.stalled = True
            put = await fast.put(f"/routes/{route}", {"priority": 3}, headers={"X-Request-Id": "a"})
            assert put.status_code == 200, put.text
            _patch_around(admin, ns, {"spec": {"priority": 5}}, "kubectl-patch")
            await _recorded(fast, route, 2)
            proxy.stalled = False
            # Its own write, answered and watched late.
            proxy.delay = 0.5
            put = await slow.put(f"/routes/{route}", {"priority": 6}, headers={"X-Request-Id": "b"})
            assert put.status_code == 200, put.text
            history = await _recorded(slow, route, 3)
            proxy.delay = 0
            await fast.runtime.history.close()
            assert await _history(fast, route) == history
    assert history["total"] == 3, history
    assert [(e["actor"], e["via"], e["clientRequestId"]) for e in history["items"]] == [
        ("token:write", "slo-api", "b"),
        ("kubectl-patch", "kubectl-patch", None),
        ("token:write", "slo-api", "a"),
    ]


async def test_two_overlapping_puts_on_one_replica_each_keep_their_request(
    admin: Admin, slo_api_kubeconfig: Path
) -> None:
    _, route, _ = _setup(admin)
    async with served(slo_api_kubeconfig) as (service, client):
        await service.eventually(_indexed(service, route), what="indexed")
        request = client.build_request("GET", "/config", params={"watch": "true"})
        response = await client.send(request, stream=True)
        try:
            stream = Stream(response)
            await stream.until(initial)
            bound = {"type": "replica", "value": 4}
            first, second = await asyncio.gather(
                client.put(f"/routes/{route}", json={"priority": 3}, headers={"X-Request-Id": "p"}),
                client.put(
                    f"/routes/{route}",
                    json={"maximumDeployment": bound},
                    headers={"X-Request-Id": "m"},
                ),
            )
            assert first.status_code == second.status_code == 200
            events = await stream.until(
                lambda e: (
                    e["type"] == "MODIFIED"
                    and e["object"].get("priority") == 3
                    and e["object"].get("maximumDeployment") == bound
                )
            )
        finally:
            await response.aclose()
        history = await _recorded(service, route, 2)
    assert history["total"] == 2, history
    by_version = {e["id"]: e["clientRequestId"] for e in history["items"]}
    assert by_version == {
        first.headers["ETag"].strip('"'): "p",
        second.headers["ETag"].strip('"'): "m",
    }
    # The stream names the same request for each change as the history does.
    for event in (e for e in events if e["type"] == "MODIFIED"):
        changed = [e for e in history["items"] if e["after"] == _owned(event["object"])]
        assert [event["by"]["clientRequestId"]] == [e["clientRequestId"] for e in changed]


def _owned(body: dict[str, Any]) -> dict[str, Any]:
    keep = ("route", "kind", "priority", "minimumDeployment", "maximumDeployment", "ttft", "otps")
    return {k: v for k, v in body.items() if k in keep}
