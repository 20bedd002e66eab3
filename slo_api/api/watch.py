"""The `GET /config?watch=true` response: a feed's events as JSON lines or Server-Sent Events."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable

from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from slo_api.api.direct_write import write_now
from slo_api.api.middleware import RAW_SEND, STREAM_LABEL
from slo_api.errors import ApiError
from slo_api.feed import (
    Allowed,
    Closing,
    Expired,
    Feed,
    Stream,
    StreamAccess,
    TooManyStreams,
    framing,
)

log = logging.getLogger("slo_api.api")

RETRY_AFTER_SECONDS = 10
FINAL_WRITE_SECONDS = 1.0


async def open_stream(
    feed: Feed,
    *,
    view: str,
    kind: str | None,
    since: str | None,
    accept: str | None,
    last_event_id: str | None,
    access: StreamAccess | None,
    allowed: Allowed | None,
) -> WatchResponse:
    """Open a stream for a caller whose `access.allowed()` answered `allowed` just now."""
    sse = framing.wants_sse(accept)
    if since is None and sse and last_event_id:
        since = last_event_id
    if since is not None:
        await feed.settle(since)
    try:
        stream = feed.open(view, kind, since, sse=sse, access=access, allowed=allowed)
    except Expired as exc:
        raise ApiError(410, f"{exc}; watch again without since", field="since") from None
    except TooManyStreams as exc:
        raise ApiError(
            429,
            f"{exc}; try again later",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        ) from None
    except Closing as exc:
        raise ApiError(503, str(exc)) from None
    return WatchResponse(feed, stream)


class WatchResponse(Response):
    """Streams until the client goes, the feed ends the stream, or the server stops.

    A raw ASGI response rather than a StreamingResponse: the request's own task writes, and
    the feed ends a stream whose writer is stuck on a full socket by cancelling that task.
    """

    def __init__(self, feed: Feed, stream: Stream) -> None:
        # Not Response.__init__: that would declare a Content-Length for an empty body.
        self.status_code = 200
        self.media_type = framing.SSE if stream.sse else framing.NDJSON
        self.raw_headers = framing.headers(stream.sse)
        self.feed = feed
        self.stream = stream
        self.background: BackgroundTask | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        feed, stream = self.feed, self.stream
        scope[STREAM_LABEL] = "/config?watch=true"
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            # The start went through every layer (status, request id, metrics); the body goes
            # past them (see RAW_SEND).
            body: Send = scope.get(RAW_SEND, send)

            def write(chunk: bytes) -> Awaitable[None]:
                # The send's own coroutine, not one wrapping it: a flush makes one per stream.
                return body({"type": "http.response.body", "body": chunk, "more_body": True})

            # Idle until the client goes: it is not woken by what the stream sends.
            listener = asyncio.create_task(_disconnected(receive))
            listener.add_done_callback(lambda t: None if t.cancelled() else feed.gone(stream))
            try:
                await feed.serve(stream, write, write_now(body))
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not stream.cancelled or task is None:
                    raise
                task.uncancel()  # the feed ended it: finish the response below
            except Exception:
                log.exception("change stream failed")
            finally:
                listener.cancel()
            if stream.gone:
                return  # the client went: nobody to finish the response for
            # A stalled reader cannot take even this: the server then just closes.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(FINAL_WRITE_SECONDS):
                    last = feed.tail(stream)
                    await body({"type": "http.response.body", "body": last, "more_body": False})
        finally:
            feed.close(stream)


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
