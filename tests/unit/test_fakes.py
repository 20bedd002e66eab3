"""The fake of the seam (tests/unit/fakes.py) is an oracle only if it is right on its own terms:
its merge patch follows RFC 7386's examples, and its one fault hook reaches every method."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slo_api.kinds.base import merged
from slo_api.kube import KubeError, Resource
from tests.unit.fakes import FakeKube, fail, merge

# RFC 7386, Appendix A: (target, patch, result), as the RFC prints them.
RFC_7386_EXAMPLES: list[tuple[Any, Any, Any]] = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]
LLM = Resource("inference.modelsphere.dev", "v1alpha1", "llmslorequirements")


@pytest.mark.parametrize(("target", "patch", "result"), RFC_7386_EXAMPLES)
def test_the_fakes_merge_patch_gives_the_rfcs_results_and_changes_neither_input(
    target: Any, patch: Any, result: Any
) -> None:
    target_before, patch_before = copy.deepcopy(target), copy.deepcopy(patch)
    assert merge(target, patch) == result
    assert (target, patch) == (target_before, patch_before)


@pytest.mark.parametrize(("target", "patch", "result"), RFC_7386_EXAMPLES)
def test_slo_apis_merge_patch_gives_the_rfcs_results(target: Any, patch: Any, result: Any) -> None:
    assert merged(target, patch) == result


async def test_the_fault_hook_is_called_with_each_methods_name_and_arguments() -> None:
    seen: list[tuple[Any, ...]] = []
    kube = FakeKube(
        {LLM.plural: [{"metadata": {"name": "a"}, "spec": {}}]},
        error_callback=lambda *call: seen.append(call),
    )
    await kube.get(LLM, "ns", "a")
    await kube.patch(LLM, "ns", "a", {"spec": {"priority": 1}})
    await kube.list(LLM)
    assert [call[0] for call in seen] == ["get", "patch", "list"]
    assert seen[0] == ("get", LLM, "ns", "a")


async def test_fail_raises_from_the_named_methods_only_and_the_given_number_of_times() -> None:
    kube = FakeKube({LLM.plural: [{"metadata": {"name": "a"}, "spec": {}}]})
    error = KubeError(500, "InternalError", "etcd", is_status=True)
    kube.error_callback = fail(error, "patch", times=2)
    await kube.get(LLM, "ns", "a")
    for _ in range(2):
        with pytest.raises(KubeError) as caught:
            await kube.patch(LLM, "ns", "a", {"spec": {"priority": 1}})
        assert caught.value is error
    assert (await kube.patch(LLM, "ns", "a", {"spec": {"priority": 1}}))["spec"] == {"priority": 1}
    kube.error_callback = fail(error, times=None)
    for _ in range(3):
        with pytest.raises(KubeError):
            await kube.get(LLM, "ns", "a")
    assert not await kube.ready()  # a probe that fails is "not ready", not an exception
