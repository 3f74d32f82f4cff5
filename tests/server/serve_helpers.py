"""Helpers of the tinyhal-serve tests: real server processes on 127.0.0.1, test models.

Each server is `python -m tinyhal.server.main --port 0 ...` started as a subprocess; the
port it picked is read from its "listening on" line. Every wait is bounded, and every
process a test starts is stopped by pid (SIGTERM, then SIGKILL) when the test is done.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "server" / "models"
START_TIMEOUT = 60.0

# A dispatch whose run time the caller sets: each element iterates x = 0.999 x + 0.5
# `n` times (about 0.85 s for n = 1e6 over 1024 elements on two cores).
SPIN_MLIR = """
func.func @spin(%x: tensor<?xf32> {iree.abi.name = "x"}, %n: i32 {iree.abi.name = "n"})
    -> (tensor<?xf32> {iree.abi.name = "y"}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d = tensor.dim %x, %c0 : tensor<?xf32>
  %e = tensor.empty(%d) : tensor<?xf32>
  %nn = arith.index_cast %n : i32 to index
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}
      ins(%x : tensor<?xf32>) outs(%e : tensor<?xf32>) {
  ^bb0(%a: f32, %o: f32):
    %v = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %a) -> f32 {
      %h = arith.constant 0.999 : f32
      %q = arith.constant 0.5 : f32
      %m = arith.mulf %acc, %h : f32
      %s = arith.addf %m, %q : f32
      scf.yield %s : f32
    }
    linalg.yield %v : f32
  } -> tensor<?xf32>
  return %r : tensor<?xf32>
}
"""

# One input and one output per V2 datatype a compiled program can carry.
_DTYPES = [("b", "i1"), ("i8", "i8"), ("i16", "i16"), ("i32", "i32"), ("i64", "i64"),
           ("f16", "f16"), ("f32", "f32"), ("f64", "f64")]


def dtypes_mlir() -> str:
    args = ", ".join(f"%{n}: tensor<?x{t}> {{iree.abi.name = \"in_{n}\"}}" for n, t in _DTYPES)
    results = ", ".join(f"tensor<?x{t}> {{iree.abi.name = \"out_{n}\"}}" for n, t in _DTYPES)
    body = []
    for n, t in _DTYPES:
        if t == "i1":
            op = f"%t_{n} = arith.constant true\n    %r_{n} = arith.xori %a, %t_{n} : i1"
        elif t.startswith("i"):
            op = (f"%k_{n} = arith.constant 3 : {t}\n    %m_{n} = arith.muli %a, %k_{n} : {t}\n"
                  f"    %r_{n} = arith.subi %m_{n}, %k_{n} : {t}")
        else:
            op = (f"%k_{n} = arith.constant 1.5 : {t}\n    %m_{n} = arith.mulf %a, %k_{n} : {t}\n"
                  f"    %r_{n} = arith.addf %m_{n}, %k_{n} : {t}")
        body.append(f"""
  %d_{n} = tensor.dim %{n}, %c0 : tensor<?x{t}>
  %e_{n} = tensor.empty(%d_{n}) : tensor<?x{t}>
  %o_{n} = linalg.generic {{indexing_maps = [#id, #id], iterator_types = ["parallel"]}}
      ins(%{n} : tensor<?x{t}>) outs(%e_{n} : tensor<?x{t}>) {{
  ^bb0(%a: {t}, %o: {t}):
    {op}
    linalg.yield %r_{n} : {t}
  }} -> tensor<?x{t}>""")
    rets = ", ".join(f"%o_{n}" for n, _ in _DTYPES)
    types = ", ".join(f"tensor<?x{t}>" for _, t in _DTYPES)
    return (f"#id = affine_map<(d0) -> (d0)>\nfunc.func @main({args}) -> ({results}) {{\n"
            f"  %c0 = arith.constant 0 : index" + "".join(body) +
            f"\n  return {rets} : {types}\n}}\n")


DTYPES = _DTYPES


@contextmanager
def sample_server(root: Path, samples: tuple[str, ...], *args: str) -> Iterator[ServerProcess]:
    """A running server over copies of the bundled `samples` in `root` (the rest of its
    command line `args`), stopped on exit."""
    for sample in samples:
        shutil.copytree(SAMPLES / sample, root / sample)
    server = ServerProcess("--model-repository", str(root), *args)
    try:
        yield server.start()
    finally:
        server.stop()


def saxpy_binary_request(x: bytes, n: int) -> tuple[bytes, int]:
    """A request to the sample `saxpy` (alpha 1.5, `x` as both `n`-value inputs) in the
    binary extension, asking its answer as JSON: the body and its JSON header's length."""
    header = json.dumps({"inputs": [
        {"name": "alpha", "datatype": "FP32", "shape": [1],
         "parameters": {"binary_data_size": 4}},
        {"name": "x", "datatype": "FP32", "shape": [n],
         "parameters": {"binary_data_size": 4 * n}},
        {"name": "y", "datatype": "FP32", "shape": [n],
         "parameters": {"binary_data_size": 4 * n}}],
        "outputs": [{"name": "z", "parameters": {"binary_data": False}}]}).encode()
    return header + b"\0\0\xc0\x3f" + x + x, len(header)


def receive_until(sock: socket.socket, marker: bytes, received: bytes = b"") -> bytes:
    """What `sock` sends (after `received`) until `marker` is in it; fails if the peer
    closes first (the socket's own timeout bounds each read)."""
    while marker not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    return received


def exchange(server: ServerProcess, data: bytes, timeout: float = 30.0) -> bytes:
    """Sends `data` on a fresh connection and reads until the server closes it (a reset
    after the answer arrived ends the read too)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it read everything: the answer is still to be read
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return received


def status_and_error(response: bytes) -> tuple[int, str]:
    assert response, "the server closed the connection without an answer"
    status = int(response.split(b" ", 2)[1])
    body = response.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(body)["error"] if status >= 400 else ""


def write_model(root: Path, name: str, vmfb: Path, config: dict | None = None) -> None:
    version = root / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(vmfb, version / "model.vmfb")
    if config is not None:
        (root / name / "config.json").write_text(json.dumps(config))


class ServerProcess:
    """A tinyhal-serve subprocess; `url` once it listens, `stop()` always."""

    def __init__(self, *args: str, env: dict | None = None,
                 open_files: int | None = None) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))

        def limit_files() -> None:  # in the child: a hard limit it cannot raise
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tinyhal.server.main", "--host", "127.0.0.1",
             "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            preexec_fn=limit_files if open_files else None,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        for stream, sink in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()
        self.url = ""
        self.port = 0

    def _pump(self, stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)
            if sink is self.stdout:
                self.lines.put(line)

    def wait_line(self, pattern: str, timeout: float = START_TIMEOUT) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None and self.lines.empty():
                raise AssertionError(
                    f"server did not print /{pattern}/ (exit {self.proc.poll()}):\n"
                    + "".join(self.stdout) + "".join(self.stderr[-40:]))
            try:
                line = self.lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            m = re.search(pattern, line)
            if m:
                return m

    def wait_stderr(self, pattern: str, timeout: float = START_TIMEOUT) -> str:
        """All of stderr once it matches `pattern`. stderr is read by its own thread, so a
        line the server logged before printing "ready" on stdout may still be in flight
        when "ready" arrives."""
        deadline = time.monotonic() + timeout
        while True:
            text = "".join(self.stderr)
            if re.search(pattern, text):
                return text
            if time.monotonic() >= deadline:
                raise AssertionError(f"server did not log /{pattern}/ (exit {self.proc.poll()}):"
                                     f"\n{text[-4000:]}")
            time.sleep(0.02)

    def start(self, ready: bool = True) -> ServerProcess:
        m = self.wait_line(r"listening on http://127\.0\.0\.1:(\d+)")
        self.port = int(m.group(1))
        self.url = f"127.0.0.1:{self.port}"
        if ready:
            self.wait_line(r"tinyhal-serve: (ready|serving)")
        return self

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def status_bytes(self, field: str) -> int:
        """A byte count of /proc/<pid>/status (`VmRSS`, `VmHWM`...)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field} in the server's /proc status")

    def rss(self) -> int:
        return self.status_bytes("VmRSS")

    def settled_rss(self, seconds: float = 1.0) -> int:
        """RSS once it stopped moving (the freed memory went back, threads went idle)."""
        time.sleep(seconds)
        return self.rss()

    # -- raw HTTP (for status codes and headers tritonclient does not expose) --------

    def request(self, method: str, path: str, body: bytes | dict | None = None,
                headers: dict | None = None, timeout: float = 30.0):
        """(status, headers with lower-case names, body bytes) of one request."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(f"http://{self.url}{path}", data=data, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """{(name, sorted label items): value} of one scrape."""
        from prometheus_client.parser import text_string_to_metric_families

        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out


class HealthWatch:
    """Asks /v2/health/live on fresh connections in a loop (a client the server's other
    clients must not lock out); `stop()` checks every answer was 200 and returns the
    slowest, in seconds."""

    def __init__(self, server: ServerProcess, timeout: float = 10.0,
                 pause: float = 0.02) -> None:
        self.server = server
        self.timeout = timeout
        self.pause = pause
        self.slowest = 0.0
        self.failures: list[str] = []
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                status, _, _ = self.server.request("GET", "/v2/health/live",
                                                   timeout=self.timeout)
                if status != 200:
                    self.failures.append(str(status))
            except OSError as exc:
                self.failures.append(repr(exc))
            self.slowest = max(self.slowest, time.monotonic() - start)
            self.count += 1
            time.sleep(self.pause)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(timeout=30)
        assert self.failures == [] and self.count > 0, (self.failures[:3], self.count)
        return self.slowest


class NonReadingClients:
    """Connections to a server whose client never reads an answer: a tiny receive window,
    so what the server answers stays in its own send buffers and memory."""

    def __init__(self, server: ServerProcess, rss_before: int) -> None:
        self.server = server
        self.rss_before = rss_before
        self.socks: list[socket.socket] = []

    def send(self, data: bytes) -> None:
        sock = socket.socket()
        self.socks.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", self.server.port))
        sock.sendall(data)

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        self.socks.clear()


@contextmanager
def non_reading_clients(server: ServerProcess, rss_growth: int) -> Iterator[NonReadingClients]:
    """Yields the non-reading clients of a started `server`. On leaving, closes them and
    checks the server's settled RSS grew by less than `rss_growth` bytes over its settled
    RSS on entry (what it held for the clients went back). Whatever fails, the sockets
    are closed and the server is stopped."""
    clients = NonReadingClients(server, server.settled_rss())
    try:
        yield clients
        clients.close()
        growth = server.settled_rss() - clients.rss_before
        assert growth < rss_growth, f"RSS grew {growth >> 20} MB after the clients left"
    finally:
        clients.close()
        server.stop()
