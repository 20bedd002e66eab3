"""`python -m controlplane build` caches the binaries; `... cluster` runs a control plane."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from controlplane.binaries import ensure_all, ensure_jaeger, ensure_toxiproxy
from controlplane.cluster import Cluster
from controlplane.server import StartError


def _sigterm_as_interrupt() -> None:
    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def run_cluster(directory: Path) -> int:
    _sigterm_as_interrupt()
    cluster = Cluster()
    try:
        cluster.start(kubeconfig_dir=directory)
        assert cluster.credentials is not None
        creds = cluster.credentials
        print(
            f"control plane ready at {cluster.plane.url}\n"
            f"  admin:   export KUBECONFIG={creds.admin_kubeconfig}\n"
            f"  slo-api: export KUBECONFIG={creds.slo_api_kubeconfig}"
            "   (get/list/watch/patch on the three SLO kinds, reviews, Events)\n"
            "CRDs and RBAC from config/ are installed. Ctrl-C stops it.",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopping the control plane", file=sys.stderr)
    except StartError as exc:
        print(f"control plane failed to start: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlplane", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "build",
        help="build or find the control plane's binaries, Jaeger's and Toxiproxy's; print paths",
    )
    cluster = commands.add_parser("cluster", help="run a control plane in the foreground")
    cluster.add_argument(
        "--dir",
        type=Path,
        default=Path(".cluster"),
        help="where to write the kubeconfigs (default: .cluster)",
    )
    demo = commands.add_parser("demo", help="control plane, sample CRs and slo-api, for a look")
    demo.add_argument(
        "--dir",
        type=Path,
        default=Path(".demo"),
        help="where to write env and kubeconfigs (default: .demo)",
    )
    demo.add_argument("--port", type=int, default=8080, help="slo-api's port (default: 8080)")
    demo.add_argument(
        "--tracing",
        action="store_true",
        help="also start Jaeger (built and cached like the control plane) and trace every request",
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        from controlplane.demo import run_demo

        return run_demo(args.dir, args.port, args.tracing)
    if args.command == "build":
        binaries = ensure_all()
        print(
            f"kube-apiserver: {binaries.kube_apiserver}\n"
            f"kube-controller-manager: {binaries.kube_controller_manager}\n"
            f"etcd: {binaries.etcd}\n"
            f"jaeger: {ensure_jaeger()}\n"
            f"toxiproxy: {ensure_toxiproxy()}"
        )
        return 0
    return run_cluster(args.dir)


if __name__ == "__main__":
    sys.exit(main())
