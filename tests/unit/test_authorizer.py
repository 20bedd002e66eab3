"""The Authorizer's rules, on a fake of the seam whose RBAC knows API groups.

Each test here stands for a finding of the access review (see the CHANGELOG): the group a
review names, what a caller without rights learns, no-op writes, a member's pool, malformed
review answers, floods of reviews and the access of change streams. What the real API server
answers is proven in tests/integration/test_kubernetes_auth.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from slo_api.errors import ApiError
from slo_api.kube import Kube, KubeError
from slo_api.service import shown
from tests.unit import vtime
from tests.unit.conftest import AUTH, Started, until
from tests.unit.fakes import TOKEN, USER, FakeKube, Grant, fail
from tests.unit.test_feed import Reader

Obj = dict[str, Any]
NEW, OLD, POOLS = "inference.modelsphere.dev", "inference.x-k8s.io", "inference.llmkube.dev"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
LLMS = "llmslorequirements"


def _llm(namespace: str, name: str, group: str = NEW, route: str | None = None) -> Obj:
    return {
        "apiVersion": f"{group}/v1alpha1",
        "kind": "LLMSLORequirement",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "serviceId": route or name,
            "priority": 0,
            "minimumDeployment": {"type": "replica", "value": 1},
        },
    }


def _pool(namespace: str, name: str, members: list[str]) -> Obj:
    return {
        "apiVersion": f"{POOLS}/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "members": [{"inferenceServiceRef": {"name": m}} for m in members],
            "swapPolicy": "sticky",
            "swapBudget": "300s",
            "gpu": 1,
        },
        "status": {"phase": "Ready", "residentMember": members[0]},
    }


def _grants(group: str, plural: str, namespace: str, *verbs: str) -> set[Grant]:
    return {(v, group, plural, namespace) for v in verbs}


async def _settled(kube: FakeKube) -> None:
    """Let Events sent in the background reach the fake."""
    for _ in range(5):
        await asyncio.sleep(0)


# -- the review names the group of the copy shown and written ------------------------------


@pytest.mark.parametrize("granted", [OLD, NEW])
async def test_the_review_names_the_group_that_holds_the_cr(
    start: Started, granted: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cluster serving only the old group: rights there count, rights on the new one do not.
    The write, its Event and its audit line name the CR the review was about."""
    caplog.set_level("INFO", logger="slo_api.audit")
    grants = _grants(granted, LLMS, "a", "get", "list", "watch", "patch")
    kube = FakeKube({LLMS: [_llm("a", "chat", OLD)]}, grants=grants)
    kube.groups = {OLD, POOLS}
    async with start(kube, slo_api_kubernetes_auth=True) as (client, app):
        got = await client.get("/routes/chat", headers=BEARER)
        put = await client.put("/routes/chat", json={"priority": 3}, headers=BEARER)
        listed = (await client.get("/config", headers=BEARER)).json()
        rt = app.state.runtime
        access = rt.access.stream(TOKEN, await rt.access.authenticate(TOKEN), None, rt.visible.held)
        if granted == OLD:
            assert got.status_code == 200, got.text
            assert put.status_code == 200, put.text
            assert [i["route"] for i in listed["items"]] == ["chat"]
            assert await access.allowed() == frozenset({("llm", "a", OLD)})
            await _settled(kube)
            [event] = kube.events
            assert event["regarding"]["apiVersion"] == f"{OLD}/v1alpha1"
            assert (event["regarding"]["namespace"], event["regarding"]["name"]) == ("a", "chat")
            [audited] = [r.__dict__ for r in caplog.records if getattr(r, "audit", False)]
            assert (audited["group"], audited["namespace"], audited["object"]) == (OLD, "a", "chat")
            assert audited["uid"] == "uid-chat"
        else:
            assert (got.status_code, put.status_code) == (404, 404)
            assert listed["items"] == []
            with pytest.raises(ApiError) as refused:
                await access.allowed()
            assert refused.value.status == 403
        assert {r["resourceAttributes"]["group"] for r in kube.access_reviews} == {OLD}


async def test_a_refusal_names_the_group_of_the_cr(start: Started) -> None:
    kube = FakeKube({LLMS: [_llm("a", "chat", OLD)]}, grants=_grants(OLD, LLMS, "a", "get"))
    kube.groups = {OLD, POOLS}
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        denied = await client.put("/routes/chat", json={"priority": 3}, headers=BEARER)
        assert denied.status_code == 403
        assert f"patch {LLMS}.{OLD}" in denied.json()["error"]["message"]


# -- a caller without rights learns nothing about which routes exist ------------------------


async def test_routes_a_caller_may_not_read_are_404_like_unknown_ones(start: Started) -> None:
    objects = {
        LLMS: [
            _llm("a", "alone"),
            _llm("a", "twice-a", route="twice"),
            _llm("b", "twice-b", route="twice"),
        ],
        "modelpools": [_pool("a", "slot", ["alone"])],
    }
    kube = FakeKube(objects, grants=set())
    async with start(kube, slo_api_kubernetes_auth=True, access_denied_seconds=0) as (
        client,
        _app,
    ):
        answers = []
        for route in ("alone", "twice", "slot", "never-was"):
            for method, body in (("GET", None), ("PUT", {"priority": 1}), ("DELETE", None)):
                answer = await client.request(method, f"/routes/{route}", json=body, headers=BEARER)
                error = answer.json()["error"]
                answers.append((answer.status_code, error["code"], error["message"]))
                assert error["message"] == f"route {route!r} is not registered"
        assert {(status, code) for status, code, _ in answers} == {(404, "not_found")}
        assert kube.patches == []
        # Who may read one of the CRs claiming an ambiguous route learns it is ambiguous.
        kube.grants = _grants(NEW, LLMS, "b", "get")
        twice = await client.get("/routes/twice", headers=BEARER)
        assert twice.status_code == 409
        # A static token reads every CR: it is told as before.
        assert (await client.get("/routes/twice", headers=AUTH)).status_code == 409


async def test_in_a_namespace_holding_both_groups_each_cr_is_shown_by_its_own_groups_rights(
    start: Started,
) -> None:
    """During a migration, rights on the new group in a namespace show the CRs of the new group
    there to GET, /config and the stream alike; the old group's CRs beside them stay hidden."""
    grants = _grants(NEW, LLMS, "a", "get", "list", "watch")
    objects = {LLMS: [_llm("a", "moved", NEW), _llm("a", "not-yet", OLD)]}
    kube = FakeKube(objects, grants=grants)
    kube.groups = {NEW, OLD, POOLS}
    async with start(kube, slo_api_kubernetes_auth=True) as (client, app):
        assert (await client.get("/routes/moved", headers=BEARER)).status_code == 200
        assert (await client.get("/routes/not-yet", headers=BEARER)).status_code == 404
        for view in ("summary", "full"):
            page = (await client.get("/config", params={"view": view}, headers=BEARER)).json()
            assert [i["route"] for i in page["items"]] == ["moved"], view
        rt = app.state.runtime
        caller = await rt.access.authenticate(TOKEN)
        allowed = await rt.access.stream(TOKEN, caller, None, rt.visible.held).allowed()
        owners = rt.feed.log.owners
        assert [r for r in rt.index.routes() if shown(owners(r), None, allowed)] == ["moved"]


# -- a write that changes nothing --------------------------------------------------------------


async def test_a_write_that_changes_nothing_sends_no_patch_and_records_no_event(
    start: Started,
) -> None:
    grants = _grants(NEW, LLMS, "a", "get", "patch")
    kube = FakeKube({LLMS: [_llm("a", "chat")]}, grants=grants)
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        current = (await client.get("/routes/chat", headers=BEARER)).json()
        for headers in (BEARER, AUTH):
            echoed = await client.put("/routes/chat", json=current, headers=headers)
            assert echoed.status_code == 200, echoed.text
            assert echoed.json() == current
            same = await client.put("/routes/chat", json={"priority": 0}, headers=headers)
            assert same.status_code == 200
        # Already at the defaults: a DELETE has nothing to reset either.
        reset = await client.delete("/routes/chat", headers=BEARER)
        assert reset.status_code == 204
        await _settled(kube)
        assert kube.patches == []
        assert kube.events == []
        changed = await client.put("/routes/chat", json={"priority": 2}, headers=BEARER)
        assert changed.status_code == 200
        await _settled(kube)
        assert len(kube.patches) == 1
        assert [e["note"] for e in kube.events] == [f"{USER} changed priority through slo-api"]


async def test_a_write_the_index_thinks_empty_is_checked_against_the_api_server(
    start: Started,
) -> None:
    """The index's copy may lag: "no change" is decided on the CR as the API server holds it."""
    kube = FakeKube({LLMS: [_llm("a", "chat")]}, grants=set())
    async with start(kube) as (client, _):
        kube.objects[LLMS, "a", "chat"]["spec"]["priority"] = 5  # changed around the index
        put = await client.put("/routes/chat", json={"priority": 0}, headers=AUTH)
        assert put.status_code == 200
        assert put.json()["priority"] == 0
        assert len(kube.patches) == 1


# -- a member's pool -----------------------------------------------------------------------------


@pytest.mark.parametrize("may_get_pool", [False, True])
async def test_a_member_shows_its_pool_only_to_callers_who_may_get_it(
    start: Started, may_get_pool: bool
) -> None:
    grants = _grants(NEW, LLMS, "a", "get", "patch", "list")
    if may_get_pool:
        grants |= _grants(POOLS, "modelpools", "a", "get", "list")
    kube = FakeKube(
        {LLMS: [_llm("a", "chat")], "modelpools": [_pool("a", "slot", ["chat"])]}, grants=grants
    )
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        read = (await client.get("/routes/chat", headers=BEARER)).json()
        written = (await client.put("/routes/chat", json={"priority": 1}, headers=BEARER)).json()
        listed = []
        for params in ({"view": "full"}, {"view": "full", "kind": "llm"}):
            page = (await client.get("/config", params=params, headers=BEARER)).json()
            listed += [i for i in page["items"] if i["route"] == "chat"]
        assert len(listed) == 2
        for body in (read, written, *listed):
            assert ("pool" in body) is may_get_pool
        static = (await client.get("/routes/chat", headers=AUTH)).json()
        assert static["pool"]["route"] == "slot"
        page = (await client.get("/config", params={"view": "full"}, headers=AUTH)).json()
        assert {i["route"]: i for i in page["items"]}["chat"]["pool"]["route"] == "slot"


@pytest.mark.parametrize("may_list_pools", [False, True])
async def test_a_stream_shows_a_members_pool_where_config_does(
    start: Started, may_list_pools: bool
) -> None:
    grants = _grants(NEW, LLMS, "a", "get", "list", "watch")
    if may_list_pools:
        grants |= _grants(POOLS, "modelpools", "a", "list")
    kube = FakeKube(
        {LLMS: [_llm("a", "chat")], "modelpools": [_pool("a", "slot", ["chat"])]}, grants=grants
    )
    async with start(kube, slo_api_kubernetes_auth=True) as (client, app):
        rt = app.state.runtime
        caller = await rt.access.authenticate(TOKEN)
        # A stream of LLM SLOs in the full view asks about the pools too (with `list` only,
        # as /config?view=full does); in the summary view it does not.
        full = await rt.access.stream(TOKEN, caller, "llm", rt.visible.held, pools=True).allowed()
        summary = await rt.access.stream(TOKEN, caller, "llm", rt.visible.held).allowed()
        assert summary == frozenset({("llm", "a", NEW)})
        assert full == summary | ({("pool", "a", POOLS)} if may_list_pools else set())
        stream = rt.feed.open("full", "llm", allowed=full)
        frame = rt.feed.log.initial_frame("full", "chat", False, stream.allowed)
        rt.feed.close(stream)
        assert frame is not None
        streamed = orjson.loads(frame)["object"]
        page = (await client.get("/config", params={"view": "full"}, headers=BEARER)).json()
        [listed] = [i for i in page["items"] if i["route"] == "chat"]
        assert ("pool" in streamed) is ("pool" in listed) is may_list_pools


# -- malformed review answers ---------------------------------------------------------------------


@pytest.mark.parametrize("answer", [{"allowed": "true"}, {"allowed": 1}, {"allowed": None}])
async def test_only_the_json_boolean_true_allows(start: Started, answer: Obj) -> None:
    kube = FakeKube({LLMS: [_llm("a", "chat")]}, grants=set())
    kube.access_answer = answer
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        assert (await client.get("/routes/chat", headers=BEARER)).status_code == 404


class _Response:
    def __init__(self, body: bytes) -> None:
        self.status, self.reason, self._body = 200, "OK", body
        self.headers: dict[str, str] = {}

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


class _Reviewer:
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def call_api(self, *_: Any, **__: Any) -> _Response:
        return _Response(self.body)


@pytest.mark.parametrize(
    "body", [b"<html>proxy error</html>", b"[]", b'{"status": "allowed"}', b'{"status": [true]}']
)
async def test_a_review_answer_that_cannot_be_read_is_a_failed_review(body: bytes) -> None:
    kube = Kube(_Reviewer(body), timeout=1)
    with pytest.raises(KubeError):
        await kube.review_access({"user": "x"})
    with pytest.raises(KubeError):
        await kube.review_token("t", [])


@pytest.mark.parametrize(
    "status",
    [
        {"authenticated": True, "user": "root"},
        {"authenticated": True, "user": {"username": USER, "groups": "system:masters"}},
        {"authenticated": True, "user": {"username": USER}, "audiences": "slo-api"},
    ],
)
async def test_a_token_review_of_the_wrong_shape_is_503(start: Started, status: Obj) -> None:
    kube = FakeKube({}, grants=set())
    kube.token_answer = status
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        answer = await client.get("/config", headers=BEARER)
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "5"
        assert answer.json()["error"]["code"] == "unavailable"


# -- floods of reviews ------------------------------------------------------------------------


async def test_identical_concurrent_questions_are_asked_once(start: Started) -> None:
    spaces = [f"ns-{n}" for n in range(30)]
    grants = {g for ns in spaces for g in _grants(NEW, LLMS, ns, "list")}
    in_flight = [0, 0]  # (now, most)

    async def counted(method: str, *args: Any) -> None:
        if method == "review_access":
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            try:
                await asyncio.sleep(0)  # let concurrent requests ask the same question meanwhile
            finally:
                in_flight[0] -= 1

    kube = FakeKube(
        {LLMS: [_llm(ns, f"r-{ns}") for ns in spaces]}, grants=grants, error_callback=counted
    )
    async with start(kube, slo_api_kubernetes_auth=True, review_concurrency=2) as (client, _):
        pages = await asyncio.gather(
            *(client.get("/config", params={"pageSize": 200}, headers=BEARER) for _ in range(5))
        )
        assert all(p.json()["total"] == 30 for p in pages)
        assert len(kube.token_reviews) == 1
        assert len(kube.access_reviews) == 30
        # Bounded, and an authenticated caller's questions wait for a slot: none refused.
        assert in_flight[1] == 2


async def test_a_flood_of_bad_tokens_is_bounded_and_never_holds_up_a_known_caller(
    start: Started,
) -> None:
    grants = _grants(NEW, LLMS, "a", "get", "patch")
    kube = FakeKube({LLMS: [_llm("a", "chat")]}, grants=grants)
    async with start(kube, slo_api_kubernetes_auth=True, review_concurrency=4) as (client, _):
        assert (await client.get("/routes/chat", headers=BEARER)).status_code == 200
        held = asyncio.Event()
        in_flight = [0, 0]  # (now, most) TokenReviews of unknown tokens

        async def hold_unknown_tokens(method: str, *args: Any) -> None:
            if method == "review_token" and args[0] != TOKEN:
                in_flight[0] += 1
                in_flight[1] = max(in_flight)
                try:
                    await held.wait()
                finally:
                    in_flight[0] -= 1

        kube.error_callback = hold_unknown_tokens
        flood = [
            asyncio.ensure_future(
                client.get("/routes/chat", headers={"Authorization": f"Bearer bad-{n}"})
            )
            for n in range(100)
        ]
        await until(lambda: in_flight[0] == 4, "four TokenReviews in flight")
        # The flood holds every TokenReview slot; a caller already known writes meanwhile.
        written = await client.put("/routes/chat", json={"priority": 4}, headers=BEARER)
        assert written.status_code == 200
        held.set()
        answers = await asyncio.gather(*flood)
        assert in_flight[1] == 4
        codes = {a.status_code for a in answers}
        # Beyond 8 x 4 waiting, a review is refused at once rather than queued.
        assert codes == {401, 503}
        assert sum(a.status_code == 401 for a in answers) <= 4 + 8 * 4


# -- change streams -----------------------------------------------------------------------------


async def test_a_stream_needs_list_and_watch_somewhere(start: Started) -> None:
    kube = FakeKube({LLMS: [_llm("a", "chat")]}, grants=_grants(NEW, LLMS, "a", "get", "list"))
    async with start(kube, slo_api_kubernetes_auth=True) as (client, app):
        refused = await client.get("/config", params={"watch": "true"}, headers=BEARER)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "forbidden"
        assert "list and watch" in refused.json()["error"]["message"]
        assert not app.state.runtime.feed.streams


async def test_stream_access_follows_the_caches_and_ends_with_the_rights(start: Started) -> None:
    grants = _grants(NEW, LLMS, "a", "list", "watch") | _grants(NEW, LLMS, "b", "list", "watch")
    kube = FakeKube({LLMS: [_llm("a", "in-a"), _llm("b", "in-b")]}, grants=grants)
    async with start(
        kube, slo_api_kubernetes_auth=True, token_review_seconds=0, access_allowed_seconds=0
    ) as (_client, app):
        rt = app.state.runtime
        caller = await rt.access.authenticate(TOKEN)
        access = rt.access.stream(TOKEN, caller, "llm", rt.visible.held)
        assert access.holder == USER
        assert await access.allowed() == frozenset({("llm", "a", NEW), ("llm", "b", NEW)})
        kube.grants -= _grants(NEW, LLMS, "b", "watch")
        assert await access.allowed() == frozenset({("llm", "a", NEW)})
        kube.grants = set()
        with pytest.raises(ApiError) as forbidden:
            await access.allowed()
        assert (forbidden.value.status, forbidden.value.code) == (403, "forbidden")
        gone = rt.access.stream("a-token-no-longer-valid", caller, "llm", rt.visible.held)
        with pytest.raises(ApiError) as unauthorized:
            await gone.allowed()
        assert unauthorized.value.status == 401
        static = rt.access.stream(
            "unit-write-token",
            await rt.access.authenticate("unit-write-token"),
            None,
            rt.visible.held,
        )
        assert static.holder is None
        assert await static.allowed() is None
        assert "token" not in repr(access).lower().replace("holder", "")


async def test_stream_access_is_free_while_the_caches_hold(start: Started) -> None:
    kube = FakeKube({LLMS: [_llm("a", "in-a")]}, grants=_grants(NEW, LLMS, "a", "list", "watch"))
    async with start(kube, slo_api_kubernetes_auth=True) as (_client, app):
        rt = app.state.runtime
        access = rt.access.stream(TOKEN, await rt.access.authenticate(TOKEN), None, rt.visible.held)
        for _ in range(3):
            assert await access.allowed() == frozenset({("llm", "a", NEW)})
        assert len(kube.token_reviews) == 1
        assert len(kube.access_reviews) == 2  # list and watch, once each


# -- a stream's view follows the caller's rights, not the CRs' comings and goings -----------------


async def _streaming(rt: Any, kind: str | None = None) -> Reader:
    """A change stream of the Kubernetes identity TOKEN, past its initial state."""
    access = rt.access.stream(TOKEN, await rt.access.authenticate(TOKEN), kind, rt.visible.held)
    r = Reader(
        rt.feed, rt.feed.open("summary", kind, access=access, allowed=await access.allowed())
    )
    await until(lambda: any(e.get("initial") for e in r.events), "the initial state")
    return r


async def test_a_namespace_that_gains_its_first_cr_widens_a_stream_in_place(
    start: Started,
) -> None:
    """The caller may list and watch in `a` and `b`; `b` holds no CR when the stream opens.
    Its first CR arrives as an ADDED on the same stream: no reset, no resync."""
    grants = _grants(NEW, LLMS, "a", "list", "watch") | _grants(NEW, LLMS, "b", "list", "watch")
    kube = FakeKube({LLMS: [_llm("a", "in-a")]}, grants=grants)
    async with start(kube, slo_api_kubernetes_auth=True, watch_access_seconds=0.05) as (_, app):
        rt = app.state.runtime
        r = await _streaming(rt)
        kube.push(LLMS, {"type": "ADDED", "object": kube.add(LLMS, _llm("b", "in-b"))})
        await until(lambda: ("ADDED", "in-b") in r.changes(), "the new namespace's CR streamed")
        # Re-checks went on meanwhile; a later change still arrives on the same stream.
        later = kube.add(LLMS, {**_llm("a", "in-a"), "spec": {**_llm("a", "in-a")["spec"]}})
        later["spec"]["priority"] = 5
        kube.push(LLMS, {"type": "MODIFIED", "object": later})
        await until(lambda: ("MODIFIED", "in-a") in r.changes(), "a later change streamed")
        assert r.changes() == [("ADDED", "in-a"), ("ADDED", "in-b"), ("MODIFIED", "in-a")]
        assert [e for e in r.events if e["type"] == "ERROR"] == []
        # A namespace the caller may not read gains a CR: it stays out of the stream.
        kube.push(LLMS, {"type": "ADDED", "object": kube.add(LLMS, _llm("c", "in-c"))})
        kube.push(LLMS, {"type": "DELETED", "object": kube.add(LLMS, _llm("b", "in-b"))})
        await until(lambda: ("DELETED", "in-b") in r.changes(), "a barrier change streamed")
        assert ("ADDED", "in-c") not in r.changes()
        assert not r.task.done()
        await r.stop()


async def test_a_namespace_that_gains_its_first_cr_as_a_stream_opens_is_in_its_initial_state(
    start: Started,
) -> None:
    """`b`'s first CR lands between the stream's access check and its initial state."""
    grants = _grants(NEW, LLMS, "a", "list", "watch") | _grants(NEW, LLMS, "b", "list", "watch")
    kube = FakeKube({LLMS: [_llm("a", "in-a")]}, grants=grants)
    async with start(kube, slo_api_kubernetes_auth=True) as (_, app):
        rt = app.state.runtime
        access = rt.access.stream(TOKEN, await rt.access.authenticate(TOKEN), None, rt.visible.held)
        allowed = await access.allowed()
        kube.push(LLMS, {"type": "ADDED", "object": kube.add(LLMS, _llm("b", "in-b"))})
        await until(lambda: rt.index.claims("in-b"), "in-b indexed")
        r = Reader(rt.feed, rt.feed.open("summary", None, access=access, allowed=allowed))
        await until(lambda: any(e.get("initial") for e in r.events), "the initial state")
        assert r.changes() == [("ADDED", "in-a"), ("ADDED", "in-b")]
        await r.stop()


def test_a_stream_outlives_a_review_outage_for_its_grace_then_ends_resumable(
    start: Started,
) -> None:
    """On virtual time: every review fails with 5xx from t=0. The stream stays open for
    WATCH_REVIEW_GRACE_SECONDS, then ends with an `unavailable` ERROR naming its position."""

    async def outage() -> None:
        grants = _grants(NEW, LLMS, "a", "list", "watch")
        kube = FakeKube({LLMS: [_llm("a", "in-a")]}, grants=grants)
        async with start(
            kube,
            slo_api_kubernetes_auth=True,
            token_review_seconds=0,  # the caches run on the wall clock: every check asks
            access_allowed_seconds=0,
            watch_access_seconds=10,
            watch_review_grace_seconds=120,
        ) as (_, app):
            r = await _streaming(app.state.runtime)
            loop = asyncio.get_running_loop()
            kube.error_callback = fail(
                KubeError(503, "ServiceUnavailable", "down", is_status=True),
                "review_token",
                "review_access",
                times=None,
            )
            down = loop.time()
            await asyncio.wait_for(asyncio.shield(r.task), 3600)
            lasted = loop.time() - down
            # Open through the grace, ended by the first re-check after it.
            assert 120 <= lasted <= 120 + 10 + 1, lasted
            *_, initial, place, last = r.events
            assert last["type"] == "ERROR"
            assert last["error"]["code"] == "unavailable"
            # The place to resume from comes with it: where the stream got to.
            assert (place["type"], place["revision"]) == ("BOOKMARK", initial["revision"])

    vtime.run(outage())
