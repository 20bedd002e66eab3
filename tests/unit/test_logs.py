"""Logging as the service sets it up: a quiet terminal at info, every library's lines at debug."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx
import pytest

from slo_api.logs import setup_logging
from tests.unit.conftest import Started
from tests.unit.fakes import FakeKube


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """The test's logging set up as the service's, and pytest's put back after it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    named = {name: logging.getLogger(name) for name in logging.Logger.manager.loggerDict}
    levels = {name: (logger.level, logger.disabled) for name, logger in named.items()}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, (was, disabled) in levels.items():
        named[name].setLevel(was)
        named[name].disabled = disabled


def _query_prometheus() -> None:
    """One request as the attainment's Prometheus client makes them (httpx), answered here."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"status": "success", "data": {"result": []}})

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        client.get("http://prometheus.test/api/v1/query", params={"query": "up"})


def _lines(err: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


@pytest.mark.usefixtures("logging_restored")
def test_at_info_a_librarys_request_lines_are_not_logged(
    capsys: pytest.CaptureFixture[str],
) -> None:
    setup_logging("info", "json")
    _query_prometheus()
    logging.getLogger("slo_api.attainment").info("ours")
    lines = _lines(capsys.readouterr().err)
    assert [line["logger"] for line in lines] == ["slo_api.attainment"]


@pytest.mark.usefixtures("logging_restored")
def test_a_librarys_warning_is_logged_at_info(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info", "json")
    for name in ("httpx", "httpcore", "aiohttp.access", "kubernetes_asyncio"):
        logging.getLogger(name).warning("trouble")
    lines = _lines(capsys.readouterr().err)
    assert [line["logger"] for line in lines] == [
        "httpx",
        "httpcore",
        "aiohttp.access",
        "kubernetes_asyncio",
    ]


@pytest.mark.usefixtures("logging_restored")
def test_at_debug_a_librarys_request_lines_are_logged(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info", "json")  # as a test run or a restart may have left it
    setup_logging("debug", "json")
    _query_prometheus()
    lines = _lines(capsys.readouterr().err)
    requests = [line for line in lines if line["logger"] == "httpx"]
    assert len(requests) == 1
    assert "prometheus.test/api/v1/query" in str(requests[0]["message"])


async def test_an_informer_names_a_core_resource_as_kubectl_does(
    start: Started, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slo_api")
    async with start(FakeKube()):
        pass
    said = [r.getMessage() for r in caplog.records if "listed" in r.getMessage()]
    assert any(m.startswith("namespaces: listed") for m in said), said
    assert not [m for m in said if ".:" in m or ". " in m.split(":")[0]]
