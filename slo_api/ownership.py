"""Who owns a route's client-owned fields: GitOps tools, read from `metadata.managedFields`.

A field that Argo CD, Flux or Helm applied is theirs: a change made through slo-api is drift to
them, reverted at their next sync (at once with Argo CD's self-heal or Flux's
kustomize-controller). A merge patch takes a field's ownership silently, so slo-api must look
before it writes. This module is the one place that reads ownership:

- `trim(obj)` keeps, of `managedFields`, only what the rules below read (the index stores CRs
  trimmed: a few hundred bytes for a CR a GitOps tool manages, nothing for any other);
- `Ownership.managed(obj)` names the client-owned fields a write would have reverted, with the
  tool that would revert each, on whatever copy of the CR the write is computed from (the
  index's or a fresh read: both are the same object when their resourceVersions match).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson

Obj = dict[str, Any]

# The fields below `spec` a client may change, for every kind (a kind has only its own).
CLIENT_FIELDS = frozenset(
    {
        "priority",
        "minimumDeployment",
        "maximumDeployment",
        "ttft",
        "otps",
        "queue",
        "default",
        "swapPolicy",
        "swapBudget",
        "reclaimAfter",
    }
)
GITOPS_MANAGERS = ("argocd-controller", "kustomize-controller", "helm-controller", "helm")
# Client-side apply records the applier as this manager: a GitOps tool only when the CR says
# one manages it (Argo CD's default sync is client-side apply), and only for the fields in
# the last-applied configuration (the ones the tool's source sets).
CLIENT_SIDE_APPLY_MANAGERS = ("kubectl-client-side-apply", "flux-client-side-apply")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
CO_OWNED = "slo-api.modelsphere.dev/co-owned"

_ARGO_ANNOTATION = "argocd.argoproj.io/tracking-id"
_ARGO_LABEL = "app.kubernetes.io/instance"
_FLUX_LABELS = ("kustomize.toolkit.fluxcd.io/", "helm.toolkit.fluxcd.io/")
_HELM_ANNOTATION = "meta.helm.sh/release-name"


def _dict(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def marker(obj: Obj) -> str | None:
    """The GitOps tool whose marker the CR carries (argocd, flux or helm), if any."""
    meta = _dict(obj.get("metadata"))
    labels, annotations = _dict(meta.get("labels")), _dict(meta.get("annotations"))
    if _ARGO_ANNOTATION in annotations or _ARGO_LABEL in labels:
        return "argocd"
    if any(k.startswith(_FLUX_LABELS) for k in labels):
        return "flux"
    if _HELM_ANNOTATION in annotations:
        return "helm"
    return None


def last_applied(obj: Obj) -> frozenset[str]:
    """The client-owned fields in the CR's last-applied configuration (client-side apply)."""
    text = _dict(_dict(obj.get("metadata")).get("annotations")).get(LAST_APPLIED)
    if not isinstance(text, str):
        return frozenset()
    try:
        applied = orjson.loads(text)
    except orjson.JSONDecodeError:
        return frozenset()
    return frozenset(_dict(_dict(applied).get("spec"))) & CLIENT_FIELDS


def _fields(entry: Obj) -> list[str]:
    """The client-owned fields below `spec` that a managedFields entry holds (any part of)."""
    spec = _dict(_dict(entry.get("fieldsV1")).get("f:spec"))
    return [k[2:] for k in spec if k.startswith("f:") and k[2:] in CLIENT_FIELDS]


@dataclass(frozen=True)
class Owner:
    """One GitOps-owned field: what GET shows under `managed` and a 409's causes list."""

    field: str  # below spec
    manager: str
    operation: str
    time: str


@dataclass(frozen=True)
class Ownership:
    """The rules, from the settings: which managers are GitOps tools, and which are co-owners
    (configured to leave slo-api's fields alone, so slo-api's writes stay)."""

    managers: frozenset[str] = frozenset(GITOPS_MANAGERS)
    client_side: frozenset[str] = frozenset(CLIENT_SIDE_APPLY_MANAGERS)
    co_owners: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, managers: Iterable[str], client_side: Iterable[str], co_owners: Iterable[str]
    ) -> Ownership:
        return cls(frozenset(managers), frozenset(client_side), frozenset(co_owners))

    @cached_property
    def _candidates(self) -> frozenset[str]:
        """Every manager that may make a field managed."""
        return (self.managers | self.client_side) - self.co_owners

    def _client_side_fields(self, obj: Obj, entries: list[Any]) -> frozenset[str]:
        """The fields a client-side apply manager may own: none without a GitOps marker, else
        those of the last-applied configuration. Read only for CRs with such a manager: the
        annotation is parsed at every watch event otherwise."""
        if not any(isinstance(e, dict) and e.get("manager") in self.client_side for e in entries):
            return frozenset()
        return last_applied(obj) if marker(obj) is not None else frozenset()

    def _counts(self, manager: str, field: str, applied: frozenset[str]) -> bool:
        if manager in self.co_owners:
            return False
        if manager in self.managers:
            return True
        return manager in self.client_side and field in applied

    def owners(self, obj: Obj) -> dict[str, Owner]:
        """Per client-owned field below spec, the GitOps tool that would revert a change."""
        meta = _dict(obj.get("metadata"))
        entries = meta.get("managedFields")
        if not isinstance(entries, list) or not entries:
            return {}
        if _dict(meta.get("annotations")).get(CO_OWNED) == "true":
            return {}
        applied = self._client_side_fields(obj, entries)
        out: dict[str, Owner] = {}
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            manager = str(entry.get("manager", ""))
            for field in _fields(entry):
                if field not in out and self._counts(manager, field, applied):
                    out[field] = Owner(
                        field,
                        manager,
                        str(entry.get("operation", "")),
                        str(entry.get("time", "")),
                    )
        return out

    def trim(self, obj: Obj) -> Obj:
        """The object as the index keeps it: `managedFields` reduced to the entries (manager,
        operation, time, the client-owned fields) that could ever make a field managed, and
        dropped when there are none: most CRs carry no GitOps ownership at all."""
        meta = obj.get("metadata")
        if not isinstance(meta, dict) or "managedFields" not in meta:
            return obj
        rest = {k: v for k, v in meta.items() if k != "managedFields"}
        entries = meta.get("managedFields")
        entries = entries if isinstance(entries, list) else []
        candidates = self._candidates
        # Most CRs: no GitOps manager at all, dropped as cheaply as before.
        if not any(isinstance(e, dict) and e.get("manager") in candidates for e in entries):
            return {**obj, "metadata": rest}
        applied = self._client_side_fields(obj, entries)
        kept = []
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            manager = str(entry.get("manager", ""))
            fields = [f for f in _fields(entry) if self._counts(manager, f, applied)]
            if fields:
                kept.append(
                    {
                        "manager": manager,
                        "operation": str(entry.get("operation", "")),
                        "time": str(entry.get("time", "")),
                        "fieldsV1": {"f:spec": {f"f:{f}": {} for f in fields}},
                    }
                )
        if kept:
            rest["managedFields"] = kept
        return {**obj, "metadata": rest}
