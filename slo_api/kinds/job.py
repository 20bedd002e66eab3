"""Job routes: JobSLORequirement, sized from a queue instead of latency sections."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from slo_api.errors import invalid
from slo_api.kinds.base import Body, Obj, PoolLookup, present, spec
from slo_api.kinds.slo import INT32_MAX, BoundValue, SLOBody, SLOKind


class JobMinimum(Body):
    type: Literal["replica", "concurrency"] = "replica"
    value: BoundValue


class JobMaximum(Body):
    type: Literal["replica"] = "replica"
    value: BoundValue


class Queue(Body):
    """The queue the scaler reads. `promql` left out of a PUT keeps the stored query."""

    maxDepth: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    promql: Annotated[str, Field(min_length=1, max_length=4096, pattern=r"\S")] | None = None


class JobBody(SLOBody):
    """A job route. Fields left out keep their stored values."""

    kind: Literal["job"] | None = None
    minimumDeployment: JobMinimum | None = None
    maximumDeployment: JobMaximum | None = None
    queue: Queue | None = None


class JobKind(SLOKind):
    name = "job"
    body_model = JobBody

    def project(self, obj: Obj, pools: PoolLookup) -> Obj:
        queue = spec(obj).get("queue") or {}
        return {
            **self.common(obj),
            "queue": {"maxDepth": queue.get("maxDepth", 0), **present(promql=queue.get("promql"))},
            **present(pool=self.pool_view(obj, pools)),
        }

    def spec_patch(self, body: Body, current: Obj, pools: PoolLookup) -> Obj:
        assert isinstance(body, JobBody)
        patch = self.common_patch(body, current, pools)
        if "queue" in body.model_fields_set:
            if body.queue is None:
                raise invalid("queue cannot be removed: the job CRD requires it", field="queue")
            queue: Obj = {}
            for name in body.queue.model_fields_set:
                value = getattr(body.queue, name)
                if value is None:
                    raise invalid(f"queue.{name} cannot be null", field=f"queue.{name}")
                queue[name] = value
            patch["queue"] = queue
        return patch
