"""A small in-memory stand-in for slo_api.kube.Kube, for HTTP-layer and fault tests."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncGenerator
from typing import Any

from slo_api.kube import KubeError, Resource

Obj = dict[str, Any]


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


class FakeKube:
    """Objects by (plural, namespace, name); watches idle until closed. Faults are injectable."""

    def __init__(self, objects: dict[str, list[Obj]] | None = None) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.rv = 100
        self.missing: set[str] = set()
        # API groups discovery says serve every plural that is not missing.
        self.groups = {"inference.modelsphere.dev", "inference.llmkube.dev"}
        self.fail_next: KubeError | None = None
        self.patches: list[tuple[str, Obj, bool]] = []
        self.closed = False
        self.timeout = 5.0
        self.config_maps: dict[tuple[str, str], Obj] = {}
        for plural, items in (objects or {}).items():
            for obj in items:
                self.add(plural, obj)

    def add(self, plural: str, obj: Obj) -> Obj:
        self.rv += 1
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "ns")
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta["resourceVersion"] = str(self.rv)
        self.objects[(plural, meta["namespace"], meta["name"])] = obj
        return obj

    def _fault(self) -> None:
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error

    async def list(self, res: Resource, **_: Any) -> Obj:
        if res.plural in self.missing:
            raise KubeError(404, message="404 page not found")
        items = [copy.deepcopy(o) for (p, _, _), o in self.objects.items() if p == res.plural]
        return {"items": items, "metadata": {"resourceVersion": str(self.rv)}}

    async def ready(self) -> bool:
        return True

    async def served(self, group: str, version: str) -> set[str]:
        if group not in self.groups:
            return set()
        plurals = {"llmslorequirements", "jobslorequirements", "modelpools"}
        return plurals - self.missing

    async def get(self, res: Resource, namespace: str, name: str) -> Obj:
        self._fault()
        obj = self.objects.get((res.plural, namespace, name))
        if obj is None:
            raise KubeError(404, "NotFound", "not found", is_status=True)
        return copy.deepcopy(obj)

    async def patch(
        self, res: Resource, namespace: str, name: str, patch: Obj, *, dry_run: bool = False
    ) -> Obj:
        self._fault()
        key = (res.plural, namespace, name)
        if key not in self.objects:
            raise KubeError(404, "NotFound", "not found", is_status=True)
        self.patches.append((res.plural, copy.deepcopy(patch), dry_run))
        wanted = patch.get("metadata") or {}
        stored = self.objects[key]["metadata"]
        for precondition in ("resourceVersion", "uid"):
            if wanted.get(precondition) and wanted[precondition] != stored[precondition]:
                raise KubeError(409, "Conflict", "the object has been modified", is_status=True)
        merged: Obj = merge(self.objects[key], {k: v for k, v in patch.items() if k != "metadata"})
        if dry_run:
            return merged
        self.rv += 1
        merged["metadata"]["resourceVersion"] = str(self.rv)
        # As the API server does: the fields written become the field manager's.
        merged["metadata"]["managedFields"] = [
            {
                "manager": "slo-api",
                "operation": "Update",
                "time": "2026-01-01T00:00:00Z",
                "fieldsV1": {"f:spec": {f"f:{k}": {} for k in patch.get("spec") or {}}},
            }
        ]
        self.objects[key] = merged
        return copy.deepcopy(merged)

    async def get_config_map(self, namespace: str, name: str) -> Obj:
        self._fault()
        cm = self.config_maps.get((namespace, name))
        if cm is None:
            raise KubeError(404, "NotFound", "not found", is_status=True)
        return copy.deepcopy(cm)

    async def create_config_map(self, namespace: str, body: Obj) -> Obj:
        self._fault()
        key = (namespace, body["metadata"]["name"])
        if key in self.config_maps:
            raise KubeError(409, "AlreadyExists", "already exists", is_status=True)
        return self._store_config_map(key, body)

    async def replace_config_map(self, namespace: str, name: str, body: Obj) -> Obj:
        self._fault()
        stored = self.config_maps.get((namespace, name))
        if stored is None:
            raise KubeError(404, "NotFound", "not found", is_status=True)
        if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", "the object has been modified", is_status=True)
        return self._store_config_map((namespace, name), body)

    def _store_config_map(self, key: tuple[str, str], body: Obj) -> Obj:
        self.rv += 1
        cm = copy.deepcopy(body)
        cm["metadata"]["resourceVersion"] = str(self.rv)
        self.config_maps[key] = cm
        return copy.deepcopy(cm)

    async def watch(
        self, res: Resource, *, initial_events: bool = False, **_: Any
    ) -> AsyncGenerator[Obj, None]:
        if initial_events:
            # A list streamed as a watch's initial events, as a current API server sends it.
            page = await self.list(res)
            for obj in page["items"]:
                yield {"type": "ADDED", "object": obj}
            yield {
                "type": "BOOKMARK",
                "object": {
                    "metadata": {
                        "resourceVersion": page["metadata"]["resourceVersion"],
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    }
                },
            }
        await asyncio.Event().wait()
        yield {}

    async def close(self) -> None:
        self.closed = True
