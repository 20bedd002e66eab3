"""A change stream behind uvicorn, as slo-api runs it, over loopback sockets.

Every part of a stream goes through the ASGI `send`, so through every middleware; what the
client reads must be one well-formed chunked response (gzip-encoded when a GZipMiddleware is
added and the client asks for it), and a stream must end, quietly, however its client goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
import uvicorn
import uvloop
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.server import free_port
from slo_api import __main__ as entry
from slo_api.app import create_app
from slo_api.settings import Settings
from tests.unit.conftest import TOKEN, Started, llm_cr, until
from tests.unit.fakes import FakeKube

Obj = dict[str, Any]
WATCH = b"/config?watch=true"
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


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


def on_a_loop_of_its_own(loop: str, scenario: Callable[[], Awaitable[None]]) -> None:
    """Run `scenario` on a new event loop of that kind, in a thread of its own."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
                runner.run(scenario())  # type: ignore[arg-type]
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def change(feed: Any, n: int) -> None:
    """Store a new route in the index, as the informers would."""
    obj = llm_cr(f"n{n}", f"r{n}")
    obj["metadata"].update(uid=f"uid-{n}", resourceVersion=str(100 + n))
    feed.index.upsert("llmslorequirements", obj)


class ChunkedReader:
    """One watch over a raw socket, its body decoded strictly as HTTP/1.1 chunks (and gunzipped
    when the response says so)."""

    def __init__(
        self,
        sock: socket.socket,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: bytes,
    ) -> None:
        self.sock, self.reader, self.writer, self.head = sock, reader, writer, head
        self.events: list[Obj] = []
        self.body = b""  # the decoded body so far
        self.ended = False  # the last chunk (size 0) came
        self._partial = b""
        self.sse = b"text/event-stream" in head.lower()
        self.gunzip = (
            zlib.decompressobj(16 + zlib.MAX_WBITS)
            if b"content-encoding: gzip" in head.lower()
            else None
        )

    @classmethod
    async def open(
        cls,
        port: int,
        *,
        target: bytes = WATCH,
        headers: bytes = b"",
        pipelined: bytes = b"",
        receive_buffer: int | None = None,
    ) -> ChunkedReader:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.connect(("127.0.0.1", port))
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(
            b"GET %b HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %b\r\n%b\r\n%b"
            % (target, TOKEN.encode(), headers, pipelined)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding: chunked" in head.lower()
        return cls(sock, reader, writer, head)

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
        data = data[:-2]
        if self.gunzip is not None:
            # Each part is readable as it arrives: all it compressed comes out of it.
            data = self.gunzip.decompress(data)
        self.body += data
        if self.sse:
            return
        lines = (self._partial + data).split(b"\n")
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

    def reset(self) -> None:
        """Go away as a crashed client's kernel does: a reset, no FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    def close(self) -> None:
        self.writer.close()


def initial(event: Obj) -> bool:
    return event["type"] == "BOOKMARK" and bool(event.get("initial"))


class CountBodies:
    """A middleware added the usual way, noting each body part the app sends."""

    def __init__(self, app: ASGIApp, parts: list[bytes]) -> None:
        self.app, self.parts = app, parts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def noted(message: Message) -> None:
            if message["type"] == "http.response.body":
                self.parts.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, noted)


async def test_every_part_of_a_stream_goes_through_the_middleware_and_the_response_stays_whole(
    start: Started,
) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a", "first")]})
    parts: list[bytes] = []
    async with start(kube) as (_, app):
        app.add_middleware(CountBodies, parts=parts)
        async with serving(app) as port:
            feed = app.state.runtime.feed
            clients = [await ChunkedReader.open(port) for _ in range(3)]
            for client in clients:
                await client.until(initial)
            await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
            change(feed, 1)
            positions = []
            for client in clients:
                event = await client.until(lambda e: e.get("route") == "r1")
                assert event["type"] == "ADDED"
                positions.append(event["revision"])
            feed.close_all()  # each stream's last line and last chunk
            for client, position in zip(clients, positions, strict=True):
                await client.to_the_end()
                # Its last line names the place the flush brought it to.
                assert client.events[-1] == {
                    "type": "BOOKMARK",
                    "revision": position,
                    "final": True,
                }
                client.close()
    # What the clients read is what went through the middleware, all of it.
    assert sorted(b"".join(c.body for c in clients).split(b"\n")) == sorted(
        b"".join(parts).split(b"\n")
    )


async def test_a_client_that_stops_reading_is_ended_and_reads_whole_events_up_to_its_place(
    start: Started,
) -> None:
    # Flushed at each change: the connection's buffers fill without waiting on a timer.
    settings = {"watch_history_bytes": 256 << 10, "watch_flush_seconds": 0}
    async with start(FakeKube(), **settings) as (_, app), serving(app) as port:
        feed = app.state.runtime.feed
        stalled = await ChunkedReader.open(port, receive_buffer=4096)
        await stalled.until(initial)
        await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
        # It stops reading. Changes come until the feed ends it: its socket and the
        # connection's buffer fill, and the history moves past what it could be sent.
        dropped = app.state.runtime.metrics.watchers_dropped.labels("too_slow")
        n = 0
        while not dropped._value.get():
            change(feed, n)
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


async def test_a_stalled_stream_that_is_cut_logs_one_warning_and_no_error(
    start: Started, caplog: pytest.LogCaptureFixture
) -> None:
    settings = {"watch_history_bytes": 256 << 10, "watch_flush_seconds": 0}
    async with start(FakeKube(), **settings) as (_, app), serving(app) as port:
        feed = app.state.runtime.feed
        stalled = await ChunkedReader.open(port, receive_buffer=4096)
        await stalled.until(initial)
        await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
        dropped = app.state.runtime.metrics.watchers_dropped.labels("too_slow")
        n = 0
        while not dropped._value.get():
            change(feed, n)
            n += 1
            if n % 100 == 0:
                await asyncio.sleep(0)
            assert n < 20_000, "never ended"
        # It never reads again: its last line cannot be written, and the server gives up.
        await until(lambda: not feed.streams, "the stream cut", within=30)
        cut = [r for r in caplog.records if "stopped reading" in r.getMessage()]
        assert [r.levelno for r in cut] == [logging.WARNING]
        assert errors_logged(caplog) == []
        stalled.close()


async def test_under_another_http_protocol_a_stream_works_the_same(start: Started) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a", "first")]})
    async with start(kube) as (_, app), serving(app, http="h11") as port:
        feed = app.state.runtime.feed
        client = await ChunkedReader.open(port)
        await client.until(initial)
        await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
        change(feed, 1)
        assert (await client.until(lambda e: e.get("route") == "r1"))["type"] == "ADDED"
        feed.close_all()
        await client.to_the_end()
        assert client.events[-1]["final"] is True
        client.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_watch_with_a_request_pipelined_behind_it_ends_when_its_client_resets(
    start: Started, caplog: pytest.LogCaptureFixture, loop: str
) -> None:
    # uvicorn (httptools) tells only the newest request of a connection that the client went,
    # and here that is the pipelined one, not yet started. Under uvloop the stream's next
    # write (a bookmark at the latest) fails; under the asyncio loop the transport drops the
    # writes without a word, so the stream ends at its lifetime, which bounds such a client.
    lifetime = 1.0 if loop == "asyncio" else 3600.0
    caplog.set_level(logging.INFO, logger="slo_api.api")
    settings = {
        "max_watchers": 1,
        "watch_bookmark_seconds": 0.2,
        "watch_lifetime_seconds": lifetime,
    }

    async def scenario() -> None:
        kube = FakeKube({"llmslorequirements": [llm_cr("a", "first")]})
        async with start(kube, **settings) as (_, app), serving(app) as port:
            feed = app.state.runtime.feed
            client = await ChunkedReader.open(
                port, pipelined=b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
            )
            await client.until(initial)
            await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
            client.reset()
            await until(lambda: not feed.streams, "the watch ended")
            # Its watcher slot is free: a new watch is served.
            again = await ChunkedReader.open(port)
            await again.until(initial)
            again.close()

    on_a_loop_of_its_own(loop, scenario)
    assert errors_logged(caplog) == []
    if loop == "uvloop":
        gone = [r for r in caplog.records if "client is gone" in r.getMessage()]
        assert [r.levelno for r in gone] == [logging.INFO]


async def test_slo_apis_own_server_runs_on_uvloop_where_a_reset_behind_a_pipelined_request_ends_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The server `slo-api` runs (its entry point's), in a thread with the loop it picks; the
    # stream's lifetime is an hour, so only the failed write can end it here.
    caplog.set_level(logging.INFO, logger="slo_api.api")
    kube = FakeKube({"llmslorequirements": [llm_cr("a", "first")]})

    async def factory(settings: Settings, metrics: Any) -> FakeKube:
        return kube

    settings = Settings(
        slo_api_token=TOKEN,
        host="127.0.0.1",
        port=free_port(),
        max_watchers=1,
        watch_bookmark_seconds=0.2,
        watch_lifetime_seconds=3600,
        shutdown_grace_seconds=0,
    )
    app = create_app(settings, kube_factory=factory)  # type: ignore[arg-type]
    server = entry.make_server(app, settings)
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        await until(lambda: server.started, "listening")
        feed = app.state.runtime.feed
        client = await ChunkedReader.open(
            settings.port, pipelined=b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
        )
        await client.until(initial)
        await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
        [stream] = feed.streams
        assert stream.task is not None
        assert isinstance(stream.task.get_loop(), uvloop.Loop)
        client.reset()
        await until(lambda: not feed.streams, "the watch ended")
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join)
    assert errors_logged(caplog) == []
    gone = [r for r in caplog.records if "client is gone" in r.getMessage()]
    assert [r.levelno for r in gone] == [logging.INFO]


async def test_a_watch_asking_for_gzip_through_a_gzip_middleware_reads_each_flush_as_it_comes(
    start: Started,
) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a", "first")]})
    async with start(kube) as (_, app):
        app.add_middleware(GZipMiddleware)
        async with serving(app) as port:
            feed = app.state.runtime.feed
            client = await ChunkedReader.open(port, headers=b"Accept-Encoding: gzip\r\n")
            assert client.gunzip is not None, client.head
            await client.until(initial)
            await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
            for n in range(3):
                # Read before the next change is made: the flush came out whole.
                change(feed, n)
                event = await client.until(lambda e, n=n: e.get("route") == f"r{n}")
                assert event["type"] == "ADDED"
            # Server-Sent Events are left as they are (the middleware's own rule).
            sse = await ChunkedReader.open(
                port, headers=b"Accept: text/event-stream\r\nAccept-Encoding: gzip\r\n"
            )
            assert sse.gunzip is None
            feed.close_all()
            await client.to_the_end()
            assert client.events[-1]["final"] is True
            assert client.gunzip.eof
            await sse.to_the_end()
            assert sse.body.startswith(b"retry: ")
            client.close()
            sse.close()


@pytest.mark.parametrize("sse", [False, True], ids=["ndjson", "sse"])
async def test_a_stream_ends_at_its_lifetime_with_its_place_and_resumes_from_it_losing_nothing(
    start: Started, sse: bool
) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a", "first")]})
    accept = b"Accept: text/event-stream\r\n" if sse else b""
    async with (
        start(kube, watch_lifetime_seconds=0.5) as (_, app),
        serving(app) as port,
    ):
        feed = app.state.runtime.feed
        first = await ChunkedReader.open(port, headers=accept)
        await until(lambda: all(s.write is not None for s in feed.streams), "caught up")
        change(feed, 1)
        await first.to_the_end()  # its lifetime ends it
        first.close()
        if sse:
            # The last frame: its id is the place to resume from (as Last-Event-ID).
            frames = first.body.strip().split(b"\n\n")
            place, data = frames[-1].split(b"\n")
            last = orjson.loads(data.removeprefix(b"data: "))
            assert place == b"id: " + last["revision"].encode()
        else:
            last = first.events[-1]
        assert last == {"type": "BOOKMARK", "revision": last["revision"], "final": True}
        change(feed, 2)  # while no stream is open
        resumed = await ChunkedReader.open(
            port, target=WATCH + b"&since=" + last["revision"].encode(), headers=accept
        )
        await resumed.to_the_end()
        resumed.close()
        # Each change exactly once across the two streams, in order (r1 may have come in
        # either, as the first stream's lifetime fell).
        if sse:
            both = first.body + resumed.body
            added = [b'"ADDED","route":"%b"' % r for r in (b"first", b"r1", b"r2")]
            assert [both.count(a) for a in added] == [1, 1, 1]
            assert both.index(added[1]) < both.index(added[2])
        else:
            routes = [e["route"] for e in first.events + resumed.events if e["type"] == "ADDED"]
            assert routes == ["first", "r1", "r2"]
