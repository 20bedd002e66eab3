"""sloctl sends the token of a kubeconfig's current context: token, tokenFile or exec plugin."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import respx
import yaml

from slo_api.cli.__main__ import main

SERVER = "https://slo.test"


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLO_API_URL", SERVER)
    monkeypatch.delenv("SLO_API_TOKEN", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=SERVER, assert_all_called=False, assert_all_mocked=True) as router:
        yield router


def _kubeconfig(directory: Path, users: dict[str, Any], current: str = "mine") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": name, "user": user} for name, user in users.items()],
        "contexts": [{"name": name, "context": {"cluster": "c", "user": name}} for name in users],
        "current-context": current,
    }
    path = directory / "config"
    path.write_text(yaml.safe_dump(config))
    return path


def _sent_token(api: respx.MockRouter, *argv: str) -> tuple[int, str | None]:
    route = api.get("/routes/x").respond(json={"route": "x", "kind": "llm"})
    code = main([*argv, "get", "x", "-o", "json"])
    if not route.calls:
        return code, None
    return code, route.calls.last.request.headers.get("Authorization")


def test_the_current_context_s_token_is_sent_and_named(
    api: respx.MockRouter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _kubeconfig(tmp_path, {"other": {"token": "wrong"}, "mine": {"token": "kube-tok"}})
    assert _sent_token(api, "--kubeconfig", str(path)) == (0, "Bearer kube-tok")
    err = capsys.readouterr().err
    assert "kubeconfig context 'mine' (user 'mine')" in err
    assert "kube-tok" not in err


@pytest.mark.parametrize(
    ("server", "sent"),
    [
        ("http://slo.test", False),
        ("http://10.0.0.7:8080", False),
        ("http://127.0.0.1:8080", True),
        ("http://localhost:8080", True),
        ("http://[::1]:8080", True),
    ],
)
def test_a_kubeconfig_token_never_goes_over_plain_http_to_another_host(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    server: str,
    sent: bool,
) -> None:
    monkeypatch.setenv("SLO_API_URL", server)
    path = _kubeconfig(tmp_path, {"mine": {"token": "kube-tok"}})
    with respx.mock(base_url=server, assert_all_called=False) as router:
        route = router.get("/routes/x").respond(json={"route": "x", "kind": "llm"})
        code = main(["--kubeconfig", str(path), "get", "x", "-o", "json"])
    assert bool(route.calls) is sent
    if not sent:
        assert code == 2
        assert "refusing to send the credentials of kubeconfig context 'mine'" in (
            capsys.readouterr().err
        )
    # An explicit token is the caller's choice, wherever it goes.
    with respx.mock(base_url=server, assert_all_called=False) as router:
        route = router.get("/routes/x").respond(json={"route": "x", "kind": "llm"})
        assert main(["--token", "given", "get", "x", "-o", "json"]) == 0


def test_kubeconfig_from_the_environment_and_a_relative_token_file(
    api: respx.MockRouter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sa.token").write_text("from-a-file\n")
    path = _kubeconfig(tmp_path, {"mine": {"tokenFile": "sa.token"}})
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{path}")
    assert _sent_token(api) == (0, "Bearer from-a-file")


def test_an_exec_plugin_s_token_is_sent(api: respx.MockRouter, tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json, os, sys\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['kind'] == 'ExecCredential'\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "                  'status': {'token': sys.argv[1] + os.environ['SUFFIX']}}))\n"
    )
    exec_spec = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": [str(plugin), "exec-"],
        "env": [{"name": "SUFFIX", "value": "tok"}],
    }
    path = _kubeconfig(tmp_path, {"mine": {"exec": exec_spec}})
    assert _sent_token(api, "--kubeconfig", str(path)) == (0, "Bearer exec-tok")


def test_an_explicit_token_wins_over_the_kubeconfig(api: respx.MockRouter, tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"mine": {"token": "kube-tok"}})
    assert _sent_token(api, "--kubeconfig", str(path), "--token", "given") == (0, "Bearer given")


@pytest.mark.parametrize(
    ("user", "says", "exit_code"),
    [
        ({"client-certificate": "c.pem", "client-key": "k.pem"}, "no bearer token", 2),
        ({"tokenFile": "missing.token"}, "cannot read the tokenFile", 2),
        ({"exec": {"command": "false-plugin-that-is-not-there"}}, "plugin", 5),
        ({"exec": {"command": sys.executable, "args": ["-c", "print('{}')"]}}, "no Exec", 5),
    ],
)
def test_a_context_without_a_usable_token_is_a_clear_error(
    api: respx.MockRouter,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    user: dict[str, Any],
    says: str,
    exit_code: int,
) -> None:
    path = _kubeconfig(tmp_path, {"mine": user})
    code, sent = _sent_token(api, "--kubeconfig", str(path))
    assert (code, sent) == (exit_code, None)
    assert says in capsys.readouterr().err


def test_a_missing_context_is_a_usage_error(
    api: respx.MockRouter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _kubeconfig(tmp_path, {"mine": {"token": "t"}}, current="gone")
    assert _sent_token(api, "--kubeconfig", str(path)) == (2, None)
    assert "no context 'gone'" in capsys.readouterr().err
