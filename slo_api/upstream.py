"""How an API server failure is answered: the one mapping from KubeError to ApiError."""

from __future__ import annotations

import logging
import re

from slo_api.errors import ApiError, invalid
from slo_api.kinds.base import Kind, Obj
from slo_api.kube import KubeError, KubeTimeout

log = logging.getLogger("slo_api.upstream")

_UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')
_DUPLICATE_FIELD = re.compile(r'duplicate field "([^"]+)"')
# What the API server writes when an admission policy or webhook, not RBAC, refused a request;
# the match starts where the policy's own words start (after `<kind> "<name>" is forbidden: `).
_ADMISSION = re.compile(
    r"(?:Validating|Mutating)AdmissionPolicy '[^']*'.*?denied request.*"
    r'|admission webhook "[^"]*" denied the request.*',
    re.DOTALL,
)


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
                    "message": f"{kind.translate_field(f)}: the installed CRD has no such field",
                }
                for f in unknown
            )
            continue
        k8s_field = str(cause.get("field", ""))
        field = kind.translate_field(k8s_field)
        if k8s_field:
            message = message.replace(k8s_field, field)
        message = _scrub(message, secrets)
        causes.append({"field": field, "message": f"{field}: {message}" if field else message})
    return causes


def to_api_error(exc: KubeError, kind: Kind, obj: Obj) -> ApiError:
    """Translate an API server failure on one CR into what the client is told."""
    if isinstance(exc, KubeTimeout):
        return ApiError(504, "the Kubernetes API server did not answer in time")
    denial = _ADMISSION.search(exc.message) if exc.status in (400, 403, 422) else None
    if denial is not None:
        # The cluster's policy refused this change (whatever code it chose): the client can
        # act on its reason; slo-api's own permissions are fine.
        return invalid(_scrub(denial.group(), _secrets(obj)))
    if exc.status in (400, 422):
        causes = _causes(exc, kind, obj)
        if not causes:
            return invalid("the Kubernetes API server refused the change")
        return invalid(
            "; ".join(c["message"] for c in causes), field=causes[0]["field"], causes=causes
        )
    if exc.status == 404:
        return ApiError(404, f"route {kind.route_of(obj)!r} is gone")
    if exc.status == 409:
        return ApiError(409, "the route changed during the write: retry")
    if exc.status in (401, 403):
        log.error(
            "RBAC: the API server refused slo-api (%s %s on %s); check its ClusterRole "
            "grants get, list, watch and patch",
            exc.status,
            exc.reason,
            kind.resource.plural,
        )
        return ApiError(
            502,
            "slo-api is not allowed to do this in the cluster "
            "(an operator has been alerted in the logs)",
        )
    return ApiError(
        502, f"the Kubernetes API server failed to answer ({exc.status or 'no response'})"
    )
