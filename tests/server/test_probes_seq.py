"""Probes of stateful models as Triton's own sequence tests drive them and as operators
change them while they serve (server/sequences.py, repository.py, config.py): an END that
leaves the queue while its sequence's step runs, `max_sequence_idle_microseconds` 0
(Triton's default), a START on a live id, steps of one sequence pipelined on one
connection, more sequences than slots, a reload and an unload under sequence load, and a
broken new version beside a serving one. Every answer is a 200 or a 4xx/503 naming why,
at once; nothing hangs, nothing is a 500. One server child (explicit model control) for
the file."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from serve_helpers import SAMPLES, ServerProcess, receive_until, write_model
from test_drain import SPIN_STEP_CONFIG, SPIN_STEP_MLIR, _spin_step
from test_sequences import CORRID32_MLIR, DIRECT_CONFIG, DIRECT_MLIR

from support.iree_tools import HOST_FLAGS, compile_mlir

pytestmark = pytest.mark.timeout(120)

GRU = SAMPLES / "gru_step" / "1" / "model.vmfb"
_GRU = json.loads((SAMPLES / "gru_step" / "config.json").read_text())


def _acc_config(slots: int, max_queue: int = 64) -> dict:
    """Y = S + X with an INT32 CORRID control, `slots` sequences at once."""
    return {
        "function": "f", "device": "sync", "max_batch_size": 4, "max_queue": max_queue,
        "sequence_batching": {
            "max_sequence_idle_microseconds": 60_000_000,
            "oldest": {"max_candidate_sequences": slots},
            "control_input": [{"name": "CORRID", "control": [
                {"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_INT32"}]}],
            "state": [{"input_name": "S_IN", "output_name": "S_OUT",
                       "data_type": "TYPE_FP32", "dims": [1],
                       "initial_state": [{"zero_data": True, "name": "z"}]}],
        },
    }


def _gru(**sequence_changes) -> dict:
    config = json.loads(json.dumps(_GRU))
    config["sequence_batching"].update(sequence_changes)
    return config


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    acc = compile_mlir(CORRID32_MLIR, HOST_FLAGS)
    write_model(root, "acc", acc, _acc_config(4))
    write_model(root, "acc_one", acc, _acc_config(1, max_queue=16))
    write_model(root, "acc_v", acc, _acc_config(4))
    write_model(root, "acc_two", acc, {**_acc_config(8), "instance_group": [{"count": 2}]})
    from_file = _acc_config(4)
    from_file["sequence_batching"]["state"][0]["initial_state"] = [
        {"data_type": "TYPE_FP32", "dims": [1], "data_file": "hundred", "name": "h"}]
    write_model(root, "acc_file", acc, from_file)
    (root / "acc_file" / "1" / "initial_state").mkdir()
    (root / "acc_file" / "1" / "initial_state" / "hundred").write_bytes(
        struct.pack("<f", 100.0))
    one_slot = {**SPIN_STEP_CONFIG, "max_batch_size": 1, "max_queue": 8}
    write_model(root, "spin_one", compile_mlir(SPIN_STEP_MLIR, HOST_FLAGS), one_slot)
    write_model(root, "gru_idle0", GRU, _gru(max_sequence_idle_microseconds=0))
    write_model(root, "gru_reload", GRU, _GRU)
    write_model(root, "gru_unload", GRU, _GRU)
    padded = root / "padded"  # Triton's test_parse_ignore_zero_prefixed_version
    for version in ("1", "003"):
        shutil.copytree(SAMPLES / "mlp_classifier" / "1", padded / version)
    (padded / "config.json").write_text((SAMPLES / "mlp_classifier" / "config.json")
                                        .read_text())
    direct = compile_mlir(DIRECT_MLIR, HOST_FLAGS)
    for name, delay_us, utilization in (("direct_now", 2_000_000, 0.0),
                                        ("direct_half", 2_000_000, 0.5)):
        config = json.loads(json.dumps(DIRECT_CONFIG))
        config["sequence_batching"]["direct"] = {
            "max_queue_delay_microseconds": delay_us,
            "minimum_slot_utilization": utilization}
        write_model(root, name, direct, config)
    two = json.loads(json.dumps(DIRECT_CONFIG))  # 2 instances x 2 rows: 4 slots
    write_model(root, "direct_two", direct,
                {**two, "max_batch_size": 2, "instance_group": [{"count": 2}]})
    shutil.copytree(SAMPLES / "mlp_classifier", root / "mlp")
    warmup = json.loads((SAMPLES / "mlp_classifier" / "config.json").read_text())
    warmup["model_warmup"] = [{"name": "w", "batch_size": 1}]
    write_model(root, "mlp_warmup", SAMPLES / "mlp_classifier" / "1" / "model.vmfb", warmup)
    return root


_LOADED = ("acc", "acc_file", "acc_one", "acc_two", "direct_two", "acc_v", "spin_one", "gru_reload", "gru_unload", "mlp",
           "direct_now", "direct_half")


@pytest.fixture(scope="module")
def server(repository):
    loads = [arg for name in _LOADED for arg in ("--load-model", name)]
    proc = ServerProcess("--model-repository", str(repository), "--model-control-mode",
                         "explicit", *loads)
    try:
        yield proc.start()
    finally:
        proc.stop()


def _acc_body(sid, x: float, start: bool = False, end: bool = False, **parameters) -> dict:
    return {"parameters": {"sequence_id": sid, "sequence_start": start,
                           "sequence_end": end, **parameters},
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [x]}]}


def _gru_body(sid, start: bool = False, end: bool = False) -> dict:
    return {"parameters": {"sequence_id": sid, "sequence_start": start,
                           "sequence_end": end},
            "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 8],
                        "data": [0.1] * 8}]}


def _infer(server: ServerProcess, model: str, body: dict, path: str = "") -> tuple[int, str]:
    status, _, payload = server.request("POST", path or f"/v2/models/{model}/infer", body,
                                        timeout=60)
    return status, payload.decode(errors="replace")


def _y(payload: str) -> float:
    outputs = {o["name"]: o["data"] for o in json.loads(payload)["outputs"]}
    return outputs["Y"][0]


def _sequence_stats(server: ServerProcess, model: str) -> dict:
    status, _, body = server.request("GET", f"/v2/models/{model}/stats")
    assert status == 200, body
    return json.loads(body)["model_stats"][0]["sequence_stats"]


def _wait_for(what: str, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


def _in_background(fn) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_an_end_that_left_the_queue_frees_the_slot_once_its_running_step_ends(server):
    """One slot. Sequence 1's step runs (about a second); its END waits behind it and
    leaves the queue at its 100 ms timeout (504, nothing ran). As Triton, whose slot is
    released once the END is taken, the sequence is over: its slot is free as soon as
    the running step ends, so sequence 2's START is served then, not after sequence 1
    idles out (60 s)."""
    running, first = _in_background(lambda: _infer(
        server, "spin_one", _spin_step(1, 1_000_000, start=True)))
    _wait_for("the step running", lambda: _sequence_stats(server, "spin_one")
              ["slots_in_use"] == 1 and _sequence_stats(server, "spin_one")
              ["queued_steps"] == 0)
    status, payload = _infer(server, "spin_one", _spin_step(1, 1, end=True, timeout=100_000))
    assert status == 504, payload
    running.join(timeout=60)
    assert first and first[0][0] == 200, first
    status, payload = _infer(server, "spin_one", _spin_step(1, 1))
    assert status == 400 and "must specify the START flag" in payload, payload
    _wait_for("the slot freed", lambda: _sequence_stats(server, "spin_one")
              ["slots_in_use"] == 0, timeout=5)
    status, payload = _infer(server, "spin_one", _spin_step(2, 1, start=True, end=True))
    assert status == 200, payload


def test_an_end_that_left_the_queue_of_an_idle_sequence_ends_it(server):
    """The same END timing out while nothing of its sequence runs (it waits for the
    busy slot... here: behind a long step of its own sequence is the case above; a
    sequence waiting for a slot has its END leave the backlog) ends the sequence."""
    running, first = _in_background(lambda: _infer(
        server, "spin_one", _spin_step(10, 1_000_000, start=True, end=True)))
    _wait_for("the step running", lambda: _sequence_stats(server, "spin_one")
              ["slots_in_use"] == 1 and _sequence_stats(server, "spin_one")
              ["queued_steps"] == 0)
    status, payload = _infer(server, "spin_one",
                             _spin_step(11, 1, start=True, end=True, timeout=100_000))
    assert status == 504, payload
    running.join(timeout=60)
    assert first and first[0][0] == 200, first
    assert _sequence_stats(server, "spin_one")["waiting_for_slot"] == 0
    status, payload = _infer(server, "spin_one", _spin_step(11, 1))
    assert status == 400 and "must specify the START flag" in payload, payload


def test_idle_time_0_is_tritons_default_of_a_second(server):
    """Triton reads `max_sequence_idle_microseconds` 0 (proto3's unset) as its default,
    one second; a Triton configuration that spells it out loads as there."""
    status, _, body = server.request("POST", "/v2/repository/models/gru_idle0/load", b"")
    assert status == 200, body
    status, _, body = server.request("GET", "/v2/models/gru_idle0/config")
    assert status == 200, body
    sequences = json.loads(body)["sequence_batching"]
    assert sequences["max_sequence_idle_microseconds"] == 1_000_000, sequences


def test_a_start_on_a_live_id_begins_again_from_the_initial_state(server):
    assert _y(_infer(server, "acc", _acc_body(7, 1.0, start=True))[1]) == 1.0
    assert _y(_infer(server, "acc", _acc_body(7, 2.0))[1]) == 3.0
    assert _y(_infer(server, "acc", _acc_body(7, 5.0, start=True))[1]) == 5.0
    assert _y(_infer(server, "acc", _acc_body(7, 1.0, end=True))[1]) == 6.0
    status, payload = _infer(server, "acc", _acc_body(7, 1.0))
    assert status == 400 and "must specify the START flag" in payload, payload


def test_a_start_on_a_live_id_begins_again_from_the_initial_state_file(server):
    """The same with the initial state read from `initial_state/<data_file>` (100): a
    START on a live id, and one on an id that ended, each begin from 100 again, also
    while other sequences of the batch carry on."""
    assert _y(_infer(server, "acc_file", _acc_body(8, 1.0, start=True))[1]) == 101.0
    assert _y(_infer(server, "acc_file", _acc_body(9, 2.0, start=True))[1]) == 102.0
    assert _y(_infer(server, "acc_file", _acc_body(8, 1.0))[1]) == 102.0
    assert _y(_infer(server, "acc_file", _acc_body(8, 5.0, start=True))[1]) == 105.0
    assert _y(_infer(server, "acc_file", _acc_body(9, 2.0, end=True))[1]) == 104.0
    assert _y(_infer(server, "acc_file", _acc_body(9, 3.0, start=True, end=True))[1]) \
        == 103.0
    assert _y(_infer(server, "acc_file", _acc_body(8, 1.0, end=True))[1]) == 106.0


def _http_post(path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


@pytest.mark.parametrize("model", ["acc", "acc_two"])
def test_steps_of_one_sequence_pipelined_on_one_connection_run_in_order(server, model):
    """20 steps sent at once on one connection (HTTP/1.1 pipelining, as an asynchronous
    client may), with one instance and with two: answered in order, each the running sum
    of the steps before it (a sequence never has two steps running)."""
    count = 20
    steps = [_acc_body(30, float(k + 1), start=k == 0, end=k == count - 1)
             for k in range(count)]
    data = b"".join(_http_post(f"/v2/models/{model}/infer", step) for step in steps)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(data)
        received = b""
        answers = []
        while len(answers) < count:
            received = receive_until(sock, b"\r\n\r\n", received)
            head, rest = received.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(rest) < length:
                chunk = sock.recv(65536)
                assert chunk
                rest += chunk
            answers.append(_y(rest[:length].decode()))
            received = rest[length:]
    assert answers == [float(sum(range(1, k + 2))) for k in range(count)], answers


@pytest.mark.parametrize("model", ["acc_one", "acc_two", "direct_two"])
def test_more_sequences_than_slots_are_served_in_turn_each_as_alone(server, model):
    """Six clients each running a four-step sequence at once on one slot (`acc_one`: the
    STARTs wait for it), on two instances (`acc_two`) and on `direct` slots of two
    instances (4 slots): every sequence is served whole and each answer is its own
    running sum (no state crosses sequences or instances)."""
    results: dict[int, list] = {}
    name = "Y"

    def run(sid: int) -> None:
        got = []
        for k in range(4):
            body = _acc_body(sid, float(sid * 10 + k), start=k == 0, end=k == 3)
            status, payload = _infer(server, model, body)
            got.append({o["name"]: o["data"] for o in json.loads(payload)["outputs"]}
                       [name][0] if status == 200 else (status, payload))
        results[sid] = got

    threads = [threading.Thread(target=run, args=(sid,)) for sid in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    for sid in range(1, 7):
        xs = [sid * 10 + k for k in range(4)]
        assert results.get(sid) == [float(sum(xs[:k + 1])) for k in range(4)], results
    assert _sequence_stats(server, model)["live_sequences"] == 0


def _storm(server: ServerProcess, model: str, clients: int, stop: threading.Event,
           answers: list) -> list[threading.Thread]:
    """`clients` threads running 5-step gru sequences on `model` until `stop`; every
    (status, payload) lands in `answers`."""
    def run(client: int) -> None:
        sid = client * 1_000_000
        while not stop.is_set():
            sid += 1
            for k in range(5):
                try:
                    status, payload = _infer(server, model, _gru_body(
                        sid, start=k == 0, end=k == 4))
                except OSError as exc:  # no answer at all: what the probe rules out
                    status, payload = None, repr(exc)
                answers.append((status, payload))
                if status != 200:
                    break

    threads = [threading.Thread(target=run, args=(c + 1,), daemon=True)
               for c in range(clients)]
    for thread in threads:
        thread.start()
    return threads


def _check_answers(answers: list, allowed: dict[int, tuple[str, ...]]) -> None:
    assert answers, "no answer at all"
    for status, payload in answers:
        assert status in allowed, (status, payload)
        if status != 200:
            assert any(word in payload for word in allowed[status]), (status, payload)


def test_a_reload_under_sequence_load_answers_every_step(server):
    """Four clients run sequences while the model is loaded again three times. The new
    version knows none of the old one's sequences (as Triton), so a step may get 400
    "must specify the START flag" or 503 (its version stopped admitting); nothing hangs,
    nothing is a 500, the model is ready throughout, and sequences started on the new
    version are served whole."""
    stop = threading.Event()
    answers: list = []
    threads = _storm(server, "gru_reload", 4, stop, answers)
    readiness: list[int] = []  # the model stays available: the old version serves

    def ready() -> None:  # until the new one loaded (Triton's availability on reload)
        while not stop.is_set():
            readiness.append(server.request("GET", "/v2/models/gru_reload/ready")[0])
            time.sleep(0.01)

    threads.append(threading.Thread(target=ready, daemon=True))
    threads[-1].start()
    try:
        for _ in range(3):
            time.sleep(0.3)
            status, _, body = server.request("POST", "/v2/repository/models/gru_reload/load",
                                             b"", timeout=60)
            assert status == 200, body
        time.sleep(0.3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert readiness and set(readiness) == {200}, readiness
    _check_answers(answers, {200: (), 400: ("must specify the START flag",),
                             503: ("unloading", "not ready", "Retry")})
    assert [s for s, _ in answers].count(200) > 20
    for k in range(3):
        status, payload = _infer(server, "gru_reload", _gru_body(99, k == 0, k == 2))
        assert status == 200, payload
    assert "Traceback" not in "".join(server.stderr)


def test_an_unload_under_sequence_and_stateless_load_answers_everyone(server):
    """Sequence clients on one model and stateless clients on another while the first
    unloads: the unload returns, each step is 200, 400 (its sequence was ended) or 503
    naming why; the stateless model serves on throughout."""
    stop = threading.Event()
    answers: list = []
    threads = _storm(server, "gru_unload", 4, stop, answers)
    mlp: list = []
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                        "data": [0.5] * 16}]}

    def stateless() -> None:
        while not stop.is_set():
            mlp.append(_infer(server, "mlp", body))

    other = threading.Thread(target=stateless, daemon=True)
    other.start()
    try:
        time.sleep(0.5)
        status, _, payload = server.request("POST",
                                            "/v2/repository/models/gru_unload/unload", b"",
                                            timeout=60)
        assert status == 200, payload
        time.sleep(0.3)
    finally:
        stop.set()
        for thread in [*threads, other]:
            thread.join(timeout=60)
    _check_answers(answers, {200: (), 400: ("must specify the START flag", "was ended"),
                             503: ("unloading", "not ready", "unloaded")})
    assert {status for status, _ in mlp} == {200}
    index = json.loads(server.request("POST", "/v2/repository/index", b"")[2])
    entry = next(e for e in index if e["name"] == "gru_unload")
    assert entry.get("state") in (None, "UNAVAILABLE"), entry


def test_a_broken_new_version_leaves_the_old_one_serving_its_live_sequence(server,
                                                                          repository):
    """Version 2 appears with a file that is no module while a sequence lives on
    version 1 (policy: latest 1). The load answers 400 naming version 2; version 1 keeps
    serving and the live sequence continues from its state, as Triton keeps the
    serving version when its replacement fails."""
    assert _y(_infer(server, "acc_v", _acc_body(5, 2.0, start=True))[1]) == 2.0
    broken = repository / "acc_v" / "2"
    broken.mkdir()
    (broken / "model.vmfb").write_bytes(b"not a module at all" * 100)
    try:
        status, _, body = server.request("POST", "/v2/repository/models/acc_v/load", b"")
        assert status == 400 and b"version 2" in body, body
        assert _y(_infer(server, "acc_v", _acc_body(5, 3.0))[1]) == 5.0
        index = json.loads(server.request("POST", "/v2/repository/index", b"")[2])
        states = {e.get("version"): e.get("state") for e in index if e["name"] == "acc_v"}
        assert states.get("1") == "READY", index
    finally:
        shutil.rmtree(broken)
    assert _y(_infer(server, "acc_v", _acc_body(5, 4.0, end=True))[1]) == 9.0


_MLP = json.loads((SAMPLES / "mlp_classifier" / "config.json").read_text())
_TRITON_CONFIGS = [  # (what changes in the model's config, status, part of the answer)
    ({"model_warmup": [{"name": "w", "batch_size": 1}]}, 400,
     "'model_warmup': a Triton setting not offered here: no warm-up requests"),
    ({"optimization": {"input_pinned_memory": {"enable": True}}}, 400,
     "'optimization': a Triton setting not offered here"),
    ({"response_cache": {"enable": True}}, 400, "no response cache"),
    ({"model_transaction_policy": {"decoupled": True}}, 400, "no decoupled models"),
    ({"ensemble_scheduling": {"step": []}}, 400, "no ensembles"),
    ({"instance_group": [{"kind": "KIND_GPU", "count": 1}]}, 400,
     "KIND_GPU is not offered here: this server has no GPUs"),
    ({"instance_group": [{"count": 1, "gpus": [0]}]}, 400,
     "'instance_group[0].gpus': a Triton setting not offered here: this server has no GPUs"),
    ({"instance_group": [{"name": "mlp_0", "kind": "KIND_MODEL", "count": 2}]}, 200, ""),
    ({"dynamic_batching": {"priority_levels": 2}}, 400, "requests are not prioritised"),
    ({"dynamic_batching": {"default_queue_policy": {"max_queue_size": 4}}}, 400,
     "bounded by 'max_queue'"),
    ({"input": [{"name": "features", "data_type": "TYPE_FP32", "dims": [16]}]}, 400,
     "Triton's form of a tensor"),
    ({"name": "other"}, 400, "config 'name' 'other' is not the model's name 'mlp'"),
    ({"platform": "onnxruntime_onnx"}, 400, "'platform': must be 'tinyhal_vmfb'"),
    ({"backend": "python"}, 400, "'backend': must be 'tinyhal'"),
    ({"parameters": {"EXECUTION_ENV_PATH": {"string_value": "x"}}}, 400,
     "'parameters.EXECUTION_ENV_PATH': a Triton backend parameter"),
    ({"version_policy": {"specific": {"versions": []}}}, 400,
     "'version_policy.specific.versions'"),
    ({"version_policy": {"latest": {"num_versions": 1}, "all": {}}}, 400,
     "give one of 'latest', 'all' and 'specific'"),
    ({"version_policy": {"specific": {"versions": [5]}}}, 400,
     "at least one version must be available under the version policy of model 'mlp'"),
    ({"version_policy": {"latest": {"num_versions": 3}}}, 200, ""),
    ({"version_policy": {"all": None}}, 200, ""),
]


@pytest.mark.parametrize("change,status,message", _TRITON_CONFIGS,
                         ids=[next(iter(c[0])) + str(i) for i, c in
                              enumerate(_TRITON_CONFIGS)])
def test_a_triton_configuration_is_taken_or_refused_naming_why(server, change, status,
                                                               message):
    """Triton's configuration keys, loaded as a repository `load`'s `config`: what this
    server does not offer is a 400 naming the key and why (not a bare "unknown key"),
    and the model that served keeps serving."""
    config = json.dumps({**_MLP, **change})
    got, _, body = server.request("POST", "/v2/repository/models/mlp/load",
                                  {"parameters": {"config": config}})
    assert got == status and message in body.decode(), body
    assert server.request("GET", "/v2/models/mlp/ready")[0] == 200


def test_a_triton_key_in_config_json_is_unavailable_with_its_reason_in_index_and_log(
        server):
    status, _, body = server.request("POST", "/v2/repository/models/mlp_warmup/load", b"")
    assert status == 400 and b"no warm-up requests" in body, body
    index = json.loads(server.request("POST", "/v2/repository/index", b"")[2])
    entry = next(e for e in index if e["name"] == "mlp_warmup")
    assert entry["state"] == "UNAVAILABLE" and "no warm-up requests" in entry["reason"], entry
    server.wait_stderr("mlp_warmup.*no warm-up requests", timeout=10)


@pytest.mark.parametrize("datatype", ["TYPE_UINT32", "TYPE_INT64", "TYPE_UINT64"])
def test_a_corrid_control_of_another_type_than_the_program_input(server, repository,
                                                                  datatype):
    """The CORRID control's `data_type` against the program input it fills (INT32): the
    same width, unsigned, is the program's values bit for bit; a wider type does not fit
    the program. Either way the load or each step answers at once, never a 500."""
    config = _acc_config(4)
    config["sequence_batching"]["control_input"][0]["control"][0]["data_type"] = datatype
    status, _, body = server.request("POST", "/v2/repository/models/acc_v/load",
                                     {"parameters": {"config": json.dumps(config)}})
    text = body.decode()
    if status == 400:
        assert "CORRID" in text, text
        return
    assert status == 200, text
    top = {"TYPE_UINT32": (1 << 32) - 1, "TYPE_INT64": (1 << 63) - 1,
           "TYPE_UINT64": (1 << 64) - 1}[datatype]
    got, payload = _infer(server, "acc_v", _acc_body(top, 1.0, start=True, end=True))
    assert got in (200, 400), payload


_SEQUENCE_EXPIRED = "timeout of the corresponding sequence has been expired"


def _hold_the_slot(server: ServerProcess, sid: int) -> tuple[threading.Thread, list]:
    """Sequence `sid` runs a long step (about a second) in spin_one's only slot."""
    running = _in_background(lambda: _infer(
        server, "spin_one", _spin_step(sid, 1_000_000, start=True, end=True)))
    _wait_for("the step running", lambda: _sequence_stats(server, "spin_one")
              ["slots_in_use"] == 1 and _sequence_stats(server, "spin_one")
              ["queued_steps"] == 0)
    return running


def test_a_sequence_waiting_for_a_slot_expires_whole_at_its_first_deadline(server):
    """Triton's L0_sequence_batcher test_request_timeout over HTTP: sequence 21 waits for
    the only slot (its START, a step and its END queued, each with a 300 ms timeout)
    while a long step runs. At the first deadline the whole sequence expires, as Triton's
    backlog: each of its requests is answered with Triton's words, and its next step
    without START is refused as a sequence not started (test_send_request_after_timeout)."""
    running, first = _hold_the_slot(server, 20)
    start, started = _in_background(lambda: _infer(
        server, "spin_one", _spin_step(21, 1, start=True, timeout=300_000)))
    _wait_for("a sequence waiting for a slot", lambda: _sequence_stats(
        server, "spin_one")["waiting_for_slot"] == 1)
    rest = [_in_background(lambda end=end: _infer(
        server, "spin_one", _spin_step(21, 1, end=end, timeout=300_000 + 500_000 * end)))
        for end in (False, True)]
    for thread, _ in [(start, None), *rest]:
        thread.join(timeout=30)
    for status, payload in [*started, *(out[0] for _, out in rest)]:
        assert status == 504 and _SEQUENCE_EXPIRED in payload, payload
    running.join(timeout=60)
    assert first and first[0][0] == 200, first
    status, payload = _infer(server, "spin_one", _spin_step(21, 1))
    assert status == 400 and "must specify the START flag on the first request" in payload
    assert _SEQUENCE_EXPIRED in payload, payload


def test_a_step_with_a_short_timeout_expires_its_waiting_sequence_at_once(server):
    """The backlog's deadline is its earliest request's (Triton's `expiration_timestamp_`
    is the minimum): a step with a 200 ms timeout behind a START allowed 30 s expires
    the whole waiting sequence then, its START too, not 30 s later."""
    running, first = _hold_the_slot(server, 22)
    start, started = _in_background(lambda: _infer(
        server, "spin_one", _spin_step(23, 1, start=True, timeout=30_000_000)))
    _wait_for("a sequence waiting for a slot", lambda: _sequence_stats(
        server, "spin_one")["waiting_for_slot"] == 1)
    status, payload = _infer(server, "spin_one", _spin_step(23, 1, timeout=200_000))
    assert status == 504 and _SEQUENCE_EXPIRED in payload, payload
    start.join(timeout=5)
    assert started and started[0][0] == 504 and _SEQUENCE_EXPIRED in started[0][1], started
    running.join(timeout=60)
    assert first and first[0][0] == 200, first


def _queue_wait(server: ServerProcess, model: str) -> tuple[int, float]:
    """(steps, their mean seconds waiting in the queue), as the server measured them."""
    wait = _sequence_stats(server, model)["queue_wait"]
    return wait["count"], wait["ns"] / 1e9 / max(wait["count"], 1)


def _direct_body(sid, start: bool = False, end: bool = False) -> dict:
    return {"parameters": {"sequence_id": sid, "sequence_start": start,
                           "sequence_end": end},
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}


def test_direct_without_a_slot_utilization_runs_at_once(server):
    """Triton's direct batcher waits out `max_queue_delay_microseconds` only for a
    `minimum_slot_utilization` above 0 (its default, 0, runs a ready slot at once): a
    lone step of `direct_now` (delay 2 s, utilization 0) waits nothing, by the server's
    own measure of its queue time."""
    for k in range(3):
        status, payload = _infer(server, "direct_now", _direct_body(1, k == 0, k == 2))
        assert status == 200, payload
    count, mean = _queue_wait(server, "direct_now")
    assert count == 3 and mean < 1.0, (count, mean)


def test_direct_runs_once_its_slot_utilization_is_reached(server):
    """`direct_half`: 4 slots, utilization 0.5, delay 2 s. Two sequences stepping
    together reach it (2 of 4 slots ready) and run at once, in one execution of their
    two rows; a lone step waits out the delay (by the server's measure)."""
    for sid in (1, 2):  # each START alone: waits out the delay
        assert _infer(server, "direct_half", _direct_body(sid, start=True))[0] == 200
    count, lone = _queue_wait(server, "direct_half")
    assert count == 2 and lone > 1.0, (count, lone)
    barrier = threading.Barrier(2)

    def step(sid: int):
        barrier.wait(timeout=30)
        return _infer(server, "direct_half", _direct_body(sid, end=True))

    pair = [_in_background(lambda sid=sid: step(sid)) for sid in (1, 2)]
    rows = []
    for thread, out in pair:
        thread.join(timeout=30)
        assert out and out[0][0] == 200, out
        rows.append({o["name"]: o["data"] for o in json.loads(out[0][1])["outputs"]}["N"])
    assert rows == [[2.0], [2.0]], rows
    count, mean = _queue_wait(server, "direct_half")
    assert count == 4 and (mean * 4 - lone * 2) / 2 < 1.0, (count, mean)


@pytest.mark.parametrize("model", ["direct_half", "acc", "spin_one"])
def test_a_sequence_models_config_loads_back_as_it_is(server, model):
    """Triton's get config, edit, load with `config`: what the config endpoint shows of
    a sequence model (`direct` and `oldest`) loads back unchanged."""
    status, _, shown = server.request("GET", f"/v2/models/{model}/config")
    assert status == 200, shown
    status, _, body = server.request("POST", f"/v2/repository/models/{model}/load",
                                     {"parameters": {"config": shown.decode()}})
    assert status == 200, body
    assert server.request("GET", f"/v2/models/{model}/config")[2] == shown


def test_a_version_directory_with_leading_zeros_is_ignored_as_triton_ignores_it(server):
    """Triton's test_parse_ignore_zero_prefixed_version: `003/` beside `1/` is not
    version 3 (Triton ignores it, logging why), so version 1 is the latest and serves."""
    status, _, body = server.request("POST", "/v2/repository/models/padded/load", b"")
    assert status == 200, body
    server.wait_stderr("model padded: ignore version directory '003' which contains "
                       "leading zeros in its directory name", timeout=10)
    index = _index_states(server)
    assert index.get(("padded", "1")) == "READY" and ("padded", "3") not in index, index
    assert server.request("GET", "/v2/models/padded/versions/3/ready")[0] != 200


def _index_states(server: ServerProcess) -> dict:
    status, _, body = server.request("POST", "/v2/repository/index", b"")
    assert status == 200, body
    return {(e["name"], e.get("version")): e.get("state") for e in json.loads(body)}


def test_a_specific_version_not_present_is_logged_and_none_is_a_failure(server):
    """Triton's VersionsToLoad: a `specific` version without its directory is logged and
    the others load; a policy that selects none fails the load naming why."""
    config = json.dumps({**_MLP, "version_policy": {"specific": {"versions": [1, 9]}}})
    status, _, body = server.request("POST", "/v2/repository/models/padded/load",
                                     {"parameters": {"config": config}})
    assert status == 200, body
    server.wait_stderr("version 9 is specified for model 'padded', but the version "
                       "directory is not present", timeout=10)
    config = json.dumps({**_MLP, "version_policy": {"specific": {"versions": [3]}}})
    status, _, body = server.request("POST", "/v2/repository/models/padded/load",
                                     {"parameters": {"config": config}})
    assert status == 400 and b"at least one version must be available" in body, body
    assert _index_states(server).get(("padded", "1")) == "READY"  # it keeps serving


def test_state_and_control_tensors_are_not_a_clients_in_tritons_words(server):
    """Triton's L0_implicit_state test_request_output_not_allowed: asking for a state
    output (or sending a state or control input) is a 400 "unexpected inference
    output/input" naming it: the server fills and keeps those."""
    body = {**_gru_body(40, start=True, end=True), "outputs": [{"name": "STATE_OUT"}]}
    status, payload = _infer(server, "gru_reload", body)
    assert status == 400, payload
    assert "unexpected inference output 'STATE_OUT' for model 'gru_reload'" in payload
    body = _acc_body(41, 1.0, start=True, end=True)
    for name in ("S_IN", "CORRID"):
        extra = {"name": name, "datatype": "FP32", "shape": [1, 1], "data": [0.0]}
        status, payload = _infer(server, "acc", {**body, "inputs": [*body["inputs"], extra]})
        assert status == 400, payload
        assert f"unexpected inference input '{name}' for model 'acc'" in payload


_TRITON_SEQUENCE_ERRORS = [  # Triton's L0_sequence_batcher reads how each message starts
    ({"sequence_id": 50, "sequence_start": True}, 2,
     "inference request to model 'acc' must specify batch-size 1 due to requirements of "
     "sequence batcher"),
    ({"sequence_start": True}, 1,
     "inference request to model 'acc' must specify a non-zero or non-empty correlation "
     "ID"),
    ({"sequence_id": 3}, 1,
     "inference request for sequence 3 to model 'acc' must specify the START flag on the "
     "first request of the sequence"),
]


@pytest.mark.parametrize("parameters,rows,start", _TRITON_SEQUENCE_ERRORS,
                         ids=["batch_size", "no_correlation_id", "no_sequence_start"])
def test_sequence_errors_begin_with_tritons_words(server, parameters, rows, start):
    body = {"parameters": parameters, "inputs": [
        {"name": "X", "datatype": "FP32", "shape": [rows, 1], "data": [1.0] * rows}]}
    status, payload = _infer(server, "acc", body)
    assert status == 400 and json.loads(payload)["error"].startswith(start), payload


def test_an_unknown_model_or_version_is_named_in_tritons_words(server):
    """Triton's L0_lifecycle reads "Request for unknown model: 'm' is not found" (and
    "... version N is not found"); the status here stays 404."""
    status, payload = _infer(server, "nope", _acc_body(1, 1.0, start=True))
    assert status == 404, payload
    assert "Request for unknown model: 'nope' is not found" in payload
    status, payload = _infer(server, "acc", _acc_body(1, 1.0, start=True),
                             "/v2/models/acc/versions/9/infer")
    assert status == 404, payload
    assert "Request for unknown model: 'acc' version 9 is not found" in payload


def test_load_failures_are_named_in_tritons_words(server, repository):
    status, _, body = server.request("POST", "/v2/repository/models/nowhere/load", b"")
    assert status == 400 and b"failed to load 'nowhere', failed to poll from model " \
        b"repository" in body, body
    status, _, body = server.request("POST", "/v2/repository/models/mlp_warmup/load", b"")
    assert status == 400 and b"load failed for model 'mlp_warmup': version 1 is at " \
        b"UNAVAILABLE state: " in body, body
