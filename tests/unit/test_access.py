"""Caches, fail-closed answers and Events of Kubernetes identities, on a fake of the seam.

What the real API server answers (TokenReview, RBAC) is proven in
tests/integration/test_kubernetes_auth.py; these check slo-api's own bookkeeping around it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import ValidationError

import slo_api
from slo_api.access import TtlCache
from slo_api.access.reviews import Reviews, token_key
from slo_api.events import EventRecorder
from slo_api.kube import Kube, KubeError, KubeUnavailable
from slo_api.metrics import Metrics
from slo_api.settings import Settings
from tests.unit.conftest import AUTH, Started, until
from tests.unit.fakes import SLO_GROUP, TOKEN, USER, FakeKube, fail

Obj = dict[str, Any]


def _llm(namespace: str, name: str) -> Obj:
    return {
        "apiVersion": "inference.modelsphere.dev/v1alpha1",
        "kind": "LLMSLORequirement",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"serviceId": name, "priority": 0},
    }


def _kube(grants: set[tuple[str, str, str]]) -> FakeKube:
    """Grants as (verb, plural, namespace), on the LLM SLOs' API group."""
    return FakeKube(
        {"llmslorequirements": [_llm("a", "in-a"), _llm("b", "in-b")]},
        grants={(verb, SLO_GROUP, plural, ns) for verb, plural, ns in grants},
    )


BEARER = {"Authorization": f"Bearer {TOKEN}"}
EDIT_A = {
    ("get", "llmslorequirements", "a"),
    ("list", "llmslorequirements", "a"),
    ("patch", "llmslorequirements", "a"),
}


def test_ttl_cache_forgets_after_its_ttl_and_holds_at_most_its_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("slo_api.access.reviews.time", SimpleNamespace(monotonic=lambda: clock[0]))
    cache: TtlCache[str, bool] = TtlCache(size=2)
    cache.put("gone", True, ttl=0.01)
    cache.put("kept", False, ttl=60)
    clock[0] += 0.02
    assert cache.get("gone") is None
    assert cache.get("kept") is False
    cache.put("x", True, 60)
    cache.put("y", True, 60)
    assert len(cache) == 2
    assert cache.get("kept") is None  # the oldest went first
    cache.put("never", True, ttl=0)
    assert cache.get("never") is None


def test_settings_need_static_tokens_or_kubernetes_auth() -> None:
    with pytest.raises(ValidationError, match="SLO_API_KUBERNETES_AUTH"):
        Settings(_env_file=None)
    only_kubernetes = Settings(slo_api_kubernetes_auth=True, slo_api_token_audiences=" x, y ,")
    assert only_kubernetes.slo_api_token_audiences == ("x", "y")


async def test_reviews_are_cached_by_token_hash_and_never_hold_the_token(start: Started) -> None:
    kube = _kube(EDIT_A)
    async with start(kube, slo_api_kubernetes_auth=True) as (client, app):
        for _ in range(3):
            assert (await client.get("/routes/in-a", headers=BEARER)).status_code == 200
        assert len(kube.token_reviews) == 1
        assert len(kube.access_reviews) == 1
        reviews = app.state.runtime.access.reviews
        assert TOKEN not in repr(list(reviews._users._items)) + repr(list(reviews._access._items))
        metrics = (await client.get("/metrics")).text
        assert 'slo_api_review_cache_total{cache="token",result="hit"} 2.0' in metrics
        assert (
            'slo_api_authorizations_total{method="kubernetes",result="allowed",verb="get"} 3.0'
            in metrics
        )


async def test_a_refused_token_is_401_and_remembered(start: Started) -> None:
    kube = _kube(EDIT_A)
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        for _ in range(2):
            answer = await client.get("/routes/in-a", headers={"Authorization": "Bearer nope"})
            assert answer.status_code == 401
        assert len(kube.token_reviews) == 1


async def test_without_kubernetes_auth_other_tokens_are_never_reviewed(start: Started) -> None:
    kube = _kube(EDIT_A)
    async with start(kube) as (client, _):
        assert (await client.get("/routes/in-a", headers=BEARER)).status_code == 401
        assert kube.token_reviews == []


async def test_rbac_decides_and_a_denial_names_the_verb_and_kind_only(start: Started) -> None:
    kube = _kube(EDIT_A | {("get", "llmslorequirements", "b")})
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        denied = await client.put("/routes/in-b", json={"priority": 1}, headers=BEARER)
        assert denied.status_code == 403
        message = denied.json()["error"]["message"]
        assert "patch llmslorequirements.inference.modelsphere.dev" in message
        assert "in-b" not in message
        assert "b " not in message.replace("llmslorequirements", "")
        assert kube.patches == []
        allowed = await client.put("/routes/in-a", json={"priority": 1}, headers=BEARER)
        assert allowed.status_code == 200
        review = kube.access_reviews[-1]
        assert review["user"] == USER
        assert review["groups"] == ["system:authenticated"]
        assert review["resourceAttributes"] == {
            "group": "inference.modelsphere.dev",
            "resource": "llmslorequirements",
            "verb": "patch",
            "namespace": "a",
            "name": "in-a",
        }


async def test_config_lists_the_namespaces_the_caller_may_list(start: Started) -> None:
    kube = _kube(EDIT_A)
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        for view in ("summary", "full"):
            page = (await client.get("/config", params={"view": view}, headers=BEARER)).json()
            assert [i["route"] for i in page["items"]] == ["in-a"]
            assert page["total"] == 1
        everything = (await client.get("/config", headers=AUTH)).json()
        assert everything["total"] == 2


@pytest.mark.parametrize("fault", [KubeUnavailable(0, "Unavailable", "refused"), KubeError(500)])
async def test_an_unanswered_review_fails_closed_with_503(start: Started, fault: KubeError) -> None:
    kube = _kube(EDIT_A)
    reviews_fail = fail(fault, "review_token", "review_access", times=None)
    kube.error_callback = reviews_fail
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        for path in ("/routes/in-a", "/config"):
            answer = await client.get(path, headers=BEARER)
            assert answer.status_code == 503
            assert answer.headers["retry-after"] == "5"
            assert answer.json()["error"]["code"] == "unavailable"
        # The token is authenticated once the API server answers; its access is not yet known.
        kube.error_callback = None
        assert (await client.get("/routes/in-a", headers=BEARER)).status_code == 200
        kube.error_callback = reviews_fail
        assert (await client.get("/routes/in-b", headers=BEARER)).status_code == 503


async def test_a_write_records_an_event_and_a_failed_event_never_fails_it(
    start: Started,
) -> None:
    kube = _kube(EDIT_A)
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        assert (await client.put("/routes/in-a", json={"priority": 3}, headers=BEARER)).is_success
        dry = await client.delete("/routes/in-a?dryRun=true", headers=BEARER)
        assert dry.status_code == 200
        assert (await client.delete("/routes/in-a", headers=BEARER)).status_code == 204
        await until(lambda: len(kube.events) == 2, "two Events recorded")
        assert [(e["reason"], e["action"]) for e in kube.events] == [
            ("SLOUpdated", "Update"),
            ("SLOReset", "Reset"),
        ]
        first = kube.events[0]
        assert first["note"] == f"{USER} changed priority through slo-api"
        assert first["regarding"]["name"] == "in-a"
        assert first["regarding"]["namespace"] == "a"
        assert first["reportingController"] == "slo-api"
        kube.error_callback = fail(KubeUnavailable(0, "Unavailable", "gone"), "create_event")
        answer = await client.put("/routes/in-a", json={"priority": 4}, headers=BEARER)
        assert answer.status_code == 200
        for _ in range(100):
            metrics = (await client.get("/metrics")).text
            if 'slo_api_events_total{result="failed"} 1.0' in metrics:
                break
            await asyncio.sleep(0.01)
        assert 'slo_api_events_total{result="failed"} 1.0' in metrics
        assert 'slo_api_events_total{result="recorded"} 2.0' in metrics


async def test_the_request_log_names_the_caller_never_the_token(
    start: Started, caplog: pytest.LogCaptureFixture
) -> None:
    kube = _kube(EDIT_A)
    caplog.set_level("INFO", logger="slo_api.request")
    async with start(kube, slo_api_kubernetes_auth=True) as (client, _):
        assert (await client.get("/routes/in-a", headers=BEARER)).status_code == 200
        assert (await client.get("/routes/in-a", headers=AUTH)).status_code == 200
        assert (await client.get("/routes/in-b", headers=BEARER)).status_code == 404
    lines = [r for r in caplog.records if r.name == "slo_api.request"]
    assert [(r.__dict__["user"], r.__dict__["status"]) for r in lines] == [
        (USER, 200),
        ("token:write", 200),
        (USER, 404),
    ]
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


async def test_events_per_cr_are_budgeted_and_the_next_one_counts_the_unrecorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("slo_api.events.time", SimpleNamespace(monotonic=lambda: clock[0]))
    kube = _kube(set())
    recorder = EventRecorder(kube, Metrics(), instance="t", burst=2, refill_seconds=3600)  # type: ignore[arg-type]
    cr = _llm("a", "hot")
    other = _llm("a", "cold")
    for n in range(5):
        recorder.record(cr, "SLOUpdated", ["priority"], f"user-{n}")
    recorder.record(other, "SLOUpdated", ["priority"], "user-x")
    await recorder.close()
    assert [(e["regarding"]["name"], e["note"]) for e in kube.events] == [
        ("hot", "user-0 changed priority through slo-api"),
        ("hot", "user-1 changed priority through slo-api"),
        ("cold", "user-x changed priority through slo-api"),
    ]
    clock[0] += 2 * 3600  # two Events' refill: the budget is full again
    recorder.record(cr, "SLOReset", [], "user-9")
    await recorder.close()
    assert kube.events[-1]["note"] == (
        "user-9 reset no fields through slo-api "
        "(3 earlier writes not recorded as Events: see the audit log)"
    )


# -- a flood of made-up tokens -------------------------------------------------------------------

SLO_API_DIR = str(Path(slo_api.__file__).parent)


async def _opcodes_of(work: Awaitable[object]) -> int:
    """The bytecode instructions slo-api's own code runs for `work`: a cost that does not
    depend on the machine or its load, so two of them compare exactly."""
    count = 0

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "opcode":
            count += 1
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if not frame.f_code.co_filename.startswith(SLO_API_DIR):
            return None
        frame.f_trace_opcodes = True
        return local

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        await work
    finally:
        sys.settrace(previous)
    return count


def _reviews(kube: FakeKube, **settings: Any) -> Reviews:
    return Reviews(
        Settings(slo_api_kubernetes_auth=True, _env_file=None, **settings),
        cast(Kube, kube),  # the fake stands where Kube does
        Metrics(),
    )


async def test_a_refusal_costs_no_more_after_ten_thousand_made_up_tokens() -> None:
    reviews = _reviews(FakeKube({}))

    async def refuse(token: str) -> None:
        assert await reviews.user(token, token_key(token)) is None

    for n in range(10):
        await refuse(f"warm-{n}")
    before = await _opcodes_of(refuse("probe-before"))
    for n in range(10_000):
        await refuse(f"made-up-{n}")
    after = await _opcodes_of(refuse("probe-after"))
    assert after <= 1.5 * before, (before, after)


async def test_refusals_never_evict_a_valid_callers_review() -> None:
    kube = FakeKube({})
    reviews = _reviews(kube, review_cache_size=100)
    assert await reviews.user(TOKEN, token_key(TOKEN)) is not None
    for n in range(1_000):
        assert await reviews.user(f"made-up-{n}", token_key(f"made-up-{n}")) is None
    assert await reviews.user(TOKEN, token_key(TOKEN)) is not None
    assert [r["token"] for r in kube.token_reviews].count(TOKEN) == 1


async def test_a_known_caller_is_reviewed_ahead_of_a_flood_of_unknown_tokens() -> None:
    """Its review expired, the known caller waits behind the one review in flight only."""
    kube = FakeKube({})
    reviews = _reviews(kube, review_concurrency=1, token_review_seconds=0)
    assert await reviews.user(TOKEN, token_key(TOKEN)) is not None  # known, not kept
    gate = asyncio.Event()
    entered: list[str] = []  # whose review reached the API server, in turn

    async def hold(method: str, *args: Any) -> None:
        if method == "review_token":
            entered.append(args[0])
            await gate.wait()

    kube.error_callback = hold
    flood = [
        asyncio.ensure_future(reviews.user(f"made-up-{n}", token_key(f"made-up-{n}")))
        for n in range(5)
    ]
    await until(lambda: entered, "a review in flight")
    known = asyncio.ensure_future(reviews.user(TOKEN, token_key(TOKEN)))
    for _ in range(5):
        await asyncio.sleep(0)
    gate.set()
    assert await known is not None
    await asyncio.gather(*flood)
    assert entered[:2] == ["made-up-0", TOKEN], entered
