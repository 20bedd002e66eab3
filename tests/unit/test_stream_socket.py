"""A change stream behind the uvicorn slo-api runs (httptools), over a loopback socket.

The flusher writes a caught-up stream's bytes straight to its connection (see
slo_api/api/direct_write.py); what the client reads must still be one well-formed chunked
response, whichever way each part went. Under another protocol (h11) nothing is written that
way.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from controlplane.server import free_port
from tests.unit.conftest import TOKEN, Started, llm_cr, until
from tests.unit.fakes import FakeKube

Obj = dict[str, Any]


@contextlib.asynccontextmanager
async def serving(app: Any, http: str = "httptools") -> AsyncIterator[int]:
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http=http, lifespan="off", log_config=None
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started, "listening")
    try:
        yield port
    finally:
        app.state.runtime.feed.close_all()
        server.should_exit = True
        await task


class ChunkedReader:
    """One watch over a raw socket, its body decoded strictly as HTTP/1.1 chunks."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.events: list[Obj] = []
        self.ended = False  # the last chunk (size 0) came
        self._partial = b""

    @classmethod
    async def open(cls, port: int, receive_buffer: int | None = None) -> ChunkedReader:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.connect(("127.0.0.1", port))
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(
            b"GET /config?watch=true HTTP/1.1\r\nHost: t\r\n"
            b"Authorization: Bearer %b\r\n\r\n" % TOKEN.encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding: chunked" in head.lower()
        return cls(reader, writer)

    async def _chunk(self) -> None:
        if self.reader.at_eof():
            raise EOFError
        size_line = await self.reader.readuntil(b"\r\n")
        size = int(size_line[:-2], 16)  # a malformed size line fails here
        data = await self.reader.readexactly(size + 2)
        assert data.endswith(b"\r\n"), data[-20:]
        if size == 0:
            self.ended = True
            return
        lines = (self._partial + data[:-2]).split(b"\n")
        self._partial = lines.pop()
        self.events += [orjson.loads(line) for line in lines if line]

    async def until(self, check: Any) -> Obj:
        async with asyncio.timeout(10):
            while True:
                for event in self.events:
                    if check(event):
                        return event
                assert not self.ended
                await self._chunk()

    async def to_the_end(self, eof_allowed: bool = False) -> None:
        """Read to the last chunk; with `eof_allowed`, or to where the server closed the
        connection (a stream whose last line could not be written), between two chunks."""
        async with asyncio.timeout(30):
            while not self.ended:
                try:
                    await self._chunk()
                except asyncio.IncompleteReadError as exc:
                    if not eof_allowed or exc.partial:
                        raise
                    break
                except EOFError:
                    if not eof_allowed:
                        raise
                    break
        assert self._partial == b""

    def close(self) -> None:
        self.writer.close()


async def test_a_flush_writes_straight_to_each_connection_and_the_response_stays_well_formed(
    start: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    through_asgi: list[bytes] = []  # body parts that went through uvicorn's ASGI send
    send = RequestResponseCycle.send

    async def counted(self: RequestResponseCycle, message: Any) -> None:
        if message["type"] == "http.response.body":
            through_asgi.append(message.get("body", b""))
        await send(self, message)

    monkeypatch.setattr(RequestResponseCycle, "send", counted)
    kube = FakeKube({"llmslorequirements": [llm_cr("a", "first")]})
    async with start(kube) as (_, app), serving(app) as port:
        feed = app.state.runtime.feed
        clients = [await ChunkedReader.open(port) for _ in range(3)]
        for client in clients:
            await client.until(lambda e: e["type"] == "BOOKMARK" and e.get("initial"))
        await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
        assert all(s.write_now is not None for s in feed.streams)

        before = len(through_asgi)
        added = llm_cr("b", "second")
        added["metadata"].update(uid="uid-b", resourceVersion="99")
        feed.index.upsert("llmslorequirements", added)
        positions = []
        for client in clients:
            event = await client.until(lambda e: e.get("route") == "second")
            assert event["type"] == "ADDED"
            positions.append(event["revision"])
        assert through_asgi[before:] == []  # the flush wrote past the ASGI send

        feed.close_all()  # each stream's last line and last chunk go through uvicorn's send
        for client, position in zip(clients, positions, strict=True):
            await client.to_the_end()
            # Its last line names the place the direct write brought it to.
            assert client.events[-1] == {"type": "BOOKMARK", "revision": position}
            client.close()


async def test_a_client_that_stops_reading_is_ended_and_reads_whole_events_up_to_its_place(
    start: Started,
) -> None:
    # Flushed at each change: the connection's buffers fill without waiting on a timer.
    settings = {"watch_history_bytes": 256 << 10, "watch_flush_seconds": 0}
    async with start(FakeKube(), **settings) as (_, app), serving(app) as port:
        feed = app.state.runtime.feed
        stalled = await ChunkedReader.open(port, receive_buffer=4096)
        await stalled.until(lambda e: e["type"] == "BOOKMARK" and e.get("initial"))
        await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
        # It stops reading. Changes come until the feed ends it: its socket and the
        # connection's buffer fill, and the history moves past what it could be sent.
        dropped = app.state.runtime.metrics.watchers_dropped.labels("too_slow")
        n = 0
        while not dropped._value.get():
            obj = llm_cr(f"n{n}", f"r{n}")
            obj["metadata"].update(uid=f"uid-{n}", resourceVersion=str(100 + n))
            feed.index.upsert("llmslorequirements", obj)
            n += 1
            if n % 100 == 0:
                await asyncio.sleep(0)
            assert n < 20_000, "never ended"
        # Now it reads all it was sent: whole chunks of whole events, in order, then its
        # ERROR.
        await stalled.to_the_end(eof_allowed=True)
        changes = [e for e in stalled.events if e["type"] == "ADDED"]
        assert [e["route"] for e in changes] == [f"r{i}" for i in range(len(changes))]
        last = stalled.events[-1]
        # Unless the server gave up on writing it (the client did not read for a second).
        if last["type"] == "ERROR":
            assert last["error"]["code"] == "too_slow"
        else:
            assert last is changes[-1]
        await until(lambda: not feed.streams, "the stream closed")
        stalled.close()


async def test_under_another_http_protocol_every_write_goes_through_asgi(start: Started) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a", "first")]})
    async with start(kube) as (_, app), serving(app, http="h11") as port:
        feed = app.state.runtime.feed
        client = await ChunkedReader.open(port)
        await client.until(lambda e: e["type"] == "BOOKMARK" and e.get("initial"))
        await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
        assert [s.write_now for s in feed.streams] == [None]
        added = llm_cr("b", "second")
        added["metadata"].update(uid="uid-b", resourceVersion="99")
        feed.index.upsert("llmslorequirements", added)
        assert (await client.until(lambda e: e.get("route") == "second"))["type"] == "ADDED"
        feed.close_all()
        await client.to_the_end()
        client.close()
