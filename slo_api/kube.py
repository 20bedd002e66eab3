"""The seam onto kubernetes_asyncio: plain dicts in and out, one error type.

Everything else in slo-api talks to the API server through `Kube`, so this is the one module
that knows kubernetes_asyncio's quirks: custom-object PATCH must be forced to merge-patch, it
has no client timeout unless given one, and error bodies arrive as unparsed text.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from slo_api import tracing

Obj = dict[str, Any]
# No timer of aiohttp's own for a call `_send` makes: `Kube._timed` bounds the whole call, the
# answer's body read included, with the upstream timeout.
_BOUNDED_BY_CALL = aiohttp.ClientTimeout()
Observer = Callable[[str, str, float], None]


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


class KubeUnavailable(KubeError):
    """No connection to the API server (refused, reset, DNS, TLS)."""


def _retry_after(headers: Any) -> float | None:
    if not headers:
        return None
    value = headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _env_has_nothing_for_aiohttp() -> bool:
    """True when aiohttp's `trust_env` would find nothing: no proxy variables, no netrc file."""
    if any(k in ("http", "https", "ws", "wss") for k in urllib.request.getproxies()):
        return False
    netrc = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    return not os.path.exists(netrc)


async def _json_body(call: Awaitable[Any]) -> Obj:
    """Read a raw (`_preload_content=False`) response and parse it with orjson.

    kubernetes_asyncio's own path decodes the bytes to text and runs `json.loads` and its
    deserializer over them; for a page of 500 CRs that was most of an initial list's time.
    Non-2xx answers raise the same ApiException that kubernetes_asyncio would.
    """
    response = await call
    try:
        body = await response.read()
    finally:
        response.release()
    tracing.note_response(response.status, response.headers)
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = body
        error.headers = response.headers
        raise error
    result: Obj = orjson.loads(body)
    return result


def _sending(headers: Mapping[str, str]) -> Obj:
    """The generated methods' `_headers` argument (the stubs leave it out): extra headers for
    one call, here the trace context."""
    return {"_headers": headers}


async def _answer(call: Awaitable[Any]) -> Any:
    """`_json_body`, with a 2xx answer that is not JSON raised as a KubeError like any other
    failed call (a review that cannot be read is no answer)."""
    try:
        return await _json_body(call)
    except orjson.JSONDecodeError:
        raise KubeError(0, "InvalidResponse", "the answer is not JSON") from None


def _review_status(result: Any) -> Obj:
    """A review's `status`; a KubeError when the answer is not an object holding one."""
    status = result.get("status") if isinstance(result, dict) else None
    if status is None and isinstance(result, dict):
        status = {}
    if not isinstance(status, dict):
        raise KubeError(0, "InvalidResponse", "the review's status is not an object")
    return status


def _details_retry(details: Obj) -> float | None:
    seconds = details.get("retryAfterSeconds")
    return float(seconds) if isinstance(seconds, int | float) else None


class Kube:
    """A client of the three custom-resource kinds with a timeout on every call."""

    def __init__(self, api_client: Any, timeout: float, observe: Observer | None = None) -> None:
        self._api_client = api_client
        self._api = client.CustomObjectsApi(api_client)
        self._authn = client.AuthenticationV1Api(api_client)
        self._authz = client.AuthorizationV1Api(api_client)
        self._events = client.EventsV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
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
            api_client.rest_client.pool_manager._trust_env = False
        return cls(api_client, request_timeout, observe)

    async def close(self) -> None:
        await self._api_client.close()

    async def _call(
        self, verb: str, resource: str, call: Callable[[Mapping[str, str]], Awaitable[Any]]
    ) -> Any:
        """One call, timed and counted; `call` is given the headers to send (a traceparent when
        a sampled request is being traced, under a span of its own)."""
        span, headers = tracing.upstream_span(verb, resource)
        if span is None:
            return await self._timed(verb, call(headers))
        with span:
            return await self._timed(verb, call(headers))

    async def _timed(self, verb: str, coro: Awaitable[Any]) -> Any:
        started = time.monotonic()
        code = "error"
        try:
            # asyncio.timeout, not wait_for: the same TimeoutError, without a task per call.
            async with asyncio.timeout(self.timeout):
                result = await coro
            code = "200"
            return result
        except ApiException as exc:
            code = str(exc.status)
            tracing.note_response(exc.status, exc.headers)
            raise KubeError.from_body(exc.status, exc.body, exc.headers) from None
        except TimeoutError:
            code = "timeout"
            tracing.note_response(code)
            raise KubeTimeout(
                0, "Timeout", f"the API server did not answer within {self.timeout:g}s"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            code = "unavailable"
            tracing.note_response(code)
            raise KubeUnavailable(0, "Unavailable", f"cannot reach the API server: {exc}") from None
        finally:
            self._observe(verb, code, time.monotonic() - started)

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
        kwargs: Obj = {"limit": limit, "_request_timeout": self.timeout, "_preload_content": False}
        if continue_:
            kwargs["_continue"] = continue_
        elif resource_version is not None:
            kwargs["resource_version"] = resource_version
        if label_selector:
            kwargs["label_selector"] = label_selector
        result: Obj = await self._call(
            "list",
            res.plural,
            lambda headers: _json_body(self._list(res, namespace, **_sending(headers), **kwargs)),
        )
        return result

    def _list(self, res: Resource, namespace: str | None, **kwargs: Any) -> Any:
        """kubernetes_asyncio's list (or watch) call, cluster-wide or in one namespace."""
        if namespace is None:
            return self._api.list_cluster_custom_object(
                res.group, res.version, res.plural, **kwargs
            )
        return self._api.list_namespaced_custom_object(
            res.group, res.version, namespace, res.plural, **kwargs
        )

    async def served(self, group: str, version: str) -> set[str]:
        """The resources (plurals) discovery lists under a group/version; empty when the API
        server does not serve that group/version at all."""
        try:
            found: Obj = await self._call(
                "discovery",
                "apiresources",
                lambda headers: _json_body(
                    self._api.get_api_resources(
                        group,
                        version,
                        _request_timeout=self.timeout,
                        _preload_content=False,
                        **_sending(headers),
                    )
                ),
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

    def _custom_object(
        self,
        method: str,
        res: Resource,
        namespace: str,
        name: str,
        headers: Mapping[str, str],
        query: Sequence[tuple[str, str]] = (),
        body: Obj | None = None,
    ) -> Awaitable[aiohttp.ClientResponse]:
        """One CR's GET or PATCH, sent by `_send`. Names and namespaces are DNS labels and
        subdomains: nothing to escape."""
        sent = {"Accept": "application/json", **headers}
        data = None
        if body is not None:
            # A merge patch: the owned-fields contract (the generated method would send a
            # dict as a json-patch).
            sent["Content-Type"] = "application/merge-patch+json"
            data = orjson.dumps(body)
        path = f"/apis/{res.group}/{res.version}/namespaces/{namespace}/{res.plural}/{name}"
        return self._send(method, path, sent, query, data)

    async def _send(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        query: Sequence[tuple[str, str]],
        body: bytes | None,
    ) -> aiohttp.ClientResponse:
        """A request as the client's request layer sends it (its default headers, its bearer
        token through its refresh hook, its proxy and TLS server name, its session and
        connection pool), straight onto its aiohttp session. The reads and writes of routes
        are most of slo-api's calls; the layer's per-call handling of arguments that are
        already plain (sanitising and copying each, the body encoded with the json module)
        cost a few percent of a GET's CPU in a profile. The answer is read raw, as with
        `_preload_content=False`."""
        api = self._api_client
        rest = api.rest_client
        config = api.configuration
        sent = {**headers, **api.default_headers}
        for auth in (await config.auth_settings()).values():
            sent[auth["key"]] = auth["value"]
        url = config.host + path + ("?" + urlencode(query) if query else "")
        options: Obj = {}
        if rest.proxy:
            options["proxy"] = rest.proxy
        if rest.proxy_headers:
            options["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            options["server_hostname"] = rest.server_hostname
        response: aiohttp.ClientResponse = await rest.pool_manager.request(
            method, url, headers=sent, data=body, timeout=_BOUNDED_BY_CALL, **options
        )
        return response

    async def get(self, res: Resource, namespace: str, name: str) -> Obj:
        result: Obj = await self._call(
            "get",
            res.plural,
            lambda headers: _json_body(self._custom_object("GET", res, namespace, name, headers)),
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
        result: Obj = await self._call(
            "patch",
            res.plural,
            lambda headers: _json_body(
                self._custom_object("PATCH", res, namespace, name, headers, query, patch)
            ),
        )
        return result

    async def review_token(self, token: str, audiences: Sequence[str]) -> Obj:
        """A TokenReview's `status`: who the API server says the bearer of `token` is."""
        spec: Obj = {"token": token}
        if audiences:
            spec["audiences"] = list(audiences)
        body: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        return _review_status(
            await self._call(
                "tokenreview",
                "tokenreviews",
                lambda headers: _answer(
                    self._authn.create_token_review(
                        body,
                        _request_timeout=self.timeout,
                        _preload_content=False,
                        **_sending(headers),
                    )
                ),
            )
        )

    async def review_access(self, spec: Obj) -> Obj:
        """A SubjectAccessReview's `status`: may this user do this to that resource?"""
        body: Any = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        return _review_status(
            await self._call(
                "subjectaccessreview",
                "subjectaccessreviews",
                lambda headers: _answer(
                    self._authz.create_subject_access_review(
                        body,
                        _request_timeout=self.timeout,
                        _preload_content=False,
                        **_sending(headers),
                    )
                ),
            )
        )

    async def create_event(self, namespace: str, event: Any) -> Obj:
        result: Obj = await self._call(
            "event",
            "events",
            lambda headers: _json_body(
                self._events.create_namespaced_event(
                    namespace,
                    event,
                    _request_timeout=self.timeout,
                    _preload_content=False,
                    **_sending(headers),
                )
            ),
        )
        return result

    async def ready(self) -> bool:
        """Whether the API server answers: its `/readyz` says 200, or it refuses the probe
        (401, 403, 404), which a server that is down cannot do. Cheap enough to ask once a
        second while the watch loops wait out an outage."""

        async def readyz() -> int:
            response = await self._api_client.call_api(
                "/readyz",
                "GET",
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.timeout,
            )
            try:
                await response.read()
                return int(response.status)
            finally:
                response.release()

        try:
            # A probe for no request: `readyz` sends no trace context.
            status = int(await self._call("readyz", "readyz", lambda headers: readyz()))
        except KubeError as exc:
            status = exc.status
        return status in (200, 401, 403, 404)

    # -- ConfigMaps (a route's history) ----------------------------------------------------

    async def get_config_map(self, namespace: str, name: str) -> Obj:
        result: Obj = await self._call(
            "configmap",
            "configmaps",
            lambda headers: _json_body(
                self._core.read_namespaced_config_map(
                    name,
                    namespace,
                    _request_timeout=self.timeout,
                    _preload_content=False,
                    **_sending(headers),
                )
            ),
        )
        return result

    async def create_config_map(self, namespace: str, body: Any) -> Obj:
        result: Obj = await self._call(
            "configmap",
            "configmaps",
            lambda headers: _json_body(
                self._core.create_namespaced_config_map(
                    namespace,
                    body,
                    field_manager="slo-api",
                    _request_timeout=self.timeout,
                    _preload_content=False,
                    **_sending(headers),
                )
            ),
        )
        return result

    async def replace_config_map(self, namespace: str, name: str, body: Any) -> Obj:
        """A PUT: conditional on the body's metadata.resourceVersion (a stale one is 409)."""
        result: Obj = await self._call(
            "configmap",
            "configmaps",
            lambda headers: _json_body(
                self._core.replace_namespaced_config_map(
                    name,
                    namespace,
                    body,
                    field_manager="slo-api",
                    _request_timeout=self.timeout,
                    _preload_content=False,
                    **_sending(headers),
                )
            ),
        )
        return result

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
        scope = f"/namespaces/{namespace}" if namespace is not None else ""
        started = time.monotonic()
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can drop a cancellation
            # that races with the response, and the watch loop then outlives its shutdown.
            async with asyncio.timeout(self.timeout):
                # The client's own request layer: the generated list method knows no
                # sendInitialEvents.
                response = await self._api_client.call_api(
                    f"/apis/{res.group}/{res.version}{scope}/{res.plural}",
                    "GET",
                    query_params=query,
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _request_timeout=aiohttp.ClientTimeout(
                        sock_connect=self.timeout, sock_read=read_timeout
                    ),
                )
        except TimeoutError:
            self._observe("watch", "timeout", time.monotonic() - started)
            raise KubeTimeout(0, "Timeout", "the watch was not accepted in time") from None
        except ApiException as exc:
            self._observe("watch", str(exc.status), time.monotonic() - started)
            raise KubeError.from_body(exc.status, exc.body, exc.headers) from None
        except (aiohttp.ClientError, OSError) as exc:
            self._observe("watch", "unavailable", time.monotonic() - started)
            raise KubeUnavailable(0, "Unavailable", f"cannot reach the API server: {exc}") from None
        self._observe("watch", str(response.status), time.monotonic() - started)
        try:
            if response.status != 200:
                raise KubeError.from_body(response.status, await response.read(), response.headers)
            if on_open is not None:
                on_open()
            async for event in _events(response):
                if event.get("type") == "ERROR":
                    raise KubeError.from_status(event.get("object") or {})
                yield event
        except TimeoutError:
            raise KubeTimeout(
                0, "Timeout", f"no watch event or bookmark for {read_timeout:g}s"
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise KubeUnavailable(0, "Unavailable", f"the watch broke: {exc}") from None
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
