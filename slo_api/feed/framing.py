"""The wire form of change-stream events: JSON lines (NDJSON) or Server-Sent Events.

The one place that knows how an event is framed; the feed frames each event once per format
and every stream that sends it shares the bytes.

An SSE frame carries an `id:` only when it is a place the client may resume from: an
EventSource reconnects by itself with the last id it saw as `Last-Event-ID`, so an id inside
the initial state would make a cut stream come back without the rest of that state.
"""

from __future__ import annotations

import random

import orjson

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
# Browsers wait `retry:` ms before reconnecting a dropped EventSource; jittered per stream so
# the clients of a restarted replica do not all come back in the same instant.
RETRY_MS = 2000


def wants_sse(accept: str | None) -> bool:
    return accept is not None and SSE in accept.lower()


def headers(sse: bool) -> list[tuple[bytes, bytes]]:
    media = SSE if sse else NDJSON
    return [
        (b"content-type", (media + "; charset=utf-8").encode()),
        # no-transform: a compressing proxy would hold events back until its buffer fills.
        (b"cache-control", b"no-cache, no-transform"),
        # Proxies that buffer responses (nginx) would hold the events back.
        (b"x-accel-buffering", b"no"),
    ]


def preamble(sse: bool) -> bytes:
    """What a stream starts with: for SSE, the reconnect delay (jittered), else nothing."""
    if not sse:
        return b""
    return b"retry: %d\n\n" % random.randint(RETRY_MS, 2 * RETRY_MS)


# JSON may carry these raw inside a string, and orjson does; but Python's line readers
# (str.splitlines, httpx's aiter_lines) end a line at them, and would hand a client half an
# event. In UTF-8 they can only stand inside a JSON string, where their escape means the same.
_LINE_BREAKS = (
    (b"\xc2\x85", b"\\u0085"),
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
)


def frame(line: bytes, position: bytes | None, sse: bool) -> bytes:
    """One event: `line` is its JSON; `position` its resumable revision, if it has one."""
    # Most lines are ASCII, which isascii tells at a word a step: two searches of each line
    # doubled the CPU of a stream's initial state after a change to every route.
    if not line.isascii() and (b"\xc2\x85" in line or b"\xe2\x80" in line):
        for raw, escaped in _LINE_BREAKS:
            line = line.replace(raw, escaped)
    if not sse:
        return line + b"\n"
    if position is None:
        return b"data: %b\n\n" % line
    return b"id: %b\ndata: %b\n\n" % (position, line)


def change_line(
    type_: str, route: str, item: bytes, revision: bytes | None, by: bytes | None = None
) -> bytes:
    """An ADDED/MODIFIED/DELETED event's JSON; without `revision` for the initial state;
    `by` (JSON) says who made the change, where known."""
    if by is not None and revision is not None:
        return b'{"type":"%b","route":%b,"object":%b,"by":%b,"revision":"%b"}' % (
            type_.encode(),
            orjson.dumps(route),
            item,
            by,
            revision,
        )
    if revision is None:
        return b'{"type":"%b","route":%b,"object":%b}' % (
            type_.encode(),
            orjson.dumps(route),
            item,
        )
    return b'{"type":"%b","route":%b,"object":%b,"revision":"%b"}' % (
        type_.encode(),
        orjson.dumps(route),
        item,
        revision,
    )


def bookmark(revision: str, sse: bool, initial: bool = False, final: bool = False) -> bytes:
    """A place to resume from; `initial`: the initial state is complete; `final`: the last
    line of a stream the server ends in order (its lifetime is over, or the server stops)."""
    event: dict[str, object] = {"type": "BOOKMARK", "revision": revision}
    if initial:
        event["initial"] = True
    if final:
        event["final"] = True
    return frame(orjson.dumps(event), revision.encode(), sse)


def error(code: str, message: str, revision: str | None, sse: bool) -> bytes:
    """The last event of a stream the server ends. Its id (SSE) is the last position the
    stream really wrote, or none when it never finished its initial state."""
    event = {"type": "ERROR", "error": {"code": code, "message": message}}
    return frame(orjson.dumps(event), revision.encode() if revision else None, sse)
