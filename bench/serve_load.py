"""tinyhal-serve under load on loopback, against iree.runtime called in-process.

Starts a real `tinyhal-serve` process on 127.0.0.1 (a free port) over a temporary copy of
a bundled sample model, once per execution mode ("async": `Module.invoke_async` on the
trio loop; "thread": `Module.invoke` in worker threads), and sends a bounded number of
requests from `--clients` keep-alive connections, JSON and binary bodies. Reports
requests/s and latency percentiles; the reference rows call the same `.vmfb` directly in
this process with iree.runtime (local-task) and with tinyhal (`Module.invoke`), no HTTP.

    python bench/serve_load.py [--requests 600] [--clients 4] [--batch 8]

Writes bench/results/serve_load.json and prints a table. The client shares the machine's
cores with the server, so requests/s is a floor for what the server alone could do.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from _common import print_table, write_results  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[1] / "server" / "models"
MODEL = "mlp_classifier"


def _percentiles(latencies: list[float]) -> dict:
    ms = sorted(x * 1e3 for x in latencies)

    def q(p: float) -> float:
        return ms[min(len(ms) - 1, int(p * len(ms)))]

    return {"p50_ms": q(0.50), "p90_ms": q(0.90), "p99_ms": q(0.99),
            "mean_ms": statistics.fmean(ms)}


class Server:
    def __init__(self, repo: Path, timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tinyhal.server.main", "--host", "127.0.0.1", "--port", "0",
             "--model-repository", str(repo), "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        self.port = 0
        deadline = time.monotonic() + timeout
        result: list[str] = []
        reader = threading.Thread(target=self._read, args=(result,), daemon=True)
        reader.start()
        reader.join(timeout=max(0.0, deadline - time.monotonic()))
        if not result:
            self.stop()
            raise SystemExit("tinyhal-serve did not become ready")
        self.port = int(result[0])

    def _read(self, result: list[str]) -> None:
        port = None
        for line in self.proc.stdout:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = m.group(1)
            if line.startswith("tinyhal-serve: ready") and port:
                result.append(port)
                return

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def _bodies(x: np.ndarray) -> dict[str, tuple[bytes, dict]]:
    json_body = json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                        "shape": list(x.shape), "data": x.ravel().tolist()}]})
    head = json.dumps({
        "inputs": [{"name": "features", "datatype": "FP32", "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes}}],
        "parameters": {"binary_data_output": True},
    }).encode()
    return {
        "json": (json_body.encode(), {"Content-Type": "application/json"}),
        "binary": (head + x.tobytes(), {"Content-Type": "application/octet-stream",
                                        "Inference-Header-Content-Length": str(len(head))}),
    }


def load(port: int, body: bytes, headers: dict, requests: int, clients: int) -> dict:
    path = f"/v2/models/{MODEL}/infer"
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        try:
            while True:
                with lock:
                    if next(counter, None) is None:
                        break
                t0 = time.perf_counter()
                conn.request("POST", path, body, headers)
                resp = conn.getresponse()
                resp.read()
                mine.append(time.perf_counter() - t0)
                if resp.status != 200:
                    errors.append(str(resp.status))
        finally:
            conn.close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    elapsed = time.perf_counter() - start
    return {"requests": len(latencies), "errors": len(errors), "seconds": elapsed,
            "rps": len(latencies) / elapsed, **_percentiles(latencies)}


def in_process(call, requests: int) -> dict:
    for _ in range(10):
        call()
    latencies = []
    start = time.perf_counter()
    for _ in range(requests):
        t0 = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    return {"requests": requests, "errors": 0, "seconds": elapsed, "rps": requests / elapsed,
            **_percentiles(latencies)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="per row (bounded)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent connections")
    parser.add_argument("--batch", type=int, default=8, help="rows per request (<= 64)")
    args = parser.parse_args(argv)
    x = np.random.default_rng(0).normal(size=(args.batch, 16)).astype(np.float32)
    vmfb = SAMPLES / MODEL / "1" / "model.vmfb"
    rows = []

    import iree.runtime as ireert

    import tinyhal

    iree_module = ireert.load_vm_flatbuffer_file(str(vmfb), driver="local-task")
    ref = [np.asarray(r.to_host()) for r in iree_module.predict(x)]
    rows.append({"what": "iree.runtime in-process (local-task)", "body": "-",
                 **in_process(lambda: [r.to_host() for r in iree_module.predict(x)],
                              args.requests)})
    module = tinyhal.load(vmfb, device="task")
    got = module.predict(x)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref)), "tinyhal != iree.runtime"
    rows.append({"what": "tinyhal Module.invoke in-process (task)", "body": "-",
                 **in_process(lambda: module.predict(x), args.requests)})
    module.close()

    bodies = _bodies(x)
    for execution in ("async", "thread"):
        with tempfile.TemporaryDirectory() as tmp:
            repo = Path(tmp)
            shutil.copytree(SAMPLES / MODEL, repo / MODEL)
            config = json.loads((repo / MODEL / "config.json").read_text())
            config.update(execution=execution, max_queue=4 * args.clients)
            (repo / MODEL / "config.json").write_text(json.dumps(config))
            server = Server(repo)
            try:
                for kind, (body, headers) in bodies.items():
                    load(server.port, body, headers, min(50, args.requests), args.clients)
                    rows.append({"what": f"tinyhal-serve {execution}, {args.clients} clients",
                                 "body": kind,
                                 **load(server.port, body, headers, args.requests,
                                        args.clients)})
            finally:
                server.stop()

    columns = ["what", "body", "requests", "errors", "rps", "p50_ms", "p90_ms", "p99_ms"]
    print(f"model {MODEL}, batch {args.batch}x16 f32, {args.requests} requests per row")
    print_table(rows, columns)
    path = write_results("serve_load", rows, {
        "model": MODEL, "batch": args.batch, "clients": args.clients,
        "command": "python bench/serve_load.py " + " ".join(argv or sys.argv[1:]),
    })
    print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
