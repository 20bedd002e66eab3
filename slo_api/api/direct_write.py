"""A change stream's bytes written straight to uvicorn's connection, past the ASGI `send`.

A flush writes to every caught-up stream. Through ASGI each of those writes costs a coroutine,
a message dict, uvicorn's checks and a copy of the bytes into an HTTP chunk, per stream. The
streams that share a batch are handed the same bytes, so here they are framed as a chunk once
and put on each connection's transport, as uvicorn's `send` would put them. What remains per
stream is the system call.

Only uvicorn's httptools protocol (the one slo-api runs) is known here. Under another server,
or a layer that wraps `send`, nothing is written this way: every write goes through ASGI.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Send

from slo_api.feed.pump import WriteNow

_HTTPTOOLS = "uvicorn.protocols.http.httptools_impl"


class _Chunk:
    """The last body framed, and its chunk: every stream of a flush is given the same bytes
    object, so all but the first find it here."""

    body = b""
    framed = b""


def write_now(send: Send) -> WriteNow | None:
    """For a response whose start was sent: a write of a body part that the connection
    takes at once, or None when `send` is not uvicorn's own."""
    cycle: Any = getattr(send, "__self__", None)
    if cycle is None or type(cycle).__module__ != _HTTPTOOLS:
        return None
    try:
        transport, flow = cycle.transport, cycle.flow
        chunked = cycle.chunked_encoding is True and cycle.response_started
        head = cycle.scope["method"] == "HEAD"
    except (AttributeError, KeyError):  # another version of uvicorn: not known here
        return None
    if not chunked or head:
        return None

    def write(body: bytes) -> bool:
        # uvicorn's send waits while the transport's buffer is over its limit, and drops the
        # bytes once the client went: the write goes through it then.
        if flow.write_paused or cycle.disconnected or cycle.response_complete:
            return False
        if body:  # an empty chunk would end the response
            if body is not _Chunk.body:
                _Chunk.body, _Chunk.framed = body, b"%x\r\n%b\r\n" % (len(body), body)
            transport.write(_Chunk.framed)
        return True

    return write
