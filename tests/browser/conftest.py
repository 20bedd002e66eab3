"""Browser tests: Debian's Chromium, driven by pytest-playwright, against the real slo-api.

slo-api runs as `python -m slo_api` (as `make demo` runs it) with slo-api's own kubeconfig on
the session's control plane. The sample CRs from config/samples are applied into fresh
namespaces with a route prefix of their own, since route names are global.
"""

from __future__ import annotations

import copy
import http.client
import itertools
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, BrowserType, Playwright, sync_playwright

from controlplane.admin import Admin, Obj
from controlplane.cluster import Cluster
from controlplane.demo import (
    ServiceError,
    apply_samples,
    load_samples,
    start_metrics,
    start_service,
    stop_service,
    wait_attainment,
    wait_ready,
)
from controlplane.server import free_port
from tests.browser.ui import updating_docs_screenshot

CHROMIUM = Path(os.environ.get("SLO_API_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SLO = "inference.modelsphere.dev/v1alpha1"
POOL = "inference.llmkube.dev/v1alpha1"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """Debian's Chromium: Playwright's own browser download is not available here."""
    if not CHROMIUM.is_file():
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}: the browser tests need Debian's "
            "chromium package (apt-get install -y chromium), or SLO_API_CHROMIUM set to a "
            "Chromium binary.",
            pytrace=False,
        )
    return {**browser_type_launch_args, "executable_path": str(CHROMIUM), "args": CHROMIUM_ARGS}


# Package scope, where the plugin has session scope: while Playwright's sync API is running, the
# main thread has a running event loop, and pytest-asyncio's tests in other folders cannot run
# theirs. So Playwright stops when the last browser test is done.


@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    pw = sync_playwright().start()
    yield pw
    pw.stop()


@pytest.fixture(scope="package")
def browser_context_args(playwright: Playwright, device: str | None) -> dict[str, Any]:
    args: dict[str, Any] = {"viewport": {"width": 1280, "height": 900}}
    if device:
        args.update(playwright.devices[device])
    return args


@pytest.fixture(scope="package")
def browser_type(playwright: Playwright, browser_name: str) -> BrowserType:
    found: BrowserType = getattr(playwright, browser_name)
    return found


@pytest.fixture(scope="package")
def launch_browser(
    browser_type_launch_args: dict[str, Any], browser_type: BrowserType
) -> Callable[..., Browser]:
    def launch(**kwargs: Any) -> Browser:
        return browser_type.launch(**{**browser_type_launch_args, **kwargs})

    return launch


@pytest.fixture(scope="package")
def browser(launch_browser: Callable[..., Browser]) -> Iterator[Browser]:
    started = launch_browser()
    yield started
    started.close()


# -- the sample CRs, renamed --------------------------------------------------------------------


@dataclass
class Samples:
    prefix: str
    namespaces: dict[str, str]

    def route(self, name: str) -> str:
        return self.prefix + name

    def namespace(self, name: str = "demo") -> str:
        return self.namespaces[name]


def rename_samples(objs: list[Obj], samples: Samples) -> list[Obj]:
    """The samples with their namespaces replaced and every route name prefixed."""
    renamed: list[Obj] = []
    for obj in copy.deepcopy(objs):
        meta = obj["metadata"]
        if obj["kind"] == "Namespace":
            meta["name"] = samples.namespaces[meta["name"]]
            renamed.append(obj)
            continue
        meta["namespace"] = samples.namespaces[meta["namespace"]]
        meta["name"] = samples.route(meta["name"])
        spec = obj["spec"]
        if "serviceId" in spec:
            spec["serviceId"] = samples.route(spec["serviceId"])
        if obj["kind"] == "ModelPool":
            for member in spec["members"]:
                ref = member["inferenceServiceRef"]
                ref["name"] = samples.route(ref["name"])
            if spec.get("default"):
                spec["default"] = samples.route(spec["default"])
            status = obj.get("status") or {}
            for key in ("residentMember", "pendingMember"):
                if status.get(key):
                    status[key] = samples.route(status[key])
            for member in status.get("members", []):
                member["name"] = samples.route(member["name"])
        renamed.append(obj)
    return renamed


@pytest.fixture(scope="session")
def samples(admin: Admin) -> Samples:
    objs = load_samples()
    originals = sorted({o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"})
    if updating_docs_screenshot():
        # The picture in the docs shows the samples as `make demo` shows them.
        result = Samples("", {name: name for name in originals})
    else:
        tag = f"ui{os.getpid() % 10000}"
        result = Samples(f"{tag}-", {name: f"{tag}-{name}" for name in originals})
    apply_samples(admin, rename_samples(objs, result))
    return result


# -- slo-api --------------------------------------------------------------------------------------


@dataclass
class Service:
    url: str
    token: str
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    @property
    def page_url(self) -> str:
        return f"{self.url}/demo-webui"

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def routes(self) -> dict[str, Obj]:
        items: dict[str, Obj] = {}
        with httpx.Client(timeout=5, headers={"Authorization": f"Bearer {self.token}"}) as http:
            for page in itertools.count(1):
                body = http.get(f"{self.url}/config", params={"page": page, "pageSize": 200})
                body.raise_for_status()
                got = body.json()
                items.update({item["route"]: item for item in got["items"]})
                if not got["items"] or len(items) >= got["total"]:
                    break
        return items


@pytest.fixture(scope="session")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The demo's Prometheus: a month of the samples' history, then the load simulator's
    (chat-7b met, code-13b at risk, reason-70b violated; renamed samples keep their models)."""
    prometheus, simulator = start_metrics(tmp_path_factory.mktemp("metrics"))
    try:
        yield prometheus.url
    finally:
        prometheus.stop()
        simulator.stop()


@pytest.fixture(scope="session")
def service(
    cluster: Cluster,
    samples: Samples,
    prometheus_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Service]:
    assert cluster.credentials is not None
    port = free_port()
    token = secrets.token_urlsafe(24)
    log_path = tmp_path_factory.mktemp("slo-api") / "slo-api.log"
    with log_path.open("wb") as log:
        process = start_service(
            cluster.credentials.slo_api_kubeconfig,
            port,
            token,
            stdout=log,
            extra_env={"PROMETHEUS_URL": prometheus_url},
        )
    svc = Service(f"http://127.0.0.1:{port}", token, log_path, process)
    try:
        try:
            wait_ready(svc.url, process)
        except ServiceError as exc:
            pytest.fail(f"{exc}\n{svc.log_tail()}", pytrace=False)
        _wait_for_samples(svc, samples)
        wait_attainment(svc.url, token, samples.route("chat-7b"))
        yield svc
    finally:
        stop_service(process)


def _wait_for_samples(svc: Service, samples: Samples, timeout: float = 30) -> None:
    wanted = {samples.route(n) for n in ("chat-7b", "batch-render", "gpu-slot-a", "translate-3b")}
    deadline = time.monotonic() + timeout
    while True:
        found = svc.routes()
        if wanted <= found.keys() and found[samples.route("translate-3b")].get("ambiguous"):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"slo-api did not list the sample routes: {sorted(found)}", pytrace=False)
        time.sleep(0.2)


# -- a gateway that serves slo-api under a path prefix -----------------------------------------


class _PrefixProxy(BaseHTTPRequestHandler):
    """Forwards `/gw/slo/<path>` to slo-api's `/<path>`, as the platform gateway does."""

    prefix = "/gw/slo"
    upstream = ""

    def _forward(self) -> None:
        if not self.path.startswith(self.prefix + "/"):
            self.send_error(404, "outside the gateway prefix")
            return
        target = urlsplit(self.upstream)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in {"host", "connection"}}
        conn = http.client.HTTPConnection(target.hostname or "", target.port, timeout=15)
        try:
            conn.request(self.command, self.path[len(self.prefix) :], body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
        finally:
            conn.close()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in {"connection", "transfer-encoding", "content-length", "date"}:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_PUT = do_DELETE = do_POST = _forward

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="session")
def gateway(service: Service) -> Iterator[str]:
    """The page's URL behind a gateway that rewrites the prefix `/gw/slo` to `/`."""
    handler = type("Proxy", (_PrefixProxy,), {"upstream": service.url})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{_PrefixProxy.prefix}/demo-webui"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def screenshot_dir(output_path: str) -> Path:
    path = Path(output_path)
    path.mkdir(parents=True, exist_ok=True)
    return path
