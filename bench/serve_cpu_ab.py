"""Server CPU per request of two builds of tinyhal-serve, A/B in alternating rounds.

Each build is a Python interpreter whose environment has that build of tinyhal installed
(for example a venv of `main` and the one of a branch). Both serve a temporary copy of
the bundled `mlp_classifier` (with or without its `dynamic_batching`); `hey` sends the
same JSON row for `--seconds` at each concurrency level. The figure is the server
process's user + system CPU per answered request (from /proc): on a shared machine it is
far steadier than requests/s, which is printed beside it. The order of the builds
alternates from round to round; each cell is the median over rounds.

    python bench/serve_cpu_ab.py --a /path/to/venv-a/bin/python --b .venv/bin/python \\
        [--rounds 6] [--seconds 3] [--concurrency 1,8,32] [--batching]

Needs Linux (/proc) and `hey` (`apt-get install hey`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent.parent / "server" / "models"
MODEL = "mlp_classifier"
BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                    "data": [0.25] * 16}]}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(python: str, repository: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([python, "-m", "tinyhal.server.main", "--host", "127.0.0.1",
                             "--port", "0", "--model-repository", str(repository)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = None
    for line in proc.stdout:
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if found:
            port = found.group(1)
        if "ready" in line:
            break
    if port is None:
        proc.kill()
        raise SystemExit(f"{python}: the server did not start")
    return proc, f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer"


def _hey(url: str, body: Path, seconds: float, concurrency: int) -> tuple[int, float]:
    out = subprocess.run(["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST",
                          "-T", "application/json", "-H", "Accept-Encoding: identity",
                          "-D", str(body), url], capture_output=True, text=True,
                         timeout=seconds + 120, check=True).stdout
    answered = sum(int(n) for n in re.findall(r"\[200\]\s+(\d+) responses", out))
    return answered, float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="interpreter of build A")
    parser.add_argument("--b", required=True, help="interpreter of build B")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--batching", action="store_true",
                        help="keep the model's dynamic_batching (default: without)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    builds = {"A": args.a, "B": args.b}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copytree(SAMPLES / MODEL, root / MODEL)
        config_path = root / MODEL / "config.json"
        config = json.loads(config_path.read_text())
        if not args.batching:
            config.pop("dynamic_batching", None)
        config_path.write_text(json.dumps(config))
        body = root / "body.json"
        body.write_text(json.dumps(BODY))
        cells: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for r in range(args.rounds):
            for name in (["A", "B"] if r % 2 == 0 else ["B", "A"]):
                proc, url = _start(builds[name], root)
                try:
                    _hey(url, body, 1.0, 8)  # warm
                    for level in levels:
                        before = _cpu_seconds(proc.pid)
                        answered, rps = _hey(url, body, args.seconds, level)
                        cpu_us = 1e6 * (_cpu_seconds(proc.pid) - before) / max(1, answered)
                        cells.setdefault((name, level), []).append((cpu_us, rps))
                        print(f"round {r + 1} {name} c={level}: {cpu_us:.1f} us CPU per "
                              f"request, {rps:.0f} requests/s", flush=True)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    for level in levels:
        for name in builds:
            runs = cells[(name, level)]
            print(f"c={level} {name}: median {statistics.median(c for c, _ in runs):.1f} us "
                  f"CPU per request, {statistics.median(r for _, r in runs):.0f} "
                  f"requests/s ({len(runs)} rounds)")


if __name__ == "__main__":
    main()
