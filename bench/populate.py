"""Create many CRs fast: parallel POSTs over a pool of keep-alive TLS connections."""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from controlplane.fleet import NAMESPACE, llm, route_name

Obj = dict[str, Any]
SLO_PATH = "/apis/inference.modelsphere.dev/v1alpha1"
POOL_PATH = "/apis/inference.llmkube.dev/v1alpha1"


@dataclass
class Created:
    count: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0


def admin_client(url: str, ca: Path, cert: Path, key: Path, connections: int) -> httpx.AsyncClient:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    return httpx.AsyncClient(
        base_url=url,
        verify=context,
        timeout=60,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def create_llms(
    client: httpx.AsyncClient, start: int, stop: int, concurrency: int = 32
) -> Created:
    """POST LLM CRs numbered start..stop-1 with `concurrency` requests in flight."""
    numbers = iter(range(start, stop))
    path = f"{SLO_PATH}/namespaces/{NAMESPACE}/llmslorequirements"
    headers = {"Content-Type": "application/json"}

    async def worker() -> None:
        for i in numbers:
            for attempt in range(5):
                response = await client.post(path, content=orjson.dumps(llm(i)), headers=headers)
                if response.status_code in (201, 409):  # 409: already there from a rerun
                    break
                if response.status_code == 429 or response.status_code >= 500:
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                raise RuntimeError(f"creating {route_name(i)}: {response.status_code}")
            else:
                raise RuntimeError(f"creating {route_name(i)}: gave up")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Created(stop - start, time.perf_counter() - started)


def plain_list(client: httpx.Client, plural_path: str, limit: int = 500) -> int:
    """List a kind the way the informer does (pages of `limit`), parsing each page: the count."""
    count = 0
    params: dict[str, str | int] = {"limit": limit}
    while True:
        response = client.get(plural_path, params=params)
        response.raise_for_status()
        page = orjson.loads(response.content)
        count += len(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return count
        params = {"limit": limit, "continue": token}
