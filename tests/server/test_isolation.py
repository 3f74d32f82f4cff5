"""One model cannot take tinyhal-serve down: malformed model directories in each model
control mode, malformed configurations loaded through the repository API, FIFO and
/dev/zero state files, names that are not UTF-8, catchable signals with a request in
flight, and a large model loading while health answers (measured by the server's own
event-loop lag monitor, not a client's clock). Every server is a child process; every
wait is bounded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from serve_helpers import SAMPLES, write_model

from support.iree_tools import HOST_FLAGS, compile_mlir
from support.large_models import large_function_mlir

pytestmark = pytest.mark.timeout(240)

SAXPY_BODY = {"inputs": [
    {"name": "alpha", "datatype": "FP32", "shape": [1], "data": [2.0]},
    {"name": "x", "datatype": "FP32", "shape": [3], "data": [0.0, 1.0, 2.0]},
    {"name": "y", "datatype": "FP32", "shape": [3], "data": [1.0, 1.0, 1.0]}]}
NOT_UTF8 = os.fsdecode(b"caf\xe9")  # a directory name that is not UTF-8
NOT_UTF8_SHOWN = "caf\\xe9"


def _gru(root: Path, name: str, change) -> Path:
    """A copy of the bundled sequence model with its config changed by `change`."""
    shutil.copytree(SAMPLES / "gru_step", root / name)
    path = root / name / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config) if isinstance(config, dict) else config)
    return root / name


def _initial_state_file(config: dict, name: str) -> None:
    del config["sequence_batching"]["state"][0]["initial_state"][0]["zero_data"]
    config["sequence_batching"]["state"][0]["initial_state"][0]["data_file"] = name


def _bad_models(root: Path) -> dict[str, str]:
    """Writes one malformed model of each kind under `root`; {name: what its reason says}."""
    sup2 = root / "version_sup2" / "²"
    sup2.mkdir(parents=True)
    shutil.copyfile(SAMPLES / "saxpy" / "1" / "model.vmfb", sup2 / "model.vmfb")
    shutil.copytree(SAMPLES / "saxpy", root / "deep")
    (root / "deep" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    _gru(root, "dims_int", lambda c: c["sequence_batching"]["state"][0]
         ["initial_state"][0].__setitem__("dims", 16))
    huge = 'HUGE'
    path = _gru(root, "huge_delay", lambda c: c["sequence_batching"]["oldest"]
                .__setitem__("max_queue_delay_microseconds", huge)) / "config.json"
    path.write_text(path.read_text().replace('"HUGE"', str(10**400)))
    fifo = _gru(root, "fifo_state", lambda c: _initial_state_file(c, "h0"))
    (fifo / "1" / "initial_state").mkdir()
    os.mkfifo(fifo / "1" / "initial_state" / "h0")
    zero = _gru(root, "zero_state", lambda c: _initial_state_file(c, "h0"))
    (zero / "1" / "initial_state").mkdir()
    (zero / "1" / "initial_state" / "h0").symlink_to("/dev/zero")
    shutil.copytree(SAMPLES / "saxpy", root / NOT_UTF8)  # a good model, its name not UTF-8
    return {
        "version_sup2": "no version directory",
        "deep": "recursion limit",
        "dims_int": "'sequence_batching.state[0].initial_state[0].dims'",
        "huge_delay": "'sequence_batching.oldest.max_queue_delay_microseconds': must be <=",
        "fifo_state": "not a regular file",
        "zero_state": "not a regular file",
    }


def _index(server) -> dict[str, dict]:
    status, _, body = server.request("POST", "/v2/repository/index", b"")
    assert status == 200, body
    return {entry["name"]: entry for entry in json.loads(body)}


def _assert_serving(server, bad: dict[str, str]) -> None:
    status, _, body = server.request("POST", "/v2/models/saxpy/infer", SAXPY_BODY)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [1.0, 3.0, 5.0]
    index = _index(server)
    for name, reason in bad.items():
        assert index[name].get("state") == "UNAVAILABLE", (name, index[name])
        assert reason in index[name]["reason"], (name, index[name])
        assert "\n" not in index[name]["reason"]
    assert index[NOT_UTF8_SHOWN]["state"] == "READY"
    for path in ("/metrics", "/v2/models/stats", "/v2/health/live"):
        status, _, body = server.request("GET", path)
        assert status == 200, (path, body[:300])
    assert f'model="{NOT_UTF8_SHOWN}"'.replace("\\", "\\\\") in server.request(
        "GET", "/metrics")[2].decode()
    assert server.proc.poll() is None


@pytest.mark.parametrize("mode", ["none", "explicit", "poll"])
def test_a_bad_directory_leaves_the_others_serving(tmp_path, start_server, mode):
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    if mode == "poll":
        server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                              "poll", "--repository-poll-secs", "3600")
        bad = _bad_models(tmp_path)  # dropped in while it serves ...
        server.proc.send_signal(signal.SIGHUP)  # ... and read at once: a poll out of turn
        deadline = time.monotonic() + 60
        while _index(server).get(NOT_UTF8_SHOWN, {}).get("state") != "READY" or any(
                "state" not in _index(server)[name] for name in bad):
            assert time.monotonic() < deadline, _index(server)
            time.sleep(0.1)
        server.proc.send_signal(signal.SIGHUP)  # a second poll meets the same failures
        server.wait_stderr("SIGHUP: reading the model repository again(.|\n)*"
                           "SIGHUP: reading")
    else:
        bad = _bad_models(tmp_path)
        loads = ("--load-model", "*") if mode == "explicit" else ()
        server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                              mode, *loads, "--no-exit-on-error")
        assert "unavailable: " in server.stdout[-1]
    _assert_serving(server, bad)
    if mode == "explicit":  # loading one of them again fails alone, with 400
        for name, reason in bad.items():
            status, _, body = server.request("POST", f"/v2/repository/models/{name}/load", b"")
            assert status == 400 and reason in json.loads(body)["error"], (name, body)
        _assert_serving(server, bad)


def test_a_bad_directory_at_start_exits_1_with_exit_on_error(tmp_path, start_server):
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    (tmp_path / "deep").mkdir()
    shutil.copytree(SAMPLES / "saxpy" / "1", tmp_path / "deep" / "1")
    (tmp_path / "deep" / "config.json").write_text("[" * 100_000)
    server = start_server("--model-repository", str(tmp_path), ready=False)
    assert server.wait(timeout=60) == 1
    assert "recursion limit" in "".join(server.stderr)


MALFORMED = [
    ("[" * 100_000, "recursion limit"),  # RecursionError before
    ('{"max_queue": ' + "9" * 400 + "}", "'max_queue': must be <="),  # OverflowError
    ('{"max_queue": 1' + "0" * 5000 + "}", "number out of range"),  # ValueError
    ('{"dynamic_batching": 5, "max_batch_size": 4}', "'dynamic_batching'"),  # TypeError
    ('{"max_batch_size": 4, "sequence_batching": {"oldest": {}, "state": [{"input_name": '
     '"a", "output_name": "b", "data_type": "TYPE_FP32", "dims": [65536, 65536]}]}}',
     "bytes per sequence"),  # MemoryError before
    ('{"instance_group": [{"count": 1e300}]}', "'instance_group[0].count'"),
    ('{"timeout_s": -1}', "'timeout_s': must be >"),
    ("3", "must hold a JSON object"),
]


def test_malformed_configs_loaded_through_the_api_are_400(tmp_path, start_server):
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                          "explicit", "--load-model", "*")
    for config, reason in MALFORMED:
        status, _, body = server.request(
            "POST", "/v2/repository/models/saxpy/load", {"parameters": {"config": config}})
        assert status == 400 and reason in json.loads(body)["error"], (config[:50], body)
        (tmp_path / "saxpy" / "config.json").write_text(config)  # the same, as a file
        status, _, body = server.request("POST", "/v2/repository/models/saxpy/load", b"")
        assert status == 400 and reason in json.loads(body)["error"], (config[:50], body)
        status, _, _ = server.request("POST", "/v2/models/saxpy/infer", SAXPY_BODY)
        assert status == 200  # the version that served keeps serving


def test_repository_extension_as_triton(tmp_path, start_server):
    for name in ("saxpy", "mlp_classifier"):
        shutil.copytree(SAMPLES / name, tmp_path / name)
    server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                          "explicit", "--load-model", "saxpy")
    index = _index(server)  # every model of the repository, loaded or not
    assert index["mlp_classifier"] == {"name": "mlp_classifier"}
    assert index["saxpy"]["state"] == "READY"
    status, _, body = server.request("POST", "/v2/repository/index", {"ready": True})
    assert [e["name"] for e in json.loads(body)] == ["saxpy"]
    # unload of a model that is not loaded succeeds
    status, _, _ = server.request("POST", "/v2/repository/models/mlp_classifier/unload", b"")
    assert status == 200
    status, _, _ = server.request("POST", "/v2/repository/models/nothing_here/unload", b"")
    assert status == 200
    # load with a config override: the whole configuration for this load
    override = json.dumps({"max_queue": 3, "description": "from the load request"})
    status, _, body = server.request("POST", "/v2/repository/models/saxpy/load",
                                     {"parameters": {"config": override}})
    assert status == 200, body
    config = json.loads(server.request("GET", "/v2/models/saxpy/config")[2])
    assert config["max_queue"] == 3 and config["description"] == "from the load request"
    status, _, body = server.request("POST", "/v2/repository/models/saxpy/load",
                                     {"parameters": {"file:1/model.vmfb": "AAAA"}})
    assert status == 400 and "other than 'config'" in json.loads(body)["error"]
    status, _, _ = server.request("POST", "/v2/repository/models/saxpy/unload", b"")
    assert _index(server)["saxpy"] == {"name": "saxpy", "version": "1",
                                       "state": "UNAVAILABLE", "reason": "unloaded"}


def test_signals_with_a_request_in_flight(tmp_path, start_server, spin_vmfb):
    write_model(tmp_path, "spin", spin_vmfb, {"max_concurrency": 1})
    server = start_server("--model-repository", str(tmp_path))
    body = {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1024], "data": [1.0] * 1024},
        {"name": "n", "datatype": "INT32", "shape": [1], "data": [300_000]}]}
    results = []
    worker = threading.Thread(target=lambda: results.append(
        server.request("POST", "/v2/models/spin/infer", body, timeout=120)))
    worker.start()
    labels = (("model", "spin"), ("version", "1"))
    deadline = time.monotonic() + 60
    while server.metrics().get(("tinyhal_inference_in_flight", labels)) != 1:
        assert time.monotonic() < deadline and worker.is_alive()
        time.sleep(0.02)
    for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
                   signal.SIGPROF, signal.SIGVTALRM, signal.SIGIO, signal.SIGPWR):
        server.proc.send_signal(signum)
    server.wait_stderr("SIGHUP ignored")
    assert server.request("GET", "/v2/health/ready")[0] == 200
    worker.join(timeout=120)
    assert results and results[0][0] == 200, results
    assert server.proc.poll() is None  # none of them ended it
    server.proc.send_signal(signal.SIGQUIT)  # drains as SIGTERM does
    assert server.wait(timeout=60) == 0


def _lag_over(metrics: dict, bound: str) -> float:
    count = metrics[("tinyhal_event_loop_lag_seconds_count", ())]
    return count - metrics[("tinyhal_event_loop_lag_seconds_bucket", (("le", bound),))]


@pytest.mark.parametrize("ops", [250, 1500])
def test_a_large_model_loads_while_health_answers(tmp_path, start_server, ops):
    # ~0.12 and ~0.4 MB of translated source: compile() of them held the interpreter ~41
    # and ~100 ms of CPU (now both compile in a child process)
    vmfb = compile_mlir(large_function_mlir(ops), HOST_FLAGS)
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    write_model(tmp_path, "big", vmfb, {"device": "sync"})
    server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                          "explicit", "--load-model", "saxpy",
                          env={"TINYHAL_VM_CACHE": str(tmp_path / "cache")})
    before = server.metrics()
    loaded = []
    loader = threading.Thread(target=lambda: loaded.append(
        server.request("POST", "/v2/repository/models/big/load", b"", timeout=180)))
    loader.start()
    answers = 0
    while loader.is_alive():
        assert server.request("GET", "/v2/health/live")[0] == 200
        answers += 1
        time.sleep(0.005)
    loader.join()
    assert loaded[0][0] == 200, loaded
    after = server.metrics()
    # health was asked while the model loaded (how many times depends on the machine's
    # speed and load: the bound is the lag monitor's, below)
    assert answers >= 1
    # the loop never stalled 50 ms while the model was read, translated and compiled
    stalls = _lag_over(after, "0.05") - _lag_over(before, "0.05")
    assert stalls == 0, (after[("tinyhal_event_loop_lag_max_seconds", ())], stalls)
    status, _, body = server.request("POST", "/v2/models/big/infer", {"inputs": [
        {"name": "n", "datatype": "INT32", "shape": [1], "data": [3]}]})
    assert status == 200, body


def _poll_until(server, done, what: str) -> dict:
    """SIGHUP (a poll now), then the index until `done(index)` (bounded)."""
    server.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 60
    while True:
        index = _index(server)
        if done(index):
            return index
        assert time.monotonic() < deadline, (what, index)
        time.sleep(0.05)


def test_polled_loads_and_unloads_never_stall_the_loop(tmp_path, start_server):
    # each unload once ran a collection of the whole heap on the event loop: 30-50 ms of
    # CPU, 0.2-2 s of the loop's time with the machine busy
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                          "poll", "--repository-poll-secs", "3600")
    odd = tmp_path / "odd" / "²"  # a version directory that is skipped, on every poll
    odd.mkdir(parents=True)
    shutil.copyfile(SAMPLES / "saxpy" / "1" / "model.vmfb", odd / "model.vmfb")
    (tmp_path / "odd" / "2").mkdir()  # and one without a model.vmfb
    before = server.metrics()
    for _ in range(3):
        for sample in ("gru_step", "mlp_classifier"):
            shutil.copytree(SAMPLES / sample, tmp_path / f"extra_{sample}")
        _poll_until(server, lambda ix: all(ix.get(f"extra_{s}", {}).get("state") == "READY"
                                           for s in ("gru_step", "mlp_classifier")), "load")
        status, _, _ = server.request("POST", "/v2/models/extra_mlp_classifier/infer", {
            "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                        "data": [0.5] * 16}]})
        assert status == 200
        for sample in ("gru_step", "mlp_classifier"):
            shutil.rmtree(tmp_path / f"extra_{sample}")
        _poll_until(server, lambda ix: not any(n.startswith("extra_") for n in ix), "unload")
        status, _, _ = server.request("POST", "/v2/models/saxpy/infer", SAXPY_BODY)
        assert status == 200
    (tmp_path / "odd" / "³").mkdir()  # a new skip: logged by a poll after all of those
    _poll_until(server, lambda ix: True, "last poll")
    log = server.wait_stderr("skipping ³/")
    after = server.metrics()
    stalls = _lag_over(after, "0.05") - _lag_over(before, "0.05")
    assert stalls == 0, (after[("tinyhal_event_loop_lag_max_seconds", ())], stalls)
    # the skipped version directories were logged once, not on each of the 8 polls
    assert log.count("skipping ²/") == 1 and log.count("version 2: no model.vmfb") == 1, log
