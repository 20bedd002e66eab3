"""The change feed over a real index and service: what each stream is told, and when it is ended."""

from __future__ import annotations

import asyncio
import gc
import inspect
import tracemalloc
from collections.abc import Iterable
from typing import Any

import orjson
import pytest

from slo_api.errors import ApiError
from slo_api.feed import Allowed, Expired, Feed, Stream, TooManyStreams
from slo_api.feed import flusher as flusher_module
from slo_api.feed.history import Change, ChangeLog, History, More
from slo_api.metrics import Metrics
from slo_api.service import Service
from slo_api.visible import VisiblePages
from tests.unit import vtime
from tests.unit.conftest import until
from tests.unit.test_index_cache import JOB, LLM, POOL, cr, make_service, pool

Obj = dict[str, Any]


def at(kind: str, namespace: str) -> tuple[str, str, str]:
    """A place a caller may list: these tests' CRs carry no apiVersion (API group "")."""
    return (kind, namespace, "")


def make_feed(service: Service | None = None, **overrides: Any) -> Feed:
    options: dict[str, Any] = {
        "history_bytes": 1 << 20,
        "max_streams": 10,
        "streams_per_identity": 3,
        "bookmark_seconds": 3600,
        "flush_seconds": 0,
        **overrides,
    }
    return Feed(service or make_service(), Metrics(), **options)


class Reader:
    """Runs one stream into a list of decoded events, as the HTTP response does."""

    def __init__(self, feed: Feed, stream: Stream) -> None:
        self.feed = feed
        self.stream = stream
        self.raw: list[bytes] = []
        self.stalled = False  # its client stops reading: every write from now on hangs
        self.task = asyncio.create_task(self._run())

    async def _write(self, chunk: bytes) -> None:
        if self.stalled:
            await asyncio.Event().wait()
        self.raw.append(chunk)

    async def _run(self) -> None:
        try:
            await self.feed.serve(self.stream, self._write)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self.stream.cancelled or task is None:
                raise
            task.uncancel()
        self.raw.append(self.feed.tail(self.stream))

    @property
    def events(self) -> list[Obj]:
        return [data for _, data in self.frames]

    @property
    def frames(self) -> list[tuple[str | None, Obj]]:
        text = b"".join(self.raw)
        if self.stream.sse:
            out = []
            for block in text.split(b"\n\n"):
                fields = dict(line.split(b": ", 1) for line in block.split(b"\n") if b": " in line)
                if b"data" in fields:
                    ident = fields.get(b"id")
                    out.append((ident.decode() if ident else None, orjson.loads(fields[b"data"])))
            return out
        return [(None, orjson.loads(line)) for line in text.splitlines()]

    def changes(self) -> list[tuple[str, str]]:
        return [
            (e["type"], e["route"]) for e in self.events if e["type"] not in ("BOOKMARK", "ERROR")
        ]

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.feed.close(self.stream)


async def reader(feed: Feed, view: str = "summary", kind: str | None = None, **kw: Any) -> Reader:
    r = Reader(feed, feed.open(view, kind, **kw))
    await r.settle()
    return r


async def test_a_stream_starts_with_the_current_routes_then_an_initial_bookmark() -> None:
    feed = make_feed()
    index = feed.index
    index.upsert(LLM, cr("a", "x", "chat"))
    index.upsert(JOB, cr("a", "y", "batch", queue={"maxDepth": 1, "promql": "up"}))
    r = await reader(feed)
    events = r.events
    assert [(e["type"], e.get("route")) for e in events] == [
        ("ADDED", "batch"),
        ("ADDED", "chat"),
        ("BOOKMARK", None),
    ]
    assert events[-1]["initial"] is True
    assert events[0]["object"] == feed.service.summary("batch")
    # No place to resume from inside the initial state: only its bookmark has one.
    assert [e.get("revision") for e in events] == [None, None, feed.revision(feed.head)]
    await r.stop()


async def test_each_change_is_sent_once_with_its_type_and_new_item() -> None:
    feed = make_feed()
    index = feed.index
    index.upsert(LLM, cr("a", "x", "chat"))
    r = await reader(feed)
    index.upsert(LLM, cr("a", "x", "chat", rv=2, priority=5))
    await r.settle()
    index.upsert(LLM, cr("a", "y", "code"))
    await r.settle()
    index.delete(LLM, cr("a", "x", "chat", rv=3))
    await r.settle()
    assert r.changes()[1:] == [("MODIFIED", "chat"), ("ADDED", "code"), ("DELETED", "chat")]
    modified = r.events[2]
    assert modified["object"]["priority"] == 5
    # A DELETED event carries the item as it last was.
    assert r.events[-1]["object"]["priority"] == 5
    revisions = [e["revision"] for e in r.events[2:]]
    assert revisions == sorted(revisions, key=feed.log.sequence)
    assert len(set(revisions)) == 3
    await r.stop()


async def test_a_relist_sends_nothing_for_the_same_objects_and_only_the_changes_otherwise() -> None:
    feed = make_feed()
    index = feed.index
    objs = [cr("a", f"n{i}", f"r{i}") for i in range(20)]
    index.replace(LLM, objs)
    r = await reader(feed)
    head = feed.head
    index.replace(LLM, objs)
    await r.settle()
    assert feed.head == head
    assert len(r.changes()) == 20
    changed = [*objs[1:5], cr("a", "n5", "r5", rv=2, priority=3), *objs[6:], cr("a", "z", "new")]
    index.replace(LLM, changed)
    await r.settle()
    assert sorted(r.changes()[20:]) == [("ADDED", "new"), ("DELETED", "r0"), ("MODIFIED", "r5")]
    await r.stop()


async def test_a_pool_membership_change_reaches_its_members_in_the_full_view() -> None:
    feed = make_feed()
    index = feed.index
    index.upsert(LLM, cr("a", "x", "chat"))
    r = await reader(feed, "full")
    index.upsert(POOL, pool("a", "p", ["chat"]))
    await r.settle()
    assert sorted(r.changes()[1:]) == [("ADDED", "p"), ("MODIFIED", "chat")]
    [chat] = [e for e in r.events if e.get("route") == "chat" and e["type"] == "MODIFIED"]
    assert chat["object"]["pool"]["route"] == "p"
    await r.stop()


async def test_a_members_pool_is_streamed_only_where_config_shows_it() -> None:
    feed = make_feed()
    index = feed.index
    index.upsert(LLM, cr("a", "x", "chat"))
    index.upsert(POOL, pool("a", "p", ["chat"]))
    llm_only = frozenset({at("llm", "a")})
    both = llm_only | {at("pool", "a")}
    pages = VisiblePages(feed.service, index, feed.log)

    def config(allowed: Allowed) -> Obj:
        body = orjson.loads(pages.page(allowed, 1, 100, "llm", True)[0])
        [item] = [i for i in body["items"] if i["route"] == "chat"]
        return dict(item)

    readers = {
        allowed: await reader(feed, "full", "llm", allowed=allowed) for allowed in (llm_only, both)
    }
    index.upsert(LLM, cr("a", "x", "chat", rv=2, priority=4))
    index.delete(LLM, cr("a", "x", "chat"))
    await asyncio.sleep(0)
    for allowed, r in readers.items():
        await r.settle()
        events = [e for e in r.events if e.get("route") == "chat"]
        assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
        # Where the caller may not list the pools of the member's namespace, neither
        # /config?view=full nor its stream shows the member's pool.
        assert all(("pool" in e["object"]) == (allowed == both) for e in events)
        assert readers[both].events[0]["object"]["pool"]["route"] == "p"
        await r.stop()
    index.upsert(LLM, cr("a", "x", "chat"))
    assert "pool" not in config(llm_only)
    assert config(both)["pool"]["route"] == "p"
    # A static token's stream (allowed None) sees the pool too.
    r = await reader(feed, "full", "llm")
    assert r.events[0]["object"]["pool"]["route"] == "p"
    await r.stop()


async def test_a_kind_filter_sees_a_route_leave_the_kind_as_deleted() -> None:
    feed = make_feed()
    index = feed.index
    index.upsert(LLM, cr("a", "x", "chat"))
    llm = await reader(feed, kind="llm")
    everyone = await reader(feed)
    index.upsert(JOB, cr("a", "j", "chat", queue={"maxDepth": 1, "promql": "up"}))
    await llm.settle()
    # Ambiguous: still listed under both kinds.
    assert llm.changes()[1:] == [("MODIFIED", "chat")]
    assert llm.events[-1]["object"]["ambiguous"] is True
    index.delete(LLM, cr("a", "x", "chat"))
    await llm.settle()
    assert llm.changes()[1:] == [("MODIFIED", "chat"), ("DELETED", "chat")]
    assert everyone.changes()[1:] == [("MODIFIED", "chat"), ("MODIFIED", "chat")]
    assert everyone.events[-1]["object"]["kind"] == "job"
    await llm.stop()
    await everyone.stop()


async def test_since_replays_exactly_the_later_changes() -> None:
    feed = make_feed()
    index = feed.index
    index.upsert(LLM, cr("a", "x", "chat"))
    first = await reader(feed)
    index.upsert(LLM, cr("a", "y", "code"))
    await first.settle()
    resume_at = first.events[-1]["revision"]
    await first.stop()
    index.upsert(LLM, cr("a", "x", "chat", rv=2, priority=1))
    index.delete(LLM, cr("a", "y", "code"))
    resumed = await reader(feed, since=resume_at)
    assert resumed.changes() == [("MODIFIED", "chat"), ("DELETED", "code")]
    assert not any(e.get("initial") for e in resumed.events)
    await resumed.stop()


async def test_a_stream_behind_gets_each_item_as_it_was_however_often_it_changed() -> None:
    # What a newer change replaced is kept packed: a stream that resumes from before reads it
    # back as it was published, in every view.
    feed = make_feed()
    index = feed.index
    index.upsert(LLM, cr("a", "x", "chat"))
    summary, full = await reader(feed), await reader(feed, "full")
    await summary.settle()
    since = {"summary": summary.events[-1]["revision"], "full": full.events[-1]["revision"]}
    await summary.stop()
    await full.stop()
    for rv in range(2, 6):
        index.upsert(LLM, cr("a", "x", "chat", rv=rv, priority=rv))
    index.delete(LLM, cr("a", "x", "chat", rv=6, priority=5))
    index.upsert(LLM, cr("a", "x", "chat", rv=7, priority=9))
    for view in ("summary", "full"):
        resumed = await reader(feed, view, since=since[view])
        seen = [
            (e["type"], e["object"]["priority"])
            for e in resumed.events
            if e["type"] not in ("BOOKMARK", "ERROR")
        ]
        assert seen == [
            ("MODIFIED", 2),
            ("MODIFIED", 3),
            ("MODIFIED", 4),
            ("MODIFIED", 5),
            ("DELETED", 5),
            ("ADDED", 9),
        ], view
        await resumed.stop()


def test_a_history_uncounts_an_entry_as_it_counted_it_however_it_was_framed_since() -> None:
    # Framing asks who made the change; packing shrinks its item. Neither may change what the
    # trim takes off, or the count drifts and the history outgrows its budget.
    owners = (("llm", "a", ""),)
    source = (LLM, "", "")
    who = More(lambda rv: b'{"actor":"someone","via":"kubectl-edit"}', shared=True)
    packed: list[Change] = []
    history = History("summary", None, 0, 1 << 20, lambda view, c: packed.append(c))
    first = Change("chat", b'{"route":"chat","priority":1}', owners, owners, source, who)
    history.append(1, 7, first)
    first.frame("ADDED", False, lambda seq: b"1", (1, 7))
    history.append(2, 8, Change("chat", b'{"route":"chat"}', owners, owners, source, who))
    assert packed == [first]  # the newer change of its route replaced its item
    first.item = b"x"
    history.budget = 0
    history.trim()
    assert (len(history), history.bytes) == (0, 0)


def test_a_history_keeps_resource_versions_past_64_bits() -> None:
    # KEP-5504 lets a resourceVersion be any decimal integer (the conformance tests reach 128
    # bits): the history's array of machine integers gives way to one of int objects.
    owners = (("llm", "a", ""),)
    source = (LLM, "", "")
    history = History("summary", None, 0, 1 << 20)
    huge = 2**100
    for seq, rv in ((1, 7), (2, huge), (3, huge + 1)):
        more = More(None, shared=True)
        history.append(seq, rv, Change(f"r{seq}", b'{"route":"r"}', owners, owners, source, more))
    assert [place for place, _ in history.live()] == [(1, 7), (2, huge), (3, huge + 1)]
    entries, _, complete = history.after(1, 1 << 20)
    assert [place for place, _ in entries] == [(2, huge), (3, huge + 1)]
    assert complete
    history.budget = 0
    history.trim()
    assert history.floor_rv[source] == huge + 1


async def test_a_revision_too_old_from_the_future_or_garbage_is_expired() -> None:
    feed = make_feed(history_bytes=4000)
    index = feed.index
    r = await reader(feed)
    old = feed.revision(feed.head)
    for i in range(40):
        index.upsert(LLM, cr("a", f"n{i}", f"r{i}"))
        await r.settle()
    with pytest.raises(Expired, match="older"):
        feed.open("summary", None, old)
    with pytest.raises(Expired, match="not from this"):
        feed.open("summary", None, feed.revision(feed.head + 5))
    with pytest.raises(Expired):
        feed.open("summary", None, "garbage")
    await r.stop()


async def test_a_stalled_reader_is_ended_at_the_bound_and_the_others_get_every_change() -> None:
    feed = make_feed(history_bytes=8000)
    index = feed.index
    index.upsert(LLM, cr("a", "first", "first"))
    stalled = await reader(feed)
    stalled.stalled = True
    healthy = await reader(feed)
    for i in range(40):
        index.upsert(LLM, cr("a", f"n{i}", f"r{i}"))
        await healthy.settle()
    await stalled.task
    tail = orjson.loads(stalled.raw[-1])
    assert tail["type"] == "ERROR"
    assert tail["error"]["code"] == "too_slow"
    assert len(healthy.changes()) == 41
    sample = feed.metrics.registry.get_sample_value
    assert sample("slo_api_change_streams_dropped_total", {"reason": "too_slow"}) == 1
    await healthy.stop()


async def test_the_error_frame_names_only_what_was_written() -> None:
    feed = make_feed(history_bytes=8000)
    index = feed.index
    r = await reader(feed, sse=True)
    bookmark_id = r.frames[-1][0]
    assert bookmark_id == feed.revision(feed.head)
    r.stalled = True
    for i in range(40):
        index.upsert(LLM, cr("a", f"n{i}", f"r{i}"))
        await r.settle()
    await r.task
    ident, error = r.frames[-1]
    assert error["type"] == "ERROR"
    # The changes it was stuck writing never left: its place is still the bookmark's.
    assert ident == bookmark_id


async def test_more_watchers_than_allowed_are_refused() -> None:
    feed = make_feed(max_streams=2)
    a = feed.open("summary", None)
    feed.open("summary", None)
    with pytest.raises(TooManyStreams):
        feed.open("summary", None)
    feed.close(a)
    feed.open("summary", None)
    assert feed.metrics.registry.get_sample_value("slo_api_change_streams_open") == 2


async def test_a_route_that_stops_being_visible_is_deleted_for_that_watcher() -> None:
    feed = make_feed()
    index = feed.index

    index.upsert(LLM, cr("mine", "x", "chat"))
    index.upsert(LLM, cr("theirs", "y", "secret"))
    r = await reader(feed, allowed=frozenset({at("llm", "mine")}))
    assert r.changes() == [("ADDED", "chat")]
    # Another namespace's CR makes it ambiguous: still visible through ours.
    index.upsert(LLM, cr("theirs", "z", "chat"))
    index.upsert(LLM, cr("theirs", "y", "secret", rv=2, priority=4))
    await r.settle()
    assert r.changes() == [("ADDED", "chat"), ("MODIFIED", "chat")]
    index.delete(LLM, cr("mine", "x", "chat"))
    await r.settle()
    assert r.changes() == [("ADDED", "chat"), ("MODIFIED", "chat"), ("DELETED", "chat")]
    await r.stop()


def test_bookmarks_carry_the_latest_revision() -> None:
    vtime.run(_bookmarks_carry_the_latest_revision())


async def _bookmarks_carry_the_latest_revision() -> None:
    # On virtual time (tests/unit/vtime.py): ten bookmark periods pass exactly, however busy
    # the machine is.
    feed = make_feed(bookmark_seconds=0.01)
    feed.start()
    r = await reader(feed, kind="job")
    feed.index.upsert(LLM, cr("a", "x", "chat"))  # not this watcher's kind
    await asyncio.sleep(0.1)
    bookmarks = [e for e in r.events if e["type"] == "BOOKMARK" and not e.get("initial")]
    assert bookmarks
    assert bookmarks[-1]["revision"] == feed.revision(feed.head)
    assert r.changes() == []
    await r.stop()
    await feed.stop()


async def test_sse_frames_carry_the_revision_as_id() -> None:
    feed = make_feed()
    feed.index.upsert(LLM, cr("a", "x", "chat"))
    r = await reader(feed, sse=True)
    text = b"".join(r.raw).decode()
    # A jittered reconnect delay first, so a restarted server's clients come back spread out.
    retry = text.split("\n\n")[0]
    assert retry.startswith("retry: ")
    assert 2000 <= int(retry.removeprefix("retry: ")) <= 4000
    revision = feed.revision(feed.head)
    # The initial ADDED has no id: an EventSource cut inside the initial state must not
    # resume from there (it would never get the rest of it).
    assert r.frames == [
        (None, {"type": "ADDED", "route": "chat", "object": feed.service.summary("chat")}),
        (revision, {"type": "BOOKMARK", "revision": revision, "initial": True}),
    ]
    feed.index.upsert(LLM, cr("a", "x", "chat", rv=2, priority=2))
    await r.settle()
    ident, event = r.frames[-1]
    assert ident == event["revision"]
    assert feed.log.sequence(str(ident)) == feed.head
    await r.stop()


async def test_closing_ends_every_stream_and_refuses_new_ones() -> None:
    feed = make_feed()
    r = await reader(feed)
    feed.close_all()
    await r.settle()
    assert r.task.done()
    assert r.task.exception() is None
    with pytest.raises(Exception, match="shutting down"):
        feed.open("summary", None)


def test_a_burst_of_changes_goes_out_in_one_write() -> None:
    vtime.run(_a_burst_of_changes_goes_out_in_one_write())


async def _a_burst_of_changes_goes_out_in_one_write() -> None:
    # On virtual time: the burst is written within one flush period, and four periods pass.
    feed = make_feed(flush_seconds=0.05)
    index = feed.index
    r = await reader(feed)
    writes = len(r.raw)
    for i in range(10):
        index.upsert(LLM, cr("a", f"n{i}", f"r{i}"))
    await asyncio.sleep(0.2)
    assert len(r.raw) == writes + 1
    assert len(r.changes()) == 10
    await r.stop()


def test_a_flush_that_takes_long_spaces_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    vtime.run(_a_flush_that_takes_long_spaces_the_next_one(monkeypatch))


async def _a_flush_that_takes_long_spaces_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # Thousands of streams make a flush long: the next one waits long enough that flushing
    # keeps to its share of the event loop, instead of taking all of it. On virtual time,
    # with each write taking a second of a clock of the test's own.
    clock = [0.0]
    monkeypatch.setattr("slo_api.feed.flusher.clock", lambda: clock[0])
    feed = make_feed(flush_seconds=0.05)
    index = feed.index
    r = Reader(feed, feed.open("summary", None))
    written = r._write

    async def slow(chunk: bytes) -> None:
        clock[0] += 1.0
        await written(chunk)

    r._write = slow  # type: ignore[method-assign]
    await r.settle()
    index.upsert(LLM, cr("a", "n1", "r1"))
    await asyncio.sleep(0.1)
    assert r.changes() == [("ADDED", "r1")]  # that flush took a second
    index.upsert(LLM, cr("a", "n2", "r2"))
    spacing = min(
        (1 - flusher_module.LOOP_SHARE) / flusher_module.LOOP_SHARE,
        flusher_module.MAX_SPACING_SECONDS,
    )
    assert spacing > 5 * 0.05  # a flush of a second: a wait far longer than flush_seconds
    await asyncio.sleep(spacing - 0.1)
    assert r.changes() == [("ADDED", "r1")]
    await asyncio.sleep(0.2)
    assert r.changes() == [("ADDED", "r1"), ("ADDED", "r2")]
    await r.stop()


def test_a_flush_writes_its_streams_a_slice_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    vtime.run(_a_flush_writes_its_streams_a_slice_per_turn(monkeypatch))


async def _a_flush_writes_its_streams_a_slice_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    # A request that comes during a flush of thousands of streams waits for one slice of it,
    # not for all of it.
    monkeypatch.setattr("slo_api.feed.flusher.PASS_STREAMS", 2)
    feed = make_feed(flush_seconds=0.05, max_streams=10)
    readers = [await reader(feed) for _ in range(5)]
    passes: list[int] = []
    deliver = feed.flusher.deliver

    def counted(streams: Iterable[Stream]) -> None:
        streams = list(streams)
        passes.append(len(streams))
        deliver(streams)

    feed.flusher.deliver = counted
    feed.index.upsert(LLM, cr("a", "n1", "r1"))
    await asyncio.sleep(0.1)
    assert passes == [2, 2, 1]
    for r in readers:
        assert r.changes() == [("ADDED", "r1")]
        await r.stop()


async def test_changes_between_opening_and_the_first_write_are_sent_once() -> None:
    feed = make_feed()
    index = feed.index
    index.upsert(LLM, cr("a", "x", "chat"))
    watcher = feed.open("summary", None)
    # The response has not started writing yet when these happen.
    index.upsert(LLM, cr("a", "y", "code"))
    index.upsert(LLM, cr("a", "x", "chat", rv=2, priority=2))
    r = Reader(feed, watcher)
    await r.settle()
    assert r.changes() == [("ADDED", "chat"), ("ADDED", "code")]
    assert r.events[0]["object"]["priority"] == 2
    assert r.events[-1]["type"] == "BOOKMARK"
    assert r.events[-1]["revision"] == feed.revision(feed.head)
    await r.stop()


async def test_a_relist_ends_no_caught_up_stream() -> None:
    feed = make_feed(history_bytes=80 * 1024)
    index = feed.index
    objs = [cr("a", f"n{i}", f"r{i}") for i in range(50)]
    index.replace(LLM, objs)
    summary = await reader(feed)
    full = await reader(feed, "full")
    resume_summary = feed.revision(feed.head)
    # Every route at once, as a relist delivers it.
    index.replace(LLM, [cr("a", f"n{i}", f"r{i}", rv=2, priority=1 + i % 10) for i in range(50)])
    index.upsert(LLM, cr("a", "n0", "r0", rv=3, priority=7))
    index.upsert(LLM, cr("a", "n0", "r0", rv=4, priority=8))
    await summary.settle()
    await full.settle()
    assert summary.stream.ended is None
    assert full.stream.ended is None
    assert len(summary.changes()) == 50 + 50 + 2
    resumed = await reader(feed, since=resume_summary)
    assert resumed.changes() == summary.changes()[50:]
    assert [e["object"]["priority"] for e in resumed.events if e.get("route") == "r0"] == [1, 7, 8]
    for r in (summary, full, resumed):
        await r.stop()


async def test_one_kinds_churn_does_not_expire_another_kinds_place() -> None:
    feed = make_feed(history_bytes=6000)
    index = feed.index
    index.upsert(JOB, cr("a", "j", "batch", queue={"maxDepth": 1, "promql": "up"}))
    jobs = await reader(feed, kind="job")
    everything = await reader(feed)
    place = jobs.events[-1]["revision"]
    await jobs.stop()
    await everything.stop()
    for i in range(60):
        index.upsert(LLM, cr("a", f"n{i}", f"r{i}"))
    with pytest.raises(Expired):
        feed.open("summary", None, place)
    index.upsert(
        JOB, cr("a", "j", "batch", rv=2, priority=4, queue={"maxDepth": 1, "promql": "up"})
    )
    resumed = await reader(feed, kind="job", since=place)
    assert resumed.changes() == [("MODIFIED", "batch")]
    await resumed.stop()


async def test_a_slow_initial_state_is_not_ended_for_the_changes_made_meanwhile() -> None:
    feed = make_feed()
    index = feed.index
    index.replace(LLM, [cr("a", f"n{i}", f"r{i}", queue=None) for i in range(2000)])
    gate = asyncio.Event()
    stream = feed.open("full", None)
    r = Reader(feed, stream)
    original = r._write

    async def slow(chunk: bytes) -> None:
        await gate.wait()
        await original(chunk)

    r._write = slow  # type: ignore[method-assign]
    await r.settle()
    for i in range(300):
        index.upsert(LLM, cr("a", "n1", "r1", rv=2 + i, priority=i % 11))
    gate.set()
    await r.settle()
    while not any(e.get("initial") for e in r.events):
        await asyncio.sleep(0.01)
    await r.settle()
    assert stream.ended is None
    assert len([e for e in r.events if e["type"] == "ADDED"]) == 2000
    assert r.events[-1]["object"]["priority"] == 299 % 11
    await r.stop()


async def test_kind_and_visibility_follow_the_config_rule_for_an_ambiguous_route() -> None:
    feed = make_feed()
    index = feed.index
    index.upsert(LLM, cr("theirs", "x", "shared"))
    index.upsert(POOL, pool("mine", "shared", []))
    allowed = frozenset({at("pool", "mine")})
    # /config?kind=llm for this caller lists the route: an LLM claims it, and the caller sees
    # one of its CRs (the pool). The stream lists it too.
    listed = feed.service.index.routes("llm")
    assert "shared" in listed
    r = await reader(feed, kind="llm", allowed=allowed)
    assert r.changes() == [("ADDED", "shared")]
    assert r.events[0]["object"]["ambiguous"] is True
    await r.stop()


class Access:
    """Answers in turn (the last one from then on); `asked`: the places they are decided over
    (by default those of the first answer: every place held was asked about)."""

    def __init__(
        self, holder: str | None, answers: list[Any], asked: frozenset[Any] | None = None
    ) -> None:
        self.holder = holder
        self.answers = answers
        first = answers[0] if answers else None
        self.asked = asked if asked is not None else frozenset(first or ())

    def settled(self) -> bool:
        return True

    async def allowed(self) -> Allowed | None:
        answer = self.answers[0] if len(self.answers) == 1 else self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        result: Allowed | None = answer
        return result


async def test_access_lost_or_changed_ends_the_stream_with_an_error_line() -> None:
    feed = make_feed(access_seconds=0.01)
    feed.index.upsert(LLM, cr("mine", "x", "chat"))
    mine = frozenset({at("llm", "mine")})
    revoked = Access("alice", [mine, ApiError(401, "the token is not valid")])
    unbound = Access("bob", [mine, ApiError(403, "no list", code="forbidden")])
    # Rights gained where CRs were already (asked about, refused): the stream never had them.
    widened = Access("carol", [mine, mine | {at("llm", "other")}], mine | {at("llm", "other")})
    # Rights on a place that gained its first CR since: the view widens in place.
    grown = Access("erin", [mine, mine | {at("llm", "new")}])
    steady = Access("dave", [mine])
    readers = [
        await reader(feed, access=a, allowed=await a.allowed())
        for a in (revoked, unbound, widened, grown, steady)
    ]
    feed.start()
    for r in readers[:3]:
        await asyncio.wait_for(r.task, 5)
    codes = [orjson.loads(r.raw[-1])["error"]["code"] for r in readers[:3]]
    assert codes == ["unauthorized", "forbidden", "expired"]
    await until(lambda: readers[3].stream.allowed == mine | {at("llm", "new")}, "widened")
    for r in readers[3:]:
        assert not r.task.done()
        await r.stop()
    await feed.stop()


async def test_streams_per_identity_are_capped_and_static_tokens_are_not() -> None:
    feed = make_feed(streams_per_identity=2)
    alice = Access("alice", [frozenset()])
    opened = [feed.open("summary", None, access=alice, allowed=frozenset()) for _ in range(2)]
    with pytest.raises(TooManyStreams, match="identity"):
        feed.open("summary", None, access=alice, allowed=frozenset())
    feed.open("summary", None, access=Access("bob", [frozenset()]), allowed=frozenset())
    for _ in range(3):
        feed.open("summary", None, access=Access(None, [None]))
    feed.close(opened[0])
    feed.open("summary", None, access=alice, allowed=frozenset())


GROUP = "inference.modelsphere.dev"


def event(feeds: list[Feed], obj: Obj, deleted: bool = False) -> None:
    """One watch event as each replica's informer applies it."""
    for feed in feeds:
        feed.index.reached(LLM, GROUP, None, obj["metadata"]["resourceVersion"])
        if deleted:
            feed.index.delete(LLM, obj, GROUP)
        else:
            feed.index.upsert(LLM, obj, GROUP)


def listed(feeds: list[Feed], objs: list[Obj], rv: int) -> None:
    for feed in feeds:
        feed.index.reached(LLM, GROUP, None, str(rv))
        feed.index.replace(LLM, objs, GROUP)


async def test_another_replica_resumes_from_the_versions_a_revision_names() -> None:
    a, b = make_feed(), make_feed()
    both = [a, b]
    listed(both, [cr("a", "x", "chat", rv=10)], 10)
    on_a = await reader(a)
    event(both, cr("a", "y", "code", rv=11))
    await on_a.settle()
    cut_at = on_a.events[-1]["revision"]
    # Changes while the client moves over; b has seen them (it may see them later too).
    event(both, cr("a", "x", "chat", rv=12, priority=3))
    event(both, cr("a", "y", "code", rv=13), deleted=True)
    event(both, cr("a", "z", "new", rv=14))
    on_b = await reader(b, since=cut_at)
    assert on_b.changes() == [("MODIFIED", "chat"), ("DELETED", "code"), ("ADDED", "new")]
    assert on_b.events[0]["object"]["priority"] == 3
    await on_a.stop()
    await on_b.stop()


async def test_a_replica_whose_history_starts_later_answers_expired() -> None:
    a = make_feed()
    listed([a], [cr("a", "x", "chat", rv=10)], 10)
    on_a = await reader(a)
    before = on_a.events[-1]["revision"]
    # b starts (a restart, a new replica) after a change it never saw as a change.
    event([a], cr("a", "x", "chat", rv=11), deleted=True)
    b = make_feed()
    listed([b], [], 11)
    with pytest.raises(Expired, match="older"):
        b.open("summary", None, before)
    # A revision from after b's first list resumes.
    after = on_a.events[-1]["revision"]
    await on_a.settle()
    after = a.revision(a.head)
    b.open("summary", None, after)
    # Another configuration (other informers) is refused, not misread.
    c = make_feed()
    listed([c], [], 11)
    c.index.reached(JOB, GROUP, None, "11")
    with pytest.raises(Expired, match="other resources"):
        c.open("summary", None, after)
    await on_a.stop()


@pytest.mark.parametrize("odd", ["a1b2", "¹²", "012"])
async def test_a_revision_is_expired_on_another_replica_where_versions_do_not_compare(
    odd: str,
) -> None:
    a, b = make_feed(), make_feed()
    both = [a, b]
    listed(both, [cr("a", "x", "chat", rv=10)], 10)
    on_a = await reader(a)
    before = a.revision(a.head)
    changed = cr("a", "y", "code")
    changed["metadata"]["resourceVersion"] = odd  # a server that is not KEP-5504 conformant
    event(both, changed)
    await on_a.settle()
    assert on_a.changes()[-1] == ("ADDED", "code")
    # b cannot tell which of its changes such a revision had seen: 410, never a guess.
    for revision in (before, on_a.events[-1]["revision"]):
        with pytest.raises(Expired, match="not comparable"):
            b.open("summary", None, revision)
    # a resumes its own revisions by their sequence, as always.
    on_a_again = await reader(a, since=before)
    assert on_a_again.changes() == [("ADDED", "code")]
    await on_a.stop()
    await on_a_again.stop()


async def test_a_revision_is_expired_on_another_replica_where_the_limits_do_not_compare() -> None:
    a, b = make_feed(), make_feed()
    both = [a, b]
    for feed in both:
        feed.service.limits.reached("slolimits", GROUP, None, "5")
        feed.service.limits.clear("slolimits", GROUP)
    listed(both, [cr("a", "x", "chat", rv=10, priority=7)], 10)
    on_a = await reader(a, "full")
    limits = default_limits("a", 11, maxPriority=9)
    limits["metadata"]["resourceVersion"] = "¹¹"
    limits_event(both, limits)
    await on_a.settle()
    assert on_a.events[-1]["object"]["limits"] == {"maxPriority": 9}
    with pytest.raises(Expired, match="not comparable"):
        b.open("full", None, on_a.events[-1]["revision"])
    await on_a.stop()


async def test_a_position_inside_one_publication_names_the_version_before_it() -> None:
    a, b = make_feed(), make_feed()
    both = [a, b]
    listed(both, [], 10)
    # One relist publishes three changes together, at the list's version 20.
    objs = [cr("a", f"n{i}", f"r{i}", rv=15 + i) for i in range(3)]
    listed(both, objs, 20)
    first = a.log.revision(a.head - 2)  # a stream cut after the first of the three
    on_b = await reader(b, since=first)
    assert sorted(on_b.changes()) == [("ADDED", "r0"), ("ADDED", "r1"), ("ADDED", "r2")]
    await on_b.stop()


async def test_a_new_streams_initial_state_is_current_though_it_is_joined_from_cached_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("slo_api.feed.core.BLOCK", 2)
    feed = make_feed()
    index = feed.index
    for i in range(5):
        index.upsert(LLM, cr("a", f"n{i}", f"r{i}"))

    async def initial_items() -> dict[str, int]:
        r = await reader(feed)
        items = {e["route"]: e["object"]["priority"] for e in r.events if e["type"] == "ADDED"}
        await r.stop()
        return items

    assert await initial_items() == {f"r{i}": 0 for i in range(5)}
    index.upsert(LLM, cr("a", "n3", "r3", rv=2, priority=6))
    index.upsert(LLM, cr("a", "n9", "r15"))  # shifts the routes after it into other blocks
    index.delete(LLM, cr("a", "n0", "r0"))
    expected = {"r1": 0, "r15": 0, "r2": 0, "r3": 6, "r4": 0}
    assert await initial_items() == expected
    assert await initial_items() == expected  # from the cache this time


async def test_a_position_given_while_a_relist_is_still_recorded_stands_before_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("slo_api.feed.history.CHUNK", 2)
    a, b = make_feed(), make_feed()
    listed([a, b], [], 10)
    objs = [cr("a", f"n{i}", f"r{i}", rv=11 + i) for i in range(6)]
    listed([b], objs, 20)
    # a records the relist two routes per turn of the loop; a stream reads it as it goes.
    for feed in [a]:
        feed.index.reached(LLM, GROUP, None, "20")
        feed.index.replace(LLM, objs, GROUP)
    assert a.log._pending  # the rest is still to be recorded
    early = a.revision(a.head)
    on_b = await reader(b, since=early)
    # Everything of the relist that a had not recorded yet comes from b.
    assert {route for _, route in on_b.changes()} >= {f"r{i}" for i in range(2, 6)}
    await on_b.stop()


async def test_a_kind_resumed_in_the_views_history_gets_only_its_kind() -> None:
    feed = make_feed()
    index = feed.index
    everyone = await reader(feed)
    place = everyone.events[-1]["revision"]
    # Nobody followed jobs alone here: the resume reads the view's history, filtered.
    jobs = await reader(feed, kind="job", since=place)
    index.upsert(LLM, cr("a", "x", "chat"))
    index.upsert(JOB, cr("a", "j", "batch", queue={"maxDepth": 1, "promql": "up"}))
    await everyone.settle()
    await jobs.settle()
    assert everyone.changes() == [("ADDED", "chat"), ("ADDED", "batch")]
    assert jobs.changes() == [("ADDED", "batch")]
    await everyone.stop()
    await jobs.stop()


async def test_a_flush_writes_to_every_caught_up_stream_itself_without_waking_their_tasks() -> None:
    # One pass of the flusher hands the shared bytes to each stream's write: the changes are
    # written before any of the streams' tasks runs again.
    feed = make_feed()
    index = feed.index
    readers = [await reader(feed) for _ in range(3)]
    index.upsert(LLM, cr("a", "x", "chat"))  # flush_seconds 0: flushed in this call
    for r in readers:
        assert r.changes() == [("ADDED", "chat")]
    for r in readers:
        await r.stop()


async def test_a_stream_whose_write_waited_goes_on_from_there_and_the_others_are_not_held() -> None:
    feed = make_feed()
    index = feed.index
    gate = asyncio.Event()
    slow_raw: list[bytes] = []

    async def slow_write(chunk: bytes) -> None:
        await gate.wait()  # its client's socket is full until the gate opens
        slow_raw.append(chunk)

    slow_stream = feed.open("summary", None)
    slow = Reader(feed, slow_stream)
    await slow.settle()
    slow_stream.write = slow_write  # from now on its writes wait
    fast = await reader(feed)
    index.upsert(LLM, cr("a", "x", "one"))
    index.upsert(LLM, cr("a", "y", "two"))
    assert fast.changes() == [("ADDED", "one"), ("ADDED", "two")]
    assert slow_raw == []
    gate.set()
    await slow.settle()
    # Its first write went out, then everything after it in one more.
    events = [orjson.loads(line) for chunk in slow_raw for line in chunk.splitlines()]
    assert [(e["type"], e["route"]) for e in events] == [("ADDED", "one"), ("ADDED", "two")]
    assert len(slow_raw) == 2
    assert slow_stream.written == feed.head
    await slow.stop()
    await fast.stop()


async def test_a_fresh_replica_resumes_from_before_its_start_where_nothing_moved_since() -> None:
    a = make_feed()
    listed([a], [cr("a", "x", "chat", rv=10)], 10)
    on_a = await reader(a)
    before = a.revision(a.head)
    a.index.reached(LLM, GROUP, None, "15")  # a bookmark: the cluster moved on, not the kind
    # b starts later (a restart, a new replica) and lists the very same object.
    b = make_feed()
    listed([b], [cr("a", "x", "chat", rv=10)], 20)
    on_b = await reader(b, since=before)
    assert on_b.changes() == []  # nothing to replay: the client's state is b's
    event([b], cr("a", "y", "code", rv=21))
    await on_b.settle()
    assert on_b.changes() == [("ADDED", "code")]
    # Where something did move before the start, the replica cannot tell what: 410.
    for moved in (
        [cr("a", "x", "chat", rv=12, priority=3)],  # changed
        [cr("a", "x", "chat", rv=10), cr("a", "y", "code", rv=11)],  # one more
        [],  # deleted
    ):
        c = make_feed()
        listed([c], moved, 20)
        with pytest.raises(Expired, match="older"):
            c.open("summary", None, before)
    await on_a.stop()
    await on_b.stop()


async def test_a_revision_given_between_a_relists_turns_stands_before_the_whole_relist(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slo_api import index as index_module

    monkeypatch.setattr(index_module, "REPLACE_TURN", 2)
    a, b = make_feed(), make_feed()
    listed([a, b], [cr("a", f"n{i}", f"r{i}", rv=5) for i in range(6)], 5)
    on_a = await reader(a)
    relisted = [cr("a", f"n{i}", f"r{i}", rv=9, priority=i + 1) for i in range(6)]
    for feed in (a, b):
        feed.index.reached(LLM, GROUP, None, "9")
    relist = asyncio.create_task(a.index.replace_in_turns(LLM, relisted, GROUP))
    await asyncio.sleep(0)  # a is still applying it (on a copy aside)
    assert a.index.replacing
    cut_at = a.revision(a.head)
    await relist
    b.index.replace(LLM, relisted, GROUP)
    on_b = await reader(b, since=cut_at)
    assert sorted(on_b.changes()) == [("MODIFIED", f"r{i}") for i in range(6)]
    await on_a.settle()
    assert on_a.stream.ended is None  # a caught-up stream stays open through the relist
    assert len(on_a.changes()) == 6 + 6
    await on_a.stop()
    await on_b.stop()


async def test_a_change_of_a_namespaces_limits_reaches_its_routes_in_the_full_view() -> None:
    feed = make_feed()
    index = feed.index
    index.upsert(LLM, cr("a", "x", "chat", priority=7))
    index.upsert(LLM, cr("b", "y", "other", priority=7))
    r = await reader(feed, "full")
    limits = feed.service.limits
    limits.upsert(
        "slolimits", {"metadata": {"namespace": "a", "name": "default"}, "spec": {"maxPriority": 5}}
    )
    await r.settle()
    assert r.changes() == [("ADDED", "chat"), ("ADDED", "other"), ("MODIFIED", "chat")]
    [chat] = [e for e in r.events if e.get("route") == "chat" and e["type"] == "MODIFIED"]
    assert chat["object"]["limits"] == {"maxPriority": 5}
    assert chat["object"]["overLimits"] == ["priority"]
    # An SLOLimits of another name is not read: nothing changes.
    limits.upsert(
        "slolimits", {"metadata": {"namespace": "b", "name": "team"}, "spec": {"maxPriority": 1}}
    )
    index.upsert(LLM, cr("b", "y", "other", rv=2, priority=6))
    await r.settle()
    [other] = [e for e in r.events if e.get("route") == "other" and e["type"] == "MODIFIED"]
    assert "limits" not in other["object"]
    await r.stop()


def limits_event(feeds: list[Feed], obj: Obj) -> None:
    """One watch event of SLOLimits as each replica's informer applies it."""
    for feed in feeds:
        limits = feed.service.limits
        limits.reached("slolimits", GROUP, None, obj["metadata"]["resourceVersion"])
        limits.upsert("slolimits", obj, GROUP)


def default_limits(namespace: str, rv: int, **caps: int) -> Obj:
    meta = {"namespace": namespace, "name": "default", "resourceVersion": str(rv)}
    return {"metadata": meta, "spec": caps}


async def test_a_full_view_resumed_on_another_replica_goes_on_exactly_after_a_limits_change() -> (
    None
):
    a, b = make_feed(), make_feed()
    both = [a, b]
    for feed in both:
        feed.service.limits.reached("slolimits", GROUP, None, "5")
        feed.service.limits.clear("slolimits", GROUP)
    listed(both, [cr("a", "x", "chat", rv=10, priority=7)], 10)
    on_a, on_b = await reader(a, "full"), await reader(b, "full")
    # A limits change, then a client-owned one: both replicas record both.
    limits_event(both, default_limits("a", 11, maxPriority=9))
    event(both, cr("a", "x", "chat", rv=12, priority=8))
    await on_a.settle()
    assert on_a.changes()[-2:] == [("MODIFIED", "chat"), ("MODIFIED", "chat")]
    cut_at = on_a.events[-1]["revision"]
    event(both, cr("a", "x", "chat", rv=13, priority=6))
    resumed = await reader(b, "full", since=cut_at)
    # Exactly the change after the cut: no older state (priority 7 or 8) sent again.
    assert resumed.changes() == [("MODIFIED", "chat")]
    assert resumed.events[0]["object"]["priority"] == 6
    assert resumed.events[0]["object"]["limits"] == {"maxPriority": 9}
    for r in (on_a, on_b, resumed):
        await r.stop()


async def test_a_revision_names_where_the_limits_were_for_a_fresh_replica_too() -> None:
    a = make_feed()
    a.service.limits.reached("slolimits", GROUP, None, "5")
    a.service.limits.clear("slolimits", GROUP)
    limits_event([a], default_limits("a", 6, maxPriority=9))
    listed([a], [cr("a", "x", "chat", rv=10)], 10)
    on_a = await reader(a, "full")
    before = a.revision(a.head)
    # b starts later (serving full-view streams from its start) and lists the same limits.
    b = make_feed()
    earlier = await reader(b, "full")
    b.service.limits.reached("slolimits", GROUP, None, "20")
    await b.service.limits.replace_in_turns(
        "slolimits",
        [b.service.limits.entry("slolimits", default_limits("a", 6, maxPriority=9))],
        GROUP,
    )
    listed([b], [cr("a", "x", "chat", rv=10)], 20)
    on_b = await reader(b, "full", since=before)
    assert on_b.changes() == []  # nothing to replay: the client's state is b's
    # Where the limits moved before its start (changed, or gone), it cannot tell what: 410.
    for moved in ([default_limits("a", 12, maxPriority=4)], []):
        c = make_feed()
        await (await reader(c, "full")).stop()
        c.service.limits.reached("slolimits", GROUP, None, "20")
        await c.service.limits.replace_in_turns(
            "slolimits", [c.service.limits.entry("slolimits", obj) for obj in moved], GROUP
        )
        listed([c], [cr("a", "x", "chat", rv=10)], 20)
        with pytest.raises(Expired, match="older"):
            c.open("full", None, before)
    for r in (on_a, on_b, earlier):
        await r.stop()


async def test_a_revision_of_a_version_that_named_only_the_kinds_is_expired() -> None:
    old = make_feed()  # its revisions name the kinds' informers alone, as before
    listed([old], [cr("a", "x", "chat", rv=10)], 10)
    given = old.revision(old.head)
    new = make_feed()
    new.service.limits.reached("slolimits", GROUP, None, "5")
    new.service.limits.clear("slolimits", GROUP)
    listed([new], [cr("a", "x", "chat", rv=10)], 10)
    with pytest.raises(Expired, match="earlier version"):
        new.open("full", None, given)


async def test_a_quiet_limits_informer_behind_another_replicas_floor_still_resumes() -> None:
    a, b = make_feed(), make_feed()
    both = [a, b]
    for feed in both:
        limits = feed.service.limits
        limits.reached("slolimits", GROUP, None, "5")
        await limits.replace_in_turns(
            "slolimits", [limits.entry("slolimits", default_limits("a", 3, maxPriority=9))], GROUP
        )
    listed(both, [cr("a", "x", "chat", rv=10)], 10)
    on_a = await reader(a, "full")
    cut_at = a.revision(a.head)  # a's SLOLimits watch stays at 5: nothing moves there
    b.service.limits.reached("slolimits", GROUP, None, "30")  # a bookmark b got, a did not
    on_b = await reader(b, "full")  # b's full-view history starts here
    event(both, cr("a", "x", "chat", rv=31, priority=4))
    resumed = await reader(b, "full", since=cut_at)
    assert resumed.changes() == [("MODIFIED", "chat")]
    # Where the limits did move before that start, b cannot tell what: 410.
    c = make_feed()
    limits = c.service.limits
    limits.reached("slolimits", GROUP, None, "30")
    await limits.replace_in_turns(
        "slolimits", [limits.entry("slolimits", default_limits("a", 20, maxPriority=8))], GROUP
    )
    listed([c], [cr("a", "x", "chat", rv=10)], 10)
    await (await reader(c, "full")).stop()
    with pytest.raises(Expired, match="older"):
        c.open("full", None, cut_at)
    for r in (on_a, on_b, resumed):
        await r.stop()


async def _resumed_after_a_write_ahead() -> tuple[Feed, list[Reader], Reader]:
    """b's own write is stored from its answer while b's informer is still behind (a watch
    being resumed): b records it before the older events that follow. A client that read
    them all on a resumes on b."""
    a, b = make_feed(), make_feed()
    both = [a, b]
    listed(both, [cr("a", "x", "chat", rv=10), cr("a", "y", "code", rv=10)], 10)
    on_a, on_b = await reader(a), await reader(b)
    answer = {"apiVersion": f"{GROUP}/v1alpha1", **cr("a", "x", "chat", rv=14, priority=9)}
    assert b.index.write_through(LLM, answer)
    event(both, cr("a", "y", "code", rv=11, priority=2))
    event(both, cr("a", "y", "code", rv=12, priority=3))
    await on_a.settle()
    assert on_a.changes()[-2:] == [("MODIFIED", "code"), ("MODIFIED", "code")]
    resumed = await reader(b, since=on_a.events[-1]["revision"])
    return a, [on_a, on_b], resumed


async def test_a_resume_on_a_replica_whose_own_write_came_before_its_informers_events() -> None:
    _, readers, resumed = await _resumed_after_a_write_ahead()
    # The client has code's priority 3 already: only b's write, which it has not seen, and
    # never code's older priority 2 after it.
    assert resumed.changes() == [("MODIFIED", "chat")]
    assert resumed.events[0]["object"]["priority"] == 9
    for r in (*readers, resumed):
        await r.stop()


async def test_a_resume_after_a_write_ahead_of_the_watches_ends_at_the_replicas_latest_item() -> (
    None
):
    a, b = make_feed(), make_feed()
    both = [a, b]
    for feed in both:
        feed.service.limits.reached("slolimits", GROUP, None, "5")
        feed.service.limits.clear("slolimits", GROUP)
    listed(both, [cr("a", "x", "chat", rv=10, priority=7)], 10)
    on_a, on_b = await reader(a, "full"), await reader(b, "full")
    # b records its own write (without limits yet), then the limits change the client has
    # already seen on a: that change is b's only item with both.
    answer = {"apiVersion": f"{GROUP}/v1alpha1", **cr("a", "x", "chat", rv=14, priority=8)}
    assert b.index.write_through(LLM, answer)
    limits_event(both, default_limits("a", 11, maxPriority=9))
    await on_a.settle()
    cut_at = on_a.events[-1]["revision"]
    resumed = await reader(b, "full", since=cut_at)
    last = resumed.events[-1] if resumed.events[-1]["type"] != "BOOKMARK" else resumed.events[-2]
    assert last["object"]["priority"] == 8
    assert last["object"]["limits"] == {"maxPriority": 9}
    for r in (on_a, on_b, resumed):
        await r.stop()


async def test_a_line_sent_before_a_resumed_stream_caught_up_resumes_without_older_states() -> None:
    a, readers, resumed = await _resumed_after_a_write_ahead()
    assert resumed.changes() == [("MODIFIED", "chat")]
    # The client holds code's priority 3 (from a) and chat's 9 (from b). Resuming from the
    # line b sent must not bring code's older priority 2 back.
    again = await reader(a, since=resumed.events[0]["revision"])
    assert ("MODIFIED", "code") not in again.changes()
    assert again.changes() in ([], [("MODIFIED", "chat")])  # a resume may repeat its change
    for r in (*readers, resumed, again):
        await r.stop()


def test_a_publications_mark_costs_a_few_dozen_bytes_and_resolves_as_published() -> None:
    # Each change its own publication (the watch's usual pace): the mark that tells where
    # the informers were after it is kept as long as the change is, for every change.
    feed = make_feed()
    log = feed.log
    lines, first = inspect.getsourcelines(ChangeLog._mark)
    last = first + len(lines)

    def in_mark(trace: tracemalloc.Trace) -> bool:
        return any(
            f.filename.endswith("feed/history.py") and first <= f.lineno < last
            for f in trace.traceback
        )

    feed.index.reached(JOB, GROUP, None, "5")  # a second informer, that does not move
    for i in range(100):  # what grows in steps has grown some
        event([feed], cr("a", f"n{i}", f"r{i}", rv=10 + i))
    tracemalloc.start(8)
    gc.collect()  # empties the free lists too: what a freed tuple left there is not kept
    before = tracemalloc.take_snapshot()
    published: dict[int, Any] = {}
    changes = 1000
    for i in range(changes):
        event([feed], cr("a", f"n{i % 100}", f"r{i % 100}", rv=200 + i, priority=i + 1))
        published[log.seq] = log.vector(log.seq)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    held = sum(t.size for t in after.traces if in_mark(t)) - sum(
        t.size for t in before.traces if in_mark(t)
    )
    assert len(published) == changes
    assert all(len(vector) == 2 for vector in published.values())
    assert all(log.vector(seq) == vector for seq, vector in published.items())
    assert held / changes < 64, held / changes
