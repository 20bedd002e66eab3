"""sloctl: read and change slo-api routes from a terminal.

See ``slo_api.cli`` for the exit codes; ``sloctl --help`` lists them too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from slo_api import __version__  # the package's (not the server's): pyproject.toml's
from slo_api.cli import commands
from slo_api.cli.client import SloClient
from slo_api.cli.errors import EXIT_CODES_HELP, CliError, ExitCode, usage
from slo_api.cli.kubeconfig import check_transport, token_from_kubeconfig
from slo_api.cli.output import FORMATS

DEFAULT_TIMEOUT = 10.0

Command = Callable[[SloClient, argparse.Namespace], int]

ENVIRONMENT_HELP = """\
environment:
  SLO_API_URL    server base URL, e.g. http://localhost:8080 (or --server)
  SLO_API_TOKEN  bearer token (or --token-file, which keeps it out of the environment too;
                 --token puts it in the process list)
  KUBECONFIG     without a token: the current context's token, tokenFile or exec plugin
                 (or --kubeconfig), for slo-api's Kubernetes identities; sent only over
                 https:// or to loopback, and the context is named on stderr"""

SET_HELP = """\
keys (dotted paths as `sloctl get` shows them):
  priority=10                 0..10; highPriority=true is the same as priority=10
  highPriority=false          priority 0
  min=2  min=replica:2        minimumDeployment; N alone means type replica
  max=pdengine:2  max=null    maximumDeployment; null asks to remove it
  minimumDeployment.value=3   any dotted path into the body
  ttft.default.p90=0.8        the threshold of that metric type, added if absent; null removes it
  otps.default.avg=20
  ttft.ranges.0.p99=3         a numeric segment indexes a list
  ttft.ranges=[]              JSON values work: [], {...}, "quoted string"
  queue.maxDepth=20  queue.promql='sum(jobs_pending)'
  pool.default=chat-7b  pool.swapPolicy=sticky  pool.swapBudget=90s  pool.reclaimAfter=5m

Values that read as JSON (numbers, true/false, null, [..], {..}, "..") are sent as JSON,
anything else as a string. set reads the route, changes it, and sends only the changed
top-level fields (a changed section such as ttft goes whole) with If-Match; if the route
changed meanwhile it re-reads and retries up to 3 times. `get` shows the fields a GitOps tool
manages under managed.*: changing one is refused (change it where the tool syncs from), unless
--force, which writes it anyway and prints the server's warning."""


def _common_options() -> argparse.ArgumentParser:
    # SUPPRESS as the default lets an option be given before or after the command name
    # without the subcommand's default overwriting the value given before it.
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument(
        "--server", default=argparse.SUPPRESS, help="slo-api base URL (default: $SLO_API_URL)"
    )
    group.add_argument(
        "--token", default=argparse.SUPPRESS, help="bearer token (default: $SLO_API_TOKEN)"
    )
    group.add_argument(
        "--token-file",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="read the bearer token from a file; - for stdin",
    )
    group.add_argument(
        "--kubeconfig",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="without a token, send the current context's (default: $KUBECONFIG)",
    )
    group.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help=f"per-request timeout (default: {DEFAULT_TIMEOUT:g})",
    )
    group.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=argparse.SUPPRESS,
        help="output format (default: table)",
    )
    return common


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    formatter = argparse.RawDescriptionHelpFormatter
    epilog = f"{EXIT_CODES_HELP}\n\n{ENVIRONMENT_HELP}"
    parser = argparse.ArgumentParser(
        prog="sloctl",
        description="Read and change the SLO settings of inference routes through slo-api.",
        epilog=epilog,
        formatter_class=formatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"sloctl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, help_text: str, handler: Command, extra: str = ""
    ) -> argparse.ArgumentParser:
        command = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=f"{extra}\n\n{epilog}" if extra else epilog,
            formatter_class=formatter,
            parents=[common],
        )
        command.set_defaults(handler=handler)
        return command

    listing = add(
        "list", "list every route with its priority, bounds and pool state", commands.cmd_list
    )
    listing.add_argument("--kind", choices=("llm", "job", "pool"), help="only routes of this kind")

    watching = add(
        "watch",
        "print route changes as they happen (the current routes first)",
        commands.cmd_watch,
        "Runs until interrupted. A lost connection is resumed where it stopped, so no change\n"
        "is missed; if the server no longer has that place (it restarted), the current\n"
        "routes are compared with what was printed: a RESYNC line, then what was added,\n"
        "changed or deleted meanwhile. -o json prints one event per line:\n"
        '{"type": "ADDED"|"MODIFIED"|"DELETED"|"RESYNC", "route", "object", "revision"}.',
    )
    watching.add_argument("--kind", choices=("llm", "job", "pool"), help="only routes of this kind")

    get = add("get", "show one route", commands.cmd_get)
    get.add_argument("route", help="route name")

    setter = add("set", "change fields of one route", commands.cmd_set, SET_HELP)
    setter.add_argument("route", help="route name")
    setter.add_argument("assignments", nargs="+", metavar="key=value")
    setter.add_argument(
        "--force",
        action="store_true",
        help="write without If-Match (over concurrent changes) and over fields a GitOps tool "
        "manages (it will revert them at its next sync)",
    )
    _dry_run(setter)

    apply = add(
        "apply",
        "send route bodies from a file",
        commands.cmd_apply,
        "The file holds one body, a list of bodies, or several YAML documents; each body has\n"
        "a route. Each is sent as a PUT as given: fields left out keep their stored values,\n"
        "a section sent (ttft, otps, queue) replaces the stored one. `sloctl get ROUTE -o yaml`\n"
        "gives a body to edit and apply.",
    )
    apply.add_argument(
        "-f", "--filename", required=True, metavar="FILE", help="JSON or YAML file; - for stdin"
    )
    _force(apply)
    _dry_run(apply)

    reset = add(
        "reset",
        "reset a route's client-owned fields to their defaults (the route stays)",
        commands.cmd_reset,
    )
    reset.add_argument("route", help="route name")
    _force(reset)
    _dry_run(reset)

    history = add(
        "history",
        "show who changed a route, when, and from what (newest first)",
        commands.cmd_history,
    )
    history.add_argument("route", help="route name")

    revert = add(
        "revert",
        "put a route back as a history entry left it",
        commands.cmd_revert,
        "Sends the entry's body with If-Match from a fresh read: if the route changes in\n"
        "between, nothing is written and sloctl exits 4. Fields set now that the entry did\n"
        "not have are removed.",
    )
    revert.add_argument("route", help="route name")
    revert.add_argument("entry", help="the entry's ID (from `sloctl history ROUTE`)")
    _dry_run(revert)

    attainment = add(
        "attainment",
        "show whether routes meet their SLOs: observed, error budget left, status",
        commands.cmd_attainment,
        "Figures come from slo-api's Prometheus. TARGET is the objective (p90<=0.8s: 90% of\n"
        "requests within 0.8 s; otps p50>=30/s), OBSERVED the window's percentile or average\n"
        "(~ when a threshold falls between histogram buckets and is estimated), BUDGET the\n"
        "error budget left over the window (negative when overspent), STATUS met, at_risk\n"
        "(burning fast now), violated or no_data (with why: no_series, no_traffic,\n"
        "insufficient_traffic), EXHAUSTS when the budget runs out at the 1h or 6h burn rate\n"
        "(the sooner; - when it never does at that rate). Per-range targets are listed as\n"
        "unmeasured: vLLM's metrics carry no context length.",
    )
    attainment.add_argument("route", nargs="?", help="one route (default: every route)")
    attainment.add_argument(
        "--window", choices=("1h", "1d", "7d", "28d"), help="the SLO window (server default: 28d)"
    )
    attainment.add_argument(
        "--sort",
        choices=("budget",),
        help="list the routes with the least budget left first (routes without one last)",
    )

    rules_parser = add(
        "rules",
        "write a PrometheusRule (YAML) with recording rules and burn-rate alerts for the "
        "routes you may read",
        commands.cmd_rules,
        "For each percentile objective of a route's ttft/otps defaults: the error ratio over\n"
        "5m, 30m, 1h, 6h and 3d (slo:sli_error:ratio_rate<w>) from vLLM's histograms, and alerts\n"
        "labelled route, metric, type, threshold: SLOErrorBudgetBurnFast (severity page: burn\n"
        "rate above 13.44 over 1h and 5m, or above 5.6 over 6h and 30m, for a 28-day budget;\n"
        "capped where more than half the requests would have to miss), SLOErrorBudgetBurnSlow\n"
        "(ticket: above 0.933 over 3d and 6h) and SLOThresholdBucketMissing (ticket: the bucket\n"
        "counted at has no series). The bucket, the arms and the series of a route are the ones\n"
        "slo-api names (its attainment's alerting and selectors). A threshold between bucket\n"
        "bounds is counted at the bound below it (conservative; each alert's threshold_bucket\n"
        "annotation says so). Averages and job routes have no error budget and get no rules\n"
        "(named on stderr), and stderr names any arm that cannot fire.\n"
        "  sloctl rules > slo-rules.yaml && kubectl apply -f slo-rules.yaml",
    )
    rules_parser.add_argument(
        "--name", default="slo-api-objectives", help="the PrometheusRule's name"
    )
    rules_parser.add_argument("--namespace", help="the PrometheusRule's namespace")
    return parser


def _force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help="write over fields a GitOps tool manages (it will revert them at its next sync)",
    )


def _dry_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run", action="store_true", help="have the server validate only; nothing is stored"
    )


def _token(args: argparse.Namespace) -> str | None:
    """--token, else --token-file, else $SLO_API_TOKEN (else, in main, the kubeconfig's)."""
    token: str | None = getattr(args, "token", None)
    path: str | None = getattr(args, "token_file", None)
    if path is None:
        return token or os.environ.get("SLO_API_TOKEN")
    if token is not None:
        raise usage("pass --token or --token-file, not both")
    if path == "-" and getattr(args, "filename", None) == "-":
        raise usage("stdin can hold the token or the bodies, not both: use a file for one")
    where = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise usage(f"cannot read the token from {where}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise usage(f"cannot read the token from {where}: it is not UTF-8") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise usage(f"the token file {where} is empty")
    if len(lines) > 1:
        raise usage(f"the token file {where} must hold one line: the token")
    return lines[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return exc.code if isinstance(exc.code, int) else ExitCode.USAGE
    server = getattr(args, "server", None) or os.environ.get("SLO_API_URL")
    # Only a kubeconfig asked for (flag or KUBECONFIG), never ~/.kube/config by default:
    # a cluster credential goes to slo-api only when the user points at it.
    kubeconfig = getattr(args, "kubeconfig", None) or os.environ.get("KUBECONFIG")
    args.timeout = getattr(args, "timeout", DEFAULT_TIMEOUT)
    args.output = getattr(args, "output", "table")
    handler: Command = args.handler
    try:
        if not server:
            raise usage("no server: pass --server or set SLO_API_URL")
        token = _token(args)
        if not token and kubeconfig:
            credential = token_from_kubeconfig(kubeconfig)
            check_transport(server, credential)
            # Which cluster identity is being lent to slo-api, said every time: the current
            # context may well be another cluster's.
            print(
                f"sloctl: using the credentials of kubeconfig context {credential.context!r} "
                f"(user {credential.user!r})",
                file=sys.stderr,
            )
            token = credential.token
        with SloClient(server, token, args.timeout) as client:
            return handler(client, args)
    except CliError as exc:
        commands.report_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`sloctl list | head`): not a failure. Point stdout at devnull
        # so the interpreter's final flush does not complain either.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
