"""The use cases behind the routes: resolve a route, read it, change it, reset it, list them."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import orjson

from slo_api.errors import ApiError, invalid
from slo_api.index import CRIndex, IndexedKind, resource_version, uid_of
from slo_api.kinds.base import Kind, Obj, PoolLookup, spec, without_unchanged
from slo_api.kinds.pool import status_view
from slo_api.kube import Kube, KubeError, Resource
from slo_api.limits import Limits
from slo_api.ownership import NOTHING, Owner, Ownership
from slo_api.upstream import to_api_error

# A write recomputed after a lost race this many times in a row gives up with 409. Each writer
# that loses to another one re-reads: N writers racing on one CR need up to N attempts.
WRITE_ATTEMPTS = 5
STALE_ETAG = "the route changed since the ETag you sent: read it again and retry"


# Where a caller may list (and, for a stream, watch): (kind name, namespace, API group).
Allowed = frozenset[tuple[str, str, str]]
# (kind name, namespace, API group of the copy shown) of each CR claiming a route.
Owners = tuple[tuple[str, str, str], ...]
# The GitOps owners remembered for a CR (see Ownership.carry), asked with the CR as it is now.
Remembered = Callable[[Obj], Mapping[str, Owner]]


def shown(owners: Owners, kind: str | None, allowed: Allowed | None) -> bool:
    """The visibility rule of a route, for /config and its stream alike: claimed by a CR of
    the kind asked for (any kind without one), and by at least one CR the caller may list
    under that CR's own API group in its namespace, whatever else the namespace holds (of any
    kind: an ambiguous route is listed as such to whoever may see one of its CRs). The rule
    GET follows too: `get` on the group of the copy shown."""
    if not owners:
        return False
    if kind is not None and all(k != kind for k, _, _ in owners):
        return False
    return allowed is None or any(owner in allowed for owner in owners)


@dataclass(frozen=True)
class Target:
    """The one CR a route resolved to, once per request.

    The review, the write, the Event and the audit line all use this one resolution, so what
    was checked is what is written: `group` is the API group of the copy shown (the one the
    index holds and the write goes to), `uid` that copy's uid.
    """

    route: str
    kind: Kind
    group: str
    namespace: str
    name: str
    uid: str
    obj: Obj

    @classmethod
    def of(cls, route: str, kind: Kind, obj: Obj) -> Target:
        meta = obj.get("metadata") or {}
        return cls(
            route,
            kind,
            kind.resource_of(obj).group,
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
            obj,
        )

    @property
    def resource(self) -> Resource:
        """Where the CR lives: writes go to the API group that holds the copy shown."""
        return self.kind.resources[self.group]

    @property
    def api_version(self) -> str:
        return f"{self.resource.group}/{self.resource.version}"


@dataclass(frozen=True)
class Result:
    body: Obj
    etag: str
    changed: list[str]
    # The CR as stored after the request (what a write's Event names, by uid and version).
    stored: Obj
    # A write's: the CR the patch was conditional on (exactly the version it changed).
    before: Obj | None = None
    # A forced write: the GitOps-owned fields it changed anyway (each tool will revert them).
    forced: list[Owner] = field(default_factory=list)

    def forced_over(self) -> str:
        """The managers a forced write overrode, with their fields, for the audit and Event."""
        return "; ".join(
            f"{manager} ({', '.join(o.field for o in self.forced if o.manager == manager)})"
            for manager in sorted({o.manager for o in self.forced})
        )


def _lost_race(exc: KubeError) -> bool:
    """The CR changed, or is another CR, since the version a patch was computed from.

    A stale resourceVersion is 409; another uid with the same version (not seen in practice,
    as a re-created CR has a new version) is a 422 on metadata.uid.
    """
    if exc.status == 409:
        return True
    return exc.status == 422 and any(c.get("field") == "metadata.uid" for c in exc.causes)


def etag_of(obj: Obj) -> str:
    """A route's strong ETag: its CR's resourceVersion, quoted."""
    return f'"{resource_version(obj)}"'


def weak_etag(body: bytes) -> str:
    """A page's weak ETag: a hash of the page's bytes."""
    return 'W/"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


def parse_if_match(header: str | None) -> str | None:
    """The resourceVersion an If-Match names; "*" -> "" (exists is enough); None when absent."""
    if header is None:
        return None
    value = header.strip()
    if value == "*":
        return ""
    if value.startswith("W/"):
        raise ApiError(412, "If-Match needs a strong ETag from GET /routes/{route}")
    if len(value) < 3 or not (value.startswith('"') and value.endswith('"')) or "," in value:
        raise invalid('If-Match must be one ETag such as "12345", or *', field="If-Match")
    return value[1:-1]


def field_managed(kind: Kind, owners: list[Owner]) -> ApiError:
    """The 409 of a write that a GitOps tool would revert: nothing was written."""
    names = [kind.api_field(o.field) for o in owners]
    managers = sorted({o.manager for o in owners})
    # Said of the first field (the error's), the others named after it.
    others = names[1:]
    also = f", as {'is' if len(others) == 1 else 'are'} {', '.join(others)}" if others else ""
    message = (
        f"{names[0]} is managed by {', '.join(managers)}{also}, which would revert this change "
        "at its next sync: make the change in the source it syncs from (Git, the chart's "
        "values), or send force=true to write it anyway"
    )
    return ApiError(
        409,
        message,
        code="field_managed",
        field=names[0],
        causes=[
            {
                "field": name,
                "manager": o.manager,
                "operation": o.operation,
                "time": o.time,
                "message": f"{name} is managed by {o.manager}" + _overridden(o),
            }
            for name, o in zip(names, owners, strict=True)
        ],
    )


def _overridden(owner: Owner) -> str:
    """What a remembered owner's cause adds: who changed the field since the tool applied it."""
    if owner.overridden_by is None:
        return ""
    by = owner.overridden_by or "a change that removed it"
    return f" (changed since by {by}; {owner.manager} has not applied it since)"


def _nothing_remembered(obj: Obj) -> Mapping[str, Owner]:
    return NOTHING


class Service:
    def __init__(
        self,
        kube: Kube,
        kinds: list[Kind],
        index: CRIndex,
        ownership: Ownership | None = None,
        remembered: Remembered | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.kube = kube
        self.kinds = {k.resource.plural: k for k in kinds}
        self.index = index
        self.ownership = ownership or Ownership()
        # The owners a forced write or a kubectl edit took a field from, still in force: the
        # route's history remembers them (managedFields alone forgets them at once).
        self.remembered: Remembered = remembered or _nothing_remembered
        self.limits = limits or Limits()
        # A route's body shows its namespace's limits: cached renders follow them, and the
        # change log hears which informer's version caused it (revisions name it).
        limits_ = self.limits
        self.limits.subscribe(lambda namespaces: index.refresh(namespaces, limits_.cause))
        # How many routes are stored beyond their limits, until a CR or a limit changes.
        self._over_limits: int | None = None
        index.subscribe(self._recount)
        self.limits.subscribe(self._recount)
        # The kind whose CRs list others as members (pools): what a member's `pool` shows.
        self.pools = next((k.name for k in kinds if k.groups_routes), "")
        self._pool_plural = next((k.resource.plural for k in kinds if k.groups_routes), "")
        # Told of each stored write's answer before the index stores it, with the state it was
        # made on (its precondition) and the kind (the route history notes the resourceVersion
        # its caller made and from what, for when the watch brings the change).
        self.on_written: Callable[[Obj, Obj, Kind], None] = _ignore

    def full_view(self, claims: Owners, allowed: Allowed | None) -> str:
        """The line view of a route's full item for a caller who may list `allowed` (None:
        everything), the route claimed by `claims`: a member's `pool` is shown only where the
        caller may list (so read) the pools of its namespace, under each API group whose pools
        are shown there (which of them lists the member is not looked up per line). The one
        rule for `/config?view=full` and its change stream alike."""
        if allowed is None or len(claims) != 1:
            return "full"
        namespace = claims[0][1]
        groups = self.index.groups_in(self._pool_plural, namespace) if self.pools else []
        if groups and all((self.pools, namespace, g) in allowed for g in groups):
            return "full"
        return "full-unpooled"

    @staticmethod
    def index_for(kinds: list[Kind], ownership: Ownership | None = None) -> CRIndex:
        return CRIndex(
            (
                IndexedKind(
                    k.name,
                    k.resource.plural,
                    k.route_of,
                    k.members_of if k.groups_routes else None,
                    k.groups,
                )
                for k in kinds
            ),
            (ownership or Ownership()).trim,
        )

    # -- resolving -------------------------------------------------------------------------

    def claims(self, route: str) -> list[Target]:
        """Every CR claiming a route (none, one, or more when it is ambiguous)."""
        return [
            Target.of(route, self.kinds[plural], obj) for plural, obj in self.index.claims(route)
        ]

    @staticmethod
    def not_found(route: str) -> ApiError:
        return ApiError(404, f"route {route!r} is not registered")

    def ambiguous(self, route: str, claims: list[Target]) -> ApiError:
        kinds = sorted({t.kind.name for t in claims})
        return ApiError(
            409,
            f"route {route!r} is claimed by {len(claims)} CRs ({', '.join(kinds)}); "
            "it is ambiguous until all but one are removed or renamed",
        )

    def pool_claim(self, namespace: str, member: str) -> Target | None:
        """The pool an LLM or job route shows: the first one listing it as a member."""
        for plural, pool in self.index.groups_with_member(namespace, member):
            kind = self.kinds[plural]
            return Target.of(kind.route_of(pool), kind, pool)
        return None

    def pool_of(self, namespace: str, member: str) -> Obj | None:
        """The read-only `pool` of an LLM or job route: the first pool listing it as member."""
        pool = self.pool_claim(namespace, member)
        return None if pool is None else self._pool_view(pool, member)

    def pools_only(self, shown: Target | None) -> PoolLookup:
        """A pool lookup that shows `shown` (the pool a caller may read) and no other."""

        def lookup(namespace: str, member: str) -> Obj | None:
            pool = self.pool_claim(namespace, member)
            if (
                pool is None
                or shown is None
                or (pool.namespace, pool.name)
                != (
                    shown.namespace,
                    shown.name,
                )
            ):
                return None
            return self._pool_view(pool, member)

        return lookup

    @staticmethod
    def _pool_view(pool: Target, member: str) -> Obj:
        status = status_view(pool.obj)
        return {
            "route": pool.route,
            "resident": status["residentMember"] == member,
            "phase": status["phase"],
        }

    def project(self, kind: Kind, obj: Obj, pools: PoolLookup | None = None) -> Obj:
        body = kind.project(obj, self.pool_of if pools is None else pools)
        managed = self.managed(kind, obj)
        if managed:
            body["managed"] = managed
        body.update(self.limits.view(kind.name, obj))
        return body

    def gitops_owners(self, obj: Obj) -> dict[str, Owner]:
        """The GitOps owners of the CR's client-owned fields: those in its managedFields and
        the remembered ones still in force. What GET shows and what a write is checked on."""
        return self.ownership.owners(obj, self.remembered(obj))

    def _recount(self, _: set[str]) -> None:
        self._over_limits = None

    def routes_over_limits(self) -> int:
        """How many routes have a CR stored beyond its namespace's limits (`overLimits`)."""
        if self._over_limits is None:
            over = set()
            for plural, obj in self.index.placed_objects(self.limits.capped()):
                kind = self.kinds[plural]
                if "overLimits" in self.limits.view(kind.name, obj):
                    over.add(kind.route_of(obj))
            self._over_limits = len(over)
        return self._over_limits

    def managed(self, kind: Kind, obj: Obj) -> dict[str, str]:
        """Read-only `managed`: each client-owned field a GitOps tool owns, and that tool."""
        owners = self.gitops_owners(obj)
        return {kind.api_field(f): owners[f].manager for f in sorted(owners)}

    # -- reads -----------------------------------------------------------------------------

    async def read(self, target: Target, pools: PoolLookup | None = None) -> Result:
        obj = await self._fresh(target)
        return Result(self.project(target.kind, obj, pools), etag_of(obj), [], obj)

    async def _fresh(self, target: Target) -> Obj:
        """The CR as the API server holds it now, if it still claims the route.

        The index can lag (milliseconds normally, longer while a watch backs off): a CR whose
        serviceId changed, or one deleted and re-created for another service, is no longer
        the route's, whatever the index says.
        """
        try:
            obj = await self.kube.get(target.resource, target.namespace, target.name)
        except KubeError as exc:
            raise to_api_error(exc, target.kind, target.obj) from None
        if target.kind.route_of(obj) != target.route:
            raise self.not_found(target.route)
        return obj

    # -- writes ----------------------------------------------------------------------------

    async def write(
        self,
        target: Target,
        data: Obj,
        *,
        if_match: str | None,
        dry_run: bool,
        pools: PoolLookup | None = None,
        force: bool = False,
    ) -> Result:
        sent_route = data.get("route")
        if sent_route is not None and sent_route != target.route:
            raise invalid(
                f"{sent_route!r} in the body differs from the URL's {target.route!r}",
                field="route",
            )
        body = target.kind.parse(data)
        return await self._apply(
            target,
            lambda current: target.kind.spec_patch(body, current, self.pool_of),
            if_match,
            dry_run,
            pools,
            force,
        )

    async def reset(
        self,
        target: Target,
        *,
        if_match: str | None,
        dry_run: bool,
        pools: PoolLookup | None = None,
        force: bool = False,
    ) -> Result:
        return await self._apply(target, target.kind.reset_patch, if_match, dry_run, pools, force)

    async def _apply(
        self,
        target: Target,
        changes: Callable[[Obj], Obj],
        if_match: str | None,
        dry_run: bool,
        pools: PoolLookup | None,
        force: bool = False,
    ) -> Result:
        """Patch the route's CR with what `changes(current)` changes, computed from the very
        object the patch is conditional on (its uid and resourceVersion).

        The index's copy is tried first (no extra round trip when it is current). A lost race
        (409: the CR changed, or is another CR now) reads the CR again, checks it still claims
        the route, and recomputes, a bounded number of times. With If-Match, the client's
        version is the only one a write may apply to. A write that changes nothing sends no
        patch: the answer is the CR as the API server holds it (read fresh, since the index's
        copy may lag and the change computed from it be wrongly empty).

        Fields a GitOps tool owns are checked on that same object too (the index keeps their
        ownership; what the patch is conditional on is what was checked): a change to one is
        refused, or with `force` written and reported, before anything is sent, so a dry run
        answers as the write would.
        """
        current = target.obj
        fresh = False
        if if_match and if_match != resource_version(current):
            current, fresh = await self._fresh(target), True
        for _ in range(WRITE_ATTEMPTS):
            if if_match and if_match != resource_version(current):
                raise ApiError(412, STALE_ETAG)
            # Only what differs from the stored CR: a client echoing a whole body back writes
            # (and the audit and Event name) just the fields it changed.
            spec_patch = without_unchanged(changes(current), spec(current))
            if not spec_patch:
                if not fresh:
                    current, fresh = await self._fresh(target), True
                    continue
                return Result(
                    self.project(target.kind, current, pools), etag_of(current), [], current
                )
            owners = self.gitops_owners(current)
            overridden = [owners[f] for f in sorted(spec_patch) if f in owners]
            if overridden and not force:
                # Refused only on what the API server holds now: the index's copy may be from
                # before the tool gave the field up.
                if not fresh:
                    current, fresh = await self._fresh(target), True
                    continue
                raise field_managed(target.kind, overridden)
            patch: Obj = {
                "metadata": {
                    "uid": uid_of(current) or "",
                    "resourceVersion": resource_version(current),
                },
                "spec": spec_patch,
            }
            try:
                obj = await self.kube.patch(
                    target.resource, target.namespace, target.name, patch, dry_run=dry_run
                )
            except KubeError as exc:
                if not _lost_race(exc):
                    raise to_api_error(exc, target.kind, current) from None
                if if_match:
                    raise ApiError(412, STALE_ETAG) from None
                current, fresh = await self._fresh(target), True
                continue
            if not dry_run:
                self.on_written(obj, current, target.kind)
                self.index.write_through(target.kind.resource.plural, obj)
            return Result(
                self.project(target.kind, obj, pools),
                etag_of(obj),
                sorted(spec_patch),
                obj,
                before=current,
                forced=overridden,
            )
        raise ApiError(409, f"route {target.route!r} kept changing during the write: retry")

    # -- listing ---------------------------------------------------------------------------

    def summary(self, route: str) -> Obj:
        claims = self.index.claims(route)
        if len(claims) == 1:
            plural, obj = claims[0]
            return self.kinds[plural].summary(obj)
        return {
            "route": route,
            "ambiguous": True,
            "kinds": sorted({self.kinds[p].name for p, _ in claims}),
            "count": len(claims),
        }

    def full(self, route: str, pools: PoolLookup | None = None) -> Obj:
        claims = self.index.claims(route)
        if len(claims) == 1:
            plural, obj = claims[0]
            return self.project(self.kinds[plural], obj, pools)
        return self.summary(route)

    def render_page(
        self,
        routes: list[str],
        page: int,
        page_size: int,
        full: bool,
        line: Callable[[str], bytes] | None = None,
    ) -> bytes:
        """Byte for byte what orjson makes of
        `{"items": [...], "total": n, "page": page, "pageSize": page_size}` for `routes`, each
        item `line(route)` (by default its cached line).

        Each item is encoded once and kept by the index until its CRs change, so a page costs
        a slice and a join, whatever the size of the index.
        """
        start = (page - 1) * page_size
        chosen = routes[start : start + page_size]
        if line is None:
            view, render = ("full", self._full_json) if full else ("summary", self._summary_json)
            rendered = self.index.rendered
            items = b",".join([rendered(view, r, render) for r in chosen])
        else:
            items = b",".join([line(r) for r in chosen])
        return b'{"items":[%b],"total":%d,"page":%d,"pageSize":%d}' % (
            items,
            len(routes),
            page,
            page_size,
        )

    def line(self, view: str, route: str) -> bytes:
        """A route's `/config` item in a view ("summary", "full", or "full-unpooled": full
        without a member's `pool`, for callers who may not read the pool) as JSON, cached by
        the index."""
        render = {"full": self._full_json, "full-unpooled": self._full_unpooled_json}.get(
            view, self._summary_json
        )
        value: bytes = self.index.rendered(view, route, render)
        return value

    def _summary_json(self, route: str) -> bytes:
        return orjson.dumps(self.summary(route))

    def _full_json(self, route: str) -> bytes:
        return orjson.dumps(self.full(route))

    def _full_unpooled_json(self, route: str) -> bytes:
        return orjson.dumps(self.full(route, _no_pool))


def _no_pool(namespace: str, member: str) -> Obj | None:
    return None


def _ignore(obj: Obj, before: Obj, kind: Kind) -> None:
    return None
