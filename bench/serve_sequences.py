"""Stateful sequences under load: tinyhal-serve's cellular batching against the same server
with sequence batching off and against Triton 2.51's sequence batcher, on one .vmfb.

The model is the bundled `gru_step` (one GRU cell step, 8 inputs, 16 hidden units; the
hidden state is implicit state kept by the server). Three servers:

- `tinyhal-1`: tinyhal-serve, the bundled config with `max_batch_size: 1`, so every
  invocation runs one step of one sequence (sequence batching off; state still kept);
- `tinyhal-cell`: tinyhal-serve, the bundled config (cellular batching: up to 64
  sequences per invocation, `oldest`, no queue delay);
- `triton`: Triton 2.51 (from the nvidia-pytriton wheel, set up as in serve_triton.py)
  with a Python-backend `model.py` (generated here) that keeps each sequence's state in a
  dict keyed by its CORRID control input and runs a batch of steps through `iree.runtime`
  (`local-sync`) on the same .vmfb; `sequence_batching` with the `oldest` strategy, the
  same candidate sequences, max_batch_size and queue delay, one instance.

Load: N sequences at once (N = 1, 8, 32, 64 by default), each a keep-alive connection that
sends its next step when the previous answer arrived (binary tensors over HTTP); a
sequence ends after `--steps` steps (sequence_end) and a new one starts in its place, so
sequences join and leave all the time. The load generator (`--client`) runs on the same
two cores as the server and every server gets the same one:

- `epoll` (the default): one thread, non-blocking sockets on one epoll, a sequence's
  requests built once when it starts; about 20 us of CPU per step.
- `asyncio`: this bench's first client (one asyncio task and stream per sequence, each
  request built as it is sent), kept for comparison with earlier figures; about 40-50 us
  per step at 32 sequences (more as steps/s fall).
- `perf_analyzer`: Triton's own load generator as a Triton user runs it on a sequence
  model (`--sequence-length`, `--serial-sequences` for the same one-step-at-a-time loop,
  its random INPUT; see `_perf_analyzer_sequences`); about 150-190 us per step. It
  sends a new request `id` with every step, so no two request headers are the same.

What a client costs decides steps/s as much as what a server costs: the figure
`client_cpu_us` is the client's CPU per step (this process's, or perf_analyzer's).
`--python-cpu` passes tinyhal-serve's option of that name to its servers (by default
they run with the server's default, `auto`: the loop and a single instance's thread on
one CPU); on a machine other work keeps busy, `none` decides steps/s
(docs/performance.md).

Each round runs every (N, server) cell, the server order rotating from round to round; a
figure is the median over rounds. Per cell: steps/s, p50 and p99 per step (ms), errors,
mean batch size (statistics endpoint), server CPU per step (/proc, Triton's stub
processes included) and the CPUs it kept busy (`server_cpus`: at 1.0 a pinned tinyhal
server is at its cap, and only less CPU per step raises its steps/s), the client's CPU
per step, the load average, and for tinyhal-serve
the CPU of its event-loop thread per step (HTTP, scheduling; the rest is the instance
threads'), where an execution's host time goes (gather, invoke, scatter, respond:
microseconds per step, from the model's `sequence_stats`, wall time) and the share of
executions whose state input was a view of the rows where they were (`in_place_pct`).
Before any load, every server runs the same sequence and must answer with the same bits.

The ratios at each N are those of the medians, and for steps/s also the median (and
range) of the ratios within each round (`paired_ratios`): the cells of a round run back to
back, so their ratio is steadier than the medians' where the machine's speed drifts
(on the 2-core VM of docs/performance.md it moves by up to 1.8x over seconds by itself).
`--servers tinyhal-cell,triton` leaves the unbatched server out, for more rounds of the
Triton ratio in the same time. The defaults (5 rounds of 3 s) give the drift more rounds
to even out than the 3 of 4 s used before.

    pip install -e '.[bench-triton]'
    python bench/serve_sequences.py [--seconds 3] [--rounds 5] [--sequences 1,8,32,64]
                                    [--steps 20] [--no-triton] [--servers A,B]
                                    [--client epoll|asyncio|perf_analyzer]

Writes bench/results/serve_sequences.json and prints a table and the ratios at each N.

`--a PYTHON --b PYTHON` compares two builds of tinyhal-serve instead (each interpreter's
environment has one build installed, e.g. a venv of `main` and the one of a branch): the
`tinyhal-cell` server of each, one build at a time, in alternating order from round to
round, at each N. Per build the medians over rounds of steps/s, CPU per step and the
event loop's CPU per step (its user and system parts apart), and the median of the
per-round differences B - A (a round's two runs saw nearly the same machine): on a
shared machine the CPU figures are far steadier than steps/s, and the paired difference
steadier than either median. Writes bench/results/serve_sequences_ab.json.

    python bench/serve_sequences.py --a /path/to/venv-a/bin/python --b .venv/bin/python \
                                    [--rounds 6] [--seconds 3] [--sequences 32]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    ServerProcess,
    cpu_seconds,
    free_port,
    paired_ratios,
    print_table,
    write_results,
)
from serve_triton import Skipped, TritonInstall  # noqa: E402

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parent / "server" / "models"
MODEL = "gru_step"
PATH = f"/v2/models/{MODEL}/infer"
STATS = f"/v2/models/{MODEL}/stats"
INPUT, HIDDEN = 8, 16
SERVERS = ("tinyhal-cell", "tinyhal-1", "triton")

TRITON_CONFIG = """\
name: "{model}"
backend: "python"
max_batch_size: {max_batch}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {input} ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {hidden} ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle}
  oldest {{ max_candidate_sequences: {candidates} max_queue_delay_microseconds: {delay} }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

# What a Triton user writes to serve a recurrent step with the Python backend: the
# backend keeps each sequence's state itself (Triton keeps implicit state only in its
# ONNX Runtime and TensorRT backends).
TRITON_MODEL_PY = '''\
import os

import iree.runtime
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.vmfb")
        self.module = iree.runtime.load_vm_flatbuffer_file(path, driver="local-sync")
        self.states = {}
        self.zero = np.zeros((1, HIDDEN), np.float32)

    def execute(self, requests):
        xs, hs, ids, ends = [], [], [], []
        for r in requests:
            corrid = int(pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy().ravel()[0])
            start = pb_utils.get_input_tensor_by_name(r, "START").as_numpy().ravel()[0]
            end = pb_utils.get_input_tensor_by_name(r, "END").as_numpy().ravel()[0]
            xs.append(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())
            hs.append(self.zero if start else self.states[corrid])
            ids.append(corrid)
            ends.append(end)
        x = xs[0] if len(xs) == 1 else np.concatenate(xs)
        h = hs[0] if len(hs) == 1 else np.concatenate(hs)
        out, state = (t.to_host() for t in self.module.step(x, h))
        responses = []
        for i, corrid in enumerate(ids):
            if ends[i]:
                self.states.pop(corrid, None)
            else:
                self.states[corrid] = state[i:i + 1].copy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT",
                                                                         out[i:i + 1])]))
        return responses
'''.replace("HIDDEN", str(HIDDEN))

CANDIDATES = 256
IDLE_US = 10_000_000


def _tinyhal_repo(root: Path, max_batch: int) -> Path:
    shutil.copytree(SAMPLES / MODEL, root / MODEL)
    path = root / MODEL / "config.json"
    config = json.loads(path.read_text())
    config["max_batch_size"] = max_batch
    path.write_text(json.dumps(config))
    return root


def _triton_repo(root: Path) -> Path:
    version = root / MODEL / "1"
    version.mkdir(parents=True)
    shutil.copy2(SAMPLES / MODEL / "1" / "model.vmfb", version / "model.vmfb")
    (version / "model.py").write_text(TRITON_MODEL_PY)
    (root / MODEL / "config.pbtxt").write_text(TRITON_CONFIG.format(
        model=MODEL, max_batch=64, input=INPUT, hidden=HIDDEN, idle=IDLE_US,
        candidates=CANDIDATES, delay=0))
    return root


def step_body(x: np.ndarray, sid: int, start: bool, end: bool) -> tuple[bytes, int]:
    """A binary-tensor V2 request for one step: (body, JSON header length)."""
    header = json.dumps({
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, INPUT],
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}],
        "parameters": {"sequence_id": sid, "sequence_start": start, "sequence_end": end},
    }).encode()
    return header + x.tobytes(), len(header)


def _http_request(port: int, body: bytes, header_length: int) -> bytes:
    return (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {header_length}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> tuple[int, bytes]:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return status, await reader.readexactly(length)


def _step_requests(port: int, x: np.ndarray, sid: int, steps: int) -> list[bytes]:
    """The HTTP requests of one sequence's steps, in order (its middle steps' requests
    are the same bytes, built once)."""
    if steps == 1:
        return [_http_request(port, *step_body(x, sid, True, True))]
    middle = _http_request(port, *step_body(x, sid, False, False))
    return [_http_request(port, *step_body(x, sid, True, False)), *[middle] * (steps - 2),
            _http_request(port, *step_body(x, sid, False, True))]


async def _asyncio_sequences(port: int, n: int, steps: int, seconds: float, base_id: int,
                             x: np.ndarray) -> tuple[list[float], int]:
    """The first client of this bench (`--client asyncio`): one asyncio task and
    stream per sequence, each request built as it is sent. (latencies, errors)"""
    latencies: list[float] = []
    errors = [0]
    stop_at = time.perf_counter() + seconds

    async def one(lane: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            sid = base_id + lane * 1_000_000
            while time.perf_counter() < stop_at:
                sid += 1
                for k in range(steps):
                    last = k == steps - 1 or time.perf_counter() >= stop_at
                    request = _http_request(port, *step_body(x, sid, k == 0, last))
                    begin = time.perf_counter()
                    status, _ = await _exchange(reader, writer, request)
                    latencies.append(time.perf_counter() - begin)
                    if status != 200:
                        errors[0] += 1
                    if last:
                        break
        finally:
            writer.close()

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), seconds + 60)
    return latencies, errors[0]


class _Lane:
    """One sequence at a time of the epoll client: its connection, the requests of its
    current sequence and the answer read so far."""

    __slots__ = ("sock", "sid", "k", "requests", "received", "begin")

    def __init__(self, sock: socket.socket, sid: int) -> None:
        self.sock = sock
        self.sid = sid
        self.k = 0
        self.requests: list[bytes] = []
        self.received = b""
        self.begin = 0.0


def _epoll_sequences(port: int, n: int, steps: int, seconds: float, base_id: int,
                     x: np.ndarray) -> tuple[list[float], int]:
    """The default client (`--client epoll`): the same closed loop as the asyncio client
    (one keep-alive connection per sequence, the next step sent when the answer
    arrived, the same request bytes), written to cost little CPU per step: one thread,
    non-blocking sockets on one epoll, a sequence's requests built once when it starts.
    (latencies, errors)"""
    latencies: list[float] = []
    errors = 0
    poller = select.epoll()
    lanes: dict[int, _Lane] = {}
    clock = time.perf_counter
    stop_at = clock() + seconds
    give_up = stop_at + 60

    def send(lane: _Lane) -> None:
        request = lane.requests[lane.k]
        lane.begin = clock()
        sent = lane.sock.send(request)
        if sent < len(request):  # the socket took part of it: finish blocking
            lane.sock.setblocking(True)
            lane.sock.sendall(request[sent:])
            lane.sock.setblocking(False)

    def next_sequence(lane: _Lane) -> None:
        lane.sid += 1
        lane.k = 0
        lane.requests = _step_requests(port, x, lane.sid, steps)
        send(lane)

    try:
        for i in range(n):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            lane = lanes[sock.fileno()] = _Lane(sock, base_id + i * 1_000_000)
            poller.register(sock.fileno(), select.EPOLLIN)
        for lane in lanes.values():
            next_sequence(lane)
        while lanes:
            if clock() > give_up:
                raise TimeoutError(f"{len(lanes)} sequences still unanswered")
            for fd, _ in poller.poll(1.0):
                lane = lanes[fd]
                data = lane.sock.recv(65536)
                if not data:
                    raise ConnectionError("the server closed a connection")
                received = lane.received + data if lane.received else data
                head = received.find(b"\r\n\r\n")
                if head < 0:
                    lane.received = received
                    continue
                fields = received[:head + 2].lower()
                at = fields.find(b"\r\ncontent-length:")
                length = int(fields[at + 17:fields.index(b"\r\n", at + 2)]) if at >= 0 \
                    else 0
                if len(received) < head + 4 + length:
                    lane.received = received
                    continue
                lane.received = b""
                latencies.append(clock() - lane.begin)
                if received[9:12] != b"200":
                    errors += 1
                lane.k += 1
                if lane.k == len(lane.requests):  # its END was answered
                    if clock() < stop_at:
                        next_sequence(lane)
                        continue
                    poller.unregister(fd)
                    lane.sock.close()
                    del lanes[fd]
                    continue
                if clock() >= stop_at and lane.k < len(lane.requests) - 1:
                    lane.requests[lane.k] = _http_request(  # time is up: this step ends it
                        port, *step_body(x, lane.sid, False, True))
                    del lane.requests[lane.k + 1:]
                send(lane)
    finally:
        for lane in lanes.values():
            lane.sock.close()
        poller.close()
    return latencies, errors


CLIENTS = ("asyncio", "epoll", "perf_analyzer")


def _perf_analyzer_sequences(tool: tuple[str, dict[str, str]], port: int, n: int, steps: int,
                             seconds: float, base_id: int, workdir: Path) -> dict[str, Any]:
    """`--client perf_analyzer`: Triton's load generator on its sequence-model path, as a
    Triton user would run it against either server: N concurrent sequences of exactly
    `steps` steps, at most one request of a sequence outstanding (`--serial-sequences`,
    the closed loop of the other clients; without it, it sends a sequence's next steps
    before the previous ones were answered, over other connections), binary tensors,
    its own random INPUT, ids of their own for each `base_id`. Its throughput and latencies are those
    of its measurement windows (three of `seconds` / 3); its CPU (user + system of the
    finished process) is over the whole run and divided by the steps the server counted."""
    binary, env = tool
    csv_file = workdir / f"pa-{port}-{n}.csv"
    csv_file.unlink(missing_ok=True)
    argv = [binary, "-m", MODEL, "-u", f"127.0.0.1:{port}", "-i", "http",
            "--concurrency-range", str(n), "--sequence-length", str(steps),
            "--sequence-length-variation", "0", "--serial-sequences",
            "--sequence-id-range", f"{base_id * 100_000}", "--measurement-interval",
            str(max(500, int(seconds * 1000 / 3))), "--stability-percentage", "500",
            "--max-trials", "3", "-f", str(csv_file)]
    before = os.times()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                          timeout=seconds * 6 + 120)
    after = os.times()
    cpu = (after.children_user - before.children_user) + \
        (after.children_system - before.children_system)
    if proc.returncode != 0 or not csv_file.exists():
        tail = " / ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        raise RuntimeError(f"perf_analyzer failed: {tail}")
    with open(csv_file) as f:
        row = next(csv.DictReader(f))
    return {"steps_s": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1e3,
            "p99_ms": float(row["p99 latency"]) / 1e3, "steps": None, "errors": 0,
            "client_cpu_s": cpu}


async def _sequences(port: int, n: int, steps: int, seconds: float, base_id: int,
                     client: str = "epoll") -> dict[str, Any]:
    """N closed-loop sequences for `seconds` with `client`: steps/s, per-step latency,
    errors and the client's own CPU per step (this process's, all of it the client's
    while it runs)."""
    x = np.linspace(-1, 1, INPUT, dtype=np.float32).reshape(1, INPUT)
    cpu0 = time.process_time()
    begin = time.perf_counter()
    if client == "asyncio":
        latencies, errors = await _asyncio_sequences(port, n, steps, seconds, base_id, x)
    else:
        latencies, errors = _epoll_sequences(port, n, steps, seconds, base_id, x)
    elapsed = time.perf_counter() - begin
    cpu = time.process_time() - cpu0
    lat = np.array(latencies) * 1e3
    return {"steps_s": len(latencies) / elapsed, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "steps": len(latencies),
            "errors": errors, "client_cpu_us": 1e6 * cpu / max(1, len(latencies))}


def _statistics(server: ServerProcess) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{STATS}", timeout=10) as r:
        entry = json.loads(r.read())["model_stats"][0]
    totals = {"inferences": entry["inference_count"], "executions": entry["execution_count"],
              "fail": entry["inference_stats"]["fail"]["count"]}
    for phase, value in entry.get("sequence_stats", {}).get("host", {}).items():
        totals[f"{phase}_ns"] = value["ns"]
    for key, value in entry.get("sequence_stats", {}).get("state_gathers", {}).items():
        totals[f"gathers_{key}"] = value
    return totals


def _user_system(pid: int, tid: int) -> tuple[float, float]:
    """User and system CPU seconds of thread `tid` of `pid` so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def measure(server: ServerProcess, n: int, steps: int, seconds: float, base_id: int,
            client: str = "epoll", analyzer: tuple[str, dict[str, str]] | None = None,
            workdir: Path | None = None) -> dict[str, Any]:
    """One cell: the client's figures and the server's CPU per step (all of it, and its
    event loop's), mean batch size and host phases (statistics endpoint)."""
    pid = server.proc.pid
    stats0, cpu0, loop0 = _statistics(server), server.cpu_seconds(), cpu_seconds(pid, pid)
    loop_parts = dict(zip(("loop_user_us", "loop_system_us"), _user_system(pid, pid)))
    if client == "perf_analyzer":
        result = _perf_analyzer_sequences(analyzer, server.port, n, steps, seconds, base_id,
                                          workdir)
    else:
        result = asyncio.run(_sequences(server.port, n, steps, seconds, base_id, client))
    cpu, stats1 = server.cpu_seconds() - cpu0, _statistics(server)
    loop = cpu_seconds(pid, pid) - loop0
    delta = {k: stats1[k] - stats0.get(k, 0) for k in stats1}
    done = result["steps"] or int(delta["inferences"])
    if "client_cpu_s" in result:
        result["client_cpu_us"] = 1e6 * result.pop("client_cpu_s") / done if done \
            else float("nan")
        result["steps"] = done
    result["errors"] += int(delta["fail"])
    result["batch"] = delta["inferences"] / delta["executions"] if delta["executions"] \
        else float("nan")
    result["cpu_us"] = 1e6 * cpu / done if done else float("nan")
    # CPUs the server kept busy: one means a tinyhal server pinned to one CPU is at its cap
    result["server_cpus"] = result["cpu_us"] * result["steps_s"] / 1e6
    if server.name.startswith("tinyhal"):  # its event loop is the main thread
        result["loop_cpu_us"] = 1e6 * loop / done if done else float("nan")
        for part, seconds in zip(("loop_user_us", "loop_system_us"),
                                 _user_system(pid, pid)):
            result[part] = 1e6 * (seconds - loop_parts[part]) / done if done else float("nan")
    for phase in ("gather", "invoke", "scatter", "respond"):
        if f"{phase}_ns" in delta and delta["inferences"]:
            result[f"{phase}_us"] = delta[f"{phase}_ns"] / 1e3 / delta["inferences"]
    gathers = delta.get("gathers_in_place", 0) + delta.get("gathers_copied", 0)
    if gathers:  # executions whose state input was a view of the rows where they were
        result["in_place_pct"] = 100 * delta["gathers_in_place"] / gathers
    result["load1"] = os.getloadavg()[0]
    return result


def _outputs(server: ServerProcess, xs: np.ndarray, sid: int) -> bytes:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", network_timeout=30)
    out = []
    try:
        for k, x in enumerate(xs):
            tensor = httpclient.InferInput("INPUT", [1, INPUT], "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            result = client.infer(MODEL, [tensor], sequence_id=sid, sequence_start=k == 0,
                                  sequence_end=k == len(xs) - 1)
            out.append(result.as_numpy("OUTPUT").tobytes())
    finally:
        client.close()
    return b"".join(out)


def verify_outputs(servers: list[ServerProcess]) -> None:
    xs = np.random.default_rng(21).standard_normal((6, 1, INPUT)).astype(np.float32)
    reference = _outputs(servers[0], xs, 99)
    for server in servers[1:]:
        if _outputs(server, xs, 99) != reference:
            raise SystemExit(f"outputs of {server.name} differ from {servers[0].name}")


def _summarise(cells: dict[tuple, list[dict]]) -> list[dict]:
    rows = []
    for (n, name), runs in sorted(cells.items()):
        row: dict[str, Any] = {"sequences": n, "server": name, "rounds": len(runs)}
        for key in runs[0]:
            values = [r[key] for r in runs if isinstance(r.get(key), (int, float))
                      and r[key] == r[key]]
            if values:
                row[key] = statistics.median(values)
        row["errors"] = sum(r["errors"] for r in runs)
        rows.append(row)
    return rows


def ratio_table(rows: list[dict], cells: dict[tuple, list[dict]]) -> list[dict]:
    """Cellular batching against sequence batching off and against Triton: the ratio of
    the medians, and for steps/s also the median and range of the ratios within a round
    (`paired_ratios`: the steadier figure where the machine's speed drifts)."""
    by = {(r["sequences"], r["server"]): r for r in rows}
    out = []
    for n in sorted({r["sequences"] for r in rows}):
        cell = by.get((n, "tinyhal-cell"))
        if cell is None:
            continue
        entry: dict[str, Any] = {"sequences": n}
        for label, name in (("vs_unbatched", "tinyhal-1"), ("vs_triton", "triton")):
            other = by.get((n, name))
            if other is None:
                continue
            entry[f"{label}_steps"] = cell["steps_s"] / other["steps_s"]
            entry[f"{label}_p99"] = cell["p99_ms"] / other["p99_ms"]
            paired = paired_ratios([r["steps_s"] for r in cells[(n, "tinyhal-cell")]],
                                   [[r["steps_s"] for r in cells[(n, name)]]])
            if paired:
                entry[f"{label}_steps_paired"] = paired["median"]
                entry[f"{label}_steps_range"] = f"{paired['min']:.2f}-{paired['max']:.2f}"
        out.append(entry)
    return out


def _tinyhal_server(name: str, python: str, repo: Path, python_cpu: str | None = None
                    ) -> ServerProcess:
    port = free_port()
    cpu = [] if python_cpu is None else ["--python-cpu", python_cpu]
    return ServerProcess(name, [python, "-m", "tinyhal.server.main", "--host", "127.0.0.1",
                                "--port", str(port), "--model-repository", str(repo),
                                "--log-level", "warning", *cpu],
                         port, json.dumps({"inputs": []}).encode(), "/v2/repository/index")


AB_FIGURES = ("steps_s", "cpu_us", "server_cpus", "loop_cpu_us", "loop_user_us",
              "loop_system_us", "batch", "p99_ms", "client_cpu_us")


def _analyzer(workdir: Path, install: TritonInstall | None = None
              ) -> tuple[str, dict[str, str]]:
    """perf_analyzer and its environment (from the bench-triton extra's Triton: the
    `install` made already, or one made in `workdir`)."""
    try:
        return (install or TritonInstall(workdir)).perf_analyzer(workdir)
    except Skipped as exc:
        raise SystemExit(f"--client perf_analyzer: {exc}") from None


def compare_builds(builds: dict[str, str], counts: list[int], steps: int, seconds: float,
                   rounds: int, client: str = "epoll", python_cpu: str | None = None) -> int:
    """The `--a/--b` mode (see the module doc): the cellular-batching server of each
    build, one at a time, alternating; prints and writes the medians and paired
    differences."""
    runs: dict[tuple[int, str], list[dict]] = {}
    base = 1
    with tempfile.TemporaryDirectory() as tmp:
        repo = _tinyhal_repo(Path(tmp), 64)
        analyzer = _analyzer(Path(tmp)) if client == "perf_analyzer" else None
        for round_index in range(rounds):
            order = list(builds) if round_index % 2 == 0 else list(reversed(builds))
            for name in order:
                server = _tinyhal_server(f"tinyhal-cell-{name}", builds[name], repo,
                                         python_cpu)
                try:
                    asyncio.run(_sequences(server.port, max(counts), steps, 1.0, base))
                    for n in counts:
                        base += 1
                        result = measure(server, n, steps, seconds, base, client, analyzer,
                                         Path(tmp))
                        runs.setdefault((n, name), []).append(result)
                        print(f"round {round_index + 1} N={n} {name}: "
                              f"{result['steps_s']:.0f} steps/s, CPU "
                              f"{result['cpu_us']:.1f} us/step (loop "
                              f"{result['loop_cpu_us']:.1f}), batch {result['batch']:.1f}, "
                              f"load {result['load1']:.2f}", flush=True)
                finally:
                    server.stop()
    rows = []
    for n in counts:
        a, b = runs[(n, "A")], runs[(n, "B")]
        for name, results in (("A", a), ("B", b)):
            row: dict[str, Any] = {"sequences": n, "build": name, "rounds": len(results)}
            for key in AB_FIGURES:
                row[key] = statistics.median(r[key] for r in results)
            row["errors"] = sum(r["errors"] for r in results)
            rows.append(row)
        diff: dict[str, Any] = {"sequences": n, "build": "B - A (paired)", "rounds": len(a)}
        for key in AB_FIGURES:
            diff[key] = statistics.median(y[key] - x[key] for x, y in zip(a, b))
        rows.append(diff)
    path = write_results("serve_sequences_ab", rows, {
        "builds": builds, "load_average_end": os.getloadavg(),
        "settings": {"seconds": seconds, "rounds": rounds, "steps": steps,
                     "client": client, "python_cpu": python_cpu}})
    print_table(rows, ["sequences", "build", "rounds", *AB_FIGURES, "errors"])
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}; wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sequences", default="1,8,32,64")
    parser.add_argument("--steps", type=int, default=20, help="steps per sequence")
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help="which of the three servers run (default all; e.g. "
                             "tinyhal-cell,triton for more rounds of the Triton ratio in "
                             "the same time)")
    parser.add_argument("--client", choices=CLIENTS, default="epoll",
                        help="the load generator (see the module doc); asyncio: this "
                             "bench's first one")
    parser.add_argument("--python-cpu", metavar="auto|none|CPU",
                        help="tinyhal-serve's --python-cpu (default: the server's default)")
    parser.add_argument("--a", metavar="PYTHON", help="interpreter of build A (with --b: "
                        "compare two builds of tinyhal-serve, see the module doc)")
    parser.add_argument("--b", metavar="PYTHON", help="interpreter of build B")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.sequences.split(",")]
    chosen = {name for name in args.servers.split(",") if name}
    if chosen - set(SERVERS) or not chosen:
        parser.error(f"--servers: a comma-separated list of {', '.join(SERVERS)}")
    if args.no_triton:
        chosen.discard("triton")
    if args.a or args.b:
        if not (args.a and args.b):
            parser.error("--a and --b go together")
        return compare_builds({"A": args.a, "B": args.b}, counts, args.steps, args.seconds,
                              args.rounds, args.client, args.python_cpu)
    servers: list[ServerProcess] = []
    skipped = None
    install = None
    probe = json.dumps({"inputs": []}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            for name, max_batch in (("tinyhal-cell", 64), ("tinyhal-1", 1)):
                if name not in chosen:
                    continue
                servers.append(_tinyhal_server(name, sys.executable,
                                               _tinyhal_repo(work / name, max_batch),
                                               args.python_cpu))
            if "triton" in chosen:
                try:
                    install = TritonInstall(work)
                    port = free_port()
                    servers.append(ServerProcess(
                        "triton", install.argv(_triton_repo(work / "triton"), port), port,
                        probe, "/v2/repository/index", cwd=install.site_packages,
                        env=install.env()))
                except Skipped as exc:
                    skipped = str(exc)
                    print(f"Triton skipped: {skipped}")
            verify_outputs(servers)
            analyzer = _analyzer(work, install) if args.client == "perf_analyzer" else None
            cells: dict[tuple, list[dict]] = {}
            base = 1
            for round_index in range(args.rounds):
                for n in counts:
                    shift = round_index % len(servers)
                    for server in servers[shift:] + servers[:shift]:
                        base += 1
                        result = measure(server, n, args.steps, args.seconds, base,
                                         args.client, analyzer, work)
                        cells.setdefault((n, server.name), []).append(result)
                        print(f"round {round_index + 1} N={n} {server.name}: "
                              f"{result['steps_s']:.0f} steps/s p99 {result['p99_ms']:.2f} ms "
                              f"batch {result['batch']:.1f} load {result['load1']:.2f}",
                              flush=True)
        finally:
            for server in servers:
                server.stop()
    rows = _summarise(cells)
    ratios = ratio_table(rows, cells)
    path = write_results("serve_sequences", rows, {
        "ratios": ratios, "triton_skipped": skipped,
        "settings": {"seconds": args.seconds, "rounds": args.rounds, "steps": args.steps,
                     "client": args.client, "python_cpu": args.python_cpu}})
    print_table(rows, ["sequences", "server", "steps_s", "p50_ms", "p99_ms", "batch",
                       "cpu_us", "server_cpus", "loop_cpu_us", "client_cpu_us", "gather_us", "invoke_us", "scatter_us",
                       "respond_us",
                       "in_place_pct", "errors", "load1"])
    print()
    print_table(ratios, ["sequences", "vs_unbatched_steps", "vs_unbatched_steps_paired",
                         "vs_unbatched_steps_range", "vs_unbatched_p99", "vs_triton_steps",
                         "vs_triton_steps_paired", "vs_triton_steps_range", "vs_triton_p99"])
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
