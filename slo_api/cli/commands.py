"""What each sloctl command does, given parsed arguments and a client."""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml

from slo_api.cli import output, rules
from slo_api.cli.client import Body, SloClient, StreamLost
from slo_api.cli.errors import CliError, ExitCode, usage
from slo_api.cli.keys import apply_assignment, changed_fields, parse_assignment

# A 412 means someone wrote between our GET and PUT; re-reading and re-applying is safe because
# the edit is expressed as key=value changes, not as a whole body.
MAX_RETRIES = 3


def warn(message: str) -> None:
    # Messages quote route names and the server's words: neither may steer the terminal.
    print(f"sloctl: {output.printable(message)}", file=sys.stderr)


def warnings(client: SloClient) -> None:
    """The server's warnings (a forced write: which tool will revert it), once each."""
    for text in client.warnings:
        warn(f"warning: {text}")
    client.warnings.clear()


def show(data: Any, fmt: str) -> None:
    print(output.dump(data, fmt))


def show_list(items: list[Body], fmt: str, table: Callable[[list[Body]], str], none: str) -> None:
    """A list as JSON or YAML, or as a table; `none` is said (not printed) when it is empty."""
    if fmt != "table":
        show(items, fmt)
    elif items:
        print(table(items))
    else:
        warn(none)


def said_done(route: str, dry_run: bool, did: str, would: str = "", then: str = "") -> None:
    """`route: updated`, or what would have been done for a dry run."""
    outcome = (would or f"would be {did}") + " (dry run)" if dry_run else did
    print(f"{output.printable(route)}: {outcome}{then}")


def show_changes(before: Body, after: Body) -> None:
    print("\n".join(output.changes(before, after)) or "  (no visible change)")


def cmd_list(client: SloClient, args: argparse.Namespace) -> int:
    show_list(
        client.list_summaries(args.kind),
        args.output,
        lambda items: output.summaries_table(items, client.summary_fields()),
        "no routes found",
    )
    return ExitCode.OK


RECONNECT_MAX_SECONDS = 10.0


def cmd_watch(client: SloClient, args: argparse.Namespace) -> int:
    """Print changes as they come; after a lost connection, resume where the stream was.

    When the server cannot resume (410, or it ended the stream with `expired`), the whole
    state comes again: it is compared with what was printed, as client-go's Replace does, so
    a route that went away meanwhile is printed as DELETED. A RESYNC line marks that.
    """
    since: str | None = None
    delay = 0.5
    connected_once = False
    ended_in_order = False  # the last stream ended with a final bookmark
    printed: dict[str, Any] = {}  # route -> the object last printed for it
    shape = client.summary_fields() if args.output == "table" else {}
    while True:
        # A stream opened without `since` starts with the whole state; a place in it is only
        # worth resuming from once the initial bookmark said that state was complete.
        resumable = since is not None
        # Starting over after having printed: collect the state, then print the difference.
        snapshot: dict[str, Any] | None = None if resumable or not connected_once else {}
        ended_in_order = False
        try:
            for event in client.watch(args.kind, since):
                connected_once = True
                delay = 0.5
                kind = event.get("type")
                revision = event.get("revision")
                if kind == "ERROR":
                    error = event.get("error") or {}
                    code = error.get("code")
                    message = str(error.get("message") or code or "error")
                    if code in ("unauthorized", "forbidden"):
                        raise CliError(f"the server ended the watch: {message}", ExitCode.AUTH)
                    if code == "expired":
                        since = None  # the server says: watch again from the whole state
                    raise StreamLost(message)
                if kind == "BOOKMARK" and event.get("initial"):
                    resumable = True
                    if snapshot is not None:
                        _resync(printed, snapshot, revision, args.output, shape)
                        snapshot = None
                if resumable and isinstance(revision, str):
                    since = revision
                if kind == "BOOKMARK" and event.get("final") and since is not None:
                    # The server ended the stream in order (its lifetime is over, or it
                    # stops): resume from here at once, nothing lost.
                    ended_in_order = True
                    break
                if kind == "BOOKMARK":
                    continue
                route = event.get("route")
                if snapshot is not None:
                    if isinstance(route, str):
                        snapshot[route] = event
                    continue
                if isinstance(route, str):
                    if kind == "DELETED":
                        printed.pop(route, None)
                    else:
                        printed[route] = event.get("object")
                print_event(event, args.output, shape)
        except StreamLost as exc:
            if not connected_once:
                raise CliError(f"the watch ended at once: {exc}", ExitCode.SERVER) from None
            warn(f"stream lost ({exc}); resuming in {delay:g}s")
        except CliError as exc:
            if exc.status == 410 and since is not None:
                warn("the server no longer has our place in its history; starting over")
                since = None
                continue
            if exc.status in (429, 502, 503, 504):
                warn(f"{exc.message}; retrying in {delay:g}s")
            else:
                raise
        if ended_in_order:
            continue
        time.sleep(delay)
        delay = min(RECONNECT_MAX_SECONDS, delay * 2)


def _resync(
    printed: dict[str, Any],
    snapshot: dict[str, Any],
    revision: Any,
    fmt: str,
    shape: output.Shape,
) -> None:
    """Print what changed between what was printed and the new whole state."""
    print_event({"type": "RESYNC", "revision": revision}, fmt, shape)
    for route in sorted(printed.keys() - snapshot.keys()):
        event = {"type": "DELETED", "route": route, "object": printed.pop(route)}
        print_event(event, fmt, shape)
    for route in sorted(snapshot):
        event = snapshot[route]
        before = printed.get(route)
        if before == event.get("object"):
            continue
        change = {**event, "type": "ADDED" if route not in printed else "MODIFIED"}
        printed[route] = event.get("object")
        print_event(change, fmt, shape)


def print_event(event: Body, fmt: str, shape: output.Shape) -> None:
    if fmt == "json":
        print(json.dumps(event, ensure_ascii=False), flush=True)
    elif fmt == "yaml":
        print("---\n" + output.dump(event, "yaml"), flush=True)
    else:
        print(output.event_line(event, shape), flush=True)


def cmd_get(client: SloClient, args: argparse.Namespace) -> int:
    body, _ = client.get(args.route)
    if args.output == "table":
        print(output.key_values(output.flatten(body)))
    else:
        show(body, args.output)
    return ExitCode.OK


def cmd_set(client: SloClient, args: argparse.Namespace) -> int:
    route: str = args.route
    # Parse everything before the first request, so a typo costs no round trip.
    assignments = [parse_assignment(text) for text in args.assignments]
    for attempt in range(MAX_RETRIES + 1):
        before, etag = client.get(route)
        after = copy.deepcopy(before)
        for assignment in assignments:
            apply_assignment(after, assignment)
        fields = changed_fields(before, after)
        if not fields:
            if args.output == "table":
                print(f"{output.printable(route)}: unchanged, nothing sent")
            else:
                show(before, args.output)
            return ExitCode.OK
        # Only the changed fields: a section sent replaces the stored one, so it goes whole,
        # and fields left out keep whatever someone else wrote meanwhile.
        patch: Body = {"route": route}
        patch.update((field, after[field]) for field in fields)
        if_match = None if args.force else etag
        if not args.force and not etag and attempt == 0:
            warn("the server sent no ETag; writing without If-Match")
        try:
            stored = client.put(
                route, patch, if_match=if_match, dry_run=args.dry_run, force=args.force
            )
        except CliError as exc:
            if exc.status != 412:
                raise
            if attempt < MAX_RETRIES:
                warn(f"{route} changed since it was read; retrying")
                continue
            raise CliError(
                f"{route} kept changing while being edited; gave up after {attempt + 1} tries",
                ExitCode.CONFLICT,
                status=412,
                details=("hint: retry, or pass --force to write without If-Match",),
            ) from None
        warnings(client)
        if args.output == "table":
            said_done(route, args.dry_run, "updated")
            show_changes(before, stored)
        else:
            show(stored, args.output)
        return ExitCode.OK
    raise AssertionError("unreachable: the loop returns or raises")


def cmd_apply(client: SloClient, args: argparse.Namespace) -> int:
    bodies, many = load_bodies(args.filename)
    results: list[Body] = []
    failure: CliError | None = None
    for body in bodies:
        route = body["route"]
        try:
            stored = client.put(route, body, dry_run=args.dry_run, force=args.force)
        except CliError as exc:
            # Server trouble would fail every remaining body the same way; a refused body does not.
            if exc.exit_code == ExitCode.SERVER:
                raise
            report_error(exc, prefix=f"{route}: ")
            failure = failure or exc
            continue
        results.append(stored)
        warnings(client)
        if args.output == "table":
            said_done(route, args.dry_run, "configured")
    if args.output != "table" and results:
        show(results if many else results[0], args.output)
    return failure.exit_code if failure else ExitCode.OK


def cmd_reset(client: SloClient, args: argparse.Namespace) -> int:
    route: str = args.route
    result = client.delete(route, dry_run=args.dry_run, force=args.force)
    warnings(client)
    if args.output == "table":
        said_done(route, args.dry_run, "reset to defaults", would="would be reset")
        return ExitCode.OK
    if result is None:
        # 204 carries no body; show what the route looks like now.
        result, _ = client.get(route)
    show(result, args.output)
    return ExitCode.OK


def cmd_history(client: SloClient, args: argparse.Namespace) -> int:
    entries = client.history(args.route)
    show_list(entries, args.output, output.history_table, f"no recorded changes for {args.route}")
    return ExitCode.OK


# What a GET shows that is not the client's to restore (the API's read-only fields).
READ_ONLY = frozenset({"route", "kind", "status", "highPriority"})
POOL_READ_ONLY = frozenset({"members", "gpu"})


def revert_body(after: Body, current: Body) -> Body:
    """The PUT that brings `current` back to a history entry's `after`: its fields, and null
    for each field set now that was not set then (a PUT leaves out-of-body fields alone)."""
    body: Body = copy.deepcopy(after)
    body["route"] = current.get("route")
    pooled = current.get("kind") == "pool"
    for key in current:
        if key in READ_ONLY or key == "pool" or key in body:
            continue
        body[key] = None
    if pooled:
        wanted = body.setdefault("pool", {})
        for key in current.get("pool") or {}:
            if key not in POOL_READ_ONLY and key not in wanted:
                wanted[key] = None
    return body


def _digest(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"digest", "size"}
        and str(value["digest"]).startswith("sha256:")
    )


def digested_fields(after: Body) -> list[str]:
    """The fields of an entry's `after` that the server kept only as a digest (too large)."""
    out = [k for k, v in after.items() if k != "pool" and _digest(v)]
    pool = after.get("pool")
    if isinstance(pool, dict):
        out += [f"pool.{k}" for k, v in pool.items() if _digest(v)]
    return out


def cmd_revert(client: SloClient, args: argparse.Namespace) -> int:
    route: str = args.route
    entries = client.history(route)
    entry = next((e for e in entries if str(e.get("id")) == args.entry), None)
    if entry is None or not isinstance(entry.get("after"), dict):
        raise CliError(
            f"{route} has no history entry {args.entry!r}",
            ExitCode.NOT_FOUND,
            details=("hint: `sloctl history ROUTE` lists the entries",),
        )
    digested = digested_fields(entry["after"])
    if digested:
        raise CliError(
            f"{route}'s entry {args.entry} keeps only a digest of {', '.join(digested)} "
            "(too large to store): it cannot be put back from the history",
            ExitCode.USAGE,
            details=("hint: restore that value from where it came from (Git, a file)",),
        )
    current, etag = client.get(route)
    body = revert_body(entry["after"], current)
    try:
        # Conditional on what was just read: a change made meanwhile is not overwritten.
        stored = client.put(route, body, if_match=etag or "*", dry_run=args.dry_run)
    except CliError as exc:
        if exc.status != 412:
            raise
        raise CliError(
            f"{route} changed while it was being reverted; nothing was written",
            ExitCode.CONFLICT,
            status=412,
            details=("hint: look at `sloctl history ROUTE` again, then retry",),
        ) from None
    if args.output == "table":
        said_done(route, args.dry_run, "reverted", then=f" to {output.printable(args.entry)}")
        show_changes(current, stored)
    else:
        show(stored, args.output)
    return ExitCode.OK


def cmd_attainment(client: SloClient, args: argparse.Namespace) -> int:
    if args.route is not None:
        if args.sort:
            raise usage("--sort orders the list of routes: leave out ROUTE")
        items = [client.attainment(args.route, args.window)]
    else:
        items = client.attainment_list(args.window, by_budget=args.sort == "budget")
    for note in output.source_notes(items):
        warn(note)
    show_list(items, args.output, output.attainment_table, "no routes found")
    return ExitCode.OK


def cmd_rules(client: SloClient, args: argparse.Namespace) -> int:
    found, skipped, warnings = rules.objectives(client.attainment_list())
    for reason in skipped:
        warn(f"no rules for {reason}")
    for warning in warnings:
        warn(warning)
    if not found:
        warn("no percentile objective to make rules for")
    document = rules.prometheus_rule(found, args.name, args.namespace)
    # YAML unless JSON is asked for: there is no table of a PrometheusRule.
    show(document, "json" if args.output == "json" else "yaml")
    return ExitCode.OK


def load_bodies(filename: str) -> tuple[list[Body], bool]:
    """Bodies from a JSON or YAML file (`-` is stdin): one object, a list, or YAML documents."""
    where = "stdin" if filename == "-" else filename
    try:
        if filename == "-":
            text = sys.stdin.read()
        else:
            with open(filename, encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise usage(f"cannot read {where}: {exc}") from None
    try:
        # JSON first: YAML would read some JSON differently (duplicate keys, big numbers).
        documents: list[Any] = [json.loads(text)]
    except ValueError:
        try:
            documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
        except yaml.YAMLError as exc:
            raise usage(f"{where} is neither JSON nor YAML: {exc}") from None
    many = len(documents) > 1 or any(isinstance(doc, list) for doc in documents)
    bodies: list[Body] = []
    for doc in documents:
        bodies.extend(doc if isinstance(doc, list) else [doc])
    if not bodies:
        raise usage(f"{where} holds no bodies")
    for number, body in enumerate(bodies, start=1):
        if not isinstance(body, dict):
            raise usage(f"{where}: body {number} is not an object")
        if not isinstance(body.get("route"), str) or not body["route"]:
            raise usage(f'{where}: body {number} has no "route"')
    return bodies, many


def report_error(error: CliError, prefix: str = "") -> None:
    # The API says a message of its field without the field (as swissd shows it: both).
    warn(prefix + (f"{error.field}: " if error.field else "") + error.message)
    for line in error.details:
        print(f"  {output.printable(line)}", file=sys.stderr)
