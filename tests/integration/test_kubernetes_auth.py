"""Kubernetes identities (DESIGN §3 Auth), on the real API server's TokenReview and RBAC.

ServiceAccounts `editor` (slo-api-edit in namespace a), `viewer` (slo-api-view in namespace b)
and `nobody` call slo-api with their own tokens; each must get exactly what RBAC grants.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.admin import Admin, AdminError
from tests.integration import crs
from tests.integration.process import start_process
from tests.integration.service import AUTH, RunningService, running
from tests.integration.tcpproxy import TcpProxy
from tests.integration.test_watch_stream import Stream, initial, served

pytestmark = pytest.mark.integration

RBAC = "rbac.authorization.k8s.io/v1"
_ids = itertools.count(1)


@dataclass
class World:
    a: str
    b: str
    people: str
    tokens: dict[str, str]

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}


def _binding(namespace: str, name: str, role: str, sa_namespace: str, sa: str) -> dict[str, Any]:
    return {
        "apiVersion": RBAC,
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_namespace}],
    }


def _service_account(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace},
    }


@pytest.fixture
def world(admin: Admin) -> World:
    """Namespaces a and b with one route of each kind, a route claimed in both, and three
    ServiceAccounts (in a third namespace) with their tokens."""
    run = f"k{os.getpid() % 10000}-{next(_ids)}"
    a, b, people = f"{run}-a", f"{run}-b", f"{run}-people"
    for ns in (a, b, people):
        admin.ensure_namespace(ns)
    for ns in (a, b):
        admin.create(crs.llm(ns, f"{ns}-llm"))
        admin.create(crs.job(ns, f"{ns}-job"))
        admin.create(crs.pool(ns, f"{ns}-pool", [f"{ns}-llm"]))
        admin.create(crs.llm(ns, "shared", service_id=f"{run}-shared"))
    for who in ("editor", "viewer", "nobody"):
        admin.create(_service_account(people, who))
    admin.create(_binding(a, "editor", "slo-api-edit", people, "editor"))
    admin.create(_binding(b, "viewer", "slo-api-view", people, "viewer"))
    tokens = {w: admin.service_account_token(people, w) for w in ("editor", "viewer", "nobody")}
    return World(a, b, people, tokens)


@pytest.fixture
async def kservice(slo_api_kubeconfig: Path) -> AsyncIterator[RunningService]:
    async with running(slo_api_kubeconfig, slo_api_kubernetes_auth=True) as started:
        yield started


async def _wait_indexed(service: RunningService, world: World) -> None:
    for ns in (world.a, world.b):
        for route in (f"{ns}-llm", f"{ns}-job", f"{ns}-pool"):
            await service.eventually(_indexed(service, route), what=route)
    shared = f"{world.a.removesuffix('-a')}-shared"
    await service.eventually(lambda: len(service.indexed(shared)) == 2, what="shared")


def _indexed(service: RunningService, route: str) -> Any:
    return lambda: service.indexed(route)


async def _call(
    service: RunningService, who: dict[str, str], method: str, path: str, body: Any = None
) -> httpx.Response:
    return await service.client.request(method, path, json=body, headers=who)


def _not_registered(response: httpx.Response, route: str) -> None:
    assert response.status_code == 404, response.text
    assert response.json() == {
        "error": {"code": "not_found", "message": f"route {route!r} is not registered"}
    }


def _forbidden(response: httpx.Response, verb: str, world: World) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "forbidden"
    assert verb in error["message"]
    for secret in (world.a, world.b, world.people, "-llm", "-job", "-pool"):
        assert secret not in error["message"]


async def test_each_identity_gets_exactly_what_rbac_grants(
    kservice: RunningService, world: World
) -> None:
    await _wait_indexed(kservice, world)
    a, b = world.a, world.b
    expected = {
        # who: (namespace a, namespace b) -> may read, may write
        "editor": {a: (True, True), b: (False, False)},
        "viewer": {a: (False, False), b: (True, False)},
        "nobody": {a: (False, False), b: (False, False)},
    }
    bodies: dict[str, dict[str, Any]] = {
        "llm": {"priority": 3},
        "job": {"priority": 4},
        "pool": {"pool": {"swapBudget": "120s"}},
    }
    for who, grants in expected.items():
        auth = world.auth(who)
        for ns, (may_read, may_write) in grants.items():
            for kind, body in bodies.items():
                route = f"{ns}-{kind}"
                got = await _call(kservice, auth, "GET", f"/routes/{route}")
                if may_read:
                    assert got.status_code == 200, (who, route, got.text)
                    assert got.json()["route"] == route
                else:
                    # A route the caller may not read does not exist for it.
                    _not_registered(got, route)
                for method, path, sent in (
                    ("PUT", f"/routes/{route}?dryRun=true", body),
                    ("PUT", f"/config/{route}", {"route": route, **body}),
                    ("DELETE", f"/routes/{route}?dryRun=true", None),
                    ("DELETE", f"/config/{route}", None),
                ):
                    answer = await _call(kservice, auth, method, path, sent)
                    if may_write:
                        assert answer.status_code in (200, 204), (who, method, path, answer.text)
                    elif may_read:
                        _forbidden(answer, "patch", world)
                    else:
                        _not_registered(answer, route)
    # Nothing the viewer or nobody tried reached a CR: namespace b still has its priority.
    stored = await kservice.get(f"/routes/{b}-llm")
    assert stored.json()["priority"] == 0


async def _listed(service: RunningService, auth: dict[str, str], **params: Any) -> dict[str, Any]:
    got = await service.client.get("/config", params={"pageSize": 200, **params}, headers=auth)
    assert got.status_code == 200, got.text
    body: dict[str, Any] = got.json()
    return body


async def test_config_lists_only_what_the_caller_may_list_in_both_views(
    kservice: RunningService, world: World
) -> None:
    await _wait_indexed(kservice, world)
    a, b = world.a, world.b
    shared = f"{a.removesuffix('-a')}-shared"
    mine = {
        "editor": {f"{a}-llm", f"{a}-job", f"{a}-pool", shared},
        "viewer": {f"{b}-llm", f"{b}-job", f"{b}-pool", shared},
        "nobody": set(),
    }
    ours = {f"{ns}-{k}" for ns in (a, b) for k in ("llm", "job", "pool")} | {shared}
    for who, routes in mine.items():
        for view in ("summary", "full"):
            body = await _listed(kservice, world.auth(who), view=view)
            listed = {item["route"] for item in body["items"]}
            # The session cluster holds other tests' routes: look at this test's only.
            assert listed & ours == routes, (who, view)
            assert body["total"] == len(body["items"])
            by_route = {item["route"]: item for item in body["items"]}
            if shared in routes:
                assert by_route[shared]["ambiguous"] is True
        only_llm = await _listed(kservice, world.auth(who), kind="llm")
        assert {i["route"] for i in only_llm["items"]} & ours == {
            r for r in routes if r.endswith("-llm") or r == shared
        }
    # A static token still sees everything.
    everything = await _listed(kservice, AUTH)
    assert ours <= {item["route"] for item in everything["items"]}


async def test_revoked_binding_and_deleted_service_account_stop_working(
    admin: Admin, slo_api_kubeconfig: Path, world: World
) -> None:
    async with running(
        slo_api_kubeconfig,
        slo_api_kubernetes_auth=True,
        token_review_seconds=1,
        access_allowed_seconds=1,
    ) as service:
        await _wait_indexed(service, world)
        editor, viewer = world.auth("editor"), world.auth("viewer")
        assert (await _call(service, editor, "GET", f"/routes/{world.a}-llm")).status_code == 200
        assert (await _call(service, viewer, "GET", f"/routes/{world.b}-llm")).status_code == 200

        admin.delete(RBAC, "RoleBinding", world.a, "editor")
        await service.eventually(
            # It may read nothing there any more: the route no longer exists for it.
            lambda: _status(service, editor, f"/routes/{world.a}-llm", 404),
            within=10,
            what="the editor refused once its RoleBinding is gone",
        )

        admin.delete("v1", "ServiceAccount", world.people, "viewer")
        await service.eventually(
            lambda: _status(service, viewer, f"/routes/{world.b}-llm", 401),
            within=10,
            what="the viewer refused once its ServiceAccount is gone",
        )


async def _status(service: RunningService, auth: dict[str, str], path: str, status: int) -> bool:
    return (await _call(service, auth, "GET", path)).status_code == status


async def test_a_token_for_another_audience_is_refused(
    admin: Admin, slo_api_kubeconfig: Path, world: World
) -> None:
    other = admin.service_account_token(world.people, "editor", audiences=["somewhere-else"])
    ours = admin.service_account_token(world.people, "editor", audiences=["slo-api"])
    route = f"/routes/{world.a}-llm"
    async with running(slo_api_kubeconfig, slo_api_kubernetes_auth=True) as service:
        await _wait_indexed(service, world)
        refused = await _call(service, {"Authorization": f"Bearer {other}"}, "GET", route)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "unauthorized"
    async with running(
        slo_api_kubeconfig, slo_api_kubernetes_auth=True, slo_api_token_audiences="slo-api"
    ) as service:
        await _wait_indexed(service, world)
        accepted = await _call(service, {"Authorization": f"Bearer {ours}"}, "GET", route)
        assert accepted.status_code == 200, accepted.text
        for token in (other, world.tokens["editor"]):
            answer = await _call(service, {"Authorization": f"Bearer {token}"}, "GET", route)
            assert answer.status_code == 401


async def test_an_unreachable_api_server_fails_closed_with_503(
    cluster: Any, slo_api_kubeconfig: Path, world: World, tmp_path: Path
) -> None:
    proxy = await TcpProxy("127.0.0.1", cluster.plane.port).start()
    try:
        kubeconfig = proxy.kubeconfig(slo_api_kubeconfig, tmp_path / "proxied.kubeconfig")
        async with running(
            kubeconfig, slo_api_kubernetes_auth=True, upstream_timeout_seconds=2
        ) as service:
            await _wait_indexed(service, world)
            editor = world.auth("editor")
            route = f"/routes/{world.a}-llm"
            assert (await _call(service, editor, "GET", route)).status_code == 200
            await proxy.stop()
            for auth, path in (
                # A token never seen: its TokenReview cannot be answered.
                (world.auth("viewer"), f"/routes/{world.b}-llm"),
                # A known token, a question never asked: its SubjectAccessReview cannot be.
                (editor, f"/routes/{world.a}-job"),
                (editor, "/config"),
            ):
                answer = await _call(service, auth, "GET", path)
                assert answer.status_code == 503, answer.text
                assert answer.headers["Retry-After"].isdigit()
                assert answer.json()["error"]["code"] == "unavailable"
            answer = await _call(
                service, editor, "PUT", f"/routes/{world.a}-pool", {"pool": {"swapBudget": "60s"}}
            )
            assert answer.status_code == 503
            # Static tokens need no review: reads from the index keep working.
            assert (await service.get("/config")).status_code == 200
    finally:
        await proxy.stop()


async def test_static_tokens_keep_their_roles_next_to_kubernetes_auth(
    slo_api_kubeconfig: Path, world: World, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("a-read-token-of-some-length read\n")
    async with running(
        slo_api_kubeconfig, slo_api_kubernetes_auth=True, slo_api_tokens_file=tokens
    ) as service:
        await _wait_indexed(service, world)
        route = f"/routes/{world.b}-llm"
        reader = {"Authorization": "Bearer a-read-token-of-some-length"}
        assert (await _call(service, reader, "GET", route)).status_code == 200
        refused = await _call(service, reader, "PUT", route, {"priority": 1})
        assert refused.status_code == 403
        assert "read but not change" in refused.json()["error"]["message"]
        written = await service.put(route, {"priority": 2})
        assert written.status_code == 200
        assert written.json()["priority"] == 2
        bogus = await _call(service, {"Authorization": "Bearer not-a-token"}, "GET", route)
        assert bogus.status_code == 401


async def test_a_write_records_an_event_naming_who_changed_what(
    admin: Admin, kservice: RunningService, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    await _wait_indexed(kservice, world)
    caplog.set_level(logging.INFO, logger="slo_api.audit")
    route = f"{world.a}-llm"
    username = f"system:serviceaccount:{world.people}:editor"
    editor = world.auth("editor")
    assert (await _call(kservice, editor, "PUT", f"/routes/{route}", {"priority": 7})).is_success
    assert (await _call(kservice, editor, "DELETE", f"/routes/{route}?dryRun=true")).is_success
    assert (await _call(kservice, editor, "DELETE", f"/routes/{route}")).is_success

    def events() -> list[dict[str, Any]]:
        found = admin.list("events.k8s.io/v1", "Event", world.a)
        return [e for e in found if e["regarding"]["name"] == route]

    recorded = await kservice.eventually(lambda: len(events()) >= 2 and events(), what="Events")
    by_reason = {e["reason"]: e for e in recorded}
    assert set(by_reason) == {"SLOUpdated", "SLOReset"}  # no Event for the dry run
    updated = by_reason["SLOUpdated"]
    assert username in updated["note"]
    assert "priority" in updated["note"]
    assert updated["reportingController"] == "slo-api"
    assert updated["regarding"]["kind"] == "LLMSLORequirement"
    assert updated["regarding"]["namespace"] == world.a
    assert username in by_reason["SLOReset"]["note"]
    # The audit line names the user, never the token.
    audits = [r for r in caplog.records if getattr(r, "audit", False)]
    assert [(a.__dict__["user"], a.__dict__["dry_run"]) for a in audits] == [
        (username, False),
        (username, True),
        (username, False),
    ]
    assert all(world.tokens["editor"] not in json.dumps(a.__dict__, default=str) for a in audits)
    # The patch names slo-api as the manager of the fields it set.
    stored = admin.get(crs.SLO, "LLMSLORequirement", world.a, route)
    assert "slo-api" in {m["manager"] for m in stored["metadata"]["managedFields"]}


async def test_a_caller_without_rights_cannot_tell_routes_that_exist_from_others(
    kservice: RunningService, world: World
) -> None:
    """Existing routes of each kind, an ambiguous one and one that never was: the same 404."""
    await _wait_indexed(kservice, world)
    shared = f"{world.a.removesuffix('-a')}-shared"
    nobody, viewer = world.auth("nobody"), world.auth("viewer")
    for route in (f"{world.a}-llm", f"{world.a}-job", f"{world.a}-pool", shared, "no-such-route"):
        for method, body in (("GET", None), ("PUT", {"priority": 1}), ("DELETE", None)):
            _not_registered(await _call(kservice, nobody, method, f"/routes/{route}", body), route)
            _not_registered(await _call(kservice, nobody, method, f"/config/{route}", body), route)
    # Who may read one of its CRs (the viewer, in b) is told the route is ambiguous.
    assert (await _call(kservice, viewer, "GET", f"/routes/{shared}")).status_code == 409
    # And a caller that may read but not patch is told it may not patch, naming nothing else.
    _forbidden(await _call(kservice, viewer, "PUT", f"/routes/{world.b}-pool", {}), "patch", world)


async def test_a_change_stream_needs_list_and_watch_somewhere(
    slo_api_kubeconfig: Path, world: World
) -> None:
    async with served(slo_api_kubeconfig, slo_api_kubernetes_auth=True) as (service, client):
        await _wait_indexed(service, world)
        params = {"watch": "true", "kind": "llm"}
        refused = await client.get("/config", params=params, headers=world.auth("nobody"))
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "forbidden"
        assert "list and watch" in error["message"]
        for secret in (world.a, world.b, world.people):
            assert secret not in error["message"]
        assert not service.runtime.feed.streams  # no slot taken
        gone = await client.get("/config", params=params, headers={"Authorization": "Bearer no"})
        assert gone.status_code == 401
        # The viewer may list and watch in b: its stream opens and shows b's routes only.
        shared = f"{world.a.removesuffix('-a')}-shared"
        async with client.stream(
            "GET", "/config", params=params, headers=world.auth("viewer")
        ) as response:
            assert response.status_code == 200
            seen = await Stream(response).until(initial)
        ours = {f"{world.a}-llm", f"{world.b}-llm", shared}
        assert {e.get("route") for e in seen} & ours == {f"{world.b}-llm", shared}


async def test_a_flood_of_bad_tokens_never_holds_up_a_valid_callers_writes(
    slo_api_kubeconfig: Path, world: World
) -> None:
    """300 requests with distinct unknown tokens (each a TokenReview) beside an editor's writes:
    the writes all succeed, the flood is all refused, and the TokenReviews in flight stay
    within their bound."""
    async with running(
        slo_api_kubeconfig, slo_api_kubernetes_auth=True, review_concurrency=4
    ) as service:
        await _wait_indexed(service, world)
        editor, route = world.auth("editor"), f"/routes/{world.a}-llm"
        assert (await _call(service, editor, "GET", route)).status_code == 200

        async def flood(n: int) -> int:
            bad = {"Authorization": f"Bearer not-a-token-{n}"}
            return (await _call(service, bad, "GET", route)).status_code

        async def writes() -> list[int]:
            codes = []
            for priority in range(1, 11):
                answer = await _call(service, editor, "PUT", route, {"priority": priority})
                codes.append(answer.status_code)
            return codes

        flooded, written = await asyncio.gather(
            asyncio.gather(*(flood(n) for n in range(300))), writes()
        )
        assert written == [200] * 10
        assert set(flooded) <= {401, 503}
        assert 401 in flooded
        stored = await _call(service, editor, "GET", route)
        assert stored.json()["priority"] == 10


def test_slo_api_may_review_tokens_and_access_and_record_events(
    cluster: Any, admin: Admin, world: World
) -> None:
    sa = cluster.slo_api_client()
    try:
        review = sa.request(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": world.tokens["viewer"]},
            },
        )
        assert review["status"]["user"]["username"].endswith(":viewer")
        access = sa.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": review["status"]["user"]["username"],
                    "groups": review["status"]["user"]["groups"],
                    "resourceAttributes": {
                        "group": "inference.modelsphere.dev",
                        "resource": "llmslorequirements",
                        "verb": "list",
                        "namespace": world.b,
                    },
                },
            },
        )
        assert access["status"]["allowed"] is True
        event = sa.create(
            {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": "probe.1", "namespace": world.a},
                "eventTime": "2026-01-01T00:00:00.000000Z",
                "type": "Normal",
                "reason": "Probe",
                "action": "Probe",
                "reportingController": "slo-api",
                "reportingInstance": "test",
                "regarding": {"kind": "Pod", "namespace": world.a, "name": "p"},
            }
        )
        assert event["reason"] == "Probe"
        with pytest.raises(AdminError) as deleted:
            sa.delete("events.k8s.io/v1", "Event", world.a, event["metadata"]["name"])
        assert deleted.value.status == 403
        with pytest.raises(AdminError) as secrets:
            sa.request("GET", f"/api/v1/namespaces/{world.a}/secrets")
        assert secrets.value.status == 403
    finally:
        sa.close()


async def test_a_namespace_editor_edits_through_slo_api_without_a_new_binding(
    admin: Admin, kservice: RunningService, world: World
) -> None:
    """Bound only to the built-in `edit` ClusterRole, into which slo-api-edit is aggregated."""
    await _wait_indexed(kservice, world)
    admin.create(_service_account(world.people, "ns-editor"))
    admin.create(_binding(world.a, "ns-editor", "edit", world.people, "ns-editor"))
    token = admin.service_account_token(world.people, "ns-editor")
    auth = {"Authorization": f"Bearer {token}"}
    route = f"/routes/{world.a}-job"
    written = await _call(kservice, auth, "PUT", route, {"priority": 9})
    assert written.status_code == 200, written.text
    assert written.json()["priority"] == 9
    listed = await _listed(kservice, auth)
    assert f"{world.a}-job" in {item["route"] for item in listed["items"]}
    _not_registered(
        await _call(kservice, auth, "PUT", f"/routes/{world.b}-job", {}), f"{world.b}-job"
    )


async def test_sloctl_sends_the_kubeconfig_token_to_a_real_process(
    slo_api_kubeconfig: Path, world: World, tmp_path: Path
) -> None:
    """sloctl with the editor's kubeconfig (a tokenFile), against `python -m slo_api`."""
    (tmp_path / "editor.token").write_text(world.tokens["editor"] + "\n")
    kubeconfig = tmp_path / "editor.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "editor", "user": {"tokenFile": "editor.token"}}],
                "contexts": [{"name": "editor", "context": {"cluster": "c", "user": "editor"}}],
                "current-context": "editor",
            }
        )
    )
    process = await start_process(
        slo_api_kubeconfig, tmp_path, SLO_API_KUBERNETES_AUTH="true", LOG_LEVEL="info"
    )
    try:

        def sloctl(*args: str) -> subprocess.CompletedProcess[str]:
            env = {k: v for k, v in os.environ.items() if k != "SLO_API_TOKEN"}
            env |= {"SLO_API_URL": process.url, "KUBECONFIG": str(kubeconfig)}
            return subprocess.run(
                [sys.executable, "-m", "slo_api.cli", *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        mine = sloctl("set", f"{world.a}-llm", "priority=6")
        assert mine.returncode == 0, mine.stderr
        assert "kubeconfig context 'editor' (user 'editor')" in mine.stderr
        theirs = sloctl("set", f"{world.b}-llm", "priority=6")
        # Not the editor's namespace: for the editor, the route does not exist.
        assert theirs.returncode == 3, theirs.stderr
        assert "not registered" in theirs.stderr
        users = {line.get("user") for line in process.lines() if line.get("audit")}
        assert users == {f"system:serviceaccount:{world.people}:editor"}
    finally:
        process.proc.terminate()
        process.proc.wait(timeout=30)
    assert world.tokens["editor"] not in process.log.read_text()
