"""Strict JSON bodies and the token store."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from slo_api.auth import TokenFileError, TokenStore
from slo_api.errors import ApiError
from slo_api.jsonbody import parse_object
from slo_api.settings import Settings

READER_1, WRITER_1, READER_2 = "reader-token-0001", "writer-token-0001", "reader-token-0002"


def test_int64_bounds() -> None:
    assert parse_object(b'{"a": 9223372036854775807}') == {"a": 2**63 - 1}
    with pytest.raises(ApiError):
        parse_object(b'{"a": 9223372036854775808}')
    with pytest.raises(ApiError):
        parse_object(b'{"a": -9223372036854775809}')


def test_long_arrays_are_refused() -> None:
    with pytest.raises(ApiError) as caught:
        parse_object(b'{"a": [' + b",".join([b"1"] * 2000) + b"]}")
    assert "more than" in caught.value.message


def test_single_token_is_a_write_token() -> None:
    store = TokenStore("s3cret-s3cret-s3cret")
    assert store.role_of("s3cret-s3cret-s3cret") == "write"
    assert store.role_of("s3cret-s3cret-s3cre") is None
    assert store.role_of("") is None


def test_tokens_file_roles_and_rotation(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"# ops\n{READER_1} read\n{WRITER_1} write\n")
    store = TokenStore(tokens_file=path)
    assert store.role_of(READER_1) == "read"
    assert store.role_of(WRITER_1) == "write"
    path.write_text(f"{READER_2} read\n")
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert store.role_of(READER_1) is None
    assert store.role_of(READER_2) == "read"
    path.write_text("broken line with three words\n")
    os.utime(path, (time.time() + 10, time.time() + 10))
    assert store.role_of(READER_2) == "read"  # a bad file keeps the previous tokens


def test_a_bad_tokens_file_fails_at_start(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("t admin\n")
    with pytest.raises(TokenFileError):
        TokenStore(tokens_file=path)
    with pytest.raises(TokenFileError):
        TokenStore(tokens_file=tmp_path / "missing")


def _touch(path: Path, text: bytes, later: float) -> None:
    path.write_bytes(text)
    os.utime(path, (time.time() + later, time.time() + later))


def test_a_non_utf8_tokens_file_keeps_the_previous_tokens_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{READER_1} read\n")
    store = TokenStore(tokens_file=path)
    assert store.file_problem() is None
    _touch(path, b"\xff\xfe" + f"{WRITER_1} write\n".encode(), 5)
    with caplog.at_level(logging.ERROR, logger="slo_api.auth"):
        assert store.role_of(READER_1) == "read"
        assert store.role_of(WRITER_1) is None
        assert store.role_of(READER_1) == "read"
    problem = store.file_problem()
    assert problem is not None
    assert "UTF-8" in problem
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1  # said once, not on every request
    assert READER_1 not in caplog.text
    assert WRITER_1 not in caplog.text
    _touch(path, f"{WRITER_1} write\n".encode(), 10)
    assert store.role_of(WRITER_1) == "write"
    assert store.role_of(READER_1) is None
    assert store.file_problem() is None


def test_a_typo_keeps_the_previous_tokens_but_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{READER_1} read\n{WRITER_1} write\n")
    store = TokenStore(tokens_file=path)
    _touch(path, f"{READER_1} read\n{WRITER_1} wirte\n".encode(), 5)
    with caplog.at_level(logging.ERROR, logger="slo_api.auth"):
        assert store.role_of(WRITER_1) == "write"
    problem = store.file_problem()
    assert problem is not None
    assert "line 2" in problem
    assert [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert store.reload_failures() == {"unreadable": 0, "invalid": 1}


def test_a_deleted_tokens_file_revokes_its_tokens_loudly_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{READER_1} read\n")
    store = TokenStore("static-token-0001", tokens_file=path)
    path.unlink()
    with caplog.at_level(logging.ERROR, logger="slo_api.auth"):
        for _ in range(5):
            assert store.role_of(READER_1) is None
        assert store.role_of("static-token-0001") == "write"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "revoked" in errors[0].getMessage()
    problem = store.file_problem()
    assert problem is not None
    assert "cannot be read" in problem
    assert store.reload_failures() == {"unreadable": 1, "invalid": 0}
    path.write_text(f"{READER_1} read\n")  # back: its tokens work again
    assert store.role_of(READER_1) == "read"
    assert store.file_problem() is None


def test_an_unreadable_tokens_file_revokes_its_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{READER_1} read\n")
    store = TokenStore(tokens_file=path)
    path.unlink()
    path.mkdir()  # there, but not a file that can be read
    assert store.role_of(READER_1) is None
    assert store.file_problem() is not None


@pytest.mark.parametrize("short", ["a", "fifteen-chars-x"])
def test_tokens_shorter_than_16_characters_are_refused(tmp_path: Path, short: str) -> None:
    with pytest.raises(ValueError, match="16"):
        TokenStore(short)
    path = tmp_path / "tokens"
    path.write_text(f"{READER_1} read\n{short} write\n")
    with pytest.raises(TokenFileError, match="line 2"):
        TokenStore(tokens_file=path)
    path.write_text(f"{READER_1} read\n")
    store = TokenStore(tokens_file=path)
    _touch(path, f"{READER_1} read\n{short} write\n".encode(), 5)
    assert store.role_of(short) is None
    assert store.role_of(READER_1) == "read"
    assert store.file_problem() is not None


def test_a_short_slo_api_token_stops_the_settings() -> None:
    with pytest.raises(ValueError, match="16"):
        Settings(slo_api_token="short-token")
    assert Settings(slo_api_token="x" * 16).slo_api_token is not None
