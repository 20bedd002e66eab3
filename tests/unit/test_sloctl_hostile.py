"""sloctl: tokens kept off the command line, and nothing a server sends can steer the terminal."""

from __future__ import annotations

import io
import json
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
TOKEN = "file-token-0123456789"
EVIL = "chat\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil\r\nroute\x7f"
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e", "\r", "\x7f")


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLO_API_URL", SERVER)
    monkeypatch.delenv("SLO_API_TOKEN", raising=False)


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=SERVER, assert_all_called=False, assert_all_mocked=True) as router:
        router.get("/openapi.json").respond(json=served_openapi())
        yield router


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _body(route: str = "chat-7b") -> dict[str, Any]:
    return {"route": route, "kind": "llm", "priority": 0, "highPriority": False}


def test_token_file_sends_the_token_it_holds(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    get = api.get("/routes/chat-7b").respond(json=_body())
    code, _, _ = run(capsys, "--token-file", str(path), "get", "chat-7b")
    assert code == 0
    assert get.calls.last.request.headers["Authorization"] == f"Bearer {TOKEN}"


def test_token_file_dash_reads_standard_input(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(f"  {TOKEN}\n"))
    get = api.get("/routes/chat-7b").respond(json=_body())
    code, _, _ = run(capsys, "get", "chat-7b", "--token-file", "-")
    assert code == 0
    assert get.calls.last.request.headers["Authorization"] == f"Bearer {TOKEN}"


def test_token_file_beats_the_environment(
    api: respx.MockRouter,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLO_API_TOKEN", "environment-token-000")
    path = tmp_path / "token"
    path.write_text(TOKEN)
    get = api.get("/routes/chat-7b").respond(json=_body())
    run(capsys, "--token-file", str(path), "get", "chat-7b")
    assert get.calls.last.request.headers["Authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    ("content", "extra", "says"),
    [
        (None, [], "cannot read"),
        ("", [], "empty"),
        ("two\nlines\n", [], "one line"),
        (TOKEN, ["--token", "other-token-0123456"], "not both"),
    ],
)
def test_bad_token_files_are_usage_errors(
    api: respx.MockRouter,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    content: str | None,
    extra: list[str],
    says: str,
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    code, _, err = run(capsys, "--token-file", str(path), *extra, "get", "chat-7b")
    assert code == 2
    assert says in err
    assert TOKEN not in err
    assert not api.calls


def test_stdin_cannot_hold_both_the_token_and_the_bodies(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(TOKEN))
    code, _, err = run(capsys, "--token-file", "-", "apply", "-f", "-")
    assert code == 2
    assert "stdin" in err


def _no_raw_controls(text: str) -> None:
    for char in RAW_CONTROLS:
        assert char not in text, repr(char)


def test_list_table_escapes_control_characters_of_route_names(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLO_API_TOKEN", TOKEN)
    item = {"route": EVIL, "kind": "llm", "priority": 1}
    api.get("/config").respond(json={"items": [item], "total": 1, "page": 1, "pageSize": 200})
    code, out, _ = run(capsys, "list")
    assert code == 0
    _no_raw_controls(out)
    assert "\\x1b]0;pwned\\x07" in out
    assert len(out.strip().splitlines()) == 2  # the header and one row: no line was injected


def test_get_table_escapes_control_characters_of_values(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLO_API_TOKEN", TOKEN)
    api.get("/routes/chat-7b").respond(json={**_body(), "queue": {"promql": EVIL}})
    code, out, _ = run(capsys, "get", "chat-7b")
    assert code == 0
    _no_raw_controls(out)
    assert "\\x9b" in out


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_machine_output_escapes_control_characters_and_round_trips(
    api: respx.MockRouter,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
) -> None:
    monkeypatch.setenv("SLO_API_TOKEN", TOKEN)
    api.get("/routes/chat-7b").respond(json=_body(EVIL))
    code, out, _ = run(capsys, "get", "chat-7b", "-o", fmt)
    assert code == 0
    _no_raw_controls(out)
    parsed = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert parsed["route"] == EVIL


def test_server_error_messages_are_escaped(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLO_API_TOKEN", TOKEN)
    api.get("/routes/chat-7b").mock(
        return_value=httpx.Response(
            400,
            json={
                "error": {
                    "code": "invalid_request",
                    "message": f"bad {EVIL}",
                    "field": EVIL,
                    "causes": [{"field": "a", "message": EVIL}, {"field": "b", "message": "x"}],
                }
            },
        )
    )
    code, _, err = run(capsys, "get", "chat-7b")
    assert code == 2
    _no_raw_controls(err)
    assert "pwned" in err


def test_a_route_name_given_by_the_user_is_escaped_in_messages(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLO_API_TOKEN", TOKEN)
    api.delete(url__regex=r"/routes/.*").respond(status_code=204)
    code, out, err = run(capsys, "reset", EVIL)
    assert code == 0
    _no_raw_controls(out + err)
