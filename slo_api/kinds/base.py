"""What every kind of route has in common: the Kind interface and the body rules shared by all."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slo_api.errors import invalid, invalid_fields
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
            raise invalid_fields(
                exc.errors(include_url=False, include_input=False), f"{self.name} routes"
            ) from None

    def translate_field(self, field: str) -> str:
        if field.startswith("spec."):
            return self.api_field(field[len("spec.") :])
        return field
