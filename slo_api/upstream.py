"""How an API server failure is answered: the one mapping from KubeError to ApiError.

`failure` is what any call's failure becomes (504, or 502 with an RBAC refusal logged
loudly); `to_api_error` adds what a CR's own read or write can say (a refused change is
400 with its causes, or `limit_exceeded` when the guardrails refused it, 404, 409);
`unavailable` is a review nobody answered (503: fail closed).
"""

from __future__ import annotations

import logging
import re

from slo_api.errors import ApiError, invalid, with_field
from slo_api.kinds.base import Kind, Obj
from slo_api.kube import KubeError, KubeTimeout, log_failure
from slo_api.limits import refusal

log = logging.getLogger("slo_api.upstream")

# What slo-api's own ClusterRole must grant on the kinds it serves.
KINDS_ROLE = "its ClusterRole grants get, list, watch and patch"
# How long a client is asked to wait after a review nobody answered.
RETRY_AFTER_SECONDS = 5

_UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')
_DUPLICATE_FIELD = re.compile(r'duplicate field "([^"]+)"')


def _secrets(obj: Obj) -> set[str]:
    meta = obj.get("metadata", {})
    return {str(meta.get("name", "")), str(meta.get("namespace", ""))} - {""}


def _scrub(message: str, secrets: set[str]) -> str:
    """`message` without the CR's name and namespace, quoted or not, as whole words only."""
    for secret in sorted(secrets, key=len, reverse=True):
        # Not inside a longer name: no word character, "-" or "." glued on either side
        # (a "." that ends a sentence is fine); quotes stay, so `"name"` becomes `"…"`.
        whole = rf"(?<![\w.-]){re.escape(secret)}(?![\w-]|\.[\w-])"
        message = re.sub(whole, "…", message)
    return message


def _causes(exc: KubeError, kind: Kind, obj: Obj) -> list[dict[str, str]]:
    secrets = _secrets(obj)
    causes: list[dict[str, str]] = []
    for cause in exc.causes:
        message = str(cause.get("message", ""))
        # Strict field validation puts the whole object (names included) in the message and
        # the field "patch"; only the unknown field names are worth passing on.
        unknown = _UNKNOWN_FIELD.findall(message) + _DUPLICATE_FIELD.findall(message)
        if unknown:
            causes.extend(
                {
                    "field": kind.translate_field(f),
                    "message": "the installed CRD has no such field",
                }
                for f in unknown
            )
            continue
        k8s_field = str(cause.get("field", ""))
        field = kind.translate_field(k8s_field)
        if k8s_field:
            message = message.replace(k8s_field, field)
        message = _scrub(message, secrets)
        causes.append({"field": field, "message": message})
    return causes


def failure(exc: KubeError, what: str, check: str) -> ApiError:
    """What a client is told of any failed call: 504 for a timeout, 502 otherwise; a refusal
    of slo-api itself (RBAC) is logged loudly (`what` the call, `check` what to grant)."""
    if isinstance(exc, KubeTimeout):
        return ApiError(504, "the Kubernetes API server did not answer in time")
    if exc.rbac:
        log_failure(log, exc, what, check)
        return ApiError(
            502,
            "slo-api is not allowed to do this in the cluster "
            "(an operator has been alerted in the logs)",
        )
    return ApiError(
        502, f"the Kubernetes API server failed to answer ({exc.status or 'no response'})"
    )


def to_api_error(exc: KubeError, kind: Kind, obj: Obj) -> ApiError:
    """Translate an API server failure on one CR into what the client is told."""
    denial = exc.denial
    if denial is not None:
        # The cluster's policy refused this change (whatever code it chose): the client can
        # act on its reason; slo-api's own permissions are fine. The guardrails' policy is
        # told in the API's names (the field, the cap and where it is set).
        return refusal(denial) or invalid(_scrub(denial, _secrets(obj)))
    if exc.status in (400, 422):
        causes = _causes(exc, kind, obj)
        if not causes:
            return invalid("the Kubernetes API server refused the change")
        return invalid(
            "; ".join(with_field(c["field"], c["message"]) for c in causes),
            field=causes[0]["field"] or None,
            causes=causes,
        )
    if exc.status == 404:
        return ApiError(404, f"route {kind.route_of(obj)!r} is gone")
    if exc.status == 409:
        return ApiError(409, "the route changed during the write: retry")
    return failure(exc, f"on {kind.resource.plural}", KINDS_ROLE)


def unavailable(what: str, why: object) -> ApiError:
    """A review (`what`) the API server did not answer, or whose answer cannot be read, or
    that waits too long for a slot: the request is refused (503 with Retry-After)."""
    if isinstance(why, KubeError) and why.rbac:
        log_failure(log, why, f"a {what}", "that it is bound to system:auth-delegator")
    else:
        log.error("%s failed, refusing the request: %s", what, why)
    return ApiError(
        503,
        f"cannot check the caller's access: the Kubernetes API server did not answer the {what}",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        code="unavailable",
    )
