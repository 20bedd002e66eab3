"""Who is calling, and what they may do: a static token's role, or a Kubernetes identity.

A bearer token that is not one of the static tokens is, when Kubernetes authentication is on,
sent to the API server in a TokenReview; each request of such a caller is then authorized with
a SubjectAccessReview on the CR it touches, so slo-api never grants more than the cluster's RBAC
does. Both reviews are cached briefly, keyed by a hash of the token (never the token itself),
and a review the API server cannot answer fails the request closed: 503, never allowed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from slo_api.auth import Role, TokenStore
from slo_api.errors import ApiError
from slo_api.kinds.base import Kind
from slo_api.kube import Kube, KubeError
from slo_api.metrics import Metrics
from slo_api.settings import Settings

log = logging.getLogger("slo_api.identity")

K = TypeVar("K")
V = TypeVar("V")

READ_VERBS = frozenset({"get", "list", "watch"})
RETRY_AFTER_SECONDS = 5


class TtlCache(Generic[K, V]):
    """A dict whose entries expire, holding at most `size` of them (the oldest go first)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: dict[K, tuple[float, V]] = {}

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= time.monotonic():
            del self._items[key]
            return None
        return item[1]

    def put(self, key: K, value: V, ttl: float) -> None:
        if ttl <= 0:
            return
        self._items.pop(key, None)
        if len(self._items) >= self.size:
            now = time.monotonic()
            for stale in [k for k, (expires, _) in self._items.items() if expires <= now]:
                del self._items[stale]
            while len(self._items) >= self.size:
                del self._items[next(iter(self._items))]
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
    def from_review(cls, user: dict[str, Any]) -> User:
        extra = user.get("extra") or {}
        return cls(
            username=str(user.get("username") or ""),
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(x) for x in v)) for k, v in extra.items())),
        )


class Caller:
    """The one place that knows who a request comes from and what it may touch.

    `name` is what logs, the audit line and Events show: the Kubernetes username, or
    `token:read` / `token:write` for a static token. A static-token caller keeps its role's
    rights and is never sent to a SubjectAccessReview.
    """

    __slots__ = ("_gate", "key", "name", "role", "user")

    def __init__(
        self,
        name: str,
        role: Role | None = None,
        user: User | None = None,
        key: str | None = None,
        gate: Gatekeeper | None = None,
    ) -> None:
        self.name = name
        self.role = role
        self.user = user
        self.key = key
        self._gate = gate

    @property
    def static(self) -> bool:
        return self.user is None

    async def may(self, verb: str, kind: Kind, namespace: str, name: str) -> bool:
        if self._gate is None or self.user is None:
            return verb in READ_VERBS or self.role == "write"
        return await self._gate.may(self, verb, kind, namespace, name)

    async def may_list(self, kind_name: str, namespace: str) -> bool:
        if self._gate is None or self.user is None:
            return True
        return await self._gate.may(self, "list", self._gate.kinds[kind_name], namespace, "")

    async def require(self, verb: str, kind: Kind, namespace: str, name: str) -> None:
        """Raise 403 unless the caller may; the message names the verb and kind, no more."""
        if not await self.may(verb, kind, namespace, name):
            resource = kind.resource
            raise ApiError(
                403,
                f"this identity may not {verb} {resource.plural}.{resource.group} here "
                "(ask for RBAC that grants it)",
            )

    async def listable(self, namespaces: Mapping[str, Iterable[str]]) -> frozenset[tuple[str, str]]:
        """The (kind name, namespace) pairs, of those given, where the caller may `list`.

        Cached decisions are read without awaiting; the rest are asked for all at once.
        """
        if self._gate is None or self.user is None:
            return frozenset((k, ns) for k, spaces in namespaces.items() for ns in spaces)
        return await self._gate.listable(self, namespaces)


# Stands for a refused token in the token cache (a Caller no request ever gets).
_REFUSED = Caller("refused")


def _unavailable(what: str, exc: KubeError) -> ApiError:
    log.error("%s failed, refusing the request: %s", what, exc)
    return ApiError(
        503,
        f"cannot check the caller's access: the Kubernetes API server did not answer the {what}",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        code="unavailable",
    )


class Gatekeeper:
    """Authenticates bearer tokens and answers access questions, with bounded caches."""

    def __init__(
        self,
        settings: Settings,
        kube: Kube,
        kinds: list[Kind],
        tokens: TokenStore,
        metrics: Metrics,
    ) -> None:
        self.kube = kube
        self.kinds = {k.name: k for k in kinds}
        self.tokens = tokens
        self.kubernetes = settings.slo_api_kubernetes_auth
        self.audiences = settings.token_audiences
        self.settings = settings
        # A refused token is remembered as _REFUSED: None means "not asked yet".
        self._tokens: TtlCache[str, Caller] = TtlCache(settings.review_cache_size)
        self._access: TtlCache[tuple[str, str, str, str, str, str], bool] = TtlCache(
            settings.review_cache_size
        )
        self._static = {role: Caller(f"token:{role}", role=role) for role in ("read", "write")}
        authn, cache = metrics.authentications, metrics.review_cache
        self._authn = {
            (m, r): authn.labels(m, r)
            for m in ("static", "kubernetes")
            for r in ("allowed", "refused", "error")
        }
        self._cache = {
            (c, r): cache.labels(c, r) for c in ("token", "access") for r in ("hit", "miss")
        }
        self._authz = metrics.authorizations
        self._decisions: dict[tuple[str, bool], Any] = {}

    # -- authentication --------------------------------------------------------------------

    async def authenticate(self, token: str) -> Caller:
        role = self.tokens.role_of(token)
        if role is not None:
            self._authn["static", "allowed"].inc()
            return self._static[role]
        if not self.kubernetes:
            self._authn["static", "refused"].inc()
            raise ApiError(401, "the token is not valid")
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._tokens.get(key)
        if cached is None:
            self._cache["token", "miss"].inc()
            cached = await self._review(token, key)
        else:
            self._cache["token", "hit"].inc()
        if cached is _REFUSED:
            self._authn["kubernetes", "refused"].inc()
            raise ApiError(401, "the token is not valid")
        self._authn["kubernetes", "allowed"].inc()
        return cached

    async def _review(self, token: str, key: str) -> Caller:
        try:
            status = await self.kube.review_token(token, self.audiences)
        except KubeError as exc:
            self._authn["kubernetes", "error"].inc()
            raise _unavailable("TokenReview", exc) from None
        user = User.from_review(status.get("user") or {})
        granted = set(status.get("audiences") or ())
        if (
            not status.get("authenticated")
            or not user.username
            or (self.audiences and not granted.intersection(self.audiences))
        ):
            self._tokens.put(key, _REFUSED, self.settings.token_refused_seconds)
            return _REFUSED
        caller = Caller(user.username, user=user, key=key, gate=self)
        self._tokens.put(key, caller, self.settings.token_review_seconds)
        return caller

    # -- authorization ---------------------------------------------------------------------

    def _access_key(
        self, caller: Caller, verb: str, kind: Kind, namespace: str, name: str
    ) -> tuple[str, str, str, str, str, str]:
        return (caller.key or "", verb, kind.resource.group, kind.resource.plural, namespace, name)

    async def may(self, caller: Caller, verb: str, kind: Kind, namespace: str, name: str) -> bool:
        key = self._access_key(caller, verb, kind, namespace, name)
        allowed = self._access.get(key)
        if allowed is None:
            self._cache["access", "miss"].inc()
            allowed = await self._review_access(caller, key)
        else:
            self._cache["access", "hit"].inc()
        self._decided(verb, allowed)
        return allowed

    def _decided(self, verb: str, allowed: bool) -> None:
        key = (verb, allowed)
        counter = self._decisions.get(key)
        if counter is None:
            result = "allowed" if allowed else "denied"
            counter = self._decisions[key] = self._authz.labels("kubernetes", verb, result)
        counter.inc()

    async def _review_access(
        self, caller: Caller, key: tuple[str, str, str, str, str, str]
    ) -> bool:
        assert caller.user is not None
        _, verb, group, resource, namespace, name = key
        attributes = {"group": group, "resource": resource, "verb": verb, "namespace": namespace}
        if name:
            attributes["name"] = name
        user = caller.user
        spec = {
            "user": user.username,
            "uid": user.uid,
            "groups": list(user.groups),
            "extra": {k: list(v) for k, v in user.extra},
            "resourceAttributes": attributes,
        }
        try:
            status = await self.kube.review_access(spec)
        except KubeError as exc:
            self._authz.labels("kubernetes", verb, "error").inc()
            raise _unavailable("SubjectAccessReview", exc) from None
        allowed = bool(status.get("allowed")) and not status.get("denied")
        ttl = (
            self.settings.access_allowed_seconds if allowed else self.settings.access_denied_seconds
        )
        self._access.put(key, allowed, ttl)
        return allowed

    async def listable(
        self, caller: Caller, namespaces: Mapping[str, Iterable[str]]
    ) -> frozenset[tuple[str, str]]:
        allowed: set[tuple[str, str]] = set()
        missing: list[tuple[str, str]] = []
        for kind_name, spaces in namespaces.items():
            kind = self.kinds[kind_name]
            for namespace in spaces:
                decision = self._access.get(self._access_key(caller, "list", kind, namespace, ""))
                if decision is None:
                    missing.append((kind_name, namespace))
                    continue
                self._cache["access", "hit"].inc()
                self._decided("list", decision)
                if decision:
                    allowed.add((kind_name, namespace))
        if missing:
            answers = await asyncio.gather(*(caller.may_list(k, ns) for k, ns in missing))
            allowed.update(pair for pair, ok in zip(missing, answers, strict=True) if ok)
        return frozenset(allowed)
