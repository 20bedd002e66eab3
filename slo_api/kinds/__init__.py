"""The three kinds of route, built from the settings that name their API groups."""

from __future__ import annotations

from slo_api.kinds.base import Kind
from slo_api.kinds.job import JobKind
from slo_api.kinds.llm import LLMKind
from slo_api.kinds.pool import PoolKind
from slo_api.kube import Resource
from slo_api.settings import Settings

__all__ = ["Kind", "build_kinds"]


def build_kinds(settings: Settings) -> list[Kind]:
    return [
        LLMKind(Resource(settings.llm_group, settings.llm_version, settings.llm_plural)),
        JobKind(Resource(settings.job_group, settings.job_version, settings.job_plural)),
        PoolKind(Resource(settings.pool_group, settings.pool_version, settings.pool_plural)),
    ]
