"""The seam (slo_api.kube) over a real HTTP connection: what each call sends, and the one mapping
of failures, around a request and around a watch's stream, to KubeError."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from slo_api.kube import Kube, KubeError, KubeUnavailable, Resource, log_failure

RES = Resource("inference.modelsphere.dev", "v1alpha1", "llmslorequirements")
FORBIDDEN = {
    "kind": "Status",
    "code": 403,
    "reason": "Forbidden",
    "message": 'llmslorequirements "a" is forbidden: User "system:serviceaccount:x:slo-api" '
    "cannot get resource",
}


class Recorder:
    """An HTTP server that records each request and answers what the test set."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.answer: web.StreamResponse | None = None
        self.stream_then_cut: bytes | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path, dict(request.query), body))
        if self.stream_then_cut is not None:
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(self.stream_then_cut)
            assert request.transport is not None
            request.transport.close()  # mid-chunk: the stream breaks
            return response
        return self.answer or web.json_response({"kind": "Thing", "metadata": {}})


def kube_at(port: int, observed: list[tuple[str, str]]) -> Kube:
    """A Kube of the real client, on loopback `port`, whose upstream metrics go to `observed`."""
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    return Kube(
        client.ApiClient(configuration),
        timeout=5,
        observe=lambda verb, code, _: observed.append((verb, code)),
    )


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, Kube, list[tuple[str, str]]]]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    observed: list[tuple[str, str]] = []
    kube = kube_at(runner.addresses[0][1], observed)
    try:
        yield recorder, kube, observed
    finally:
        await kube.close()
        await runner.cleanup()


async def watch_into(events: list[dict[str, Any]], kube: Kube) -> None:
    async for event in kube.watch(RES, resource_version="1", timeout_seconds=60, read_timeout=5):
        events.append(event)


async def test_each_call_sends_its_request(
    recorder: tuple[Recorder, Kube, list[tuple[str, str]]],
) -> None:
    server, kube, observed = recorder
    await kube.list(RES, continue_="c1", namespace="team-a", label_selector="tier=prod")
    await kube.patch(RES, "team-a", "a", {"spec": {"priority": 1}}, dry_run=True)
    await kube.review_access({"user": "u"})
    await kube.create_event("team-a", {"metadata": {"namespace": "team-a"}})
    await kube.list_config_maps("team-a", "app=x")
    await kube.delete_config_map("team-a", "h", resource_version="7")
    await kube.list_config_maps(None, "app=x", continue_="c2")
    await kube.get_crd("routerevisions.slo-api.modelsphere.dev")

    base = "/apis/inference.modelsphere.dev/v1alpha1/namespaces/team-a/llmslorequirements"
    assert server.requests == [
        ("GET", base, {"limit": "500", "continue": "c1", "labelSelector": "tier=prod"}, None),
        (
            "PATCH",
            f"{base}/a",
            {"fieldValidation": "Strict", "fieldManager": "slo-api", "dryRun": "All"},
            {"spec": {"priority": 1}},
        ),
        (
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {},
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {"user": "u"},
            },
        ),
        (
            "POST",
            "/apis/events.k8s.io/v1/namespaces/team-a/events",
            {},
            {"metadata": {"namespace": "team-a"}},
        ),
        (
            "GET",
            "/api/v1/namespaces/team-a/configmaps",
            {"labelSelector": "app=x", "limit": "500"},
            None,
        ),
        (
            "DELETE",
            "/api/v1/namespaces/team-a/configmaps/h",
            {},
            {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "preconditions": {"resourceVersion": "7"},
            },
        ),
        (
            "GET",
            "/api/v1/configmaps",
            {"labelSelector": "app=x", "limit": "500", "continue": "c2"},
            None,
        ),
        (
            "GET",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/routerevisions.slo-api.modelsphere.dev",
            {},
            None,
        ),
    ]
    assert [code for _, code in observed] == ["200"] * 8
    assert [verb for verb, _ in observed][:3] == ["list", "patch", "subjectaccessreview"]


async def test_a_refusal_of_slo_api_is_a_kube_error_that_says_rbac(
    recorder: tuple[Recorder, Kube, list[tuple[str, str]]],
) -> None:
    server, kube, observed = recorder
    server.answer = web.json_response(FORBIDDEN, status=403)
    with pytest.raises(KubeError) as raised:
        await kube.get(RES, "team-a", "a")
    assert raised.value.status == 403
    assert raised.value.is_status
    assert raised.value.rbac
    assert observed == [("get", "403")]


async def test_a_watch_cut_mid_stream_is_unavailable(
    recorder: tuple[Recorder, Kube, list[tuple[str, str]]],
) -> None:
    server, kube, observed = recorder
    server.stream_then_cut = b'{"type": "ADDED", "object": {"metadata": {}}}\n{"type": "MOD'
    events: list[dict[str, Any]] = []
    with pytest.raises(KubeUnavailable, match="the watch broke"):
        await watch_into(events, kube)
    assert [e["type"] for e in events] == ["ADDED"]
    assert observed == [("watch", "200")]


async def test_no_api_server_is_unavailable_for_a_call_and_a_watch() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    observed: list[tuple[str, str]] = []
    kube = kube_at(port, observed)
    try:
        with pytest.raises(KubeUnavailable, match="cannot reach the API server"):
            await kube.get(RES, "team-a", "a")
        with pytest.raises(KubeUnavailable, match="cannot reach the API server"):
            await watch_into([], kube)
        assert not await kube.ready()
    finally:
        await kube.close()
    assert observed == [("get", "unavailable"), ("watch", "unavailable"), ("readyz", "unavailable")]


def test_a_policy_denial_is_not_rbac_and_only_rbac_is_logged_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    denied = KubeError(
        403, "Forbidden", 'x is forbidden: admission webhook "quota.example" denied the request: no'
    )
    refused = KubeError.from_status(FORBIDDEN)
    assert denied.denial == 'admission webhook "quota.example" denied the request: no'
    assert not denied.rbac
    assert refused.rbac
    assert refused.denial is None
    assert not KubeError(404, "NotFound").rbac
    log = logging.getLogger("test.kube")
    with caplog.at_level(logging.INFO, logger="test.kube"):
        log_failure(log, refused, "the watch of x", "its ClusterRole", "; retrying")
        log_failure(log, denied, "the watch of x", "its ClusterRole", "; retrying")
    (error, warning) = caplog.records
    assert error.levelno == logging.ERROR
    assert error.getMessage().startswith("RBAC: the API server refused slo-api the watch of x")
    assert error.getMessage().endswith("check its ClusterRole; retrying")
    assert warning.levelno == logging.WARNING
    assert not warning.getMessage().startswith("RBAC")


async def test_with_no_proxy_or_netrc_in_the_environment_the_client_does_not_look_for_them(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "absent-netrc"))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    kube = await Kube.connect(str(kubeconfig), 1.0)
    try:
        session = kube._api_client.rest_client.pool_manager
        assert session.trust_env is False
        assert not session.closed
    finally:
        await kube.close()
    assert session.closed
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    kube = await Kube.connect(str(kubeconfig), 1.0)
    try:
        assert kube._api_client.rest_client.pool_manager.trust_env is True
    finally:
        await kube.close()
