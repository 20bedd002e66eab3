"""Settings an operator coming from the original service writes, and values that disagree."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from slo_api import __main__ as entry
from slo_api.settings import Settings, unrecognised

TOKEN = "a-token-of-16-chars"
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("written", ["INFO", "Info", "info", " WARNING "])
def test_log_level_is_read_in_any_case(written: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOG_LEVEL", written)
    assert Settings(slo_api_token=TOKEN).log_level == written.strip().lower()


def test_an_unknown_log_level_still_stops_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOG_LEVEL", "VERBOSE")
    with pytest.raises(ValidationError, match="log_level"):
        Settings(slo_api_token=TOKEN)


def test_slo_api_token_from_a_secret_with_a_trailing_newline_is_stripped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLO_API_TOKEN", f"  {TOKEN}\n")
    token = Settings().slo_api_token
    assert token is not None
    assert token.get_secret_value() == TOKEN


def test_a_token_that_is_short_once_stripped_is_refused_pointing_at_the_upgrade_guide() -> None:
    with pytest.raises(ValidationError, match=r"16 characters.*docs/upgrade\.md"):
        Settings(slo_api_token=" short-token \n")


def test_variables_named_like_settings_that_are_none_are_listed() -> None:
    environ = {
        "SLO_API_TOKEN": TOKEN,
        "SLO_API_TOKENS_FILE": "/x",
        "SLO_API_TOKNE": "typo",
        "WATCH_NAMESPACE": "a",  # WATCH_NAMESPACES misspelt
        "WATCH_FLUSH_SECONDS": "0.5",
        "GITOPS_CO_OWNERS": "argocd-controller",
        "GITOPS_COOWNERS": "argocd-controller",  # GITOPS_CO_OWNERS misspelt
        "SLO_API_URL": "http://x",  # sloctl's
        "LOG_LEVEL": "info",
        "PATH": "/bin",
    }
    assert unrecognised(environ) == ["GITOPS_COOWNERS", "SLO_API_TOKNE", "WATCH_NAMESPACE"]


def test_a_drain_shorter_than_an_upstream_call_is_refused() -> None:
    with pytest.raises(ValidationError, match="SHUTDOWN_DRAIN_SECONDS"):
        Settings(slo_api_token=TOKEN, shutdown_drain_seconds=5, upstream_timeout_seconds=10)
    assert Settings(slo_api_token=TOKEN, shutdown_drain_seconds=10).shutdown_drain_seconds == 10


def test_an_inactivity_timeout_below_the_api_servers_bookmarks_is_warned_about() -> None:
    quiet = Settings(slo_api_token=TOKEN, watch_inactivity_seconds=30)
    assert any("WATCH_INACTIVITY_SECONDS" in w for w in quiet.warnings({}))
    assert Settings(slo_api_token=TOKEN).warnings({}) == []


def test_start_up_logs_what_it_ignored_and_serves_with_the_drain_setting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in [n for n in os.environ if n.startswith(("SLO_API_", "WATCH_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLO_API_TOKEN", TOKEN)
    monkeypatch.setenv("WATCH_NAMESPACE", "team-a")
    monkeypatch.setenv("SHUTDOWN_DRAIN_SECONDS", "21")
    monkeypatch.setenv("LOG_LEVEL", "INFO")
    served: list[int | None] = []

    def serve(self: entry.Server) -> None:
        served.append(self.config.timeout_graceful_shutdown)

    monkeypatch.setattr(entry.Server, "run", serve)
    monkeypatch.setattr(entry, "setup_logging", lambda level, fmt: None)
    caplog.set_level(logging.WARNING, logger="slo_api")
    entry.main([])  # 1: the stand-in server never started
    assert served == [21]
    assert "WATCH_NAMESPACE is not a setting of slo-api" in caplog.text


def test_invalid_settings_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLO_API_TOKEN", "short")
    monkeypatch.setattr(sys, "argv", ["slo-api"])
    assert entry.main([]) == 2


def test_list_settings_are_read_from_comma_separated_variables_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WATCH_NAMESPACES", " team-a , team-b")
    monkeypatch.setenv("LLM_GROUP", "inference.x-k8s.io,inference.modelsphere.dev")
    monkeypatch.setenv("GITOPS_MANAGERS", "argocd-controller,,flux ,")
    monkeypatch.setenv("GITOPS_CO_OWNERS", "argocd-controller")
    monkeypatch.setenv("SLO_API_TOKEN_AUDIENCES", "slo-api")
    settings = Settings(slo_api_token=TOKEN)
    assert settings.watch_namespaces == ("team-a", "team-b")
    assert settings.llm_group == ("inference.x-k8s.io", "inference.modelsphere.dev")
    assert settings.gitops_managers == ("argocd-controller", "flux")
    assert settings.gitops_co_owners == ("argocd-controller",)
    assert settings.slo_api_token_audiences == ("slo-api",)


def test_unset_list_settings_are_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WATCH_NAMESPACES", "GITOPS_CO_OWNERS", "SLO_API_TOKEN_AUDIENCES", "POOL_GROUP"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings(slo_api_token=TOKEN)
    assert settings.watch_namespaces == ()
    assert settings.gitops_co_owners == ()
    assert settings.slo_api_token_audiences == ()
    assert settings.pool_group == ("inference.llmkube.dev",)
    assert "helm" in settings.gitops_managers


def test_the_argo_cd_tracking_label_is_a_label_key_or_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GITOPS_ARGOCD_TRACKING_LABEL", raising=False)
    assert Settings(slo_api_token=TOKEN).gitops_argocd_tracking_label == ""
    monkeypatch.setenv("GITOPS_ARGOCD_TRACKING_LABEL", " app.kubernetes.io/instance ")
    assert Settings(slo_api_token=TOKEN).gitops_argocd_tracking_label == (
        "app.kubernetes.io/instance"
    )
    monkeypatch.setenv("GITOPS_ARGOCD_TRACKING_LABEL", "app.kubernetes.io/instance=chat")
    with pytest.raises(ValidationError, match="not a label key"):
        Settings(slo_api_token=TOKEN)


def test_a_token_too_short_for_the_upgrade_points_at_the_guide() -> None:
    with pytest.raises(ValidationError, match=r"docs/upgrade\.md"):
        Settings(slo_api_token="abc123", slo_api_kubernetes_auth=True)
    assert "16 characters" in (REPO / "docs" / "upgrade.md").read_text()
