"""Bearer tokens with roles: one SLO_API_TOKEN (write), or a file of `token role` lines.

The file is re-read when its modification time or size changes, so a mounted Secret can rotate
tokens without a restart. Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path
from typing import Literal

Role = Literal["read", "write"]
ROLES: tuple[Role, ...] = ("read", "write")

log = logging.getLogger("slo_api.auth")


class TokenFileError(ValueError):
    pass


def parse_tokens(text: str) -> list[tuple[bytes, Role]]:
    tokens: list[tuple[bytes, Role]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or parts[1] not in ROLES:
            raise TokenFileError(f"line {number}: expected `<token> read|write`")
        role: Role = "read" if parts[1] == "read" else "write"
        tokens.append((parts[0].encode(), role))
    return tokens


class TokenStore:
    def __init__(self, token: str | None = None, tokens_file: Path | None = None) -> None:
        self._static: list[tuple[bytes, Role]] = [(token.encode(), "write")] if token else []
        self._file = tokens_file
        self._file_tokens: list[tuple[bytes, Role]] = []
        self._stamp: tuple[float, int] | None = None
        if tokens_file is not None:
            self._reload(initial=True)

    def _reload(self, initial: bool = False) -> None:
        assert self._file is not None
        try:
            stat = os.stat(self._file)
        except OSError as exc:
            if initial:
                raise TokenFileError(f"cannot read SLO_API_TOKENS_FILE: {exc.strerror}") from None
            return
        stamp = (stat.st_mtime, stat.st_size)
        if stamp == self._stamp:
            return
        try:
            tokens = parse_tokens(self._file.read_text())
        except (OSError, TokenFileError) as exc:
            if initial:
                raise TokenFileError(f"SLO_API_TOKENS_FILE: {exc}") from None
            log.error("tokens file not reloaded, keeping the previous tokens: %s", exc)
            return
        self._stamp = stamp
        self._file_tokens = tokens
        if not initial:
            log.info("tokens file reloaded: %d tokens", len(tokens))

    def role_of(self, presented: str) -> Role | None:
        if self._file is not None:
            self._reload()
        candidate = presented.encode()
        found: Role | None = None
        # Compare against every token, without stopping early, so timing says nothing.
        for token, role in (*self._static, *self._file_tokens):
            if hmac.compare_digest(candidate, token) and found != "write":
                found = role
        return found
