"""What LLM and job routes share: the serviceId route key, priority and deployment bounds."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field

from slo_api.errors import invalid
from slo_api.kinds.base import (
    Body,
    Kind,
    Managed,
    Obj,
    PoolLookup,
    present,
    replacing,
    spec,
)

HIGH_PRIORITY = 10
INT32_MAX = 2**31 - 1
BoundValue = Annotated[int, Field(ge=0, le=INT32_MAX)]
Priority = Annotated[int, Field(ge=0, le=10)]


class PoolView(Body):
    """Read-only: the ModelPool this route is a member of.

    It changes on its own during swaps, so an echoed copy is ignored, as Kubernetes ignores
    `status` in an update of the main resource.
    """

    route: str
    resident: bool
    phase: str | None


# Read-only: what a platform admin allows (the namespace's SLOLimits `default`), set apart
# from the route's own values; an echoed copy is ignored, as `managed` is.
Limits = Annotated[
    dict[str, int | float] | None,
    Field(
        description="Read-only: the caps in effect for this route (its namespace's SLOLimits "
        "`default`, in that spec's field names: maxPriority, maxReplicas, maxPDEngines, "
        "minTTFTSeconds, maxOTPS, minQueueDepth; only those set that apply to the kind, "
        "maxPDEngines showing maxReplicas where it is unset; absent where none do). A write "
        "beyond one is 400 limit_exceeded; ignored when echoed."
    ),
]
OverLimits = Annotated[
    list[str] | None,
    Field(
        description="Read-only: the fields (the API's names) stored beyond `limits` (set "
        "before the cap, which admission never rechecks); each value may stay or move toward "
        "its cap, not away, nor spread to another value (a threshold is matched by its "
        "context-length range and metric type); ignored when echoed."
    ),
]


class OverLimitBound(Body):
    """One value stored beyond its cap, with the bound a write of its key may reach."""

    limit: str = Field(description="The cap (an SLOLimits spec field, as in `limits`).")
    field: str = Field(description="The capped field, in the API's names.")
    bound: int | float = Field(
        description="The stored value: a write of the same key may reach it (stay or move "
        "toward the cap), no further; every other value and key is held to the cap itself."
    )
    contextLengthRangeLow: int | None = Field(
        default=None,
        description="A threshold's range, by its low bound (absent: the section's default).",
    )
    type: str | None = Field(default=None, description="A threshold's metric type.")


OverLimitBounds = Annotated[
    list[OverLimitBound] | None,
    Field(
        description="Read-only: for each value stored beyond `limits`, the bound that applies "
        "to it (a threshold matched by its context-length range and metric type); every "
        "other value, and every new range or metric, is held to the cap; ignored when echoed."
    ),
]


class SLOBody(Body):
    route: str | None = None
    highPriority: bool | None = None
    priority: Priority | None = None
    pool: PoolView | None = None
    managed: Managed = None
    limits: Limits = None
    overLimits: OverLimits = None
    overLimitBounds: OverLimitBounds = None


def _bound(obj: Any) -> Obj | None:
    return (
        {"type": obj.get("type", "replica"), "value": obj.get("value")}
        if isinstance(obj, dict)
        else None
    )


class SLOKind(Kind):
    """LLMSLORequirement and JobSLORequirement: routes named by spec.serviceId."""

    summary_fields: ClassVar[dict[str, str]] = {
        name: name
        for name in ("highPriority", "priority", "minimumDeployment", "maximumDeployment")
    }
    reset_spec: ClassVar[Obj] = {
        "priority": 0,
        "minimumDeployment": {"type": "replica", "value": 1},
        "maximumDeployment": None,
    }

    def route_of(self, obj: Obj) -> str:
        service_id = spec(obj).get("serviceId")
        return service_id if isinstance(service_id, str) else ""

    def common(self, obj: Obj) -> Obj:
        s = spec(obj)
        priority = s.get("priority", 0)
        return {
            "route": self.route_of(obj),
            "kind": self.name,
            "highPriority": priority == HIGH_PRIORITY,
            "priority": priority,
            **present(
                minimumDeployment=_bound(s.get("minimumDeployment")),
                maximumDeployment=_bound(s.get("maximumDeployment")),
            ),
        }

    def summary_body(self, obj: Obj) -> Obj:
        return self.common(obj)  # the body's first part: its summary fields and no more

    def pool_view(self, obj: Obj, pools: PoolLookup) -> Obj | None:
        meta = obj.get("metadata", {})
        return pools(str(meta.get("namespace", "")), self.route_of(obj))

    def common_patch(self, body: SLOBody, current: Obj, pools: PoolLookup) -> Obj:
        """Priority and bounds. An echoed `pool` is ignored: it changes on its own."""
        fields = body.model_fields_set
        patch: Obj = {}
        priority = self._priority(body, spec(current).get("priority", 0))
        if priority is not None:
            patch["priority"] = priority
        for name in ("minimumDeployment", "maximumDeployment"):
            if name in fields:
                bound = getattr(body, name)
                if bound is None and name == "minimumDeployment":
                    raise invalid(
                        "minimumDeployment cannot be removed (DELETE resets it)", field=name
                    )
                patch[name] = bound.model_dump() if bound is not None else None
        return patch

    @staticmethod
    def _priority(body: SLOBody, stored: int) -> int | None:
        """The priority to write, as the client meant it, or None to leave it.

        Clients of the original API know only `highPriority`, and many send back everything
        they read: a value equal to what is stored counts as echoed, not as a wish.
        """
        fields = body.model_fields_set
        if "highPriority" in fields and body.highPriority is None:
            raise invalid("highPriority must be true or false", field="highPriority")
        if "priority" in fields and body.priority is None:
            raise invalid("priority must be an integer from 0 to 10", field="priority")
        high, priority = body.highPriority, body.priority
        high_changed = high is not None and high != (stored == HIGH_PRIORITY)
        priority_changed = priority is not None and priority != stored
        if high_changed and priority_changed:
            assert priority is not None
            if high != (priority == HIGH_PRIORITY):
                message = (
                    f"highPriority {str(high).lower()} disagrees with priority {priority} "
                    "(true goes with 10, false with 0 to 9)"
                )
                raise invalid(
                    message,
                    field="highPriority",
                    causes=[
                        {"field": "highPriority", "message": message},
                        {"field": "priority", "message": message},
                    ],
                )
            return priority
        if priority_changed:
            return priority
        if high_changed:
            # false lowers only "high" (10) to 0; a tier 1..9 that someone chose stays.
            return HIGH_PRIORITY if high else 0
        return None

    def api_field(self, spec_field: str) -> str:
        return spec_field


def sections_patch(body: Body, current: Obj, names: tuple[str, ...]) -> Obj:
    """Sections replace what is stored: keys the new section lacks become nulls."""
    patch: Obj = {}
    stored = spec(current)
    for name in names:
        if name in body.model_fields_set:
            value = getattr(body, name)
            patch[name] = (
                None
                if value is None
                else replacing(value.model_dump(exclude_none=True), stored.get(name))
            )
    return patch
