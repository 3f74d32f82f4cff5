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
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import ServerProcess, free_port, hey, print_table, write_results  # noqa: E402

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parent / "server" / "models"
MODEL = "mlp_classifier"
PATH = f"/v2/models/{MODEL}/infer"


def _hey(server: ServerProcess, body_file: str, seconds: float, concurrency: int) -> dict:
    cpu0 = server.cpu_seconds()
    result = hey(server.url, body_file, seconds, concurrency)
    cpu = server.cpu_seconds() - cpu0
    result["cpu_us"] = 1e6 * cpu / max(1, result["answered"])
    return result


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
    servers: list[ServerProcess] = []
    with tempfile.TemporaryDirectory() as tmp:
        body_file = os.path.join(tmp, "body.json")
        Path(body_file).write_bytes(body)
        try:
            port = free_port()
            servers.append(ServerProcess(
                "baseline (FastAPI+uvicorn+iree.runtime)",
                [sys.executable, str(HERE / "baseline_server.py"),
                 str(SAMPLES / MODEL / "1" / "model.vmfb"), "--port", str(port)], port, body,
                PATH))
            for batching in (False, True):
                repo = _repo(Path(tmp) / f"repo-{batching}", batching)
                port = free_port()
                servers.append(ServerProcess(
                    f"tinyhal-serve{' + dynamic batching' if batching else ''}",
                    [sys.executable, "-m", "tinyhal.server.main", "--port", str(port),
                     "--model-repository", str(repo), "--log-level", "warning"], port, body,
                    PATH))
            for server in servers:  # warm-up
                hey(server.url, body_file, 1, 8)
            cells: dict[tuple[str, int], list[dict]] = {}
            for r in range(args.rounds):
                for c in levels:
                    order = servers[r % len(servers):] + servers[:r % len(servers)]
                    for server in order:
                        result = _hey(server, body_file, args.seconds, c)
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
