"""The one error type every failure becomes, and the envelope it is rendered in."""

from __future__ import annotations

from typing import Any

CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    412: "precondition_failed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    500: "internal_error",
    502: "upstream_error",
    503: "not_ready",
    504: "upstream_timeout",
}


class ApiError(Exception):
    """An error answered to the client as `{"error": {...}}` with its HTTP status."""

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
        super().__init__(message)
        self.status = status
        self.code = code or CODES.get(status, "error")
        self.message = message
        self.field = field
        self.causes = causes
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
