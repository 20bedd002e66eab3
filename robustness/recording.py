"""The recording of one robustness run: JSON lines, one record per line, each with a `type`.

`meta` (one, first): the seed, the command that replays the run, and the settings the
validators need (the replicas, the identities and what each may see, the history bound...).
`request`: one HTTP request and its answer, to a replica of slo-api or (replica `kube`) a write
the harness made around slo-api, straight to the API server.
`truth`: one event of the harness's own watch on the API server: the ground truth.
`stream`: a change-stream watcher opening a connection, receiving one line, or closing it.
`fault`: a fault the harness injected, from its start to its end.

Times are Unix seconds (floats) from the harness's one clock. docs/development.md ("The
robustness harness") describes every field; this module is the one place that reads and writes
them, so the validators and the runner agree on the format.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

Obj = dict[str, Any]

# Truth events beside the API server's own: the harness's watch broke and it listed again
# (states between the last one seen and the listed one are unknown).
GAP = "GAP"
# The replica name of a write made around slo-api, straight to the API server.
KUBE = "kube"


class FormatError(ValueError):
    """A recording line that is not a record of this format."""


@dataclass(slots=True)
class Meta:
    seed: int | None
    command: list[str]
    settings: Obj = field(default_factory=dict)
    started: float = 0.0
    type: str = "meta"


@dataclass(slots=True)
class Request:
    """One request and its answer (`status` None: no answer, `error` says why)."""

    id: str
    replica: str
    identity: str
    method: str
    path: str
    sent: float
    answered: float | None = None
    status: int | None = None
    error: str | None = None
    # Only the headers that matter: If-Match, X-Request-Id, ETag, Warning, Retry-After...
    request_headers: dict[str, str] = field(default_factory=dict)
    response_headers: dict[str, str] = field(default_factory=dict)
    request_body: Any = None
    response_body: Any = None
    # "traffic", or "final": the reads of each replica's view after the settle period.
    phase: str = "traffic"
    type: str = "request"

    def header(self, name: str) -> str | None:
        """A response header, by name in any case."""
        return _header(self.response_headers, name)

    def sent_header(self, name: str) -> str | None:
        return _header(self.request_headers, name)


@dataclass(slots=True)
class Truth:
    """One event of the harness's watch: `event` ADDED, MODIFIED, DELETED or GAP.

    `object` is trimmed to what the validators read: apiVersion, kind, metadata (name,
    namespace, uid, resourceVersion, labels, annotations), spec, data (a RouteRevision's) and
    `managers`: each managedFields entry as {manager, operation, time, fields}, `fields` the
    top-level spec keys it owns.
    """

    time: float
    resource: str
    event: str
    object: Obj = field(default_factory=dict)
    type: str = "truth"


@dataclass(slots=True)
class Stream:
    """A watcher's connection: `what` is `open` (with `status`, `since`), `line` or `close`."""

    time: float
    watcher: str
    session: int
    replica: str
    identity: str
    what: str
    view: str = "summary"
    kind: str | None = None
    since: str | None = None
    status: int | None = None
    line: Obj | None = None
    # For `close`: `end` (the harness closed it after the settle period), `drop` (closed at a
    # random point to resume elsewhere), `server` (the server ended it), `error`.
    reason: str | None = None
    type: str = "stream"


@dataclass(slots=True)
class Fault:
    name: str
    target: str
    start: float
    end: float | None = None
    detail: str = ""
    type: str = "fault"


Record = Meta | Request | Truth | Stream | Fault
_TYPES: dict[str, type[Any]] = {
    "meta": Meta,
    "request": Request,
    "truth": Truth,
    "stream": Stream,
    "fault": Fault,
}


def _header(headers: dict[str, str], name: str) -> str | None:
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


def encode(record: Record) -> bytes:
    return orjson.dumps(dataclasses.asdict(record)) + b"\n"


def decode(line: bytes | str, number: int = 0) -> Record:
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise FormatError(f"line {number}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise FormatError(f"line {number}: not a JSON object")
    cls = _TYPES.get(str(raw.get("type")))
    if cls is None:
        raise FormatError(f"line {number}: unknown record type {raw.get('type')!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(raw) - names
    if unknown:
        raise FormatError(f"line {number}: unknown fields {sorted(unknown)} in a {raw['type']}")
    try:
        record: Record = cls(**raw)
    except TypeError as exc:
        raise FormatError(f"line {number}: {exc}") from None
    return record


@dataclass(slots=True)
class Recording:
    """A loaded recording, its records by type in the order they were written."""

    meta: Meta
    requests: list[Request] = field(default_factory=list)
    truth: list[Truth] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    @property
    def settings(self) -> Obj:
        return self.meta.settings

    def records(self) -> Iterator[Record]:
        yield self.meta
        yield from self.requests
        yield from self.truth
        yield from self.streams
        yield from self.faults

    def add(self, record: Record) -> None:
        if isinstance(record, Meta):
            self.meta = record
        elif isinstance(record, Request):
            self.requests.append(record)
        elif isinstance(record, Truth):
            self.truth.append(record)
        elif isinstance(record, Stream):
            self.streams.append(record)
        else:
            self.faults.append(record)

    def save(self, path: Path) -> None:
        with path.open("wb") as out:
            for record in self.records():
                out.write(encode(record))


def load(path: Path) -> Recording:
    with path.open("rb") as source:
        return read(source)


def read(lines: Iterable[bytes] | IO[bytes]) -> Recording:
    recording: Recording | None = None
    pending: list[Record] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = decode(line, number)
        if isinstance(record, Meta):
            if recording is not None:
                raise FormatError(f"line {number}: a second meta record")
            recording = Recording(record)
        else:
            pending.append(record)
    if recording is None:
        raise FormatError("no meta record")
    for record in pending:
        recording.add(record)
    return recording


class Recorder:
    """Appends records to a recording as they happen (flushed per record: a run that dies
    leaves everything it saw)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._out: IO[bytes] = path.open("wb")

    def write(self, record: Record) -> None:
        self._out.write(encode(record))
        self._out.flush()

    def close(self) -> None:
        self._out.close()
