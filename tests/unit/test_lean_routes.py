"""The lean twins of /routes/{route}: the same answers as FastAPI's general path, without its
dependency solver."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi.dependencies.utils import solve_dependencies

from tests.unit.conftest import AUTH, Started, llm_cr
from tests.unit.fakes import FakeKube

JSON = {**AUTH, "Content-Type": "application/json"}
# Each step: method, path, headers, body. Run once as is (the lean path: no query string) and
# once with a query string that changes nothing (FastAPI's general path).
STEPS: list[tuple[str, str, dict[str, str], bytes | None]] = [
    ("GET", "/routes/a", AUTH, None),
    ("GET", "/config/a", AUTH, None),
    ("GET", "/routes/a", {**AUTH, "If-None-Match": '"101"'}, None),
    ("GET", "/routes/a", {}, None),
    ("GET", "/routes/a", {"Authorization": "Bearer nope"}, None),
    ("GET", "/routes/missing", AUTH, None),
    ("GET", "/routes/bad%01name", AUTH, None),
    ("PUT", "/routes/a", JSON, b'{"priority": 3}'),
    ("PUT", "/routes/a", JSON, b'{"priority": 3}'),
    ("PUT", "/routes/a", {**JSON, "If-Match": '"1"'}, b'{"priority": 4}'),
    ("PUT", "/routes/a", {**JSON, "If-Match": "W/x"}, b'{"priority": 4}'),
    ("PUT", "/routes/a", {**JSON, "If-Match": "nonsense"}, b'{"priority": 4}'),
    ("PUT", "/routes/a", {**AUTH, "Content-Type": "text/plain"}, b'{"priority": 4}'),
    ("PUT", "/routes/a", JSON, b"{not json"),
    ("PUT", "/routes/a", JSON, b'{"priority": 99}'),
    ("PUT", "/routes/a", {"Content-Type": "application/json"}, b'{"priority": 4}'),
    ("PUT", "/config/missing", JSON, b'{"priority": 4}'),
    ("DELETE", "/routes/a", {**AUTH, "If-Match": '"1"'}, None),
    ("DELETE", "/routes/a", AUTH, None),
    ("GET", "/routes/a", AUTH, None),
]
# What a query string that asks for the defaults looks like for each method.
GENERAL = {"GET": "?unused=1", "PUT": "?dryRun=false&force=false", "DELETE": "?dryRun=false"}


async def _ready(app: Any) -> None:
    for _ in range(200):
        if app.state.runtime.ready():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never ready")


def _answer(response: httpx.Response) -> tuple[int, bytes, dict[str, str]]:
    # The request id is new for every request; the rest must be byte for byte the same.
    headers = {k: v for k, v in response.headers.items() if k != "x-request-id"}
    return response.status_code, response.content, headers


async def _run(start: Started, query: bool) -> list[Any]:
    kube = FakeKube({"llmslorequirements": [llm_cr("a"), llm_cr("b")]})
    async with start(kube) as (client, app):
        await _ready(app)
        answers: list[Any] = []
        for method, path, headers, body in STEPS:
            url = path + (GENERAL[method] if query else "")
            answers.append(
                _answer(await client.request(method, url, headers=headers, content=body))
            )
        answers.append(kube.patches)
        return answers


@pytest.fixture
def solver_calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every call of FastAPI's dependency solver, counted."""
    calls: list[object] = []

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("request"))
        return await solve_dependencies(*args, **kwargs)

    # Where the route handler looks it up.
    monkeypatch.setattr("fastapi.routing.solve_dependencies", counted)
    return calls


async def test_the_lean_path_answers_as_the_general_path(
    start: Started, solver_calls: list[object]
) -> None:
    lean = await _run(start, query=False)
    assert solver_calls == [], "a request without a query string went through the solver"
    general = await _run(start, query=True)
    assert len(solver_calls) == len(STEPS)
    assert lean == general
    statuses = [status for status, _, _ in lean[:-1]]
    # The steps cover what they claim to: answers, conditions and refusals alike.
    assert statuses == [
        200, 200, 304, 401, 401, 404, 400,
        200, 200, 412, 412, 400, 415, 400, 400, 401, 404,
        412, 204, 200,
    ]  # fmt: skip


async def test_a_query_parameter_is_still_validated(start: Started) -> None:
    async with start(FakeKube({"llmslorequirements": [llm_cr("a")]})) as (client, app):
        await _ready(app)
        refused = await client.put("/routes/a?dryRun=maybe", headers=JSON, content=b"{}")
        assert refused.status_code == 400
        assert refused.json()["error"]["field"] == "dryRun"
        dry = await client.put("/routes/a?dryRun=true", headers=JSON, content=b'{"priority": 5}')
        assert dry.status_code == 200
        assert dry.json()["priority"] == 5
        assert (await client.get("/routes/a", headers=AUTH)).json()["priority"] == 0
