"""A core of its own for the process under test, the others for everything else.

The fan-out runs slo-api beside the API server, etcd, the load generator and the watcher
processes on one machine. Sharing two cores with them, slo-api got about 0.6 of a core even
without streams, and what the streams cost was lost in what the others took from it. In a
cluster its clients and the control plane run elsewhere: pinned apart (every thread of each
process, Linux only), the ratio against the run without streams is the streams' own cost.
That takes cores enough for the rest: on two, the one left could not carry the API server,
etcd and the bench's changes at 100 a second, so below `MIN_CORES` nothing is pinned.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

PROC = Path("/proc")
MIN_CORES = 4


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for stat in PROC.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name is in parentheses and may hold spaces: fields follow its end.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            out[int(stat.parent.name)] = int(fields[1])
    return out


def tree(root: int) -> set[int]:
    """`root` and every process descended from it."""
    parents = _parents()
    found = {root}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found.add(pid)
                grew = True
    return found


def _pin(pids: Iterable[int], cpus: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in (PROC / str(pid) / "task").iterdir():
                with contextlib.suppress(OSError):  # a thread that ended meanwhile
                    os.sched_setaffinity(int(task.name), cpus)


@contextlib.contextmanager
def apart(pid: int) -> Iterator[str]:
    """Pin `pid` (and what it started) to the last core, this process and the rest of what it
    started (those it starts meanwhile too) to the others; yields how, for the report."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < MIN_CORES:
        yield f"all {len(cpus) or os.cpu_count()} cores shared (fewer than {MIN_CORES})"
        return
    own, rest = {cpus[-1]}, set(cpus[:-1])
    served = tree(pid)
    _pin(served, own)
    _pin(tree(os.getpid()) - served, rest)
    try:
        yield f"slo-api on core {cpus[-1]}, everything else on {len(rest)} other(s)"
    finally:
        _pin(tree(os.getpid()), set(cpus))
