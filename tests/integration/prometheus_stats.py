"""A transport to a real Prometheus that asks each query for its statistics (`stats=all`) and
keeps, by query, the samples Prometheus says it loaded and the most it held at once."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlencode

import httpx


class Recording(httpx.AsyncHTTPTransport):
    """The real transport, keeping each query sent and the samples Prometheus says it loaded
    for it (`totalQueryableSamples`) and held at once (`peakSamples`)."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []
        self.loaded: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
        query = form.get("query", "")
        self.queries.append(query)
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        asked = httpx.Request(
            request.method,
            request.url,
            headers=headers,
            content=urlencode({**form, "stats": "all"}).encode(),
        )
        answer = await super().handle_async_request(asked)
        content = await answer.aread()
        stats = (json.loads(content).get("data") or {}).get("stats") or {}
        samples = stats.get("samples") or {}
        self.loaded[query] = int(samples.get("totalQueryableSamples", 0))
        self.peak[query] = int(samples.get("peakSamples", 0))
        # The content is decoded: its encoding and length no longer apply.
        kept = {
            k: v
            for k, v in answer.headers.items()
            if k.lower() not in ("content-encoding", "content-length")
        }
        return httpx.Response(answer.status_code, headers=kept, content=content)
