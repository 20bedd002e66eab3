"""Strict JSON bodies and the token store."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slo_api.auth import TokenFileError, TokenStore
from slo_api.errors import ApiError
from slo_api.jsonbody import parse_object


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
    store = TokenStore("s3cret")
    assert store.role_of("s3cret") == "write"
    assert store.role_of("s3cre") is None
    assert store.role_of("") is None


def test_tokens_file_roles_and_rotation(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# ops\nreader-1 read\nwriter-1 write\n")
    store = TokenStore(tokens_file=path)
    assert store.role_of("reader-1") == "read"
    assert store.role_of("writer-1") == "write"
    path.write_text("reader-2 read\n")
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert store.role_of("reader-1") is None
    assert store.role_of("reader-2") == "read"
    path.write_text("broken line with three words\n")
    os.utime(path, (time.time() + 10, time.time() + 10))
    assert store.role_of("reader-2") == "read"  # a bad file keeps the previous tokens


def test_a_bad_tokens_file_fails_at_start(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("t admin\n")
    with pytest.raises(TokenFileError):
        TokenStore(tokens_file=path)
    with pytest.raises(TokenFileError):
        TokenStore(tokens_file=tmp_path / "missing")
