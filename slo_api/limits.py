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
from slo_api.index import Source, reach, rv_number
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


# A value's key: a value beyond its cap is grandfathered only by a stored value under the same
# key (the scalars have one key each; a threshold's is its range's low bound, or "default", and
# its metric type).
Key = tuple[Any, ...]
Keyed = list[tuple[Key, Number]]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _priority(spec: Obj) -> Keyed:
    return [((), spec.get("priority", 0))]


def _maximum(type_: str) -> Callable[[Obj], Keyed]:
    def values(spec: Obj) -> Keyed:
        bound = spec.get("maximumDeployment")
        if not isinstance(bound, dict) or bound.get("type", "replica") != type_:
            return []  # no maximum: not autoscaled, nothing to cap
        return [((), bound.get("value", 0))]

    return values


def _thresholds(section: str) -> Callable[[Obj], Keyed]:
    def values(spec: Obj) -> Keyed:
        found = spec.get(section)
        if not isinstance(found, dict):
            return []
        default = found.get("default")
        sets = [("default", default if isinstance(default, dict) else {})] + [
            (r.get("contextLengthRangeLow"), r)
            for r in found.get("ranges") or []
            if isinstance(r, dict)
        ]
        return [
            ((low, m.get("type")), m["threshold"])
            for low, s in sets
            for m in s.get("metrics") or []
            if isinstance(m, dict) and _number(m.get("threshold"))
        ]

    return values


def _queue_depth(spec: Obj) -> Keyed:
    queue = spec.get("queue")
    depth = queue.get("maxDepth", 0) if isinstance(queue, dict) else 0
    return [((), depth)] if depth else []  # 0: unconfigured, nothing to cap


def exact(value: Number) -> str:
    """A number as written, never rounded: an integral one without a fraction (as the policy's
    messages write them), so a client may retry at the bound it reads."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value)


@dataclass(frozen=True)
class Cap:
    """One field of SLOLimits' spec: what it caps in a route of which kinds."""

    name: str  # the SLOLimits spec field
    field: str  # the capped field in the API's names
    kinds: tuple[str, ...]
    upper: bool  # a maximum (True) or a minimum
    integer: bool
    # The route's values the cap applies to, each with its key, from its CR's spec.
    values: Callable[[Obj], Keyed]
    # How a refusal says what the cap allows: the values it applies to, and a unit.
    what: str = ""
    unit: str = ""

    def beyond(self, value: Number, cap: Number) -> bool:
        return value > cap if self.upper else value < cap

    def held(self, old: Obj | None, cap: Number) -> dict[Key, Number]:
        """The rule, per value (config/guardrails/policy.yaml states it in CEL): the bound of
        each key whose old value (an update's; a create has none) is beyond the cap is that
        value, the furthest one where a key holds several; every other key's is the cap. So a
        grandfathered value may stay or move toward the cap but neither move away nor spread
        to another key."""
        found: dict[Key, Number] = {}
        for key, value in self.values(old) if old is not None else []:
            if self.beyond(value, found.get(key, cap)):
                found[key] = value
        return found

    def breached(self, spec: Obj, cap: Number, old: Obj | None = None) -> bool:
        """Whether a value of `spec` is beyond the bound `held` gives its key."""
        held = self.held(old, cap)
        return any(self.beyond(value, held.get(key, cap)) for key, value in self.values(spec))

    def rule(self, cap: Number) -> str:
        """What the cap allows, in the API's names: `priority may be at most 5 (...)`."""
        bound = "at most" if self.upper else "at least"
        keyed = " (of the same context-length range and metric type)" if self.what else ""
        return (
            f"{self.what or self.field} may be {bound} {exact(cap)}{self.unit} (a value stored "
            f"beyond it{keyed} may stay or move toward it)"
        )


SLO_KINDS = ("llm", "job")
CAPS: tuple[Cap, ...] = (
    Cap("maxPriority", "priority", SLO_KINDS, True, True, _priority),
    Cap(
        "maxReplicas",
        "maximumDeployment.value",
        SLO_KINDS,
        True,
        True,
        _maximum("replica"),
        "a replica maximumDeployment.value",
    ),
    Cap(
        "maxPDEngines",
        "maximumDeployment.value",
        ("llm",),
        True,
        True,
        _maximum("pdengine"),
        "a pdengine maximumDeployment.value",
    ),
    Cap(
        "minTTFTSeconds",
        "ttft",
        ("llm",),
        False,
        False,
        _thresholds("ttft"),
        "each ttft threshold",
        " s",
    ),
    Cap("maxOTPS", "otps", ("llm",), True, False, _thresholds("otps"), "each otps threshold"),
    # A floor: a lower depth demands more replicas, as a lower TTFT does.
    Cap("minQueueDepth", "queue.maxDepth", ("job",), False, True, _queue_depth),
)
BY_NAME = {cap.name: cap for cap in CAPS}
# Where maxPDEngines is unset, maxReplicas caps pdengines too (the policy does the same).
FALLBACK = {"maxPDEngines": "maxReplicas"}

# The start of every message of the policy's validations (config/guardrails/policy.yaml).
_REFUSAL = re.compile(
    r"\b(?:(?P<via>maxPDEngines) is unset, so maxReplicas caps pdengines too: )?"
    r"(?P<cap>" + "|".join(BY_NAME) + r") is (?P<value>[0-9.eE+-]+) "
    r"in this namespace's SLOLimits default\b"
)


def refusal(denial: str) -> ApiError | None:
    """The `400 limit_exceeded` an admission denial means when the guardrails' policy made it
    (None for any other policy): the field in the API's names, the cap and where it is set."""
    found = _REFUSAL.search(denial)
    if found is None:
        return None
    limit = found["cap"]
    cap = BY_NAME[found["via"] or limit]
    try:
        value = float(found["value"])
    except ValueError:
        return None
    via = f", which caps pdengines too while {found['via']} is unset" if found["via"] else ""
    message = (
        f"{cap.rule(value)} for this route: {limit} is {exact(value)} in {SOURCE}{via} "
        "(set by a platform admin)"
    )
    return ApiError(
        400,
        message,
        field=cap.field,
        causes=[{"field": cap.field, "message": message, "limit": limit}],
        code="limit_exceeded",
    )


def effective(caps: dict[str, Number], kind: str) -> dict[str, Number]:
    """The caps an SLOLimits' `caps` put on a route of `kind`: those that apply to the kind,
    maxPDEngines falling back to maxReplicas."""
    found = {c.name: caps[c.name] for c in CAPS if c.name in caps and kind in c.kinds}
    for name, fallback in FALLBACK.items():
        if kind in BY_NAME[name].kinds and name not in found and fallback in found:
            found[name] = found[fallback]
    return found


def caps_of(obj: Obj) -> dict[str, Number]:
    """The caps an SLOLimits sets (its spec's known fields that are numbers)."""
    spec = _spec(obj)
    return {cap.name: spec[cap.name] for cap in CAPS if _number(spec.get(cap.name))}


@dataclass(frozen=True)
class _Held:
    """What the store keeps of one listed object: its (namespace, name) and what it means
    here (an SLOLimits `default`'s caps, or an exempt namespace), or None for nothing."""

    name: tuple[str, str]
    value: Any
    rv: int = 0


Listener = Callable[[set[str]], None]


class Limits:
    """The caps in effect per namespace, as two informers report them (see the module)."""

    def __init__(self) -> None:
        self._caps: dict[str, dict[str, Number]] = {}
        self._exempt: set[str] = set()
        self._listeners: list[Listener] = []
        # Moves with every change: what caches of derived values check.
        self.version = 0
        # Where the informers are in the cluster's history, as the index keeps it for the
        # kinds' (slo_api.index.CRIndex): routes show the caps, so a change stream's revision
        # names these versions too. Per informer: the version reached, the first one, the
        # objects that mean something here (name -> resourceVersion: what is counted), and
        # from its first list the newest of those and how many; and the informers that met a
        # resourceVersion that does not compare (see CRIndex.opaque).
        self.positions: dict[Source, int] = {}
        self.first_positions: dict[Source, int] = {}
        self.first_lists: dict[Source, tuple[int, int]] = {}
        self.opaque: set[Source] = set()
        self._meaning: dict[Source, dict[tuple[str, str], int]] = {}
        # While listeners run: the informer and resourceVersion of what they are told about.
        self.cause: tuple[Source, int] | None = None

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(namespaces)` with the namespaces whose caps in effect changed."""
        self._listeners.append(listener)

    # -- reads -----------------------------------------------------------------------------

    def held(self, source: Source) -> int:
        """How many objects of an informer mean something here (see `first_lists`)."""
        return len(self._meaning.get(source, ()))

    def state(self, source: Source) -> tuple[int, int]:
        """An informer's newest object that means something here, and how many there are: a
        version at or after that newest, with as many, names this same state."""
        meaning = self._meaning.get(source, {})
        return max(meaning.values(), default=0), len(meaning)

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
        return effective(caps, kind)

    @staticmethod
    def over(obj: Obj, caps: dict[str, Number], old: Obj | None = None) -> list[str]:
        """The fields (the API's names) of a route's CR beyond `caps` (those in effect), once
        each: stored ones (no `old`), or those a write of `obj` over `old` breaks."""
        spec = _spec(obj)
        old_spec = _spec(old) if old is not None else None
        fields: list[str] = []
        for name, value in caps.items():
            cap = BY_NAME[name]
            if cap.field not in fields and cap.breached(spec, value, old_spec):
                fields.append(cap.field)
        return fields

    @staticmethod
    def bounds(obj: Obj, caps: dict[str, Number]) -> list[Obj]:
        """Each value of a route's CR stored beyond `caps` with the bound a write of its key
        may reach (`Cap.held`: the value itself); every other value's bound is its cap."""
        spec = _spec(obj)
        out: list[Obj] = []
        for name, value in caps.items():
            cap = BY_NAME[name]
            for key, bound in cap.held(spec, value).items():
                entry: Obj = {"limit": name, "field": cap.field, "bound": bound}
                if len(key) == 2:  # a threshold: its range (none: the default) and type
                    low, type_ = key
                    entry.update({} if low == "default" else {"contextLengthRangeLow": low})
                    entry["type"] = type_
                out.append(entry)
        return out

    def view(self, kind: str, obj: Obj) -> Obj:
        """A route's read-only `limits`, `overLimits` and `overLimitBounds`, each only when
        there is something."""
        namespace = str((obj.get("metadata") or {}).get("namespace", ""))
        caps = self.in_effect(kind, namespace)
        if not caps:
            return {}
        over = self.over(obj, caps)
        held = self.bounds(obj, caps) if over else []
        return {
            "limits": caps,
            **({"overLimits": over} if over else {}),
            **({"overLimitBounds": held} if held else {}),
        }

    # -- the informers' store (slo_api.watching.Store) ----------------------------------------

    def entry(self, plural: str, obj: Obj, group: str | None = None) -> _Held:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        # Caps take effect in the order their events arrive, compared or not; a version that
        # does not compare is 0 here: never taken for a newer state of an informer.
        rv = rv_number(obj) or 0
        if plural == NAMESPACES.plural:
            labels = meta.get("labels") or {}
            return _Held(("", name), True if labels.get(EXEMPT_LABEL) == "true" else None, rv)
        namespace = str(meta.get("namespace", ""))
        return _Held((namespace, name), caps_of(obj) if name == PARAMS_NAME else None, rv)

    def reached(self, plural: str, group: str, namespace: str | None, rv: str | None) -> None:
        """An informer reached `rv` (an event, a bookmark or a list), before it applies it."""
        source = (plural, group, namespace or "")
        reach(self.positions, self.first_positions, source, rv, self.opaque)

    def _source(self, plural: str, group: str | None, namespace: str) -> Source:
        scoped = (plural, group or "", namespace)
        return scoped if scoped in self.positions else (plural, group or "", "")

    def upsert(self, plural: str, obj: Obj, group: str | None = None) -> bool:
        held = self.entry(plural, obj, group)
        source = self._source(plural, group, held.name[0])
        self._changed(self._set(plural, held.name, held.value, source, held.rv), (source, held.rv))
        return True

    def delete(self, plural: str, obj: Obj, group: str | None = None) -> bool:
        held = self.entry(plural, obj, group)
        source = self._source(plural, group, held.name[0])
        self._changed(self._set(plural, held.name, None, source, held.rv), (source, held.rv))
        return True

    async def replace_in_turns(
        self,
        plural: str,
        objs: Iterable[Any],
        group: str | None = None,
        namespace: str | None = None,
    ) -> None:
        self._replace(plural, objs, group, namespace)

    def clear(self, plural: str, group: str | None = None, namespace: str | None = None) -> None:
        self._replace(plural, (), group, namespace)

    def _replace(
        self, plural: str, objs: Iterable[Any], group: str | None, namespace: str | None
    ) -> None:
        listed = [h for h in objs if isinstance(h, _Held)]
        source = (plural, group or "", namespace or "")
        self._meaning[source] = {}
        changed: set[str] = set()
        if plural == NAMESPACES.plural:
            old = set(self._exempt)
            self._exempt = {h.name[1] for h in listed if h.value}
            changed = old ^ self._exempt
            for h in listed:
                if h.value:
                    self._meaning[source][h.name] = h.rv
        else:
            kept = {h.name[0]: h for h in listed if h.name[1] == PARAMS_NAME and h.value}
            for ns in set(self._caps) | set(kept):
                if namespace is None or ns == namespace:
                    found = kept.get(ns)
                    value, rv = (found.value, found.rv) if found else (None, 0)
                    changed |= self._set(plural, (ns, PARAMS_NAME), value, source, rv)
        self.first_lists.setdefault(source, self.state(source))
        # A relist: what it finds changed changed at some point up to the list's version.
        self._changed(changed, (source, self.positions.get(source, 0)))

    def _set(
        self, plural: str, name: tuple[str, str], value: Any, source: Source, rv: int
    ) -> set[str]:
        """Store one object's meaning; the namespaces whose caps in effect may have changed."""
        namespace, obj_name = name
        meaning = self._meaning.setdefault(source, {})
        if plural == NAMESPACES.plural:
            was = obj_name in self._exempt
            if value:
                self._exempt.add(obj_name)
                meaning[name] = rv
            else:
                self._exempt.discard(obj_name)
                meaning.pop(name, None)
            return {obj_name} if was != bool(value) else set()
        if obj_name != PARAMS_NAME:
            return set()
        old = self._caps.get(namespace)
        if value:
            self._caps[namespace] = value
            meaning[name] = rv
        else:
            self._caps.pop(namespace, None)
            meaning.pop(name, None)
        return {namespace} if old != (value or None) else set()

    def _changed(self, namespaces: set[str], cause: tuple[Source, int] | None = None) -> None:
        if not namespaces:
            return
        self.version += 1
        self.cause = cause
        try:
            for listener in self._listeners:
                try:
                    listener(namespaces)
                except Exception:
                    log.exception("limits listener failed")
        finally:
            self.cause = None
