"""The open change streams: who they are, how many each identity holds, and their access.

A stream's access is checked again on a timer of its own (not on bookmarks): the caller's
token may be revoked or its RoleBinding removed while the stream stays open for hours. The
check runs through a few workers in turn, not a task per stream. A check that finds the
caller's rights unchanged keeps the stream open, its view widened in place to namespaces that
gained their first CRs since; a stream ends when the caller lost access, or when its access
could not be checked (5xx) for `review_grace` seconds (resumable).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import NamedTuple, Protocol

from slo_api.errors import ApiError
from slo_api.feed.history import Floor, History
from slo_api.feed.pump import Pump, Write
from slo_api.index import Source
from slo_api.service import Allowed

Place = tuple[str, str, str]  # (kind name, namespace, API group): where access is asked about

log = logging.getLogger("slo_api.feed")

ACCESS_WORKERS = 8  # at most this many access checks at once


class StreamAccess(Protocol):
    """What a stream needs to know about its caller, now and while it stays open."""

    # The identity the per-identity stream cap counts; None: not capped (static tokens).
    holder: str | None

    @property
    def asked(self) -> frozenset[Place]:
        """The places the last `allowed()` answer was decided over (those holding CRs of
        the stream's kinds then); set when that answer is returned, not before."""
        ...

    async def allowed(self) -> Allowed | None:
        """What the caller may list and watch now; None = everything (a static token).

        Raises ApiError(401, code "unauthorized") when the token is no longer valid and
        ApiError(403, code "forbidden") when the caller may no longer list+watch anywhere.
        """
        ...

    def settled(self) -> bool:
        """Whether every place holding CRs of the stream's kinds now was asked about."""
        ...


class Ending(NamedTuple):
    """A stream to end, with the code (one of errors.STREAM_ERRORS) and message of its ERROR."""

    stream: Stream
    code: str
    message: str


class TooManyStreams(Exception):
    pass


class Stream:
    """One open stream: what it asked for, and how far through its history it has written."""

    # A flush reads a dozen of these for each of thousands of streams: slots keep them in
    # the object itself, in a few cache lines.
    __slots__ = (
        "access",
        "allowed",
        "bookmarks",
        "cancelled",
        "checking",
        "cursor",
        "ended",
        "finished",
        "floor",
        "gone",
        "history",
        "holder",
        "initial",
        "kind",
        "places",
        "pump",
        "reached",
        "resent",
        "retired",
        "serving",
        "sse",
        "task",
        "unanswered_since",
        "view",
        "write",
        "writing_upto",
        "written",
    )

    def __init__(
        self,
        history: History,
        kind: str | None,
        sse: bool,
        cursor: int,
        access: StreamAccess | None,
        allowed: Allowed | None,
        initial: bool,
    ) -> None:
        self.history = history
        self.view = history.view
        # Usually the history's kind; a resume of a kind this replica never followed alone
        # reads the view's history, filtered.
        self.kind = kind
        self.sse = sse
        self.access = access
        self.allowed = allowed
        self.holder = access.holder if access is not None else None
        self.initial = initial
        # Read up to (handed to a write); the position written is `written`, never more.
        self.cursor = cursor
        self.written: int | None = None if initial else cursor
        self.bookmarks = 0
        # Resumed from another process's revision: the versions it had reached per informer,
        # whose changes it is not sent again (see ChangeLog.parse); None once none can follow.
        # And the routes it was sent a change of since: their later changes are this process's
        # later items (they may show what the revision had reached with what it had not).
        self.reached: dict[Source, int] | None = None
        # And that revision's versions with the objects held there, for the life of the
        # stream: no position it is given names less (ChangeLog.revision).
        self.floor: Floor | None = None
        self.resent: set[str] = set()
        # Why the server ended it: (code, message); None while it runs.
        self.ended: tuple[str, str] | None = None
        self.gone = False  # the client went away
        # The index's places_version at which the stream's access was last found to cover
        # every place of its kinds; a check of its access under way; since when its checks
        # fail for want of an answer (5xx), None while they are answered.
        self.places = -1
        self.checking = False
        self.unanswered_since: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.serving = False  # inside Feed.serve: may be cancelled to end it
        self.cancelled = False  # the feed cancelled its task (not the server)
        self.retired = False  # its lifetime is over: it ends with a final bookmark
        # Past its initial state: how the flusher writes to it, the write under way when the
        # client's socket was full (the next bytes wait for it), the position that write
        # brings it to, and what its task waits for until the stream is over.
        self.write: Write | None = None
        self.pump: Pump | None = None
        self.writing_upto = 0
        self.finished: asyncio.Future[None] | None = None


class Registry:
    def __init__(self, max_streams: int, per_identity: int, review_grace: float = 300.0) -> None:
        self.max_streams = max_streams
        self.per_identity = per_identity
        self.review_grace = review_grace
        self.streams: set[Stream] = set()
        self._held: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.streams)

    def add(self, stream: Stream) -> None:
        if len(self.streams) >= self.max_streams:
            raise TooManyStreams(f"{self.max_streams} change streams are open already")
        holder = stream.holder
        if holder is not None and self._held[holder] >= self.per_identity:
            raise TooManyStreams(
                f"this identity has {self.per_identity} change streams open already"
            )
        self.streams.add(stream)
        if holder is not None:
            self._held[holder] += 1

    def discard(self, stream: Stream) -> None:
        if stream not in self.streams:
            return
        self.streams.remove(stream)
        holder = stream.holder
        if holder is not None:
            self._held[holder] -= 1
            if not self._held[holder]:
                del self._held[holder]

    def on(self, history: History) -> list[Stream]:
        return [s for s in self.streams if s.history is history]

    async def recheck(self) -> list[Ending]:
        """Ask each stream's access again; the streams to end, with an ERROR code and message."""
        pending = [
            s for s in self.streams if s.access is not None and s.ended is None and not s.checking
        ]
        verdicts: list[Ending] = []

        async def worker() -> None:
            while pending:
                ending = await self.check(pending.pop())
                if ending is not None:
                    verdicts.append(ending)

        await asyncio.gather(*(worker() for _ in range(ACCESS_WORKERS)))
        return verdicts

    async def check(self, stream: Stream) -> Ending | None:
        """Ask one stream's access again: None while it goes on (its view widened in place
        when namespaces gained their first CRs), else why it ends."""
        access = stream.access
        assert access is not None
        before = access.asked
        stream.checking = True
        try:
            allowed = await access.allowed()
        except ApiError as exc:
            if exc.status in (401, 403):
                return Ending(stream, exc.code, exc.message)
            # Not an answer about this caller (the API server is down): keep the stream for
            # the grace, as a request would be retried.
            return self._unanswered(stream, exc.message)
        except Exception:
            log.exception("a change stream's access check failed")
            return self._unanswered(stream, "the check failed")
        finally:
            stream.checking = False
        stream.unanswered_since = None
        return _judged(stream, allowed, before, access.asked)

    def _unanswered(self, stream: Stream, why: str) -> Ending | None:
        now = asyncio.get_running_loop().time()
        if stream.unanswered_since is None:
            stream.unanswered_since = now
        log.warning("a change stream's access could not be checked: %s", why)
        if now - stream.unanswered_since < self.review_grace:
            return None
        return Ending(
            stream,
            code="unavailable",
            message=f"this identity's access could not be checked for {self.review_grace:g} s; "
            "watch again with since",
        )


def _judged(
    stream: Stream, allowed: Allowed | None, before: frozenset[Place], after: frozenset[Place]
) -> Ending | None:
    """Whether a stream whose caller may now list `allowed` goes on, asked about the places
    `after` (those holding CRs now), `before` at its previous check.

    It goes on when its rights are the same where they were asked about both times: places
    that gained their first CRs since join its view in place (a change there is written only
    once they are asked about, see Feed._deliver), and places emptied stay in it (the
    DELETED of their last CR may still be on its way). Rights lost where CRs are, or gained
    where CRs were already (the stream never had them), end it: watch again."""
    current = stream.allowed
    if allowed == current:
        return None
    if allowed is not None and current is not None:
        lost = current - allowed
        gained = allowed - current
        if not any(p in after for p in lost) and not any(p in before for p in gained):
            stream.allowed = allowed | lost
            return None
    return Ending(
        stream,
        code="expired",
        message="what this identity may list changed; watch again without since",
    )
