"""sloctl history and revert against a mocked slo-api."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from slo_api.cli.commands import revert_body
from tests.unit.test_sloctl import LLM, POOL, SERVER, run

ENTRIES: list[dict[str, Any]] = [
    {
        "id": "120",
        "time": "2026-12-01T03:12:09Z",
        "actor": "kubectl-edit",
        "via": "kubectl-edit",
        "requestId": None,
        "changes": [{"field": "priority", "from": 6, "to": 0}],
        "after": {"route": "chat-7b", "kind": "llm", "priority": 0},
    },
    {
        "id": "110",
        "time": "2026-12-01T02:58:40Z",
        "actor": "token:write",
        "via": "slo-api",
        "requestId": "r-1",
        "changes": [
            {"field": "priority", "from": 0, "to": 6},
            {"field": "ttft", "from": None, "to": {"default": {"metrics": []}}},
        ],
        "after": {
            "route": "chat-7b",
            "kind": "llm",
            "priority": 6,
            "minimumDeployment": {"type": "replica", "value": 1},
        },
    },
]


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[respx.MockRouter]:
    monkeypatch.setenv("SLO_API_URL", SERVER)
    monkeypatch.setenv("SLO_API_TOKEN", "s3cret")
    with respx.mock(base_url=SERVER, assert_all_called=False, assert_all_mocked=True) as router:
        router.get("/routes/chat-7b/history").respond(
            json={"items": ENTRIES, "total": 2, "page": 1, "pageSize": 200}
        )
        yield router


def test_history_prints_a_line_per_change_newest_first(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "history", "chat-7b")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "TIME", "ACTOR", "VIA", "CHANGES"]
    assert lines[1].split()[:4] == ["120", "2026-12-01T03:12:09Z", "kubectl-edit", "kubectl-edit"]
    assert lines[1].endswith("priority 6->0")
    assert lines[2].endswith("priority 0->6, ttft set")
    code, out, _ = run(capsys, "history", "chat-7b", "-o", "json")
    assert json.loads(out) == ENTRIES


def test_history_says_which_entries_were_carried_over_from_a_config_map(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLO_API_URL", SERVER)
    monkeypatch.setenv("SLO_API_TOKEN", "s3cret")
    carried = [{**ENTRIES[0], "migrated": False}, {**ENTRIES[1], "migrated": True}]
    with respx.mock(base_url=SERVER, assert_all_mocked=True) as router:
        router.get("/routes/chat-7b/history").respond(
            json={"items": carried, "total": 2, "page": 1, "pageSize": 200}
        )
        code, out, _ = run(capsys, "history", "chat-7b")
    assert code == 0
    lines = out.splitlines()
    assert "migrated" not in lines[1]
    assert "token:write (migrated)" in lines[2]


def test_revert_puts_the_entry_back_conditionally_removing_what_it_lacked(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LLM, headers={"ETag": '"130"'})
    put = api.put("/routes/chat-7b").respond(json={**LLM, "priority": 6})
    code, out, _ = run(capsys, "revert", "chat-7b", "110")
    assert code == 0, out
    assert put.calls.last.request.headers["If-Match"] == '"130"'
    assert json.loads(put.calls.last.request.content) == {
        "route": "chat-7b",
        "kind": "llm",
        "priority": 6,
        "minimumDeployment": {"type": "replica", "value": 1},
        "maximumDeployment": None,
        "ttft": None,
        "otps": None,
    }


def test_revert_refuses_on_a_concurrent_change_and_an_unknown_entry(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LLM, headers={"ETag": '"130"'})
    api.put("/routes/chat-7b").mock(
        return_value=httpx.Response(
            412, json={"error": {"code": "precondition_failed", "message": "stale"}}
        )
    )
    code, _, err = run(capsys, "revert", "chat-7b", "110")
    assert code == 4
    assert "changed while it was being reverted" in err
    code, _, err = run(capsys, "revert", "chat-7b", "999")
    assert code == 3
    assert "no history entry" in err


def test_a_pool_revert_nulls_only_the_settings_it_lacked() -> None:
    after = {
        "route": "gpu-slot-a",
        "kind": "pool",
        "pool": {"swapPolicy": "sticky", "swapBudget": "90s"},
    }
    assert revert_body(after, POOL) == {
        "route": "gpu-slot-a",
        "kind": "pool",
        "pool": {
            "swapPolicy": "sticky",
            "swapBudget": "90s",
            "default": None,
            "reclaimAfter": None,
        },
    }


def test_revert_refuses_an_entry_that_keeps_only_a_digest_of_a_value(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    digest = {"digest": "sha256:" + "0" * 64, "size": 45_000}
    big = {**ENTRIES[1], "id": "140", "after": {**ENTRIES[1]["after"], "ttft": digest}}
    api.get("/routes/chat-7b/history").respond(
        json={"items": [big], "total": 1, "page": 1, "pageSize": 200}
    )
    put = api.put("/routes/chat-7b").respond(json=LLM)
    code, _, err = run(capsys, "revert", "chat-7b", "140")
    assert code == 2
    assert "keeps only a digest of ttft" in err
    assert not put.called
