"""Load generation: wrk (C, one thread) driven by a generated Lua script, with its CPU measured.

wrk is used when it is on PATH (the driver installs Debian's package when it runs as root);
otherwise an async httpx generator stands in, and its own CPU is reported the same way so a
reader can tell whether the generator was the bottleneck.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    """One timed run of the load generator against one target."""

    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int
    generator_cpu: float  # the load generator's CPU seconds / wall seconds (1.0 = one core)
    server_cpu: float  # the slo-api process's CPU over the same run, same unit
    tool: str


@dataclass
class Series:
    """Repetitions of one measurement: medians and spread."""

    runs: list[Run] = field(default_factory=list)

    def _values(self, name: str) -> list[float]:
        return [float(getattr(r, name)) for r in self.runs]

    def median(self, name: str) -> float:
        return statistics.median(self._values(name))

    def spread(self, name: str) -> tuple[float, float]:
        values = self._values(name)
        return min(values), max(values)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"runs": [asdict(r) for r in self.runs]}
        for name in ("rps", "p50_ms", "p90_ms", "p99_ms", "generator_cpu", "server_cpu"):
            low, high = self.spread(name)
            out[name] = {"median": self.median(name), "min": low, "max": high}
        out["errors"] = sum(r.errors for r in self.runs)
        return out


def process_cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime are fields 14 and 15 of /proc/PID/stat; the split above starts at 3.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """Resident memory of a process (`VmHWM`: the peak so far), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def ensure_wrk() -> bool:
    """Install Debian's wrk when it is missing and we may; False means use the fallback."""
    if have_wrk():
        return True
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "install", "-y", "-q", "wrk"], ["apt-get", "update", "-q"]):
            subprocess.run(argv, env=env, capture_output=True, check=False, timeout=300)
            if argv[1] == "install" and have_wrk():
                return True
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "wrk"],
            env=env,
            capture_output=True,
            check=False,
            timeout=300,
        )
    return have_wrk()


@dataclass
class Target:
    """What to send: a method, a list of paths (taken round robin), headers, and bodies.

    `body` may contain `{n}`, replaced per request by a counter modulo `body_mod`, so writes
    change something on every request (an unchanged merge patch is a no-op on the server).
    """

    base_url: str
    paths: list[str]
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    body_mod: int = 11


def _lua(target: Target) -> str:
    def quote(text: str) -> str:
        return json.dumps(text)  # a JSON string literal is a valid Lua string literal here

    paths = ", ".join(quote(p) for p in target.paths)
    headers = "\n".join(f"wrk.headers[{quote(k)}] = {quote(v)}" for k, v in target.headers.items())
    if target.body is not None:
        prefix, _, suffix = target.body.partition("{n}")
        make_body = (
            f"local body = {quote(prefix)} .. tostring(n % {target.body_mod}) .. {quote(suffix)}"
        )
    else:
        make_body = "local body = nil"
    return f"""
wrk.method = {quote(target.method)}
{headers}
local paths = {{{paths}}}
local n = 0
request = function()
  n = n + 1
  {make_body}
  return wrk.format(nil, paths[(n % #paths) + 1], nil, body)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {{"requests": %d, "duration_us": %d, "status": %d, "connect": %d, "read": %d, '
    .. '"write": %d, "timeout": %d, "p50": %d, "p90": %d, "p99": %d}}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
"""


def run_wrk(target: Target, seconds: float, connections: int, server_pid: int | None = None) -> Run:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_lua(target))
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        server_before = process_cpu_seconds(server_pid)
        started = time.perf_counter()
        out = subprocess.run(
            [
                "wrk",
                "-t1",
                f"-c{connections}",
                f"-d{max(1, round(seconds))}s",
                "--timeout",
                "10s",
                "-s",
                script.name,
                target.base_url,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 60,
        )
        wall = time.perf_counter() - started
        server_cpu = process_cpu_seconds(server_pid) - server_before
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        os.unlink(script.name)
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    data = json.loads(line.removeprefix("RESULT "))
    duration = data["duration_us"] / 1e6
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    errors = sum(data[k] for k in ("status", "connect", "read", "write", "timeout"))
    return Run(
        requests=data["requests"],
        seconds=duration,
        rps=data["requests"] / duration,
        p50_ms=data["p50"] / 1000,
        p90_ms=data["p90"] / 1000,
        p99_ms=data["p99"] / 1000,
        errors=errors,
        generator_cpu=cpu / wall,
        server_cpu=server_cpu / duration,
        tool="wrk",
    )


def run_httpx(
    target: Target, seconds: float, connections: int, server_pid: int | None = None
) -> Run:
    """The fallback generator: `connections` keep-alive clients in this process."""
    import httpx

    latencies: list[float] = []
    errors = 0
    counter = 0

    async def client_loop(client: httpx.AsyncClient, deadline: float) -> None:
        nonlocal errors, counter
        while time.perf_counter() < deadline:
            counter += 1
            path = target.paths[counter % len(target.paths)]
            body = None
            if target.body is not None:
                body = target.body.replace("{n}", str(counter % target.body_mod)).encode()
            sent = time.perf_counter()
            response = await client.request(target.method, path, content=body)
            latencies.append(time.perf_counter() - sent)
            if response.status_code >= 400:
                errors += 1

    async def main() -> float:
        limits = httpx.Limits(max_connections=connections)
        async with httpx.AsyncClient(
            base_url=target.base_url,
            headers=target.headers,
            limits=limits,
            verify=False,  # noqa: S501 - loopback benchmark; wrk does not verify either
            timeout=10,
        ) as client:
            started = time.perf_counter()
            deadline = started + seconds
            await asyncio.gather(*(client_loop(client, deadline) for _ in range(connections)))
            return time.perf_counter() - started

    own_before = time.process_time()
    server_before = process_cpu_seconds(server_pid)
    duration = asyncio.run(main())
    own = time.process_time() - own_before
    server_cpu = process_cpu_seconds(server_pid) - server_before
    ordered = sorted(latencies)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000

    return Run(
        requests=len(ordered),
        seconds=duration,
        rps=len(ordered) / duration,
        p50_ms=pct(50),
        p90_ms=pct(90),
        p99_ms=pct(99),
        errors=errors,
        generator_cpu=own / duration,
        server_cpu=server_cpu / duration,
        tool="httpx",
    )


def run(target: Target, seconds: float, connections: int, server_pid: int | None = None) -> Run:
    if have_wrk():
        return run_wrk(target, seconds, connections, server_pid)
    return run_httpx(target, seconds, connections, server_pid)
