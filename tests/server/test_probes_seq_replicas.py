"""Probe of the replica set (deploy/haproxy, local.sh) under continuous load when one
replica is told to stop as Kubernetes tells a pod (SIGTERM): HAProxy's health check and
the server's drain contract together must lose no admitted request. Eight clients
(stateless requests, and sequences of six steps) run through HAProxy throughout; every
answer is a 200, the sequences' outputs are bitwise those of one plain server, and the
drained replica exits 0. Skipped without `haproxy`, as test_replicas.py."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from test_replicas import _inputs, _run, _step, local_set, needs_haproxy, reference
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.timeout(240), needs_haproxy]
__all__ = ["local_set", "reference"]  # fixtures of test_replicas.py, used here


def test_sigterm_to_a_replica_under_load_loses_no_admitted_request(local_set, reference):
    replicas = local_set(2, "--drain-timeout", "60")
    stop = threading.Event()
    failures: list[str] = []
    served = [0]

    def stateless() -> None:
        client = httpclient.InferenceServerClient(replicas.url, network_timeout=60)
        tensor = httpclient.InferInput("features", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.full((1, 16), 0.5, np.float32))
        try:
            while not stop.is_set():
                try:
                    client.infer("mlp_classifier", [tensor])
                    served[0] += 1
                except InferenceServerException as exc:
                    failures.append(f"[{exc.status()}] {exc.message()}")
        finally:
            client.close()

    clients = [threading.Thread(target=stateless, daemon=True) for _ in range(4)]
    for client in clients:
        client.start()
    try:
        inputs = _inputs(12000, count=4)
        want, _ = _run(reference.url, inputs, 12000, True)
        half = 3

        def pause(i: int, k: int) -> None:
            if k == half and i == 0:
                # the replica holding sequence 0 is told to stop mid-sequence
                port = replicas.table()[str(12000)]
                pid = replicas.replicas[replicas.replica_of(port)][1]
                os.kill(pid, signal.SIGTERM)
            time.sleep(0.05)

        got, errors = _run(replicas.url, inputs, 12000, True, pause=pause)
        assert not errors, sorted(errors.items())[:3]
        assert got == want
        replicas.wait_line(r"replica r\d exited 0")
        time.sleep(0.5)  # stateless load on the one replica left
    finally:
        stop.set()
        for client in clients:
            client.join(timeout=60)
    assert not failures, failures[:3]
    assert served[0] > 20
    # a sequence started now goes to the replica left
    client = httpclient.InferenceServerClient(replicas.url)
    x = np.zeros((1, 8), np.float32)
    _step(client, x, 13000, True, start=True, end=True)
    client.close()
    assert replicas.stop() == 0
