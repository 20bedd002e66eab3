"""What every kind of route has in common: the Kind interface and the body rules shared by all."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slo_api.errors import ApiError, invalid
from slo_api.index import group_of
from slo_api.kube import Resource

Obj = dict[str, Any]
PoolLookup = Callable[[str, str], Obj | None]


class Body(BaseModel):
    """A request body: strict types, no unknown fields, no NaN or Infinity."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


# Read-only `managed` (which client-owned fields a GitOps tool owns, and which tool): it changes
# on its own (at each sync), so an echoed copy is ignored, as `status` is.
Managed = Annotated[
    dict[str, str] | None,
    Field(
        description="Read-only: client-owned fields a GitOps tool manages, and that tool "
        "(a change to one is 409 field_managed unless force=true); ignored when echoed."
    ),
]


def field_path(loc: tuple[int | str, ...]) -> str:
    """`("ttft", "default", "metrics", 0, "threshold")` -> `ttft.default.metrics[0].threshold`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def validation_error(exc: ValidationError, kind: str) -> ApiError:
    causes = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and "[" in p))
        field = field_path(loc)
        if error["type"] == "extra_forbidden":
            message = f"{field} is not a field of {kind} routes"
        elif error["type"] == "missing":
            message = f"{field} is required"
        else:
            message = f"{field}: {error['msg']}"
        causes.append({"field": field, "message": message})
    return invalid(causes[0]["message"], field=causes[0]["field"], causes=causes)


def spec(obj: Obj) -> Obj:
    value = obj.get("spec")
    return value if isinstance(value, dict) else {}


def replacing(new: Any, old: Any) -> Any:
    """A merge-patch value that makes the stored `old` equal `new` (keys `new` lacks -> null)."""
    if isinstance(new, dict):
        previous = old if isinstance(old, dict) else {}
        patch = {k: replacing(v, previous.get(k)) for k, v in new.items()}
        patch.update({k: None for k in previous if k not in new})
        return patch
    return new


def merged(stored: Any, patch: Any) -> Any:
    """`stored` with a JSON merge patch applied (RFC 7386)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(stored) if isinstance(stored, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result


def without_unchanged(patch: Obj, stored: Obj) -> Obj:
    """The top-level fields of a spec patch that would change what is stored.

    A client that echoes a whole body back sends every field it read; only what it changed is
    written, so the audit line and the Event name what the client actually changed.
    """
    return {k: v for k, v in patch.items() if merged(stored.get(k), v) != stored.get(k)}


def present(**fields: Any) -> Obj:
    """The fields that are set: the original API left unset optional fields out of bodies."""
    return {k: v for k, v in fields.items() if v is not None}


def _no_pools(namespace: str, route: str) -> Obj | None:
    return None  # a summary shows no pool


def check_read_only(name: str, sent: Any, current: Any) -> None:
    if sent != current:
        raise invalid(
            f"{name} is read-only: send it unchanged or leave it out "
            "(re-read the route if it changed since)",
            field=name,
        )


# Go's time.ParseDuration, step for step, so slo-api stores only what a Go controller can read.
_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # MICRO SIGN
    "\u03bcs": 1_000,  # GREEK SMALL LETTER MU
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DIGITS = "0123456789"
# The shape alone (ASCII digits, Go's units, an optional "+"), as the ModelPool CRD's pattern;
# the range (at least 1ns, at most Go's longest duration) is checked by go_duration_ns.
GO_DURATION_PATTERN = "^[+]?(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h))+$"
_OVER = 1 << 63
GO_DURATION_MAX = "2562047h47m16.854775807s"  # 1<<63 - 1 nanoseconds


def _leading_int(text: str) -> tuple[int, str]:
    i, x = 0, 0
    while i < len(text) and text[i] in _DIGITS:
        if x > _OVER // 10:
            raise ValueError("overflow")
        x = x * 10 + int(text[i])
        if x > _OVER:
            raise ValueError("overflow")
        i += 1
    return x, text[i:]


def _leading_fraction(text: str) -> tuple[int, float, str]:
    # Digits past what an int64 holds are read but ignored, as Go does.
    i, x, scale, overflow = 0, 0, 1.0, False
    while i < len(text) and text[i] in _DIGITS:
        if not overflow:
            if x > (_OVER - 1) // 10:
                overflow = True
            else:
                y = x * 10 + int(text[i])
                if y > _OVER:
                    overflow = True
                else:
                    x, scale = y, scale * 10
        i += 1
    return x, scale, text[i:]


def go_duration_ns(text: str) -> int | None:
    """Nanoseconds in a Go duration string (`90s`, `5m`, `1h30m`), or None where Go errs."""
    try:
        return _parse_go_duration(text)
    except ValueError:
        return None


def _parse_go_duration(text: str) -> int:
    s, negative = text, False
    if s and s[0] in "+-":
        negative, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError("invalid duration")
    total = 0
    while s:
        if s[0] != "." and s[0] not in _DIGITS:
            raise ValueError("invalid duration")
        before = len(s)
        whole, s = _leading_int(s)
        has_whole = len(s) != before
        fraction, scale, has_fraction = 0, 1.0, False
        if s.startswith("."):
            s = s[1:]
            before = len(s)
            fraction, scale, s = _leading_fraction(s)
            has_fraction = len(s) != before
        if not has_whole and not has_fraction:
            raise ValueError("invalid duration")
        i = 0
        while i < len(s) and s[i] != "." and s[i] not in _DIGITS:
            i += 1
        unit = _UNIT_NS.get(s[:i]) if i else None
        if unit is None:
            raise ValueError("missing or unknown unit")
        s = s[i:]
        if whole > _OVER // unit:
            raise ValueError("overflow")
        whole *= unit
        if fraction:
            # float64 arithmetic, truncated toward zero, exactly as Go computes it.
            whole += int(float(fraction) * (float(unit) / scale))
            if whole > _OVER:
                raise ValueError("overflow")
        total += whole
        if total > _OVER:
            raise ValueError("overflow")
    if negative:
        return -total
    if total > _OVER - 1:
        raise ValueError("overflow")
    return total


class Kind(ABC):
    """One kind of route: how to read its CRs, check bodies, and build merge patches."""

    name: ClassVar[str]
    body_model: ClassVar[type[Body]]
    # A summary's fields beside route and kind, each with where it stands in the route's body
    # (dotted). The summary is that part of the body, so a client that holds bodies (the page,
    # from the change stream) derives it as the server does: the OpenAPI document's `x-summary`.
    summary_fields: ClassVar[dict[str, str]]
    # What DELETE sets: the CRD's defaults of the client-owned fields, as `spec` fields.
    reset_spec: ClassVar[Obj]
    # True when the kind's CRs list other routes as members (pools), which the index tracks.
    groups_routes: ClassVar[bool] = False

    def __init__(self, resource: Resource, groups: Sequence[str] = ()) -> None:
        # The API groups that may serve the kind, most preferred first; `resource` is the
        # kind under the first of them. The version and plural are the same in every group.
        self.groups = tuple(groups) or (resource.group,)
        self.resources = {
            group: Resource(group, resource.version, resource.plural) for group in self.groups
        }
        self.resource = self.resources[self.groups[0]]
        self._summary_steps = tuple(
            (name, tuple(path.split("."))) for name, path in self.summary_fields.items()
        )

    def resource_of(self, obj: Obj) -> Resource:
        """Where a CR the index holds lives: the group of its apiVersion (writes go there)."""
        return self.resources.get(group_of(obj), self.resource)

    @abstractmethod
    def route_of(self, obj: Obj) -> str: ...

    def members_of(self, obj: Obj) -> list[str]:
        return []

    @abstractmethod
    def project(self, obj: Obj, pools: PoolLookup) -> Obj:
        """The route's body as GET answers it."""

    def summary_body(self, obj: Obj) -> Obj:
        """The route's body, or the part of it that holds every summary field."""
        return self.project(obj, _no_pools)

    def summary(self, obj: Obj) -> Obj:
        """The route's line in `GET /config`: `summary_fields` picked from its body."""
        body = self.summary_body(obj)
        summary = {"route": body["route"], "kind": body["kind"]}
        # Every /config page and summary stream renders this once per change of each route.
        for name, steps in self._summary_steps:
            value: Any = body
            for step in steps:
                value = value.get(step) if isinstance(value, dict) else None
            if value is not None:
                summary[name] = value
        return summary

    @abstractmethod
    def spec_patch(self, body: Body, current: Obj, pools: PoolLookup) -> Obj:
        """The `spec` part of the merge patch for a validated body."""

    def reset_patch(self, current: Obj) -> Obj:
        """The `spec` part of the merge patch that DELETE sends."""
        return copy.deepcopy(self.reset_spec)

    @classmethod
    def reset_body(cls) -> Obj:
        """What DELETE sets, in the API's fields (the OpenAPI document's `x-reset`)."""
        return copy.deepcopy(cls.reset_spec)

    @abstractmethod
    def api_field(self, spec_field: str) -> str:
        """The API's name of a field below `spec.` (from an API server's cause)."""

    def parse(self, data: Obj) -> Body:
        try:
            return self.body_model.model_validate(data)
        except ValidationError as exc:
            raise validation_error(exc, self.name) from None

    def translate_field(self, field: str) -> str:
        if field.startswith("spec."):
            return self.api_field(field[len("spec.") :])
        return field
