"""Probe of the replica set (deploy/haproxy, local.sh) under continuous load when one
replica is told to stop as Kubernetes tells a pod (SIGTERM): HAProxy's health check and
the server's drain contract together must lose no admitted request. Eight clients
(stateless requests, and sequences of six steps) run through HAProxy throughout; every
answer is a 200, the sequences' outputs are bitwise those of one plain server, and the
drained replica exits 0. A replica that drops requests unread has them retried
elsewhere, and HAProxy's own 502 is a JSON error. Skipped without `haproxy`, as test_replicas.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from test_replicas import (
    _inputs,
    _run,
    _slot_of,
    _step,
    local_set,
    needs_haproxy,
    reference,
    sequence_key,
)
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.timeout(240), needs_haproxy]
__all__ = ["local_set", "reference"]  # fixtures of test_replicas.py, used here


class _StatelessLoad:
    """Four tritonclient callers of `mlp_classifier` through the front end until
    `stop()`: how many were served, and every failure (an error answer or none at all)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.served = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(4)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=60)
        tensor = httpclient.InferInput("features", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.full((1, 16), 0.5, np.float32))
        try:
            while not self._stop.is_set():
                try:
                    client.infer("mlp_classifier", [tensor])
                    self.served += 1
                except InferenceServerException as exc:
                    self.failures.append(f"[{exc.status()}] {exc.message()}")
                except Exception as exc:  # noqa: BLE001 - no answer at all: a failure
                    self.failures.append(repr(exc))
        finally:
            client.close()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        assert not self.failures, self.failures[:3]
        assert self.served > 20


def test_sigterm_to_a_replica_under_load_loses_no_admitted_request(local_set, reference):
    replicas = local_set(2, "--drain-timeout", "60")
    load = _StatelessLoad(replicas.url)
    try:
        inputs = _inputs(12000, count=4)
        want, _ = _run(reference.url, inputs, 12000, True)
        half = 3

        def pause(i: int, k: int) -> None:
            if k == half and i == 0:
                # the replica holding sequence 0 is told to stop mid-sequence
                port = replicas.table()[sequence_key("12000")]
                pid = replicas.replicas[replicas.replica_of(port)][1]
                os.kill(pid, signal.SIGTERM)
            time.sleep(0.05)

        got, errors = _run(replicas.url, inputs, 12000, True, pause=pause)
        assert not errors, sorted(errors.items())[:3]
        assert got == want
        replicas.wait_line(r"replica r\d exited 0")
        time.sleep(0.5)  # stateless load on the one replica left
    finally:
        load.stop()
    # a sequence started now goes to the replica left
    client = httpclient.InferenceServerClient(replicas.url)
    x = np.zeros((1, 8), np.float32)
    _step(client, x, 13000, True, start=True, end=True)
    client.close()
    assert replicas.stop() == 0


def test_sigterm_to_a_replica_without_sequences_under_load_loses_nothing(local_set):
    """No sequence lives on it: its listener and its idle connections close at once,
    while the front end still sends it requests (its check has not seen the drain yet)."""
    replicas = local_set(2, "--drain-timeout", "60")
    load = _StatelessLoad(replicas.url)
    try:
        time.sleep(0.5)
        os.kill(replicas.replicas["r2"][1], signal.SIGTERM)
        replicas.wait_line(r"replica r2 exited 0")
        time.sleep(0.5)
    finally:
        load.stop()
    assert replicas.stop() == 0


class _ClosingReplica:
    """A replica that passes HAProxy's readiness check and closes every other request's
    connection without an answer (as one killed mid-request)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                while True:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        head += chunk
                    if not head.startswith(b"GET /v2/health/ready"):
                        self.closed += 1
                        return  # closes without an answer
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: 14\r\n\r\n{\"ready\":true}")
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


def _post_mlp(url: str) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://{url}/v2/models/mlp_classifier/infer", method="POST",
        data=json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                     "shape": [1, 16], "data": [0.5] * 16}]}).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_a_replica_that_drops_requests_unread_is_retried_then_a_json_502(local_set):
    """A replica that closes connections without an answer (a pooled connection closed
    as a replica drains, or a replica gone): its requests go to another replica (our
    replicas close a connection without an answer only before they read a request); with
    no other replica left, HAProxy's own 502 is a JSON error as the replicas' are,
    saying the request may have run."""
    replicas = local_set(1)
    fake = _ClosingReplica()
    try:
        replicas.api(f"set server replicas/slot9 addr 127.0.0.1 port {fake.port}")
        replicas.api("set server replicas/slot9 state ready")
        deadline = time.monotonic() + 30
        while True:
            states = {f[3]: f[5] for f in map(str.split, replicas.api(
                "show servers state replicas").splitlines()) if len(f) > 5}
            if states.get("slot9") == "2":
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.1)
        answers = [_post_mlp(replicas.url) for _ in range(6)]  # round robin
        assert fake.closed and {status for status, _ in answers} == {200}, answers
        replicas.api(f"set server replicas/{_slot_of(replicas, 'r1')} state maint")
        status, body = _post_mlp(replicas.url)
        assert status == 502, body
        assert "the request may have run" in json.loads(body)["error"], body
    finally:
        replicas.api("set server replicas/slot9 state maint")
        fake.close()
    assert replicas.stop() == 0


def test_long_sequence_ids_that_share_a_prefix_keep_their_own_replicas(local_set,
                                                                        reference):
    """Sequence ids up to the server's 1,024 characters: two that share their first 64
    (a stick table keyed by the id itself cuts it there) are pinned each to its own
    replica, so each sequence's steps reach its state and answer as one plain server
    does."""
    replicas = local_set(2)
    prefix = "projects/p/locations/l/sessions/" + "s" * 40
    ids = [prefix + "-a", prefix + "-b"]
    inputs = _inputs(14000, count=2)
    want = {}
    got = {}
    ref = httpclient.InferenceServerClient(reference.url)
    client = httpclient.InferenceServerClient(replicas.url)
    try:
        for k in range(4):  # interleaved: a's START, b's START (the other replica), ...
            for i, sid in enumerate(ids):
                want[(i, k)] = _step(ref, inputs[i][k], sid, True, start=k == 0,
                                     end=k == 3)
                try:
                    got[(i, k)] = _step(client, inputs[i][k], sid, True, start=k == 0,
                                        end=k == 3)
                except InferenceServerException as exc:
                    got[(i, k)] = f"[{exc.status()}] {exc.message()}"
    finally:
        ref.close()
        client.close()
    assert got == want
    assert replicas.stop() == 0
