"""tinyhal-serve under clients and an operator that do everything wrong, for N minutes.

One `tinyhal-serve --model-control-mode poll` child process on 127.0.0.1 over a temporary
copy of the sample models. Steady traffic, each class on its own threads and keep-alive
connections, every answer checked:

- `json`: `mlp_classifier` requests and answers in JSON, compared with the first answer;
- `binary`: the same with binary tensors both ways, compared byte for byte;
- `sequence`: `gru_step` sequences of 2-8 steps (START, steps, END), each answer compared
  with the same step of a reference sequence; one in five is abandoned mid-sequence (the
  server idles it out).

Meanwhile one chaos thread, in a seeded random order, again and again:

- `non_reading`: sockets with a 4 KiB receive window asking ~10 MB JSON answers of
  `saxpy` and never reading them (the send timeout evicts them), closed after 3 s;
- `stalled_upload`: a 4 MB body of which 1 MB is sent (408 expected);
- `bad_config`, `version_dir`, `state_file`, `not_utf8_name`: a malformed model dropped
  into the repository (config.json not JSON, 100k levels deep, a 401-digit integer in a
  numeric field, `dims` an integer; a version directory `²`; an `initial_state` file that
  is a FIFO or a link to /dev/zero; a good model under a non-UTF-8 name), polled at once
  (SIGHUP), seen in the repository index (UNAVAILABLE with its reason, or escaped), the
  served models still READY, then removed;
- `corrupt_served`: the served `mlp_classifier`'s model file overwritten or truncated in
  place, polled (its version keeps serving), restored;
- `add_remove`: a good model added, served once, removed;
- `signal`: SIGHUP, SIGUSR1 or SIGUSR2 with requests in flight;
- `hostile`: a gzip bomb, a 1 MB header, 200 slowloris sockets, malformed JSON, 65 dims,
  50 sockets with a 4 KiB receive window pipelining 8,192 requests each and reading
  nothing, or 20 chunked bodies of 60,000 one-byte chunks sent at once (400 expected).

A steady request *fails* when it gets anything but 200, 503 (refused, not admitted) or 504
(the documented answer of a request the drain or a timeout gave up on), a wrong answer or a
broken connection; every 5xx other than 503/504 is counted apart. Reported: per class the
requests served, refused and failed; 5xx; chaos actions and surprises (an answer other than
the documented one); the server's RSS at the start (after the reference answers and a
second), at the end (two seconds after the traffic stopped) and its peak (VmHWM), the end
checked within `--rss-bound-mb` (default 24) of the start; the event loop's longest stall
and its stalls over 50 ms during the run (from /metrics); readiness at the end; the exit
code and seconds of the SIGTERM drain.

    python bench/serve_chaos.py [--minutes 1] [--clients 2] [--seed 1] [--actions A,B]
    python bench/serve_chaos.py --each-action [--minutes 2]

Writes bench/results/serve_chaos.json and prints a table. Exits 1 when anything failed.
`--each-action` runs every chosen action alone (the steady traffic beside it), then none,
then all, each on a server of its own, and tables RSS start/end/peak per run: where the
memory of the full mix goes.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "server"))

from _common import print_table, write_results  # noqa: E402
from serve_helpers import saxpy_binary_request  # noqa: E402

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parent / "server" / "models"
SERVED = ("mlp_classifier", "saxpy", "gru_step")
MB = 1 << 20
ROW = [0.125 * (i % 9) - 0.5 for i in range(16)]
JSON_BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                    "shape": [1, 16], "data": ROW}]}).encode()
_BINARY_HEADER = json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                         "shape": [1, 16],
                                         "parameters": {"binary_data_size": 64}}],
                             "parameters": {"binary_data_output": True}}).encode()
BINARY_BODY = _BINARY_HEADER + struct.pack("<16f", *ROW)
STEP_INPUTS = [[round(0.1 * ((k * 8 + i) % 13) - 0.6, 3) for i in range(8)]
               for k in range(8)]
OK_STATUSES = {200, 503, 504}  # answered: served, refused before admission, timed out


def _status_bytes(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class Server:
    """The `tinyhal-serve` child; its stderr is kept (the last lines) for the report."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tinyhal.server.main", "--host", "127.0.0.1", "--port",
             "0", "--model-repository", str(root), "--model-control-mode", "poll",
             "--repository-poll-secs", "2", "--request-head-timeout", "2",
             "--request-body-timeout", "2", "--send-timeout", "2",
             "--client-memory-limit", "256M", "--drain-timeout", "20",
             "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.log: list[str] = []
        threading.Thread(target=self._keep_log, daemon=True).start()
        deadline = time.monotonic() + 120
        self.port = 0
        for line in self.proc.stdout:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "tinyhal-serve: ready" in line or time.monotonic() > deadline:
                break
        if not self.port:
            self.proc.kill()
            raise SystemExit("tinyhal-serve did not start:\n" + "".join(self.log[-20:]))
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def _keep_log(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            del self.log[:-200]

    def request(self, method: str, path: str, body: bytes = b"",
                headers: dict | None = None, timeout: float = 60) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body, headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def index(self) -> dict[str, list[dict]]:
        status, body = self.request("POST", "/v2/repository/index")
        if status != 200:
            raise OSError(f"repository index answered {status}: {body[:200]!r}")
        entries: dict[str, list[dict]] = {}
        for entry in json.loads(body):
            entries.setdefault(entry["name"], []).append(entry)
        return entries

    def metrics(self) -> dict[str, float]:
        """{sample name with labels: value} of the event-loop lag series."""
        from prometheus_client.parser import text_string_to_metric_families

        status, body = self.request("GET", "/metrics")
        out = {}
        if status == 200:
            for family in text_string_to_metric_families(body.decode()):
                if family.name.startswith("tinyhal_event_loop_lag"):
                    for s in family.samples:
                        out[s.name + json.dumps(s.labels, sort_keys=True)] = s.value
        return out

    def stop(self) -> tuple[int, float]:
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        return code, time.monotonic() - start


class Tally:
    """Answers per traffic class: served (200, right answer), refused (503), timed out
    (504), failed (anything else) and 5xx other than 503/504; the first failures kept."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, Counter] = {}
        self.failures: list[str] = []

    def add(self, kind: str, status: int, right: bool = True, what: str = "") -> None:
        outcome = ("served" if right else "failed") if status == 200 else \
            "refused" if status == 503 else "timed_out" if status == 504 else "failed"
        with self.lock:
            counts = self.counts.setdefault(kind, Counter())
            counts[outcome] += 1
            if status >= 500 and status not in (503, 504):
                counts["errors_5xx"] += 1
            if outcome == "failed" and len(self.failures) < 20:
                self.failures.append(f"{kind} {status}: {what[:200]}")


class Client:
    """One keep-alive connection that reconnects after a broken one."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)

    def post(self, path: str, body: bytes, headers: dict) -> tuple[int, bytes, dict]:
        try:
            self.conn.request("POST", path, body, headers)
            resp = self.conn.getresponse()
            return resp.status, resp.read(), dict(resp.getheaders())
        except (OSError, http.client.HTTPException) as exc:
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=60)
            return -1, repr(exc).encode(), {}


def _sequence_body(sid: int, step: int, end: bool) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 8],
                                   "data": STEP_INPUTS[step]}],
                       "parameters": {"sequence_id": sid, "sequence_start": step == 0,
                                      "sequence_end": end}}).encode()


def _outputs(payload: bytes) -> object:
    return json.loads(payload)["outputs"]


def stateless_client(server: Server, kind: str, expect: bytes, tally: Tally,
                     stop: threading.Event) -> None:
    """`json` or `binary` requests to mlp_classifier until `stop`."""
    client = Client(server)
    path = "/v2/models/mlp_classifier/infer"
    if kind == "json":
        body, headers = JSON_BODY, {"Content-Type": "application/json"}
    else:
        body, headers = BINARY_BODY, {"Inference-Header-Content-Length": str(len(_BINARY_HEADER))}
    while not stop.is_set():
        status, payload, _ = client.post(path, body, headers)
        right = status != 200 or (_outputs(payload) == json.loads(expect) if kind == "json"
                                  else payload == expect)
        tally.add(kind, status, right, payload.decode(errors="replace"))


def sequence_client(server: Server, reference: list, ids: itertools.count, tally: Tally,
                    rng: random.Random, stop: threading.Event) -> None:
    """gru_step sequences until `stop`: START, steps, END; one in five abandoned."""
    client = Client(server)
    path = "/v2/models/gru_step/infer"
    while not stop.is_set():
        sid, steps = next(ids), rng.randint(2, 8)
        last = rng.randrange(steps - 1) if rng.random() < 0.2 else steps - 1
        for step in range(last + 1):
            status, payload, _ = client.post(path, _sequence_body(sid, step, step == steps - 1),
                                             {"Content-Type": "application/json"})
            right = status != 200 or _outputs(payload) == reference[step]
            tally.add("sequence", status, right, f"step {step}: " +
                      payload.decode(errors="replace"))
            if status != 200:
                break  # a refused or failed step: this sequence is over for the client


def _write_config(path: Path, doc: dict | str) -> None:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))


class Chaos:
    def __init__(self, server: Server, root: Path, tally: Tally, rng: random.Random) -> None:
        self.server, self.root, self.tally, self.rng = server, root, tally, rng
        self.vmfb = root / "mlp_classifier" / "1" / "model.vmfb"
        self.original = self.vmfb.read_bytes()
        self.done: Counter = Counter()
        self.surprises: list[str] = []
        self.shown: dict[str, str] = {}  # per malformed change: the index's reason

    def expect(self, what: str, status: int, want: set[int]) -> None:
        if status >= 500 and status not in (503, 504):
            self.tally.add("chaos", status, what=what)
        if status not in want:
            self.surprises.append(f"{what}: {status}")

    # -- the repository ------------------------------------------------------------

    def poll_until(self, what: str, done: Callable[[dict], bool], timeout: float = 20.0
                   ) -> dict | None:
        """SIGHUP (a poll now), then the index until `done(index)`; None on timeout."""
        os.kill(self.server.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            index = self.server.index()
            if done(index):
                return index
            time.sleep(0.2)
        self.surprises.append(f"{what}: not seen in the index within {timeout:g} s")
        return None

    def served_ready(self, what: str, index: dict) -> None:
        for name in SERVED:
            if not any(e.get("state") == "READY" for e in index.get(name, [])):
                self.surprises.append(f"{what}: {name} not READY: {index.get(name)}")

    def drop_in(self, what: str, name: str, make: Callable[[Path], None]) -> None:
        """Makes model directory `name` with `make`, polls until the index shows it with a
        state, checks the served models are still READY, removes it and polls it away."""
        folder = self.root / name
        make(folder)
        shown = os.fsencode(name).decode("utf-8", "backslashreplace")  # as the server shows it
        index = self.poll_until(what, lambda ix: any("state" in e for e in ix.get(shown, [])))
        if index is not None:
            entry = index[shown][0]
            self.shown[what] = f"{entry['state']}: {entry.get('reason', '')}"[:160]
            self.served_ready(what, index)
        shutil.rmtree(folder)
        self.poll_until(f"{what} removed", lambda ix: shown not in ix)

    def bad_config(self) -> None:
        kind = self.rng.choice(["not_json", "deep", "huge_int", "dims_int"])
        doc: dict | str
        if kind == "not_json":
            doc = "{nope"
        elif kind == "deep":
            doc = "[" * 100_000 + "]" * 100_000
        elif kind == "huge_int":
            doc = json.dumps({"function": "saxpy", "max_batch_size": 7}).replace(
                "7", "7" * 401)
        else:
            doc = json.loads((SAMPLES / "gru_step" / "config.json").read_text())
            doc["sequence_batching"]["state"][0]["initial_state"][0]["dims"] = 16

        def make(folder: Path) -> None:
            source = "gru_step" if kind == "dims_int" else "saxpy"
            shutil.copytree(SAMPLES / source, folder)
            _write_config(folder / "config.json", doc)

        self.drop_in(f"bad_config {kind}", "bad_model", make)

    def version_dir(self) -> None:
        def make(folder: Path) -> None:
            (folder / "²").mkdir(parents=True)
            shutil.copyfile(SAMPLES / "saxpy" / "1" / "model.vmfb", folder / "²" / "model.vmfb")
            shutil.copyfile(SAMPLES / "saxpy" / "config.json", folder / "config.json")

        self.drop_in("version_dir ²", "odd_version", make)

    def state_file(self) -> None:
        kind = self.rng.choice(["fifo", "dev_zero"])

        def make(folder: Path) -> None:
            shutil.copytree(SAMPLES / "gru_step", folder)
            doc = json.loads((folder / "config.json").read_text())
            doc["sequence_batching"]["state"][0]["initial_state"][0] = {
                "data_type": "TYPE_FP32", "dims": [16], "data_file": "s", "name": "s"}
            _write_config(folder / "config.json", doc)
            (folder / "1" / "initial_state").mkdir()
            if kind == "fifo":
                os.mkfifo(folder / "1" / "initial_state" / "s")
            else:
                (folder / "1" / "initial_state" / "s").symlink_to("/dev/zero")

        self.drop_in(f"state_file {kind}", "odd_state", make)

    def not_utf8_name(self) -> None:
        def make(folder: Path) -> None:
            shutil.copytree(SAMPLES / "saxpy", folder)

        name = os.fsdecode(b"caf\xe9")
        self.drop_in("not_utf8_name", name, make)

    def corrupt_served(self) -> None:
        """The served model's file broken in place: the poll's reload fails, its version
        keeps serving (the steady clients see nothing), then the file comes back."""
        if self.rng.random() < 0.5:
            with open(self.vmfb, "r+b") as f:
                f.write(bytes(b ^ 0xA5 for b in self.original[:4096]))
        else:
            os.truncate(self.vmfb, self.rng.randrange(len(self.original)))
        self.poll_until("corrupt_served", lambda ix: any(
            e.get("state") == "READY" for e in ix.get("mlp_classifier", [])))
        time.sleep(0.5)
        tmp = self.vmfb.with_suffix(".tmp")
        tmp.write_bytes(self.original)
        tmp.replace(self.vmfb)
        index = self.poll_until("corrupt_served restored", lambda ix: True)
        if index is not None:
            self.served_ready("corrupt_served restored", index)

    def add_remove(self) -> None:
        folder = self.root / "extra"
        shutil.copytree(SAMPLES / "saxpy", folder)
        self.poll_until("add extra", lambda ix: any(
            e.get("state") == "READY" for e in ix.get("extra", [])))
        body = json.dumps({"inputs": [
            {"name": "alpha", "datatype": "FP32", "shape": [1], "data": [2.0]},
            {"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]},
            {"name": "y", "datatype": "FP32", "shape": [2], "data": [0.5, 0.5]}]}).encode()
        status, _ = self.server.request("POST", "/v2/models/extra/infer", body)
        self.expect("infer extra", status, {200})
        shutil.rmtree(folder)
        self.poll_until("remove extra", lambda ix: "extra" not in ix)
        self.expect("infer removed extra", self.server.request(
            "POST", "/v2/models/extra/infer", body)[0], {404, 503})

    def send_signal(self) -> None:
        sig = self.rng.choice([signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2])
        os.kill(self.server.proc.pid, sig)
        self.done[f"signal {sig.name}"] += 1
        time.sleep(0.2)

    # -- clients -------------------------------------------------------------------

    def non_reading(self) -> None:
        n = MB  # 4 MiB per input as binary, a JSON answer of about 10 MB
        body, header_length = saxpy_binary_request(bytes(range(256)) * (n // 64), n)
        head = (f"POST /v2/models/saxpy/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                f"{len(body)}\r\nInference-Header-Content-Length: {header_length}\r\n\r\n"
                ).encode()
        socks = []
        try:
            for _ in range(4):
                sock = socket.socket()
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.settimeout(30)
                sock.connect(("127.0.0.1", self.server.port))
                sock.sendall(head + body)
            time.sleep(3.0)
        finally:
            for sock in socks:
                sock.close()

    def stalled_upload(self) -> None:
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=30) as s:
            s.sendall(b"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: 4000000\r\n\r\n" + b" " * MB)
            answer = s.recv(4096)
        self.expect("stalled upload", int(answer.split(b" ")[1]) if answer else -1, {408})

    def hostile(self) -> None:
        kind = self.rng.choice(["gzip_bomb", "huge_header", "slowloris", "bad_json",
                                "65_dims", "pipelining_flood", "tiny_chunks"])
        self.done[f"hostile {kind}"] += 1
        path = "/v2/models/mlp_classifier/infer"
        if kind == "gzip_bomb":
            row = b"[" + b"0.0," * 15 + b"0.0]"
            body = gzip.compress(b'{"inputs":[{"name":"features","datatype":"FP32",'
                                 b'"shape":[1,16],"data":[' +
                                 b",".join([row] * ((70 << 20) // len(row))) + b"]}]}", 9)
            self.expect(kind, self.server.request("POST", path, body,
                                                  {"Content-Encoding": "gzip"})[0],
                        {400, 413})
        elif kind == "huge_header":
            try:
                status, _ = self.server.request("GET", "/v2/health/live", b"",
                                                {"X-Big": "a" * MB})
            except OSError:
                status = 431  # answered and closed while the header was being sent
            self.expect(kind, status, {431})
        elif kind == "slowloris":
            socks = []
            try:
                for _ in range(200):
                    s = socket.create_connection(("127.0.0.1", self.server.port), timeout=10)
                    socks.append(s)
                    s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
                time.sleep(0.5)
            finally:
                for s in socks:
                    s.close()
        elif kind == "pipelining_flood":
            flood = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n" * 8192
            socks = []
            try:
                for _ in range(50):
                    s = socket.socket()
                    socks.append(s)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    s.settimeout(10)
                    s.connect(("127.0.0.1", self.server.port))
                    s.setblocking(False)
                    try:
                        s.send(flood)
                    except BlockingIOError:
                        pass
                time.sleep(1.0)
            finally:
                for s in socks:
                    s.close()
        elif kind == "tiny_chunks":
            body = (f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                    f"\r\n").encode() + b"1\r\n \r\n" * 60000 + b"0\r\n\r\n"
            socks = [socket.create_connection(("127.0.0.1", self.server.port), timeout=30)
                     for _ in range(20)]
            try:
                senders = [threading.Thread(target=s.sendall, args=(body,)) for s in socks]
                for sender in senders:
                    sender.start()
                for sender in senders:
                    sender.join(timeout=60)
                for s in socks:
                    answer = s.recv(4096)
                    self.expect(kind, int(answer.split(b" ")[1]) if answer else -1, {400})
            finally:
                for s in socks:
                    s.close()
        elif kind == "bad_json":
            self.expect(kind, self.server.request("POST", path, b"{nope")[0], {400})
        else:
            shape = json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                            "shape": [1] * 65, "data": [0.0]}]}).encode()
            self.expect(kind, self.server.request("POST", path, shape)[0], {400})

    ACTIONS = ("non_reading", "stalled_upload", "bad_config", "version_dir", "state_file",
               "not_utf8_name", "corrupt_served", "add_remove", "send_signal", "send_signal",
               "hostile", "hostile")

    def step(self, actions: list[str]) -> None:
        action = getattr(self, self.rng.choice(actions))
        try:
            action()
        except OSError as exc:
            self.surprises.append(f"{action.__name__}: {exc!r}")
        self.done[action.__name__] += 1


def _lag(metrics: dict[str, float]) -> tuple[float, float]:
    """(longest stall since start in s, count of wake-ups later than 50 ms)."""
    longest = metrics.get("tinyhal_event_loop_lag_max_seconds{}", 0.0)
    total = metrics.get("tinyhal_event_loop_lag_seconds_count{}", 0.0)
    within = metrics.get('tinyhal_event_loop_lag_seconds_bucket{"le": "0.05"}', 0.0)
    return longest, total - within


def _reference(server: Server) -> tuple[bytes, bytes, list]:
    """The answers every steady request is compared with."""
    status, answer = server.request("POST", "/v2/models/mlp_classifier/infer", JSON_BODY)
    assert status == 200, answer
    status, binary = server.request("POST", "/v2/models/mlp_classifier/infer", BINARY_BODY,
                                    {"Inference-Header-Content-Length":
                                     str(len(_BINARY_HEADER))})
    assert status == 200, binary
    steps = []
    for step in range(8):
        status, payload = server.request("POST", "/v2/models/gru_step/infer",
                                         _sequence_body(1, step, step == 7))
        assert status == 200, payload
        steps.append(_outputs(payload))
    return json.dumps(_outputs(answer)).encode(), binary, steps


def run(args: argparse.Namespace, actions: list[str], steady: list[str]) -> dict:
    """One server, the steady classes and the chaos `actions` for `args.minutes`: the
    per-class rows, the summary and what the report prints beside them."""
    tally = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for model in SERVED:
            shutil.copytree(SAMPLES / model, root / model)
        server = Server(root)
        try:
            expect_json, expect_binary, reference = _reference(server)
            expect = {"json": expect_json, "binary": expect_binary}
            time.sleep(1.0)
            rss_start = _status_bytes(server.proc.pid, "VmRSS")
            lag_before = _lag(server.metrics())
            stop = threading.Event()
            ids = itertools.count(1000)
            threads = []
            for i in range(args.clients):
                for kind in steady:
                    target, extra = (sequence_client, (reference, ids, tally, random.Random(
                        args.seed * 100 + i), stop)) if kind == "sequence" else \
                        (stateless_client, (kind, expect[kind], tally, stop))
                    threads.append(threading.Thread(target=target, args=(server, *extra),
                                                    daemon=True))
            for t in threads:
                t.start()
            chaos = Chaos(server, root, tally, random.Random(args.seed))
            end = time.monotonic() + args.minutes * 60
            next_sample = time.monotonic()
            rss_timeline = []
            while time.monotonic() < end and server.proc.poll() is None:
                if actions:
                    chaos.step(actions)
                else:
                    time.sleep(1.0)
                if time.monotonic() >= next_sample:
                    rss_timeline.append(round(_status_bytes(server.proc.pid, "VmRSS") / MB))
                    next_sample += 15.0
            stop.set()
            for t in threads:
                t.join(timeout=120)
            time.sleep(2.0)
            alive = server.proc.poll() is None
            rss_end = _status_bytes(server.proc.pid, "VmRSS") if alive else 0
            rss_peak = _status_bytes(server.proc.pid, "VmHWM") if alive else 0
            lag_after = _lag(server.metrics()) if alive else (float("nan"), float("nan"))
            ready = server.request("GET", "/v2/health/ready")[0] if alive else -1
        finally:
            exit_code, drain_seconds = server.stop()
    classes = sorted(tally.counts)
    rows = [{"class": kind, **{k: tally.counts[kind][k] for k in
                               ("served", "refused", "timed_out", "failed", "errors_5xx")}}
            for kind in classes]
    failed = sum(tally.counts[k]["failed"] for k in classes)
    errors_5xx = sum(tally.counts[k]["errors_5xx"] for k in classes)
    summary = {
        "minutes": args.minutes, "clients_per_class": args.clients,
        "failed_admitted": failed, "errors_5xx": errors_5xx,
        "chaos_actions": sum(chaos.done.values()), "surprises": len(chaos.surprises),
        "rss_start_mb": round(rss_start / MB, 1), "rss_end_mb": round(rss_end / MB, 1),
        "rss_peak_mb": round(rss_peak / MB, 1), "rss_bound_mb": args.rss_bound_mb,
        "lag_max_ms": round(lag_after[0] * 1e3, 1),
        "lag_over_50ms_during_run": lag_after[1] - lag_before[1],
        "ready_at_end": ready, "exit_code": exit_code,
        "drain_seconds": round(drain_seconds, 1)}
    healthy = (failed == 0 and errors_5xx == 0 and not chaos.surprises and ready == 200
               and exit_code == 0 and (rss_end - rss_start) / MB <= args.rss_bound_mb)
    return {"rows": rows, "summary": summary, "healthy": healthy, "chaos": chaos,
            "tally": tally, "rss_timeline": rss_timeline, "log_tail": server.log[-40:]}


def _report(outcome: dict) -> None:
    rows, summary, chaos = outcome["rows"], outcome["summary"], outcome["chaos"]
    print_table(rows, list(rows[0]) if rows else ["class"])
    print()
    print_table([summary], list(summary))
    print("actions:", json.dumps(dict(sorted(chaos.done.items()))))
    print("RSS (MB) every 15 s:", outcome["rss_timeline"])
    print("malformed changes as the index showed them:")
    for what, shown in sorted(chaos.shown.items()):
        print(f"   {what}: {shown}")
    for line in outcome["tally"].failures + chaos.surprises:
        print("  !", line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--clients", type=int, default=2,
                        help="threads per steady class (json, binary, sequence)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rss-bound-mb", type=float, default=24.0,
                        help="how far the settled RSS at the end may be above the start")
    parser.add_argument("--steady", default="json,binary,sequence",
                        help="the steady classes to run (comma-separated; default all)")
    parser.add_argument("--results-name", default="serve_chaos",
                        help="bench/results/NAME.json to write (default serve_chaos)")
    parser.add_argument("--actions", default="",
                        help="comma-separated chaos actions to draw from (default: all of "
                             + ", ".join(sorted(set(Chaos.ACTIONS))) + "; none: 'none')")
    parser.add_argument("--each-action", action="store_true",
                        help="one run (a server of its own, --minutes long) per chaos action "
                             "of --actions alone, one with none, then one with all of them; "
                             "a table of RSS start/end/peak per run")
    args = parser.parse_args(argv)
    actions = list(Chaos.ACTIONS) if not args.actions else \
        [a for a in args.actions.split(",") if a != "none"]
    if set(actions) - set(Chaos.ACTIONS):
        raise SystemExit(f"--actions: no action {', '.join(set(actions) - set(Chaos.ACTIONS))}")
    if not 0 < args.minutes <= 60:
        raise SystemExit("--minutes must be in (0, 60]")
    if not 1 <= args.clients <= 16:
        raise SystemExit("--clients must be in [1, 16]")
    steady = [k for k in args.steady.split(",") if k]
    if set(steady) - {"json", "binary", "sequence"}:
        raise SystemExit("--steady: classes are json, binary and sequence")
    if not re.fullmatch(r"[\w.-]{1,64}", args.results_name):
        raise SystemExit("--results-name must be a plain file name")
    command = "python bench/serve_chaos.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    if args.each_action:
        return _each_action(args, actions, steady, command)
    outcome = run(args, actions, steady)
    _report(outcome)
    chaos = outcome["chaos"]
    path = write_results(args.results_name, outcome["rows"] + [outcome["summary"]], {
        "command": command, "rss_mb_every_15s": outcome["rss_timeline"],
        "actions": dict(chaos.done), "shown": chaos.shown,
        "failures": outcome["tally"].failures, "surprises": chaos.surprises,
        "server_log_tail": outcome["log_tail"], "load_average": os.getloadavg()})
    print(f"wrote {path}")
    return 0 if outcome["healthy"] else 1


def _each_action(args: argparse.Namespace, actions: list[str], steady: list[str],
                 command: str) -> int:
    """Runs each action alone, none, then all: where the memory of the full mix goes."""
    table = []
    healthy = True
    for name, chosen in ([(a, [a]) for a in sorted(set(actions))]
                         + [("none", []), ("all", actions)]):
        outcome = run(args, chosen, steady)
        summary = outcome["summary"]
        healthy = healthy and outcome["healthy"]
        table.append({"actions": name, "served": sum(r["served"] for r in outcome["rows"]),
                      "failed": summary["failed_admitted"], "5xx": summary["errors_5xx"],
                      "surprises": summary["surprises"],
                      "rss_start_mb": summary["rss_start_mb"],
                      "rss_end_mb": summary["rss_end_mb"],
                      "rss_growth_mb": round(summary["rss_end_mb"] - summary["rss_start_mb"], 1),
                      "rss_peak_mb": summary["rss_peak_mb"],
                      "lag_max_ms": summary["lag_max_ms"], "exit": summary["exit_code"]})
        print_table(table[-1:], list(table[-1]))
        for line in outcome["tally"].failures + outcome["chaos"].surprises:
            print("  !", line)
    print()
    print_table(table, list(table[0]))
    path = write_results(args.results_name, table, {"command": command,
                                                    "load_average": os.getloadavg()})
    print(f"wrote {path}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
