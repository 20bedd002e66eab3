"""The refusals of `GET /config?watch=true` (streams themselves are tested over a real socket)."""

from __future__ import annotations

from tests.unit.conftest import AUTH, Started, llm_cr
from tests.unit.fakes import FakeKube


async def test_a_watch_needs_the_token_and_a_resume_from_elsewhere_is_410(start: Started) -> None:
    async with start(FakeKube({"llmslorequirements": [llm_cr("a")]})) as (client, app):
        assert (await client.get("/config", params={"watch": "true"})).status_code == 401
        feed = app.state.runtime.feed
        feed.open("summary", None)
        for since in ("garbage", "0123abcd.1", feed.revision(feed.head + 1)):
            gone = await client.get(
                "/config", params={"watch": "true", "since": since}, headers=AUTH
            )
            assert gone.status_code == 410, since
            assert gone.json()["error"]["code"] == "expired"
            assert gone.json()["error"]["field"] == "since"
        sse = await client.get(
            "/config",
            params={"watch": "true"},
            headers={**AUTH, "Accept": "text/event-stream", "Last-Event-ID": "other.7"},
        )
        assert sse.status_code == 410
        plain = await client.get("/config", params={"since": feed.revision(0)}, headers=AUTH)
        assert plain.status_code == 400
        assert plain.json()["error"]["field"] == "since"


async def test_watchers_beyond_max_watchers_get_429_with_retry_after(start: Started) -> None:
    async with start(FakeKube(), max_watchers=2) as (client, app):
        feed = app.state.runtime.feed
        feed.open("summary", None)
        feed.open("full", "llm")
        refused = await client.get("/config", params={"watch": "true"}, headers=AUTH)
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) > 0
        assert refused.json()["error"]["code"] == "too_many_requests"
        # An ordinary page is not limited by open streams.
        assert (await client.get("/config", headers=AUTH)).status_code == 200
