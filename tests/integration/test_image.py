"""The image, built from the real Dockerfile and run the way config/manager's Deployment runs it.

No image registry is reachable from the test machines, so the base is made from Debian's
packages with mmdebstrap (cached; see release/image.py) and passed as the Dockerfile's
PYTHON_IMAGE. The container runs with the Deployment's security context (its user, a read-only
root filesystem with a tmpfs /tmp, every capability dropped, no privilege escalation) against the
session's control plane, with the slo-api ServiceAccount's token in a kubeconfig mounted
read-only. Where podman cannot run at all these tests fail: the image is part of what ships.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import resource
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from packaging.utils import canonicalize_name

from controlplane.admin import Admin
from controlplane.demo import ServiceError, wait_ready
from controlplane.server import free_port
from release import image as images
from release import lock as locks
from release.version import version
from tests.integration import crs

# The first test also makes the base (mmdebstrap, about a minute and a half when not cached) and
# builds the image; later runs take their caches.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
# One tag per checkout, so test runs of two checkouts on one machine never run each other's build.
TAG = f"localhost/slo-api:test-{hashlib.sha256(str(REPO).encode()).hexdigest()[:8]}"
TOKEN = "image-test-token"
SOURCE = "https://git.example.com/platform/slo-api"
# Installers, by file or directory name, that no base may leave in the final image.
INSTALLERS = (
    "pip", "pip-*", "pip3", "pip3.*", "setuptools", "setuptools-*", "wheel", "wheel-*",
    "easy_install*", "_distutils_hack", "pkg_resources", "ensurepip",
)  # fmt: skip
KUBECONFIG_IN_CONTAINER = "/etc/slo-api/kubeconfig"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", re.M)


def _deployment() -> dict[str, Any]:
    path = REPO / "config" / "manager" / "deployment.yaml"
    found: list[dict[str, Any]] = [
        d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Deployment"
    ]
    return found[0]


POD = _deployment()["spec"]["template"]["spec"]
CONTAINER = next(c for c in POD["containers"] if c["name"] == "slo-api")
SECURITY = {**POD.get("securityContext", {}), **CONTAINER["securityContext"]}
# Kubernetes sends SIGTERM after the preStop hook, within the same grace period.
PRESTOP_SECONDS = int(CONTAINER["lifecycle"]["preStop"]["sleep"]["seconds"])
STOP_WITHIN = POD["terminationGracePeriodSeconds"] - PRESTOP_SECONDS


def _podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


def _ulimits() -> list[str]:
    """Explicit limits below the host's: the runtime cannot raise one above its caller's."""
    flags = []
    for name, which, wanted in (
        ("nofile", resource.RLIMIT_NOFILE, 4096),
        ("nproc", resource.RLIMIT_NPROC, 4096),
    ):
        soft, _ = resource.getrlimit(which)
        value = wanted if soft == resource.RLIM_INFINITY else min(wanted, soft)
        flags += ["--ulimit", f"{name}={value}:{value}"]
    return flags


def _security_flags() -> list[str]:
    """podman's spelling of the Deployment's securityContext and its /tmp emptyDir."""
    assert SECURITY["readOnlyRootFilesystem"] is True
    assert SECURITY["capabilities"]["drop"] == ["ALL"]
    assert SECURITY["allowPrivilegeEscalation"] is False
    assert SECURITY["seccompProfile"]["type"] == "RuntimeDefault"  # podman's default profile
    tmp = next(v for v in POD["volumes"] if v["name"] == "tmp")
    size = tmp["emptyDir"]["sizeLimit"].replace("Mi", "m")
    return [
        "--read-only",
        "--read-only-tmpfs=false",  # only what the Deployment mounts is writable
        "--tmpfs",
        f"/tmp:rw,size={size},mode=1777",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
    ]


# The runtime podman uses here, and the host's network: the container reaches the control plane
# on loopback and listens on loopback only.
RUN_FLAGS = ["--runtime", "runc", "--network", "host", *_ulimits()]


@pytest.fixture(scope="module")
def image() -> str:
    problem = images.podman_problem()
    if problem:
        pytest.fail(f"podman cannot run on this machine, so the image cannot be tested: {problem}")
    try:
        base = images.debian_base()
        images.build(TAG, base, source=SOURCE)
    except images.ImageError as exc:
        pytest.fail(str(exc))
    return TAG


def _container_kubeconfig(host_kubeconfig: Path, directory: Path) -> Path:
    """The slo-api kubeconfig with its CA inlined (the host path means nothing inside)."""
    config = yaml.safe_load(host_kubeconfig.read_text())
    for cluster in config["clusters"]:
        ca = Path(cluster["cluster"].pop("certificate-authority"))
        cluster["cluster"]["certificate-authority-data"] = base64.b64encode(
            ca.read_bytes()
        ).decode()
    path = directory / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o444)  # the container's user is not the file's owner, as with a Secret volume
    return path


@dataclass
class Container:
    name: str
    url: str

    def logs(self) -> str:
        """What the container wrote, both streams (slo-api logs to stderr)."""
        done = subprocess.run(
            ["podman", "logs", self.name], capture_output=True, text=True, timeout=60, check=False
        )
        return done.stdout + done.stderr

    def host_pid(self) -> int:
        return int(_podman("inspect", "--format", "{{.State.Pid}}", self.name).strip())

    def state(self) -> str:
        return _podman("inspect", "--format", "{{.State.Status}}", self.name).strip()

    def poll(self) -> int | None:
        """None while the container runs, else its exit code (as `Popen.poll`)."""
        if self.state() in ("created", "running"):
            return None
        return int(_podman("inspect", "--format", "{{.State.ExitCode}}", self.name).strip())


@pytest.fixture
def container(image: str, slo_api_kubeconfig: Path, tmp_path: Path) -> Iterator[Container]:
    kubeconfig = _container_kubeconfig(slo_api_kubeconfig, tmp_path)
    port = free_port()
    name = f"slo-api-test-{uuid.uuid4().hex[:8]}"
    _podman(
        "run", "--detach", "--name", name, *RUN_FLAGS, *_security_flags(),
        "--volume", f"{kubeconfig}:{KUBECONFIG_IN_CONTAINER}:ro",
        "--env", f"KUBECONFIG={KUBECONFIG_IN_CONTAINER}",
        "--env", f"SLO_API_TOKEN={TOKEN}",
        "--env", f"PORT={port}",
        "--env", "HOST=127.0.0.1",
        "--env", "LOG_FORMAT=json",
        image,
    )  # fmt: skip
    started = Container(name, f"http://127.0.0.1:{port}")
    try:
        try:
            wait_ready(started.url, started, 90)
        except ServiceError as exc:
            raise AssertionError(f"{exc}: {started.logs()}") from None
        yield started
    finally:
        _podman("rm", "--force", "--time", "0", name, check=False)


def _run_python(image: str, code: str) -> str:
    """Runs code with the image's own interpreter and environment, as its user."""
    return _podman(
        "run", "--rm", *RUN_FLAGS, *_security_flags(),
        "--entrypoint", "/opt/venv/bin/python", image, "-c", code,
    )  # fmt: skip


def _status_fields(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


# -- what the image holds -----------------------------------------------------------------------


def test_the_image_runs_slo_api_as_the_numeric_non_root_user(image: str) -> None:
    config = json.loads(_podman("image", "inspect", "--format", "{{json .Config}}", image))
    user = f"{SECURITY['runAsUser']}:{SECURITY['runAsGroup']}"
    assert config["User"] == user
    assert config["Entrypoint"] == ["slo-api"]
    assert str(CONTAINER["ports"][0]["containerPort"]) + "/tcp" in config["ExposedPorts"]


def test_the_image_holds_exactly_the_locked_versions_and_no_build_tools(image: str) -> None:
    installed = json.loads(
        _run_python(
            image,
            "import importlib.metadata as m, importlib.util as u, json, shutil; "
            "print(json.dumps({'dists': {d.metadata['Name']: d.version for d in m.distributions()},"
            " 'tools': [t for t in ('pip', 'hatchling', 'setuptools') if u.find_spec(t)]"
            " + [t for t in ('gcc', 'cc', 'pip', 'pip3') if shutil.which(t)]}))",
        )
    )
    locked = {canonicalize_name(n): v for n, v in PIN.findall(locks.RUNTIME.path.read_text())}
    dists = {canonicalize_name(n): v for n, v in installed["dists"].items()}
    project = locks.read_pyproject()["project"]
    assert isinstance(project, dict)
    assert dists.pop(canonicalize_name("slo-api")) == project["version"]
    assert dists == locked
    assert installed["tools"] == []


def test_no_installer_is_left_anywhere_in_the_image(image: str) -> None:
    """Not only in /opt/venv: the base's own Python (python:*-slim ships pip, setuptools and
    wheel; Debian's venv module their wheels) is searched too, so whichever base was built."""
    found = json.loads(
        _run_python(
            image,
            "import fnmatch, json, os\n"
            f"patterns = {INSTALLERS!r}\n"
            "found = []\n"
            "for root, dirs, files in os.walk('/'):\n"
            "    if root in ('/proc', '/sys', '/dev'):\n"
            "        dirs[:] = []\n"
            "        continue\n"
            "    found += [os.path.join(root, n) for n in dirs + files\n"
            "              if any(fnmatch.fnmatch(n, p) for p in patterns)]\n"
            "print(json.dumps(found))\n",
        )
    )
    assert found == []


def test_the_image_is_labelled_with_its_version_source_revision_and_creation(image: str) -> None:
    labels = json.loads(_podman("image", "inspect", "--format", "{{json .Labels}}", image))
    expected = images.labels(SOURCE)
    assert labels["org.opencontainers.image.version"] == version()
    # The installed package says the same (`slo-api --version`).
    assert _run_python(image, "import slo_api; print(slo_api.__version__)").strip() == version()
    assert labels["org.opencontainers.image.source"] == SOURCE
    assert labels["org.opencontainers.image.revision"] == expected["REVISION"]
    assert labels["org.opencontainers.image.created"] == expected["CREATED"]
    license_id = locks.read_pyproject()["project"]
    assert isinstance(license_id, dict)
    assert labels["org.opencontainers.image.licenses"] == license_id["license"]


# -- the running container ----------------------------------------------------------------------


def test_the_container_runs_locked_down_and_serves_reads_and_writes(
    container: Container, admin: Admin, namespace: str
) -> None:
    pid = container.host_pid()
    # Exec form: slo-api itself is PID 1 of the container, not a shell.
    assert "slo-api" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    status = _status_fields(pid)
    assert status["Uid"].split() == [str(SECURITY["runAsUser"])] * 4
    assert status["Gid"].split() == [str(SECURITY["runAsGroup"])] * 4
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    writes = _podman(
        "exec", container.name, "/opt/venv/bin/python", "-c",
        "import errno\n"
        "for path in ('/opt/venv/x', '/etc/x', '/tmp/x'):\n"
        "    try:\n"
        "        open(path, 'w').close(); print(path, 'written')\n"
        "    except OSError as e:\n"
        "        print(path, errno.errorcode[e.errno])\n",
    )  # fmt: skip
    assert writes.split("\n")[:3] == ["/opt/venv/x EROFS", "/etc/x EROFS", "/tmp/x written"]

    route = f"image-{namespace}"
    admin.create(crs.llm(namespace, "chat", service_id=route, priority=3))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=container.url, headers=auth, timeout=30) as http:
        deadline = time.monotonic() + 30
        while (read := http.get(f"/routes/{route}")).status_code == 404:
            assert time.monotonic() < deadline, f"{route} never indexed: {container.logs()}"
            time.sleep(0.1)
        assert read.status_code == 200, read.text
        assert read.json()["priority"] == 3

        written = http.put(f"/routes/{route}", json={"priority": 7})
        assert written.status_code == 200, written.text
        assert written.json()["priority"] == 7
        stored = admin.get(crs.SLO, "LLMSLORequirement", namespace, "chat")
        assert stored["spec"]["priority"] == 7
        assert http.get(f"/routes/{route}").json()["priority"] == 7

        metrics = http.get("/metrics")
        assert 'slo_api_upstream_requests_total{code="200",verb="patch"}' in metrics.text


def test_sigterm_stops_the_container_with_exit_0_within_the_grace_period(
    container: Container,
) -> None:
    _podman("kill", "--signal", "TERM", container.name)
    try:
        code = _podman("wait", container.name, timeout=STOP_WITHIN).strip()
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {STOP_WITHIN}s after SIGTERM: {container.logs()}")
    logs = container.logs()
    assert code == "0", logs
    assert "Unclosed client session" not in logs
    assert "Traceback" not in logs
    # JSON lines, as the Deployment asks for, through to the end of the shutdown.
    lines = [json.loads(line) for line in logs.splitlines()]
    assert "Application shutdown complete." in [line.get("message") for line in lines], logs
