"""TokenReviews and SubjectAccessReviews: cached, deduplicated and bounded.

Every answer is cached briefly, keyed by a hash of the token (never the token itself).
Identical questions asked while one is in flight share its answer (single flight): five
concurrent `GET /config` of one caller over 300 namespaces ask 300 questions, not 1,500. At
most `review_concurrency` TokenReviews, and as many SubjectAccessReviews, are in flight at once,
each kind with its own bound: a flood of unknown tokens waits for TokenReview slots only, so
it neither crowds known callers' access questions nor takes the connections that writes and
watches need. Beyond `REVIEW_QUEUE_FACTOR` times that many TokenReviews waiting, one is refused
at once (503 with Retry-After) rather than queued without end; access questions, asked only
for callers already authenticated, wait. A token that authenticated before is reviewed again
ahead of every unknown token waiting, and refused tokens are remembered in a small cache of
their own: a flood of made-up tokens neither delays nor evicts a valid caller. Every cache
operation is O(1), so a refusal costs the same after a million tokens as after one.

An answer that cannot be read (not JSON, `status` not an object, fields of the wrong type)
fails closed like an answer that never came: 503. Only the JSON boolean `true` authenticates
or allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from slo_api.bounded import BoundedDict
from slo_api.errors import ApiError
from slo_api.kube import Kube, KubeError
from slo_api.metrics import Metrics
from slo_api.settings import Settings
from slo_api.upstream import unavailable

log = logging.getLogger("slo_api.access")

K = TypeVar("K")
V = TypeVar("V")

REVIEW_QUEUE_FACTOR = 8
# How long a token that authenticated counts as a known caller's (reviewed first).
KNOWN_SECONDS = 24 * 3600.0
# (token hash, verb, group, plural, namespace, name): one access question.
AccessKey = tuple[str, str, str, str, str, str]


class TtlCache(Generic[K, V]):
    """A dict whose entries expire, holding at most `size` of them: the least recently used
    goes first, in O(1) (see BoundedDict), so a full cache costs what an empty one does."""

    def __init__(self, size: int) -> None:
        self._items: BoundedDict[K, tuple[float, V]] = BoundedDict(size)

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= time.monotonic():
            del self._items[key]
            return None
        self._items.touch(key)
        return item[1]

    def put(self, key: K, value: V, ttl: float) -> None:
        if ttl <= 0:
            return
        self._items.pop(key, None)
        self._items[key] = (time.monotonic() + ttl, value)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class User:
    """What a TokenReview said about the bearer of a token."""

    username: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def from_review(cls, user: Any) -> User:
        """Raises ValueError when the answer is not the shape a TokenReview has."""
        if not isinstance(user, dict):
            raise ValueError("status.user is not an object")
        username, uid = user.get("username", ""), user.get("uid", "")
        groups, extra = user.get("groups") or [], user.get("extra") or {}
        if not isinstance(username, str) or not isinstance(uid, str):
            raise ValueError("status.user.username or uid is not a string")
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise ValueError("status.user.groups is not a list of strings")
        if not isinstance(extra, dict) or not all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in extra.values()
        ):
            raise ValueError("status.user.extra is not a map of string lists")
        return cls(
            username=username,
            uid=uid,
            groups=tuple(groups),
            extra=tuple(sorted((str(k), tuple(v)) for k, v in extra.items())),
        )


def token_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class _Bound:
    """At most `limit` holders at once, and at most `waiting` queued behind them.

    A freed slot goes to an urgent waiter first (a caller already known), then to the others
    in turn: however many unknown tokens wait, a known caller waits for one slot only. Only
    the others count against `waiting`.
    """

    def __init__(self, what: str, limit: int, waiting: int | None = None) -> None:
        self.what = what
        self._free = limit
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._others: deque[asyncio.Future[None]] = deque()
        self._max_waiting = waiting

    @contextlib.asynccontextmanager
    async def slot(self, urgent: bool = False) -> AsyncIterator[None]:
        if self._free and not self._urgent and not self._others:
            self._free -= 1
        else:
            queue = self._urgent if urgent else self._others
            if not urgent and self._max_waiting is not None and len(queue) >= self._max_waiting:
                raise unavailable(self.what, f"more than {self._max_waiting} waiting")
            turn = asyncio.get_running_loop().create_future()
            queue.append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release()  # handed a slot just as the waiter went: pass it on
                else:
                    with contextlib.suppress(ValueError):  # already passed over
                        queue.remove(turn)
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        for queue in (self._urgent, self._others):
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1


class _SingleFlight(Generic[K, V]):
    """Concurrent calls with one key share one run of the work.

    The work runs in a task of its own: a caller that goes away (a client disconnecting)
    never cancels the answer others wait for, and the answer still reaches the cache.
    """

    def __init__(self) -> None:
        self._running: dict[K, asyncio.Task[V]] = {}

    def __len__(self) -> int:
        return len(self._running)

    async def run(self, key: K, work: Callable[[], Awaitable[V]]) -> V:
        task = self._running.get(key)
        if task is None:

            async def _run() -> V:
                return await work()

            task = asyncio.ensure_future(_run())
            self._running[key] = task
            task.add_done_callback(lambda t: self._done(key, t))
        return await asyncio.shield(task)

    def _done(self, key: K, task: asyncio.Task[V]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have gone


# Refused tokens are remembered apart, in a cache this small: a flood of made-up tokens
# cycles through it and never evicts a valid caller's review.
REFUSED_CACHE_SIZE = 1024


class Reviews:
    """The API server's answers about tokens and access, as slo-api may rely on them."""

    def __init__(self, settings: Settings, kube: Kube, metrics: Metrics) -> None:
        self.kube = kube
        self.settings = settings
        self.audiences = settings.slo_api_token_audiences
        self._users: TtlCache[str, User] = TtlCache(settings.review_cache_size)
        self._refused: TtlCache[str, bool] = TtlCache(REFUSED_CACHE_SIZE)
        # Tokens that authenticated, kept longer than their reviews: when one's review
        # expires, it is asked again ahead of unknown tokens (see _Bound).
        self._known: TtlCache[str, bool] = TtlCache(settings.review_cache_size)
        self._access: TtlCache[AccessKey, bool] = TtlCache(settings.review_cache_size)
        self._token_flights: _SingleFlight[str, User | None] = _SingleFlight()
        self._access_flights: _SingleFlight[AccessKey, bool] = _SingleFlight()
        limit = settings.review_concurrency
        self._token_bound = _Bound("TokenReview", limit, limit * REVIEW_QUEUE_FACTOR)
        # Access questions come from callers already authenticated, one per namespace of a
        # `GET /config` (hundreds at once are normal): they wait for a slot, never refused.
        self._access_bound = _Bound("SubjectAccessReview", limit)
        cache = metrics.review_cache
        self._cache = {
            (c, r): cache.labels(c, r) for c in ("token", "access") for r in ("hit", "miss")
        }
        self._errors = {
            "token": metrics.authentications.labels("kubernetes", "error"),
            "access": metrics.authorizations,
        }

    # -- tokens ----------------------------------------------------------------------------

    async def user(self, token: str, key: str) -> User | None:
        """Who the bearer of `token` is, or None when the API server refuses the token."""
        user = self._users.get(key)
        if user is not None:
            self._cache["token", "hit"].inc()
            return user
        if self._refused.get(key) is not None:
            self._cache["token", "hit"].inc()
            return None
        self._cache["token", "miss"].inc()
        return await self._token_flights.run(key, lambda: self._review_token(token, key))

    async def _review_token(self, token: str, key: str) -> User | None:
        try:
            async with self._token_bound.slot(urgent=self._known.get(key) is not None):
                status = await self.kube.review_token(token, self.audiences)
            user = User.from_review(status.get("user") or {})
            granted = status.get("audiences") or []
            if not isinstance(granted, list):
                raise ValueError("status.audiences is not a list")
        except (KubeError, ValueError) as exc:
            self._errors["token"].inc()
            raise unavailable("TokenReview", exc) from None
        except ApiError:
            self._errors["token"].inc()
            raise
        if (
            status.get("authenticated") is not True
            or not user.username
            or (self.audiences and not set(granted).intersection(self.audiences))
        ):
            self._refused.put(key, True, self.settings.token_refused_seconds)
            return None
        self._users.put(key, user, self.settings.token_review_seconds)
        self._known.put(key, True, KNOWN_SECONDS)
        return user

    # -- access ----------------------------------------------------------------------------

    def cached(self, key: AccessKey) -> bool | None:
        """A decision already known, read without awaiting; None when it must be asked."""
        decision = self._access.get(key)
        if decision is not None:
            self._cache["access", "hit"].inc()
        return decision

    async def allowed(self, user: User, key: AccessKey) -> bool:
        decision = self.cached(key)
        if decision is not None:
            return decision
        self._cache["access", "miss"].inc()
        return await self._access_flights.run(key, lambda: self._review_access(user, key))

    async def _review_access(self, user: User, key: AccessKey) -> bool:
        _, verb, group, resource, namespace, name = key
        attributes = {"group": group, "resource": resource, "verb": verb, "namespace": namespace}
        if name:
            attributes["name"] = name
        spec = {
            "user": user.username,
            "uid": user.uid,
            "groups": list(user.groups),
            "extra": {k: list(v) for k, v in user.extra},
            "resourceAttributes": attributes,
        }
        try:
            async with self._access_bound.slot():
                status = await self.kube.review_access(spec)
        except (KubeError, ApiError) as exc:
            self._errors["access"].labels("kubernetes", verb, "error").inc()
            if isinstance(exc, ApiError):
                raise
            raise unavailable("SubjectAccessReview", exc) from None
        allowed = status.get("allowed") is True and status.get("denied") is not True
        ttl = (
            self.settings.access_allowed_seconds if allowed else self.settings.access_denied_seconds
        )
        self._access.put(key, allowed, ttl)
        return allowed
