"""What clients can make tinyhal-serve hold, and what a /metrics scrape costs its loop.

Four scenarios, each against a fresh `tinyhal-serve` over temporary copies of the bundled
models (figures read from /proc inside the server process, never a client's clock):

- metrics: 1,000 model versions (copies of `saxpy`); CPU time of the event-loop thread
  (the process's main thread) and of the whole process for 5 scrapes one after another,
  then for 40 scrapes at once.
- inflated: a gzip body of about 0.1 MiB inflating to 64 MiB of JSON FP32 data for
  `mlp_classifier` with a shape its signature refuses; then two 8 Mi-element JSON tensors
  for `saxpy`, the second of a datatype the signature refuses (the first is parsed). Peak
  RSS growth (VmHWM) against the declared bytes of the tensors.
- stalled: three rounds of six uploads declaring 60 MiB that stall after 48 MiB (408 after
  `--request-body-timeout 1`); RSS after each round against the baseline.
- nonreading: 12 clients with a 4 KiB receive window each asking `saxpy` for a 20 MB JSON
  answer (16 MiB binary bodies) under `--client-memory-limit 160M --send-timeout 2`; RSS
  while they hold on and after the send timeout dropped them.

- pipelined: 500 clients with a 4 KiB receive window each pipelining 256 KiB of
  `GET /v2/health/live` (8,192 requests) and reading nothing, two rounds: RSS while they
  hold on and after they closed, and the event loop's longest stall (its lag metric).
- hotpath: CPU time of the event-loop thread per request, 10,000 requests one after
  another on one keep-alive connection, for a small JSON `saxpy` request (under 4 KiB)
  and a 16 KiB binary one (over 4 KiB: its head is parsed apart from the rest of the
  read); run it with two interpreters for an A/B of a change on the read path.

    python bench/serve_budgets.py [--only metrics,inflated,stalled,nonreading,pipelined,
                                          hotpath]

Writes bench/results/serve_budgets.json and prints one line per figure.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import ServerProcess, cpu_seconds, free_port, write_results  # noqa: E402

SAMPLES = Path(__file__).resolve().parent.parent / "server" / "models"
MB = 1 << 20
_SAXPY = json.dumps({"inputs": [
    {"name": "alpha", "datatype": "FP32", "shape": [1], "data": [2.0]},
    {"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]},
    {"name": "y", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}).encode()


def _serve(root: Path, model: str, *flags: str) -> ServerProcess:
    port = free_port()
    return ServerProcess("tinyhal-serve", [sys.executable, "-m", "tinyhal.server.main",
                                           "--port", str(port), "--model-repository",
                                           str(root), "--log-level", "error", *flags],
                         port, _SAXPY, f"/v2/models/{model}/infer", ready_timeout=300)


def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field}")


def _request(port: int, path: str, body: bytes | None = None,
             headers: dict | None = None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", body, headers or {})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def metrics(tmp: Path) -> list[dict]:
    vmfb = SAMPLES / "saxpy" / "1" / "model.vmfb"
    for i in range(1000):
        (tmp / f"m{i:04d}" / "1").mkdir(parents=True)
        (tmp / f"m{i:04d}" / "1" / "model.vmfb").symlink_to(vmfb)
        (tmp / f"m{i:04d}" / "config.json").write_text(
            json.dumps({"function": "saxpy", "execution": "async"}))
    server = _serve(tmp, "m0000")
    pid = server.proc.pid
    rows = []
    try:
        while _request(server.port, "/v2/health/ready") != 200:  # every model loaded
            time.sleep(0.2)
        for label, clients in (("5 scrapes, one after another", 1),
                               ("40 scrapes at once", 40)):
            loop0, total0 = cpu_seconds(pid, pid), cpu_seconds(pid)
            if clients == 1:
                for _ in range(5):
                    _request(server.port, "/metrics")
                count = 5
            else:
                threads = [threading.Thread(target=_request, args=(server.port, "/metrics"))
                           for _ in range(clients)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                count = clients
            rows.append({"scenario": f"metrics, 1000 models: {label}",
                         "loop_cpu_ms_per_scrape": 1e3 * (cpu_seconds(pid, pid) - loop0)
                         / count,
                         "process_cpu_ms_per_scrape": 1e3 * (cpu_seconds(pid) - total0)
                         / count})
    finally:
        server.stop()
    return rows


def _rows_json(count: int, value: bytes) -> bytes:
    return b"[" + b",".join([value] * count) + b"]"


def inflated(tmp: Path) -> list[dict]:
    for name in ("saxpy", "mlp_classifier"):
        shutil.copytree(SAMPLES / name, tmp / name)
    server = _serve(tmp, "saxpy", "--max-request-bytes", str(128 * MB))
    pid = server.proc.pid
    rows = []
    try:
        n = 1 << 20
        data = b'{"inputs":[{"name":"features","datatype":"FP32","shape":[%d,16],' \
               b'"data":' % n + _rows_json(16 * n, b"0.0") + b"}]}"
        cases = [("signature refuses the shape", "mlp_classifier", data, 16 * n * 4)]
        n = 8 * MB
        data = b'{"inputs":[{"name":"alpha","datatype":"FP32","shape":[1],"data":[2]},' \
               b'{"name":"x","datatype":"FP32","shape":[%d],"data":' % n + \
               _rows_json(n, b"0.5") + b'},{"name":"y","datatype":"INT32","shape":[%d],' \
               b'"data":' % n + _rows_json(n, b"1") + b"}]}"
        cases.append(("x parsed, y's datatype refused", "saxpy", data, 2 * 4 * n))
        for label, model, data, declared in cases:
            body = gzip.compress(data, compresslevel=6)
            time.sleep(0.5)
            before = _status(pid, "VmRSS")
            status = _request(server.port, f"/v2/models/{model}/infer", body,
                              {"Content-Encoding": "gzip"})
            rows.append({"scenario": f"inflated JSON: {label}", "status": status,
                         "gzip_bytes": len(body), "json_bytes": len(data),
                         "declared_tensor_bytes": declared,
                         "peak_rss_growth_mb": (_status(pid, "VmHWM") - before) / MB,
                         "growth_over_declared": (_status(pid, "VmHWM") - before)
                         / declared})
    finally:
        server.stop()
    return rows


def stalled(tmp: Path) -> list[dict]:
    shutil.copytree(SAMPLES / "saxpy", tmp / "saxpy")
    server = _serve(tmp, "saxpy", "--request-body-timeout", "1")
    pid = server.proc.pid
    rows = []
    try:
        time.sleep(1)
        baseline = _status(pid, "VmRSS")
        for round_ in range(3):
            socks = []
            for _ in range(6):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
                sock.sendall(b"POST /v2/models/saxpy/infer HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Length: %d\r\n\r\n" % (60 * MB) + b" " * (48 * MB))
                socks.append(sock)
            peak = _status(pid, "VmRSS")
            for sock in socks:
                sock.recv(65536)
                sock.close()
            time.sleep(1)
            rows.append({"scenario": f"stalled uploads, round {round_ + 1}",
                         "rss_while_held_mb": (peak - baseline) / MB,
                         "rss_after_mb": (_status(pid, "VmRSS") - baseline) / MB})
    finally:
        server.stop()
    return rows


def nonreading(tmp: Path) -> list[dict]:
    shutil.copytree(SAMPLES / "saxpy", tmp / "saxpy")
    server = _serve(tmp, "saxpy", "--client-memory-limit", "160M", "--send-timeout", "2")
    pid = server.proc.pid
    n = 2 * MB
    header, body = _saxpy_binary(n, binary_answer=False)
    head = (f"POST /v2/models/saxpy/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
            f"\r\nInference-Header-Content-Length: {len(header)}\r\n\r\n").encode()
    socks = []
    try:
        time.sleep(1)
        baseline = _status(pid, "VmRSS")
        for _ in range(12):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(60)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(head + body)
            socks.append(sock)
        time.sleep(1)
        held = _status(pid, "VmRSS")
        time.sleep(5)
        after_timeout = _status(pid, "VmRSS")
        for sock in socks:
            sock.close()
        socks = []
        time.sleep(1)
        return [{"scenario": "12 non-reading clients, 20 MB JSON answers",
                 "rss_while_held_mb": (held - baseline) / MB,
                 "rss_after_send_timeout_mb": (after_timeout - baseline) / MB,
                 "rss_after_close_mb": (_status(pid, "VmRSS") - baseline) / MB}]
    finally:
        for sock in socks:
            sock.close()
        server.stop()


def _lag_max(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("tinyhal_event_loop_lag_max_seconds "):
                return float(line.split()[1])
    raise RuntimeError("no tinyhal_event_loop_lag_max_seconds")


def pipelined(tmp: Path) -> list[dict]:
    shutil.copytree(SAMPLES / "saxpy", tmp / "saxpy")
    server = _serve(tmp, "saxpy", "--send-timeout", "5")
    pid = server.proc.pid
    flood = b"GET /v2/health/live HTTP/1.1\r\n\r\n" * ((256 << 10) // 32)
    rows = []
    try:
        time.sleep(1)
        baseline = _status(pid, "VmRSS")
        for round_ in range(2):
            socks = []
            try:
                for _ in range(500):
                    sock = socket.socket()
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    sock.connect(("127.0.0.1", server.port))
                    sock.setblocking(False)
                    try:
                        sock.send(flood)
                    except BlockingIOError:
                        pass
                    socks.append(sock)
                time.sleep(3)
                held = _status(pid, "VmRSS")
            finally:
                for sock in socks:
                    sock.close()
            time.sleep(2)
            rows.append({"scenario": f"500 non-reading clients pipelining 8,192 requests, "
                                     f"round {round_ + 1}",
                         "rss_while_held_mb": (held - baseline) / MB,
                         "rss_after_close_mb": (_status(pid, "VmRSS") - baseline) / MB,
                         "loop_lag_max_ms": _lag_max(server.port) * 1e3})
        return rows
    finally:
        server.stop()


def _saxpy_binary(n: int, binary_answer: bool) -> tuple[bytes, bytes]:
    """A `saxpy` request of `n` values in the binary extension: (its JSON header, the
    whole body)."""
    x = np.linspace(0.001, 1.0, n, dtype=np.float32).tobytes()
    header = json.dumps({"inputs": [
        {"name": "alpha", "datatype": "FP32", "shape": [1],
         "parameters": {"binary_data_size": 4}},
        {"name": "x", "datatype": "FP32", "shape": [n], "parameters": {"binary_data_size": 4 * n}},
        {"name": "y", "datatype": "FP32", "shape": [n], "parameters": {"binary_data_size": 4 * n}}],
        "outputs": [{"name": "z", "parameters": {"binary_data": binary_answer}}]}).encode()
    return header, header + np.float32(1.5).tobytes() + x + x


def hotpath(tmp: Path) -> list[dict]:
    shutil.copytree(SAMPLES / "saxpy", tmp / "saxpy")
    server = _serve(tmp, "saxpy")
    n = 2048
    header, binary = _saxpy_binary(n, binary_answer=True)
    kinds = {"small JSON": (_SAXPY, ""),
             "16 KiB binary": (binary, f"Inference-Header-Content-Length: {len(header)}\r\n")}
    rows = []
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            for kind, (body, extra) in kinds.items():
                request = (f"POST /v2/models/saxpy/infer HTTP/1.1\r\nHost: x\r\n"
                           f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body
                count = 10000
                before = cpu_seconds(server.proc.pid, server.proc.pid)
                for _ in range(count):
                    sock.sendall(request)
                    answer = sock.recv(1 << 20)
                    length = int(answer.split(b"content-length: ", 1)[1].split(b"\r", 1)[0])
                    while len(answer) - answer.index(b"\r\n\r\n") - 4 < length:
                        answer += sock.recv(1 << 20)
                    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
                loop = cpu_seconds(server.proc.pid, server.proc.pid) - before
                rows.append({"scenario": f"{kind} request, one keep-alive connection",
                             "requests": count, "loop_cpu_us_per_request": loop / count * 1e6})
        return rows
    finally:
        server.stop()


SCENARIOS = {"metrics": metrics, "inflated": inflated, "stalled": stalled,
             "nonreading": nonreading, "pipelined": pipelined, "hotpath": hotpath}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args()
    rows = []
    for name in args.only.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            for row in SCENARIOS[name](Path(tmp)):
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                  for k, v in row.items()}))
                rows.append(row)
    write_results("serve_budgets", rows)


if __name__ == "__main__":
    main()
