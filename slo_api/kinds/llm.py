"""LLM routes: LLMSLORequirement, with ttft and otps latency sections."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from slo_api.kinds.base import Body, Obj, PoolLookup, present, spec
from slo_api.kinds.slo import BoundValue, SLOBody, SLOKind, sections_patch

INT64_MAX = 2**63 - 1
MetricType = Literal["avg", "p50", "p80", "p90", "p95", "p99"]
SECTIONS = ("ttft", "otps")


class Metric(Body):
    type: MetricType
    threshold: Annotated[float, Field(ge=0)]


Metrics = Annotated[list[Metric], Field(min_length=1, max_length=16)]


class MetricSet(Body):
    metrics: Metrics


class ContextRange(Body):
    contextLengthRangeLow: Annotated[int, Field(ge=0, le=INT64_MAX)]
    contextLengthRangeHigh: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    metrics: Metrics


class Section(Body):
    """A latency objective. A section sent replaces the stored one, ranges included."""

    default: MetricSet
    ranges: Annotated[list[ContextRange], Field(max_length=64)] | None = None


class LLMMinimum(Body):
    type: Literal["replica", "concurrency", "pdengine"] = "replica"
    value: BoundValue


class LLMMaximum(Body):
    type: Literal["replica", "pdengine"] = "replica"
    value: BoundValue


class LLMBody(SLOBody):
    """An LLM route. Fields left out keep their stored values."""

    kind: Literal["llm"] | None = None
    minimumDeployment: LLMMinimum | None = None
    maximumDeployment: LLMMaximum | None = None
    ttft: Section | None = None
    otps: Section | None = None


class LLMKind(SLOKind):
    name = "llm"
    body_model = LLMBody
    reset_spec: ClassVar[Obj] = {**SLOKind.reset_spec, "ttft": None, "otps": None}

    def project(self, obj: Obj, pools: PoolLookup) -> Obj:
        s = spec(obj)
        return {
            **self.common(obj),
            **present(ttft=s.get("ttft"), otps=s.get("otps"), pool=self.pool_view(obj, pools)),
        }

    def spec_patch(self, body: Body, current: Obj, pools: PoolLookup) -> Obj:
        assert isinstance(body, LLMBody)
        return {
            **self.common_patch(body, current, pools),
            **sections_patch(body, current, SECTIONS),
        }
