"""Settings from the environment, validated once at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", frozen=True)

    slo_api_token: SecretStr | None = Field(
        None, description="The single write token (required unless SLO_API_TOKENS_FILE is set)."
    )
    slo_api_tokens_file: Path | None = Field(
        None, description="A file of `token role` lines (role read or write), re-read on change."
    )
    slo_api_kubernetes_auth: bool = Field(
        False,
        description="Authenticate other bearer tokens with a TokenReview and authorize each "
        "request with a SubjectAccessReview (the cluster's RBAC).",
    )
    slo_api_token_audiences: str | None = Field(
        None, description="Comma-separated audiences sent in each TokenReview (optional)."
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
    host: str = Field("0.0.0.0", description="Address to listen on.")  # noqa: S104
    port: int = Field(8080, ge=1, le=65535, description="Port to listen on.")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    kubeconfig: str | None = Field(
        None, description="Path of a kubeconfig; in-cluster configuration when unset."
    )

    llm_group: str = "inference.modelsphere.dev"
    llm_version: str = "v1alpha1"
    llm_plural: str = "llmslorequirements"
    job_group: str = "inference.modelsphere.dev"
    job_version: str = "v1alpha1"
    job_plural: str = "jobslorequirements"
    pool_group: str = "inference.llmkube.dev"
    pool_version: str = "v1alpha1"
    pool_plural: str = "modelpools"

    crd_recheck_seconds: float = Field(
        60, gt=0, description="How often a missing CRD is looked up."
    )
    upstream_timeout_seconds: float = Field(
        10, gt=0, description="Timeout of every call to the API server."
    )
    watch_timeout_seconds: int = Field(
        300, ge=10, description="Server-side timeout of one watch request (randomised up to 2x)."
    )
    watch_inactivity_seconds: float = Field(
        90, gt=0, description="A watch with no event or bookmark for this long is reconnected."
    )
    max_body_bytes: int = Field(65536, ge=1024, description="Largest accepted request body.")
    shutdown_grace_seconds: float = Field(
        2, ge=0, description="After SIGTERM, how long /readyz says 503 before the server stops."
    )

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
        if self.slo_api_token is not None and not self.slo_api_token.get_secret_value().strip():
            raise ValueError("SLO_API_TOKEN is empty")
        return self

    @property
    def token_audiences(self) -> list[str]:
        value = self.slo_api_token_audiences or ""
        return [a.strip() for a in value.split(",") if a.strip()]
