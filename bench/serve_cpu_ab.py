"""Server CPU per request of two builds of tinyhal-serve, A/B in alternating rounds.

Each build is a Python interpreter whose environment has that build of tinyhal installed
(for example a venv of `main` and the one of a branch, or a script that runs one
interpreter with another checkout first on PYTHONPATH). Both serve a temporary copy of
the bundled `mlp_classifier` (with or without its `dynamic_batching`); at each
concurrency level a load generator sends one 1x16 FP32 row for `--seconds`: `hey` as
JSON, and with `--binary` also `perf_analyzer` (binary tensors in and out, as Triton's
own client sends them; libcurl writes head and body apart).

The figure is the server process's user + system CPU per answered request (from /proc;
answered = the model's successful inferences in its statistics): on a shared machine it
is far steadier than requests/s, which is printed beside it. Beside the total, the CPU
per request of the event-loop thread alone, the part of the total spent in the kernel,
the server's involuntary context switches per request (its threads preempted: on a
shared CPU, mostly by the load generator's threads the answers woke), the load
generator's own CPU per request (from its rusage: whether a build's answers make the
client work more), the mean batch (requests per execution) and the load generator's
p99. With `--placement` (needs `perf` and the right to trace the whole system, e.g.
root), also the share of the load generator's thread wake-ups that the kernel placed on
the servers' CPU (`sched:sched_wakeup`, recorded system-wide during each cell): client
threads run there preempt the server, and where they land varies from run to run by
itself (docs/performance.md, the binary cells). The tracing costs CPU of its own:
compare its figures only with other `--placement` runs. Both servers stay up throughout, their threads on the same CPU
(`--python-cpu`; left to `auto`, the two would claim different ones, and the CPUs of a
shared machine differ); each round runs every cell on one build and then on the other,
the order alternating from round to round, so a change in the machine's load falls on
both alike (many short rounds, e.g. `--rounds 20 --seconds 1`, follow it closest); each
figure is the median over rounds, and B/A the median of the rounds' ratios of CPU per
request (each ratio compares two cells run back to back).

    python bench/serve_cpu_ab.py --a /path/to/venv-a/bin/python --b .venv/bin/python \\
        [--rounds 6] [--seconds 3] [--concurrency 1,8,32,64] [--batching] \\
        [--binary [--perf-analyzer PATH]] [--placement]

Needs Linux (/proc) and `hey` (`apt-get install hey`); `--binary` needs perf_analyzer
(on PATH, or `--perf-analyzer`; the environment must let it find its libraries, see
`bench/serve_triton.py` for where it comes from).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import cpu_seconds  # noqa: E402

SAMPLES = Path(__file__).resolve().parent.parent / "server" / "models"
MODEL = "mlp_classifier"
ROW = [0.25] * 16
BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16], "data": ROW}]}


def _start(python: str, repository: Path, cpu: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([python, "-m", "tinyhal.server.main", "--host", "127.0.0.1",
                             "--port", "0", "--model-repository", str(repository),
                             "--python-cpu", cpu],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = None
    for line in proc.stdout:
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if found:
            port = int(found.group(1))
        if "ready" in line:
            break
    if port is None:
        proc.kill()
        raise SystemExit(f"{python}: the server did not start")
    return proc, port


def _statistics(port: int) -> tuple[int, int]:
    """(successful requests, executions) of the model so far."""
    url = f"http://127.0.0.1:{port}/v2/models/{MODEL}/stats"
    with urllib.request.urlopen(url, timeout=30) as response:
        stats = json.load(response)["model_stats"][0]
    return stats["inference_stats"]["success"]["count"], stats["execution_count"]


def _server_counts(pid: int) -> tuple[float, int]:
    """(system CPU seconds of the process, involuntary context switches of its live
    threads) so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        system = int(f.read().rsplit(")", 1)[1].split()[12]) / os.sysconf("SC_CLK_TCK")
    switches = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                found = re.search(r"nonvoluntary_ctxt_switches:\s+(\d+)", f.read())
        except OSError:  # the thread ended meanwhile
            continue
        switches += int(found.group(1)) if found else 0
    return system, switches


def _children_cpu() -> float:
    """User + system CPU seconds of this process's finished children (the load
    generators, each waited for before the next cell)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _hey(port: int, work: Path, seconds: float, concurrency: int) -> tuple[float, float]:
    """(requests/s, p99 ms) of one `hey` run."""
    out = subprocess.run(["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST",
                          "-T", "application/json", "-H", "Accept-Encoding: identity",
                          "-D", str(work / "body.json"),
                          f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer"],
                         capture_output=True, text=True, timeout=seconds + 120,
                         check=True).stdout
    p99 = re.search(r"99% in ([\d.]+) secs", out)
    return (float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            1e3 * float(p99.group(1)) if p99 else math.nan)


def _perf_analyzer(binary: str, port: int, work: Path, seconds: float,
                   concurrency: int) -> tuple[float, float]:
    """(requests/s, p99 ms) perf_analyzer measured; NaN when it found no stable
    measurement (the server's CPU per request over the run still counts)."""
    csv_file = work / "pa.csv"
    csv_file.unlink(missing_ok=True)
    argv = [binary, "-m", MODEL, "-u", f"127.0.0.1:{port}", "-i", "http", "-b", "1",
            "--concurrency-range", str(concurrency), "--input-data", str(work / "pa.json"),
            "--measurement-interval", str(max(500, int(seconds * 1000 / 3))),
            "--stability-percentage", "500", "--max-trials", "6", "-f", str(csv_file)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds * 6 + 120)
    if done.returncode != 0 or not csv_file.exists():
        return math.nan, math.nan
    with open(csv_file, newline="") as f:
        row = next(csv.DictReader(f))
    return float(row["Inferences/Second"]), float(row["p99 latency"]) / 1e3


def _start_placement(work: Path) -> subprocess.Popen:
    """Records the kernel's thread wake-ups system-wide, in the background, until
    `_placement` stops it (beside a cell's load generator)."""
    return subprocess.Popen(["perf", "record", "-q", "-e", "sched:sched_wakeup", "-a",
                             "-o", str(work / "wakeups.data")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _placement(recorder: subprocess.Popen, work: Path, comm: str, cpu: str) -> float:
    """Stops `recorder` (`_start_placement`); the % of `comm`'s threads' wake-ups it saw
    the kernel place on CPU `cpu` (NaN when there were none)."""
    recorder.send_signal(signal.SIGINT)
    try:
        recorder.wait(timeout=60)
        trace = subprocess.run(["perf", "script", "-i", str(work / "wakeups.data"), "-F",
                                "trace"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        recorder.kill()
        return math.nan
    targets = [int(found.group(1)) for found in re.finditer(
        rf"comm={re.escape(comm)} pid=\d+ prio=\d+ target_cpu=(\d+)", trace)]
    if not targets or not cpu.isdigit():
        return math.nan
    return 100.0 * sum(1 for t in targets if t == int(cpu)) / len(targets)


def _measure(server: tuple[subprocess.Popen, int], tool: str, level: int, work: Path,
             args: argparse.Namespace) -> tuple[float, ...]:
    """One cell: (us of server CPU per answered request, of it the event loop's, mean
    requests per execution, requests/s and p99 ms the load generator saw, us of the
    server's CPU per request in the kernel, its involuntary context switches per
    request, us of the load generator's own CPU per request, % of its thread wake-ups
    placed on the server's CPU: NaN without `--placement`)."""
    proc, port = server
    before, loop0 = cpu_seconds(proc.pid), cpu_seconds(proc.pid, proc.pid)
    system0, switches0 = _server_counts(proc.pid)
    answered0, executions0 = _statistics(port)
    client0 = _children_cpu()
    recorder = _start_placement(work) if args.placement else None
    rps, p99 = _hey(port, work, args.seconds, level) if tool == "hey" else \
        _perf_analyzer(args.perf_analyzer, port, work, args.seconds, level)
    client = _children_cpu() - client0
    # a process's comm: its program's name, at most 15 characters
    comm = os.path.basename("hey" if tool == "hey" else args.perf_analyzer)[:15]
    placed = _placement(recorder, work, comm, args.python_cpu) if recorder else math.nan
    cpu = cpu_seconds(proc.pid) - before
    loop = cpu_seconds(proc.pid, proc.pid) - loop0
    system, switches = _server_counts(proc.pid)
    answered, executions = _statistics(port)
    answered, executions = max(1, answered - answered0), executions - executions0
    return (1e6 * cpu / answered, 1e6 * loop / answered, answered / max(1, executions),
            rps, p99, 1e6 * (system - system0) / answered, (switches - switches0) / answered,
            1e6 * client / answered, placed)


def _median(values: list[float]) -> float:
    """The median of the values that are not NaN (NaN when none is)."""
    kept = [v for v in values if v == v]
    return statistics.median(kept) if kept else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="interpreter of build A")
    parser.add_argument("--b", required=True, help="interpreter of build B")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--batching", action="store_true",
                        help="keep the model's dynamic_batching (default: without)")
    parser.add_argument("--binary", action="store_true",
                        help="also load with perf_analyzer (binary tensors)")
    parser.add_argument("--no-hey", action="store_true", help="only perf_analyzer")
    parser.add_argument("--python-cpu", default=str(max(os.sched_getaffinity(0))),
                        help="the CPU both servers' threads run on (default: the last "
                             "one this process may use)")
    parser.add_argument("--placement", action="store_true",
                        help="also the share of the load generator's wake-ups placed on "
                             "the servers' CPU (perf, system-wide tracing)")
    parser.add_argument("--perf-analyzer", default=shutil.which("perf_analyzer"),
                        help="perf_analyzer's path (default: from PATH)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    builds = {"A": args.a, "B": args.b}
    tools = [] if args.no_hey else ["hey"]
    if args.binary or args.no_hey:
        if not args.perf_analyzer:
            raise SystemExit("--binary needs perf_analyzer (on PATH or --perf-analyzer)")
        tools.append("pa")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copytree(SAMPLES / MODEL, root / MODEL)
        config_path = root / MODEL / "config.json"
        config = json.loads(config_path.read_text())
        if not args.batching:
            config.pop("dynamic_batching", None)
        config_path.write_text(json.dumps(config))
        (root / "body.json").write_text(json.dumps(BODY))
        (root / "pa.json").write_text(json.dumps({"data": [{"features": ROW}]}))
        cells: dict[tuple[str, str, int], list[tuple[float, ...]]] = {}
        servers = {}
        try:
            for name in builds:  # both stay up: a round runs the same cell on each in turn
                servers[name] = _start(builds[name], root, args.python_cpu)
                _hey(servers[name][1], root, 1.0, 8)  # warm
            for r in range(args.rounds):
                for tool in tools:
                    for level in levels:
                        for name in (["A", "B"] if r % 2 == 0 else ["B", "A"]):
                            cell = _measure(servers[name], tool, level, root, args)
                            cells.setdefault((name, tool, level), []).append(cell)
                            print(f"round {r + 1} {name} {tool} c={level}: {cell[0]:.1f} us "
                                  f"CPU per request (loop {cell[1]:.1f}, kernel "
                                  f"{cell[5]:.1f}, {cell[6]:.2f} preemptions), batch "
                                  f"{cell[2]:.1f}, {cell[3]:.0f} requests/s, p99 "
                                  f"{cell[4]:.1f} ms, load generator {cell[7]:.1f} us "
                                  f"per request, {cell[8]:.0f}% of its wake-ups on the "
                                  f"server's CPU", flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=30)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    for tool in tools:
        for level in levels:
            for name in builds:
                runs = cells[(name, tool, level)]
                cpu, loop, batch, rps, p99, system, switches, client, placed = (
                    _median([run[i] for run in runs]) for i in range(9))
                print(f"{tool} c={level} {name}: median {cpu:.1f} us CPU per request (loop "
                      f"{loop:.1f}, kernel {system:.1f}, {switches:.2f} preemptions), batch "
                      f"{batch:.1f}, {rps:.0f} requests/s, p99 {p99:.1f} ms, load generator "
                      f"{client:.1f} us per request, {placed:.0f}% of its wake-ups on the "
                      f"server's CPU ({len(runs)} rounds)")
            pairs = zip(cells[("A", tool, level)], cells[("B", tool, level)])
            ratio = statistics.median(b[0] / a[0] for a, b in pairs)
            print(f"{tool} c={level} B/A: median of the rounds' CPU-per-request ratios "
                  f"{ratio:.3f}")


if __name__ == "__main__":
    main()
