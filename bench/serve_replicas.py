"""Replicas behind HAProxy (deploy/haproxy/local.sh) against one plain tinyhal-serve.

    python bench/serve_replicas.py [--seconds 3] [--rounds 3] [--concurrency 8,32]

Setups, all on 127.0.0.1, serving the bundled `mlp_classifier` (one 16-feature row per
JSON request, `hey` as the load generator: `apt-get install hey haproxy`):

    plain       one tinyhal-serve, clients connect to it directly
    lb-1        HAProxy (the shipped config) in front of one replica
    lb-2        HAProxy in front of two replicas, `--python-cpu auto` (each claims a CPU
                of its own)
    lb-2-1cpu   the same two replicas with `--python-cpu 1` both: their event loops
                share one CPU, as two `auto` replicas did before CPUs were claimed

Each round runs every setup at every concurrency, in an order rotating from round to
round so drift on a shared machine spreads over all; a cell is the median over rounds.
Besides requests/s and p99 it reports CPU per request of everything serving (HAProxy and
the replicas, from /proc: steadier than wall-clock figures on a shared machine).

On a host with 2 cores, HAProxy, two replicas and `hey` share those two cores: a second
replica cannot double throughput there, and HAProxy costs CPU of its own. The figures
show what the front end costs and whether two replicas on one host get in each other's
way; the scaling a second host (or more cores) buys is not measured here.

Writes bench/results/serve_replicas.json and prints a table.
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
LOCAL_SH = HERE.parent / "deploy" / "haproxy" / "local.sh"
MODEL = "mlp_classifier"
PATH = f"/v2/models/{MODEL}/infer"
BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                               "data": [0.25] * 16}]}).encode()
SETUPS = {
    "plain": None,
    "lb-1": (1, []),
    "lb-2": (2, []),
    "lb-2-1cpu": (2, ["--python-cpu", "1"]),
}


def start(setup: str, lock_dir: str) -> ServerProcess:
    port = free_port()
    env = dict(os.environ, TINYHAL_CPU_LOCK_DIR=lock_dir, PYTHON=sys.executable,
               TINYHAL_SERVE=f"{sys.executable} -m tinyhal.server.main")
    if SETUPS[setup] is None:
        argv = [sys.executable, "-m", "tinyhal.server.main", "--port", str(port)]
    else:
        replicas, flags = SETUPS[setup]
        argv = [str(LOCAL_SH), "--replicas", str(replicas), "--port", str(port), *flags]
    return ServerProcess(setup, argv, port, BODY, PATH, env=env, ready_timeout=180)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", default="8,32")
    args = p.parse_args(argv)
    for tool in ("hey", "haproxy"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: apt-get install {tool}")
    levels = [int(c) for c in args.concurrency.split(",")]
    cells: dict[tuple[str, int], list[dict]] = {}
    names = list(SETUPS)
    with tempfile.TemporaryDirectory() as tmp:
        body_file = os.path.join(tmp, "body.json")
        with open(body_file, "wb") as f:
            f.write(BODY)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for setup in order:
                server = start(setup, os.path.join(tmp, f"cpus-{setup}-{r}"))
                try:
                    hey(server.url, body_file, 1, 8)  # warm up
                    for c in levels:
                        cpu0 = server.cpu_seconds()
                        result = hey(server.url, body_file, args.seconds, c)
                        cpu = server.cpu_seconds() - cpu0
                        result["cpu_us"] = 1e6 * cpu / max(1, result["answered"])
                        cells.setdefault((setup, c), []).append(result)
                        print(f"round {r + 1} {setup} c={c}: {result['rps']:.0f} req/s "
                              f"p99 {result['p99_ms']:.1f} ms, {result['errors']} errors",
                              flush=True)
                finally:
                    server.stop()
    rows = []
    for c in levels:
        plain = statistics.median(x["rps"] for x in cells[("plain", c)])
        for setup in names:
            runs = cells[(setup, c)]
            rps = statistics.median(x["rps"] for x in runs)
            rows.append({"setup": setup, "concurrency": c, "rps": round(rps),
                         "vs_plain": round(rps / plain, 2),
                         "p99_ms": round(statistics.median(x["p99_ms"] for x in runs), 2),
                         "cpu_us_per_req": round(statistics.median(x["cpu_us"] for x in runs)),
                         "errors": sum(x["errors"] for x in runs)})
    print(f"\n{MODEL}, one 1x16 f32 row per JSON request, hey -z {args.seconds:g}s, "
          f"median of {args.rounds} rounds; {os.cpu_count()} CPUs shared with the load "
          f"generator (and, on a shared machine, with other work)")
    print_table(rows, ["setup", "concurrency", "rps", "vs_plain", "p99_ms", "cpu_us_per_req",
                       "errors"])
    path = write_results("serve_replicas", rows, {
        "load_generator": "hey", "seconds": args.seconds, "rounds": args.rounds,
        "setups": {k: ("one tinyhal-serve" if v is None else
                       f"HAProxy + {v[0]} replica(s) {' '.join(v[1]) or '--python-cpu auto'}")
                   for k, v in SETUPS.items()}})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
