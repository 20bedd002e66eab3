"""Pool routes: ModelPool, named by metadata.name, whose members share one GPU slot."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from slo_api.errors import invalid
from slo_api.kinds.base import (
    Body,
    Kind,
    Managed,
    Obj,
    PoolLookup,
    check_read_only,
    present,
    spec,
)
from slo_api.kinds.goduration import GO_DURATION_MAX, GO_DURATION_PATTERN, go_duration_ns
from slo_api.route_names import MAX_ROUTE, route_problem

_NULLABLE = ("default", "reclaimAfter")


def _positive_duration(value: str | None) -> str | None:
    if value is None:
        return value
    ns = go_duration_ns(value)
    if ns is None:
        raise ValueError(
            "must be a Go duration such as 45s, 5m or 1h30m (ASCII digits; units ns, us, ms, "
            f"s, m, h), at most {GO_DURATION_MAX}"
        )
    if ns < 1:
        raise ValueError("must be at least 1ns")
    return value


_DURATION = Field(
    max_length=64,
    description=f"A Go duration from 1ns to {GO_DURATION_MAX}, such as 45s, 5m or 1h30m.",
    # Documented only: the validator below checks the shape and the range in one go.
    json_schema_extra={"pattern": GO_DURATION_PATTERN},
)


def _route_name(value: str | None) -> str | None:
    # The default is a member's route: the one rule for route names, not a restatement of it.
    problem = None if value is None else route_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


class PoolSettings(Body):
    default: Annotated[str, Field(min_length=1, max_length=MAX_ROUTE)] | None = None
    swapPolicy: Literal["sticky", "reclaim"] | None = None
    swapBudget: Annotated[str, _DURATION] | None = None
    reclaimAfter: Annotated[str, _DURATION] | None = None
    members: list[str] | None = Field(None, description="Read-only.")
    gpu: int | None = Field(None, description="Read-only.")

    _durations = field_validator("swapBudget", "reclaimAfter")(_positive_duration)
    _default = field_validator("default")(_route_name)


class MemberStatus(Body):
    name: str
    phase: str | None = None
    resident: bool | None = None


class PoolStatus(Body):
    """Read-only: what the pool controller last reported.

    It changes on its own during swaps, so an echoed copy is ignored (never compared).
    """

    phase: str | None = None
    residentMember: str | None = None
    pendingMember: str | None = None
    members: list[MemberStatus] = []


class PoolBody(Body):
    """A pool route. Fields left out keep their stored values."""

    route: str | None = None
    kind: Literal["pool"] | None = None
    pool: PoolSettings | None = None
    status: PoolStatus | None = None
    managed: Managed = None


def members(obj: Obj) -> list[str]:
    names = []
    for member in spec(obj).get("members") or []:
        ref = member.get("inferenceServiceRef") if isinstance(member, dict) else None
        name = ref.get("name") if isinstance(ref, dict) else None
        if isinstance(name, str) and name:
            names.append(name)
    return names


def status_view(obj: Obj) -> Obj:
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    assert isinstance(status, dict)
    return {
        "phase": status.get("phase"),
        "residentMember": status.get("residentMember") or None,
        "pendingMember": status.get("pendingMember") or None,
        "members": [
            {"name": m.get("name"), "phase": m.get("phase"), "resident": m.get("resident")}
            for m in status.get("members") or []
            if isinstance(m, dict)
        ],
    }


class PoolKind(Kind):
    name = "pool"
    body_model = PoolBody
    summary_fields: ClassVar[dict[str, str]] = {
        "swapPolicy": "pool.swapPolicy",
        "swapBudget": "pool.swapBudget",
        "residentMember": "status.residentMember",
    }
    reset_spec: ClassVar[Obj] = {
        "swapPolicy": "sticky",
        "swapBudget": "300s",
        "default": None,
        "reclaimAfter": None,
    }
    groups_routes = True

    def route_of(self, obj: Obj) -> str:
        return str(obj.get("metadata", {}).get("name", ""))

    def members_of(self, obj: Obj) -> list[str]:
        return members(obj)

    def settings(self, obj: Obj) -> Obj:
        s = spec(obj)
        return {
            "members": members(obj),
            **present(
                default=s.get("default") or None,
                swapPolicy=s.get("swapPolicy"),
                swapBudget=s.get("swapBudget"),
                reclaimAfter=s.get("reclaimAfter") or None,
                gpu=s.get("gpu"),
            ),
        }

    def project(self, obj: Obj, pools: PoolLookup) -> Obj:
        return {
            "route": self.route_of(obj),
            "kind": self.name,
            "pool": self.settings(obj),
            "status": status_view(obj),
        }

    def spec_patch(self, body: Body, current: Obj, pools: PoolLookup) -> Obj:
        assert isinstance(body, PoolBody)
        if "pool" not in body.model_fields_set:
            return {}
        if body.pool is None:
            raise invalid("pool cannot be null: send the settings to change", field="pool")
        settings = body.pool
        stored = self.settings(current)
        patch: Obj = {}
        for name in sorted(settings.model_fields_set):
            value: Any = getattr(settings, name)
            if name in ("members", "gpu"):
                check_read_only(f"pool.{name}", value, stored.get(name))
            elif value is None and name not in _NULLABLE:
                raise invalid(
                    f"pool.{name} cannot be null (DELETE resets it)", field=f"pool.{name}"
                )
            else:
                patch[name] = value
        default = patch.get("default")
        # Only a changed default is checked: one echoed unchanged is not the client's wish,
        # even if the deployer has since removed that member.
        if (
            default is not None
            and default != stored.get("default")
            and (default not in stored["members"])
        ):
            raise invalid(
                f"pool.default must name a current member ({', '.join(stored['members'])})",
                field="pool.default",
            )
        return patch

    @classmethod
    def reset_body(cls) -> Obj:
        return {"pool": super().reset_body()}

    def api_field(self, spec_field: str) -> str:
        if spec_field.startswith("members"):
            return "pool.members"
        return f"pool.{spec_field}"
