"""Where tinyhal-serve's CPU goes per request: py-spy samples of the server under hey load.

Starts `tinyhal-serve` on the bundled `mlp_classifier` (its bundled config, the queue delay
set by `--delay`), drives it with `hey` (one 1x16 FP32 JSON row, `Accept-Encoding:
identity`) at `--concurrency` for `--seconds`, and meanwhile records the server with
`py-spy record --format raw` (`pip install py-spy`; needs ptrace permission, e.g. root).
Prints the server's CPU per request over the load (from /proc; py-spy's sampling adds a
little), then the share of samples per request-path stage (a sample counts for the
innermost stage on its stack), the functions with the most samples on top of the stack
(self) and with the most anywhere on it (inclusive). Samples whose innermost frame is a
blocking wait (`WAITS`) are left out. py-spy samples wall-clock time of threads that are
not idle, so on a loaded machine a runnable thread waiting for a core counts where it
waits (often a syscall such as the socket send): read shares as "where the thread was",
and the /proc figure as what it cost. Writes bench/results/serve_profile.json
and keeps the collapsed stacks beside it (serve_profile.txt, for flamegraph tools).

`--binary` sends the row as perf_analyzer does (binary tensor extension: a JSON header,
the 64 input bytes after it, the outputs asked for as binary data). Beside the total, the
CPU per request of the event-loop thread alone (the rest is the instance thread's, and
the kernel's work on its behalf).

    python bench/serve_profile.py [--seconds 20] [--concurrency 8] [--delay 0] [--rate 200]
                                  [--binary]

`--sequences N` profiles the stateful path instead, deterministically enough to compare
builds on a shared machine: the bundled `gru_step` under N closed-loop sequences (as
`serve_sequences.py` drives it), the server's event-loop thread under cProfile on a
thread-CPU clock switched on for the `--seconds` of measured load only
(`loop_profiler.py`). Per step: the calls into the server's request-path modules (the
periodic tasks left out: their share grows as steps/s falls), all calls, profiled loop
time, and the functions with the most calls and the most time. `--python` (repeatable)
names each build's interpreter; the default is this one.

    python bench/serve_profile.py --sequences 32 [--seconds 4] [--python A --python B]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    RESULTS_DIR,
    ServerProcess,
    cpu_seconds,
    free_port,
    hey,
    write_results,
)

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parent / "server" / "models"
MODEL = "mlp_classifier"
PATH = f"/v2/models/{MODEL}/infer"

# stage -> substrings of a frame ("function (file:line)"); the innermost match wins
STAGES = [
    ("http: parse, write, socket", ("server/http.py", "httptools", "trio/_highlevel_socket")),
    ("routes + app", ("server/app.py",)),
    ("protocol: parse request / build response", ("server/protocol.py", "orjson")),
    ("metrics + statistics", ("server/metrics.py", "server/stats.py", "prometheus_client")),
    ("scheduling + batching", ("server/admission.py", "server/batching.py",
                               "server/scheduling.py", "server/sequence")),
    ("repository: prepare, invoke, outputs", ("server/repository.py",)),
    ("vm: invocation (interpreter, hal module)", ("/vm/",)),
    ("hal + drivers", ("/hal/",)),
    ("trio: scheduler, epoll, tasks", ("trio/",)),
]


# innermost frames that are blocking waits py-spy does not always recognise as idle (a
# thread parked on a queue or lock, the event loop in epoll_wait): left out of the shares
WAITS = ("InstanceThread._loop (", "WorkerThread._work (", "EpollIOManager.get_events (")


def _stage(frames: list[str]) -> str:
    for frame in reversed(frames):
        for stage, needles in STAGES:
            if any(n in frame for n in needles):
                return stage
    return "other (interpreter start, idle, unknown)"


def analyse(raw: str, top: int = 25) -> dict:
    """Sample counts by stage, by function on top of the stack, by function anywhere."""
    stages: collections.Counter = collections.Counter()
    self_counts: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = waiting = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames or frames[-1].startswith(WAITS):
            waiting += n
            continue
        total += n
        stages[_stage(frames)] += n
        self_counts[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n

    def share(counter: collections.Counter, k: int) -> list[tuple[str, float]]:
        return [(key, 100.0 * v / total) for key, v in counter.most_common(k)]

    return {"samples": total, "waiting_samples": waiting, "stages": share(stages, len(stages)),
            "self": share(self_counts, top), "inclusive": share(inclusive, top)}


# the server's request-path modules, and the periodic tasks left out of them
REQUEST_PATH = ("http", "app", "protocol", "repository", "scheduling", "admission",
                "batching", "sequences", "sequence_clients", "sequence_state", "metrics",
                "stats", "budget")
PERIODIC = ("run", "_expire_idle", "_compact_states")


def _per_step(stats_file: Path, steps: int) -> dict:
    """Calls and profiled time per step from a loop profile (see `sequence_calls`)."""
    import pstats
    import re

    rows = []
    modules: collections.Counter = collections.Counter()
    for (path, line, name), (_, calls, own, _, _) in pstats.Stats(str(stats_file)).stats.items():
        where = re.search(r"server/(\w+)\.py$", path)
        label = f"{where.group(1) if where else os.path.basename(path)}:{line}:{name}"
        rows.append((label, calls / steps, 1e6 * own / steps))
        if where and where.group(1) in REQUEST_PATH and name not in PERIODIC:
            modules[where.group(1)] += calls / steps
    return {"steps": steps, "request_path_calls": sum(modules.values()),
            "modules": dict(modules), "calls": sum(r[1] for r in rows),
            "profiled_us": sum(r[2] for r in rows),
            "most_calls": sorted(rows, key=lambda r: -r[1])[:15],
            "most_time": sorted(rows, key=lambda r: -r[2])[:15]}


def sequence_calls(pythons: list[str], sequences: int, seconds: float) -> int:
    """The `--sequences` mode (see the module doc)."""
    import asyncio
    import time

    from serve_sequences import _sequences, _statistics, _tinyhal_repo

    profiler = str(Path(__file__).resolve().parent / "loop_profiler.py")
    reports = []
    with tempfile.TemporaryDirectory(prefix="serve-profile-") as tmp:
        repo = _tinyhal_repo(Path(tmp), 64)
        for index, python in enumerate(pythons):
            stats_file = Path(tmp) / f"loop-{index}.prof"
            flag = Path(f"{stats_file}.on")
            port = free_port()
            server = ServerProcess(f"tinyhal-{index}", [
                python, profiler, str(stats_file), "--host", "127.0.0.1", "--port",
                str(port), "--model-repository", str(repo), "--log-level", "warning"],
                port, json.dumps({"inputs": []}).encode(), "/v2/repository/index")
            try:
                asyncio.run(_sequences(port, sequences, 20, 1.0, 1))  # warm-up
                before = _statistics(server)["inferences"]
                flag.touch()
                time.sleep(0.3)  # the watcher's period, and a pass of the loop
                load = asyncio.run(_sequences(port, sequences, 20, seconds, 10_000_000))
                flag.unlink()
                time.sleep(0.3)
                steps = _statistics(server)["inferences"] - before
            finally:
                server.stop()
            report = _per_step(stats_file, steps)
            report.update({"python": python, "steps_s": load["steps_s"],
                           "load_average": os.getloadavg()[0]})
            reports.append(report)
    for index, report in enumerate(reports):
        print(f"\nbuild {index} ({report['python']}): {report['steps']} steps profiled, "
              f"{report['steps_s']:.0f} steps/s under the profiler, load average "
              f"{report['load_average']:.1f}")
        print(f"  per step: {report['request_path_calls']:.2f} calls into the request "
              f"path ({', '.join(f'{k} {v:.2f}' for k, v in sorted(report['modules'].items()))}"
              f"); {report['calls']:.1f} calls and {report['profiled_us']:.1f} profiled us "
              f"in all")
        for title, key in (("most calls", "most_calls"), ("most time", "most_time")):
            print(f"  {title} (calls/step, profiled us/step):")
            for label, calls, own in report[key]:
                print(f"    {calls:7.2f} {own:8.2f}  {label}")
    path = write_results("serve_profile_sequences", [], {"builds": reports})
    print(f"wrote {os.path.relpath(path)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--delay", type=int, default=0, help="max_queue_delay_microseconds")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--binary", action="store_true",
                        help="binary tensors in and out, as perf_analyzer sends them")
    parser.add_argument("--sequences", type=int, default=0, metavar="N",
                        help="profile N gru_step sequences' calls instead (see the doc)")
    parser.add_argument("--python", action="append", metavar="PYTHON",
                        help="with --sequences: a build's interpreter (repeatable)")
    args = parser.parse_args(argv)
    if args.sequences:
        return sequence_calls(args.python or [sys.executable], args.sequences, args.seconds)
    for tool in ("hey", "py-spy"):
        if not shutil.which(tool) and not shutil.which(tool, path=os.path.dirname(
                sys.executable)):
            raise SystemExit(f"{tool} not found (apt-get install hey; pip install py-spy)")
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")

    row = [round(0.1 * i - 0.7, 3) for i in range(16)]
    content_type, headers = "application/json", ()
    if args.binary:
        header = json.dumps({
            "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                        "parameters": {"binary_data_size": 64}}],
            "parameters": {"binary_data_output": True}}).encode()
        body = header + struct.pack("<16f", *row)
        content_type = "application/octet-stream"
        headers = (f"Inference-Header-Content-Length: {len(header)}",)
    else:
        body = json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                       "shape": [1, 16], "data": row}]}).encode()
    with tempfile.TemporaryDirectory(prefix="serve-profile-") as tmp:
        work = Path(tmp)
        body_file = work / "body.bin"
        body_file.write_bytes(body)
        shutil.copytree(SAMPLES / MODEL, work / "repo" / MODEL)
        config_path = work / "repo" / MODEL / "config.json"
        config = json.loads(config_path.read_text())
        config.setdefault("dynamic_batching", {})["max_queue_delay_microseconds"] = args.delay
        config_path.write_text(json.dumps(config))
        port = free_port()
        server = ServerProcess("tinyhal-serve", [
            sys.executable, "-m", "tinyhal.server.main", "--port", str(port),
            "--model-repository", str(work / "repo"), "--log-level", "warning"],
            port, json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                          "shape": [1, 16], "data": row}]}).encode(), PATH)
        try:
            hey(server.url, str(body_file), 2, args.concurrency, content_type,
                headers)  # warm-up
            raw_file = work / "stacks.txt"
            record = [py_spy, "record", "--format", "raw", "--rate", str(args.rate),
                      "--duration", str(max(1, int(args.seconds) - 2)), "--pid",
                      str(server.proc.pid), "--output", str(raw_file)]
            spy = subprocess.Popen(record, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            result: dict = {}
            pid = server.proc.pid
            cpu0, loop0 = server.cpu_seconds(), cpu_seconds(pid, pid)
            runner = threading.Thread(target=lambda: result.update(
                hey(server.url, str(body_file), args.seconds, args.concurrency,
                    content_type, headers)))
            runner.start()
            runner.join(args.seconds + 180)
            cpu, loop = server.cpu_seconds() - cpu0, cpu_seconds(pid, pid) - loop0
            spy.wait(timeout=120)
            if not raw_file.exists():
                raise SystemExit(f"py-spy wrote nothing: {spy.stderr.read().decode()[-500:]}")
            raw = raw_file.read_text()
        finally:
            server.stop()
    report = analyse(raw)
    answered = max(1, result.get("answered", 0))
    report.update({"rps": result.get("rps"), "p99_ms": result.get("p99_ms"),
                   "cpu_us_per_request": 1e6 * cpu / answered,
                   "loop_cpu_us_per_request": 1e6 * loop / answered,
                   "load_average": os.getloadavg()})
    print(f"hey c={args.concurrency} {'binary' if args.binary else 'JSON'} {args.seconds:g} s: "
          f"{report['rps']:.0f} req/s, server CPU {report['cpu_us_per_request']:.0f} "
          f"us/request, its event loop {report['loop_cpu_us_per_request']:.0f} (with py-spy "
          f"attached), "
          f"load average {report['load_average'][0]:.2f}; {report['samples']} samples "
          f"(and {report['waiting_samples']} in blocking waits, left out)")
    for title, key in (("stage (innermost on the stack)", "stages"),
                       ("function, self", "self"), ("function, inclusive", "inclusive")):
        print(f"\n{title}:")
        for name, pct in report[key]:
            print(f"  {pct:5.1f}%  {name}")
    os.makedirs(RESULTS_DIR, exist_ok=True)
    Path(RESULTS_DIR, "serve_profile.txt").write_text(raw)
    path = write_results("serve_profile", [], {**report, "command": "python "
                         "bench/serve_profile.py " + " ".join(argv or sys.argv[1:])})
    print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
