"""Numbers a hostile client may send: each is a 400 that names the field, never a 500."""

from __future__ import annotations

import pytest

from tests.unit.conftest import AUTH, Started, llm_cr
from tests.unit.fakes import FakeKube


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        # Past Python's int-from-text digit limit (4300): int() raises ValueError.
        (b'{"priority": ' + b"9" * 5000 + b"}", "priority"),
        (b'{"priority": -' + b"9" * 5000 + b"}", "priority"),
        (b'{"priority": 9223372036854775808}', "priority"),
        (
            b'{"ttft": {"default": {"metrics": [{"type": "p90", "threshold": 0}]}, '
            b'"ranges": [{"contextLengthRangeLow": 99999999999999999999, '
            b'"metrics": [{"type": "p90", "threshold": 0}]}]}}',
            "ttft.ranges[0].contextLengthRangeLow",
        ),
    ],
)
async def test_oversized_integers_are_400_with_the_field(
    start: Started, raw: bytes, field: str
) -> None:
    kube = FakeKube({"llmslorequirements": [llm_cr("a")]})
    async with start(kube) as (client, _):
        response = await client.put(
            "/routes/a", content=raw, headers={**AUTH, "Content-Type": "application/json"}
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_request"
        assert "too large" in error["message"]
        assert error.get("field") == field
        assert kube.patches == []
