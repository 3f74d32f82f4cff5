"""Answers written by an instance thread: exactly one response per request, whoever
sends it (`DirectReply`), `respond` called on the instance thread only for a request
that succeeded and only when the instance has nothing else queued (else on the loop as it
takes in the outcome, before the request's task wakes), never for a request that already
has its outcome or stopped waiting, and over HTTP a keep-alive connection that stays in
step while deadlines race the instance's answers."""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading

import numpy as np
import pytest
import trio

from tinyhal.server.admission import Admission, Instance, PendingRequest, answer_directly
from tinyhal.server.batching import BatchingConfig
from tinyhal.server.http import DirectReply, HttpServer, Response
from tinyhal.server.instances import InstanceThread

pytestmark = pytest.mark.timeout(60)


def _http(draining: bool = False) -> HttpServer:
    http = HttpServer(None, None, max_body=1 << 20)
    http.draining = draining
    return http


def _pair() -> tuple[socket.socket, socket.socket]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.settimeout(5)
    return ours, peer


def _read_all(peer: socket.socket) -> bytes:
    peer.setblocking(False)
    chunks = []
    while True:
        try:
            chunk = peer.recv(1 << 16)
        except BlockingIOError:
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def test_the_first_answer_wins_and_nothing_is_written_after_close():
    ours, peer = _pair()
    with ours, peer:
        reply = DirectReply(ours.fileno(), True, _http())
        assert reply.send(Response(200, b'{"a":1}'))
        assert not reply.send(Response(504, b'{"error":"late"}'))
        reply.close()
        data = _read_all(peer)
        assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b'{"a":1}')
        assert b"connection: close" not in data
        assert reply.sent.status == 200 and reply.keep_alive and not reply.rest

        closed = DirectReply(ours.fileno(), True, _http())
        closed.close()
        assert not closed.send(Response(200, b"{}"))
        assert closed.sent is None and _read_all(peer) == b""


def test_draining_closes_the_connection_and_big_or_blocked_answers_go_to_the_loop():
    ours, peer = _pair()
    with ours, peer:
        draining = DirectReply(ours.fileno(), True, _http(draining=True))
        assert draining.send(Response(200, b"{}"))
        assert b"connection: close" in _read_all(peer) and not draining.keep_alive

        big = DirectReply(ours.fileno(), True, _http())
        assert not big.send(Response(200, b"x" * (1 << 17)))  # the loop's, without a copy

        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        try:
            while True:
                ours.send(b"f" * 4096)
        except BlockingIOError:
            pass  # the socket takes nothing more
        blocked = DirectReply(ours.fileno(), True, _http())
        assert blocked.send(Response(200, b'{"b":2}'))
        assert blocked.rest.endswith(b'{"b":2}') and blocked.rest.startswith(b"HTTP/1.1 200")


def test_only_requests_still_waiting_are_answered():
    answered = []
    requests = []
    for name in ("waiting", "finished", "detached", "failed", "no respond"):
        requests.append(PendingRequest([], 1, math.inf, name, 0.0,
                                       None if name == "no respond" else
                                       lambda results, seconds, name=name:
                                       answered.append((name, results, seconds))))
    requests[1].finished = True  # the drain or an unload answered it already
    requests[2].detached = True  # its deadline passed: its task answered 504
    outcomes = [([("y", "FP32", np.ones(1))], None)] * 5
    outcomes[3] = (None, ValueError("a bad row"))
    answer_directly(requests, outcomes, [(5, 5, 0.25)])
    assert [(name, seconds) for name, _, seconds in answered] == [("waiting", 0.25)]


def test_respond_runs_on_the_instance_thread_when_nothing_is_queued_else_on_the_loop():
    calls: list[tuple[str, float, str]] = []
    gate = threading.Event()

    def invoke(args: list) -> list:
        gate.wait(30)
        (x,) = args
        if (x == -1).any():
            raise ValueError("a row of -1")
        return [("y", "FP32", x * 2)]

    def respond_for(name: str):
        def respond(results: list, seconds: float) -> None:
            calls.append((name, float(results[0][2][0, 0]), threading.current_thread().name))
        return respond

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()
        admission = Admission([Instance(InstanceThread("direct#0", token), invoke)], 64,
                              BatchingConfig(8, 0))
        outcomes = {}

        async def one(name: str, value: float) -> None:
            try:
                out, _, _ = await admission.infer([np.full((1, 4), value, np.float32)], 1,
                                                  math.inf, name, respond_for(name))
                outcomes[name] = float(out[0][2][0, 0])
            except ValueError as exc:
                outcomes[name] = exc

        gate.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "first", 1.0)  # runs alone; the others queue meanwhile
            with trio.fail_after(10):
                while admission.running < 1:
                    await trio.sleep(0.001)
            for name, value in (("good", 3.0), ("bad", -1.0)):
                nursery.start_soon(one, name, value)
            with trio.fail_after(10):
                while admission.queued < 2:
                    await trio.sleep(0.001)
            gate.set()
        admission.stop()
        # the first execution finished with two requests queued: the loop answered it as
        # it took in the outcome (before its task woke); the batch after it (failed, then
        # each alone) ran with nothing queued: the instance answered its success
        assert outcomes["first"] == 2.0 and outcomes["good"] == 6.0
        assert isinstance(outcomes["bad"], ValueError)
        assert calls == [("first", 2.0, threading.current_thread().name),
                         ("good", 6.0, "direct#0")]

    trio.run(main)


def test_respond_runs_on_the_instance_thread_while_the_next_batch_waits_its_delay():
    """A queued request that waits out a long queue delay does not keep the instance
    from answering the execution it just finished itself."""
    calls: list[tuple[str, str]] = []
    gate = threading.Event()

    def invoke(args: list) -> list:
        gate.wait(30)
        return [("y", "FP32", args[0] * 2)]

    def respond_for(name: str):
        def respond(results: list, seconds: float) -> None:
            calls.append((name, threading.current_thread().name))
        return respond

    async def main() -> None:
        token = trio.lowlevel.current_trio_token()
        # a batch of 4 rows starts at once; fewer wait up to half a second
        admission = Admission([Instance(InstanceThread("delay#0", token), invoke)], 64,
                              BatchingConfig(8, 500_000, (4,)))

        async def one(name: str) -> None:
            await admission.infer([np.ones((1, 4), np.float32)], 1, math.inf, name,
                                  respond_for(name))

        gate.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "first")
            with trio.fail_after(10):
                while admission.running < 1:
                    await trio.sleep(0.001)
            nursery.start_soon(one, "second")
            with trio.fail_after(10):
                while admission.queued < 1:
                    await trio.sleep(0.001)
            gate.set()  # "first" ends while "second" has most of its delay to wait
        admission.stop()
        assert calls == [("first", "delay#0"), ("second", "delay#0")]

    trio.run(main)


def test_keep_alive_connection_stays_in_step_while_deadlines_race_answers(server):
    """Deadlines about as long as an execution: each request gets exactly one answer,
    its own (200 with its id, or 504), in order on one connection."""
    conn = http.client.HTTPConnection(*server.url.split(":"), timeout=30)
    statuses = set()
    try:
        for i in range(300):
            body = json.dumps({"id": f"r{i}", "inputs": [{
                "name": "features", "datatype": "FP32", "shape": [1, 16],
                "data": [0.1 * (k + i % 7) for k in range(16)]}]})
            timeout = ("0.0001", "0.0003", "0.001", "0")[i % 4]
            conn.request("POST", "/v2/models/mlp_classifier/infer", body,
                         {"Inference-Timeout": timeout, "Content-Type": "application/json"})
            response = conn.getresponse()
            payload = json.loads(response.read())
            statuses.add(response.status)
            assert response.status in (200, 504), payload
            if response.status == 200:
                assert payload["id"] == f"r{i}"
            else:
                assert "deadline exceeded" in payload["error"]
    finally:
        conn.close()
    assert 200 in statuses
    status, _, _ = server.request("GET", "/v2/health/live")
    assert status == 200


def test_metrics_and_statistics_read_after_an_answer_count_it(server):
    """An answer the instance thread wrote is in the metrics and statistics the client
    reads right after it (the loop finishes its accounting first)."""
    labels = (("code", "200"), ("model", "mlp_classifier"), ("version", "1"))
    name = "tinyhal_inference_requests_total"
    before = server.metrics().get((name, labels), 0)
    conn = http.client.HTTPConnection(*server.url.split(":"), timeout=30)
    try:
        for i in range(1, 21):
            body = json.dumps({"inputs": [{"name": "features", "datatype": "FP32",
                                           "shape": [1, 16], "data": [0.5] * 16}]})
            conn.request("POST", "/v2/models/mlp_classifier/infer", body)
            response = conn.getresponse()
            assert response.status == 200, response.read()
            response.read()
            assert server.metrics()[(name, labels)] == before + i
    finally:
        conn.close()
