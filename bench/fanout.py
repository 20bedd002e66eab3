"""Change-stream fan-out: N watchers (1,000, 5,000) while the API server takes 100 changes a second.

- Delivery: the driver merge-patches LLM CRs straight to the API server at a fixed rate, each
  change writing a unique `maximumDeployment.value`; watcher processes (bench/watchers.py) note
  when each change reaches each of their streams. The figure per change is from the API
  server's answer to its PATCH (and, beside it, from the moment the PATCH was sent) to the
  moment the last of the N streams had it. slo-api's CPU is measured over the same window.
- GET /config throughput (page 1, pageSize 200, 8 connections) with the changes flowing, rep by
  rep without watchers and with the N watchers open (opened afresh for each rep).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench import load, populate
from bench.load import Series, Target
from bench.scenarios import AUTH, REPO, TOKEN, ServiceProcess, Settings
from controlplane import fleet

LLM_PATH = f"{populate.SLO_PATH}/namespaces/{fleet.NAMESPACE}/llmslorequirements"
MARK_BASE = 1_000_000  # maximumDeployment values the driver writes: MARK_BASE + change number
STALLED = 20  # streams whose clients stop reading, in the SIGTERM measure
OPEN_SECONDS = 600  # for the watcher processes to have every stream past its initial state


class NotOpened(Exception):
    """The watchers could not open their streams in time: that count is not measured."""


class Changes:
    """Merge patches at `rate` a second on a thread of their own, until stopped."""

    def __init__(
        self, client_args: tuple[str, Path, Path, Path], routes: int, rate: float, first: int
    ) -> None:
        self.client_args = client_args
        self.routes = routes
        self.rate = rate
        self.sent: dict[int, float] = {}
        self.answered: dict[int, float] = {}
        self.failed = 0
        # Every change writes a value never written before, or it would be no change at all.
        self._next = first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Changes:
        self._stop.clear()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    async def _run(self) -> None:
        # Enough connections that no PATCH waits for one: its send time is when it leaves.
        async with populate.admin_client(*self.client_args, connections=64) as client:
            pending: set[asyncio.Task[None]] = set()
            started = time.monotonic()
            sent_here = 0
            while not self._stop.is_set():
                due = started + sent_here / self.rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                mark = self._next
                self._next += 1
                sent_here += 1
                task = asyncio.create_task(self._patch(client, mark))
                pending.add(task)
                task.add_done_callback(pending.discard)
            if pending:
                await asyncio.gather(*pending)

    async def _patch(self, client: httpx.AsyncClient, mark: int) -> None:
        name = fleet.route_name(mark % self.routes)
        body = {"spec": {"maximumDeployment": {"type": "replica", "value": MARK_BASE + mark}}}
        self.sent[MARK_BASE + mark] = time.monotonic()
        response = await client.patch(
            f"{LLM_PATH}/{name}",
            json=body,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if response.status_code != 200:
            self.failed += 1
            self.sent.pop(MARK_BASE + mark, None)
        else:
            self.answered[MARK_BASE + mark] = time.monotonic()


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


class Watchers:
    """The watcher processes (bench/watchers.py), holding `count` streams between them."""

    def __init__(self, svc: ServiceProcess, workdir: Path, count: int, processes: int) -> None:
        self.count = count
        self.outputs = [workdir / f"watchers-{n}.json" for n in range(processes)]
        self.procs: list[subprocess.Popen[bytes]] = []
        for path in self.outputs:
            path.unlink(missing_ok=True)
            path.with_suffix(".ready").unlink(missing_ok=True)
            argv = [sys.executable, "-m", "bench.watchers", svc.url, TOKEN]
            argv += [str(count // processes), str(path)]
            self.procs.append(subprocess.Popen(argv, cwd=REPO))

    def wait_open(self, timeout: float = OPEN_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while not all(p.with_suffix(".ready").exists() for p in self.outputs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.close()
                raise NotOpened(
                    f"the watcher processes did not have their {self.count:,} streams past "
                    f"their initial states within {timeout:g} s"
                )
            time.sleep(0.1)

    def cpu_seconds(self) -> float:
        return sum(load.process_cpu_seconds(p.pid) for p in self.procs)

    def renice(self, value: int) -> None:
        for proc in self.procs:
            os.setpriority(os.PRIO_PROCESS, proc.pid, value)

    def close(self) -> list[dict[str, Any]]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()  # still opening its connections: what it saw is lost
                proc.wait()
        return [json.loads(p.read_text()) for p in self.outputs if p.exists()]


def fanout(
    svc: ServiceProcess,
    client_args: tuple[str, Path, Path, Path],
    workdir: Path,
    routes: int,
    s: Settings,
    watchers: int = 1000,
    rate: float = 100.0,
    seconds: float = 20.0,
    processes: int = 4,
) -> dict[str, Any]:
    config = Target(svc.url, ["/config?page=1&pageSize=200"], headers=AUTH)
    out: dict[str, Any] = {"watchers": watchers, "rate": rate, "seconds": seconds, "routes": routes}

    # GET /config with the changes flowing, rep by rep without and with the watchers open, so
    # drift on the machine hits both. The watcher processes stand in for clients on other
    # machines: at nice 19 they take only the CPU slo-api leaves. Their CPU is reported.
    alone, watched = Series(), Series()
    clients_cpu: list[float] = []
    changes = Changes(client_args, routes, rate, first=0).start()
    try:
        load.run(config, s.warmup, s.config_connections, svc.pid)
        # Before any stream was open, and once the first ones are: what the streams hold.
        out["rss_mib_before_streams"] = svc.rss_kib() / 1024
        for rep in range(s.reps):
            alone.runs.append(load.run(config, s.seconds, s.config_connections, svc.pid))
            group = Watchers(svc, workdir, watchers, processes)
            try:
                group.wait_open()
                if not rep:
                    out["rss_mib_streams_open"] = svc.rss_kib() / 1024
                group.renice(19)
                before, wall = group.cpu_seconds(), time.monotonic()
                watched.runs.append(load.run(config, s.seconds, s.config_connections, svc.pid))
                clients_cpu.append((group.cpu_seconds() - before) / (time.monotonic() - wall))
            finally:
                group.close()
    finally:
        changes.stop()
    out["config_alone"] = alone.summary()
    out["config_watched"] = watched.summary()
    out["config_ratio"] = watched.median("rps") / alone.median("rps")
    out["watcher_clients_cpu"] = statistics.median(clients_cpu)

    # Delivery to every watcher, and slo-api's CPU meanwhile.
    group = Watchers(svc, workdir, watchers, processes)
    try:
        group.wait_open()
        opened = httpx.get(f"{svc.url}/metrics").text
        out["open_streams_metric"] = _sample(opened, "slo_api_change_streams_open")
        cpu_before, clients_before = load.process_cpu_seconds(svc.pid), group.cpu_seconds()
        wall_before = time.monotonic()
        changes = Changes(client_args, routes, rate, first=1_000_000).start()
        time.sleep(seconds)
        changes.stop()
        wall = time.monotonic() - wall_before
        cpu = (load.process_cpu_seconds(svc.pid) - cpu_before) / wall
        out["delivery_clients_cpu"] = (group.cpu_seconds() - clients_before) / wall
        time.sleep(3)  # stragglers
        out["sigterm"] = _sigterm(svc, stalled=STALLED)
    finally:
        reports = group.close()
    last: dict[int, float] = {}
    seen: dict[int, int] = {}
    dropped = 0
    for data in reports:
        dropped += data["dropped"]
        for mark, at in data["last"].items():
            last[int(mark)] = max(last.get(int(mark), 0.0), at)
        for mark, count in data["seen"].items():
            seen[int(mark)] = seen.get(int(mark), 0) + count
    timed = changes.sent
    delivered = [mark for mark in timed if seen.get(mark) == watchers]
    latencies = [(last[mark] - timed[mark]) * 1000 for mark in delivered]
    # From the API server's answer instead: without the API server's own write latency (the
    # watch event leaves it at about the same moment; a few arrive before the answer).
    after_answer = [
        (last[mark] - changes.answered[mark]) * 1000
        for mark in delivered
        if mark in changes.answered
    ]
    out["delivery"] = {
        "changes": len(timed),
        "changes_per_s": len(timed) / seconds,
        "failed_patches": changes.failed,
        "delivered_to_all": len(delivered),
        "p50_ms": _percentile(latencies, 0.5) if latencies else None,
        "p99_ms": _percentile(latencies, 0.99) if latencies else None,
        "max_ms": max(latencies) if latencies else None,
        "mean_ms": statistics.fmean(latencies) if latencies else None,
        "from_answer_p50_ms": _percentile(after_answer, 0.5) if after_answer else None,
        "from_answer_p99_ms": _percentile(after_answer, 0.99) if after_answer else None,
        "server_cpu": cpu,
        "dropped_streams": dropped,
    }
    return out


def _sigterm(svc: ServiceProcess, stalled: int) -> dict[str, Any]:
    """SIGTERM with every stream still open and `stalled` more whose clients never read:
    how long until the process exits, and how."""
    host, port = svc.url.removeprefix("http://").rsplit(":", 1)
    sockets = []
    for _ in range(stalled):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(
            f"GET /config?watch=true&view=full HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
        )
        sockets.append(sock)
    try:
        time.sleep(2)  # their initial states fill the socket buffers; then nobody reads
        proc = svc.proc
        assert proc is not None
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = proc.wait(60)
        except subprocess.TimeoutExpired:
            code = None
        return {
            "stalled": stalled,
            "exit_code": code,
            "seconds": time.monotonic() - began,
        }
    finally:
        for sock in sockets:
            sock.close()


def _sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None
