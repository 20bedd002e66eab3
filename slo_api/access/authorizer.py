"""One authorizer for every caller: who is calling, and what they may see and do.

A static token's role and a Kubernetes identity's RBAC are decided here, and only here:
routes ask `resolve` for the one CR they act on, `visible` for what `GET /config` lists, and
`stream` for what a change stream follows, the same way for both kinds of caller.

- A route is resolved once per request into a `Target` (kind, API group of the copy shown and
  written, namespace, name, uid) that the review, the write, the Event and the audit line reuse.
- A caller that may `get` none of the CRs claiming a route is told what it is told for a route
  that does not exist (404): no 403, 404 or 409 difference leaks which routes exist.
- Questions name the API group of the copy that is shown and written, never the kind's
  preferred group: during a migration the rights on the group that holds the CR are what count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from slo_api.access.reviews import AccessKey, Reviews, User, token_key
from slo_api.auth import Role, TokenStore
from slo_api.errors import ApiError
from slo_api.kinds.base import Kind, PoolLookup
from slo_api.kube import Kube
from slo_api.metrics import Metrics
from slo_api.service import Allowed, Service, Target
from slo_api.settings import Settings

READ_VERBS = frozenset({"get", "list", "watch"})
# Per kind name, per namespace holding its CRs, the API groups of the copies shown there.
Held = Mapping[str, Mapping[str, Iterable[str]]]


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: a plain value, asked about through the Authorizer.

    `name` is what logs, the audit line and Events show: the Kubernetes username, or
    `token:read` / `token:write` for a static token. `role` is a static token's, `user` a
    Kubernetes identity's; `key` is a hash of the token (never the token itself).
    """

    name: str
    role: Role | None = None
    user: User | None = None
    key: str = ""


class Authorizer:
    """Authenticates bearer tokens and decides every access question, for every caller."""

    def __init__(
        self,
        settings: Settings,
        kube: Kube,
        service: Service,
        tokens: TokenStore,
        metrics: Metrics,
    ) -> None:
        self.service = service
        self.kinds = {k.name: k for k in service.kinds.values()}
        self.tokens = tokens
        self.kubernetes = settings.slo_api_kubernetes_auth
        self.reviews = Reviews(settings, kube, metrics)
        self._static = {role: Caller(f"token:{role}", role=role) for role in ("read", "write")}
        authn = metrics.authentications
        self._authn = {
            (m, r): authn.labels(m, r)
            for m in ("static", "kubernetes")
            for r in ("allowed", "refused")
        }
        self._authz = metrics.authorizations
        self._decisions: dict[tuple[str, str, bool], Any] = {}

    # -- who -------------------------------------------------------------------------------

    async def authenticate(self, token: str) -> Caller:
        """The caller a bearer token stands for; 401 when it stands for none.

        A static token is known here. Any other token, when Kubernetes authentication is on,
        is sent to the API server in a TokenReview (a static token rotated out of the file
        included: it is then just an unknown token).
        """
        role = self.tokens.role_of(token)
        if role is not None:
            self._authn["static", "allowed"].inc()
            return self._static[role]
        if not self.kubernetes:
            self._authn["static", "refused"].inc()
            raise ApiError(401, "the token is not valid")
        key = token_key(token)
        user = await self.reviews.user(token, key)
        if user is None:
            self._authn["kubernetes", "refused"].inc()
            raise ApiError(401, "the token is not valid")
        self._authn["kubernetes", "allowed"].inc()
        return Caller(user.username, user=user, key=key)

    # -- one CR ----------------------------------------------------------------------------

    async def may(
        self, caller: Caller, verb: str, kind: Kind, group: str, namespace: str, name: str
    ) -> bool:
        if caller.user is None:
            allowed = verb in READ_VERBS or caller.role == "write"
            self._decided("static", verb, allowed)
            return allowed
        key = (caller.key, verb, group, kind.resource.plural, namespace, name)
        allowed = await self.reviews.allowed(caller.user, key)
        self._decided("kubernetes", verb, allowed)
        return allowed

    def _decided(self, method: str, verb: str, allowed: bool) -> None:
        key = (method, verb, allowed)
        counter = self._decisions.get(key)
        if counter is None:
            result = "allowed" if allowed else "denied"
            counter = self._decisions[key] = self._authz.labels(method, verb, result)
        counter.inc()

    async def require(self, caller: Caller, verb: str, target: Target) -> None:
        """Raise 403 unless the caller may; the message names the verb and resource, no more."""
        if await self.may(caller, verb, target.kind, target.group, target.namespace, target.name):
            return
        if caller.user is None:
            raise ApiError(403, "this token may read but not change routes")
        resource = target.resource
        raise ApiError(
            403,
            f"this identity may not {verb} {resource.plural}.{resource.group} here "
            "(ask for RBAC that grants it)",
        )

    async def resolve(self, caller: Caller, route: str) -> Target:
        """The one CR a request on `route` acts on, once the caller may read it.

        404 unless the caller may `get` at least one CR claiming the route (a route it may
        not read does not exist for it), then 409 when the route is ambiguous. A write then
        asks `require(caller, "patch", target)` about this same target.
        """
        claims = self.service.claims(route)
        for target in claims:
            if await self.may(
                caller, "get", target.kind, target.group, target.namespace, target.name
            ):
                break
        else:
            raise self.service.not_found(route)
        if len(claims) > 1:
            raise self.service.ambiguous(route, claims)
        return claims[0]

    async def pools(self, caller: Caller, target: Target) -> PoolLookup:
        """How a route's `pool` is shown to this caller: only when it may `get` that pool."""
        if caller.user is None:  # a static token reads every CR: nothing to ask
            return self.service.pool_of
        pool = self.service.pool_claim(target.namespace, target.route)
        if pool is not None and not await self.may(
            caller, "get", pool.kind, pool.group, pool.namespace, pool.name
        ):
            pool = None
        return self.service.pools_only(pool)

    # -- many CRs --------------------------------------------------------------------------

    async def visible(
        self, caller: Caller, held: Held, verbs: tuple[str, ...] = ("list",)
    ) -> Allowed | None:
        """The (kind name, namespace, API group) places, of those held, where the caller may
        `verbs`; None when it may everywhere (a static token).

        Each place counts on its own: during a migration, rights on one group in a namespace
        show that group's CRs there, whatever else the namespace holds (as GET shows a CR to
        whoever may `get` it under its own group). Cached decisions are read without
        awaiting; the rest are asked for all at once (deduplicated and bounded behind the
        reviews).
        """
        user = caller.user
        if user is None:
            return None
        questions: dict[tuple[str, str, str], list[AccessKey]] = {}
        for kind_name, spaces in held.items():
            plural = self.kinds[kind_name].resource.plural
            for namespace, groups in spaces.items():
                for group in groups:
                    questions[kind_name, namespace, group] = [
                        (caller.key, verb, group, plural, namespace, "") for verb in verbs
                    ]
        # Each decision read once: one cached now may expire before the end of this request.
        answers: dict[AccessKey, bool] = {}
        missing: list[AccessKey] = []
        for keys in questions.values():
            for key in keys:
                decision = self.reviews.cached(key)
                if decision is None:
                    missing.append(key)
                else:
                    answers[key] = decision
        if missing:
            results = await asyncio.gather(*(self.reviews.allowed(user, k) for k in missing))
            answers.update(zip(missing, results, strict=True))
        allowed: set[tuple[str, str, str]] = set()
        for place, keys in questions.items():
            ok = all(answers[k] for k in keys)
            for verb in verbs:
                self._decided("kubernetes", verb, ok)
            if ok:
                allowed.add(place)
        return frozenset(allowed)

    def stream(
        self,
        token: str,
        caller: Caller,
        kind: str | None,
        held: Callable[[], Held],
        *,
        pools: bool = False,
    ) -> CallerStream:
        """`pools`: the stream shows members' `pool` (the full view), so its allowed set
        also names where the caller may list pools (see Service.full_view)."""
        return CallerStream(self, token, caller, kind, held, pools)


class CallerStream:
    """What one change stream may follow, asked again whenever the stream wants to know.

    Holds the stream's token (in memory only, like the request that opened it) so it can be
    authenticated again once its TokenReview is older than the cache keeps it; every re-check
    is served from the caches until their times run out, then asked again.
    """

    __slots__ = ("_authz", "_held", "_kinds", "_pools", "_token", "asked", "holder")

    def __init__(
        self,
        authz: Authorizer,
        token: str,
        caller: Caller,
        kind: str | None,
        held: Callable[[], Held],
        pools: bool = False,
    ) -> None:
        self._authz = authz
        self._token = token
        self._kinds = [kind] if kind is not None else list(authz.kinds)
        # The pool kind, when the stream shows members' `pool` and does not stream pools
        # (their pairs are then asked with `list` only, as /config?view=full asks them).
        pool_kind = authz.service.pools
        self._pools = pool_kind if pools and pool_kind and pool_kind not in self._kinds else ""
        self._held = held
        # Streams are capped per Kubernetes identity; static tokens are not capped.
        self.holder: str | None = caller.user.username if caller.user is not None else None
        # The places the last answer was decided over (see StreamAccess.asked).
        self.asked: frozenset[tuple[str, str, str]] = frozenset()

    def __repr__(self) -> str:
        return f"CallerStream(holder={self.holder!r})"

    async def allowed(self) -> Allowed | None:
        """What the caller may list and watch now; None = everything (a static token).

        401 when the token is no longer valid; 403 when the caller may list and watch the
        kind in no namespace. With no CR of the kind anywhere yet, a caller that may list and
        watch it cluster-wide (under its preferred group) may follow the empty stream.
        """
        authz = self._authz
        caller = await authz.authenticate(self._token)
        held = self._held()
        asked = self._places(held)
        mine = {k: held.get(k, {}) for k in self._kinds}
        allowed = await authz.visible(caller, mine, ("list", "watch"))
        if allowed is None:
            self.asked = asked
            return allowed
        if allowed and self._pools:
            pools = await authz.visible(caller, {self._pools: held.get(self._pools, {})})
            self.asked = asked
            return allowed | (pools or frozenset())
        if allowed:
            self.asked = asked
            return allowed
        if not any(mine.values()):
            for name in self._kinds:
                kind = authz.kinds[name]
                if all(
                    [
                        await authz.may(caller, verb, kind, kind.resource.group, "", "")
                        for verb in ("list", "watch")
                    ]
                ):
                    self.asked = asked
                    return allowed
        raise ApiError(
            403,
            "this identity may not list and watch "
            + " or ".join(authz.kinds[k].resource.plural for k in self._kinds)
            + " in any namespace (ask for RBAC that grants it)",
        )

    def settled(self) -> bool:
        """Whether every place holding CRs of the stream's kinds now was asked about in the
        last answer (a namespace that gained its first CR since was not)."""
        asked = self.asked
        held = self._held()
        for name in self._followed():
            for namespace, groups in held.get(name, {}).items():
                for group in groups:
                    if (name, namespace, group) not in asked:
                        return False
        return True

    def _followed(self) -> list[str]:
        return [*self._kinds, self._pools] if self._pools else self._kinds

    def _places(self, held: Held) -> frozenset[tuple[str, str, str]]:
        return frozenset(
            (name, namespace, group)
            for name in self._followed()
            for namespace, groups in held.get(name, {}).items()
            for group in groups
        )
