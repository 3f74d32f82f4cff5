"""Probes of what a careless operator puts in a model repository and does to a running
server, beyond test_probes_repository.py: configurations whose every field is within
its own bound but whose whole is not (instance groups adding up to thousands of
threads, sequence state rows adding up to more memory than the machine has, `direct`
sequence slots adding up to millions), a
`config.json` an editor wrote with a byte order mark, a `version_policy` put in a
version's config.json, a state named twice (it loaded, and the idle expiry's failure
on the half never filled ended the process), two directories naming one version, and a
load while the server drains. Each is answered at once (200, or a 400/503 naming what is wrong) and leaves
the server serving. Server children on 127.0.0.1, every wait bounded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from serve_helpers import SAMPLES, ServerProcess

pytestmark = pytest.mark.timeout(120)

_MLP = json.loads((SAMPLES / "mlp_classifier" / "config.json").read_text())
_GRU = json.loads((SAMPLES / "gru_step" / "config.json").read_text())
_BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                "data": [0.5] * 16}]}).encode()
_STEP = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 8],
                     "data": [0.1] * 8}]}


def _copy(root: Path, sample: str, name: str, config: dict | bytes | None = None,
          versions: tuple[str, ...] = ("1",)) -> Path:
    model = root / name
    for version in versions:
        shutil.copytree(SAMPLES / sample / "1", model / version)
    if isinstance(config, bytes):
        (model / "config.json").write_bytes(config)
    elif config is not None:
        (model / "config.json").write_text(json.dumps(config))
    return model


def _with(base: dict, **changes) -> dict:
    return {**json.loads(json.dumps(base)), **changes}


def _sequence_rows(candidates: int) -> dict:
    sequences = json.loads(json.dumps(_GRU["sequence_batching"]))
    sequences["oldest"]["max_candidate_sequences"] = candidates
    return _with(_GRU, max_batch_size=64, sequence_batching=sequences)


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for sample in ("mlp_classifier", "saxpy", "gru_step"):
        shutil.copytree(SAMPLES / sample, root / sample)
    bad_control = json.loads(json.dumps(_GRU))  # no such program input
    bad_control["sequence_batching"]["control_input"] = [{"name": "NOPE", "control": [
        {"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}]
    _copy(root, "gru_step", "bad_control", _with(bad_control, instance_group=[{"count": 4}]))
    # 64 groups of 256: each count within its bound, 16,384 instances together
    _copy(root, "mlp_classifier", "many_instances",
          _with(_MLP, instance_group=[{"count": 256}] * 64))
    # 65,536 slots of a 64 KiB state row: 4 GiB of device memory at load
    wide = _sequence_rows(65536)
    wide["sequence_batching"]["state"][0]["dims"] = [16384]
    wide["sequence_batching"]["state"][0]["initial_state"][0]["dims"] = [16384]
    _copy(root, "gru_step", "state_rows", wide)
    direct = json.loads(json.dumps(_GRU))  # 16.7 M slots: a 600 MB list of free ones
    direct["sequence_batching"] = {"direct": {}}
    _copy(root, "gru_step", "direct_slots",
          _with(direct, max_batch_size=65536, instance_group=[{"count": 256}]))
    twice = json.loads(json.dumps(_GRU))  # one state given twice: one half unfilled
    twice["sequence_batching"]["state"] *= 2
    _copy(root, "gru_step", "state_twice", twice)
    _copy(root, "mlp_classifier", "bom",
          b"\xef\xbb\xbf" + (SAMPLES / "mlp_classifier" / "config.json").read_bytes())
    model = _copy(root, "mlp_classifier", "version_policy_below", _MLP)
    (model / "1" / "config.json").write_text('{"version_policy": {"all": {}}}')
    _copy(root, "mlp_classifier", "same_version", _MLP, versions=("01", "1"))
    _copy(root, "mlp_classifier", "beyond_int64", _MLP, versions=(str(1 << 64),))
    return root


@pytest.fixture(scope="module")
def server(repository):
    proc = ServerProcess("--model-repository", str(repository), "--model-control-mode",
                         "explicit", "--load-model", "mlp_classifier")
    try:
        yield proc.start()
    finally:
        proc.stop()


def _threads(server: ServerProcess) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/task"))


# (model, status of its load, part of its answer)
_LOADS = [
    ("many_instances", 400, "'instance_group' counts add up to 16384 instances; at most 256"),
    ("state_rows", 400, "'sequence_batching.state' holds 65536 rows of 65536 bytes"),
    ("direct_slots", 400, "holds max_batch_size x instances = 16777216 sequence slots"),
    ("state_twice", 400, "'sequence_batching': the program input 'STATE_IN' is named "
                         "twice"),
    ("bom", 200, ""),
    ("version_policy_below", 400, "'version_policy': chooses the versions of the model, "
                                  "so it belongs in version_policy_below/config.json"),
    ("same_version", 200, ""),
    ("beyond_int64", 400, "no version directory"),
]


@pytest.mark.parametrize("model,status,message", _LOADS, ids=[c[0] for c in _LOADS])
def test_a_configuration_beyond_its_whole_bound_is_refused_at_once(server, model, status,
                                                                   message):
    threads, peak = _threads(server), server.status_bytes("VmHWM")
    got, _, payload = server.request("POST", f"/v2/repository/models/{model}/load", b"",
                                     timeout=60)
    assert got == status and message.encode() in payload, payload
    # refused before any instance thread started or any state row was allocated
    assert server.status_bytes("VmHWM") - peak < 64 << 20
    assert _threads(server) <= threads + 8
    if status == 200:
        got, _, payload = server.request("POST", f"/v2/models/{model}/infer", _BODY)
        assert got == 200, payload
    got, _, payload = server.request("POST", "/v2/models/mlp_classifier/infer", _BODY)
    assert got == 200, payload


def test_the_directory_spelled_as_the_version_serves_and_the_other_is_logged(server):
    assert server.request("POST", "/v2/repository/models/same_version/load", b"")[0] == 200
    log = server.wait_stderr(r"model same_version: ignore version directory '01' which "
                             r"contains leading zeros")
    assert "same_version version 1" in log
    log = server.wait_stderr(r"skipping 18446744073709551616/: version directories are "
                             r"named by integers of at most 18 digits")
    status, _, payload = server.request("GET", "/v2/repository/index")
    states = {(e["name"], e.get("version")): e.get("state") for e in json.loads(payload)}
    assert states[("same_version", "1")] == "READY", states


def test_a_load_while_the_server_drains_is_503_and_loads_nothing(tmp_path):
    """A live sequence keeps the listener open while the server drains; a load then
    would load a model only for the drain to close it: 503 "draining", as new work."""
    shutil.copytree(SAMPLES / "gru_step", tmp_path / "gru_step")
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "explicit", "--load-model", "gru_step")
    try:
        server.start()
        step = {**_STEP, "parameters": {"sequence_id": 5, "sequence_start": True}}
        assert server.request("POST", "/v2/models/gru_step/infer", step)[0] == 200
        server.proc.send_signal(signal.SIGTERM)
        server.wait_stderr("SIGTERM: draining")
        status, headers, payload = server.request(
            "POST", "/v2/repository/models/saxpy/load", b"")
        assert status == 503 and b"draining" in payload, payload
        assert headers.get("retry-after") == "1"
        assert "loading model saxpy" not in "".join(server.stderr)
        step = {**_STEP, "parameters": {"sequence_id": 5, "sequence_end": True}}
        assert server.request("POST", "/v2/models/gru_step/infer", step)[0] == 200
        assert server.wait(30) == 0
    finally:
        server.stop()


def test_a_poll_meets_a_model_being_copied_in_and_serves_it_once_whole(tmp_path):
    """An operator copies a model into a polled repository file by file: the poll
    sees its directory with no version, then a model file half written, then a config
    that is not yet whole JSON. Each state is refused naming why (no 5xx, the server
    keeps serving); once the copy is done the model serves."""
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "poll", "--repository-poll-secs", "0.1", "--no-exit-on-error")
    try:
        server.start()
        model = tmp_path / "mlp"
        (model / "1").mkdir(parents=True)
        whole = (SAMPLES / "mlp_classifier" / "1" / "model.vmfb").read_bytes()
        (model / "1" / "model.vmfb").write_bytes(whole[:len(whole) // 2])
        server.wait_stderr(r"model mlp version 1 failed to load: mlp/1/model\.vmfb: ")
        (model / "config.json").write_text(json.dumps(_MLP)[:40])
        server.wait_stderr(r"mlp/config.json: not valid JSON")
        (model / "config.json").write_text(json.dumps(_MLP))
        (model / "1" / "model.vmfb").write_bytes(whole)
        deadline = time.monotonic() + 60
        while server.request("GET", "/v2/models/mlp/ready")[0] != 200:
            assert time.monotonic() < deadline, "".join(server.stderr)[-3000:]
            time.sleep(0.1)
        assert server.request("POST", "/v2/models/mlp/infer", _BODY)[0] == 200
        assert "Traceback" not in "".join(server.stderr)
    finally:
        server.stop()


_FAILING_EXPIRY = """
import tinyhal.server.sequences as sequences

def _compact_states(self, idle_since):
    raise RuntimeError("a bug in the idle expiry")

sequences.SequenceBatcher._compact_states = _compact_states
"""


def test_a_failing_sequence_batcher_task_fails_its_model_not_the_server(tmp_path):
    """A bug in a sequence batcher's background task (the idle expiry here, made to
    fail by a `sitecustomize` of the server child) raised in a trio system task, which
    ends the whole run (TrioInternalError, every model gone). It is contained to its
    model version: logged, its steps answered 503 naming why, the other models serve."""
    shutil.copytree(SAMPLES / "gru_step", tmp_path / "repo" / "gru_step")
    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "repo" / "mlp_classifier")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_FAILING_EXPIRY)
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH"))
                           if p)
    server = ServerProcess("--model-repository", str(tmp_path / "repo"),
                           env={"PYTHONPATH": path})
    try:
        server.start()
        step = {**_STEP, "parameters": {"sequence_id": 1, "sequence_start": True}}
        assert server.request("POST", "/v2/models/gru_step/infer", step)[0] == 200
        server.wait_stderr(r"model 'gru_step': the sequence batcher failed")
        step = {**_STEP, "parameters": {"sequence_id": 2, "sequence_start": True}}
        status, _, payload = server.request("POST", "/v2/models/gru_step/infer", step)
        assert status == 503 and b"the sequence batcher failed (RuntimeError)" in payload
        assert server.request("POST", "/v2/models/mlp_classifier/infer", _BODY)[0] == 200
        assert server.proc.poll() is None
        server.terminate()
        assert server.wait(30) == 0
    finally:
        server.stop()


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_poll_of_many_models_reads_nothing_again(tmp_path):
    """Each poll read every model's configuration again, and listed the whole
    repository once per model: 1,000 models polled every second took 8.4 s of CPU in
    10 s doing nothing. A poll now compares a few stats per model and reads only the
    models whose files changed. Measured as the server's own CPU time (not a wall
    clock) over some twenty polls of 200 models."""
    for i in range(200):
        (tmp_path / f"m{i:03d}" / "1").mkdir(parents=True)
        os.link(SAMPLES / "saxpy" / "1" / "model.vmfb", tmp_path / f"m{i:03d}" / "1" /
                "model.vmfb")
        shutil.copyfile(SAMPLES / "saxpy" / "config.json", tmp_path / f"m{i:03d}" /
                        "config.json")
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "poll", "--repository-poll-secs", "0.1")
    try:
        server.start()
        time.sleep(1.5)  # the first polls look at every model once
        before = _cpu_seconds(server.proc.pid)
        time.sleep(2)
        spent = _cpu_seconds(server.proc.pid) - before
        assert spent < 0.5, f"{spent:.2f} s of CPU for some twenty idle polls"
        # a change is still seen at the next poll
        (tmp_path / "m007" / "config.json").write_text(json.dumps(
            {"function": "saxpy", "max_queue": 3}))
        server.wait_stderr("loading model m007 version 1", timeout=30)
    finally:
        server.stop()


@pytest.mark.parametrize("model", ["saxpy", "gru_step", "mlp_classifier"])
def test_a_configuration_read_from_the_server_loads_back_as_it_is(server, model):
    """Triton's own pattern (its lifecycle tests, operators' scripts): get a model's
    configuration, change a setting, load the model with it as `config`. What the config
    endpoint shows was refused ('name': unknown key), and a sequence model's controls
    were shown without their values. Now it loads back; what it shows of the model
    (name, signature) must be the model's, or the load names the difference."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(server.url, network_timeout=60.0)
    try:
        client.load_model(model)
        config = client.get_model_config(model)
        client.load_model(model, config=json.dumps(config))
        assert client.get_model_config(model) == config
        client.load_model(model, config=json.dumps({**config, "max_queue": 7}))
        assert client.get_model_config(model)["max_queue"] == 7
        for change, message in (({"name": "other"}, "config 'name' 'other' is not the "
                                 "model's name"),
                                ({"input": config["input"][:0]}, "config 'input' [] is not "
                                 "the program's"),
                                ({"platform": "onnxruntime_onnx"}, "'platform': must be "
                                 "'tinyhal_vmfb'")):
            with pytest.raises(InferenceServerException) as info:
                client.load_model(model, config=json.dumps({**config, **change}))
            assert message in str(info.value), str(info.value)
        assert client.get_model_config(model)["max_queue"] == 7  # the last good load
    finally:
        client.close()


def test_a_failed_load_ends_the_instance_threads_it_started(server):
    """A sequence model whose control input the program lacks failed after its four
    instance threads started and its modules loaded, and left both behind: 30 loads
    left 121 threads. They end with the failed load."""
    threads = _threads(server)
    for _ in range(30):
        status, _, payload = server.request("POST", "/v2/repository/models/bad_control/load",
                                            b"")
        assert status == 400 and b"control input 'NOPE'" in payload, payload
    deadline = time.monotonic() + 30
    while _threads(server) > threads + 4:
        assert time.monotonic() < deadline, _threads(server) - threads
        time.sleep(0.1)


def test_a_signal_while_a_model_loads_lets_the_load_finish_and_exits_0(tmp_path):
    """SIGINT while an explicit load runs (256 instances: some tenths of a second), then
    SIGTERM and a storm of SIGHUP while a poll loads: the load finishes and is answered,
    the drain ends with exit 0, nothing is logged as a traceback."""
    wide = {"function": "saxpy", "instance_group": [{"count": 256}]}
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "explicit" / "saxpy")
    _copy(tmp_path / "explicit", "saxpy", "wide", wide)
    server = ServerProcess("--model-repository", str(tmp_path / "explicit"),
                           "--model-control-mode", "explicit", "--load-model", "saxpy")
    answers: list = []
    try:
        server.start()
        loader = threading.Thread(target=lambda: answers.append(server.request(
            "POST", "/v2/repository/models/wide/load", b"", timeout=60)))
        loader.start()
        server.wait_stderr("loading model wide version 1")
        server.proc.send_signal(signal.SIGINT)
        loader.join(timeout=60)
        assert answers and answers[0][0] == 200, answers
        assert server.wait(60) == 0
    finally:
        server.stop()
    (tmp_path / "polled").mkdir()
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "polled" / "saxpy")
    server = ServerProcess("--model-repository", str(tmp_path / "polled"),
                           "--model-control-mode", "poll", "--repository-poll-secs", "0.1")
    try:
        server.start()
        _copy(tmp_path / "polled", "saxpy", "wide", wide)
        server.wait_stderr("loading model wide version 1")
        for _ in range(20):
            server.proc.send_signal(signal.SIGHUP)
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        assert "Traceback" not in "".join(server.stderr)
    finally:
        server.stop()
