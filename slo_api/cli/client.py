"""A small synchronous client for the slo-api HTTP contract."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx

from slo_api.cli.errors import CliError, ExitCode, usage

Body = dict[str, Any]

# A change stream sends a bookmark every 15 s (the server's default): four missed in a row
# means the connection is dead even if no error said so.
WATCH_READ_TIMEOUT = 60.0

PAGE_SIZE = (
    200  # the largest page the API serves, so a listing takes as few round trips as possible
)

_EXIT_BY_STATUS = {
    401: ExitCode.AUTH,
    403: ExitCode.AUTH,
    404: ExitCode.NOT_FOUND,
    409: ExitCode.CONFLICT,
    412: ExitCode.CONFLICT,
}

_HINTS = {
    401: "pass --token-file (or --token), set SLO_API_TOKEN, or point --kubeconfig at a context "
    "with a token",
    403: "the token may be read-only, or RBAC does not grant this identity the verb",
}


def exit_code_for(status: int) -> ExitCode:
    if status in _EXIT_BY_STATUS:
        return _EXIT_BY_STATUS[status]
    if 400 <= status < 500:
        return ExitCode.USAGE
    return ExitCode.SERVER


def encode_body(body: Any) -> bytes:
    """JSON-encode a request body, refusing what JSON cannot carry (NaN, YAML dates)."""
    try:
        return json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise usage(f"the body cannot be sent as JSON: {exc}") from None


class StreamLost(Exception):
    """A change stream ended or broke; it can be resumed from the last revision read."""


class SloClient:
    def __init__(
        self,
        server: str,
        token: str | None,
        timeout: float,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not server.startswith(("http://", "https://")):
            raise usage(f"--server must be an http:// or https:// URL, got {server!r}")
        # Keep any path prefix: a gateway may serve the API under one.
        self.server = server.rstrip("/")
        self.timeout = timeout
        # The Warning headers of the answers so far (a forced write names who will revert it).
        self.warnings: list[str] = []
        headers = {"Accept": "application/json", "User-Agent": "sloctl"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            headers=headers, timeout=httpx.Timeout(timeout), transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SloClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the API ------------------------------------------------------------------------------

    def list_summaries(self, kind: str | None = None) -> list[Body]:
        """Every route summary, walking the pages until `total` items are read."""
        return self._routes_pages("/config", {"kind": kind} if kind else {}, "/config")

    def attainment(self, route: str, window: str | None = None) -> Body:
        """Whether one route meets its objectives (`GET /routes/{route}/attainment`)."""
        params: dict[str, str | int] = {"window": window} if window else {}
        path = self._route_path(route) + "/attainment"
        return self._json_object(self._send("GET", path, params=params or None))

    def attainment_list(self, window: str | None = None, by_budget: bool = False) -> list[Body]:
        """Every visible route's attainment without series (`GET /config?view=attainment`)."""
        params: dict[str, str | int] = {"view": "attainment"}
        if window:
            params["window"] = window
        if by_budget:
            params["sort"] = "budget"
        return self._routes_pages("/config", params, "attainment")

    def _routes_pages(self, path: str, params: dict[str, str | int], what: str) -> list[Body]:
        """Every item of a paged route listing, read until `total`; each route once."""
        items: list[Body] = []
        seen: set[str] = set()
        page = 1
        while True:
            query: dict[str, str | int] = {**params, "page": page, "pageSize": PAGE_SIZE}
            data = self._json_object(self._send("GET", path, params=query))
            batch, total = data.get("items"), data.get("total")
            if not isinstance(batch, list) or not isinstance(total, int):
                raise CliError(
                    f"the server's {what} answer has no items/total; is --server an slo-api?",
                    ExitCode.SERVER,
                )
            for item in batch:
                # Routes added or removed between pages shift the window; skip repeats.
                route = item.get("route") if isinstance(item, dict) else None
                if isinstance(route, str) and route not in seen:
                    seen.add(route)
                    items.append(item)
            if not batch or len(items) >= total:
                return items
            page += 1

    def summary_fields(self) -> dict[str, list[str]]:
        """Each kind's summary fields, as the server's OpenAPI document names them."""
        doc = self._json_object(self._send("GET", "/openapi.json"))
        shape = doc.get("components", {}).get("schemas", {}).get("Summary", {}).get("x-summary")
        if not isinstance(shape, dict) or not all(
            isinstance(fields, dict) for fields in shape.values()
        ):
            raise CliError(
                "the server's OpenAPI document does not say what a summary holds "
                "(x-summary); is --server an slo-api of this version or later?",
                ExitCode.SERVER,
            )
        return {str(kind): [str(name) for name in fields] for kind, fields in shape.items()}

    def watch(self, kind: str | None = None, since: str | None = None) -> Iterator[Body]:
        """The events of `GET /config?watch=true` as they come; StreamLost when it ends.

        Errors the server answers before the stream starts (401, 410 expired, 429) are
        CliErrors like any request's.
        """
        params = {"watch": "true"}
        if kind:
            params["kind"] = kind
        if since:
            params["since"] = since
        timeout = httpx.Timeout(self.timeout, read=max(self.timeout, WATCH_READ_TIMEOUT))
        headers = {"Accept": "application/x-ndjson"}
        try:
            with self._http.stream(
                "GET", self.server + "/config", params=params, headers=headers, timeout=timeout
            ) as response:
                if response.status_code >= 300:
                    response.read()
                    raise error_from_response(response)
                for line in response.iter_lines():
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        raise CliError(
                            f"{self.server} sent a line that is not JSON; is --server an slo-api?",
                            ExitCode.SERVER,
                        ) from None
                    if isinstance(event, dict):
                        yield event
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise usage(f"bad server URL {self.server!r}: {exc}") from None
        except httpx.TransportError as exc:
            raise StreamLost(str(exc) or type(exc).__name__) from None
        raise StreamLost("the server ended the stream")

    def history(self, route: str) -> list[Body]:
        """A route's recorded changes, newest first, walking the pages until `total` are read."""
        items: list[Body] = []
        page = 1
        while True:
            params: dict[str, str | int] = {"page": page, "pageSize": PAGE_SIZE}
            path = self._route_path(route) + "/history"
            data = self._json_object(self._send("GET", path, params=params))
            batch, total = data.get("items"), data.get("total")
            if not isinstance(batch, list) or not isinstance(total, int):
                raise CliError(
                    "the server's history answer has no items/total; is --server an slo-api?",
                    ExitCode.SERVER,
                )
            items.extend(item for item in batch if isinstance(item, dict))
            if not batch or len(items) >= total:
                return items
            page += 1

    def get(self, route: str) -> tuple[Body, str | None]:
        response = self._send("GET", self._route_path(route))
        return self._json_object(response), response.headers.get("ETag")

    def put(
        self,
        route: str,
        body: Body,
        *,
        if_match: str | None = None,
        dry_run: bool = False,
        force: bool = False,
    ) -> Body:
        headers = {"Content-Type": "application/json"}
        if if_match:
            headers["If-Match"] = if_match
        response = self._send(
            "PUT",
            self._route_path(route),
            params=_params(dry_run, force),
            content=encode_body(body),
            headers=headers,
        )
        return self._json_object(response)

    def delete(self, route: str, *, dry_run: bool = False, force: bool = False) -> Body | None:
        """Reset a route; the would-be (dry run) or stored body when the server sends one."""
        response = self._send("DELETE", self._route_path(route), params=_params(dry_run, force))
        if response.status_code == 204 or not response.content:
            return None
        return self._json_object(response)

    # -- plumbing -----------------------------------------------------------------------------

    @staticmethod
    def _route_path(route: str) -> str:
        # safe="" so a "/" or "?" in a route name cannot change the path.
        return "/routes/" + quote(route, safe="")

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str | int] | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        try:
            response = self._http.request(
                method, self.server + path, params=params, content=content, headers=headers
            )
        except httpx.TimeoutException:
            raise CliError(
                f"no answer from {self.server} within {self.timeout:g}s (raise --timeout?)",
                ExitCode.SERVER,
            ) from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise usage(f"bad server URL {self.server!r}: {exc}") from None
        except httpx.ConnectError as exc:
            raise CliError(f"cannot connect to {self.server}: {exc}", ExitCode.SERVER) from None
        except httpx.HTTPError as exc:
            raise CliError(f"talking to {self.server} failed: {exc}", ExitCode.SERVER) from None
        if response.status_code >= 300:
            raise error_from_response(response)
        # A forced write's Warning (which GitOps tool will revert it): for the command to show.
        self.warnings.extend(_warning_text(w) for w in response.headers.get_list("Warning"))
        return response

    def _json_object(self, response: httpx.Response) -> Body:
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise CliError(
                f"{self.server} answered HTTP {response.status_code} without a JSON object; "
                "is --server an slo-api?",
                ExitCode.SERVER,
                status=response.status_code,
            )
        return data


def _params(dry_run: bool, force: bool = False) -> dict[str, str | int] | None:
    params: dict[str, str | int] = {}
    if dry_run:
        params["dryRun"] = "true"
    if force:
        params["force"] = "true"
    return params or None


def _warning_text(header: str) -> str:
    """The text of a `299 - "text"` Warning header (the header itself when it is not one)."""
    parts = header.split(" ", 2)
    text = parts[2] if len(parts) == 3 else header
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        text = text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return text


def error_from_response(response: httpx.Response) -> CliError:
    """Turn an error answer into a CliError carrying the API's message, field and causes."""
    status = response.status_code
    exit_code = exit_code_for(status)
    try:
        envelope = response.json()
    except ValueError:
        envelope = None
    error = envelope.get("error") if isinstance(envelope, dict) else None
    message: str | None = None
    field: str | None = None
    details: list[str] = []
    if isinstance(error, dict):
        message = _text(error.get("message")) or _text(error.get("code"))
        field = _text(error.get("field"))
        causes = error.get("causes")
        # One cause is the message itself; several are worth listing (but the one the
        # message already says, as said of its field).
        said = f"{field}: {message}" if field else message
        if isinstance(causes, list) and len(causes) > 1:
            details.extend(c for c in map(_cause_text, causes) if c and c not in (message, said))
    elif isinstance(error, str):
        message = error
    if not message:
        snippet = " ".join(response.text.split())[:200]
        message = f"HTTP {status} {response.reason_phrase}" + (f": {snippet}" if snippet else "")
    if isinstance(error, dict) and error.get("code") == "field_managed":
        details.append(
            "hint: change it in the source the tool syncs from, or pass --force to write it "
            "anyway (the tool will revert it at its next sync)"
        )
    elif isinstance(error, dict) and error.get("code") == "limit_exceeded":
        details.append(
            "hint: `sloctl get ROUTE` shows the route's limits; a value stored beyond one may "
            "stay or move toward it; a platform admin sets them (the namespace's SLOLimits)"
        )
    elif status in _HINTS:
        details.append("hint: " + _HINTS[status])
    return CliError(message, exit_code, status=status, field=field, details=tuple(details))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _cause_text(cause: Any) -> str | None:
    if isinstance(cause, str):
        return cause
    if isinstance(cause, dict):
        message = _text(cause.get("message")) or _text(cause.get("reason")) or ""
        field = _text(cause.get("field"))
        return f"{field}: {message}" if field else message or None
    return None
