"""sloctl and the guardrails: `get` shows a route's limits, `set` explains a refusal and will
not pretend to change what a platform admin sets."""

from __future__ import annotations

import pytest
import respx

from tests.unit.test_sloctl import LLM, api, env, error, run, view

__all__ = ["api", "env"]  # the fixtures, used by name

LIMITED = {**LLM, "priority": 7, "limits": {"maxPriority": 5}, "overLimits": ["priority"]}


def test_get_shows_the_limits_and_what_is_beyond_them(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LIMITED)

    code, out, _ = run(capsys, "get", "chat-7b")

    assert code == 0
    shown = view(out)
    assert shown["limits.maxPriority"] == "5"
    assert shown["overLimits"] == "priority"


def test_set_beyond_a_limit_explains_the_refusal(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    api.get("/routes/chat-7b").respond(json=LIMITED, headers={"ETag": '"7"'})
    message = (
        "priority may be at most 5 for this route: maxPriority is 5 in the namespace's "
        "SLOLimits `default` (set by a platform admin)"
    )
    api.put("/routes/chat-7b").mock(
        return_value=error(400, "limit_exceeded", message, field="priority")
    )

    code, out, err = run(capsys, "set", "chat-7b", "priority=9")

    assert code == 2
    assert out == ""
    assert "priority may be at most 5" in err
    assert "sloctl get" in err
    assert "platform admin" in err


def test_set_refuses_to_change_the_limits_before_sending_anything(
    api: respx.MockRouter, capsys: pytest.CaptureFixture[str]
) -> None:
    put = api.put("/routes/chat-7b")

    code, _, err = run(capsys, "set", "chat-7b", "limits.maxPriority=10")

    assert code == 2
    assert "limits is read-only" in err
    assert "SLOLimits" in err
    assert not put.called
