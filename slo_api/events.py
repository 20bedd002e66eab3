"""Kubernetes Events (events.k8s.io/v1) on the CRs slo-api changes: who changed what.

`kubectl describe` of a CR then shows each change made through slo-api. An Event is recorded
in the background: it never fails, and never slows down, the write the client waits for.
Failures are logged and counted in `slo_api_events_total{result="failed"}`.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import uuid

from slo_api.kinds.base import Obj
from slo_api.kube import Kube, KubeError
from slo_api.metrics import Metrics

log = logging.getLogger("slo_api.events")

CONTROLLER = "slo-api"
MAX_PENDING = 256
NOTE_LIMIT = 1024  # the API server refuses a longer note


class EventRecorder:
    def __init__(self, kube: Kube, metrics: Metrics, instance: str | None = None) -> None:
        self.kube = kube
        self.instance = (instance or os.environ.get("POD_NAME") or socket.gethostname())[:128]
        self._pending: set[asyncio.Task[None]] = set()
        self._counts = {r: metrics.events.labels(r) for r in ("recorded", "failed", "dropped")}

    def record(self, regarding: Obj, reason: str, fields: list[str], by: str) -> None:
        """Start recording an Event on the CR `regarding`; returns at once."""
        if len(self._pending) >= MAX_PENDING:
            # The API server is too slow to keep up: drop rather than hold memory.
            self._counts["dropped"].inc()
            return
        task = asyncio.create_task(self._send(regarding, reason, fields, by))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def event(self, regarding: Obj, reason: str, fields: list[str], by: str) -> Obj:
        meta = regarding.get("metadata") or {}
        verb = "reset" if reason == "SLOReset" else "changed"
        what = ", ".join(fields) if fields else "no fields"
        note = f"{by} {verb} {what} through slo-api"
        now = datetime.datetime.now(datetime.UTC)
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                # As client-go names them: the object's name and a unique suffix.
                "name": f"{str(meta.get('name', 'slo'))[:200]}.{uuid.uuid4().hex[:16]}",
                "namespace": meta.get("namespace"),
            },
            "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "type": "Normal",
            "reason": reason,
            "action": "Reset" if reason == "SLOReset" else "Update",
            "note": note[:NOTE_LIMIT],
            "reportingController": CONTROLLER,
            "reportingInstance": self.instance,
            "regarding": {
                "apiVersion": regarding.get("apiVersion"),
                "kind": regarding.get("kind"),
                "namespace": meta.get("namespace"),
                "name": meta.get("name"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
        }

    async def _send(self, regarding: Obj, reason: str, fields: list[str], by: str) -> None:
        event = self.event(regarding, reason, fields, by)
        try:
            await self.kube.create_event(event["metadata"]["namespace"], event)
        except KubeError as exc:
            self._counts["failed"].inc()
            log.warning("Event %s not recorded: %s", reason, exc)
        except Exception:
            self._counts["failed"].inc()
            log.exception("Event %s not recorded", reason)
        else:
            self._counts["recorded"].inc()

    async def close(self, grace: float = 2.0) -> None:
        """Let Events in flight finish (briefly), then cancel what is left."""
        if not self._pending:
            return
        _, late = await asyncio.wait(set(self._pending), timeout=grace)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=grace)
