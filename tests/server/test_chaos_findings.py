"""Regression tests for what bench/serve_chaos.py found, each against a server child
with bounded waits.

- An abandoned sequence (started, then never stepped again until it idles out) kept its
  state in a block of the device's transient ring until it expired: the ring's tail
  could not pass it, so everything allocated after it stayed behind it, and a ring that
  wrapped round to it would have had to wait for the sequence to expire. Its state now
  moves into a buffer of its own within a pass of the idle check.
- Large requests (4 MiB binary inputs, a 10 MB JSON answer) left their memory behind:
  the module kept each call's input buffers for the next call (up to 4 per argument,
  whatever their size); glibc, once a large block was freed, raised its mmap threshold
  and put every later large block in a heap or a thread's arena, which kept it; the
  transient ring's pages stayed resident at the high water of the burst. Now only small
  inputs are kept, large blocks are mapped on their own (unmapped when freed), and the
  rings give back their pages above the live blocks after a large release."""

from __future__ import annotations

import http.client
import json
import shutil
import threading
import time

import numpy as np
import pytest
from serve_helpers import SAMPLES, ServerProcess, saxpy_binary_request

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


def _large_saxpy(port: int, n: int) -> bytes:
    """One saxpy request with `n`-value binary inputs and a JSON answer, read whole."""
    x = np.linspace(0.001, 1.0, n, dtype=np.float32)
    body, header_length = saxpy_binary_request(x.tobytes(), n)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v2/models/saxpy/infer", body,
                     {"Inference-Header-Content-Length": str(header_length)})
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read()
    finally:
        conn.close()


def _settled_rss(server: ServerProcess, timeout: float = 15.0) -> int:
    """RSS once two readings half a second apart agree within 1 MB (the give-back runs on
    a thread of the server's own), or the last reading."""
    last = server.rss()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = server.rss()
        if abs(now - last) < (1 << 20):
            return now
        last = now
    return last


def test_large_requests_give_their_memory_back(tmp_path):
    """Rounds of 4 concurrent saxpy requests with 4 MiB inputs and 10 MB JSON answers:
    the server's settled RSS after them stays within 8 MB of where it was after one
    such request (before: 20-35 MB more after three rounds, growing with the rounds)."""
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    server = ServerProcess("--model-repository", str(tmp_path)).start()
    n = 1 << 20
    try:
        first = _large_saxpy(server.port, n)  # warms up what one such request needs
        baseline = _settled_rss(server)
        answers: list[bytes] = []

        def one() -> None:
            answers.append(_large_saxpy(server.port, n))

        for _ in range(3):
            threads = [threading.Thread(target=one) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
        assert answers == [first] * 12
        growth = _settled_rss(server) - baseline
        assert growth < 8 << 20, f"RSS stayed {growth / (1 << 20):.1f} MB up"
    finally:
        server.stop()
