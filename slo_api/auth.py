"""Bearer tokens with roles: one SLO_API_TOKEN (write), or a file of `token role` lines.

The file is re-read when its modification time or size changes, so a mounted Secret can rotate
tokens without a restart. A file that cannot be read any more revokes its tokens (the operator
removed it); one that cannot be parsed keeps the previous tokens (a typo must not lock everyone
out) and says so in the logs, in `/readyz` and in the `slo_api_tokens_file_*` metrics. Tokens
are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

Role = Literal["read", "write"]
ROLES: tuple[Role, ...] = ("read", "write")
MIN_TOKEN_CHARS = 16
FailureReason = Literal["unreadable", "invalid"]

log = logging.getLogger("slo_api.auth")


class TokenFileError(ValueError):
    pass


def token_problem(token: str) -> str | None:
    """Why `token` is not good enough to be accepted, or None."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"tokens must be at least {MIN_TOKEN_CHARS} characters long"
    return None


def parse_tokens(text: str) -> list[tuple[bytes, Role]]:
    tokens: list[tuple[bytes, Role]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or parts[1] not in ROLES:
            raise TokenFileError(f"line {number}: expected `<token> read|write`")
        problem = token_problem(parts[0])
        if problem is not None:
            raise TokenFileError(f"line {number}: {problem}")
        role: Role = "read" if parts[1] == "read" else "write"
        tokens.append((parts[0].encode(), role))
    return tokens


class TokenStore:
    def __init__(self, token: str | None = None, tokens_file: Path | None = None) -> None:
        if token is not None and (problem := token_problem(token)) is not None:
            raise TokenFileError(f"SLO_API_TOKEN: {problem}")
        self._static: list[tuple[bytes, Role]] = [(token.encode(), "write")] if token else []
        self._file = tokens_file
        self._file_tokens: list[tuple[bytes, Role]] = []
        self._stamp: tuple[float, int] | None = None
        # Why the file's current content is not in use (None while it is), said once per change.
        self._problem: str | None = None
        self._failures: dict[FailureReason, int] = {"unreadable": 0, "invalid": 0}
        if tokens_file is not None:
            self._reload(initial=True)

    def _reload(self, initial: bool = False) -> None:
        assert self._file is not None
        try:
            stat = os.stat(self._file)
            stamp = (stat.st_mtime, stat.st_size)
            if stamp == self._stamp:
                return
            raw = self._file.read_bytes()
        except OSError as exc:
            if initial:
                raise TokenFileError(f"cannot read SLO_API_TOKENS_FILE: {exc.strerror}") from None
            self._unreadable(exc)
            return
        try:
            tokens = parse_tokens(_decode(raw))
        except TokenFileError as exc:
            if initial:
                raise TokenFileError(f"SLO_API_TOKENS_FILE: {exc}") from None
            # Not parsed again until it changes: one error line per bad version of the file.
            self._stamp = stamp
            self._fail("invalid", f"the tokens file cannot be parsed ({exc})")
            log.error(
                "tokens file not reloaded, keeping the previous %d tokens: %s",
                len(self._file_tokens),
                exc,
            )
            return
        self._stamp = stamp
        self._file_tokens = tokens
        self._problem = None
        if not initial:
            log.info("tokens file reloaded: %d tokens", len(tokens))

    def _unreadable(self, exc: OSError) -> None:
        was = self._problem
        self._stamp = None  # read again in full once it is back
        self._file_tokens = []
        problem = f"the tokens file cannot be read ({exc.strerror}); its tokens are revoked"
        if was != problem:
            self._fail("unreadable", problem)
            log.error(
                "tokens file cannot be read (%s): every token it held is revoked until it can",
                exc.strerror,
            )

    def _fail(self, reason: FailureReason, problem: str) -> None:
        self._failures[reason] += 1
        self._problem = problem

    def file_problem(self) -> str | None:
        """Why the tokens file's content is not in use, or None (also without a file)."""
        return self._problem

    def has_file(self) -> bool:
        return self._file is not None

    def reload_failures(self) -> dict[FailureReason, int]:
        return dict(self._failures)

    def register_metrics(self, registry: CollectorRegistry) -> None:
        if self._file is not None:
            registry.register(_TokensFileCollector(self))

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


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenFileError(f"byte {exc.start} is not UTF-8") from None


class _TokensFileCollector(Collector):
    """Read when scraped, for an alert on a tokens file that is not in use."""

    def __init__(self, store: TokenStore) -> None:
        self._store = store

    def collect(self) -> Iterable[Metric]:
        ok = GaugeMetricFamily(
            "slo_api_tokens_file_ok",
            "1 while the tokens file's current content is in use; 0 while it cannot be read "
            "(its tokens revoked) or parsed (the previous tokens kept)",
        )
        ok.add_metric([], float(self._store.file_problem() is None))
        failures = CounterMetricFamily(
            "slo_api_tokens_file_reload_failures",
            "Changes of the tokens file that could not be used, by reason",
            labels=["reason"],
        )
        for reason, count in self._store.reload_failures().items():
            failures.add_metric([reason], float(count))
        yield from (ok, failures)
