"""Jaeger v2's all-in-one as a trace backend on loopback ports: OTLP/HTTP in, the query API out.

Built from the Go module proxy and cached as the control plane's binaries are (see
`binaries.ensure_jaeger`). Every port is chosen free, so several can run side by side; spans
are kept in memory and go with the process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from controlplane.binaries import ensure_jaeger
from controlplane.daemon import Daemon
from controlplane.server import free_port

# Only what the tests and the demo use: the OTLP/HTTP receiver, in-memory storage and the
# query API (and its UI); the collector's own metrics are off (they would want port 8888).
CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memory_store:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: memory_store
    http:
      endpoint: 127.0.0.1:{query_port}
    grpc:
      endpoint: 127.0.0.1:{query_grpc_port}
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp_port}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memory_store
"""


class Jaeger(Daemon):
    def __init__(self, workdir: Path) -> None:
        super().__init__("jaeger", workdir)
        self.otlp_port = free_port()
        self.query_port = free_port()

    @property
    def otlp_endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT (the exporter appends /v1/traces)."""
        return f"http://127.0.0.1:{self.otlp_port}"

    @property
    def query_url(self) -> str:
        """The query API and the UI."""
        return f"http://127.0.0.1:{self.query_port}"

    def start(self, timeout: float = 60) -> Jaeger:
        binary = ensure_jaeger()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "jaeger.yaml"
        config.write_text(
            CONFIG.format(
                otlp_port=self.otlp_port,
                query_port=self.query_port,
                query_grpc_port=free_port(),
            )
        )
        # The query API answers once it is up; the receiver starts before it in the pipeline.
        self.run([str(binary), "--config", str(config)], f"{self.query_url}/api/services", timeout)
        return self

    # -- the query API -------------------------------------------------------------------

    def trace(self, trace_id: str) -> list[dict[str, Any]] | None:
        """The spans of one trace (Jaeger's JSON), or None while it has none of it."""
        response = httpx.get(f"{self.query_url}/api/traces/{trace_id}", timeout=5)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        data = response.json().get("data") or []
        return list(data[0]["spans"]) if data else None

    def traces(self, service: str, limit: int = 1000) -> list[dict[str, Any]]:
        """Every stored trace of `service` (each with its spans)."""
        response = httpx.get(
            f"{self.query_url}/api/traces",
            params={"service": service, "limit": str(limit), "lookback": "1h"},
            timeout=5,
        )
        if response.status_code == 404:
            return []
        response.raise_for_status()
        return list(response.json().get("data") or [])
