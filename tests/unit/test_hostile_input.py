"""Hostile input at the HTTP layer: lone surrogates, odd methods, Host headers, request ids."""

from __future__ import annotations

import json
import logging
import re

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slo_api.api.errors import error_response
from slo_api.errors import ApiError
from slo_api.jsonbody import parse_object
from tests.unit.conftest import AUTH, Started, llm_cr
from tests.unit.fakes import FakeKube


@pytest.mark.parametrize(
    "raw",
    [
        b'{"\\ud800": 1, "\\ud800": 2}',
        b'{"\\udfff": 1}',
        b'{"priority": "\\ud800"}',
        b'{"a": {"b": ["x\\udc00y"]}}',
        b'{"a\\ud83d": 1}',
    ],
)
def test_lone_surrogates_are_refused_at_parse_time(raw: bytes) -> None:
    with pytest.raises(ApiError) as caught:
        parse_object(raw)
    assert caught.value.status == 400
    assert "surrogate" in caught.value.message
    # The refusal itself must be sendable.
    assert error_response(caught.value).status_code == 400


def test_a_surrogate_pair_is_one_character_and_welcome() -> None:
    assert parse_object(b'{"k": "\\ud83d\\ude00"}') == {"k": "\U0001f600"}


def test_an_error_that_orjson_cannot_encode_still_gets_an_envelope() -> None:
    response = error_response(ApiError(400, "bad \ud800 key", field="\udfff"))
    assert response.status_code == 400
    body = json.loads(bytes(response.body))
    assert body["error"]["code"] == "invalid_request"
    assert "bad" in body["error"]["message"]


async def test_surrogate_bodies_are_400_and_log_no_traceback(
    start: Started, caplog: pytest.LogCaptureFixture
) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a")]})
    async with start(kube) as (client, _):
        caplog.set_level(logging.INFO)
        for raw in (b'{"\\ud800": 1, "\\ud800": 2}', b'{"ttft": "\\udabcsecret"}'):
            response = await client.put("/routes/a", content=raw, headers=AUTH)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["code"] == "invalid_request"
        assert not [r for r in caplog.records if r.exc_info]
        assert "secret" not in caplog.text
        assert kube.patches == []


# Hypothesis leaves surrogates out unless asked, and draws them rarely even then.
_CHARS = st.characters(exclude_categories=()) | st.characters(
    min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()
)
_KEYS = st.text(_CHARS, max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _KEYS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.dictionaries(_KEYS, _JSON, max_size=5), ascii_only=st.booleans())
def test_parse_object_answers_any_body_with_a_value_or_a_sendable_400(
    body: dict[str, object], ascii_only: bool
) -> None:
    # ensure_ascii=True writes surrogates as \\uXXXX escapes; False puts them raw (not UTF-8).
    raw = json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    refused: ApiError | None = None
    try:
        value = parse_object(raw)
    except ApiError as exc:
        refused = exc
    if refused is None:
        orjson.dumps(value)  # whatever is accepted can be encoded again (logs, patches)
    else:
        assert refused.status == 400
        assert error_response(refused).status_code == 400


async def test_unusual_methods_are_counted_as_other(start: Started) -> None:
    async with start() as (client, _):
        for method in ("PROPFIND", "X-EVIL-1", "BREW"):
            await client.request(method, "/healthz")
        await client.get("/healthz")
        metrics = (await client.get("/metrics")).text
        assert 'method="other"' in metrics
        assert 'method="GET"' in metrics
        for method in ("PROPFIND", "X-EVIL-1", "BREW"):
            assert f'method="{method}"' not in metrics


@pytest.mark.parametrize("path", ["/healthz/", "/config/", "/metrics/", "/openapi.json/"])
async def test_trailing_slashes_never_redirect_to_the_host_header(
    start: Started, path: str
) -> None:
    async with start() as (client, _):
        response = await client.get(path, headers={**AUTH, "Host": "evil.example"})
        location = response.headers.get("location", "")
        assert "evil.example" not in location
        assert not location.startswith(("http:", "https:", "//"))


@pytest.mark.parametrize("sent", ["abc\n", "abc\r\n", "abc\nX-Injected: 1"])
async def test_a_request_id_must_be_safe_as_a_whole(start: Started, sent: str) -> None:
    async with start() as (client, _):
        raw = sent.encode()
        response = await client.get("/healthz", headers=[(b"X-Request-Id", raw)])
        assert response.headers["x-request-id"] != sent
        assert "\n" not in response.headers["x-request-id"]
        assert len(response.headers["x-request-id"]) == 32


async def test_every_response_says_nosniff_and_the_page_sends_its_csp(start: Started) -> None:
    async with start() as (client, _):
        for path in ("/healthz", "/nowhere", "/demo-webui", "/demo-webui/app.js"):
            response = await client.get(path)
            assert response.headers["x-content-type-options"] == "nosniff", path
        page = await client.get("/demo-webui")
        csp = page.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp
        assert "default-src 'none'" in csp
        assert "script-src 'self'" in csp


async def test_docs_load_only_same_origin_assets_and_they_are_served(start: Started) -> None:
    async with start() as (client, _):
        page = await client.get("/docs")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        html = page.text
        assert "://" not in html  # no CDN, no other origin
        refs = re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(r"url: '([^']+)'", html)
        assert refs
        for ref in refs:
            assert not ref.startswith(("/", "http:", "https:")), ref
            if ref.startswith("data:"):
                continue
            # Relative to /docs, as a browser resolves it.
            asset = await client.get("/" + ref)
            assert asset.status_code == 200, ref
            assert asset.content, ref
        js = await client.get("/docs/swagger-ui-bundle.js")
        assert js.headers["content-type"].startswith("text/javascript")
        assert "SwaggerUIBundle" in js.text
        css = await client.get("/docs/swagger-ui.css")
        assert css.headers["content-type"].startswith("text/css")
        assert (await client.get("/docs/secrets.txt")).status_code == 404


async def test_docs_can_be_turned_off(start: Started) -> None:
    async with start(docs_enabled=False) as (client, _):
        assert (await client.get("/docs")).status_code == 404
        assert (await client.get("/docs/swagger-ui-bundle.js")).status_code == 404
        assert (await client.get("/openapi.json")).status_code == 200
