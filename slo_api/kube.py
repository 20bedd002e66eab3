"""The seam onto kubernetes_asyncio: plain dicts in and out, one error type.

Everything else in slo-api talks to the API server through `Kube`, so this is the one module
that knows kubernetes_asyncio's quirks: custom-object PATCH must be forced to merge-patch, it
has no client timeout unless given one, and error bodies arrive as unparsed text.

Every failure, of a call or of a streamed watch, leaves this module as one of:

    KubeError          the API server answered with an error (`status`, its parsed `Status`)
    ├── KubeTimeout    no answer within the upstream timeout, or a watch gone silent
    └── KubeUnavailable  no connection (refused, reset, DNS, TLS)

`_mapped` is the one table from kubernetes_asyncio's and aiohttp's exceptions to these,
wrapped around every request and around the reading of every watch stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
import urllib.request
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from slo_api import tracing

Obj = dict[str, Any]
Observer = Callable[[str, str, float], None]
# kubernetes_asyncio's read buffer: a watch event of a large object is one line.
READ_BUFSIZE = 2**21

# What the API server writes when an admission policy or webhook, not RBAC, refused a request;
# the match starts where the policy's own words start (after `<kind> "<name>" is forbidden: `).
_ADMISSION = re.compile(
    r"(?:Validating|Mutating)AdmissionPolicy '[^']*'.*?denied request.*"
    r'|admission webhook "[^"]*" denied the request.*',
    re.DOTALL,
)


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str


@dataclass
class KubeError(Exception):
    """A failed call to the API server, with its parsed `Status` when it sent one.

    `status` is the HTTP code (0 when no response arrived). `is_status` tells a JSON Status
    apart from a bare "404 page not found", which is how a missing CRD answers.
    """

    status: int
    reason: str = ""
    message: str = ""
    causes: list[Obj] = field(default_factory=list)
    is_status: bool = False
    retry_after: float | None = None

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"

    @property
    def denial(self) -> str | None:
        """A cluster policy's (admission policy's or webhook's) refusal of this one request,
        from where its own words start, whatever code it chose; None otherwise."""
        if self.status not in (400, 403, 422):
            return None
        found = _ADMISSION.search(self.message)
        return found.group() if found is not None else None

    @property
    def rbac(self) -> bool:
        """The API server refused slo-api itself: its credentials (401) or its RBAC (403),
        not a policy's denial of one change. Only an operator can fix that (`log_failure`)."""
        return self.status in (401, 403) and self.denial is None

    @property
    def label(self) -> str:
        """The `code` label of the upstream-call metrics."""
        return str(self.status) if self.status else "error"

    @classmethod
    def from_body(cls, status: int, body: bytes | str | None, headers: Any = None) -> KubeError:
        retry_after = _retry_after(headers)
        try:
            parsed = json.loads(body or b"")
        except (ValueError, TypeError):
            parsed = None
        if isinstance(parsed, dict) and parsed.get("kind") == "Status":
            return cls.from_status(parsed, retry_after=retry_after, default_code=status)
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
        return cls(status=status, message=text.strip()[:200], retry_after=retry_after)

    @classmethod
    def from_status(
        cls, status: Obj, retry_after: float | None = None, default_code: int = 0
    ) -> KubeError:
        details = status.get("details") or {}
        return cls(
            status=int(status.get("code") or default_code),
            reason=str(status.get("reason") or ""),
            message=str(status.get("message") or ""),
            causes=[c for c in details.get("causes") or [] if isinstance(c, dict)],
            is_status=True,
            retry_after=retry_after or _details_retry(details),
        )


class KubeTimeout(KubeError):
    """The API server did not answer within the upstream timeout."""

    @property
    def label(self) -> str:
        return "timeout"


class KubeUnavailable(KubeError):
    """No connection to the API server (refused, reset, DNS, TLS)."""

    @property
    def label(self) -> str:
        return "unavailable"


@contextlib.contextmanager
def _mapped(
    timeout: str = "the API server did not answer in time",
    broken: str = "cannot reach the API server",
) -> Iterator[None]:
    """The one mapping of the client's failures to KubeError, around a request or the reading
    of a stream; `timeout` and `broken` say what failed, for the log lines."""
    try:
        yield
    except ApiException as exc:
        raise KubeError.from_body(exc.status, exc.body, exc.headers) from None
    except TimeoutError:
        raise KubeTimeout(0, "Timeout", timeout) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise KubeUnavailable(0, "Unavailable", f"{broken}: {exc}") from None


def log_failure(
    logger: logging.Logger, exc: KubeError, what: str, check: str, then: str = ""
) -> None:
    """The one rule for logging a failed call: a refusal of slo-api itself (`rbac`), which
    only an operator can fix, is an error that starts `RBAC:` and says what to `check`;
    anything else a warning. `what` names the call, `then` what happens next."""
    if exc.rbac:
        logger.error(
            "RBAC: the API server refused slo-api %s (%s); check %s%s", what, exc, check, then
        )
    else:
        logger.warning("%s failed (%s)%s", what, exc, then)


def _retry_after(headers: Any) -> float | None:
    if not headers:
        return None
    value = headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _details_retry(details: Obj) -> float | None:
    seconds = details.get("retryAfterSeconds")
    return float(seconds) if isinstance(seconds, int | float) else None


def _env_has_nothing_for_aiohttp() -> bool:
    """True when aiohttp's `trust_env` would find nothing: no proxy variables, no netrc file."""
    if any(k in ("http", "https", "ws", "wss") for k in urllib.request.getproxies()):
        return False
    netrc = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    return not os.path.exists(netrc)


# Reads a raw response into what a call returns (and raises a non-2xx one).
Reader = Callable[[Any], Awaitable[Any]]


async def _json_body(response: Any) -> Obj:
    """A raw (`_preload_content=False`) response parsed with orjson; a non-2xx one raised.

    kubernetes_asyncio's own path decodes the bytes to text and runs `json.loads` and its
    deserializer over them; for a page of 500 CRs that was most of an initial list's time.
    """
    try:
        body = await response.read()
    finally:
        response.release()
    tracing.note_response(response.status, response.headers)
    if not 200 <= response.status <= 299:
        raise KubeError.from_body(response.status, body, response.headers)
    result: Obj = orjson.loads(body)
    return result


async def _answer(response: Any) -> Any:
    """`_json_body`, with a 2xx answer that is not JSON raised as a KubeError like any other
    failed call (a review that cannot be read is no answer)."""
    try:
        return await _json_body(response)
    except orjson.JSONDecodeError:
        raise KubeError(0, "InvalidResponse", "the answer is not JSON") from None


async def _status_only(response: Any) -> int:
    try:
        await response.read()
        return int(response.status)
    finally:
        response.release()


def _review_status(result: Any) -> Obj:
    """A review's `status`; a KubeError when the answer is not an object holding one."""
    status = result.get("status") if isinstance(result, dict) else None
    if status is None and isinstance(result, dict):
        status = {}
    if not isinstance(status, dict):
        raise KubeError(0, "InvalidResponse", "the review's status is not an object")
    return status


class Kube:
    """The seam: every request slo-api makes of the API server, through kubernetes_asyncio's
    request layer, with plain dicts in and out.

    Custom objects (list, watch, get, merge patch), discovery of an API group's resources,
    TokenReviews and SubjectAccessReviews, Events, ConfigMaps (a route's history) and the
    API server's readiness. Each request goes through `_request`: a timeout, a span when the
    request is traced, the upstream metrics and the one mapping of failures (`_mapped`);
    a watch's stream is read under the same mapping.
    """

    def __init__(self, api_client: Any, timeout: float, observe: Observer | None = None) -> None:
        self._api_client = api_client
        self.timeout = timeout
        self._observe = observe or (lambda verb, code, seconds: None)

    @classmethod
    async def connect(
        cls, kubeconfig: str | None, request_timeout: float, observe: Observer | None = None
    ) -> Kube:
        configuration = client.Configuration()
        if kubeconfig:
            await config.load_kube_config(
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        api_client = client.ApiClient(configuration)
        if _env_has_nothing_for_aiohttp():
            # kubernetes_asyncio's session trusts the environment, so aiohttp looks for proxy
            # variables and reads the netrc file (in a worker thread) on every request. When
            # there is neither, those look-ups can only find nothing: skip them. Read once,
            # like the kubeconfig; a proxy set in the environment keeps the old behaviour.
            # The same connector (its TLS context, its limit) under a session that does not.
            rest = api_client.rest_client
            trusting = rest.pool_manager
            rest.pool_manager = aiohttp.ClientSession(
                connector=trusting.connector, trust_env=False, read_bufsize=READ_BUFSIZE
            )
            trusting.detach()  # the connector now belongs to the new session
        return cls(api_client, request_timeout, observe)

    async def close(self) -> None:
        await self._api_client.close()

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | aiohttp.ClientTimeout | None = None,
    ) -> Awaitable[Any]:
        """One request through the client's request layer, answered raw: the generated
        methods' argument checks were a tenth of slo-api's CPU per GET /routes in a profile,
        and they know neither merge patches of custom objects nor sendInitialEvents."""
        return self._api_client.call_api(  # type: ignore[no-any-return]
            path,
            method,
            query_params=list(query),
            header_params={"Accept": "application/json", **(headers or {})},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=self.timeout if timeout is None else timeout,
        )

    async def _request(
        self,
        verb: str,
        resource: str,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
        read: Reader = _json_body,
        traced: bool = True,
    ) -> Any:
        """One request, timed, counted and (when `traced` and the request is sampled) under a
        span of its own whose context it sends; failures raised as KubeError."""
        span, headers = tracing.upstream_span(verb, resource) if traced else (None, {})
        if content_type is not None:
            headers = {**headers, "Content-Type": content_type}

        async def call() -> Any:
            return await read(
                await self._send(method, path, query=query, body=body, headers=headers)
            )

        if span is None:
            return await self._timed(verb, call())
        with span:
            return await self._timed(verb, call())

    async def _timed(self, verb: str, call: Awaitable[Any]) -> Any:
        started = time.monotonic()
        code = "error"
        try:
            with _mapped(timeout=f"the API server did not answer within {self.timeout:g}s"):
                # asyncio.timeout, not wait_for: the same TimeoutError, without a task per call.
                async with asyncio.timeout(self.timeout):
                    result = await call
            code = "200"
            return result
        except KubeError as exc:
            code = exc.label
            if not exc.status:
                tracing.note_response(code)
            raise
        finally:
            self._observe(verb, code, time.monotonic() - started)

    # -- custom objects --------------------------------------------------------------------

    @staticmethod
    def _path(res: Resource, namespace: str | None, name: str = "") -> str:
        scope = f"/namespaces/{namespace}" if namespace is not None else ""
        # The core group ("": namespaces) is served under /api, every other under /apis.
        api = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
        # Names and namespaces are DNS labels and subdomains: nothing to escape.
        return f"{api}{scope}/{res.plural}" + (f"/{name}" if name else "")

    async def list(
        self,
        res: Resource,
        *,
        limit: int = 500,
        continue_: str | None = None,
        resource_version: str | None = None,
        namespace: str | None = None,
        label_selector: str = "",
    ) -> Obj:
        """One page of a list, cluster-wide or in one namespace."""
        query = [("limit", str(limit))]
        if continue_:
            query.append(("continue", continue_))
        elif resource_version is not None:
            query.append(("resourceVersion", resource_version))
        if label_selector:
            query.append(("labelSelector", label_selector))
        result: Obj = await self._request(
            "list", res.plural, "GET", self._path(res, namespace), query=query
        )
        return result

    async def served(self, group: str, version: str) -> set[str]:
        """The resources (plurals) discovery lists under a group/version; empty when the API
        server does not serve that group/version at all."""
        try:
            found: Obj = await self._request(
                "discovery", "apiresources", "GET", f"/apis/{group}/{version}"
            )
        except KubeError as exc:
            if exc.status == 404:
                return set()
            raise
        return {
            str(r["name"])
            for r in found.get("resources") or []
            if isinstance(r, dict) and "/" not in str(r.get("name", "/"))
        }

    async def get(self, res: Resource, namespace: str, name: str) -> Obj:
        result: Obj = await self._request(
            "get", res.plural, "GET", self._path(res, namespace, name)
        )
        return result

    async def patch(
        self, res: Resource, namespace: str, name: str, patch: Obj, *, dry_run: bool = False
    ) -> Obj:
        query = [
            # Strict: a field the installed CRD lacks is an error, not silently pruned.
            ("fieldValidation", "Strict"),
            # Named so `managedFields` (and `kubectl diff`) show which fields slo-api owns.
            ("fieldManager", "slo-api"),
        ]
        if dry_run:
            query.append(("dryRun", "All"))
        result: Obj = await self._request(
            "patch",
            res.plural,
            "PATCH",
            self._path(res, namespace, name),
            query=query,
            body=patch,
            # A merge patch: the owned-fields contract (a dict would go as a json-patch).
            content_type="application/merge-patch+json",
        )
        return result

    # -- reviews, Events, ConfigMaps (earlier versions' route histories) --------------------

    async def review_token(self, token: str, audiences: Sequence[str]) -> Obj:
        """A TokenReview's `status`: who the API server says the bearer of `token` is."""
        spec: Obj = {"token": token}
        if audiences:
            spec["audiences"] = list(audiences)
        return await self._review("authentication.k8s.io/v1", "TokenReview", spec)

    async def review_access(self, spec: Obj) -> Obj:
        """A SubjectAccessReview's `status`: may this user do this to that resource?"""
        return await self._review("authorization.k8s.io/v1", "SubjectAccessReview", spec)

    async def _review(self, api_version: str, kind: str, spec: Obj) -> Obj:
        verb = kind.lower()
        body = {"apiVersion": api_version, "kind": kind, "spec": spec}
        return _review_status(
            await self._request(
                verb, f"{verb}s", "POST", f"/apis/{api_version}/{verb}s", body=body, read=_answer
            )
        )

    async def create_event(self, namespace: str, event: Obj) -> Obj:
        result: Obj = await self._request(
            "event",
            "events",
            "POST",
            f"/apis/events.k8s.io/v1/namespaces/{namespace}/events",
            body=event,
        )
        return result

    async def create(self, res: Resource, namespace: str, body: Obj) -> Obj:
        """Create a namespaced custom object (a route's revision): 409 when it exists."""
        result: Obj = await self._request(
            "create",
            res.plural,
            "POST",
            self._path(res, namespace),
            query=[("fieldManager", "slo-api")],
            body=body,
        )
        return result

    async def delete(self, res: Resource, namespace: str, name: str, *, uid: str = "") -> Obj:
        """Delete a custom object; with `uid`, only that very object (a precondition)."""
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            body["preconditions"] = {"uid": uid}
        result: Obj = await self._request(
            "delete", res.plural, "DELETE", self._path(res, namespace, name), body=body
        )
        return result

    async def list_config_maps(
        self, namespace: str | None, label_selector: str, *, continue_: str | None = None
    ) -> Obj:
        """The ConfigMaps a label selects (earlier versions' route histories), one page of
        up to 500 (the next with the answer's `continue`)."""
        scope = f"/namespaces/{namespace}" if namespace is not None else ""
        query = [("labelSelector", label_selector), ("limit", "500")]
        if continue_:
            query.append(("continue", continue_))
        result: Obj = await self._request(
            "configmap", "configmaps", "GET", f"/api/v1{scope}/configmaps", query=query
        )
        return result

    async def get_crd(self, name: str) -> Obj:
        """A CustomResourceDefinition (when slo-api's own was made: see history.migrate)."""
        result: Obj = await self._request(
            "get",
            "customresourcedefinitions",
            "GET",
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
        )
        return result

    async def delete_config_map(self, namespace: str, name: str, *, resource_version: str) -> Obj:
        """Delete a ConfigMap as it was read: a change made since is a 409, not lost."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"resourceVersion": resource_version},
        }
        result: Obj = await self._request(
            "configmap",
            "configmaps",
            "DELETE",
            f"/api/v1/namespaces/{namespace}/configmaps/{name}",
            body=body,
        )
        return result

    async def ready(self) -> bool:
        """Whether the API server answers: its `/readyz` says 200, or it refuses the probe
        (401, 403, 404), which a server that is down cannot do. Cheap enough to ask once a
        second while the watch loops wait out an outage."""
        try:
            # A probe for no request: it sends no trace context.
            status = int(
                await self._request(
                    "readyz", "readyz", "GET", "/readyz", read=_status_only, traced=False
                )
            )
        except KubeError as exc:
            status = exc.status
        return status in (200, 401, 403, 404)

    # -- watches ---------------------------------------------------------------------------

    async def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        timeout_seconds: int,
        read_timeout: float,
        initial_events: bool = False,
        namespace: str | None = None,
        label_selector: str = "",
        on_open: Callable[[], None] | None = None,
    ) -> AsyncGenerator[Obj, None]:
        """Yield watch events as dicts; ERROR events are raised as `KubeError`.

        `on_open` is called once the API server has accepted the watch (a 200), before any
        event: an answer from the API server, which a caller's backoff may count as one.

        The stream is read raw (not through kubernetes_asyncio's Watch) so an ERROR event keeps
        its Status, and a silent connection ends after `read_timeout` seconds without bytes.
        With `initial_events`, the stream starts with every current CR as ADDED, then a
        BOOKMARK annotated `k8s.io/initial-events-end` (a list without a list: the API server
        streams from its watch cache, and nobody holds the whole list at once).
        """
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if initial_events:
            query += [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]
        if resource_version or not initial_events:
            query.append(("resourceVersion", resource_version))
        if label_selector:
            query.append(("labelSelector", label_selector))
        started = time.monotonic()
        try:
            with _mapped(timeout="the watch was not accepted in time"):
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can drop a
                # cancellation that races with the response, and the watch loop then outlives
                # its shutdown.
                async with asyncio.timeout(self.timeout):
                    response = await self._send(
                        "GET",
                        self._path(res, namespace),
                        query=query,
                        timeout=aiohttp.ClientTimeout(
                            sock_connect=self.timeout, sock_read=read_timeout
                        ),
                    )
        except KubeError as exc:
            self._observe("watch", exc.label, time.monotonic() - started)
            raise
        self._observe("watch", str(response.status), time.monotonic() - started)
        try:
            with _mapped(
                timeout=f"no watch event or bookmark for {read_timeout:g}s",
                broken="the watch broke",
            ):
                if response.status != 200:
                    body = await response.read()
                    raise KubeError.from_body(response.status, body, response.headers)
                if on_open is not None:
                    on_open()
                async for event in _events(response):
                    if event.get("type") == "ERROR":
                        raise KubeError.from_status(event.get("object") or {})
                    yield event
        finally:
            response.release()


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[Obj]:
    # Split on newlines ourselves: aiohttp's readline caps a line at 64 KiB, and a CR can be
    # larger than that. Each chunk is scanned once: an initial stream of 100,000 CRs arrives
    # in chunks of many lines, and cutting the rest off after every line would copy each
    # chunk once per line in it.
    rest = b""
    async for chunk in response.content.iter_any():
        data = rest + chunk if rest else chunk
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            line = data[start:end]
            start = end + 1
            if line.strip():
                yield orjson.loads(line)
        rest = data[start:]
    if rest.strip():
        yield orjson.loads(rest)
