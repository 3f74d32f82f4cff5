"""Probes of signals at phases of a stateful model's life the drain tests do not reach
(server/main.py, sequences.py, repository.py): SIGTERM while an unload waits for a
running step, SIGHUP during a drain of a `poll` server whose sequences live on, a live
sequence idling out during the drain, and USR1/USR2 while a step runs. Each request is
answered (200, or 503/504 naming why), readiness is 503 from the signal on, and the
process exits 0 without waiting out the drain's bound. A server child per test (each
ends it)."""

from __future__ import annotations

import json
import signal
import time

import pytest
from serve_helpers import SAMPLES, ServerProcess, write_model
from test_drain import SPIN_STEP_CONFIG, SPIN_STEP_MLIR, _spin_step
from test_probes_seq import _in_background, _infer, _sequence_stats, _wait_for

from support.iree_tools import HOST_FLAGS, compile_mlir

pytestmark = pytest.mark.timeout(120)

GRU = SAMPLES / "gru_step" / "1" / "model.vmfb"


def _gru_config(idle_us: int) -> dict:
    config = json.loads((SAMPLES / "gru_step" / "config.json").read_text())
    config["sequence_batching"]["max_sequence_idle_microseconds"] = idle_us
    return config


def _gru_step(sid, start: bool = False, end: bool = False) -> dict:
    return {"parameters": {"sequence_id": sid, "sequence_start": start,
                           "sequence_end": end},
            "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 8],
                        "data": [0.1] * 8}]}


@pytest.fixture(scope="module")
def spin_vmfb():
    return compile_mlir(SPIN_STEP_MLIR, HOST_FLAGS)


def test_sigterm_while_an_unload_waits_for_a_running_step(tmp_path, spin_vmfb):
    """A step runs (about 2 s); an unload of its model waits for it; SIGTERM arrives.
    The step is answered 200, the unload 200, readiness is 503 at once, and the process
    exits 0 once both are done, far within the drain's bound (60 s)."""
    write_model(tmp_path, "spin", spin_vmfb, SPIN_STEP_CONFIG)
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "explicit", "--load-model", "spin", "--drain-timeout", "60")
    try:
        server.start()
        step, stepped = _in_background(lambda: _infer(
            server, "spin", _spin_step(1, 2_000_000, start=True, end=True)))
        _wait_for("the step running", lambda: _sequence_stats(server, "spin")
                  ["queued_steps"] == 0 and _sequence_stats(server, "spin")
                  ["live_sequences"] == 1)
        unload, unloaded = _in_background(lambda: server.request(
            "POST", "/v2/repository/models/spin/unload", b"", timeout=60))
        _wait_for("the model unloading", lambda: server.request(
            "GET", "/v2/models/spin/ready")[0] != 200)
        started = time.monotonic()
        server.terminate()
        server.wait_stderr("SIGTERM: draining", 10)
        assert server.request("GET", "/v2/health/ready")[0] == 503
        step.join(timeout=30)
        unload.join(timeout=30)
        assert stepped and stepped[0][0] == 200, stepped
        assert unloaded and unloaded[0][0] == 200, unloaded
        assert server.wait(timeout=30) == 0, "".join(server.stderr[-20:])
        assert time.monotonic() - started < 30
        assert "Traceback" not in "".join(server.stderr)
    finally:
        server.stop()


def test_sighup_during_the_drain_of_a_poll_server_with_a_live_sequence(tmp_path):
    """A `poll` server drains with a live sequence; SIGHUP (a poll out of turn) during
    the drain loads nothing and ends nothing: the sequence's steps are served until its
    END, then the process exits 0."""
    write_model(tmp_path, "gru", GRU, _gru_config(60_000_000))
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "poll", "--repository-poll-secs", "3600", "--drain-timeout", "60")
    try:
        server.start()
        assert _infer(server, "gru", _gru_step(1, start=True))[0] == 200
        server.terminate()
        server.wait_stderr("SIGTERM: draining", 10)
        write_model(tmp_path, "late", GRU, _gru_config(60_000_000))  # must not load now
        for _ in range(3):
            server.proc.send_signal(signal.SIGHUP)
            assert _infer(server, "gru", _gru_step(1))[0] == 200
        status, payload = _infer(server, "late", _gru_step(2, start=True))
        assert status in (404, 503), payload
        assert _infer(server, "gru", _gru_step(1, end=True))[0] == 200
        assert server.wait(timeout=30) == 0, "".join(server.stderr[-20:])
        assert "Traceback" not in "".join(server.stderr)
    finally:
        server.stop()


def test_a_live_sequence_idling_out_during_the_drain_ends_it(tmp_path):
    """The drain waits for live sequences to END or idle out: one whose client went
    quiet idles out after its `max_sequence_idle_microseconds` (1 s) and the process
    exits 0 then, not at the drain's bound (60 s)."""
    write_model(tmp_path, "gru", GRU, _gru_config(1_000_000))
    server = ServerProcess("--model-repository", str(tmp_path), "--drain-timeout", "60")
    try:
        server.start()
        assert _infer(server, "gru", _gru_step(1, start=True))[0] == 200
        started = time.monotonic()
        server.terminate()
        assert server.wait(timeout=30) == 0, "".join(server.stderr[-20:])
        assert time.monotonic() - started < 20
    finally:
        server.stop()


def test_usr1_usr2_and_hup_while_a_step_runs_change_nothing(tmp_path, spin_vmfb):
    write_model(tmp_path, "spin", spin_vmfb, SPIN_STEP_CONFIG)
    server = ServerProcess("--model-repository", str(tmp_path))
    try:
        server.start()
        assert _infer(server, "spin", _spin_step(1, 1, start=True))[0] == 200
        step, stepped = _in_background(lambda: _infer(server, "spin",
                                                      _spin_step(1, 1_000_000)))
        _wait_for("the step running", lambda: _sequence_stats(server, "spin")
                  ["queued_steps"] == 0 and server.metrics().get(
                      ("tinyhal_inference_in_flight", (("model", "spin"), ("version", "1"))))
                  == 1)
        for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            server.proc.send_signal(signum)
        step.join(timeout=30)
        assert stepped and stepped[0][0] == 200, stepped
        assert _infer(server, "spin", _spin_step(1, 1, end=True))[0] == 200
        assert server.proc.poll() is None
    finally:
        server.stop()
