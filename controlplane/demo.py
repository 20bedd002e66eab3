"""`python -m controlplane demo`: a control plane with the sample CRs, and slo-api serving them.

The browser tests reuse the pieces: `load_samples`, `apply_samples`, `start_service` and
`wait_ready`.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Protocol

import httpx

from controlplane.admin import Admin, AdminError, Obj, load_yaml_dir
from controlplane.cluster import CONFIG, REPO, Cluster
from controlplane.jaeger import Jaeger
from controlplane.loadsim import Simulator, history_openmetrics, models
from controlplane.prometheus import Prometheus
from controlplane.server import StartError, die_with_parent

SAMPLES = CONFIG / "samples"
SCRAPE_SECONDS = 5


class ServiceError(RuntimeError):
    """slo-api did not become ready, or exited."""


def load_samples(directory: Path = SAMPLES) -> list[Obj]:
    return load_yaml_dir(directory)


def apply_samples(admin: Admin, objs: Iterable[Obj]) -> list[Obj]:
    """Apply each object without its status, then write any status through the subresource.

    The API server ignores `status` on the main resource of a kind with a status subresource,
    so a ModelPool's observed state (normally its controller's) needs its own merge patch.
    """
    objs = list(objs)
    applied = [admin.apply({k: v for k, v in obj.items() if k != "status"}) for obj in objs]
    for obj in objs:
        if obj.get("status"):
            meta = obj["metadata"]
            admin.merge_patch(
                obj["apiVersion"],
                obj["kind"],
                meta.get("namespace"),
                meta["name"],
                {"status": obj["status"]},
                subresource="status",
            )
    return applied


def start_service(
    kubeconfig: Path,
    port: int,
    token: str,
    host: str = "127.0.0.1",
    log_format: str = "console",
    stdout: IO[bytes] | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """slo-api as a child process (`python -m slo_api`), in its own session.

    Its own session keeps a terminal's Ctrl-C away from it, so the parent stops it first and
    then the control plane; if the parent dies, the kernel sends it SIGTERM.
    """
    env = {
        **os.environ,
        "SLO_API_TOKEN": token,
        "KUBECONFIG": str(kubeconfig),
        "PORT": str(port),
        "HOST": host,
        "LOG_FORMAT": log_format,
    }
    env.pop("SLO_API_TOKENS_FILE", None)
    env.update(extra_env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "slo_api"],
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


class Running(Protocol):
    """What `wait_ready` watches: a process, or anything that says when it has exited."""

    def poll(self) -> int | None: ...


def wait_ready(url: str, process: Running, timeout: float = 60) -> None:
    """Poll `GET {url}/readyz` until 200; fail early if the process exits."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    with httpx.Client(timeout=2) as http:
        while time.monotonic() < deadline:
            code = process.poll()
            if code is not None:
                raise ServiceError(f"slo-api exited with code {code} before it was ready")
            try:
                response = http.get(f"{url}/readyz")
                if response.status_code == 200:
                    return
                last = f"{response.status_code} {response.text[:200]}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            time.sleep(0.2)
    raise ServiceError(f"slo-api was not ready after {timeout:.0f}s (last: {last})")


def wait_attainment(url: str, token: str, route: str, timeout: float = 120) -> None:
    """Poll a route's attainment until slo-api's first refresh from Prometheus answered
    (`source.status` "ok"): until then every route says `unavailable`, with no figures."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=5, headers=headers) as http:
        while time.monotonic() < deadline:
            try:
                response = http.get(f"{url}/routes/{route}/attainment")
                if response.status_code == 200:
                    source = response.json()["source"]
                    if source["status"] == "ok":
                        return
                    last = f"{source['status']}: {source.get('reason')}"
                else:
                    last = f"{response.status_code} {response.text[:200]}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            time.sleep(0.5)
    raise ServiceError(f"slo-api had no attainment after {timeout:.0f}s (last: {last})")


def stop_service(process: subprocess.Popen[bytes], timeout: float = 20) -> int | None:
    """SIGTERM, wait for a graceful stop, then kill. Returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def write_env(path: Path, url: str, token: str, kubeconfig: Path) -> None:
    lines = [
        f"export SLO_API_URL={shlex.quote(url)}",
        f"export SLO_API_TOKEN={shlex.quote(token)}",
        f"export KUBECONFIG={shlex.quote(str(kubeconfig))}",
    ]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)


# Kubernetes identities for the page: RBAC, not slo-api, decides what each may do.
DEMO_NAMESPACE = "demo"
DEMO_IDENTITIES = (("demo-editor", "edit"), ("demo-viewer", "view"))


def create_demo_identities(admin: Admin, directory: Path) -> dict[str, Path]:
    """ServiceAccounts bound to the built-in `edit` and `view` roles in the demo namespace
    only; their tokens are written to files (0600) in `directory`."""
    files: dict[str, Path] = {}
    for name, role in DEMO_IDENTITIES:
        admin.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": DEMO_NAMESPACE},
            }
        )
        admin.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": name, "namespace": DEMO_NAMESPACE},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": DEMO_NAMESPACE}],
            }
        )
        path = directory / f"{name}.token"
        path.write_text(admin.service_account_token(DEMO_NAMESPACE, name) + "\n")
        path.chmod(0o600)
        files[name] = path
    return files


def start_metrics(directory: Path) -> tuple[Prometheus, Simulator]:
    """Prometheus with a month of the samples' history, scraping the load simulator.

    The simulator's routes: chat-7b meets its SLO, code-13b is at risk, reason-70b is
    violated (see controlplane/loadsim.py). The model names are the samples' own, so renamed
    copies of the samples (the browser tests') read the same series.
    """
    workdir = directory / "prometheus"
    shutil.rmtree(workdir, ignore_errors=True)  # a previous run's month would overlap this one
    simulator = Simulator(models(load_samples()))
    target = simulator.start()
    prometheus = Prometheus(workdir, scrape_config=scrape_config(target))
    try:
        # Blocks as long as the month (not hundreds of 2-hour ones: seconds, not minutes).
        history = history_openmetrics(simulator.model_names, simulator.started)
        prometheus.backfill(history, max_block_duration="720h")
        prometheus.start()
        wait_for_scrape(prometheus.url)
    except BaseException:
        prometheus.stop()
        simulator.stop()
        raise
    return prometheus, simulator


def scrape_config(target: str) -> str:
    return (
        "scrape_configs:\n"
        "  - job_name: vllm\n"
        f"    scrape_interval: {SCRAPE_SECONDS}s\n"
        "    static_configs:\n"
        f'      - targets: ["{target}"]\n'
    )


def wait_for_scrape(url: str, scrapes: int = 3, timeout: float = 60) -> None:
    """Until Prometheus has scraped the simulator a few times: a rate over the shortest window
    (5m) needs two samples of the live series, and slo-api's first refresh comes at once."""
    query = f"count_over_time(up[5m]) >= {scrapes} and up == 1"
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5) as http:
        while time.monotonic() < deadline:
            answer = http.get(f"{url}/api/v1/query", params={"query": query}).json()
            if answer.get("data", {}).get("result"):
                return
            time.sleep(0.5)
    raise StartError(f"prometheus did not scrape the load simulator in {timeout:g}s")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(directory: Path, port: int, tracing: bool = False) -> int:
    signal.signal(signal.SIGTERM, _raise_interrupt)
    directory = directory.resolve()
    cluster = Cluster()
    service: subprocess.Popen[bytes] | None = None
    jaeger: Jaeger | None = None
    metrics: tuple[Prometheus, Simulator] | None = None
    code = 0
    try:
        trace_env: dict[str, str] = {}
        if tracing:
            jaeger = Jaeger(directory / "jaeger").start()
            # Every request traced: a demo is for looking at each one.
            trace_env = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
                "OTEL_TRACES_SAMPLER_ARG": "1.0",
            }
        metrics = start_metrics(directory)
        prometheus = metrics[0]
        cluster.start(kubeconfig_dir=directory)
        assert cluster.admin is not None
        assert cluster.credentials is not None
        creds = cluster.credentials
        apply_samples(cluster.admin, load_samples())
        token = secrets.token_urlsafe(24)
        url = f"http://127.0.0.1:{port}"
        identities = create_demo_identities(cluster.admin, directory)
        service = start_service(
            creds.slo_api_kubeconfig,
            port,
            token,
            extra_env={
                "SLO_API_KUBERNETES_AUTH": "true",
                "PROMETHEUS_URL": prometheus.url,
                **trace_env,
            },
        )
        wait_ready(url, service)
        # The page and sloctl show figures from the first look on.
        wait_attainment(url, token, "chat-7b")
        env_file = directory / "env"
        write_env(env_file, url, token, creds.admin_kubeconfig)
        print(
            "\nslo-api demo is ready (sample CRs from config/samples)\n"
            f"  page:       {url}/demo-webui\n"
            f"  token:      {token}  (static write token: every route)\n"
            f"  as a user:  $(cat {identities['demo-editor']})  (ServiceAccount demo-editor:\n"
            f"              the built-in edit role in namespace {DEMO_NAMESPACE} only)\n"
            f"              $(cat {identities['demo-viewer']})  (demo-viewer: view there)\n"
            f"  shell:      source {env_file}\n"
            '  try:        curl -H "Authorization: Bearer $SLO_API_TOKEN" $SLO_API_URL/config\n'
            f"  kubeconfig: {creds.admin_kubeconfig} (admin; e.g. kubectl get llmslo -A)\n"
            f"  prometheus: {prometheus.url} (a month of history, then the load simulator:\n"
            "              chat-7b meets its SLO, code-13b is at risk, reason-70b violated;\n"
            "              sloctl attainment, or open a route on the page)\n"
            + (
                f"  traces:     {jaeger.query_url}/search?service=slo-api (Jaeger; every request)\n"
                if jaeger is not None
                else "  traces:     off (make demo TRACING=1 starts Jaeger, every request traced)\n"
            )
            + "Ctrl-C stops slo-api, the control plane and Prometheus.\n",
            flush=True,
        )
        exit_code = service.wait()
        how = f"was killed by signal {-exit_code}" if exit_code < 0 else f"exited with {exit_code}"
        print(f"slo-api {how}; stopping the control plane", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("\nstopping slo-api and the control plane", file=sys.stderr)
    except (StartError, ServiceError, AdminError, RuntimeError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if service is not None:
            stop_service(service)
        cluster.stop()
        if metrics is not None:
            metrics[0].stop()
            metrics[1].stop()
        if jaeger is not None:
            jaeger.stop()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return code
