"""The one error type every failure becomes, and the envelope it is rendered in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Every error code with its HTTP status: the one list (the OpenAPI document names them from
# it). The first code of a status is the one an error that names only its status gets.
ERRORS: dict[str, int] = {
    "invalid_request": 400,
    "limit_exceeded": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "field_managed": 409,
    "expired": 410,
    "precondition_failed": 412,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "too_many_requests": 429,
    "internal_error": 500,
    "upstream_error": 502,
    "not_ready": 503,
    "unavailable": 503,
    "upstream_timeout": 504,
}
CODES: dict[int, str] = {}
for _code, _status in ERRORS.items():
    CODES.setdefault(_status, _code)
_FALLBACK = {False: "invalid_request", True: "internal_error"}
# The codes of the ERROR line that ends a change stream: the caller's access lost (as a request
# would be answered), what it may list changed (watch again without `since`), or the stream fell
# further behind than the history keeps.
STREAM_ERRORS: tuple[str, ...] = (
    "unauthorized",
    "forbidden",
    "expired",
    "too_slow",
    "unavailable",
)


def without_field(message: str, field: str | None) -> str:
    """`message` as said of `field`: a client shows `field: message` (swissd's does), so a
    message never starts with its own field (`priority must be...` -> `must be...`)."""
    if field:
        for prefix in (f"{field}: ", f"{field} "):
            if message.startswith(prefix) and message[len(prefix) :].strip():
                return message[len(prefix) :].lstrip()
    return message


def with_field(field: str | None, message: str) -> str:
    """What a client shows of a message said of `field` (one line naming several causes)."""
    return f"{field}: {message}" if field else message


class ApiError(Exception):
    """An error answered to the client as `{"error": {...}}` with its HTTP status.

    Its code is the first of its status in ERRORS unless `code` names another of them (a status
    with none: invalid_request for 4xx, internal_error for 5xx). With a `field`, the message (and
    each cause's) is what is said of the field, without it (`without_field`): the one place
    that rule is kept, so every error is built as reads best and answered alike.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        field: str | None = None,
        causes: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        message = without_field(message, field)
        super().__init__(message)
        if code is not None and code not in ERRORS:
            raise ValueError(f"{code!r} is not an error code of ERRORS")
        self.status = status
        # A status without a code of its own (a framework's 406 or 501) still answers a code of
        # the list, so clients and the OpenAPI document's enum never meet another.
        self.code = code or CODES.get(status) or _FALLBACK[status >= 500]
        self.message = message
        self.field = field
        self.causes = [
            {**c, "message": without_field(c["message"], c.get("field"))} if "message" in c else c
            for c in causes or []
        ] or None
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        if self.causes:
            error["causes"] = self.causes
        return {"error": error}


def invalid(
    message: str, field: str | None = None, causes: list[dict[str, str]] | None = None
) -> ApiError:
    return ApiError(400, message, field=field, causes=causes)


def field_path(loc: Iterable[int | str]) -> str:
    """`("ttft", "default", "metrics", 0, "threshold")` -> `ttft.default.metrics[0].threshold`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def invalid_fields(errors: Iterable[Mapping[str, Any]], holder: str) -> ApiError:
    """A 400 with one cause per pydantic error (a body's or a request's); `holder` names what
    the fields are fields of, for an unknown one (`llm routes`)."""
    causes = []
    for error in errors:
        # Pydantic names the validators of a union's members in `loc` (`function-after[...]`):
        # not fields the client sent.
        loc = [p for p in error.get("loc", ()) if not (isinstance(p, str) and "[" in p)]
        field = field_path(loc)
        if error.get("type") == "extra_forbidden":
            message = f"is not a field of {holder}"
        elif error.get("type") == "missing":
            message = "is required"
        else:
            message = str(error.get("msg"))
        causes.append({"field": field, "message": message})
    if not causes:
        return invalid("invalid request")
    return invalid(causes[0]["message"], field=causes[0]["field"] or None, causes=causes)
