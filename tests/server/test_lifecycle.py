"""tinyhal-serve process lifecycle: SIGTERM drain, failed models, bundled samples, and
peak device memory on /metrics equal to what the allocator counts for the same work."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from serve_helpers import SAMPLES, write_model

pytestmark = pytest.mark.timeout(120)


def _wait_in_flight(server, labels: tuple) -> None:
    """Waits (30 s at most) until the server reports one request of `labels` running."""
    deadline = time.monotonic() + 30
    while server.metrics().get(("tinyhal_inference_in_flight", labels)) != 1:
        assert time.monotonic() < deadline, "the slow request never started"
        time.sleep(0.02)


def _spin(n: int, length: int = 1024) -> dict:
    return {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [length], "data": [1.0] * length},
        {"name": "n", "datatype": "INT32", "shape": [1], "data": [n]},
    ]}


def test_sigterm_drains_in_flight_requests_then_exits_0(tmp_path, spin_vmfb, start_server):
    write_model(tmp_path, "spin", spin_vmfb, {"max_concurrency": 2})
    server = start_server("--model-repository", str(tmp_path), "--drain-timeout", "20")
    labels = (("model", "spin"), ("version", "1"))
    results = []
    worker = threading.Thread(target=lambda: results.append(
        server.request("POST", "/v2/models/spin/infer", _spin(1_200_000))))
    worker.start()
    _wait_in_flight(server, labels)
    server.terminate()
    # the listener closes: new connections are refused while the request finishes
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=1):
                pass
        except OSError:
            break
        assert time.monotonic() < deadline, "server still accepts connections after SIGTERM"
        time.sleep(0.02)
    worker.join(timeout=60)
    assert results and results[0][0] == 200, results
    body = json.loads(results[0][2])
    assert body["outputs"][0]["shape"] == [1024]
    assert server.wait(timeout=30) == 0
    out = "".join(server.stdout)
    assert "stopped (exit 0)" in out
    assert "SIGTERM: draining" in "".join(server.stderr)


def test_failed_model_is_unavailable_or_stops_the_server(tmp_path, start_server):
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    broken = tmp_path / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.vmfb").write_bytes(b"not a flatbuffer" * 8)
    server = start_server("--model-repository", str(tmp_path), "--no-exit-on-error")
    status, _, body = server.request("GET", "/v2/health/ready")
    assert status == 503 and json.loads(body) == {"ready": False}
    status, _, body = server.request("POST", "/v2/repository/index")
    index = {m["name"]: m for m in json.loads(body)}
    assert index["saxpy"]["state"] == "READY"
    assert index["broken"]["state"] == "UNAVAILABLE" and "FlatBuffer" in index["broken"]["reason"]
    status, headers, body = server.request("POST", "/v2/models/broken/infer", _spin(1))
    assert status == 503 and "not ready" in json.loads(body)["error"]
    status, _, _ = server.request("GET", "/v2/models/broken/ready")
    assert status == 503
    status, _, _ = server.request("GET", "/v2/models/saxpy/ready")
    assert status == 200

    strict = start_server("--model-repository", str(tmp_path), ready=False)
    assert strict.wait(timeout=60) == 1
    assert "failed to load" in "".join(strict.stderr)


def test_peak_device_memory_on_metrics_matches_the_allocator(tmp_path, start_server):
    """A fresh server and a fresh in-process Module run the same request: /metrics shows
    the allocator's exact per-heap and device-wide peaks."""
    import tinyhal

    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp_classifier")
    vmfb = tmp_path / "mlp_classifier/1/model.vmfb"
    x = np.random.default_rng(5).normal(size=(48, 16)).astype(np.float32)

    module = tinyhal.load(vmfb, device="sync")  # the bundled config's device
    try:
        module.invoke("predict", x)
        expected = module.statistics()
    finally:
        module.close()

    server = start_server("--model-repository", str(tmp_path))
    status, _, body = server.request("POST", "/v2/models/mlp_classifier/infer", {
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [48, 16],
                    "data": x.tolist()}]})
    assert status == 200, body
    m = server.metrics()
    assert m[("tinyhal_device_memory_peak_bytes", (("device", "sync"),))] == expected.peak_bytes
    for heap, stats in expected.heaps.items():
        key = (("device", "sync"), ("heap", heap))
        assert m[("tinyhal_device_heap_peak_bytes", key)] == stats.peak_bytes, heap
        assert m[("tinyhal_device_heap_live_bytes", key)] == stats.live_bytes, heap
        assert m[("tinyhal_device_heap_allocations_total", key)] == stats.allocation_count
    assert expected.peak_bytes >= x.nbytes


def test_no_arguments_serves_the_bundled_samples():
    """`tinyhal-serve` with no --model-repository serves the samples in the package."""
    from tinyhal.server.repository import ModelRepository, bundled_models_dir

    repo = ModelRepository(bundled_models_dir())
    try:
        assert repo.load_all() == []
        assert sorted(repo.models) == ["gru_step", "mlp_classifier", "saxpy"]
        mv = repo.get("mlp_classifier")
        assert (mv.function, mv.max_batch_size, mv.device_name, mv.execution) == \
            ("predict", 64, "sync", "thread")
        assert mv.batching is not None
        gru = repo.get("gru_step")
        assert gru.sequences is not None and [s.name for s in gru.inputs] == ["INPUT"]
    finally:
        repo.close()


def test_bundled_samples_rebuild_byte_for_byte():
    proc = subprocess.run([sys.executable, str(SAMPLES / "build_samples.py"), "--check"],
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cli_rejects_a_missing_repository(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tinyhal.server.main", "--port", "0",
                           "--model-repository", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a directory" in proc.stderr


@pytest.mark.parametrize("device,execution", [("sync", "thread"), ("emu", "thread")])
def test_other_devices_give_the_same_bits(tmp_path, start_server, device, execution):
    """--device sync runs invocations in a worker thread (the sync device would block the
    event loop); emu runs them on the loop like task. Both match iree.runtime."""
    import iree.runtime as rt

    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp_classifier")
    config_path = tmp_path / "mlp_classifier/config.json"
    config = json.loads(config_path.read_text())
    del config["device"]  # the server's --device decides
    config_path.write_text(json.dumps(config))
    server = start_server("--model-repository", str(tmp_path), "--device", device)
    x = np.random.default_rng(9).normal(size=(3, 16)).astype(np.float32)
    head = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [3, 16],
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    status, headers, body = server.request(
        "POST", "/v2/models/mlp_classifier/infer", head + x.tobytes(),
        {"Inference-Header-Content-Length": str(len(head))})
    assert status == 200
    n = int(headers["inference-header-content-length"])
    probs = np.frombuffer(body[n : n + 48], np.float32).reshape(3, 4)
    cls = np.frombuffer(body[n + 48 :], np.int32)
    ref = rt.load_vm_flatbuffer_file(str(tmp_path / "mlp_classifier/1/model.vmfb"),
                                     driver="local-task").predict(x)
    np.testing.assert_array_equal(probs, ref[0].to_host())
    np.testing.assert_array_equal(cls, ref[1].to_host())
    status, _, body = server.request("GET", "/v2/models/mlp_classifier/config")
    config = json.loads(body)
    assert (config["device"], config["execution"]) == (device, execution)
    m = server.metrics()
    assert m[("tinyhal_device_memory_peak_bytes", (("device", device),))] > 0


@pytest.mark.parametrize("attempt", range(3))
def test_drain_timeout_exits_3_and_logs_what_it_abandoned(tmp_path, spin_vmfb, start_server,
                                                          attempt):
    """SIGTERM with --drain-timeout far below a running invocation's time: the documented
    exit code 3, never a signal, and the log names the abandoned invocation."""
    from tinyhal.server.main import EXIT_DRAIN_TIMEOUT

    write_model(tmp_path, "spin", spin_vmfb, {"max_concurrency": 2})
    server = start_server("--model-repository", str(tmp_path), "--drain-timeout", "0.2")
    labels = (("model", "spin"), ("version", "1"))
    body = {**_spin(4_000_000), "id": f"slow-{attempt}"}

    def send() -> None:
        try:
            server.request("POST", "/v2/models/spin/infer", body, timeout=30)
        except OSError:
            pass  # the server ended with the request unanswered: that is the point

    worker = threading.Thread(target=send, daemon=True)
    worker.start()
    _wait_in_flight(server, labels)
    time.sleep(0.05 * attempt)  # a different point of the invocation each time
    server.terminate()
    code = server.wait(timeout=30)
    assert code == EXIT_DRAIN_TIMEOUT, (code, "".join(server.stderr[-20:]))
    err = "".join(server.stderr)
    assert "abandoning 1 invocation(s)" in err, err
    assert f"abandoned: model spin version 1 request slow-{attempt}" in err, err
    assert f"stopped (exit {EXIT_DRAIN_TIMEOUT})" in "".join(server.stdout)


def test_per_model_peak_memory_is_what_one_invocation_held(tmp_path, start_server):
    """tinyhal_model_memory_peak_bytes equals the allocator's peak over one invocation of
    the same request in a fresh process, minus what was live before it; bigger batches
    hold more; the device-wide peak stays the since-start peak."""
    import tinyhal

    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp_classifier")
    vmfb = tmp_path / "mlp_classifier/1/model.vmfb"
    rng = np.random.default_rng(6)
    small = rng.normal(size=(4, 16)).astype(np.float32)
    large = rng.normal(size=(64, 16)).astype(np.float32)

    module = tinyhal.load(vmfb, device="sync")
    try:
        module.invoke("predict", small)  # warm: constants and caches as the server has them
        before = module.statistics().live_bytes
        module.device.allocator.reset_peak()
        module.invoke("predict", large)
        expected_large = module.statistics().peak_bytes - before
    finally:
        module.close()

    server = start_server("--model-repository", str(tmp_path))
    labels = (("device", "sync"), ("model", "mlp_classifier"), ("version", "1"))
    peaks = []
    for x in (small, large, small):
        status, _, body = server.request("POST", "/v2/models/mlp_classifier/infer", {
            "inputs": [{"name": "features", "datatype": "FP32", "shape": list(x.shape),
                        "data": x.tolist()}]})
        assert status == 200, body
        peaks.append(server.metrics()[("tinyhal_model_memory_peak_bytes", labels)])
    assert peaks[0] < peaks[1] == peaks[2] == expected_large, (peaks, expected_large)
    m = server.metrics()
    assert m[("tinyhal_device_memory_peak_bytes", (("device", "sync"),))] >= peaks[1]
    status, _, body = server.request("GET", "/v2/models/mlp_classifier/config")
    assert json.loads(body)["peak_invocation_bytes"] == expected_large


def test_second_signal_exits_4_and_logs_what_it_abandoned(tmp_path, spin_vmfb, start_server):
    from tinyhal.server.main import EXIT_SECOND_SIGNAL

    write_model(tmp_path, "spin", spin_vmfb, {"max_concurrency": 1})
    server = start_server("--model-repository", str(tmp_path), "--drain-timeout", "60",
                          "--access-log")
    labels = (("model", "spin"), ("version", "1"))

    def send() -> None:
        try:
            server.request("POST", "/v2/models/spin/infer",
                           {**_spin(4_000_000), "id": "twice"}, timeout=30)
        except OSError:
            pass

    threading.Thread(target=send, daemon=True).start()
    _wait_in_flight(server, labels)
    server.terminate()
    server.wait_stderr("draining", timeout=10)
    server.terminate()
    assert server.wait(timeout=30) == EXIT_SECOND_SIGNAL
    # stderr is read by its own thread, which may still be behind the exit
    err = server.wait_stderr("abandoned: model spin version 1 request twice", timeout=10)
    assert "second SIGTERM: abandoning 1 invocation(s)" in err, err
    assert "abandoned: model spin version 1 request twice" in err
    assert '"GET /metrics" 200' in err  # --access-log logs each request


def test_a_faulting_kernel_takes_down_its_device_not_the_server(tmp_path, start_server):
    """A model whose machine code is corrupt (a fuzz case whose kernel faults with
    SIGSEGV): the request gets a 500 naming the fault, the model and its device become
    unavailable, the server keeps serving models on other devices, and loading the model
    again runs it on a fresh device (where it faults again, cleanly)."""
    from support.mutations import case_seed, mutate, subjects

    subject = subjects(["tiny"])[0]
    with open(subject.path, "rb") as f:
        corrupt, _ = mutate(f.read(), case_seed(0, "tiny", 1794))
    version = tmp_path / "corrupt" / "1"
    version.mkdir(parents=True)
    (version / "model.vmfb").write_bytes(corrupt)
    (tmp_path / "corrupt" / "config.json").write_text(
        json.dumps({"function": "main", "device": "task"}))
    shutil.copytree(SAMPLES / "mlp_classifier", tmp_path / "mlp_classifier")  # on sync
    server = start_server("--model-repository", str(tmp_path), "--model-control-mode",
                          "explicit", "--load-model", "*")
    status, _, body = server.request("GET", "/v2/models/corrupt")
    request = {"inputs": [{"name": spec["name"], "datatype": "FP32", "shape": [4],
                           "data": [1.0, 2.0, 3.0, 4.0]} for spec in json.loads(body)["inputs"]]}
    for _ in range(2):
        status, _, body = server.request("POST", "/v2/models/corrupt/infer", request)
        assert status == 500, body
        assert "faulted" in json.loads(body)["error"] and "SIGSEGV" in json.loads(body)["error"]
        status, _, body = server.request("POST", "/v2/models/corrupt/infer", request)
        assert status == 503 and "device lost" in json.loads(body)["error"], body
        assert server.request("GET", "/v2/models/corrupt/ready")[0] == 503
        assert server.request("GET", "/v2/health/ready")[0] == 503
        assert server.request("GET", "/v2/health/live")[0] == 200
        status, _, body = server.request("POST", "/v2/models/mlp_classifier/infer", {
            "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                        "data": [0.5] * 16}]})
        assert status == 200, body
        status, _, body = server.request("POST", "/v2/repository/models/corrupt/load")
        assert status == 200, body
        assert server.request("GET", "/v2/models/corrupt/ready")[0] == 200
    assert "device task was lost" in "".join(server.stderr)
