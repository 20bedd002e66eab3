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
    llm, job, pool = settings.llm_group, settings.job_group, settings.pool_group
    return [
        LLMKind(Resource(llm[0], settings.llm_version, settings.llm_plural), llm),
        JobKind(Resource(job[0], settings.job_version, settings.job_plural), job),
        PoolKind(Resource(pool[0], settings.pool_version, settings.pool_plural), pool),
    ]
