"""Replicas behind the shipped HAProxy front end (deploy/haproxy), run as an operator runs
them: `deploy/haproxy/local.sh` starting real tinyhal-serve processes and Debian's
`haproxy` on 127.0.0.1, driven with tritonclient (JSON and binary tensors).

Interleaved `gru_step` sequences through two replicas give outputs bitwise equal to one
plain server, and the same config without its stick rules (round robin alone) fails the
same check; scaling 2 -> 3 under live sequences moves none; a replica drained through the
runtime API loses no step and exits 0; a killed replica's sequences get a clear error
while new ones go elsewhere. The autoscale rule (server/autoscale.py) is checked on its
own and against real servers, idle and loaded. Without `haproxy` those tests skip with
the reason (.ci/run installs it where it can).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import ServerProcess
from tritonclient.utils import InferenceServerException

from tinyhal.server.autoscale import Policy, desired_replicas, replica_load, scrape_load

pytestmark = pytest.mark.timeout(240)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
LOCAL_SH = DEPLOY / "haproxy" / "local.sh"
CONFIG = DEPLOY / "haproxy" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy")
needs_haproxy = pytest.mark.skipif(
    HAPROXY is None, reason="haproxy not installed (Debian: apt-get install haproxy; "
                            ".ci/run installs it where it can)")
GONE = "the replica that held its state is gone"
STEPS = 6
SEQUENCES = 15


def sequence_key(sid: str) -> str:
    """The stick table's key of a sequence id as HAProxy reads it (the string id "0" is
    read with its quotes): its SHA-256 in upper-case hex (deploy/haproxy/haproxy.cfg)."""
    return hashlib.sha256(sid.encode()).hexdigest().upper()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runtime_api(path: Path, command: str) -> str:
    """One command to HAProxy's runtime API (its unix socket): the answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


class LocalSet:
    """`local.sh --replicas N` as a subprocess: its lines, its runtime API, its replicas."""

    def __init__(self, tmp: Path, replicas: int, *flags: str) -> None:
        self.port = _free_port()
        self.run_dir = tmp / f"run-{self.port}"
        self.socket = self.run_dir / "haproxy.sock"
        env = dict(os.environ, PYTHON=sys.executable, PYTHONUNBUFFERED="1",
                   TINYHAL_SERVE=f"{sys.executable} -m tinyhal.server.main")
        self.proc = subprocess.Popen(
            [str(LOCAL_SH), "--replicas", str(replicas), "--port", str(self.port),
             "--run-dir", str(self.run_dir), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = f"127.0.0.1:{self.port}"
        self.replicas: dict[str, tuple[int, int]] = {}  # name -> (port, pid)

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_line(self, pattern: str, timeout: float = 90.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            ready = re.search(r"local\.sh: replica (r\d+) ready on 127\.0\.0\.1:(\d+) "
                              r"\(pid (\d+)", line)
            if ready:
                self.replicas[ready.group(1)] = (int(ready.group(2)), int(ready.group(3)))
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"local.sh did not print /{pattern}/ (exit {self.proc.poll()}):"
                             f"\n{''.join(self.output[-60:])}")

    def start(self) -> LocalSet:
        self.wait_line(r"local\.sh: \d+ replicas ready behind")
        return self

    def api(self, command: str) -> str:
        return _runtime_api(self.socket, command)

    def table(self) -> dict[str, int]:
        """{sequence key (`sequence_key`): port of the replica it is pinned to}."""
        out = {}
        for line in self.api("show table replicas").splitlines():
            m = re.search(r"key=(\S+) .*server_key=127\.0\.0\.1:(\d+)", line)
            if m:
                out[m.group(1)] = int(m.group(2))
        return out

    def server_state(self, replica: str) -> tuple[int, int]:
        """HAProxy's view of `replica`'s server: (operational state: 0 down, 2 up;
        administrative flags: 0x8 drain)."""
        port = self.replicas[replica][0]
        for fields in map(str.split, self.api("show servers state replicas").splitlines()):
            if len(fields) > 18 and fields[0].isdigit() and fields[18] == str(port):
                return int(fields[5]), int(fields[6])
        raise AssertionError(f"HAProxy has no server for replica {replica} (port {port})")

    def wait_server_state(self, replica: str, check, what: str, timeout: float = 30.0
                          ) -> None:
        """Waits until HAProxy's (operational, administrative) state of `replica`'s server
        passes `check`."""
        deadline = time.monotonic() + timeout
        while not check(*self.server_state(replica)):
            assert time.monotonic() < deadline, f"HAProxy never saw replica {replica} {what}"
            time.sleep(0.05)

    def replica_of(self, port: int) -> str:
        return next(name for name, (p, _) in self.replicas.items() if p == port)

    def stop(self, timeout: float = 90.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # its replicas and haproxy are its children: end them too
            for _, pid in self.replicas.values():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait(timeout=10)
            raise


@pytest.fixture
def local_set(tmp_path):
    """local_set(replicas, *flags) -> a started LocalSet, stopped afterwards."""
    started: list[LocalSet] = []

    def start(replicas: int, *flags: str) -> LocalSet:
        s = LocalSet(tmp_path, replicas, *flags)
        started.append(s)
        return s.start()

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop()


@pytest.fixture(scope="module")
def reference():
    """One plain server: what the replica set must answer, bit for bit."""
    proc = ServerProcess()
    try:
        yield proc.start()
    finally:
        proc.stop()


def _inputs(seed: int, count: int = SEQUENCES, steps: int = STEPS) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal((1, 8)).astype(np.float32) for _ in range(steps)]
            for _ in range(count)]


def _step(client, x: np.ndarray, sequence_id: int, binary: bool, start: bool = False,
          end: bool = False) -> bytes:
    tensor = httpclient.InferInput("INPUT", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    result = client.infer("gru_step", [tensor], sequence_id=sequence_id,
                          sequence_start=start, sequence_end=end,
                          outputs=[httpclient.InferRequestedOutput("OUTPUT",
                                                                   binary_data=binary)])
    return result.as_numpy("OUTPUT").tobytes()


def _run(url: str, inputs: list[list[np.ndarray]], first_id: int, binary: bool,
         steps: range | None = None, end: bool = True, pause=None):
    """Steps `steps` (default all) of sequence i = first_id + i over inputs[i], every
    sequence from its own thread and connection, interleaved; `pause(i, k)` runs before
    step k. -> (outputs {(i, k): bytes}, errors {(i, k): message})."""
    outputs: dict[tuple[int, int], bytes] = {}
    errors: dict[tuple[int, int], str] = {}
    barrier = threading.Barrier(len(inputs))

    def run(i: int) -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=60)
        try:
            barrier.wait(timeout=30)
            for k in steps or range(len(inputs[i])):
                if pause is not None:
                    pause(i, k)
                try:
                    outputs[(i, k)] = _step(client, inputs[i][k], first_id + i, binary,
                                            start=k == 0,
                                            end=end and k == len(inputs[i]) - 1)
                except InferenceServerException as exc:
                    errors[(i, k)] = f"[{exc.status()}] {exc.message()}"
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return outputs, errors


def _requests_served(url: str, model: str) -> float:
    """The replica at `url`'s count of `model` requests answered."""
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "tinyhal_inference_requests_total"
               and s.labels.get("model") == model)


@needs_haproxy
def test_shipped_config_is_valid_with_and_without_dns_discovery():
    for extra in ({}, {"TINYHAL_REPLICAS_DNS": "localhost:8000"}):
        proc = subprocess.run([HAPROXY, "-c", "-f", str(CONFIG)], capture_output=True,
                              text=True, timeout=30, env=dict(os.environ, **extra))
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_kubernetes_front_end_runs_the_shipped_config():
    docs = {d["kind"]: d for d in yaml.safe_load_all(
        (DEPLOY / "kubernetes/haproxy.yaml").read_text()) if d}
    assert docs["ConfigMap"]["data"]["haproxy.cfg"] == CONFIG.read_text()
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    replicas = {d["kind"]: d for d in yaml.safe_load_all(
        (DEPLOY / "kubernetes/tinyhal-serve.yaml").read_text()) if d}
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    service = replicas["Service"]
    assert env["TINYHAL_REPLICAS_SERVICE"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"  # DNS answers every pod
    assert service["spec"]["publishNotReadyAddresses"] is True  # draining pods stay
    policy = replicas["NetworkPolicy"]["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": docs["Deployment"]["spec"]["selector"][
        "matchLabels"]}} in policy  # the front end may reach the replicas


@needs_haproxy
def test_local_sh_refuses_a_bad_command_line_and_a_busy_port(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run([str(LOCAL_SH), "--replicas", "0", "--port", "8000"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "--replicas must be at least 1" in proc.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([str(LOCAL_SH), "--replicas", "1", "--port", str(port),
                               "--run-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and f"is port {port} free?" in proc.stdout, proc.stdout


@needs_haproxy
def test_two_replicas_answer_sequences_bitwise_as_one_server(local_set, reference):
    replicas = local_set(2)
    for binary, first in ((False, 1000), (True, 2000)):
        inputs = _inputs(first)
        want, errors = _run(reference.url, inputs, first, binary)
        assert not errors
        got, errors = _run(replicas.url, inputs, first, binary)
        assert not errors, sorted(errors.items())[:3]
        assert got == want  # every step's bytes, JSON and binary alike
        pinned = replicas.table()
        ids = [sequence_key(str(first + i)) for i in range(SEQUENCES)]
        assert set(ids) <= set(pinned)
        assert len({pinned[i] for i in ids}) == 2, "sequences should spread over both"
    # a `sequence-id` header pins as well (clients that cannot have the body read)
    client = httpclient.InferenceServerClient(replicas.url)
    x = _inputs(3, 1, 2)[0]
    headers = {"sequence-id": "3000"}
    tensors = []
    for k in range(2):
        tensor = httpclient.InferInput("INPUT", [1, 8], "FP32")
        tensor.set_data_from_numpy(x[k])
        tensors.append(client.infer("gru_step", [tensor], sequence_id=3000,
                                    sequence_start=k == 0, sequence_end=k == 1,
                                    headers=headers).as_numpy("OUTPUT").tobytes())
    ref = httpclient.InferenceServerClient(reference.url)
    assert tensors == [_step(ref, x[0], 3000, False, start=True),
                       _step(ref, x[1], 3000, False, end=True)]
    # the string id "0" is a sequence (only the number 0 is none): pinned like the others
    zero = [_step(client, x[k % 2], "0", False, start=k == 0, end=k == 5)
            for k in range(6)]
    assert zero == [_step(ref, x[k % 2], "0", False, start=k == 0, end=k == 5)
                    for k in range(6)]
    assert sequence_key('"0"') in replicas.table()
    # requests of one keep-alive connection are balanced each on its own (both replicas
    # up first: a check that timed out on a loaded host takes one out for a moment)
    for name in replicas.replicas:
        replicas.wait_server_state(name, lambda op, admin: op == 2, "up")
    before = [_requests_served(f"127.0.0.1:{p}", "mlp_classifier")
              for p, _ in replicas.replicas.values()]
    tensor = httpclient.InferInput("features", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 16), np.float32))
    for _ in range(10):
        client.infer("mlp_classifier", [tensor])
    after = [_requests_served(f"127.0.0.1:{p}", "mlp_classifier")
             for p, _ in replicas.replicas.values()]
    served = [a - b for a, b in zip(after, before)]
    assert sum(served) == 10 and min(served) >= 3, served  # round robin: 5 and 5
    client.close()
    ref.close()
    assert replicas.stop() == 0


@needs_haproxy
def test_round_robin_alone_fails_the_same_check(local_set, tmp_path):
    config = tmp_path / "round-robin.cfg"
    config.write_text("".join(line for line in CONFIG.read_text().splitlines(True)
                              if not line.lstrip().startswith(("stick ", "force-persist"))))
    # the broken sequences stay live until they idle out: do not wait for them
    replicas = local_set(2, "--haproxy-config", str(config), "--drain-timeout", "0.5")
    got, errors = _run(replicas.url, _inputs(4000), 4000, False)
    assert errors, "round robin alone should break sequences spread over two replicas"
    assert all("must specify the START flag" in e for e in errors.values()), errors
    assert replicas.stop() == 0


@needs_haproxy
def test_scale_to_three_moves_no_sequence_and_a_drain_loses_no_step(local_set, reference):
    replicas = local_set(2, "--drain-timeout", "60")
    inputs = _inputs(5000)
    want, _ = _run(reference.url, inputs, 5000, True)
    got, errors = _run(replicas.url, inputs, 5000, True, steps=range(3))
    assert not errors
    pinned = replicas.table()
    # 2 -> 3 while all 15 sequences are live
    replicas.proc.send_signal(signal.SIGUSR1)
    replicas.wait_line(r"replica r3 ready .*; 3 replicas;")
    more, errors = _run(replicas.url, inputs, 5000, True, steps=range(3, STEPS))
    assert not errors, sorted(errors.items())[:3]
    assert {**got, **more} == want
    after = replicas.table()
    assert {k: after[k] for k in pinned} == pinned, "a live sequence moved"
    # new sequences reach the new replica; keep them live while it drains
    fresh = _inputs(6000)
    want, _ = _run(reference.url, fresh, 6000, True)
    got, errors = _run(replicas.url, fresh, 6000, True, steps=range(2))
    assert not errors
    r3_port = replicas.replicas["r3"][0]
    on_r3 = [i for i in range(SEQUENCES) if replicas.table()[sequence_key(str(6000 + i))]
             == r3_port]
    assert on_r3, "round robin over three replicas gave the new one no sequence"
    replicas.proc.send_signal(signal.SIGUSR2)  # drain the newest: r3
    replicas.wait_server_state("r3", lambda op, admin: admin & 0x8, "draining")
    assert "drained" not in "".join(replicas.output), "r3 left while holding sequences"
    # the rest of every sequence, r3's included, and new sequences meanwhile
    late = _inputs(7000)
    rest, errors = _run(replicas.url, fresh, 6000, True, steps=range(2, STEPS))
    assert not errors, sorted(errors.items())[:3]
    assert {**got, **rest} == want  # 0 lost steps
    _, errors = _run(replicas.url, late, 7000, True, steps=range(1), end=False)
    assert not errors
    replicas.wait_line(r"replica r3 drained \(exit 0; 2 replicas\)")
    table = replicas.table()
    assert all(table[sequence_key(str(7000 + i))] != r3_port for i in range(SEQUENCES)), \
        "a draining replica took a new sequence"
    assert replicas.stop() == 0


@needs_haproxy
def test_a_killed_replicas_sequences_get_a_clear_error_and_new_ones_go_elsewhere(
        local_set):
    replicas = local_set(2)
    inputs = _inputs(8000, count=8)
    _, errors = _run(replicas.url, inputs, 8000, False, steps=range(2))
    assert not errors
    r2_port, r2_pid = replicas.replicas["r2"]
    table = replicas.table()
    lost = {i for i in range(8) if table[sequence_key(str(8000 + i))] == r2_port}
    assert lost and len(lost) < 8
    # string ids the "gone" answer must quote as JSON (round robin puts two on r2)
    client = httpclient.InferenceServerClient(replicas.url)
    quoted = [f'q"\\{k}' for k in range(4)]
    for sid in quoted:
        _step(client, inputs[0][0], sid, False, start=True)
    os.kill(r2_pid, signal.SIGKILL)
    replicas.wait_line(r"replica r2 exited -9")
    # down in HAProxy too: its steps are still sent there (force-persist, as to a
    # draining replica), refused, and answered "gone"
    replicas.wait_server_state("r2", lambda op, admin: op == 0, "down")
    _, errors = _run(replicas.url, inputs, 8000, False, steps=range(2, STEPS))
    assert {i for i, _ in errors} == lost
    assert all(GONE in e and e.startswith("[400]") for e in errors.values()), errors
    gone = []
    for sid in quoted:
        try:
            _step(client, inputs[0][1], sid, False, end=True)
        except InferenceServerException as exc:  # r1's may have idled out meanwhile
            if GONE in exc.message():
                assert exc.message().startswith(f"sequence {sid}: {GONE}"), exc.message()
                gone.append(sid)
    assert len(gone) == 2, gone  # a broken JSON answer would name no sequence
    client.close()
    fresh = _inputs(9000, count=8)
    _, errors = _run(replicas.url, fresh, 9000, False)
    assert not errors, sorted(errors.items())[:3]
    r1_port = replicas.replicas["r1"][0]
    assert all(replicas.table()[sequence_key(str(9000 + i))] == r1_port for i in range(8))
    # with no replica up, HAProxy's own 503 is a JSON error as the replicas' are
    replicas.api(f"set server replicas/{_slot_of(replicas, 'r1')} state maint")
    client = httpclient.InferenceServerClient(replicas.url)
    tensor = httpclient.InferInput("features", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("mlp_classifier", [tensor])
    client.close()
    assert refused.value.status() == "503"
    assert "no replica can take the request" in refused.value.message()
    assert replicas.stop() == 0


def _slot_of(replicas: LocalSet, replica: str) -> str:
    """The HAProxy server (slot) a replica fills, from local.sh's line."""
    return next(line.rsplit("server replicas/", 1)[1].split(")")[0]
                for line in replicas.output if f"replica {replica} ready on" in line)


@needs_haproxy
def test_a_reload_keeps_every_sequence_pinned(tmp_path, reference):
    """`peers` hands the stick table to the new process of a reload (master-worker mode,
    SIGUSR2), so live sequences keep their replica."""
    servers = [ServerProcess().start() for _ in range(2)]
    try:
        config = tmp_path / "haproxy.cfg"
        config.write_text(CONFIG.read_text() + "".join(
            f"    server r{i} {s.url}\n" for i, s in enumerate(servers)))
        port = _free_port()
        api_path = tmp_path / "haproxy.sock"
        env = dict(os.environ, TINYHAL_LB_BIND=f"127.0.0.1:{port}",
                   TINYHAL_LB_RUNTIME_API=str(api_path),
                   TINYHAL_LB_PEER=f"127.0.0.1:{_free_port()}")
        haproxy = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(config)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(
            line.decode() for line in haproxy.stderr), daemon=True).start()
        try:
            def api(command: str) -> str:
                return _runtime_api(api_path, command)

            deadline = time.monotonic() + 30
            while not api_path.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            url = f"127.0.0.1:{port}"
            while [f[5] for f in map(str.split, api("show servers state replicas")
                                     .splitlines()) if len(f) > 5 and f[3] in ("r0", "r1")
                   ] != ["2", "2"]:  # both running
                assert time.monotonic() < deadline, "".join(lines)
                time.sleep(0.1)
            inputs = _inputs(11000)
            want, _ = _run(reference.url, inputs, 11000, False)
            got, errors = _run(url, inputs, 11000, False, steps=range(3))
            assert not errors
            before = api("show table replicas").count(": key=")
            assert before == SEQUENCES
            # a process keeps waiting to be taught for ~5 s after it started; a reload
            # before then would lose the table (deploy/README.md)
            while "resync_timeout=<PAST>" not in api("show peers"):
                assert time.monotonic() < deadline, api("show peers")
                time.sleep(0.2)
            haproxy.send_signal(signal.SIGUSR2)  # reload: a new worker, the old one leaves
            deadline = time.monotonic() + 30
            while "".join(lines).count("Loading success") < 2:
                assert time.monotonic() < deadline, "".join(lines)
                time.sleep(0.1)
            # the old worker teaches the new one its table as it leaves
            while api("show table replicas").count(": key=") != before:
                assert time.monotonic() < deadline, "".join(lines)
                time.sleep(0.2)
            more, errors = _run(url, inputs, 11000, False, steps=range(3, STEPS))
            assert not errors, sorted(errors.items())[:3]
            assert {**got, **more} == want
        finally:
            haproxy.terminate()
            haproxy.wait(timeout=30)
    finally:
        for s in servers:
            s.stop()


@needs_haproxy
def test_sigterm_to_a_replica_drains_its_sequences_and_new_work_goes_elsewhere(local_set):
    """What Kubernetes does to a pod: SIGTERM, no runtime API call."""
    replicas = local_set(2, "--drain-timeout", "60")
    inputs = _inputs(10000, count=8)
    _, errors = _run(replicas.url, inputs, 10000, False, steps=range(2))
    assert not errors
    r2_port, r2_pid = replicas.replicas["r2"]
    assert r2_port in replicas.table().values()
    os.kill(r2_pid, signal.SIGTERM)
    stateless = httpclient.InferInput("features", [1, 16], "FP32")
    stateless.set_data_from_numpy(np.zeros((1, 16), np.float32))
    client = httpclient.InferenceServerClient(replicas.url)
    for _ in range(6):  # new work is refused there (503) and retried on r1
        client.infer("mlp_classifier", [stateless])
    client.close()
    # its readiness is 503 now: once HAProxy's check takes it down, its sequences'
    # steps must still reach it (a loaded host used to get there before the steps did)
    replicas.wait_server_state("r2", lambda op, admin: op == 0, "down")
    _, errors = _run(replicas.url, inputs, 10000, False, steps=range(2, STEPS))
    assert not errors, (sorted(errors.items())[:3], "".join(replicas.output[-100:]))
    replicas.wait_line(r"replica r2 exited 0")


# -- the autoscale decision ------------------------------------------------------------


def test_autoscale_rule_is_the_hpa_algorithm():
    policy = Policy(target=4, min_replicas=2, max_replicas=10)
    assert desired_replicas([0, 0], policy) == 2  # idle: the minimum
    assert desired_replicas([0, 0, 0, 0], policy) == 3  # one pod at a time down
    assert desired_replicas([4.2, 3.9], policy) == 2  # within the 10% tolerance
    assert desired_replicas([8, 8], policy) == 4
    assert desired_replicas([9, 0], policy) == 3  # the mean decides: ceil(2 * 4.5 / 4)
    assert desired_replicas([100] * 8, policy) == 10  # the maximum
    assert desired_replicas([], policy) == 2
    for bad in ([-1.0], [float("nan")]):
        with pytest.raises(ValueError):
            desired_replicas(bad, policy)
    with pytest.raises(ValueError):
        Policy(target=0)
    with pytest.raises(ValueError):
        Policy(min_replicas=3, max_replicas=2)


def test_autoscale_policy_is_the_manifests():
    """The module's defaults are the HPA's numbers: one rule, two places to read it."""
    docs = {d["kind"]: d for d in yaml.safe_load_all(
        (DEPLOY / "kubernetes/hpa-prometheus-adapter.yaml").read_text()) if d}
    spec = docs["HorizontalPodAutoscaler"]["spec"]
    policy = Policy()
    assert float(spec["metrics"][0]["pods"]["target"]["averageValue"]) == policy.target
    assert (spec["minReplicas"], spec["maxReplicas"]) == (policy.min_replicas,
                                                          policy.max_replicas)
    (down,) = spec["behavior"]["scaleDown"]["policies"]
    assert (down["type"], down["value"]) == ("Pods", policy.scale_down_step)
    rule = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])["rules"][0]
    from tinyhal.server.autoscale import LOAD_METRICS

    assert all(name in rule["metricsQuery"] for name in LOAD_METRICS)


def _spin(n: int) -> dict:
    return {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1024], "data": [1.0] * 1024},
        {"name": "n", "datatype": "INT32", "shape": [1], "data": [n]}]}


def test_autoscale_decision_on_real_servers_idle_and_loaded(server, reference):
    """`spin` runs one invocation at a time with one more queued: two long requests make
    a load of 2 there, while the reference server stays idle."""
    policy = Policy(target=1, min_replicas=1, max_replicas=4)
    assert scrape_load(reference.url) == 0
    assert desired_replicas([scrape_load(reference.url)], policy) == 1
    done = []
    workers = [threading.Thread(target=lambda: done.append(
        server.request("POST", "/v2/models/spin/infer", _spin(800_000), timeout=120)[0]))
        for _ in range(2)]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 60
        load = 0.0
        while load < 2 and time.monotonic() < deadline and len(done) < 2:
            load = scrape_load(server.url)
            time.sleep(0.02)
        assert load == 2, "two spin requests never ran and queued at once"
        loads = [load, scrape_load(reference.url)]
        assert desired_replicas(loads, policy) == 2  # mean 1 per replica: as many
        assert desired_replicas([load], policy) == 2  # one replica loaded 2x: double
    finally:
        for w in workers:
            w.join(timeout=120)
    assert done == [200, 200]
    proc = subprocess.run([sys.executable, "-m", "tinyhal.server.autoscale", "--target", "1",
                           "--min", "1", reference.url, server.url], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["desired"] == 1  # both idle again: the minimum
    assert replica_load("") == 0


# -- CPUs on a shared host, secrets off the command line -------------------------------


def _loop_cpus(pid: int) -> str:
    """The CPUs the server's main thread (its event loop) may run on."""
    with open(f"/proc/{pid}/status") as f:
        return f.read().split("Cpus_allowed_list:", 1)[1].split("\n", 1)[0].strip()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not sys.platform.startswith("linux"),
                    reason="needs Linux and at least two CPUs this process may use")
def test_two_servers_on_one_host_take_different_cpus(tmp_path):
    env = {"TINYHAL_CPU_LOCK_DIR": str(tmp_path)}
    servers = [ServerProcess(env=env) for _ in range(2)]
    try:
        for s in servers:
            s.start()
        loops = [_loop_cpus(s.proc.pid) for s in servers]
        assert all(loop.isdigit() for loop in loops), loops  # each pinned to one CPU
        assert loops[0] != loops[1]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            f"cpu-{loop}.lock" for loop in loops)
    finally:
        for s in servers:
            s.stop()
    third = ServerProcess(env=env).start()  # the claims ended with their processes
    try:
        assert _loop_cpus(third.proc.pid).isdigit()
    finally:
        third.stop()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not sys.platform.startswith("linux"),
                    reason="needs Linux and at least two CPUs this process may use")
def test_a_server_finding_every_cpu_claimed_pins_nothing(tmp_path):
    import fcntl
    held = []
    for cpu in os.sched_getaffinity(0):  # as other servers hold them
        fd = os.open(tmp_path / f"cpu-{cpu}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.append(fd)
    try:
        server = ServerProcess(env={"TINYHAL_CPU_LOCK_DIR": str(tmp_path)}).start()
        try:
            assert not _loop_cpus(server.proc.pid).isdigit()  # left to the kernel
            assert server.request("GET", "/v2/health/ready")[0] == 200
        finally:
            server.stop()
    finally:
        for fd in held:
            os.close(fd)


def test_a_server_without_a_usable_cpu_lock_directory_still_starts(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    server = ServerProcess(env={"TINYHAL_CPU_LOCK_DIR": str(blocker / "cpus")}).start()
    try:
        assert server.request("GET", "/v2/health/ready")[0] == 200
    finally:
        server.stop()


def test_restricted_api_reads_its_header_value_from_a_file_or_the_environment(tmp_path):
    secret = "s3cr3t-" + os.urandom(8).hex()
    key_file = tmp_path / "admin-key"
    key_file.write_text(secret + "\n")
    for value, env in ((f"@{key_file}", None), ("env:TEST_ADMIN_KEY",
                                                {"TEST_ADMIN_KEY": secret})):
        server = ServerProcess("--http-restricted-api", f"statistics:x-admin-key={value}",
                               env=env).start()
        try:
            with open(f"/proc/{server.proc.pid}/cmdline", "rb") as f:
                assert secret.encode() not in f.read()
            assert server.request("GET", "/v2/models/stats")[0] == 403
            assert server.request("GET", "/v2/models/stats",
                                  headers={"x-admin-key": secret})[0] == 200
        finally:
            server.stop()
    for value, env, says in (
            (f"@{tmp_path / 'missing'}", None, "cannot read the header value from"),
            ("env:TEST_ADMIN_KEY", {"TEST_ADMIN_KEY": ""}, "is empty (or unset)")):
        proc = subprocess.run(
            [sys.executable, "-m", "tinyhal.server.main", "--port", "0",
             "--http-restricted-api", f"statistics:x-admin-key={value}"],
            capture_output=True, text=True, timeout=60, env=dict(os.environ, **(env or {})))
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
