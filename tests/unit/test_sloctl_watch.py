"""sloctl watch against a mocked stream: what it prints and how it resumes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from tests.unit.conftest import served_openapi
from tests.unit.test_sloctl import SERVER, SUMMARIES, TOKEN, error, run

Obj = dict[str, Any]


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLO_API_URL", SERVER)
    monkeypatch.setenv("SLO_API_TOKEN", TOKEN)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    return slept


class Broken(httpx.SyncByteStream):
    """Lines, then the connection breaking mid-stream (or, with `end`, a clean close)."""

    def __init__(self, events: list[Obj], end: bool = False) -> None:
        self.events = events
        self.end = end

    def __iter__(self) -> Iterator[bytes]:
        for event in self.events:
            yield json.dumps(event).encode() + b"\n"
        if not self.end:
            raise httpx.ReadError("connection reset")


def event(type_: str, item: Obj, revision: str) -> Obj:
    return {"type": type_, "route": item["route"], "object": item, "revision": revision}


def test_watch_prints_changes_and_resumes_after_a_dropped_connection(
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat, batch = SUMMARIES[0], SUMMARIES[1]
    streams = [
        Broken(
            [
                event("ADDED", chat, "e.3"),
                event("ADDED", batch, "e.3"),
                {"type": "BOOKMARK", "initial": True, "revision": "e.3"},
                event("MODIFIED", {**chat, "priority": 4}, "e.4"),
            ]
        ),
        Broken([event("DELETED", batch, "e.6"), {"type": "BOOKMARK", "revision": "e.9"}], True),
    ]
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if streams:
            return httpx.Response(200, stream=streams.pop(0))
        return error(401, "unauthorized", "the token is not valid")

    with respx.mock(base_url=SERVER, assert_all_mocked=True) as api:
        api.get("/config").mock(side_effect=answer)
        code, out, err = run(capsys, "watch", "-o", "json", "--kind", "llm")
    assert code == 5  # ended by the 401 on the third connection
    printed = [json.loads(line) for line in out.splitlines()]
    assert [(e["type"], e["route"]) for e in printed] == [
        ("ADDED", "chat-7b"),
        ("ADDED", "batch-render"),
        ("MODIFIED", "chat-7b"),
        ("DELETED", "batch-render"),
    ]
    params = [dict(r.url.params) for r in seen]
    assert params[0] == {"watch": "true", "kind": "llm"}
    assert params[1] == {"watch": "true", "kind": "llm", "since": "e.4"}
    assert params[2]["since"] == "e.9"  # the bookmark moved the place on
    assert "resuming" in err


def test_watch_resumes_at_once_and_quietly_after_a_stream_that_ended_at_its_lifetime(
    capsys: pytest.CaptureFixture[str], no_sleep: list[float]
) -> None:
    chat = SUMMARIES[0]
    streams = [
        Broken(
            [
                event("ADDED", chat, "e.3"),
                {"type": "BOOKMARK", "initial": True, "revision": "e.3"},
                event("MODIFIED", {**chat, "priority": 4}, "e.4"),
                {"type": "BOOKMARK", "revision": "e.5", "final": True},
            ],
            end=True,
        ),
        Broken([event("MODIFIED", {**chat, "priority": 5}, "e.6")]),
    ]
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if streams:
            return httpx.Response(200, stream=streams.pop(0))
        return error(401, "unauthorized", "the token is not valid")

    with respx.mock(base_url=SERVER, assert_all_mocked=True) as api:
        api.get("/config").mock(side_effect=answer)
        code, out, err = run(capsys, "watch", "-o", "json")
    assert code == 5
    printed = [json.loads(line) for line in out.splitlines()]
    assert [(e["type"], e["object"]["priority"]) for e in printed] == [
        ("ADDED", chat["priority"]),
        ("MODIFIED", 4),
        ("MODIFIED", 5),
    ]
    # Resumed from the final bookmark's place, at once, without a word; the broken second
    # stream is resumed as any lost one (after a pause, saying so).
    assert dict(seen[1].url.params) == {"watch": "true", "since": "e.5"}
    assert dict(seen[2].url.params)["since"] == "e.6"
    assert no_sleep == [0.5]
    assert err.count("resuming") == 1


def test_watch_starts_over_when_its_place_expired_and_prints_what_changed_meanwhile(
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat, batch = SUMMARIES[0], SUMMARIES[1]
    answers = [
        httpx.Response(
            200,
            stream=Broken(
                [
                    event("ADDED", chat, "a.1"),
                    event("ADDED", batch, "a.1"),
                    {"type": "BOOKMARK", "initial": True, "revision": "a.1"},
                ]
            ),
        ),
        error(410, "expired", "revision 'a.1' is not from this server process"),
        # The whole state again: batch went away and chat changed while we were away.
        httpx.Response(
            200,
            stream=Broken(
                [
                    event("ADDED", {**chat, "priority": 3}, "b.1"),
                    {"type": "BOOKMARK", "initial": True, "revision": "b.1"},
                ]
            ),
        ),
        error(403, "forbidden", "no"),
    ]
    with respx.mock(base_url=SERVER, assert_all_mocked=True) as api:
        route = api.get("/config").mock(side_effect=answers)
        code, out, err = run(capsys, "watch", "-o", "json")
    assert code == 5
    assert "since" not in route.calls[2].request.url.params
    printed = [json.loads(line) for line in out.splitlines()]
    assert [(e["type"], e.get("route")) for e in printed] == [
        ("ADDED", "chat-7b"),
        ("ADDED", "batch-render"),
        ("RESYNC", None),
        ("DELETED", "batch-render"),
        ("MODIFIED", "chat-7b"),
    ]
    assert printed[-1]["object"]["priority"] == 3
    assert "starting over" in err


def test_watch_prints_a_table_and_follows_the_servers_error_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat = SUMMARIES[0]
    answers = [
        httpx.Response(
            200,
            stream=Broken(
                [
                    event("ADDED", chat, "a.1"),
                    {"type": "BOOKMARK", "initial": True, "revision": "a.1"},
                    # What may be listed changed: watch again from the whole state.
                    {"type": "ERROR", "error": {"code": "expired", "message": "changed"}},
                ],
                True,
            ),
        ),
        httpx.Response(
            200,
            stream=Broken(
                [
                    event("ADDED", chat, "b.1"),
                    {"type": "BOOKMARK", "initial": True, "revision": "b.1"},
                    {"type": "ERROR", "error": {"code": "forbidden", "message": "no access"}},
                ],
                True,
            ),
        ),
    ]
    with respx.mock(base_url=SERVER, assert_all_mocked=True) as api:
        api.get("/openapi.json").respond(json=served_openapi())
        route = api.get("/config").mock(side_effect=answers)
        code, out, err = run(capsys, "watch")
    assert code == 5
    assert "since" not in route.calls[1].request.url.params
    lines = out.splitlines()
    assert lines[0].split() == [
        "ADDED",
        "chat-7b",
        "llm",
        "priority=10",
        "min=replica:1",
        "max=replica:4",
    ]
    assert lines[1].split()[0] == "RESYNC"
    assert len(lines) == 2  # chat did not change: nothing more to print
    assert "no access" in err


def test_watch_that_cannot_start_exits_with_the_servers_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with respx.mock(base_url=SERVER, assert_all_mocked=True) as api:
        api.get("/openapi.json").respond(json=served_openapi())
        api.get("/config").mock(return_value=error(400, "invalid_request", "kind: bad"))
        code, _, err = run(capsys, "watch")
    assert code == 2
    assert "kind: bad" in err


def test_a_stream_cut_inside_its_initial_state_starts_over(
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat, batch = SUMMARIES[0], SUMMARIES[1]
    answers = [
        # Cut after the first route of the initial state: resuming from its revision would
        # never bring the second.
        httpx.Response(200, stream=Broken([event("ADDED", chat, "e.3")])),
        httpx.Response(
            200,
            stream=Broken(
                [
                    event("ADDED", chat, "e.3"),
                    event("ADDED", batch, "e.3"),
                    {"type": "BOOKMARK", "initial": True, "revision": "e.3"},
                ]
            ),
        ),
        error(401, "unauthorized", "the token is not valid"),
    ]
    with respx.mock(base_url=SERVER, assert_all_mocked=True) as api:
        route = api.get("/config").mock(side_effect=answers)
        code, _, _ = run(capsys, "watch", "-o", "json")
    assert code == 5
    assert "since" not in route.calls[1].request.url.params
    assert route.calls[2].request.url.params["since"] == "e.3"
