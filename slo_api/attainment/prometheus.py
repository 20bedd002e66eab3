"""The seam to Prometheus's HTTP API (`/api/v1/query`, `/api/v1/query_range`): every query
slo-api sends goes through here, with the timeout, the bearer token and the CA bundle.

Whatever goes wrong (a timeout, a refused connection, a 5xx, an answer that is not
Prometheus's JSON, a query error) is one `PrometheusError` whose message is the reason shown
in attainment's `source.reason`.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

Labels = dict[str, str]
# Characters of an answer's error kept in a reason.
REASON_CHARS = 300


class PrometheusError(Exception):
    """A query failed; the message says why, for `source.reason` and the log."""

    def __init__(self, reason: str, cause: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.cause = cause  # the metric's label: timeout, connection, status, malformed, query


@dataclass(frozen=True)
class Sample:
    labels: Labels
    value: float


@dataclass(frozen=True)
class Series:
    labels: Labels
    points: tuple[tuple[float, float], ...]


class Prometheus:
    def __init__(
        self,
        url: str,
        timeout: float,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.token_file = token_file
        verify: ssl.SSLContext | bool = True
        if ca_file is not None:
            verify = ssl.create_default_context(cafile=str(ca_file))
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout), verify=verify, transport=transport
        )

    async def close(self) -> None:
        await self._client.aclose()

    def _headers(self) -> dict[str, str]:
        if self.token_file is None:
            return {}
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            raise PrometheusError(
                f"cannot read the bearer token file: {exc.strerror}", "token"
            ) from None
        return {"Authorization": f"Bearer {token}"}

    async def _post(self, path: str, form: dict[str, str]) -> Any:
        # Prometheus gives up a little before the client does, so a slow query says why.
        form = {**form, "timeout": f"{max(int(self.timeout * 900), 100)}ms"}
        try:
            # httpx's timeout is per read: an answer trickling in would never end without
            # a deadline for the whole exchange.
            async with asyncio.timeout(self.timeout):
                answer = await self._client.post(
                    self.url + path, data=form, headers=self._headers()
                )
        except (httpx.TimeoutException, TimeoutError):
            raise PrometheusError(
                f"Prometheus did not answer within {self.timeout:g} s", "timeout"
            ) from None
        except httpx.HTTPError as exc:
            raise PrometheusError(
                f"cannot reach Prometheus: {type(exc).__name__}: {exc}"[:REASON_CHARS],
                "connection",
            ) from None
        try:
            body = answer.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
            if answer.status_code >= 300:
                raise PrometheusError(
                    f"Prometheus answered HTTP {answer.status_code}", "status"
                ) from None
            raise PrometheusError("Prometheus's answer is not its JSON", "malformed")
        if body["status"] == "error":
            detail = f"{body.get('errorType', '')}: {body.get('error', '')}"[:REASON_CHARS]
            cause = "status" if answer.status_code >= 500 else "query"
            raise PrometheusError(f"the query failed ({detail})", cause)
        data = body.get("data")
        if not isinstance(data, dict):
            raise PrometheusError("Prometheus's answer is not its JSON", "malformed")
        return data

    async def query(self, expr: str, at: float) -> list[Sample]:
        """An instant query's vector (a scalar is one sample without labels)."""
        data = await self._post("/api/v1/query", {"query": expr, "time": _time(at)})
        kind, result = data.get("resultType"), data.get("result")
        try:
            if kind == "scalar":
                samples = [Sample({}, _value(result[1]))]
            elif kind == "vector":
                samples = [Sample(_labels(r["metric"]), _value(r["value"][1])) for r in result]
            else:
                raise TypeError
            # 0/0 and the like (no observations) are no value at all.
            return [s for s in samples if math.isfinite(s.value)]
        except (TypeError, KeyError, IndexError, ValueError):
            pass
        raise PrometheusError("Prometheus's answer is not its JSON", "malformed")

    async def query_range(self, expr: str, start: float, end: float, step: int) -> list[Series]:
        data = await self._post(
            "/api/v1/query_range",
            {"query": expr, "start": _time(start), "end": _time(end), "step": str(step)},
        )
        try:
            if data.get("resultType") == "matrix":
                return [
                    Series(
                        _labels(r["metric"]),
                        tuple(
                            (float(t), value)
                            for t, v in _pairs(r["values"])
                            if math.isfinite(value := _value(v))
                        ),
                    )
                    for r in data["result"]
                ]
        except (TypeError, KeyError, IndexError, ValueError):
            pass
        raise PrometheusError("Prometheus's answer is not its JSON", "malformed")


def _time(at: float) -> str:
    return f"{at:.3f}"


def _value(text: Any) -> float:
    if not isinstance(text, str):
        raise TypeError
    return float(text)


def _labels(metric: Any) -> Labels:
    if not isinstance(metric, dict):
        raise TypeError
    return {str(k): str(v) for k, v in metric.items()}


def _pairs(values: Any) -> Sequence[tuple[Any, Any]]:
    """A range's points; NaN ones (no observations in a step) are left out by the caller."""
    if not isinstance(values, list):
        raise TypeError
    return [(t, v) for t, v in values]
