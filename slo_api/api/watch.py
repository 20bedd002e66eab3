"""The `GET /config?watch=true` response: a feed's events as JSON lines or Server-Sent Events."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable

from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from slo_api.api.middleware import STREAM_LABEL
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
# uvicorn's complaint when an application returns before its response is complete. ASGI has
# no message that aborts a response: returning is how an application gives one up, and
# uvicorn then closes the connection, which is what a stream whose client is gone or stopped
# reading needs. The line is left out for those streams only (`_cut`): they have one of ours.
UNFINISHED = "ASGI callable returned without completing response."
_cut: contextvars.ContextVar[bool] = contextvars.ContextVar("slo_api_stream_cut", default=False)


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
    """Streams until the client goes, the feed ends the stream, its lifetime is over, or the
    server stops.

    A raw ASGI response rather than a StreamingResponse: the request's own task writes the
    initial state, the flusher the rest (every write through the ASGI `send`, so through
    every middleware), and the feed ends a stream whose writer is stuck on a full socket by
    cancelling that task.
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

            def write(chunk: bytes) -> Awaitable[None]:
                # The send's own coroutine, not one wrapping it: a flush makes one per stream.
                return send({"type": "http.response.body", "body": chunk, "more_body": True})

            # Idle until the client goes: it is not woken by what the stream sends.
            listener = asyncio.create_task(_disconnected(receive))
            listener.add_done_callback(lambda t: None if t.cancelled() else feed.gone(stream))
            try:
                await feed.serve(stream, write)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not stream.cancelled or task is None:
                    raise
                task.uncancel()  # the feed ended it: finish the response below
            except (OSError, RuntimeError) as exc:
                # The server could not write: the connection is gone, whether or not the
                # server told this request (it does not when another request was pipelined
                # behind it).
                stream.gone = True
                log.info("a change stream ended: its client is gone (%s)", exc or type(exc))
            except Exception:
                log.exception("change stream failed")
            finally:
                listener.cancel()
            if stream.gone:
                _cut.set(True)  # nobody to finish the response for
                return
            try:
                # A stalled reader cannot take even this: the server then closes.
                async with asyncio.timeout(FINAL_WRITE_SECONDS):
                    last = feed.tail(stream)
                    await send({"type": "http.response.body", "body": last, "more_body": False})
            except TimeoutError:
                _cut.set(True)
                log.warning("a change stream was cut: its client stopped reading")
            except (OSError, RuntimeError) as exc:
                _cut.set(True)
                log.info("a change stream ended: its client is gone (%s)", exc or type(exc))
        finally:
            feed.close(stream)


def quiet_cut_streams() -> None:
    """Leave uvicorn's ERROR line out for the change streams cut here (once per process)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _CutStreamFilter) for f in logger.filters):
        logger.addFilter(_CutStreamFilter())


class _CutStreamFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # Logged from the request's own task, in its context: where `_cut` was set.
        return not (record.msg == UNFINISHED and _cut.get())


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
