"""tinyhal-serve against the server a user would write instead, under the same load.

The baseline is `bench/baseline_server.py`: FastAPI + uvicorn, a plain `def` route calling
iree.runtime (local-task) on the same bundled `mlp_classifier` .vmfb, JSON in and out
(`pip install '.[bench]'`). Beside it run two `tinyhal-serve` processes over temporary
copies of the model: one without dynamic batching, one with the bundled config's
`dynamic_batching` (the unbatched one runs the bundled config without that key: same
device, concurrency and queue). The load generator is `hey` (`apt-get install hey`), the same JSON request of one
16-feature row for every server.
Each round runs every concurrency level against every server, in an order that rotates
from round to round, so drift on a shared machine spreads over all of them; a cell's
figure is the median over rounds.

    python bench/serve_load.py [--seconds 3] [--rounds 3] [--concurrency 1,8,32]

Writes bench/results/serve_load.json and prints a table with each server's requests/s and
p99 and their ratios to the baseline's, and the server process's CPU time per request
(user + system, from /proc: steadier than wall-clock figures on a shared machine). The load
generator shares the machine's cores with the servers, so the absolute numbers are floors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import print_table, write_results  # noqa: E402

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parent / "server" / "models"
MODEL = "mlp_classifier"
PATH = f"/v2/models/{MODEL}/infer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A server subprocess on 127.0.0.1:`port`, ready once `PATH` answers 200."""

    def __init__(self, name: str, argv: list[str], port: int, body: bytes) -> None:
        self.name, self.port = name, port
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 90
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}{PATH}", body,
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"{name} did not answer within 90 s")
            time.sleep(0.2)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hey(port: int, body_file: str, seconds: float, concurrency: int, pid: int = 0) -> dict:
    cpu0 = _cpu_seconds(pid) if pid else 0.0
    out = subprocess.run(
        ["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST",
         "-T", "application/json", "-D", body_file, f"http://127.0.0.1:{port}{PATH}"],
        capture_output=True, text=True, timeout=seconds + 120, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p = {q: float(m.group(1)) * 1e3 for q in ("50", "99")
         if (m := re.search(rf"{q}% in ([\d.]+) secs", out))}
    codes = {int(c): int(n) for c, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    errors = sum(n for c, n in codes.items() if c != 200)
    if "Error distribution:" in out:  # connection-level failures: "  [count]\tmessage"
        tail = out.split("Error distribution:", 1)[1]
        errors += sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]", tail, re.M))
    cpu = _cpu_seconds(pid) - cpu0 if pid else float("nan")
    answered = max(1, sum(codes.values()))
    return {"rps": rps, "p50_ms": p.get("50", float("nan")), "p99_ms": p.get("99", float("nan")),
            "ok": codes.get(200, 0), "errors": errors, "cpu_us": 1e6 * cpu / answered}


def _repo(root: Path, batching: bool) -> Path:
    shutil.copytree(SAMPLES / MODEL, root / MODEL)
    config_path = root / MODEL / "config.json"
    config = json.loads(config_path.read_text())
    if not batching:
        config.pop("dynamic_batching", None)
    config_path.write_text(json.dumps(config))
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per cell and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", default="1,8,32")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    if not shutil.which("hey"):
        raise SystemExit("hey not found: apt-get install hey")

    features = [round(0.1 * i - 0.7, 3) for i in range(16)]
    body = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                   "data": features}]}).encode()
    servers: list[Process] = []
    with tempfile.TemporaryDirectory() as tmp:
        body_file = os.path.join(tmp, "body.json")
        Path(body_file).write_bytes(body)
        try:
            port = _free_port()
            servers.append(Process(
                "baseline (FastAPI+uvicorn+iree.runtime)",
                [sys.executable, str(HERE / "baseline_server.py"),
                 str(SAMPLES / MODEL / "1" / "model.vmfb"), "--port", str(port)], port, body))
            for batching in (False, True):
                repo = _repo(Path(tmp) / f"repo-{batching}", batching)
                port = _free_port()
                servers.append(Process(
                    f"tinyhal-serve{' + dynamic batching' if batching else ''}",
                    [sys.executable, "-m", "tinyhal.server.main", "--port", str(port),
                     "--model-repository", str(repo), "--log-level", "warning"], port, body))
            for server in servers:  # warm-up
                hey(server.port, body_file, 1, 8)
            cells: dict[tuple[str, int], list[dict]] = {}
            for r in range(args.rounds):
                for c in levels:
                    order = servers[r % len(servers):] + servers[:r % len(servers)]
                    for server in order:
                        result = hey(server.port, body_file, args.seconds, c,
                                     server.proc.pid)
                        cells.setdefault((server.name, c), []).append(result)
                        print(f"round {r + 1} c={c:<3} {server.name:<42} "
                              f"{result['rps']:8.1f} req/s  p99 {result['p99_ms']:7.2f} ms",
                              flush=True)
        finally:
            for server in servers:
                server.stop()

    rows = []
    baseline_name = servers[0].name
    for c in levels:
        base = cells[(baseline_name, c)]
        base_rps = statistics.median(x["rps"] for x in base)
        base_p99 = statistics.median(x["p99_ms"] for x in base)
        for server in servers:
            runs = cells[(server.name, c)]
            rps = statistics.median(x["rps"] for x in runs)
            p99 = statistics.median(x["p99_ms"] for x in runs)
            cpu = statistics.median(x["cpu_us"] for x in runs)
            base_cpu = statistics.median(x["cpu_us"] for x in base)
            rows.append({
                "server": server.name, "concurrency": c, "rps": rps,
                "cpu_us_per_request": cpu, "cpu_vs_baseline": cpu / base_cpu,
                "p50_ms": statistics.median(x["p50_ms"] for x in runs), "p99_ms": p99,
                "rps_vs_baseline": rps / base_rps, "p99_vs_baseline": p99 / base_p99,
                "errors": sum(x["errors"] for x in runs),
                "rounds": [{"rps": x["rps"], "p99_ms": x["p99_ms"], "cpu_us": x["cpu_us"]}
                           for x in runs],
            })
    print(f"\nmodel {MODEL}, one 1x16 f32 row per JSON request, hey -z {args.seconds:g}s, "
          f"median of {args.rounds} alternating rounds")
    print_table(rows, ["server", "concurrency", "rps", "p50_ms", "p99_ms", "rps_vs_baseline",
                       "p99_vs_baseline", "cpu_us_per_request", "cpu_vs_baseline", "errors"])
    path = write_results("serve_load", rows, {
        "model": MODEL, "seconds": args.seconds, "rounds": args.rounds,
        "load_generator": "hey",
        "command": "python bench/serve_load.py " + " ".join(argv or sys.argv[1:]),
    })
    print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
