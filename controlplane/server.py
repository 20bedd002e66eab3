"""Start and stop etcd and kube-apiserver on free loopback ports in a private directory."""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

import yaml

from controlplane.admin import kubeconfig
from controlplane.binaries import Binaries, ensure_all
from controlplane.pki import Pki, make_pki

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    # Runs in the child between fork and exec: if the test run is killed (even with SIGKILL),
    # the kernel sends the control plane SIGTERM, so no orphan etcd or API server survives.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StartError(RuntimeError):
    """A component did not become ready; the message carries the tail of its log."""


class _Process:
    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


# The controllers the tests need: the aggregation one fills ClusterRoles with an aggregationRule
# (the built-in admin, edit and view) from the ClusterRoles labelled for them, as in a real
# cluster; the garbage collector removes what a CR owns (a route's revisions) with it.
CONTROLLERS = "clusterrole-aggregation-controller,garbage-collector-controller"


class ControlPlane:
    """etcd, kube-apiserver with RBAC, TokenRequest and a client-certificate admin, and a
    kube-controller-manager running only the controllers the tests need."""

    def __init__(
        self,
        workdir: Path | None = None,
        binaries: Binaries | None = None,
        start_timeout: float = 120,
    ) -> None:
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="slo-api-cp-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binaries = binaries or ensure_all()
        self.start_timeout = start_timeout
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.controller_manager_port = free_port()
        self.pki: Pki = make_pki(self.workdir / "pki")
        self.url = f"https://127.0.0.1:{self.port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self._etcd = _Process("etcd", self._etcd_argv(), self.workdir / "etcd.log")
        self._apiserver = _Process(
            "kube-apiserver", self._apiserver_argv(), self.workdir / "kube-apiserver.log"
        )
        self._controller_manager = _Process(
            "kube-controller-manager",
            self._controller_manager_argv(),
            self.workdir / "kube-controller-manager.log",
        )

    def _etcd_argv(self) -> list[str]:
        return [
            str(self.binaries.etcd),
            "--name=slo-api-test",
            f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
            f"--initial-cluster=slo-api-test=http://127.0.0.1:{self.etcd_peer_port}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]

    def _apiserver_argv(self) -> list[str]:
        return [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={self.pki.serving_cert}",
            f"--tls-private-key-file={self.pki.serving_key}",
            f"--client-ca-file={self.pki.ca_cert}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={self.url}/",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--disable-admission-plugins=ServiceAccount",
            "--enable-priority-and-fairness=false",
            "--v=1",
        ]

    def _controller_manager_argv(self) -> list[str]:
        return [
            str(self.binaries.kube_controller_manager),
            f"--kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
            f"--controllers={CONTROLLERS}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.controller_manager_port}",
            f"--cert-dir={self.workdir / 'controller-manager-certs'}",
            "--use-service-account-credentials=false",
            "--v=1",
        ]

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        try:
            self.start_etcd()
            self.start_apiserver()
            self.start_controller_manager()
        except BaseException:
            self.stop()
            raise
        return self

    def start_etcd(self) -> None:
        self._etcd.start()
        self._wait(self._etcd, f"{self.etcd_url}/health", None)

    def start_apiserver(self) -> None:
        self._apiserver.start()
        self._wait(self._apiserver, f"{self.url}/readyz", self._ssl_context())

    def start_controller_manager(self) -> None:
        config = kubeconfig(
            self.url,
            self.pki.ca_cert,
            user="admin",
            cert=(self.pki.admin_cert, self.pki.admin_key),
        )
        path = self.workdir / "controller-manager.kubeconfig"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        self._controller_manager.start()
        # It serves /healthz with a certificate of its own making: the port answering is
        # what is waited for, not who signed it.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        self._wait(
            self._controller_manager,
            f"https://127.0.0.1:{self.controller_manager_port}/healthz",
            context,
        )

    def stop_apiserver(self) -> None:
        self._apiserver.stop()

    def signal_apiserver(self, signum: int) -> None:
        """Send kube-apiserver a signal (the robustness harness pauses it: SIGSTOP, SIGCONT)."""
        proc = self._apiserver.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)

    def restart_apiserver(self) -> None:
        self.stop_apiserver()
        self.start_apiserver()

    def stop(self) -> None:
        self._controller_manager.stop()
        self._apiserver.stop()
        self._etcd.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers ---------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def _wait(self, process: _Process, url: str, context: ssl.SSLContext | None) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if not process.running():
                raise StartError(
                    f"{process.name} exited during start-up; its log ends:\n{process.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as response:  # noqa: S310
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.25)
        raise StartError(
            f"{process.name} was not ready within {self.start_timeout:.0f}s ({last}); "
            f"its log ends:\n{process.log_tail()}"
        )

    def etcd_call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One call to etcd's JSON gateway (for compaction in fault tests)."""
        import json

        request = urllib.request.Request(  # noqa: S310 - loopback etcd
            f"{self.etcd_url}{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            result: dict[str, Any] = json.loads(response.read())
            return result

    def compact_etcd(self) -> int:
        """Compact etcd's history up to now; watches from older revisions get 410."""
        revision = int(self.etcd_call("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        self.etcd_call("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision
