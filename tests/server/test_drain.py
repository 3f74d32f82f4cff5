"""Drain and unload answer everyone (server/scheduling.py, main.py's drain, app.py's
unload): a sequence waiting for a slot when its model unloads or the server is told to
stop gets an answer and a log line, the unload returns and leaves the repository
usable, the drain contract a load balancer builds on (listener open while sequences
live here, their steps served, new work 503 "draining" with Retry-After, exit 0), and
the dynamic batcher's queue bound while its instance is idle. Child server processes,
each bounded."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import pytest
from serve_helpers import SAMPLES, ServerProcess, write_model

from support.iree_tools import HOST_FLAGS, compile_mlir

pytestmark = pytest.mark.timeout(120)

GRU = SAMPLES / "gru_step" / "1" / "model.vmfb"
MLP = SAMPLES / "mlp_classifier" / "1" / "model.vmfb"
_X = [0.5] * 8


# A sequence step whose run time the caller sets: each of the state's 1024 elements
# iterates s = 0.999 s + 0.5 `N` times (about 0.85 s for N = 1e6 on two cores).
SPIN_STEP_MLIR = """
#row = affine_map<(d0, d1) -> (d0, 0)>
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @spin(%n: tensor<?x1xi32> {iree.abi.name = "N"},
                %s: tensor<?x1024xf32> {iree.abi.name = "S_IN"})
    -> (tensor<?x1024xf32> {iree.abi.name = "Y"},
        tensor<?x1024xf32> {iree.abi.name = "S_OUT"}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d = tensor.dim %s, %c0 : tensor<?x1024xf32>
  %e = tensor.empty(%d) : tensor<?x1024xf32>
  %r = linalg.generic {indexing_maps = [#row, #id, #id],
                       iterator_types = ["parallel", "parallel"]}
      ins(%n, %s : tensor<?x1xi32>, tensor<?x1024xf32>) outs(%e : tensor<?x1024xf32>) {
  ^bb0(%k: i32, %a: f32, %o: f32):
    %kk = arith.index_cast %k : i32 to index
    %v = scf.for %i = %c0 to %kk step %c1 iter_args(%acc = %a) -> f32 {
      %h = arith.constant 0.999 : f32
      %q = arith.constant 0.5 : f32
      %m = arith.mulf %acc, %h : f32
      %t = arith.addf %m, %q : f32
      scf.yield %t : f32
    }
    linalg.yield %v : f32
  } -> tensor<?x1024xf32>
  return %r, %r : tensor<?x1024xf32>, tensor<?x1024xf32>
}
"""

SPIN_STEP_CONFIG = {
    "function": "spin", "device": "task", "max_batch_size": 4,
    "sequence_batching": {
        "max_sequence_idle_microseconds": 60_000_000,
        "state": [{"input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_FP32",
                   "dims": [1024], "initial_state": [{"data_type": "TYPE_FP32",
                                                      "dims": [1024], "zero_data": True,
                                                      "name": "z"}]}],
    },
}


@pytest.fixture(scope="module")
def spin_step_vmfb():
    return compile_mlir(SPIN_STEP_MLIR, HOST_FLAGS)


def _spin_step(sid, n: int, start: bool = False, end: bool = False, **parameters) -> dict:
    return {"id": f"spin-{sid}",
            "parameters": {"sequence_id": sid, "sequence_start": start,
                           "sequence_end": end, **parameters},
            "inputs": [{"name": "N", "datatype": "INT32", "shape": [1, 1], "data": [n]}]}


def _wait_running(server: ServerProcess, model: str) -> None:
    labels = (("model", model), ("version", "1"))
    _wait_for("a step running", lambda: server.metrics().get(
        ("tinyhal_inference_in_flight", labels)) == 1)


def _gru_config(candidates: int = 1, idle_us: int = 60_000_000) -> dict:
    config = json.loads((SAMPLES / "gru_step" / "config.json").read_text())
    config["sequence_batching"]["max_sequence_idle_microseconds"] = idle_us
    config["sequence_batching"]["oldest"]["max_candidate_sequences"] = candidates
    return config


def _step_body(sid, start: bool = False, end: bool = False) -> dict:
    return {"parameters": {"sequence_id": sid, "sequence_start": start,
                           "sequence_end": end},
            "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 8], "data": _X}]}


def _mlp_body() -> dict:
    return {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                        "data": [0.25] * 16}]}


def _in_background(server: ServerProcess, path: str, body: dict) -> tuple[threading.Thread,
                                                                              list]:
    """Sends one request from a thread; its (status, headers, body) lands in the list."""
    out: list = []

    def send() -> None:
        try:
            out.append(server.request("POST", path, body, timeout=60))
        except OSError as exc:  # no answer at all: what the tests rule out
            out.append((None, {}, repr(exc).encode()))

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, out


def _sequence_stats(server: ServerProcess, model: str) -> dict:
    status, _, body = server.request("GET", f"/v2/models/{model}/stats")
    assert status == 200, body
    return json.loads(body)["model_stats"][0]["sequence_stats"]


def _wait_for(what, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


def _backlog(server: ServerProcess) -> tuple[threading.Thread, list]:
    """Sequence 1 holds gru_one's only slot; sequence 2's START waits for one."""
    status, _, body = server.request("POST", "/v2/models/gru_one/infer",
                                     _step_body(1, start=True))
    assert status == 200, body
    waiting = _in_background(server, "/v2/models/gru_one/infer", _step_body(2, start=True))
    _wait_for("a sequence waiting for a slot",
              lambda: _sequence_stats(server, "gru_one")["waiting_for_slot"] == 1)
    return waiting


def test_unload_with_a_sequence_waiting_for_a_slot_answers_it_and_returns(tmp_path):
    write_model(tmp_path, "gru_one", GRU, _gru_config())
    write_model(tmp_path, "mlp", MLP, json.loads(
        (SAMPLES / "mlp_classifier" / "config.json").read_text()))
    server = ServerProcess("--model-repository", str(tmp_path),
                           "--model-control-mode", "explicit", "--load-model", "*")
    try:
        server.start()
        thread, answer = _backlog(server)
        status, _, body = server.request("POST", "/v2/repository/models/gru_one/unload",
                                         timeout=30)
        assert status == 200, body
        thread.join(timeout=30)
        assert answer and answer[0][0] == 503, answer
        assert "unloading" in json.loads(answer[0][2])["error"]
        assert "retry-after" in answer[0][1]
        server.wait_stderr(r"answered 503: model gru_one version 1 request .*unloading")
        # the repository lock was not kept: other models load and the unloaded one again
        assert server.request("POST", "/v2/repository/models/mlp/load")[0] == 200
        assert server.request("POST", "/v2/repository/models/gru_one/load")[0] == 200
        status, _, body = server.request("POST", "/v2/models/gru_one/infer",
                                         _step_body(2, start=True, end=True))
        assert status == 200, body
    finally:
        server.stop()


def test_sigterm_with_a_sequence_backlog_answers_it_and_exits_0(tmp_path):
    write_model(tmp_path, "gru_one", GRU, _gru_config())
    server = ServerProcess("--model-repository", str(tmp_path), "--drain-timeout", "1")
    try:
        server.start()
        thread, answer = _backlog(server)
        server.terminate()
        assert server.wait(timeout=30) == 0, "".join(server.stderr[-20:])
        thread.join(timeout=30)
        assert answer and answer[0][0] == 503, answer
        assert "drain" in json.loads(answer[0][2])["error"]
        err = server.wait_stderr(r"answered 503: model gru_one version 1 request", 10)
        assert "--drain-timeout 1 s) ran out" in err
        assert "stopped (exit 0)" in "".join(server.stdout)
    finally:
        server.stop()


def test_drain_serves_live_sequences_and_refuses_new_work_with_503(tmp_path):
    """The drain contract: readiness 503 at once; the listener stays open while a
    sequence lives here; its steps are served; a START and a stateless request get 503
    with Retry-After and "draining"; a step of a sequence not live here gets the 400 it
    gets at any time (its replica is this one: a retry elsewhere cannot help); once the
    sequence ends the process exits 0, well before the drain's bound."""
    write_model(tmp_path, "gru", GRU, _gru_config(candidates=4))
    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp_classifier")
    server = ServerProcess("--model-repository", str(tmp_path), "--drain-timeout", "60")
    try:
        server.start()
        path = "/v2/models/gru/infer"
        assert server.request("POST", path, _step_body("live", start=True))[0] == 200
        server.terminate()
        server.wait_stderr("SIGTERM: draining", 10)
        assert server.request("GET", "/v2/health/ready")[0] == 503
        status, _, payload = server.request("POST", path, _step_body("unknown"))
        assert status == 400 and "START flag" in json.loads(payload)["error"], payload
        for body, where in ((_step_body("new", start=True), path),
                            (_step_body("live", start=True), path),
                            (_mlp_body(), "/v2/models/mlp_classifier/infer")):
            status, headers, payload = server.request("POST", where, body)
            assert status == 503 and "draining" in json.loads(payload)["error"], payload
            assert headers["retry-after"] == "1"
        for _ in range(3):  # new connections too: the listener is open
            assert server.request("POST", path, _step_body("live"))[0] == 200
        assert server.proc.poll() is None
        assert server.request("POST", path, _step_body("live", end=True))[0] == 200
        assert server.wait(timeout=30) == 0
        assert "stopped (exit 0)" in "".join(server.stdout)
    finally:
        server.stop()


def test_queue_bound_holds_while_the_instance_waits_out_a_delay(tmp_path):
    """As Triton's max_queue_size: requests waiting out a queue delay on an idle
    instance count against the bound; the next one is refused with 503."""
    config = json.loads((SAMPLES / "mlp_classifier" / "config.json").read_text())
    config.update(max_queue=2, dynamic_batching={
        "max_queue_delay_microseconds": 5_000_000, "preferred_batch_size": [8]})
    write_model(tmp_path, "mlp", MLP, config)
    server = ServerProcess("--model-repository", str(tmp_path))
    try:
        server.start()
        waiting = [_in_background(server, "/v2/models/mlp/infer", _mlp_body())
                   for _ in range(2)]
        _wait_for("two requests queued", lambda: server.metrics().get(
            ("tinyhal_inference_queued", (("model", "mlp"), ("version", "1")))) == 2)
        status, headers, body = server.request("POST", "/v2/models/mlp/infer", _mlp_body())
        assert status == 503, body
        assert "Exceeds maximum queue size" in json.loads(body)["error"]
        assert int(headers["retry-after"]) >= 1
        for thread, answer in waiting:
            thread.join(timeout=30)
            assert answer and answer[0][0] == 200, answer
    finally:
        server.stop()


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_long_sequence_ids_keep_memory_bounded(tmp_path):
    """Sequences with 2 MiB string ids are refused (400, never kept); sequences
    with the longest id taken that idle out are remembered by a digest: a late step
    is still told why, and the server's memory does not grow with the ids."""
    write_model(tmp_path, "gru", GRU, _gru_config(candidates=256, idle_us=100_000))
    server = ServerProcess("--model-repository", str(tmp_path))
    try:
        server.start()
        path = "/v2/models/gru/infer"
        assert server.request("POST", path, _step_body("warm", start=True, end=True))[0] \
            == 200
        before = _rss_kb(server.proc.pid)
        huge = "x" * (2 << 20)
        for i in range(60):
            status, _, body = server.request("POST", path,
                                             _step_body(f"{i}{huge}", start=True))
            assert status == 400 and b"at most 1024" in body, body[:200]
        longest = ["%04d" % i + "y" * 1020 for i in range(200)]
        for sid in longest:
            assert server.request("POST", path, _step_body(sid, start=True))[0] == 200
        _wait_for("the sequences to idle out",
                  lambda: _sequence_stats(server, "gru")["live_sequences"] == 0)
        status, _, body = server.request("POST", path, _step_body(longest[7]))
        assert status == 400 and b"expired" in body, body
        grown = _rss_kb(server.proc.pid) - before
        # kept ids would be 120 MiB and more; what remains is the allocator's slack
        # after 60 bodies of 2 MiB (below the size that has freed memory trimmed)
        assert grown < 48 << 10, f"RSS grew by {grown} KiB"
    finally:
        server.stop()


def test_sigterm_waits_for_a_detached_sequence_step_then_exits_0(tmp_path, spin_step_vmfb):
    """A step that got its 504 still runs on the model's modules: the drain waits for it
    (the modules are not closed under it), serves the sequence's last step after it,
    and the process exits 0."""
    write_model(tmp_path, "spin", spin_step_vmfb, SPIN_STEP_CONFIG)
    server = ServerProcess("--model-repository", str(tmp_path), "--drain-timeout", "60")
    try:
        server.start()
        status, _, body = server.request("POST", "/v2/models/spin/infer", _spin_step(
            1, 1_000_000, start=True, timeout=100_000))
        assert status == 504 and b"still updates its state" in body, body
        _wait_running(server, "spin")  # detached, still running
        server.terminate()
        server.wait_stderr("SIGTERM: draining", 10)
        # the sequence is live here: its last step is served, after the detached one
        status, _, body = server.request("POST", "/v2/models/spin/infer",
                                         _spin_step(1, 1, end=True), timeout=60)
        assert status == 200, body
        assert server.wait(timeout=60) == 0, "".join(server.stderr[-20:])
        err = "".join(server.stderr)
        assert "Traceback" not in err and "abandon" not in err, err[-3000:]
        assert "stopped (exit 0)" in "".join(server.stdout)
    finally:
        server.stop()


def test_drain_bound_answers_a_running_sequence_step_504_and_logs_it(tmp_path,
                                                                    spin_step_vmfb):
    """The bound runs out while a step runs: its request is answered 504 and logged,
    the step's invocation is logged as abandoned, and the exit code is 3."""
    from tinyhal.server.main import EXIT_DRAIN_TIMEOUT

    write_model(tmp_path, "spin", spin_step_vmfb, SPIN_STEP_CONFIG)
    server = ServerProcess("--model-repository", str(tmp_path), "--drain-timeout", "0.5")
    try:
        server.start()
        thread, answer = _in_background(server, "/v2/models/spin/infer",
                                        _spin_step(1, 8_000_000, start=True))
        _wait_running(server, "spin")
        server.terminate()
        thread.join(timeout=60)
        assert answer and answer[0][0] == 504, answer
        assert "drain" in json.loads(answer[0][2])["error"]
        assert server.wait(timeout=60) == EXIT_DRAIN_TIMEOUT
        err = server.wait_stderr("abandoned: model spin version 1 request spin-1", 10)
        assert "answered 504: model spin version 1 request spin-1" in err, err[-3000:]
    finally:
        server.stop()


def test_unload_waits_for_a_running_step_without_holding_the_repository(tmp_path,
                                                                        spin_step_vmfb):
    """While an unload waits for a sequence step that runs, other models load and the
    index answers (the repository lock is not held across the wait); the step is
    answered 200, then the unload returns."""
    write_model(tmp_path, "spin", spin_step_vmfb, SPIN_STEP_CONFIG)
    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp_classifier")
    server = ServerProcess("--model-repository", str(tmp_path),
                           "--model-control-mode", "explicit", "--load-model", "spin")
    try:
        server.start()
        step, step_answer = _in_background(server, "/v2/models/spin/infer",
                                           _spin_step(1, 4_000_000, start=True, end=True))
        _wait_running(server, "spin")
        unload, unload_answer = _in_background(server, "/v2/repository/models/spin/unload",
                                               {})
        status, _, body = server.request("POST", "/v2/repository/models/mlp_classifier/load")
        assert status == 200, body
        assert unload.is_alive() and step.is_alive(), "the step ended before the load"
        status, _, body = server.request("POST", "/v2/repository/index")
        assert status == 200 and {"name": "spin", "version": "1", "state": "UNLOADING"} \
            in json.loads(body), body
        step.join(timeout=60)
        unload.join(timeout=60)
        assert step_answer[0][0] == 200, step_answer
        assert unload_answer[0][0] == 200, unload_answer
        status, _, body = server.request("POST", "/v2/models/spin/infer",
                                         _spin_step(2, 1, start=True))
        assert status == 503, body
    finally:
        server.stop()
