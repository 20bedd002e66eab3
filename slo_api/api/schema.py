"""OpenAPI documentation of the bodies, which the routes parse by hand (the kind decides)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from slo_api.errors import ERRORS, STREAM_ERRORS
from slo_api.kinds.base import Kind
from slo_api.kinds.job import JobKind
from slo_api.kinds.llm import LLMKind
from slo_api.kinds.pool import PoolKind

_SAID_OF_FIELD = (
    "With `field` set, it is said of that field and does not start with it: a client shows "
    "`field: message`."
)


class ErrorCause(BaseModel):
    field: str = Field(description="The field in the API's names (`ttft.default.metrics[0]`).")
    message: str = Field(description=f"What is wrong. {_SAID_OF_FIELD}")
    manager: str | None = Field(
        None, description="field_managed: the GitOps tool that owns the field."
    )
    operation: str | None = Field(None, description="field_managed: Apply or Update.")
    time: str | None = Field(None, description="field_managed: when the tool last set it.")
    limit: str | None = Field(
        None, description="limit_exceeded: the field of the namespace's SLOLimits that caps it."
    )


class ErrorDetail(BaseModel):
    code: str = Field(
        description=", ".join(f"{code} ({status})" for code, status in ERRORS.items()),
        json_schema_extra={"enum": list(ERRORS)},
    )
    message: str = Field(
        description=f"What is wrong, in words a person can act on. {_SAID_OF_FIELD} Another "
        "cause it names is named as `field: message`."
    )
    field: str | None = Field(
        None, description="The field the error is about (the first cause's, with causes)."
    )
    causes: list[ErrorCause] | None = Field(None, description="Every problem found, in order.")


class Error(BaseModel):
    """The one envelope of every error."""

    error: ErrorDetail


class Summary(BaseModel):
    """One route in `GET /config`: the fields that apply to its kind, or `ambiguous`.

    `x-summary` names each kind's fields and where they stand in its body (dotted).
    """

    route: str
    kind: str | None = None
    highPriority: bool | None = None
    priority: int | None = None
    minimumDeployment: dict[str, Any] | None = None
    maximumDeployment: dict[str, Any] | None = None
    swapPolicy: str | None = None
    swapBudget: str | None = None
    residentMember: str | None = None
    ambiguous: bool | None = None
    kinds: list[str] | None = None
    count: int | None = None


class ConfigPage(BaseModel):
    items: list[dict[str, Any]] = Field(
        description="Summaries, or with view=full the bodies GET /routes/{route} answers"
    )
    total: int
    page: int
    pageSize: int


class FieldChange(BaseModel):
    field: str = Field(description="The API's name: `priority`, `ttft`, `pool.swapBudget`, ...")
    from_: Any = Field(None, alias="from", description="The value before (null: not set)")
    to: Any = Field(None, description="The value after (null: removed)")


class HistoryEntry(BaseModel):
    """One change of a route's client-owned fields."""

    id: str = Field(description="The CR's resourceVersion after the change: what revert names")
    time: str = Field(description="When (RFC 3339, seconds)")
    actor: str = Field(
        description="Who: the caller as the audit line names it (a Kubernetes username, or "
        "token:write), or the field manager for a change made around slo-api"
    )
    via: str = Field(
        description="`slo-api`, or the field manager that made the change (`unknown` when "
        "managedFields do not say; `slo-api` with the actor `unknown`: a change that claims "
        "slo-api's manager but that no replica made)"
    )
    requestId: str | None = Field(
        None, description="slo-api's own id of the write's request (via slo-api)"
    )
    clientRequestId: str | None = Field(
        None, description="The X-Request-Id the caller sent with the write, if any"
    )
    changes: list[FieldChange] = Field(
        description='A value over 8 KiB is `{digest: "sha256:...", size}` instead'
    )
    after: dict[str, Any] = Field(
        description="The route's client-owned fields after the change: a PUT body (a value "
        "over 8 KiB kept as its digest: such an entry cannot be reverted)"
    )
    owners: dict[str, Any] | None = Field(
        None,
        description="The GitOps owners in effect after the change, per field below spec: "
        "`{manager, operation, time}`",
    )
    migrated: bool = Field(
        False,
        description="Carried over from the ConfigMap an earlier version kept the route's "
        "history in: a store namespace editors could write, so its actor and values are as "
        "trustworthy as that namespace's editors",
    )


class HistoryPage(BaseModel):
    items: list[HistoryEntry] = Field(description="Newest first")
    total: int
    page: int
    pageSize: int


class AttainmentSource(BaseModel):
    status: str = Field(
        description="stale: no refresh has renewed the figures for over 3 refresh intervals "
        "and a query timeout",
        json_schema_extra={"enum": ["ok", "stale", "unavailable", "not_configured"]},
    )
    reason: str | None = Field(
        description="Why stale or unavailable (null when ok or not_configured)"
    )
    asOf: str | None = Field(
        description="RFC 3339 UTC time of the figures shown; null before the first good answer"
    )


class BurnRates(BaseModel):
    """`(1 - goodRatio over w) / (1 - objective)`, whatever the window asked for; null: no
    requests in w."""

    model_config = {"populate_by_name": True}
    m5: float | None = Field(alias="5m")
    m30: float | None = Field(alias="30m")
    h1: float | None = Field(alias="1h")
    h6: float | None = Field(alias="6h")


class GoodRatioBounds(BaseModel):
    """What the interpolated good ratio is known to lie between: the fraction counted at the
    bucket bounds around the threshold (equal when the threshold is a bound)."""

    low: float
    high: float


class Coverage(BaseModel):
    """The part of the window Prometheus holds for the route: from its earliest sample (to
    within `resolution`), of the series its figures are read from (the recorded ones when
    `sloctl rules` records the route)."""

    since: str = Field(description="RFC 3339 UTC time of the earliest sample in the window")
    fraction: float = Field(description="Of the window held, 0 to 1")
    resolution: str = Field(
        description="The step the earliest sample was looked for at (`40m19s`): a thousandth "
        "of the window, at least a minute, coarser when a finer one would hold more than "
        "ATTAINMENT_MAX_SAMPLES samples at once"
    )


class ExhaustsAt(BaseModel):
    """When the window's error budget runs out if the burn rate over 1h (or 6h) goes on
    (RFC 3339 UTC); null when it never does at that rate (at or below 1) or is already spent."""

    model_config = {"populate_by_name": True}
    h1: str | None = Field(alias="1h")
    h6: str | None = Field(alias="6h")


class AttainmentObjective(BaseModel):
    metric: str = Field(json_schema_extra={"enum": ["ttft", "otps", "queue"]})
    type: str = Field(description="avg, p50...p99, or maxDepth (queue)")
    threshold: float
    objective: float | None = Field(description="The fraction within threshold (0.9 for p90)")
    observed: float | None
    goodRatio: float | None
    budgetRemaining: float | None = Field(description="Negative when overspent")
    burnRates: BurnRates | None
    status: str = Field(json_schema_extra={"enum": ["no_data", "violated", "at_risk", "met"]})
    estimated: bool = Field(description="The threshold falls between bucket bounds: interpolated")
    requests: float | None = Field(
        description="Requests counted in the window (an increase: may be fractional); null "
        "for a queue or when no series matched"
    )
    reason: str | None = Field(
        description="Why no_data: the selector matched no series in the window, they counted "
        "no request, or fewer than ATTAINMENT_MIN_REQUESTS (the figures are still shown)",
        json_schema_extra={"enum": ["no_series", "no_traffic", "insufficient_traffic", None]},
    )
    goodRatioBounds: GoodRatioBounds | None = Field(description="Null when goodRatio is")
    coverage: Coverage | None = Field(
        description="Null for a queue, when no series matched, or when Prometheus did not answer"
    )
    exhaustsAt: ExhaustsAt | None = Field(description="Percentile objectives only")
    series: list[list[float]] | None = Field(
        None,
        description="GET one route only: [unix seconds, observed over the step ending then], "
        "at most 200 points (step = window / 200, at least 5 minutes)",
    )


class Unmeasured(BaseModel):
    metric: str
    range: dict[str, Any] | None
    reason: str


class Selectors(BaseModel):
    """Each metric's label matchers of the route, braces included, to follow a series name
    (`{model_name="chat-7b"}`): built with its queries, so `sloctl rules` records the same
    series."""

    ttft: str
    otps: str


class AlertBucket(BaseModel):
    le: float = Field(description="The bucket bound good requests are counted at")
    exact: bool = Field(description="false: the threshold lies above it, between two bounds")


class AlertArm(BaseModel):
    severity: str = Field(json_schema_extra={"enum": ["page", "ticket"]})
    long: str
    short: str
    burnRate: float = Field(description="Fires when both windows burn above it")
    budgetShare: float = Field(
        description="The share of the 28-day error budget that burn spends over `long`"
    )
    capped: bool = Field(
        description="Lowered from the workbook's factor so the arm can fire: it needs at most "
        "half of the requests to miss the threshold"
    )


class Alerting(BaseModel):
    """What the alerts of one percentile target count and fire on (`sloctl rules`)."""

    metric: str = Field(json_schema_extra={"enum": ["ttft", "otps"]})
    type: str
    threshold: float
    objective: float
    bucket: AlertBucket | None = Field(description="null: no bucket bound lies at or below it")
    arms: list[AlertArm]


class Narrowed(BaseModel):
    """A metric whose raw series over the window hold more samples than one query may load."""

    metric: str = Field(json_schema_extra={"enum": ["ttft", "otps"]})
    window: str = Field(description="The answer's window, or a burn rate's (5m, 30m, 1h, 6h)")
    to: str | None = Field(
        description="The span its figures are over instead (`3d11h20m`); null: not queried"
    )
    reason: str


class Attainment(BaseModel):
    """Is the route meeting its SLO (see docs/api.md, Attainment)."""

    route: str
    kind: str
    window: str = Field(json_schema_extra={"enum": ["1h", "1d", "7d", "28d"]})
    source: AttainmentSource
    selectors: Selectors | None = Field(description="null for job and pool routes")
    objectives: list[AttainmentObjective]
    unmeasured: list[Unmeasured]
    alerting: list[Alerting] = Field(
        description="Each percentile target of ttft/otps defaults, figures or not (LLM routes)"
    )
    narrowed: list[Narrowed] = Field(
        description="Metrics read over less than the window (ATTAINMENT_MAX_SAMPLES), with why"
    )


class AttainmentPage(BaseModel):
    items: list[Attainment]
    total: int
    page: int
    pageSize: int


KINDS: list[type[Kind]] = [LLMKind, JobKind, PoolKind]
MODELS: list[type[BaseModel]] = [
    *(kind.body_model for kind in KINDS),
    Error,
    Summary,
    ConfigPage,
    HistoryPage,
    Attainment,
    AttainmentPage,
]


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


ROUTE_BODY = {"oneOf": [ref(kind.body_model.__name__) for kind in KINDS]}
_ERROR = {"application/json": {"schema": ref("Error")}}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {
        304: "Not modified (If-None-Match matched)",
        400: "Invalid request, or a value beyond the route's limits (limit_exceeded: `field` "
        "names it, the message the cap and where it is set)",
        401: "Missing or wrong token",
        403: "A read token on a write, RBAC denies the Kubernetes identity this verb, or "
        "(watch) it may list and watch the kind in no namespace",
        404: "No such route, or none of its CRs the caller may read",
        409: "The route is claimed by more than one CR (conflict), or the write would change a "
        "field a GitOps tool owns (field_managed: its causes name each field and manager)",
        412: "If-Match did not match",
        413: "Body too large",
        415: "Body not JSON",
        410: "watch: `since` (or Last-Event-ID) is too old or from another server process; "
        "watch again without it",
        429: "watch: MAX_WATCHERS streams are open already (see Retry-After)",
        502: "The API server failed",
        503: "Not ready, or the API server cannot review a Kubernetes identity (Retry-After)",
        504: "The API server timed out",
    }
    return {c: {"description": text[c], **({} if c == 304 else {"content": _ERROR})} for c in codes}


_COMMON = (400, 401, 403, 404, 409, 502, 503, 504)
_ETAG = {"ETag": {"description": "The CR's resourceVersion, quoted", "schema": {"type": "string"}}}
_WRITTEN = {
    **_ETAG,
    "Warning": {
        "description": 'With force=true over fields a GitOps tool manages: 299 - "forced over '
        '<manager> (<fields>): ..." (the tool will revert the change at its next sync)',
        "schema": {"type": "string"},
    },
}
GET_RESPONSES = {
    200: {
        "description": "The route",
        "headers": _ETAG,
        "content": {"application/json": {"schema": ROUTE_BODY}},
    },
    **_errors(304, *_COMMON),
}
HISTORY_RESPONSES = {
    200: {
        "description": "The route's recorded changes, newest first (the last "
        "ROUTE_HISTORY_ENTRIES), paginated like /config",
        "content": {"application/json": {"schema": ref("HistoryPage")}},
    },
    **_errors(*_COMMON),
}
ATTAINMENT_RESPONSES = {
    200: {
        "description": "Whether the route meets its SLO over the window, from Prometheus",
        "content": {"application/json": {"schema": ref("Attainment")}},
    },
    **_errors(*_COMMON),
}
PUT_RESPONSES = {
    200: {
        "description": "The stored (or, with dryRun, would-be) route; when the body changes "
        "nothing, the route as stored (no write, no Event)",
        "headers": _WRITTEN,
        "content": {"application/json": {"schema": ROUTE_BODY}},
    },
    **_errors(*_COMMON, 412, 413, 415),
}
DELETE_RESPONSES = {
    204: {"description": "Reset", "headers": _WRITTEN},
    200: {
        "description": "With dryRun: the would-be route",
        "headers": _WRITTEN,
        "content": {"application/json": {"schema": ROUTE_BODY}},
    },
    **_errors(*_COMMON, 412),
}
WATCH_EVENT = {
    "type": "object",
    "description": (
        "One change. ADDED, MODIFIED and DELETED carry `route` and `object` (the /config item "
        "in the chosen view; for DELETED, as it last was). The stream opens with one ADDED per "
        "route, then a BOOKMARK with `initial: true`; BOOKMARKs follow every "
        "WATCH_BOOKMARK_SECONDS. A stream the server ends in order (its lifetime, "
        "WATCH_LIFETIME_SECONDS, is over, or the server stops) ends with a BOOKMARK with "
        "`final: true`: resume from its revision. ERROR is the last line of a stream the "
        "server ended for a reason of its own."
    ),
    "required": ["type"],
    "properties": {
        "type": {"enum": ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]},
        "route": {"type": "string"},
        "object": {"type": "object"},
        "by": {
            "type": "object",
            "description": (
                "On an ADDED or MODIFIED (never in the initial state) that comes from a change "
                "of a route's fields, who made it, as the history names it, matched by the "
                "change's resourceVersion: `actor`, `via` (`slo-api` or the field manager), "
                "`requestId` and `clientRequestId`. Through the replica that wrote it: the "
                "caller and request ids; through another replica: only `via: slo-api` (`actor` "
                "`unknown`); around slo-api: the field manager. Absent when not known (a "
                "relist, a change the history does not record)."
            ),
            "properties": {
                "actor": {"type": ["string", "null"]},
                "via": {"type": "string"},
                "requestId": {"type": ["string", "null"]},
                "clientRequestId": {"type": ["string", "null"]},
            },
        },
        "revision": {"type": "string", "description": "Opaque; resume with since=<revision>."},
        "initial": {"type": "boolean"},
        "final": {
            "type": "boolean",
            "description": "The stream's last line: resume with since=<its revision>.",
        },
        "error": {
            "type": "object",
            "description": "ERROR: why the stream ended. too_slow: it fell further behind "
            "than the history keeps; expired: what the caller may list changed (both: watch "
            "again without since); unauthorized, forbidden: the caller's access was lost; "
            "unavailable: its access could not be checked for WATCH_REVIEW_GRACE_SECONDS "
            "(resume with since, from the bookmark before it).",
            "properties": {
                "code": {"type": "string", "enum": list(STREAM_ERRORS)},
                "message": {"type": "string"},
            },
        },
    },
}
CONFIG_RESPONSES = {
    200: {
        "description": (
            "A page of routes (weak ETag over the page). With `watch=true`, a stream of change "
            "events instead: JSON lines, or Server-Sent Events when the request accepts "
            "text/event-stream (each event's `id` is its revision; Last-Event-ID resumes)."
        ),
        "content": {
            "application/json": {"schema": ref("ConfigPage")},
            "application/x-ndjson": {"schema": WATCH_EVENT},
            "text/event-stream": {
                "schema": {
                    "type": "string",
                    "description": "`id: <revision>` and `data: <event as JSON>` per event.",
                }
            },
        },
    },
    **_errors(304, 400, 401, 403, 410, 429, 503),
}
PUT_BODY = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": ROUTE_BODY}}}
}


def add_components(openapi: dict[str, Any]) -> dict[str, Any]:
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    # Clients (the demo page) read a body's kind and what DELETE resets it to from here, and
    # which fields of a body make its summary.
    for kind in KINDS:
        schemas[kind.body_model.__name__].update(
            {"x-kind": kind.name, "x-reset": kind.reset_body()}
        )
    schemas["Summary"]["x-summary"] = {kind.name: dict(kind.summary_fields) for kind in KINDS}
    openapi["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in openapi.get("paths", {}).items():
        if path.startswith(("/routes", "/config")):
            for operation in operations.values():
                operation["security"] = [{"bearer": []}]
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    return openapi
