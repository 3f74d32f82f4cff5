"""How long loading a model with a very large VM function stalls a serving tinyhal-serve.

A server (`--model-control-mode explicit`, translation cache off, so every load
translates) serves `saxpy`; each round loads and unloads `big`, one function of
`--steps` x 3 integer VM instructions, while a client keeps asking `/v2/health/live`.
Per round: the load's seconds, the server's own longest event-loop stall during it (its
lag monitor, `tinyhal_event_loop_lag_max_seconds` and the wall-clock maximum, read
fresh from a new server process each round so the maxima are the load's), the health
answers the client got, and how long CPython's `compile()` of the translated source
holds the interpreter when run in-process (CPU seconds; what the server held before
compiling in a child process).

    python bench/load_stall.py [--steps 4000] [--rounds 3]

Writes bench/results/load_stall.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from _common import ServerProcess, free_port, print_table, write_results  # noqa: E402

from support.iree_tools import HOST_FLAGS, compile_mlir  # noqa: E402
from support.large_models import large_function_mlir  # noqa: E402

SAXPY = {"inputs": [{"name": "alpha", "datatype": "FP32", "shape": [1], "data": [2.0]},
                    {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]},
                    {"name": "y", "datatype": "FP32", "shape": [1], "data": [1.0]}]}


def _post(url: str, timeout: float = 300.0) -> int:
    req = urllib.request.Request(url, b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise SystemExit(f"no metric {name}")


def _ask_health(port: int, done: threading.Event, answers: list[int]) -> None:
    while not done.is_set():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/live", timeout=30):
            answers[0] += 1


def _compile_hold(vmfb: Path) -> tuple[int, float]:
    """(bytes of translated source, CPU seconds of compile() of it in this process)."""
    import builtins

    os.environ["TINYHAL_VM_CACHE"] = "off"
    import tinyhal
    from tinyhal.vm import codegen

    sources: list[str] = []
    real = builtins.compile

    def keep(source, filename, mode, *args, **kwargs):
        if str(filename).startswith("<tinyhal-vm"):
            sources.append(source)
        return real(source, filename, mode, *args, **kwargs)

    codegen.compile = keep
    codegen._CHILD_COMPILE_BYTES = 1 << 62  # noqa: SLF001 - measure the in-process compile
    try:
        tinyhal.load(str(vmfb), device="sync").close()
    finally:
        del codegen.compile
    start = time.thread_time()
    real(sources[0], "<measured>", "exec")
    return len(sources[0]), time.thread_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    vmfb = compile_mlir(large_function_mlir(args.steps), HOST_FLAGS)
    source_bytes, hold = _compile_hold(vmfb)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copytree(HERE.parent / "server" / "models" / "saxpy", root / "saxpy")
        (root / "big" / "1").mkdir(parents=True)
        shutil.copyfile(vmfb, root / "big" / "1" / "model.vmfb")
        (root / "big" / "config.json").write_text(json.dumps({"device": "sync"}))
        for _ in range(args.rounds):
            port = free_port()
            server = ServerProcess(
                "tinyhal-serve",
                [sys.executable, "-m", "tinyhal.server", "--port", str(port),
                 "--model-repository", str(root), "--model-control-mode", "explicit",
                 "--load-model", "saxpy"],
                port, json.dumps(SAXPY).encode(), "/v2/models/saxpy/infer",
                env={**os.environ, "TINYHAL_VM_CACHE": "off"})
            try:
                before = _metric(port, "tinyhal_event_loop_lag_max_seconds")
                wall_before = _metric(port, "tinyhal_event_loop_lag_wall_max_seconds")
                answers = [0]
                done = threading.Event()
                client = threading.Thread(target=_ask_health, args=(port, done, answers))
                client.start()
                start = time.perf_counter()
                status = _post(f"http://127.0.0.1:{port}/v2/repository/models/big/load")
                seconds = time.perf_counter() - start
                done.set()
                client.join(timeout=60)
                rows.append({
                    "load_status": status, "load_s": seconds,
                    "lag_max_ms": 1e3 * _metric(port, "tinyhal_event_loop_lag_max_seconds"),
                    "wall_lag_max_ms": 1e3 * _metric(
                        port, "tinyhal_event_loop_lag_wall_max_seconds"),
                    "lag_max_before_ms": 1e3 * before,
                    "wall_lag_before_ms": 1e3 * wall_before,
                    "health_answers": answers[0],
                    "compile_hold_ms": 1e3 * hold, "source_bytes": source_bytes,
                })
            finally:
                server.stop()
    print_table(rows, ["load_status", "load_s", "lag_max_ms", "wall_lag_max_ms",
                       "lag_max_before_ms", "health_answers", "compile_hold_ms",
                       "source_bytes"])
    print("results:", write_results("load_stall", rows, {"steps": args.steps}))


if __name__ == "__main__":
    main()
