"""Kubernetes Events (events.k8s.io/v1) on the CRs slo-api changes: who changed what.

`kubectl describe` of a CR then shows each change made through slo-api. An Event is recorded
in the background: it never fails, and never slows down, the write the client waits for.
Failures are logged and counted in `slo_api_events_total{result="failed"}`.

Like client-go's event spam filter, each CR has a budget (a burst, then one Event per interval):
a client hammering one CR would otherwise double the API server's writes. Writes beyond it are
counted, and the next Event says how many went unrecorded (the audit log has every write).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import socket
import time
import uuid

from slo_api.bounded import BoundedDict
from slo_api.kinds.base import Obj
from slo_api.kube import Kube, KubeError, log_failure
from slo_api.metrics import Metrics
from slo_api.service import Target

log = logging.getLogger("slo_api.events")

CONTROLLER = "slo-api"
# What to check when the API server refuses slo-api an Event.
ROLE = "that it may create events.k8s.io events (ClusterRole slo-api:events)"
MAX_PENDING = 256
# Events sent at once: they share the API client's connection pool with the watches and the
# writes, which must never queue behind them.
MAX_SENDING = 4
BURST = 10  # Events per CR at once
REFILL_SECONDS = 6.0  # then one per CR this often
BUDGETS = 10_000  # CRs whose budget is remembered (the least recent are forgotten)
NOTE_LIMIT = 1024  # the API server refuses a longer note


def regarding(target: Target, stored: Obj) -> Obj:
    """What an Event on a write names: the CR the request resolved to (its kind, API group,
    namespace and name), at the uid and version the write left it."""
    meta = stored.get("metadata") or {}
    return {
        "apiVersion": target.api_version,
        "kind": target.obj.get("kind"),
        "metadata": {
            "namespace": target.namespace,
            "name": target.name,
            "uid": meta.get("uid", target.uid),
            "resourceVersion": meta.get("resourceVersion"),
        },
    }


class EventRecorder:
    def __init__(
        self,
        kube: Kube,
        metrics: Metrics,
        instance: str | None = None,
        burst: int = BURST,
        refill_seconds: float = REFILL_SECONDS,
    ) -> None:
        self.kube = kube
        self.instance = (instance or os.environ.get("POD_NAME") or socket.gethostname())[:128]
        self.burst = burst
        self.refill_seconds = refill_seconds
        self._pending: set[asyncio.Task[None]] = set()
        self._sending = asyncio.Semaphore(MAX_SENDING)
        # Per CR (namespace, name): (Events left, when last refilled, writes not recorded).
        self._budgets: BoundedDict[tuple[str, str], tuple[float, float, int]] = BoundedDict(BUDGETS)
        self._counts = {
            r: metrics.events.labels(r) for r in ("recorded", "failed", "dropped", "suppressed")
        }

    def record(
        self, regarding: Obj, reason: str, fields: list[str], by: str, forced: str = ""
    ) -> None:
        """Start recording an Event on the CR `regarding`; returns at once.

        `forced` names the GitOps tools a forced write overrode (they will revert it)."""
        meta = regarding.get("metadata") or {}
        unrecorded = self._spend((str(meta.get("namespace")), str(meta.get("name"))))
        if unrecorded is None:
            self._counts["suppressed"].inc()
            return
        if len(self._pending) >= MAX_PENDING:
            # The API server is too slow to keep up: drop rather than hold memory.
            self._counts["dropped"].inc()
            return
        task = asyncio.create_task(self._send(regarding, reason, fields, by, unrecorded, forced))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _spend(self, key: tuple[str, str]) -> int | None:
        """Take one Event from the CR's budget: how many writes went unrecorded before this
        one, or None when the budget is spent (this write is counted as unrecorded)."""
        now = time.monotonic()
        left, since, unrecorded = self._budgets.pop(key, (float(self.burst), now, 0))
        left = min(float(self.burst), left + (now - since) / self.refill_seconds)
        if left < 1:
            self._budgets[key] = (left, now, unrecorded + 1)
            return None
        self._budgets[key] = (left - 1, now, 0)
        return unrecorded

    def event(
        self,
        regarding: Obj,
        reason: str,
        fields: list[str],
        by: str,
        unrecorded: int = 0,
        forced: str = "",
    ) -> Obj:
        meta = regarding.get("metadata") or {}
        verb = "reset" if reason == "SLOReset" else "changed"
        what = ", ".join(fields) if fields else "no fields"
        note = f"{by} {verb} {what} through slo-api"
        if forced:
            note += f", forced over {forced} (which will revert it at its next sync)"
        if unrecorded:
            note += f" ({unrecorded} earlier writes not recorded as Events: see the audit log)"
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

    async def _send(
        self, regarding: Obj, reason: str, fields: list[str], by: str, unrecorded: int, forced: str
    ) -> None:
        event = self.event(regarding, reason, fields, by, unrecorded, forced)
        try:
            async with self._sending:
                await self.kube.create_event(event["metadata"]["namespace"], event)
        except KubeError as exc:
            self._counts["failed"].inc()
            log_failure(log, exc, f"recording the Event {reason}", ROLE)
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
