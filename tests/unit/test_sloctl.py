"""sloctl against a mocked slo-api: the requests it sends, what it prints, how it exits."""

from __future__ import annotations

import copy
import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
import yaml

from slo_api.cli.__main__ import main
from tests.unit.conftest import served_openapi

SERVER = "http://slo.test"
TOKEN = "s3cret"

LLM: dict[str, Any] = {
    "route": "chat-7b",
    "kind": "llm",
    "highPriority": False,
    "priority": 0,
    "minimumDeployment": {"type": "replica", "value": 1},
    "maximumDeployment": {"type": "replica", "value": 4},
    "ttft": {
        "default": {"metrics": [{"type": "p90", "threshold": 0.8}]},
        "ranges": [
            {
                "contextLengthRangeLow": 0,
                "contextLengthRangeHigh": 4096,
                "metrics": [{"type": "p90", "threshold": 0.5}],
            }
        ],
    },
    "otps": {"default": {"metrics": [{"type": "avg", "threshold": 20}]}},
    "pool": {"route": "gpu-slot-a", "resident": True, "phase": "Ready"},
}

POOL: dict[str, Any] = {
    "route": "gpu-slot-a",
    "kind": "pool",
    "pool": {
        "members": ["chat-7b", "code-13b"],
        "default": "chat-7b",
        "swapPolicy": "sticky",
        "swapBudget": "300s",
        "reclaimAfter": "300s",
        "gpu": 1,
    },
    "status": {"phase": "Ready", "residentMember": "chat-7b", "pendingMember": None},
}

SUMMARIES: list[dict[str, Any]] = [
    {
        "route": "chat-7b",
        "kind": "llm",
        "highPriority": True,
        "priority": 10,
        "minimumDeployment": {"type": "replica", "value": 1},
        "maximumDeployment": {"type": "replica", "value": 4},
    },
    {
        "route": "batch-render",
        "kind": "job",
        "highPriority": False,
        "priority": 3,
        "minimumDeployment": {"type": "concurrency", "value": 0},
        "maximumDeployment": None,
    },
    {
        "route": "gpu-slot-a",
        "kind": "pool",
        "swapPolicy": "sticky",
        "swapBudget": "300s",
        "residentMember": "chat-7b",
    },
    {"route": "translate-3b", "ambiguous": True, "kinds": ["llm"], "count": 2},
]


def error(status: int, code: str, message: str, **extra: Any) -> httpx.Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    return httpx.Response(
        status, json={"error": {"code": code, "message": message, **extra}}, headers=headers
    )


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLO_API_URL", SERVER)
    monkeypatch.setenv("SLO_API_TOKEN", TOKEN)


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    # assert_all_mocked: a request the test did not expect fails the test.
    with respx.mock(base_url=SERVER, assert_all_called=False, assert_all_mocked=True) as router:
        # What a table shows of each kind's summaries is the server's document's to say.
        router.get("/openapi.json").respond(json=served_openapi())
        yield router


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def sent_json(call: Any) -> Any:
    return json.loads(call.request.content)


def view(out: str) -> dict[str, str]:
    """`key  value` lines (get, and the changes set prints) as a dict."""
    return dict(line.strip().split(None, 1) for line in out.splitlines() if "  " in line.strip())


def table_rows(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in out.splitlines()}


# -- list ---------------------------------------------------------------------------------------


def test_list_walks_every_page_and_prints_a_table(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    page1 = api.get("/config", params__eq={"page": "1", "pageSize": "200"}).respond(
        json={"items": SUMMARIES[:2], "total": 4, "page": 1, "pageSize": 200}
    )
    page2 = api.get("/config", params__eq={"page": "2", "pageSize": "200"}).respond(
        json={"items": SUMMARIES[2:], "total": 4, "page": 2, "pageSize": 200}
    )

    code, out, _ = run(capsys, "list")

    assert code == 0
    assert page1.call_count == page2.call_count == 1
    assert page1.calls.last.request.headers["Authorization"] == f"Bearer {TOKEN}"
    rows = table_rows(out)
    assert rows["ROUTE"] == [
        "ROUTE", "KIND", "PRIORITY", "MIN", "MAX", "POLICY", "BUDGET", "RESIDENT",
    ]  # fmt: skip
    assert rows["chat-7b"] == ["chat-7b", "llm", "10", "replica:1", "replica:4", "-", "-", "-"]
    assert rows["batch-render"][2:5] == ["3", "concurrency:0", "-"]
    assert rows["gpu-slot-a"] == ["gpu-slot-a", "pool", "-", "-", "-", "sticky", "300s", "chat-7b"]
    assert rows["translate-3b"][1] == "ambiguous(2:llm)"


def test_list_kind_pool_filters_on_the_server_and_shows_only_pool_columns(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    route = api.get("/config").respond(json={"items": [SUMMARIES[2]], "total": 1})

    code, out, _ = run(capsys, "list", "--kind", "pool")

    assert code == 0
    assert dict(route.calls.last.request.url.params) == {
        "page": "1",
        "pageSize": "200",
        "kind": "pool",
    }
    assert out.splitlines()[0].split() == ["ROUTE", "KIND", "POLICY", "BUDGET", "RESIDENT"]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_list_machine_output_is_every_item(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    api.get("/config", params={"page": "1"}).respond(json={"items": SUMMARIES[:3], "total": 4})
    api.get("/config", params={"page": "2"}).respond(json={"items": SUMMARIES[3:], "total": 4})

    code, out, _ = run(capsys, "list", "-o", fmt)

    assert code == 0
    assert (json.loads(out) if fmt == "json" else yaml.safe_load(out)) == SUMMARIES


def test_list_stops_on_an_empty_page_even_if_total_promises_more(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/config", params={"page": "1"}).respond(json={"items": SUMMARIES[:1], "total": 5})
    api.get("/config", params={"page": "2"}).respond(json={"items": [], "total": 5})

    code, out, _ = run(capsys, "list", "-o", "json")

    assert code == 0
    assert json.loads(out) == SUMMARIES[:1]


def test_list_table_columns_are_the_kinds_summary_fields_the_server_names(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = copy.deepcopy(served_openapi())
    # A server whose job summaries hold only a priority: its job rows have no bound columns.
    doc["components"]["schemas"]["Summary"]["x-summary"]["job"] = {"priority": "priority"}
    api.get("/openapi.json").respond(json=doc)
    api.get("/config").respond(json={"items": SUMMARIES[:2], "total": 2})

    code, out, _ = run(capsys, "list")

    assert code == 0
    rows = table_rows(out)
    assert rows["ROUTE"] == ["ROUTE", "KIND", "PRIORITY", "MIN", "MAX", "PRIORITY"]
    assert rows["chat-7b"] == ["chat-7b", "llm", "10", "replica:1", "replica:4", "-"]
    assert rows["batch-render"] == ["batch-render", "job", "-", "-", "-", "3"]


def test_list_table_from_a_server_that_does_not_say_what_a_summary_holds_is_an_error(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = copy.deepcopy(served_openapi())
    del doc["components"]["schemas"]["Summary"]["x-summary"]
    api.get("/openapi.json").respond(json=doc)
    api.get("/config").respond(json={"items": SUMMARIES, "total": 4})

    code, out, err = run(capsys, "list")

    assert code == 1
    assert out == ""
    assert "x-summary" in err
    # Scripts do not need it.
    assert run(capsys, "list", "-o", "json")[0] == 0


def test_list_with_no_routes_says_so(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/config").respond(json={"items": [], "total": 0})

    code, out, err = run(capsys, "list")

    assert (code, out) == (0, "")
    assert "no routes" in err


# -- get ----------------------------------------------------------------------------------------


def test_get_prints_keys_that_set_accepts(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LLM, headers={"ETag": '"7"'})

    code, out, _ = run(capsys, "get", "chat-7b")

    assert code == 0
    shown = view(out)
    assert shown["priority"] == "0"
    assert shown["minimumDeployment"] == "replica:1"
    assert shown["maximumDeployment"] == "replica:4"
    assert shown["ttft.default.p90"] == "0.8"
    assert shown["ttft.ranges.0.contextLengthRangeHigh"] == "4096"
    assert shown["ttft.ranges.0.p90"] == "0.5"
    assert shown["otps.default.avg"] == "20"
    assert shown["pool.route"] == "gpu-slot-a"


def test_get_pool_lists_members_on_one_line(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/gpu-slot-a").respond(json=POOL)

    _, out, _ = run(capsys, "get", "gpu-slot-a")

    shown = view(out)
    assert shown["pool.members"] == "chat-7b, code-13b"
    assert shown["pool.swapBudget"] == "300s"
    assert shown["status.pendingMember"] == "null"


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_get_machine_output_is_the_body(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    api.get("/routes/chat-7b").respond(json=LLM)

    _, out, _ = run(capsys, "get", "chat-7b", "-o", fmt)

    assert (json.loads(out) if fmt == "json" else yaml.safe_load(out)) == LLM


def test_route_names_are_escaped_into_one_path_segment(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    route = api.get(path__regex=r"^/routes/").respond(json={"route": "a/b c?d"})

    code, _, _ = run(capsys, "get", "a/b c?d")

    assert code == 0
    assert route.calls.last.request.url.raw_path == b"/routes/a%2Fb%20c%3Fd"


def test_options_work_after_the_command_and_override_the_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with respx.mock(assert_all_mocked=True) as router:
        route = router.get("https://other.test/prefix/routes/x").respond(json={"route": "x"})
        code, _, _ = run(
            capsys, "get", "x", "--server", "https://other.test/prefix/", "--token", "t2"
        )
    assert code == 0
    assert route.calls.last.request.headers["Authorization"] == "Bearer t2"


def test_without_a_token_no_authorization_header_is_sent(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLO_API_TOKEN")
    route = api.get("/routes/x").respond(json={"route": "x"})

    run(capsys, "get", "x")

    assert "Authorization" not in route.calls.last.request.headers


# -- set ----------------------------------------------------------------------------------------


def test_set_puts_only_changed_fields_with_if_match(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LLM, headers={"ETag": '"7"'})
    stored = {**LLM, "priority": 10, "highPriority": True}
    put = api.put("/routes/chat-7b").respond(json=stored, headers={"ETag": '"8"'})

    code, out, _ = run(capsys, "set", "chat-7b", "priority=10")

    assert code == 0
    request = put.calls.last.request
    assert request.headers["If-Match"] == '"7"'
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["Content-Type"] == "application/json"
    assert "dryRun" not in request.url.params
    assert sent_json(put.calls.last) == {"route": "chat-7b", "priority": 10}
    assert out.splitlines()[0] == "chat-7b: updated"
    # highPriority is derived by the server, and shown because the user would want to know.
    assert view(out) == {"priority": "0 -> 10", "highPriority": "false -> true"}


def test_set_sends_a_changed_section_whole(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LLM, headers={"ETag": '"7"'})
    put = api.put("/routes/chat-7b").respond(json=LLM)

    code, _, _ = run(capsys, "set", "chat-7b", "ttft.default.p99=2", "max=pdengine:2", "min=3")

    assert code == 0
    expected_ttft = copy.deepcopy(LLM["ttft"])
    expected_ttft["default"]["metrics"].append({"type": "p99", "threshold": 2})
    assert sent_json(put.calls.last) == {
        "route": "chat-7b",
        "ttft": expected_ttft,  # ranges included: a section sent replaces the stored one
        "maximumDeployment": {"type": "pdengine", "value": 2},
        "minimumDeployment": {"type": "replica", "value": 3},
    }


def test_set_pool_fields(api: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    api.get("/routes/gpu-slot-a").respond(json=POOL, headers={"ETag": '"3"'})
    put = api.put("/routes/gpu-slot-a").respond(json=POOL)

    run(capsys, "set", "gpu-slot-a", "pool.swapBudget=90s", "pool.default=code-13b")

    assert sent_json(put.calls.last) == {
        "route": "gpu-slot-a",
        "pool": {**POOL["pool"], "swapBudget": "90s", "default": "code-13b"},
    }


def test_set_dry_run_and_force(api: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    api.get("/routes/chat-7b").respond(json=LLM, headers={"ETag": '"7"'})
    put = api.put("/routes/chat-7b").respond(json={**LLM, "priority": 5})

    code, out, _ = run(capsys, "set", "chat-7b", "priority=5", "--dry-run", "--force")

    assert code == 0
    request = put.calls.last.request
    assert request.url.params["dryRun"] == "true"
    assert "If-Match" not in request.headers
    assert out.splitlines()[0] == "chat-7b: would be updated (dry run)"


def test_set_json_output_is_the_stored_body(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = {**LLM, "priority": 4}
    api.get("/routes/chat-7b").respond(json=LLM)
    api.put("/routes/chat-7b").respond(json=stored)

    _, out, _ = run(capsys, "set", "chat-7b", "priority=4", "-o", "json")

    assert json.loads(out) == stored


def test_set_without_a_change_sends_nothing(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LLM)  # no PUT mocked: sending one fails the test

    code, out, _ = run(capsys, "set", "chat-7b", "priority=0", "otps.default.avg=20")

    assert code == 0
    assert "unchanged" in out


def test_set_retries_on_412_against_the_fresh_body(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh = {**LLM, "priority": 3}  # someone else wrote between our GET and PUT
    api.get("/routes/chat-7b").mock(
        side_effect=[
            httpx.Response(200, json=LLM, headers={"ETag": '"7"'}),
            httpx.Response(200, json=fresh, headers={"ETag": '"9"'}),
        ]
    )
    put = api.put("/routes/chat-7b").mock(
        side_effect=[
            error(412, "precondition_failed", "the route changed since it was read"),
            httpx.Response(
                200, json={**fresh, "minimumDeployment": {"type": "replica", "value": 2}}
            ),
        ]
    )

    code, out, err = run(capsys, "set", "chat-7b", "min=2")

    assert code == 0
    assert [c.request.headers["If-Match"] for c in put.calls] == ['"7"', '"9"']
    assert sent_json(put.calls.last) == {
        "route": "chat-7b",
        "minimumDeployment": {"type": "replica", "value": 2},
    }
    assert "retrying" in err
    assert "chat-7b: updated" in out


def test_set_gives_up_after_three_retries(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    get = api.get("/routes/chat-7b").respond(json=LLM, headers={"ETag": '"7"'})
    put = api.put("/routes/chat-7b").mock(return_value=error(412, "precondition_failed", "stale"))

    code, out, err = run(capsys, "set", "chat-7b", "priority=1")

    assert code == 4
    assert get.call_count == put.call_count == 4  # one try and three retries
    assert out == ""
    assert "gave up after 4 tries" in err
    assert "--force" in err


def test_set_rejects_a_bad_assignment_before_any_request(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "set", "chat-7b", "priority")

    assert code == 2
    assert "expected key=value" in err
    assert not api.calls


def test_set_rejects_a_path_through_a_scalar_without_writing(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LLM)

    code, _, err = run(capsys, "set", "chat-7b", "priority.value=1")

    assert code == 2
    assert "priority is not an object" in err
    assert [c.request.method for c in api.calls] == ["GET"]


# -- apply --------------------------------------------------------------------------------------


def test_apply_puts_each_yaml_body_as_given(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bodies = [
        {"route": "chat-7b", "priority": 10, "ttft": LLM["ttft"]},
        {"route": "gpu-slot-a", "pool": {"swapBudget": "90s"}},
    ]
    path = tmp_path / "slo.yaml"
    path.write_text(yaml.safe_dump(bodies))
    chat = api.put("/routes/chat-7b").respond(json=LLM)
    pool = api.put("/routes/gpu-slot-a").respond(json=POOL)

    code, out, _ = run(capsys, "apply", "-f", str(path))

    assert code == 0
    assert sent_json(chat.calls.last) == bodies[0]
    assert sent_json(pool.calls.last) == bodies[1]
    assert "If-Match" not in chat.calls.last.request.headers
    assert chat.calls.last.request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert out.splitlines() == ["chat-7b: configured", "gpu-slot-a: configured"]


def test_apply_reads_json_from_stdin_with_dry_run(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"route": "chat-7b", "priority": 2})))
    put = api.put("/routes/chat-7b").respond(json={**LLM, "priority": 2})

    code, out, _ = run(capsys, "apply", "-f", "-", "--dry-run", "-o", "json")

    assert code == 0
    assert put.calls.last.request.url.params["dryRun"] == "true"
    assert json.loads(out)["priority"] == 2  # one body in, one object out


def test_apply_multi_document_yaml_outputs_a_list(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "slo.yaml"
    path.write_text("route: chat-7b\npriority: 1\n---\nroute: gpu-slot-a\n")
    api.put("/routes/chat-7b").respond(json=LLM)
    api.put("/routes/gpu-slot-a").respond(json=POOL)

    _, out, _ = run(capsys, "apply", "-f", str(path), "-o", "yaml")

    assert yaml.safe_load(out) == [LLM, POOL]


def test_apply_continues_past_a_refused_body_and_exits_with_its_code(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "slo.json"
    path.write_text(json.dumps([{"route": "chat-7b", "priority": 11}, {"route": "gpu-slot-a"}]))
    api.put("/routes/chat-7b").respond(
        400, json={"error": {"code": "invalid_request", "message": "too big", "field": "priority"}}
    )
    pool = api.put("/routes/gpu-slot-a").respond(json=POOL)

    code, out, err = run(capsys, "apply", "-f", str(path))

    assert code == 2
    assert pool.called
    # Said as swissd says it: the field, then the message said of it.
    assert "chat-7b: priority: too big" in err
    assert out == "gpu-slot-a: configured\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"priority": 1}', 'has no "route"'),
        ("[1, 2]", "is not an object"),
        ("route: [unclosed", "neither JSON nor YAML"),
        ("", "holds no bodies"),
        ('{"route": "x", "priority": .nan}', "cannot be sent as JSON"),
    ],
)
def test_apply_refuses_a_bad_file_before_sending(
    api: respx.MockRouter,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    content: str,
    message: str,
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    code, _, err = run(capsys, "apply", "-f", str(path))

    assert code == 2
    assert message in err
    assert not api.calls


def test_apply_missing_file(api: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "apply", "-f", "does-not-exist.yaml")

    assert code == 2
    assert "cannot read does-not-exist.yaml" in err


# -- reset --------------------------------------------------------------------------------------


def test_reset_sends_delete(api: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    delete = api.delete("/routes/chat-7b").respond(204)

    code, out, _ = run(capsys, "reset", "chat-7b")

    assert code == 0
    assert "dryRun" not in delete.calls.last.request.url.params
    assert delete.calls.last.request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert out == "chat-7b: reset to defaults\n"


def test_reset_dry_run_prints_the_would_be_body(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    would_be = {**LLM, "priority": 0, "ttft": None}
    delete = api.delete("/routes/chat-7b").respond(200, json=would_be)

    code, out, _ = run(capsys, "reset", "chat-7b", "--dry-run", "-o", "json")

    assert code == 0
    assert delete.calls.last.request.url.params["dryRun"] == "true"
    assert json.loads(out) == would_be


def test_reset_json_rereads_after_a_204(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.delete("/routes/chat-7b").respond(204)
    api.get("/routes/chat-7b").respond(json={"route": "chat-7b", "priority": 0})

    _, out, _ = run(capsys, "reset", "chat-7b", "-o", "json")

    assert json.loads(out) == {"route": "chat-7b", "priority": 0}


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "exit_code", "shown"),
    [
        (error(400, "invalid_request", "must be 0..10", field="priority"), 2,
         "priority: must be 0..10"),
        (error(401, "unauthorized", "missing or invalid bearer token"), 5, "--token"),
        (error(403, "forbidden", "read-only token"), 5, "read-only token"),
        (error(404, "not_found", 'route "chat-7b" not found'), 3, 'route "chat-7b" not found'),
        (error(409, "conflict", "route claimed by 2 CRs (llm, job)"), 4, "claimed by 2 CRs"),
        (error(500, "internal", "boom"), 1, "boom"),
        (error(502, "upstream_error", "the API server failed"), 1, "the API server failed"),
        (error(503, "not_ready", "index not synced"), 1, "index not synced"),
        (error(504, "upstream_timeout", "the API server timed out"), 1, "timed out"),
        (httpx.Response(502, text="<html>Bad Gateway</html>"), 1, "HTTP 502 Bad Gateway"),
        (httpx.Response(200, text="<html>not the API</html>"), 1, "without a JSON object"),
    ],
)  # fmt: skip
def test_api_errors_print_the_message_and_exit_with_its_code(
    api: respx.MockRouter,
    capsys: pytest.CaptureFixture[str],
    response: httpx.Response,
    exit_code: int,
    shown: str,
) -> None:
    api.get("/routes/chat-7b").mock(return_value=response)

    code, out, err = run(capsys, "get", "chat-7b")

    assert (code, out) == (exit_code, "")
    assert shown in err
    assert "Traceback" not in err


def test_several_causes_are_listed(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    causes = [
        {"field": "minimumDeployment", "message": "both bounds pdengine or neither"},
        {"field": "maximumDeployment", "message": "a pdengine maximum is not 1"},
    ]
    api.get("/routes/chat-7b").respond(json=LLM)
    api.put("/routes/chat-7b").mock(
        return_value=error(400, "invalid_request", "2 problems", causes=causes)
    )

    code, _, err = run(capsys, "set", "chat-7b", "max=pdengine:1")

    assert code == 2
    assert "maximumDeployment: a pdengine maximum is not 1" in err


def test_the_cause_the_message_says_is_not_listed_again(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    causes = [
        {"field": "priority", "message": "must be an integer"},
        {"field": "otps.default", "message": "is required"},
    ]
    api.get("/routes/chat-7b").respond(json=LLM)
    api.put("/routes/chat-7b").mock(
        return_value=error(
            400, "invalid_request", "must be an integer", field="priority", causes=causes
        )
    )

    code, _, err = run(capsys, "set", "chat-7b", "priority=1")

    assert code == 2
    assert err.count("priority: must be an integer") == 1
    assert "otps.default: is required" in err


@pytest.mark.parametrize(
    ("exc", "shown"),
    [
        (httpx.ReadTimeout("timed out"), "no answer from http://slo.test within 10s"),
        (httpx.ConnectTimeout("timed out"), "no answer from"),
        (httpx.ConnectError("[Errno 111] Connection refused"), "cannot connect to"),
        (httpx.RemoteProtocolError("peer closed connection"), "peer closed connection"),
    ],
)
def test_network_failures_exit_1_without_a_traceback(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], exc: Exception, shown: str
) -> None:
    api.get("/config").mock(side_effect=exc)

    code, _, err = run(capsys, "list")

    assert code == 1
    assert shown in err


def test_apply_stops_at_server_trouble(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "slo.json"
    path.write_text(json.dumps([{"route": "a"}, {"route": "b"}]))
    api.put("/routes/a").mock(side_effect=httpx.ConnectError("refused"))
    b = api.put("/routes/b").respond(json={"route": "b"})

    code, _, _ = run(capsys, "apply", "-f", str(path))

    assert code == 1
    assert not b.called


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_connection_refused_for_real(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--server", f"http://127.0.0.1:{_unused_port()}", "list")

    assert code == 1
    assert "cannot connect to" in err


def test_timeout_for_real(capsys: pytest.CaptureFixture[str]) -> None:
    # A listening socket that never answers: the kernel accepts the connection, nobody replies.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code, _, err = run(
            capsys, "--server", f"http://127.0.0.1:{port}", "--timeout", "0.2", "list"
        )

    assert code == 1
    assert "within 0.2s" in err


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_reader_that_goes_away_is_not_an_error(
    api: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.get("/config").respond(json={"items": SUMMARIES, "total": 4})
    monkeypatch.setattr("sys.stdout", _ClosedPipe())

    assert main(["list"]) == 0


# -- usage --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [[], ["list"], ["get"], ["set"], ["apply"], ["reset"]],
)
def test_help_on_every_command_documents_the_exit_codes(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, _ = run(capsys, *argv, "--help")

    assert code == 0
    assert "usage: sloctl" in out
    assert "4  conflict" in out
    assert "SLO_API_TOKEN" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["get"],
        ["set", "chat-7b"],
        ["list", "--kind", "cron"],
        ["get", "x", "-o", "xml"],
        ["get", "x", "--timeout", "0"],
        ["apply"],
    ],
)
def test_bad_arguments_exit_2(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, _, err = run(capsys, *argv)

    assert code == 2
    assert "usage: sloctl" in err
    assert not api.calls


def test_no_server_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLO_API_URL")

    code, _, err = run(capsys, "list")

    assert code == 2
    assert "SLO_API_URL" in err


def test_a_server_without_a_scheme_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--server", "localhost:8080", "list")

    assert code == 2
    assert "http://" in err


def test_get_shows_the_fields_a_gitops_tool_manages(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json={**LLM, "managed": {"priority": "argocd-controller"}})

    code, out, _ = run(capsys, "get", "chat-7b")

    assert code == 0
    assert view(out)["managed.priority"] == "argocd-controller"


def test_set_refused_as_field_managed_hints_at_force(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LLM, headers={"ETag": '"7"'})
    api.put("/routes/chat-7b").mock(
        return_value=error(
            409,
            "field_managed",
            "priority is managed by argocd-controller",
            causes=[{"field": "priority", "manager": "argocd-controller", "message": "m"}],
        )
    )

    code, out, err = run(capsys, "set", "chat-7b", "priority=5")

    assert code != 0
    assert out == ""
    assert "argocd-controller" in err
    assert "--force" in err


def test_set_force_asks_the_server_to_force_and_prints_its_warning(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LLM, headers={"ETag": '"7"'})
    warning = '299 - "forced over argocd-controller (priority): it will revert this change"'
    put = api.put("/routes/chat-7b").respond(
        json={**LLM, "priority": 5}, headers={"Warning": warning}
    )

    code, _, err = run(capsys, "set", "chat-7b", "priority=5", "--force")

    assert code == 0
    assert put.calls.last.request.url.params["force"] == "true"
    assert "sloctl: warning: forced over argocd-controller (priority)" in err
    assert "299" not in err


def test_reset_force(api: respx.MockRouter, capsys: pytest.CaptureFixture[str]) -> None:
    delete = api.delete("/routes/chat-7b").respond(204)

    code, _, _ = run(capsys, "reset", "chat-7b", "--force")

    assert code == 0
    assert delete.calls.last.request.url.params["force"] == "true"
