"""The guardrails a platform admin sets on a namespace's routes: its SLOLimits named `default`.

The API server enforces them for every writer (config/guardrails/policy.yaml, a
ValidatingAdmissionPolicy); slo-api shows them before a save (a route's read-only `limits`),
reports the routes stored beyond them (`overLimits`: admission never rechecks what is stored)
and explains a refusal (`400 limit_exceeded`). `CAPS` is the one table of what each cap caps.

`Limits` is where two informers keep what slo-api reads of the cluster for this, and no more:
the caps of each namespace's `default` (other SLOLimits are ignored) and the names of the
namespaces labelled exempt (the informer lists only those, by label selector).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from slo_api.errors import ApiError
from slo_api.kube import Resource

log = logging.getLogger("slo_api.limits")

Obj = dict[str, Any]
Number = int | float

GROUP = "inference.modelsphere.dev"
PARAMS = Resource(GROUP, "v1alpha1", "slolimits")
NAMESPACES = Resource("", "v1", "namespaces")
PARAMS_NAME = "default"
EXEMPT_LABEL = "slo-api.modelsphere.dev/limits-exempt"
EXEMPT_SELECTOR = f"{EXEMPT_LABEL}=true"
# Where a cap comes from, in words a tenant can act on (never the CR's name or namespace).
SOURCE = "the namespace's SLOLimits `default`"


@dataclass(frozen=True)
class WatchedResource:
    """What an informer of the guardrails watches (slo_api.watching.Watched)."""

    name: str
    resource: Resource


PARAMS_WATCH = WatchedResource("slolimits", PARAMS)
NAMESPACES_WATCH = WatchedResource("namespaces", NAMESPACES)


def _spec(obj: Obj) -> Obj:
    value = obj.get("spec")
    return value if isinstance(value, dict) else {}


def _maximum(type_: str) -> Callable[[Obj], list[Number]]:
    def values(spec: Obj) -> list[Number]:
        bound = spec.get("maximumDeployment")
        if not isinstance(bound, dict) or bound.get("type", "replica") != type_:
            return []  # no maximum: not autoscaled, nothing to cap
        return [bound.get("value", 0)]

    return values


def _thresholds(section: str) -> Callable[[Obj], list[Number]]:
    def values(spec: Obj) -> list[Number]:
        found = spec.get(section)
        if not isinstance(found, dict):
            return []
        sets = [found.get("default") or {}, *(found.get("ranges") or [])]
        return [
            m["threshold"]
            for s in sets
            if isinstance(s, dict)
            for m in s.get("metrics") or []
            if isinstance(m, dict) and isinstance(m.get("threshold"), int | float)
        ]

    return values


def _queue_depth(spec: Obj) -> list[Number]:
    queue = spec.get("queue")
    return [queue.get("maxDepth", 0)] if isinstance(queue, dict) else []


@dataclass(frozen=True)
class Cap:
    """One field of SLOLimits' spec: what it caps in a route of which kinds."""

    name: str  # the SLOLimits spec field
    field: str  # the capped field in the API's names
    kinds: tuple[str, ...]
    upper: bool  # a maximum (True) or a minimum
    integer: bool
    # The route's values the cap applies to, from its CR's spec (none: it applies to nothing).
    values: Callable[[Obj], list[Number]]
    # How a refusal says what the cap allows, e.g. "may be at most".
    unit: str = ""

    def beyond(self, value: Number, cap: Number) -> bool:
        return value > cap if self.upper else value < cap

    def rule(self, cap: Number) -> str:
        """What the cap allows, in the API's names: `priority may be at most 5`."""
        bound = "at most" if self.upper else "at least"
        what = {
            "maxReplicas": "a replica maximumDeployment.value",
            "maxPDEngines": "a pdengine maximumDeployment.value",
            "minTTFTSeconds": "every ttft threshold",
            "maxOTPS": "every otps threshold",
        }.get(self.name, self.field)
        return f"{what} may be {bound} {cap:g}{self.unit}"


SLO_KINDS = ("llm", "job")
CAPS: tuple[Cap, ...] = (
    Cap("maxPriority", "priority", SLO_KINDS, True, True, lambda s: [s.get("priority", 0)]),
    Cap("maxReplicas", "maximumDeployment.value", SLO_KINDS, True, True, _maximum("replica")),
    Cap("maxPDEngines", "maximumDeployment.value", ("llm",), True, True, _maximum("pdengine")),
    Cap("minTTFTSeconds", "ttft", ("llm",), False, False, _thresholds("ttft"), " s"),
    Cap("maxOTPS", "otps", ("llm",), True, False, _thresholds("otps")),
    Cap("maxQueueDepth", "queue.maxDepth", ("job",), True, True, _queue_depth),
)
BY_NAME = {cap.name: cap for cap in CAPS}

# The start of every message of the policy's validations (config/guardrails/policy.yaml).
_REFUSAL = re.compile(
    r"\b(?P<cap>" + "|".join(BY_NAME) + r") is (?P<value>[0-9.eE+-]+) "
    r"in this namespace's SLOLimits default\b"
)


def refusal(denial: str) -> ApiError | None:
    """The `400 limit_exceeded` an admission denial means when the guardrails' policy made it
    (None for any other policy): the field in the API's names, the cap and where it is set."""
    found = _REFUSAL.search(denial)
    if found is None:
        return None
    cap = BY_NAME[found["cap"]]
    try:
        value = float(found["value"])
    except ValueError:
        return None
    message = (
        f"{cap.rule(value)} for this route: {cap.name} is {value:g} in {SOURCE} "
        "(set by a platform admin)"
    )
    return ApiError(
        400,
        message,
        field=cap.field,
        causes=[{"field": cap.field, "message": message, "limit": cap.name}],
        code="limit_exceeded",
    )


def caps_of(obj: Obj) -> dict[str, Number]:
    """The caps an SLOLimits sets (its spec's known fields that are numbers)."""
    spec = _spec(obj)
    return {
        cap.name: spec[cap.name]
        for cap in CAPS
        if isinstance(spec.get(cap.name), int | float) and not isinstance(spec[cap.name], bool)
    }


@dataclass(frozen=True)
class _Held:
    """What the store keeps of one listed object: its (namespace, name) and what it means
    here (an SLOLimits `default`'s caps, or an exempt namespace), or None for nothing."""

    name: tuple[str, str]
    value: Any


Listener = Callable[[set[str]], None]


class Limits:
    """The caps in effect per namespace, as two informers report them (see the module)."""

    def __init__(self) -> None:
        self._caps: dict[str, dict[str, Number]] = {}
        self._exempt: set[str] = set()
        self._listeners: list[Listener] = []
        # Moves with every change: what caches of derived values check.
        self.version = 0

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(namespaces)` with the namespaces whose caps in effect changed."""
        self._listeners.append(listener)

    # -- reads -----------------------------------------------------------------------------

    def exempt(self, namespace: str) -> bool:
        """Whether the namespace is labelled exempt from the guardrails."""
        return namespace in self._exempt

    def capped(self) -> set[str]:
        """The namespaces where some cap is in effect."""
        return {ns for ns, caps in self._caps.items() if caps and ns not in self._exempt}

    def in_effect(self, kind: str, namespace: str) -> dict[str, Number]:
        """The caps in effect for a route of `kind` in `namespace` (the SLOLimits spec's field
        names), only those that apply to the kind."""
        if namespace in self._exempt:
            return {}
        caps = self._caps.get(namespace)
        if not caps:
            return {}
        return {c.name: caps[c.name] for c in CAPS if c.name in caps and kind in c.kinds}

    @staticmethod
    def over(obj: Obj, caps: dict[str, Number]) -> list[str]:
        """The fields (the API's names) of a route's CR stored beyond `caps`, once each."""
        spec = _spec(obj)
        fields: list[str] = []
        for name, value in caps.items():
            cap = BY_NAME[name]
            if cap.field not in fields and any(cap.beyond(v, value) for v in cap.values(spec)):
                fields.append(cap.field)
        return fields

    def view(self, kind: str, obj: Obj) -> Obj:
        """A route's read-only `limits` and `overLimits`, each only when there is something."""
        namespace = str((obj.get("metadata") or {}).get("namespace", ""))
        caps = self.in_effect(kind, namespace)
        if not caps:
            return {}
        over = self.over(obj, caps)
        return {"limits": caps, **({"overLimits": over} if over else {})}

    # -- the informers' store (slo_api.watching.Store) ----------------------------------------

    def entry(self, plural: str, obj: Obj, group: str | None = None) -> _Held:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if plural == NAMESPACES.plural:
            labels = meta.get("labels") or {}
            return _Held(("", name), True if labels.get(EXEMPT_LABEL) == "true" else None)
        namespace = str(meta.get("namespace", ""))
        return _Held((namespace, name), caps_of(obj) if name == PARAMS_NAME else None)

    def reached(self, plural: str, group: str, namespace: str | None, rv: str | None) -> None:
        pass  # nothing here is part of the change stream's revisions

    def upsert(self, plural: str, obj: Obj, group: str | None = None) -> bool:
        held = self.entry(plural, obj, group)
        self._changed(self._set(plural, held.name, held.value))
        return True

    def delete(self, plural: str, obj: Obj, group: str | None = None) -> bool:
        held = self.entry(plural, obj, group)
        self._changed(self._set(plural, held.name, None))
        return True

    async def replace_in_turns(
        self,
        plural: str,
        objs: Iterable[Any],
        group: str | None = None,
        namespace: str | None = None,
    ) -> None:
        self._replace(plural, objs, namespace)

    def clear(self, plural: str, group: str | None = None, namespace: str | None = None) -> None:
        self._replace(plural, (), namespace)

    def _replace(self, plural: str, objs: Iterable[Any], namespace: str | None) -> None:
        held = {h.name: h.value for h in objs if isinstance(h, _Held)}
        if plural == NAMESPACES.plural:
            old = set(self._exempt)
            self._exempt = {name for (_, name), value in held.items() if value}
            self._changed(old ^ self._exempt)
            return
        listed = {ns: v for (ns, name), v in held.items() if name == PARAMS_NAME and v is not None}
        changed = set()
        for ns in set(self._caps) | set(listed):
            if namespace is None or ns == namespace:
                changed |= self._set(plural, (ns, PARAMS_NAME), listed.get(ns))
        self._changed(changed)

    def _set(self, plural: str, name: tuple[str, str], value: Any) -> set[str]:
        """Store one object's meaning; the namespaces whose caps in effect may have changed."""
        namespace, obj_name = name
        if plural == NAMESPACES.plural:
            was = obj_name in self._exempt
            if value:
                self._exempt.add(obj_name)
            else:
                self._exempt.discard(obj_name)
            return {obj_name} if was != bool(value) else set()
        if obj_name != PARAMS_NAME:
            return set()
        old = self._caps.get(namespace)
        if value:
            self._caps[namespace] = value
        else:
            self._caps.pop(namespace, None)
        return {namespace} if old != (value or None) else set()

    def _changed(self, namespaces: set[str]) -> None:
        if not namespaces:
            return
        self.version += 1
        for listener in self._listeners:
            try:
                listener(namespaces)
            except Exception:
                log.exception("limits listener failed")
