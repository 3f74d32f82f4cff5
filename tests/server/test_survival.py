"""tinyhal-serve survives its operators: model files changed under a served model, unload
with more admitted than it runs, load/unload cycles under batching load, memory flat over
reloads, health answering while a model's host code runs, and the second-signal
contract. Every server is a child process; every wait is bounded."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from serve_helpers import SAMPLES, ServerProcess, write_model

from support.iree_tools import HOST_FLAGS, compile_mlir

pytestmark = pytest.mark.timeout(300)

MLP = SAMPLES / "mlp_classifier"
ROW = [0.25 * (i % 7) - 0.5 for i in range(16)]
MLP_BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                   "data": ROW}]}).encode()

# Integer work in the VM itself (no dispatch): with TINYHAL_VM_NATIVE_LOOPS=0 it runs as
# Python, holding the GIL as a host-heavy program does.
HOST_SPIN_MLIR = """
func.func @host_spin(%n: i32 {iree.abi.name = "n"}) -> (i32 {iree.abi.name = "r"}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %z = arith.constant 1 : i32
  %k = arith.constant 1103515245 : i32
  %one = arith.constant 12345 : i32
  %nn = arith.index_cast %n : i32 to index
  %r = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %z) -> (i32) {
    %m = arith.muli %acc, %k : i32
    %a = arith.addi %m, %one : i32
    scf.yield %a : i32
  }
  return %r : i32
}
"""


class Traffic:
    """Client threads sending one request in a loop on keep-alive connections; every
    answer is recorded by status, and 200 answers are checked against `expect`."""

    def __init__(self, server: ServerProcess, path: str, body: bytes, threads: int = 2,
                 expect: bytes | None = None) -> None:
        self.server, self.path, self.body, self.expect = server, path, body, expect
        self.statuses: dict[int, int] = {}
        self.wrong: list[bytes] = []
        self.others: list[bytes] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True)
                         for _ in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        while not self._stop.is_set():
            try:
                conn.request("POST", self.path, self.body,
                             {"Content-Type": "application/json"})
                resp = conn.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
                with self._lock:
                    self.statuses[-1] = self.statuses.get(-1, 0) + 1
                continue
            with self._lock:
                self.statuses[resp.status] = self.statuses.get(resp.status, 0) + 1
                if resp.status == 200 and self.expect is not None and \
                        _outputs(payload) != self.expect:
                    self.wrong.append(payload)
                elif resp.status not in (200, 503):
                    self.others.append(payload)
        conn.close()

    def stop(self) -> dict[int, int]:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        return self.statuses


def _outputs(payload: bytes) -> bytes:
    doc = json.loads(payload)
    return json.dumps(doc["outputs"], sort_keys=True).encode()


def _post(server: ServerProcess, path: str, body: bytes = b"") -> tuple[int, dict]:
    status, _, payload = server.request("POST", path, body, timeout=120)
    return status, json.loads(payload or b"{}")


def _mlp_answer(server: ServerProcess, model: str = "mlp") -> bytes:
    status, _, payload = server.request("POST", f"/v2/models/{model}/infer", MLP_BODY)
    assert status == 200, payload
    return _outputs(payload)


def test_model_file_changes_under_load_keep_the_loaded_version(tmp_path):
    """In-place overwrite, truncation and deletion of a served model's file change
    nothing it answers; a failed reload names the file and the reason and keeps the old
    version serving; a successful one swaps."""
    shutil.copytree(MLP, tmp_path / "mlp")
    vmfb = tmp_path / "mlp" / "1" / "model.vmfb"
    original = vmfb.read_bytes()
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "explicit", "--load-model", "*").start()
    try:
        expect = _mlp_answer(server)
        traffic = Traffic(server, "/v2/models/mlp/infer", MLP_BODY, expect=expect)
        time.sleep(0.3)
        with open(vmfb, "r+b") as f:  # same size, other bytes, in place
            f.write(bytes(b ^ 0x5A for b in original))
        time.sleep(0.3)
        os.truncate(vmfb, 0)
        time.sleep(0.3)
        vmfb.unlink()
        time.sleep(0.3)
        status, doc = _post(server, "/v2/repository/models/mlp/load")
        assert status == 400 and "no version directory" in doc["error"], doc
        vmfb.write_bytes(os.urandom(len(original)))  # corrupt: the reload fails ...
        status, doc = _post(server, "/v2/repository/models/mlp/load")
        assert status == 400 and "mlp/1/model.vmfb" in doc["error"], doc
        assert str(tmp_path) not in doc["error"]
        assert server.request("GET", "/v2/models/mlp/ready")[0] == 200  # ... old serves
        time.sleep(0.3)
        vmfb.write_bytes(original)
        status, doc = _post(server, "/v2/repository/models/mlp/load")
        assert status == 200, doc
        time.sleep(0.3)
        statuses = traffic.stop()
        assert traffic.wrong == [] and traffic.others == [], (traffic.wrong[:1],
                                                              traffic.others[:1])
        assert set(statuses) == {200} and statuses[200] > 20, statuses
        assert _mlp_answer(server) == expect
    finally:
        server.stop()


@pytest.fixture(scope="module")
def spin_repository(tmp_path_factory, spin_vmfb) -> Path:
    root = tmp_path_factory.mktemp("spin")
    write_model(root, "spin", spin_vmfb, {"max_concurrency": 1, "max_queue": 16})
    return root


def test_unload_returns_once_more_admitted_than_instances_finished(spin_repository):
    server = ServerProcess("--model-repository", str(spin_repository),
                           "--model-control-mode", "explicit", "--load-model", "*").start()
    try:
        body = json.dumps({"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [256], "data": [1.0] * 256},
            {"name": "n", "datatype": "INT32", "shape": [1], "data": [3_000_000]}]}).encode()
        results: list[int] = []

        def one() -> None:
            results.append(server.request("POST", "/v2/models/spin/infer", body,
                                          timeout=120)[0])

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        # all six admitted before the unload (one runs, five wait): a request the unload
        # beats to admission is rightly refused with 503, and that is not what this tests
        deadline = time.monotonic() + 30
        while server.metrics().get(("tinyhal_inference_queued",
                                    (("model", "spin"), ("version", "1"))), 0) < 5:
            assert time.monotonic() < deadline, "requests were not queued"
            time.sleep(0.01)
        status, doc = _post(server, "/v2/repository/models/spin/unload")
        assert status == 200, doc
        for t in threads:
            t.join(timeout=120)
        assert results == [200] * 6
        # the repository lock is free: another load answers
        status, doc = _post(server, "/v2/repository/models/spin/load")
        assert status == 200, doc
    finally:
        server.stop()


def test_load_unload_cycles_under_batching_load_fail_nothing_admitted(tmp_path):
    shutil.copytree(MLP, tmp_path / "mlp")
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "explicit", "--load-model", "*").start()
    try:
        expect = _mlp_answer(server)
        traffic = Traffic(server, "/v2/models/mlp/infer", MLP_BODY, threads=4, expect=expect)
        for _ in range(200):
            assert _post(server, "/v2/repository/models/mlp/unload")[0] == 200
            assert _post(server, "/v2/repository/models/mlp/load")[0] == 200
        statuses = traffic.stop()
        # admitted requests all succeed; the only refusals are 503 while unloaded
        assert traffic.wrong == [] and traffic.others == [], (traffic.wrong[:1],
                                                              traffic.others[:1])
        assert set(statuses) <= {200, 503} and statuses.get(200, 0) > 100, statuses
    finally:
        server.stop()


RSS_CHILD = r"""
import sys, trio
from tinyhal.server.repository import ModelRepository

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

async def main():
    repo = ModelRepository(sys.argv[1], default_device="sync")
    repo.token = trio.lowlevel.current_trio_token()
    marks = {}
    async with trio.open_nursery() as nursery:
        for cycle in range(1, 1001):
            failed = await repo.reload("saxpy", nursery)
            assert not failed, failed[0].reason
            await repo.unload_model("saxpy")
            if cycle in (100, 1000):
                marks[cycle] = rss()
        nursery.cancel_scope.cancel()
    repo.close()
    print(marks[100], marks[1000])

trio.run(main)
"""


def test_memory_is_flat_over_reloads(tmp_path):
    """RSS after 1,000 load/unload cycles is within 5 MB of after the first 100."""
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(tmp_path)],
                         capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    after_100, after_1000 = map(int, out.stdout.split())
    assert after_1000 - after_100 < 5 << 20, (after_100, after_1000)


FROZEN_CHILD = r"""
import gc, sys, trio, weakref
from tinyhal.server.repository import ModelRepository

async def main():
    repo = ModelRepository(sys.argv[1], default_device="sync")
    repo.token = trio.lowlevel.current_trio_token()
    async with trio.open_nursery() as nursery:
        assert not await repo.reload("saxpy", nursery)
        assert gc.get_freeze_count() > 0  # the loaded heap is out of the collector's scans
        first = weakref.ref(repo.get("saxpy"))
        assert not await repo.reload("saxpy", nursery)  # replaces it: it retires
        while repo.retiring:
            await trio.sleep(0.01)
        await repo.unload_model("saxpy")
        nursery.cancel_scope.cancel()
    repo.close()
    print("collected" if first() is None else "kept")

trio.run(main)
"""


def test_a_version_that_left_is_collected_although_the_heap_is_frozen(tmp_path):
    """Loading freezes the heap out of the cyclic collector (long pauses under load);
    a version replaced by a reload is still collected, cycles and all."""
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    out = subprocess.run([sys.executable, "-c", FROZEN_CHILD, str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["collected"]


def test_health_answers_while_a_model_runs_host_code(tmp_path):
    """A model whose invocation is host-heavy (VM code as Python, holding the GIL) runs
    continuously; health answers with p99 under 50 ms."""
    write_model(tmp_path, "host", compile_mlir(HOST_SPIN_MLIR, HOST_FLAGS))
    server = ServerProcess("--model-repository", str(tmp_path),
                           env={"TINYHAL_VM_NATIVE_LOOPS": "0"}).start()
    try:
        body = json.dumps({"inputs": [{"name": "n", "datatype": "INT32", "shape": [1],
                                       "data": [300_000]}]}).encode()
        traffic = Traffic(server, "/v2/models/host/infer", body, threads=1)
        deadline = time.monotonic() + 60
        while traffic.statuses.get(200, 0) < 1:  # the model is busy from now on
            assert time.monotonic() < deadline
            time.sleep(0.01)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        latencies = []
        for _ in range(300):
            start = time.perf_counter()
            conn.request("GET", "/v2/health/live")
            assert conn.getresponse().read() == b'{"live":true}'
            latencies.append(time.perf_counter() - start)
            time.sleep(0.002)
        conn.close()
        statuses = traffic.stop()
        assert set(statuses) == {200}, statuses
        latencies.sort()
        assert latencies[int(len(latencies) * 0.99)] < 0.050, latencies[-5:]
    finally:
        server.stop()


@pytest.mark.timeout(600)
def test_a_second_signal_at_any_moment_exits_4_or_0(tmp_path):
    """SIGTERM then SIGTERM/SIGINT 0-50 ms later, 20 times: the exit code is 4, or 0
    when the drain had completed; never death by a signal."""
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    codes = []
    for i in range(20):
        server = ServerProcess("--model-repository", str(tmp_path)).start()
        try:
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(i * 0.05 / 19)
            server.proc.send_signal(signal.SIGINT if i % 2 else signal.SIGTERM)
            codes.append(server.wait(timeout=60))
        finally:
            server.stop()
    assert set(codes) <= {0, 4}, codes


def test_fifo_model_file_is_refused_and_index_reasons_name_no_absolute_path(tmp_path):
    shutil.copytree(MLP, tmp_path / "mlp")
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "model.vmfb").write_bytes(b"not a module" * 100)
    server = ServerProcess("--model-repository", str(tmp_path), "--model-control-mode",
                           "explicit", "--load-model", "*", "--no-exit-on-error").start()
    try:
        status, _, body = server.request("POST", "/v2/repository/index", b"")
        (broken,) = [m for m in json.loads(body) if m["name"] == "broken"]
        assert broken["state"] == "UNAVAILABLE" and "broken/1/model.vmfb" in broken["reason"]
        assert str(tmp_path) not in body.decode()
        vmfb = tmp_path / "mlp" / "1" / "model.vmfb"
        vmfb.unlink()
        os.mkfifo(vmfb)  # a reader of it would block until a writer comes: never
        status, doc = _post(server, "/v2/repository/models/mlp/load")
        assert status == 400 and "not a regular file" in doc["error"], doc
        assert str(tmp_path) not in doc["error"]
        assert server.request("GET", "/v2/models/mlp/ready")[0] == 200  # old one serves
        status, doc = _post(server, "/v2/repository/models/broken/load")  # lock is free
        assert status == 400 and "broken/1/model.vmfb" in doc["error"], doc
    finally:
        server.stop()


def test_a_closed_stdout_changes_nothing(tmp_path):
    shutil.copytree(SAMPLES / "saxpy", tmp_path / "saxpy")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinyhal.server.main", "--host", "127.0.0.1", "--port", "0",
         "--model-repository", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            if "tinyhal-serve: ready" in line:
                break
            assert time.monotonic() < deadline
        proc.stdout.close()  # the reader goes away: the "stopped" line cannot be written
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
