"""Regression tests for what bench/serve_chaos.py found, each against a server child
with bounded waits.

- An abandoned sequence (started, then never stepped again until it idles out) kept its
  state in a block of the device's transient ring until it expired: the ring's tail
  could not pass it, so everything allocated after it stayed behind it, and a ring that
  wrapped round to it would have had to wait for the sequence to expire. Its state now
  moves into a buffer of its own within a pass of the idle check."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from serve_helpers import SAMPLES, ServerProcess

pytestmark = pytest.mark.timeout(120)


def _step(server: ServerProcess, sid: int, x: list[float], start: bool, end: bool) -> list:
    status, _, body = server.request("POST", "/v2/models/gru_step/infer", {
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 8], "data": x}],
        "parameters": {"sequence_id": sid, "sequence_start": start, "sequence_end": end}})
    assert status == 200, body
    return json.loads(body)["outputs"]


def _transient_live(server: ServerProcess) -> float:
    return sum(v for (name, labels), v in server.metrics().items()
               if name == "tinyhal_device_heap_live_bytes" and ("heap", "transient") in labels)


def test_an_idle_sequence_gives_the_transient_ring_back(tmp_path):
    shutil.copytree(SAMPLES / "gru_step", tmp_path / "gru_step")
    config_path = tmp_path / "gru_step" / "config.json"
    config = json.loads(config_path.read_text())
    config["sequence_batching"]["max_sequence_idle_microseconds"] = 60_000_000
    config_path.write_text(json.dumps(config))
    server = ServerProcess("--model-repository", str(tmp_path)).start()
    xs = [[0.25 * i - 1.0 for i in range(8)], [0.5 - 0.125 * i for i in range(8)]]
    try:
        want = [_step(server, 1, xs[0], True, False), _step(server, 1, xs[1], False, True)]
        assert _step(server, 2, xs[0], True, False) == want[0]
        # sequence 2 is idle: its state, a step's output, leaves the ring within a pass
        # of the idle check (at most a second here), long before it would expire
        deadline = time.monotonic() + 15
        while _transient_live(server) > 0:
            assert time.monotonic() < deadline, "the idle sequence still holds ring memory"
            time.sleep(0.1)
        live = server.metrics()[("tinyhal_sequences_live", (("model", "gru_step"), ("version", "1")))]
        assert live == 1
        assert _step(server, 2, xs[1], False, True) == want[1]  # its state moved intact
    finally:
        server.stop()
