"""Who owns a route's client-owned fields: GitOps tools, read from `metadata.managedFields`,
the tools' markers on the CR, and what is remembered of them.

A field that Argo CD, Flux or Helm applied is theirs: a change made through slo-api is drift to
them, reverted at their next sync (at once with Argo CD's self-heal or Flux's
kustomize-controller). A merge patch takes a field's ownership silently, so slo-api must look
before it writes. This module is the one place that reads ownership:

- `Ownership.owners(obj, remembered)` names the client-owned fields a write would have
  reverted, with the tool that would revert each, on whatever copy of the CR the write is
  computed from (the index's or a fresh read: the same object when their resourceVersions
  match): the fields a GitOps manager holds in `managedFields` now, and the remembered ones
  still in force;
- `Ownership.carry(before, old, new)` is the memory's rule: a change that moves a field away
  from the tool (a forced write, `kubectl edit`) does not end the tool's claim, since the tool
  puts its value back at its next sync. The claim ends when the tool applies again (then the
  field is the tool's afresh, or released when the tool no longer sets it), when the CR loses
  the tool's marker, is declared co-owned, or says the tool will not override it (Flux's
  `ssa: IfNotPresent` / `Ignore`, `reconcile: disabled`);
- `Ownership.trim(obj)` keeps, of `managedFields`, only what those rules read (the index stores
  CRs trimmed: a few hundred bytes for a CR a GitOps tool manages, nothing for any other).

Markers are only the tools' real ones: Argo CD's tracking annotation (or, when the cluster's
Argo CD tracks by label, that label), Flux's kustomize-controller and helm-controller labels,
and Helm's release annotations with its `managed-by` label. `app.kubernetes.io/instance` alone
is not one: most Helm charts set it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import orjson

from slo_api.managed_fields import (
    Fact,
    entry_of,
    field_entries,
    spec_keys,
    without_managed_fields,
)

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
# Client-side apply records the applier as this manager: Argo CD's default sync is client-side
# apply, so it is Argo CD only on a CR Argo CD tracks, and only for the fields in the
# last-applied configuration (the ones its source sets). Flux applies server-side and Helm as
# `helm`; `flux-client-side-apply` is the manager Flux tells people to use for changes it keeps.
CLIENT_SIDE_APPLY_MANAGERS = ("kubectl-client-side-apply",)
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
CO_OWNED = "slo-api.modelsphere.dev/co-owned"

ARGOCD_TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
_FLUX_LABELS = ("kustomize.toolkit.fluxcd.io/name", "kustomize.toolkit.fluxcd.io/namespace")
_FLUX_HELM_LABELS = ("helm.toolkit.fluxcd.io/name", "helm.toolkit.fluxcd.io/namespace")
_HELM_ANNOTATIONS = ("meta.helm.sh/release-name", "meta.helm.sh/release-namespace")
_HELM_MANAGED_BY = "app.kubernetes.io/managed-by"
# kustomize-controller's apply policies (read, as Flux does, from a label or an annotation,
# in any case): with these it does not override the fields of the CR in the cluster.
_FLUX_SSA = "kustomize.toolkit.fluxcd.io/ssa"
_FLUX_HANDS_OFF = frozenset({"ifnotpresent", "ignore"})
_FLUX_RECONCILE = "kustomize.toolkit.fluxcd.io/reconcile"

# The tool each known manager is, so its own marker is the one that counts. A manager
# configured beyond these counts with any tool's marker.
TOOLS = {
    "argocd-controller": "argocd",
    "kubectl-client-side-apply": "argocd",
    "kustomize-controller": "flux",
    "helm-controller": "flux-helm",
    "helm": "helm",
}


def _dict(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def _has(values: Obj, *keys: str) -> bool:
    """Every key is set to a non-empty string."""
    for key in keys:
        value = values.get(key)
        if not value or not isinstance(value, str):
            return False
    return True


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
    return [k for k in spec_keys(entry) if k in CLIENT_FIELDS]


@dataclass(frozen=True, slots=True)
class Owner:
    """One GitOps-owned field: what GET shows under `managed` and a 409's causes list.

    `overridden_by` is set when the tool no longer holds the field in `managedFields` but
    will put its value back at its next sync (a remembered owner): the manager that holds the
    field now, or "" when nobody does (the field was removed). `time` is when the tool last
    applied the field.
    """

    field: str  # below spec
    manager: str
    operation: str
    time: str
    overridden_by: str | None = None

    @property
    def remembered(self) -> bool:
        return self.overridden_by is not None

    def to_json(self) -> dict[str, str]:
        out = {
            "field": self.field,
            "manager": self.manager,
            "operation": self.operation,
            "time": self.time,
        }
        if self.overridden_by is not None:
            out["overriddenBy"] = self.overridden_by
        return out

    @classmethod
    def from_json(cls, data: Any) -> Owner:
        """An owner as `to_json` wrote it; ValueError for anything else."""
        if not isinstance(data, dict):
            raise ValueError("an owner is a JSON object")
        values = [data.get(k) for k in ("field", "manager", "operation", "time")]
        overridden = data.get("overriddenBy")
        if not all(isinstance(v, str) for v in values) or not (
            overridden is None or isinstance(overridden, str)
        ):
            raise ValueError(
                "an owner has string field, manager, operation and time (and overriddenBy)"
            )
        field, manager, operation, time = (str(v) for v in values)
        return cls(field, manager, operation, time, overridden)


NOTHING: Mapping[str, Owner] = {}


@dataclass(frozen=True)
class Ownership:
    """The rules, from the settings: which managers are GitOps tools, which are co-owners
    (configured to leave slo-api's fields alone, so slo-api's writes stay), and the label by
    which the cluster's Argo CD tracks its resources, if it does ("" when it tracks by its
    annotation, the default since Argo CD 3.0)."""

    managers: frozenset[str] = frozenset(GITOPS_MANAGERS)
    client_side: frozenset[str] = frozenset(CLIENT_SIDE_APPLY_MANAGERS)
    co_owners: frozenset[str] = frozenset()
    argocd_tracking_label: str = ""

    @classmethod
    def of(
        cls,
        managers: Iterable[str],
        client_side: Iterable[str],
        co_owners: Iterable[str],
        argocd_tracking_label: str = "",
    ) -> Ownership:
        return cls(
            frozenset(managers), frozenset(client_side), frozenset(co_owners), argocd_tracking_label
        )

    @cached_property
    def _tools(self) -> frozenset[str]:
        """Every manager that may be a GitOps tool."""
        return self.managers | self.client_side

    # -- markers ---------------------------------------------------------------------------

    def markers(self, obj: Obj) -> set[str]:
        """The tools whose marker the CR carries: argocd, flux (kustomize-controller),
        flux-helm (helm-controller) and helm. Read at every watch event (see trim): plain
        lookups, no more."""
        meta = _dict(obj.get("metadata"))
        labels, annotations = _dict(meta.get("labels")), _dict(meta.get("annotations"))
        found = set()
        label = self.argocd_tracking_label
        if _has(annotations, ARGOCD_TRACKING_ANNOTATION) or (label and _has(labels, label)):
            found.add("argocd")
        if _has(labels, *_FLUX_LABELS):
            found.add("flux")
        if _has(labels, *_FLUX_HELM_LABELS):
            found.add("flux-helm")
        if labels.get(_HELM_MANAGED_BY) == "Helm" and _has(annotations, *_HELM_ANNOTATIONS):
            found.add("helm")
        return found

    @staticmethod
    def _marked(manager: str, markers: set[str]) -> bool:
        tool = TOOLS.get(manager)
        if tool == "flux-helm":  # helm-controller installs with Helm: either marker
            return bool(markers & {"flux-helm", "helm"})
        return tool in markers if tool is not None else bool(markers)

    @staticmethod
    def _hands_off(obj: Obj, manager: str, markers: set[str]) -> bool:
        """kustomize-controller will not override the CR in the cluster (Flux's policies)."""
        tool = TOOLS.get(manager)
        if tool != "flux" and not (tool is None and "flux" in markers):
            return False
        meta = _dict(obj.get("metadata"))
        for values in (_dict(meta.get("labels")), _dict(meta.get("annotations"))):
            ssa, reconcile = values.get(_FLUX_SSA), values.get(_FLUX_RECONCILE)
            if isinstance(ssa, str) and ssa.lower() in _FLUX_HANDS_OFF:
                return True
            if isinstance(reconcile, str) and reconcile.lower() == "disabled":
                return True
        return False

    # -- the rules -------------------------------------------------------------------------

    def _counts(self, manager: str, field: str, applied: frozenset[str]) -> bool:
        if manager in self.co_owners:
            return False
        if manager in self.managers:
            return True
        return manager in self.client_side and field in applied

    def _applied(self, obj: Obj, entries: list[Obj], markers: set[str]) -> frozenset[str]:
        """The fields a client-side apply manager may own: those of the last-applied
        configuration, on a CR marked by that manager's tool. Read only for CRs with such a
        manager: the annotation is parsed at every watch event otherwise."""
        if not any(
            e.get("manager") in self.client_side and self._marked(str(e["manager"]), markers)
            for e in entries
        ):
            return frozenset()
        return last_applied(obj)

    def owners(self, obj: Obj, remembered: Mapping[str, Owner] = NOTHING) -> dict[str, Owner]:
        """Per client-owned field below spec, the GitOps tool that would revert a change: the
        one holding it in managedFields now, else a remembered one still in force."""
        meta = _dict(obj.get("metadata"))
        if _dict(meta.get("annotations")).get(CO_OWNED) == "true":
            return {}
        entries = field_entries(obj)
        if not entries and not remembered:
            return {}
        markers = self.markers(obj)
        applied = self._applied(obj, entries, markers)
        out: dict[str, Owner] = {}
        for entry in entries:
            manager = str(entry.get("manager", ""))
            if self._hands_off(obj, manager, markers):
                continue
            for field in _fields(entry):
                if field not in out and self._counts(manager, field, applied):
                    out[field] = Owner(
                        field,
                        manager,
                        str(entry.get("operation", "")),
                        str(entry.get("time", "")),
                    )
        for field, owner in remembered.items():
            if field in out or field not in CLIENT_FIELDS or field != owner.field:
                continue
            if self._in_force(obj, owner, entries, markers):
                holders = [e for e in entries if field in _fields(e)]
                latest = max(holders, key=lambda e: str(e.get("time", "")), default=None)
                holder = "" if latest is None else str(latest.get("manager", ""))
                out[field] = replace(owner, overridden_by=holder)
        return out

    def held(self, facts: Iterable[Fact]) -> set[str]:
        """The client-owned fields a GitOps manager holds in managedFields kept as facts (see
        managed_fields.facts), whatever the CR: every field `owners` may name from them."""
        return {
            field
            for manager, _, _, fields in facts
            if manager in self._tools and manager not in self.co_owners
            for field in fields
            if field in CLIENT_FIELDS
        }

    def _in_force(self, obj: Obj, owner: Owner, entries: list[Obj], markers: set[str]) -> bool:
        """A remembered owner's claim holds: still a GitOps tool, still marking the CR,
        still overriding it, and it has not applied since (an apply of its own would have
        set the field again, so one without it means its source no longer sets the field).
        Its entry's time says whether it applied; to the second, as the API server keeps it."""
        manager = owner.manager
        if manager in self.co_owners or manager not in self._tools:
            return False
        if not self._marked(manager, markers) or self._hands_off(obj, manager, markers):
            return False
        return not any(
            e.get("manager") == manager
            and e.get("operation") == owner.operation
            and str(e.get("time", "")) != owner.time
            for e in entries
        )

    def carry(self, before: Mapping[str, Owner], old: Obj | None, new: Obj) -> dict[str, Owner]:
        """The owners in effect after a change from `old` to `new` (None: not known), given
        those in effect before it (remembered ones included; {} when nothing is known). Fed
        with each pair of consecutive states of one CR (one uid: a CR created again under the
        same name starts from {}), full or trimmed, it is the memory `owners` reads."""
        prior = self.owners(old, before) if old is not None else before
        return self.owners(new, prior)

    # -- what the index keeps --------------------------------------------------------------

    def trim(self, obj: Obj) -> Obj:
        """The object as the index keeps it: of `managedFields`, on a CR a GitOps tool
        manages or marks, each GitOps manager's entry (manager, operation, time, the
        client-owned fields it holds: the time even when it holds none, to tell when it
        applies again) and every other entry holding a client-owned field (who holds a
        field taken from the tool); on any other CR, nothing: most CRs carry no GitOps
        ownership at all."""
        bare = without_managed_fields(obj)
        if bare is obj:
            return obj
        entries = field_entries(obj)
        tools = self._tools
        if not any(e.get("manager") in tools for e in entries) and not self.markers(obj):
            return bare
        kept = []
        for entry in entries:
            manager = str(entry.get("manager", ""))
            fields = _fields(entry)
            if fields or manager in tools:
                operation, time = str(entry.get("operation", "")), str(entry.get("time", ""))
                kept.append(entry_of(manager, operation, time, fields))
        if kept:
            bare["metadata"]["managedFields"] = kept
        return bare
