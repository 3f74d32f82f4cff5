"""Shared benchmark plumbing: timing, JSON output under bench/results/, a printed table,
and for the server benchmarks: server subprocesses on free loopback ports, their CPU time
from /proc, and `hey` runs."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Callable
from typing import Any

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def median_seconds(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def paired_ratios(ours: list[float], theirs: list[list[float]]) -> dict[str, float]:
    """Round by round, `ours` over the best of `theirs` in the same round (one list per
    other server, in round order): the median and range of those ratios.

    Why paired: on a shared or virtual machine the speed of a CPU drifts over seconds
    (docs/performance.md measured the same server's CPU per step move 1.8x with nothing
    changed); cells of one round run back to back, so their ratio cancels most of that
    drift, where the ratio of two medians taken over different moments keeps it."""
    ratios = []
    for index, value in enumerate(ours):
        others = [runs[index] for runs in theirs
                  if index < len(runs) and runs[index] == runs[index] and runs[index] > 0]
        if others and value == value:
            ratios.append(value / max(others))
    if not ratios:
        return {}
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "rounds": len(ratios)}


def write_results(name: str, rows: list[dict[str, Any]], extra: dict[str, Any] | None = None
                  ) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    payload = {
        "benchmark": name,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "rows": rows,
        **(extra or {}),
    }
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    return path


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    widths = [max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(fmt(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))


def free_port() -> int:
    """An ephemeral TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server subprocess on 127.0.0.1:`port`, ready once POSTing `body` to `path` answers
    200 (within `ready_timeout` seconds, else SystemExit with the tail of its stderr)."""

    def __init__(self, name: str, argv: list[str], port: int, body: bytes, path: str, *,
                 cwd: str | None = None, env: dict[str, str] | None = None,
                 ready_timeout: float = 90.0) -> None:
        self.name, self.port, self.path = name, port, path
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     cwd=cwd, env=env)
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", body,
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"{name} did not answer within {ready_timeout:g} s")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def cpu_seconds(self) -> float:
        """CPU seconds so far of the server and every process it started (Triton's Python
        backend runs models in stub processes)."""
        return sum(cpu_seconds(pid) for pid in process_tree(self.proc.pid))

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of one process (or of its thread `tid`) so far (Linux
    /proc); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """`pid` and its live descendants (from /proc/PID/task/TID/children)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{current}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    return found


def hey(url: str, body_file: str, seconds: float, concurrency: int,
        content_type: str = "application/json", headers: tuple[str, ...] = ()
        ) -> dict[str, Any]:
    """One `hey -z` run POSTing `body_file`: requests/s, p50/p99 (ms), answered, errors.

    Sends `Accept-Encoding: identity` (hey asks for gzip otherwise, and servers that
    honour it would compress every response)."""
    out = subprocess.run(
        ["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST",
         "-T", content_type, "-H", "Accept-Encoding: identity",
         *(arg for header in headers for arg in ("-H", header)), "-D", body_file, url],
        capture_output=True, text=True, timeout=seconds + 120, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p = {q: float(m.group(1)) * 1e3 for q in ("50", "99")
         if (m := re.search(rf"{q}% in ([\d.]+) secs", out))}
    codes = {int(c): int(n) for c, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    errors = sum(n for c, n in codes.items() if c != 200)
    if "Error distribution:" in out:  # connection-level failures: "  [count]\tmessage"
        tail = out.split("Error distribution:", 1)[1]
        errors += sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]", tail, re.M))
    return {"rps": rps, "p50_ms": p.get("50", float("nan")), "p99_ms": p.get("99", float("nan")),
            "ok": codes.get(200, 0), "answered": sum(codes.values()), "errors": errors}
