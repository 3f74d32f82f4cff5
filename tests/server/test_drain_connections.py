"""Drain as a client on a kept-alive connection sees it: every request that reached the
server gets an HTTP answer (200 served, or 503 "draining" with `connection: close`), none
is cut by a reset or a close without an answer; new connections are refused only once the
listener is gone."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest
from serve_helpers import sample_server

pytestmark = pytest.mark.timeout(120)

_ROW = json.dumps({"inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32",
                               "data": [0.25] * 16}]}).encode()


def _request(port: int) -> bytes:
    return (f"POST /v2/models/mlp_classifier/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Length: {len(_ROW)}\r\n\r\n").encode() + _ROW


def _read_answer(sock: socket.socket, pending: bytes) -> tuple[int, bool, bytes] | None:
    """(status, connection: close said, what follows) of one answer; None when the
    connection ended before a whole answer came."""
    data = pending
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return int(lines[0].split()[1]), headers.get("connection") == "close", rest[length:]


class _Client(threading.Thread):
    """Sends requests back to back on one kept-alive connection (a new one after the
    server closes it) until a connection is refused or `stop` is set; counts what each
    request sent got."""

    def __init__(self, port: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port, self.stop = port, stop
        self.statuses: dict[int, int] = {}
        self.unanswered: list[str] = []
        self.refused = False

    def run(self) -> None:
        request = _request(self.port)
        while not self.stop.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            except OSError:
                self.refused = True
                return
            with sock:
                pending = b""
                while not self.stop.is_set():
                    try:
                        sock.sendall(request)
                        answer = _read_answer(sock, pending)
                    except OSError as exc:
                        self.unanswered.append(type(exc).__name__)
                        break
                    if answer is None:
                        self.unanswered.append("closed without an answer")
                        break
                    status, close, pending = answer
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                    if close:
                        break


def test_sigterm_answers_every_request_sent_on_a_kept_alive_connection(tmp_path):
    with sample_server(tmp_path, ("mlp_classifier",), "--drain-timeout", "10") as server:
        stop = threading.Event()
        clients = [_Client(server.port, stop) for _ in range(16)]
        for client in clients:
            client.start()
        time.sleep(1.0)
        server.terminate()
        assert server.wait(30) == 0
        stop.set()
        for client in clients:
            client.join(15)
    statuses: dict[int, int] = {}
    for client in clients:
        for status, count in client.statuses.items():
            statuses[status] = statuses.get(status, 0) + count
    unanswered = [what for client in clients for what in client.unanswered]
    assert statuses.get(200, 0) > 100, statuses
    assert set(statuses) <= {200, 503}, statuses
    assert unanswered == [], (unanswered, statuses)


def test_connections_made_while_the_server_was_stopped_get_answers_after_sigterm(tmp_path):
    """Connections the kernel completed while the process did not run (SIGSTOP), each with
    its request sent, then SIGTERM: each is accepted and answered before the listener
    closes (closing it with them in its queue would reset them)."""
    with sample_server(tmp_path, ("mlp_classifier",)) as server:
        os.kill(server.proc.pid, signal.SIGSTOP)
        socks = []
        try:
            for _ in range(24):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
                sock.sendall(_request(server.port))
                socks.append(sock)
            os.kill(server.proc.pid, signal.SIGTERM)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        answers = []
        for sock in socks:
            with sock:
                try:
                    answer = _read_answer(sock, b"")
                except OSError as exc:
                    answer = type(exc).__name__
                answers.append(answer if isinstance(answer, str) else
                               answer and answer[:2])
        assert server.wait(30) == 0
    assert all(isinstance(a, tuple) and a[0] in (200, 503) for a in answers), answers
    assert any(a == (503, True) for a in answers), answers  # the drain answered them


def test_a_drain_bound_cut_by_clients_not_reading_says_so(tmp_path):
    """Clients that never read their large answers hold their connections to the drain's
    bound; the server then closes them, says so, and exits 0 (no invocation runs)."""
    n = 1_000_000
    ones = ",".join(["1"] * n)
    body = (f'{{"inputs":[{{"name":"alpha","shape":[1],"datatype":"FP32","data":[1.5]}},'
            f'{{"name":"x","shape":[{n}],"datatype":"FP32","data":[{ones}]}},'
            f'{{"name":"y","shape":[{n}],"datatype":"FP32","data":[{ones}]}}]}}').encode()
    with sample_server(tmp_path, ("saxpy",), "--drain-timeout", "2") as server:
        socks = []
        for _ in range(2):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(f"POST /v2/models/saxpy/infer HTTP/1.1\r\nHost: x\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            socks.append(sock)
        server.wait_stderr(r"saxpy", timeout=30)
        time.sleep(1.0)  # the answers are being written
        server.terminate()
        assert server.wait(30) == 0
        log = server.wait_stderr(r"drain: closing \d connection", timeout=10)
        for sock in socks:
            sock.close()
    assert "not reading its answer" in log
