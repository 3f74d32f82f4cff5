"""Large JSON answers do not stall the server's event loop.

Encoding a million FP32 values to JSON (about 10 MB) is one long call that holds the
interpreter lock; the server writes such an answer a slice at a time, on a thread other
than the loop's (see `tinyhal.server.protocol.encodes_in_slices`). Checked here: the
sliced bytes are exactly what one call writes, and a server child answering several
10 MB JSON answers at once keeps its own lag monitor's longest stall under 50 ms.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import ml_dtypes
import numpy as np
import orjson
import pytest
from serve_helpers import ServerProcess, sample_server

from tinyhal.server import protocol
from tinyhal.server.protocol import (
    DATATYPES,
    build_infer_response,
    encodes_in_slices,
    parse_infer_request,
)

SLICE = protocol.JSON_SLICE_ELEMENTS
_INPUT = b'"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}]'
# every output JSON; one output binary; everything binary but the large one asked as JSON
REQUESTS = [
    b"{%b}" % _INPUT,
    b'{"id":"a\\"b",%b,"outputs":[{"name":"small"},{"name":"big"},'
    b'{"name":"bin","parameters":{"binary_data":true}}]}' % _INPUT,
    b'{%b,"parameters":{"binary_data_output":true},"outputs":[{"name":"big",'
    b'"parameters":{"binary_data":false}},{"name":"bin"}]}' % _INPUT,
]


def _big_arrays(size: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(size)
    special = np.resize(np.array([np.nan, np.inf, -np.inf, -0.0, 1e-40, 65504.0]), size)
    return [("FP32", rng.standard_normal(size).astype(np.float32)),
            ("FP64", rng.standard_normal(size) * 1e300),
            ("FP16", special.astype(np.float16)),
            ("BF16", rng.standard_normal(size).astype(ml_dtypes.bfloat16)),
            ("INT64", rng.integers(-(1 << 62), 1 << 62, size)),
            ("UINT8", rng.integers(0, 255, size, dtype=np.uint8)),
            ("BOOL", rng.integers(0, 2, size).astype(bool)),
            ("FP32", special.astype(np.float32).reshape(2, -1) if size % 2 == 0
             else special.astype(np.float32))]


@pytest.mark.parametrize("size", [SLICE, SLICE + 1, 3 * SLICE, 3 * SLICE + 7])
def test_sliced_answer_is_the_same_bytes(monkeypatch, size):
    cases = []
    for datatype, big in _big_arrays(size):
        for body in REQUESTS:
            request = parse_infer_request(body)
            results = [("big", datatype, big), ("small", "FP32", np.ones(3, np.float32)),
                       ("bin", "FP32", np.arange(SLICE + 5, dtype=np.float32))]
            cases.append((request, results, build_infer_response("m", "1", request, results)))
    monkeypatch.setattr(protocol, "JSON_SLICE_ELEMENTS", 1 << 62)  # in one piece
    for request, results, sliced in cases:
        assert sliced == build_infer_response("m", "1", request, results)


def test_which_answers_are_sliced():
    big = np.zeros(SLICE + 1, np.float32)
    small = np.zeros(SLICE, np.float32)
    all_json, one_binary, big_json = (parse_infer_request(body) for body in REQUESTS)
    all_binary = parse_infer_request(b'{%b,"parameters":{"binary_data_output":true}}'
                                     % _INPUT)

    def results(big_one: np.ndarray, bin_one: np.ndarray) -> list:
        return [("big", "FP32", big_one), ("small", "FP32", small), ("bin", "FP32", bin_one)]

    assert not encodes_in_slices(all_json, results(small, small))
    assert encodes_in_slices(all_json, results(small, big))
    assert not encodes_in_slices(one_binary, results(small, big))  # "bin" is binary
    assert encodes_in_slices(big_json, results(big, big))
    assert not encodes_in_slices(big_json, results(small, big))
    assert not encodes_in_slices(all_binary, results(big, big))


class _TimedOrjson:
    """orjson, with the longest CPU time (this thread's: a thread the machine keeps
    waiting is not charged) of one `dumps` call."""

    OPT_SERIALIZE_NUMPY = orjson.OPT_SERIALIZE_NUMPY

    def __init__(self) -> None:
        self.calls = 0
        self.longest = 0.0

    def dumps(self, *args, **kwargs) -> bytes:
        start = time.thread_time()
        try:
            return orjson.dumps(*args, **kwargs)
        finally:
            self.calls += 1
            self.longest = max(self.longest, time.thread_time() - start)


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_no_step_holds_the_interpreter_long(monkeypatch, datatype):
    values = np.random.default_rng(0).standard_normal(1 << 20).astype(DATATYPES[datatype])
    request = parse_infer_request(b"{%b}" % _INPUT)
    timed = _TimedOrjson()
    monkeypatch.setattr(protocol, "orjson", timed)
    body, _ = build_infer_response("m", "1", request, [("y", datatype, values)])
    assert len(body) > 10 << 20
    assert timed.calls > values.size // SLICE
    assert timed.longest < 0.01, f"one step took {timed.longest * 1e3:.1f} ms of CPU"


N = 1 << 20  # a million FP32 values: about 10 MB of JSON, 30-110 ms in one call
CLIENTS = 4  # more than saxpy's 2 instances: some answers are the loop's to make


@pytest.fixture(scope="module")
def saxpy_server(tmp_path_factory):
    with sample_server(tmp_path_factory.mktemp("repo"), ("saxpy",)) as server:
        yield server


def _saxpy(server: ServerProcess, x: np.ndarray, y: np.ndarray) -> bytes:
    """z = 1.5 x + y asked with binary inputs and a JSON answer: the answer's body."""
    header = json.dumps({"inputs": [
        {"name": "alpha", "datatype": "FP32", "shape": [1],
         "parameters": {"binary_data_size": 4}},
        {"name": "x", "datatype": "FP32", "shape": [N], "parameters": {"binary_data_size": 4 * N}},
        {"name": "y", "datatype": "FP32", "shape": [N], "parameters": {"binary_data_size": 4 * N}},
    ], "outputs": [{"name": "z", "parameters": {"binary_data": False}}]}).encode()
    body = header + np.float32(1.5).tobytes() + x.tobytes() + y.tobytes()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", "/v2/models/saxpy/infer", body,
                     {"Inference-Header-Content-Length": str(len(header))})
        answer = conn.getresponse()
        payload = answer.read()
    finally:
        conn.close()
    assert answer.status == 200, payload[:300]
    return payload


def _stalls_over_50ms(server: ServerProcess) -> float:
    """How many times the server's lag monitor found its loop kept out over 50 ms."""
    metrics = server.metrics()
    return (metrics[("tinyhal_event_loop_lag_seconds_count", ())]
            - metrics[("tinyhal_event_loop_lag_seconds_bucket", (("le", "0.05"),))])


@pytest.mark.timeout(180)
def test_large_json_answers_keep_the_loop_responsive(saxpy_server):
    """Rounds of 4 clients asking 10 MB JSON answers at once, with no stall over 50 ms.
    The machine is shared: a process elsewhere that keeps a server thread holding the
    interpreter lock from running stalls the loop too (the monitor takes off only the
    loop thread's own waits for a CPU), so a pass with such a stall is run again, up to
    three passes. (Encoded in one call, such answers stalled the loop 47-135 ms; the
    CPU time of each step is bounded by `test_no_step_holds_the_interpreter_long`.)"""
    x = np.arange(N, dtype=np.float32) * np.float32(0.37)
    y = np.linspace(-1, 1, N, dtype=np.float32)
    expected = np.float32(1.5) * x + y
    answers: list = []
    errors: list = []

    def client() -> None:
        try:
            answers.append(_saxpy(saxpy_server, x, y))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    stalls = []
    for _ in range(3):
        before = _stalls_over_50ms(saxpy_server)
        for _ in range(2):
            threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=90)
        stalls.append(_stalls_over_50ms(saxpy_server) - before)
        if not stalls[-1]:
            break
    assert not errors and len(answers) == 2 * CLIENTS * len(stalls), errors
    # the answers are checked once the server is measured: decoding one takes this
    # process seconds of CPU the server would have to share
    assert all(payload == answers[0] for payload in answers)
    data = json.loads(answers[0])["outputs"][0]["data"]
    np.testing.assert_allclose(np.array(data, np.float32), expected, rtol=1e-6)
    assert stalls[-1] == 0, f"stalls over 50 ms in each pass: {stalls}"
