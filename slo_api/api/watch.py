"""The `GET /config?watch=true` response: a feed's events as JSON lines or Server-Sent Events."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from slo_api.api.middleware import STREAM_LABEL
from slo_api.errors import ApiError
from slo_api.feed import Closing, Expired, Feed, TooManyWatchers, Visible, Watcher

log = logging.getLogger("slo_api.api")

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
RETRY_AFTER_SECONDS = 10
FINAL_WRITE_SECONDS = 1.0


def wants_sse(accept: str | None) -> bool:
    return accept is not None and SSE in accept.lower()


def open_stream(
    feed: Feed,
    *,
    view: str,
    kind: str | None,
    since: str | None,
    accept: str | None,
    last_event_id: str | None,
    visible: Visible | None = None,
) -> WatchResponse:
    sse = wants_sse(accept)
    if since is None and sse and last_event_id:
        since = last_event_id
    try:
        watcher = feed.open(view, kind, since, visible, sse)
    except Expired as exc:
        raise ApiError(
            410, f"{exc}; watch again without since", field="since", code="expired"
        ) from None
    except TooManyWatchers as exc:
        raise ApiError(
            429,
            f"{exc}; try again later",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            code="too_many_requests",
        ) from None
    except Closing as exc:
        raise ApiError(503, str(exc), code="not_ready") from None
    return WatchResponse(feed, watcher)


class WatchResponse(Response):
    """Streams until the client goes, the feed drops the watcher, or the server stops.

    A raw ASGI response rather than a StreamingResponse: a dropped watcher's writer may be
    stuck on a full socket, and the feed ends it by cancelling the task that writes.
    """

    def __init__(self, feed: Feed, watcher: Watcher) -> None:
        # Not Response.__init__: that would declare a Content-Length for an empty body.
        self.status_code = 200
        self.media_type = SSE if watcher.sse else NDJSON
        self.raw_headers = [
            (b"content-type", (self.media_type + "; charset=utf-8").encode()),
            (b"cache-control", b"no-cache"),
            # Proxies that buffer responses (nginx) would hold the events back.
            (b"x-accel-buffering", b"no"),
        ]
        self.feed = feed
        self.watcher = watcher
        self.background: BackgroundTask | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        feed, watcher = self.feed, self.watcher
        scope[STREAM_LABEL] = "/config?watch=true"
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

            async def write(chunk: bytes) -> None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})

            writer = asyncio.create_task(feed.serve(watcher, write))
            listener = asyncio.create_task(_disconnected(receive))
            try:
                done, _ = await asyncio.wait({writer, listener}, return_when="FIRST_COMPLETED")
            finally:
                writer.cancel()
                listener.cancel()
                await asyncio.gather(writer, listener, return_exceptions=True)
            if listener in done and not listener.cancelled():
                return  # the client went: nobody to finish the response for
            if not writer.cancelled() and writer.exception() is not None:
                log.error("change stream failed", exc_info=writer.exception())
            tail = b""
            if watcher.dropped is not None:
                tail = feed.error(
                    watcher,
                    "too_slow",
                    f"the stream fell more than {feed.queue} changes behind; "
                    "watch again with since=<the last revision read>",
                )
            # A stalled reader cannot take even this: the server then just closes.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(FINAL_WRITE_SECONDS):
                    await send({"type": "http.response.body", "body": tail, "more_body": False})
        finally:
            feed.close(watcher)


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
