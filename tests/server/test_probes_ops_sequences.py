"""Probes of a sequence model as peers' clients drive it: every form a `sequence_id` can
take in JSON, START and END in one request, END of a sequence never started, a flood of
STARTs beyond the slots, and a sequence that outlives an unload and a reload of its
model. Every answer is a 200 or a 4xx/503 naming why, at once; the backlog of STARTs
waiting for a slot is bounded by `max_queue` and each waiting START is served once a
slot frees. One server child for the file."""

from __future__ import annotations

import json
import shutil
import threading

import pytest
from serve_helpers import SAMPLES, ServerProcess

pytestmark = pytest.mark.timeout(120)

_STEP = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 8],
                     "data": [0.1] * 8}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(SAMPLES / "gru_step", root / "gru_step")
    config = json.loads((SAMPLES / "gru_step" / "config.json").read_text())
    config["sequence_batching"]["oldest"]["max_candidate_sequences"] = 2
    config["sequence_batching"]["max_sequence_idle_microseconds"] = 1_000_000
    config["max_queue"] = 4
    shutil.copytree(SAMPLES / "gru_step", root / "two_slots")
    (root / "two_slots" / "config.json").write_text(json.dumps(config))
    proc = ServerProcess("--model-repository", str(root), "--model-control-mode", "explicit", "--load-model", "*")
    try:
        yield proc.start()
    finally:
        proc.stop()


def _step(server: ServerProcess, model: str = "gru_step", **parameters):
    status, _, payload = server.request("POST", f"/v2/models/{model}/infer",
                                        {**_STEP, "parameters": parameters}, timeout=60)
    return status, payload.decode(errors="replace")


_IDS = [
    (0, 400, "must specify a non-zero or non-empty correlation ID"),
    ("", 400, "must specify a non-zero or non-empty correlation ID"),
    (1 << 64, 400, "parameter 'sequence_id' must be a uint64 or a string"),
    (-1, 400, "parameter 'sequence_id' must be a uint64 or a string, not -1"),
    (1.5, 400, "parameter 'sequence_id' must be a uint64 or a string, not 1.5"),
    (True, 400, "parameter 'sequence_id' must be a uint64 or a string, not true"),
    (None, 400, "parameter 'sequence_id' must be a uint64 or a string, not null"),
    ([1], 400, "parameter 'sequence_id' must be a uint64 or a string, not [1]"),
    ("x" * 5000, 400, "is a string of 5000 characters; at most 1024 are taken"),
    ((1 << 64) - 1, 200, ""),
    ("é\u0000", 200, ""),
]


@pytest.mark.parametrize("sid,status,message", _IDS, ids=[repr(i[0])[:20] for i in _IDS])
def test_every_form_of_a_sequence_id(server, sid, status, message):
    got, payload = _step(server, sequence_id=sid, sequence_start=True, sequence_end=True)
    assert got == status and message in payload, payload


def test_start_and_end_in_one_request_and_an_end_never_started(server):
    assert _step(server, sequence_id=7, sequence_start=True, sequence_end=True)[0] == 200
    status, payload = _step(server, sequence_id=7)
    assert status == 400 and "must specify the START flag" in payload, payload
    status, payload = _step(server, sequence_id=8, sequence_end=True)
    assert status == 400 and "must specify the START flag" in payload, payload
    for flag in ("sequence_start", "sequence_end"):
        status, payload = _step(server, sequence_id=9, **{flag: "true"})
        assert status == 400 and f"parameter '{flag}' must be true or false" in payload


def test_a_flood_of_starts_beyond_the_slots_is_bounded_and_served(server):
    """Two slots, `max_queue` 4: two STARTs get a slot, up to four wait for one (each
    served once an idle sequence expires, after a second), the rest are 503
    "overloaded" at once."""
    results: list[tuple[int, str]] = []

    def start(i: int) -> None:
        results.append(_step(server, "two_slots", sequence_id=100 + i, sequence_start=True))

    threads = [threading.Thread(target=start, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    statuses = [status for status, _ in results]
    # slots and queue hold six at most (fewer when the first STARTs still count as
    # queued as the flood arrives); every START is answered
    assert len(statuses) == 12 and set(statuses) <= {200, 503}, results
    assert 2 <= statuses.count(200) <= 6, results
    assert all("Exceeds maximum queue size" in p for s, p in results if s == 503)


def test_a_sequence_across_an_unload_and_a_reload(server):
    assert _step(server, sequence_id=20, sequence_start=True)[0] == 200
    assert server.request("POST", "/v2/repository/models/gru_step/unload", b"")[0] == 200
    status, payload = _step(server, sequence_id=20)
    assert status == 503 and "is not ready" in payload, payload
    assert server.request("POST", "/v2/repository/models/gru_step/load", b"")[0] == 200
    status, payload = _step(server, sequence_id=20)  # its state went with the unload
    assert status == 400 and "must specify the START flag" in payload, payload
    assert _step(server, sequence_id=20, sequence_start=True, sequence_end=True)[0] == 200
