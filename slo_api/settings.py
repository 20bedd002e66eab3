"""Settings from the environment, validated once at start-up."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from slo_api.attainment.selectors import route_labels_problem
from slo_api.auth import token_problem

SLO_GROUPS = ("inference.modelsphere.dev", "inference.x-k8s.io")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Label selectors as the API server parses them (k8s.io/apimachinery labels.Parse).
_LABEL_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = rf"(?:{_DNS_SUBDOMAIN.pattern}/)?{_LABEL_NAME}"
_LABEL_VALUE = rf"(?:{_LABEL_NAME})?"
_REQUIREMENT = re.compile(
    rf"\s*(?:!\s*{_LABEL_KEY}"
    rf"|{_LABEL_KEY}\s*(?:==?|!=)\s*{_LABEL_VALUE}"
    rf"|{_LABEL_KEY}\s+(?:in|notin)\s*\(\s*{_LABEL_NAME}(?:\s*,\s*{_LABEL_VALUE})*\s*\)"
    rf"|{_LABEL_KEY}\s*[<>]\s*-?\d+"
    rf"|{_LABEL_KEY})\s*"
)


# The API server sends a watch a bookmark about once a minute, even when nothing changes.
API_SERVER_BOOKMARK_SECONDS = 60
# Environment variables of these prefixes are slo-api's: one it does not know is most likely a
# misspelt or retired setting, so start-up says so. sloctl reads SLO_API_URL, prometheus_client
# PROMETHEUS_MULTIPROC_DIR.
OWN_PREFIXES = ("SLO_API_", "WATCH_", "GITOPS_", "PROMETHEUS_", "ATTAINMENT_")
READ_ELSEWHERE = frozenset({"SLO_API_URL", "PROMETHEUS_MULTIPROC_DIR"})


# A list setting: comma-separated in the environment (not JSON), a tuple once read.
CommaList = Annotated[tuple[str, ...], NoDecode]


def _items(value: object) -> object:
    """The items of a list setting, each stripped: from `a, b` or from a sequence given as one."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(","))
    if isinstance(value, list | tuple):
        return tuple(item.strip() if isinstance(item, str) else item for item in value)
    return value


def _distinct(items: tuple[str, ...], what: str, instead: str) -> tuple[str, ...]:
    """`items` when none is empty or listed twice; `instead` says what to write instead."""
    listed = ",".join(items)
    if "" in items:
        raise ValueError(f"{listed!r} has an empty {what}: {instead}")
    twice = sorted({i for i in items if items.count(i) > 1})
    if twice:
        raise ValueError(f"{listed!r} lists {', '.join(twice)} more than once")
    return items


def _selector_problem(selector: str) -> str | None:
    """Why the API server would refuse a label selector, or None."""
    # Commas separate requirements, except inside the parentheses of `in` and `notin`.
    for requirement in re.split(r",(?![^(]*\))", selector):
        if not _REQUIREMENT.fullmatch(requirement):
            return f"{requirement.strip()!r} is not a label selector requirement"
    return None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", frozen=True)

    slo_api_token: SecretStr | None = Field(
        None,
        description="The write token, at least 16 characters once leading and trailing "
        "whitespace is stripped (as from request tokens: a Secret with a trailing newline "
        "works). One of it, `SLO_API_TOKENS_FILE` or `SLO_API_KUBERNETES_AUTH=true` is required.",
    )
    slo_api_tokens_file: Path | None = Field(
        None,
        description="A file of `<token> read|write` lines (tokens at least 16 characters), "
        "re-read when it changes (rotation without restart); a `read` token gets 403 on PUT "
        "and DELETE. A file that cannot be read any more revokes its tokens; one that cannot be "
        "parsed keeps the previous tokens (see [Probes](#probes)).",
    )
    slo_api_kubernetes_auth: bool = Field(
        False,
        description="Authenticate other bearer tokens with a TokenReview and authorize each "
        "request with a SubjectAccessReview: callers get what the cluster's RBAC grants them "
        "(see [Kubernetes identities](api.md#kubernetes-identities)).",
    )
    slo_api_token_audiences: CommaList = Field(
        (),
        description="Audiences sent in each TokenReview, comma-separated; a token minted for "
        "another audience is 401.",
    )
    token_review_seconds: float = Field(
        60, ge=0, description="How long an authenticated token is remembered."
    )
    token_refused_seconds: float = Field(
        10, ge=0, description="How long a refused token is remembered."
    )
    access_allowed_seconds: float = Field(
        30, ge=0, description="How long an allowed SubjectAccessReview is remembered."
    )
    access_denied_seconds: float = Field(
        5, ge=0, description="How long a denied SubjectAccessReview is remembered."
    )
    review_cache_size: int = Field(
        10000, ge=1, description="Most token reviews, and most access reviews, remembered."
    )
    review_concurrency: int = Field(
        16,
        ge=1,
        description="Most TokenReviews, and most SubjectAccessReviews, in flight at once; more "
        "wait (TokenReviews: at most 8 times as many, then 503).",
    )
    host: str = Field("0.0.0.0", description="Address to listen on.")  # noqa: S104
    port: int = Field(8080, ge=1, le=65535, description="Port to listen on.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="The least severe level logged, in any case (`INFO` too). Libraries' "
        "lines per request or connection (httpx's per Prometheus query, aiohttp's, "
        "kubernetes_asyncio's) only at `debug`; their warnings always.",
    )
    log_format: Literal["json", "console"] = Field(
        "json", description="`json` lines, or `console` for development."
    )
    kubeconfig: str | None = Field(
        None, description="Path of a kubeconfig; in-cluster configuration when unset."
    )

    llm_group: CommaList = Field(
        SLO_GROUPS,
        description="API groups that may serve LLM SLOs, comma-separated, most preferred first "
        "(see [Migrating between API groups](#migrating-between-api-groups)); an empty or "
        "repeated group exits 2.",
    )
    llm_version: str = Field("v1alpha1", description="API version of LLM SLOs.")
    llm_plural: str = Field("llmslorequirements", description="Plural of LLM SLOs.")
    job_group: CommaList = Field(
        SLO_GROUPS, description="API groups that may serve job SLOs, as `LLM_GROUP`."
    )
    job_version: str = Field("v1alpha1", description="API version of job SLOs.")
    job_plural: str = Field("jobslorequirements", description="Plural of job SLOs.")
    pool_group: CommaList = Field(
        ("inference.llmkube.dev",),
        description="API groups that may serve ModelPools, as `LLM_GROUP`.",
    )
    pool_version: str = Field("v1alpha1", description="API version of ModelPools.")
    pool_plural: str = Field("modelpools", description="Plural of ModelPools.")

    watch_namespaces: CommaList = Field(
        (),
        description="Namespaces to watch, comma-separated; empty: every namespace. Each kind is "
        "then listed and watched per namespace, so Roles in those namespaces are enough (see "
        "[Watching some namespaces](deploying.md#watching-some-namespaces)); routes elsewhere "
        "are 404 and not in `/config`.",
    )
    watch_label_selector: str = Field(
        "",
        description="A label selector (`tier=prod`, `team in (a,b)`, `!legacy`): only CRs it "
        "selects are routes, and a CR relabelled out of it drops out; empty: every CR.",
    )
    crd_recheck_seconds: float = Field(
        60,
        gt=0,
        description="How often discovery is asked which groups serve each kind (a CRD "
        "installed or deleted is followed within this).",
    )
    upstream_timeout_seconds: float = Field(
        10, gt=0, description="Timeout of every call to the API server (504 when exceeded)."
    )
    watch_timeout_seconds: int = Field(
        300,
        ge=10,
        description="Server-side timeout of one watch request (randomised up to twice that).",
    )
    watch_inactivity_seconds: float = Field(
        90, gt=0, description="A watch with no event or bookmark for this long is reconnected."
    )
    watch_bookmark_seconds: float = Field(
        5,
        gt=0,
        description="How often an open `GET /config?watch=true` stream gets a BOOKMARK: with "
        "every write, how soon a stream whose client is gone without a word is noticed.",
    )
    watch_lifetime_seconds: float = Field(
        1800,
        gt=0,
        description="Longest life of one `GET /config?watch=true` stream, randomised up to "
        "twice that (as the API server's watch timeout): it then ends with a final BOOKMARK "
        "and the client resumes from it. Bounds what a client gone unnoticed can hold.",
    )
    watch_flush_seconds: float = Field(
        0.1,
        ge=0,
        le=5,
        description="Changes go out to the change streams together, this long after the first "
        "of them: longer costs less CPU per stream, shorter is sooner (`0`: at once). With "
        "thousands of streams a flush itself takes long, and the next one waits until flushing "
        "takes at most a tenth of the event loop (0.5 s at most).",
    )
    max_watchers: int = Field(
        1000, ge=1, description="Most open change streams; more are 429 with `Retry-After`."
    )
    watch_streams_per_identity: int = Field(
        20,
        ge=1,
        description="Most open change streams per Kubernetes identity (static tokens are not "
        "counted); more are 429.",
    )
    watch_history_bytes: int = Field(
        16 * 1024 * 1024,
        ge=4096,
        description="Bytes of changes kept per view (and per kind followed alone) for streams "
        "that fall behind and for resuming with `since` (older is `410 expired`).",
    )
    watch_access_seconds: float = Field(
        10,
        gt=0,
        description="How often an open change stream's token and visible namespaces are "
        "checked again.",
    )
    watch_review_grace_seconds: float = Field(
        300,
        gt=0,
        description="How long an open change stream stays open while its re-checks cannot be "
        "answered (the API server fails its reviews with 5xx); it then ends with an "
        "`unavailable` `ERROR` line after a bookmark of its place, and the client resumes "
        "with `since`.",
    )
    route_history_entries: int = Field(
        20,
        ge=0,
        le=100,
        description="Changes kept per CR in its history, one RouteRevision each (see "
        "[History](api.md#history-who-changed-a-route-and-undo)); at most 100; `0` records "
        "nothing (what is stored stays readable).",
    )
    gitops_managers: CommaList = Field(
        ("argocd-controller", "kustomize-controller", "helm-controller", "helm"),
        description="Field managers that are GitOps tools, comma-separated: a write that "
        "would change a field one of them owns is `409 field_managed` unless `force=true` (see "
        "[Fields a GitOps tool manages](api.md#fields-a-gitops-tool-manages)).",
    )
    gitops_client_side_managers: CommaList = Field(
        ("kubectl-client-side-apply",),
        description="Client-side apply managers, GitOps tools (Argo CD's default sync) on a CR "
        "Argo CD tracks, for the fields in its last-applied configuration; a manager added "
        "here counts on a CR with any GitOps marker.",
    )
    gitops_argocd_tracking_label: str = Field(
        "",
        description="The label by which the cluster's Argo CD tracks its resources, when it "
        "does (`application.resourceTrackingMethod: label`, the default before Argo CD 3.0: "
        "`app.kubernetes.io/instance`, or its `application.instanceLabelKey`); empty: only "
        "Argo CD's `argocd.argoproj.io/tracking-id` annotation marks a CR as Argo CD's.",
    )
    gitops_co_owners: CommaList = Field(
        (),
        description="GitOps managers configured to leave slo-api's fields alone (Argo CD's "
        "ignoreDifferences, Flux's ignore rules): writes to their fields go through.",
    )
    max_body_bytes: int = Field(
        65536,
        ge=1024,
        description="Largest accepted request body; a larger one is 413, before it is read.",
    )
    docs_enabled: bool = Field(
        True,
        description="Serve Swagger UI at `/docs`; its assets ship with slo-api (the "
        "`fastapi-offline` package), nothing is loaded from another origin.",
    )
    shutdown_grace_seconds: float = Field(
        2,
        ge=0,
        description="After SIGTERM, how long `/readyz` says 503 before the server stops accepting.",
    )
    shutdown_drain_seconds: int = Field(
        15,
        ge=1,
        description="Then how long in-flight requests may take to finish (change streams are "
        "ended at once) before they are cancelled and the lifespan shutdown runs; at least "
        "`UPSTREAM_TIMEOUT_SECONDS`. The pod's `terminationGracePeriodSeconds` must cover "
        "preStop + the grace + the drain + a few seconds (the manifests: 5 + 2 + 15 + 5 ≤ 30).",
    )

    prometheus_url: str | None = Field(
        None,
        description="The Prometheus (or compatible: Thanos, Mimir) that holds vLLM's histograms "
        "and the job queues' series, e.g. `http://prometheus.monitoring:9090`; unset: "
        "attainment says `not_configured` (see "
        "[Attainment](api.md#attainment-is-a-route-meeting-its-slo)).",
    )
    prometheus_bearer_token_file: Path | None = Field(
        None,
        description="A file holding the bearer token sent to Prometheus, re-read at each "
        "refresh (a rotated token is picked up).",
    )
    prometheus_ca_file: Path | None = Field(
        None, description="The CA bundle that verifies Prometheus's certificate (https)."
    )
    prometheus_timeout_seconds: float = Field(
        10, gt=0, le=300, description="Timeout of each query to Prometheus."
    )
    prometheus_route_labels: str = Field(
        'model_name="{model}"',
        description="The label matchers selecting a route's vLLM series, comma-separated "
        '`label="template"` pairs; the template may name `{model}` (`spec.model`, or '
        "`spec.serviceId` when empty), `{serviceId}`, `{namespace}` and `{name}`, each value "
        "escaped. One route can narrow its own with the annotation "
        "`slo-api.modelsphere.dev/prometheus-matchers`.",
    )
    attainment_refresh_seconds: float = Field(
        60, ge=5, description="How often attainment is queried from Prometheus for all routes."
    )
    attainment_min_requests: int = Field(
        100,
        ge=0,
        description="The traffic floor: an objective over a window with fewer requests is "
        "`no_data` (reason `insufficient_traffic`), its figures shown but not judged (a p99 "
        "needs 100 requests before one slow request is within its budget). 0: no floor.",
    )
    attainment_series_limit: int = Field(
        100,
        ge=1,
        description="Most series a job route's `queue.promql` may return; more is that "
        "route's `unavailable` (the depth is the highest of them).",
    )
    attainment_max_samples: int = Field(
        50_000_000,
        ge=1000,
        description="Most samples one attainment query of raw series may load (estimated from "
        "what 5 minutes of them hold): a longer window is narrowed to fit, and the answer's "
        "`narrowed` says so; a coverage subquery looks at a coarser step to hold at most this "
        "many, and `coverage.resolution` says which. Routes recorded by `sloctl rules` are read "
        "from 20x fewer samples.",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: object) -> object:
        # The original service read LOG_LEVEL=INFO; the level's name is the same in any case.
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("slo_api_token", mode="before")
    @classmethod
    def _strip_token(cls, value: object) -> object:
        # As request tokens are: a Secret written with a trailing newline must not make every
        # static-token client 401.
        return value.strip() if isinstance(value, str) else value

    @field_validator(
        "slo_api_token_audiences",
        "llm_group",
        "job_group",
        "pool_group",
        "watch_namespaces",
        "gitops_managers",
        "gitops_client_side_managers",
        "gitops_co_owners",
        mode="before",
    )
    @classmethod
    def _split(cls, value: object) -> object:
        return _items(value)

    @field_validator(
        "slo_api_token_audiences",
        "gitops_managers",
        "gitops_client_side_managers",
        "gitops_co_owners",
    )
    @classmethod
    def _non_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # `a,,b`, a trailing comma or nothing at all: no name, so none is listed.
        return tuple(item for item in value if item)

    @field_validator("gitops_argocd_tracking_label")
    @classmethod
    def _label_key(cls, value: str) -> str:
        value = value.strip()
        if value and not re.fullmatch(_LABEL_KEY, value):
            raise ValueError(f"{value!r} is not a label key (such as app.kubernetes.io/instance)")
        return value

    @field_validator("llm_group", "job_group", "pool_group")
    @classmethod
    def _groups(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _distinct(value, "group", "list API groups separated by commas, most preferred first")
        for group in value:
            if not _DNS_SUBDOMAIN.fullmatch(group) or len(group) > 253:
                raise ValueError(f"{group!r} is not an API group (a lowercase DNS name)")
        return value

    @field_validator("watch_namespaces")
    @classmethod
    def _namespaces(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if value == ("",):
            return ()  # empty: every namespace
        _distinct(
            value,
            "namespace",
            "list namespaces separated by commas, or leave it empty to watch every namespace",
        )
        for namespace in value:
            if not _DNS_LABEL.fullmatch(namespace):
                raise ValueError(f"{namespace!r} is not a namespace name")
        return value

    @field_validator("watch_label_selector")
    @classmethod
    def _label_selector(cls, value: str) -> str:
        value = value.strip()
        problem = _selector_problem(value) if value else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip().rstrip("/")
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value

    @field_validator("prometheus_route_labels")
    @classmethod
    def _route_labels(cls, value: str) -> str:
        problem = route_labels_problem(value)
        if problem:
            raise ValueError(problem)
        return value.strip()

    @model_validator(mode="after")
    def _needs_a_token(self) -> Settings:
        if (
            self.slo_api_token is None
            and self.slo_api_tokens_file is None
            and not self.slo_api_kubernetes_auth
        ):
            raise ValueError(
                "set SLO_API_TOKEN or SLO_API_TOKENS_FILE, or SLO_API_KUBERNETES_AUTH=true"
            )
        if self.slo_api_token is not None:
            token = self.slo_api_token.get_secret_value()
            if not token.strip():
                raise ValueError("SLO_API_TOKEN is empty")
            problem = token_problem(token)
            if problem is not None:
                raise ValueError(f"SLO_API_TOKEN: {problem} (docs/upgrade.md: rotate it first)")
        return self

    @model_validator(mode="after")
    def _agree(self) -> Settings:
        if self.shutdown_drain_seconds < self.upstream_timeout_seconds:
            raise ValueError(
                f"SHUTDOWN_DRAIN_SECONDS ({self.shutdown_drain_seconds}) is below "
                f"UPSTREAM_TIMEOUT_SECONDS ({self.upstream_timeout_seconds:g}): a request "
                "waiting for the API server at SIGTERM would be cut off"
            )
        return self

    def warnings(self, environ: Mapping[str, str]) -> list[str]:
        """What start-up logs about these settings: legal, but likely not what was meant."""
        said = [f"{name} is not a setting of slo-api; ignored" for name in unrecognised(environ)]
        if self.watch_inactivity_seconds < API_SERVER_BOOKMARK_SECONDS:
            said.append(
                f"WATCH_INACTIVITY_SECONDS ({self.watch_inactivity_seconds:g}) is below the "
                f"API server's bookmark interval (about {API_SERVER_BOOKMARK_SECONDS} s): a "
                "quiet kind's watch reconnects every time it elapses"
            )
        return said


def unrecognised(environ: Mapping[str, str]) -> list[str]:
    """Variables named like slo-api's settings that are none of them."""
    known = {name.upper() for name in Settings.model_fields} | READ_ELSEWHERE
    return sorted(
        name
        for name in environ
        if name.upper().startswith(OWN_PREFIXES) and name.upper() not in known
    )
