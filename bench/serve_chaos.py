"""tinyhal-serve under an operator and clients that do everything wrong, for N minutes.

One `tinyhal-serve --model-control-mode explicit` over a temporary copy of the bundled
models. Steady traffic: `--clients` threads send the same `mlp_classifier` request on
keep-alive connections and check every 200 answer against the first one. Meanwhile a
chaos thread, in a random (seeded) order, again and again:

- unloads and loads `mlp_classifier` (requests meanwhile may get 503: not admitted);
- overwrites its `model.vmfb` in place with other bytes, truncates it, deletes it, then
  calls `load` (which must fail and keep the old version serving), restores the file and
  loads it again;
- loads and unloads `saxpy`;
- sends bad clients: a gzip bomb, a 1 MB header, 200 slowloris sockets, stalled uploads,
  malformed JSON and a 65-dimension shape.

A request counts as *failed* when it got anything but 200 or 503, a wrong answer, or a
broken connection; 503s are counted apart (refused while unloaded, nothing admitted).
At the end: requests served, refused, failed, chaos actions done, the server's RSS at the
start and at the end, and its exit code after SIGTERM.

    python bench/serve_chaos.py [--minutes 3] [--clients 4] [--seed 1]

Writes bench/results/serve_chaos.json and prints a table.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import print_table, write_results  # noqa: E402

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parent / "server" / "models"
ROW = [0.125 * (i % 9) - 0.5 for i in range(16)]
BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                               "data": ROW}]}).encode()


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Server:
    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tinyhal.server.main", "--host", "127.0.0.1", "--port",
             "0", "--model-repository", str(root), "--model-control-mode", "explicit",
             "--request-head-timeout", "2", "--request-body-timeout", "2",
             "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + 120
        self.port = 0
        for line in self.proc.stdout:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "tinyhal-serve: ready" in line:
                break
            if time.monotonic() > deadline:
                break
        if not self.port:
            self.proc.kill()
            raise SystemExit("tinyhal-serve did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def request(self, method: str, path: str, body: bytes = b"",
                headers: dict | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body, headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.served = self.refused = self.failed = 0
        self.failures: list[str] = []

    def add(self, status: int, ok: bool, what: str = "") -> None:
        with self.lock:
            if status == 200 and ok:
                self.served += 1
            elif status == 503:
                self.refused += 1
            else:
                self.failed += 1
                if len(self.failures) < 10:
                    self.failures.append(f"{status}: {what[:200]}")


def _client(server: Server, expect: bytes, counts: Counts, stop: threading.Event) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    while not stop.is_set():
        try:
            conn.request("POST", "/v2/models/mlp_classifier/infer", BODY,
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            counts.add(-1, False, repr(exc))
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            continue
        ok = resp.status != 200 or json.loads(payload)["outputs"] == json.loads(expect)
        counts.add(resp.status, ok, payload.decode(errors="replace"))
    conn.close()


class Chaos:
    def __init__(self, server: Server, root: Path, rng: random.Random) -> None:
        self.server, self.root, self.rng = server, root, rng
        self.vmfb = root / "mlp_classifier" / "1" / "model.vmfb"
        self.original = self.vmfb.read_bytes()
        self.done: dict[str, int] = {}
        self.surprises: list[str] = []

    def expect(self, what: str, status: int, want: set[int]) -> None:
        if status not in want:
            self.surprises.append(f"{what}: {status}")

    def reload_cycle(self) -> None:
        self.expect("unload", self.server.request(
            "POST", "/v2/repository/models/mlp_classifier/unload")[0], {200})
        self.expect("load", self.server.request(
            "POST", "/v2/repository/models/mlp_classifier/load")[0], {200})

    def file_abuse(self) -> None:
        with open(self.vmfb, "r+b") as f:
            f.write(bytes(b ^ 0xA5 for b in self.original[:4096]))
        time.sleep(0.05)
        self.expect("load corrupt", self.server.request(
            "POST", "/v2/repository/models/mlp_classifier/load")[0], {400})
        os.truncate(self.vmfb, self.rng.randrange(len(self.original)))
        time.sleep(0.05)
        self.vmfb.unlink()
        time.sleep(0.05)
        self.expect("load missing", self.server.request(
            "POST", "/v2/repository/models/mlp_classifier/load")[0], {400})
        self.vmfb.write_bytes(self.original)
        self.expect("load restored", self.server.request(
            "POST", "/v2/repository/models/mlp_classifier/load")[0], {200})

    def other_model(self) -> None:
        self.expect("load saxpy", self.server.request(
            "POST", "/v2/repository/models/saxpy/load")[0], {200})
        self.expect("unload saxpy", self.server.request(
            "POST", "/v2/repository/models/saxpy/unload")[0], {200})

    def gzip_bomb(self) -> None:
        row = b"[" + b"0.0," * 15 + b"0.0]"
        body = gzip.compress(b'{"inputs":[{"name":"features","datatype":"FP32",'
                             b'"shape":[1,16],"data":[' +
                             b",".join([row] * ((70 << 20) // len(row))) + b"]}]}", 9)
        self.expect("gzip bomb", self.server.request(
            "POST", "/v2/models/mlp_classifier/infer", body,
            {"Content-Encoding": "gzip"})[0], {400, 413})

    def huge_header(self) -> None:
        try:
            status, _ = self.server.request("GET", "/v2/health/live", b"",
                                            {"X-Big": "a" * (1 << 20)})
        except OSError:
            status = 431  # the server answered and closed while the header was sent
        self.expect("huge header", status, {431})

    def slowloris(self) -> None:
        socks = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", self.server.port), timeout=10)
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        time.sleep(0.5)
        for s in socks:
            s.close()

    def stalled_upload(self) -> None:
        s = socket.create_connection(("127.0.0.1", self.server.port), timeout=30)
        s.sendall(b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: 4000000\r\n\r\n" + b" " * (1 << 20))
        answer = s.recv(4096)
        s.close()
        self.expect("stalled upload", int(answer.split(b" ")[1]) if answer else -1, {408})

    def bad_requests(self) -> None:
        path = "/v2/models/mlp_classifier/infer"
        self.expect("bad json", self.server.request("POST", path, b"{nope")[0], {400})
        shape = json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                        "shape": [1] * 65, "data": [0.0]}]}).encode()
        self.expect("65 dims", self.server.request("POST", path, shape)[0], {400})

    def step(self) -> None:
        actions = [self.reload_cycle, self.file_abuse, self.other_model, self.gzip_bomb,
                   self.huge_header, self.slowloris, self.stalled_upload, self.bad_requests]
        action = self.rng.choice(actions)
        try:
            action()
        except OSError as exc:
            self.surprises.append(f"{action.__name__}: {exc!r}")
        self.done[action.__name__] = self.done.get(action.__name__, 0) + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 60:
        raise SystemExit("--minutes must be in (0, 60]")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for model in ("mlp_classifier", "saxpy"):
            shutil.copytree(SAMPLES / model, root / model)
        server = Server(root)
        try:
            status, expect = server.request("POST", "/v2/models/mlp_classifier/infer", BODY)
            assert status == 200, expect
            expect = json.dumps(json.loads(expect)["outputs"]).encode()
            time.sleep(1.0)
            rss_start = _rss(server.proc.pid)
            counts, stop = Counts(), threading.Event()
            clients = [threading.Thread(target=_client, args=(server, expect, counts, stop),
                                        daemon=True) for _ in range(args.clients)]
            for t in clients:
                t.start()
            chaos = Chaos(server, root, random.Random(args.seed))
            end = time.monotonic() + args.minutes * 60
            while time.monotonic() < end:
                chaos.step()
            stop.set()
            for t in clients:
                t.join(timeout=120)
            time.sleep(1.0)
            rss_end = _rss(server.proc.pid)
            health = server.request("GET", "/v2/health/ready")[0]
        finally:
            exit_code = server.stop()
    row = {"minutes": args.minutes, "clients": args.clients, "served": counts.served,
           "refused_503": counts.refused, "failed": counts.failed,
           "chaos_actions": sum(chaos.done.values()), "surprises": len(chaos.surprises),
           "rss_start_mb": round(rss_start / 2**20, 1),
           "rss_end_mb": round(rss_end / 2**20, 1), "ready_at_end": health,
           "exit_code": exit_code}
    print_table([row], list(row))
    print("actions:", json.dumps(chaos.done, sort_keys=True))
    for line in counts.failures + chaos.surprises:
        print("  ", line)
    path = write_results("serve_chaos", [row], {
        "command": "python bench/serve_chaos.py " + " ".join(argv or sys.argv[1:]),
        "actions": chaos.done, "failures": counts.failures, "surprises": chaos.surprises,
        "load_average": os.getloadavg()})
    print(f"wrote {path}")
    return 0 if counts.failed == 0 and not chaos.surprises else 1


if __name__ == "__main__":
    sys.exit(main())
