"""Resources an unauthenticated client can make tinyhal-serve hold, probed as an attacker
would: pipelining floods that never read, connections reset at every phase of a request,
half-closed sockets, keep-alive connections idle at the connection cap, accept storms,
and requests failing in every way the memory budget sees. Each probe reads what the
server holds from inside it (RSS from /proc, the budget's held bytes and the event loop's
longest stall from /metrics), never from a client's clock. One server for the file; every
wait is bounded."""

from __future__ import annotations

import gzip
import json
import shutil
import socket
import struct
import threading
import time

import numpy as np
import pytest
from serve_helpers import (
    SAMPLES,
    HealthWatch,
    ServerProcess,
    sample_server,
    saxpy_binary_request,
)

pytestmark = pytest.mark.timeout(180)

MB = 1 << 20
HEALTH = b"GET /v2/health/live HTTP/1.1\r\n\r\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with sample_server(tmp_path_factory.mktemp("probes_hostile"), ("saxpy",),
                       "--max-connections", "300", "--send-timeout", "2",
                       "--request-body-timeout", "2", "--request-head-timeout", "3",
                       "--client-memory-limit", "96M") as server:
        yield server


def _metric(server: ServerProcess, name: str) -> float:
    return server.metrics()[(name, ())]


def _held(server: ServerProcess) -> float:
    return _metric(server, "tinyhal_client_memory_held_bytes")


def _stalls(server: ServerProcess) -> float:
    """How many times so far the event loop stalled over 50 ms (its lag histogram)."""
    metrics = server.metrics()
    bucket = "tinyhal_event_loop_lag_seconds_bucket"
    return metrics[(bucket, (("le", "+Inf"),))] - metrics[(bucket, (("le", "0.05"),))]


def _wait_for(condition, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _connect(server: ServerProcess, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", server.port))
    return sock


def _flood_without_reading(server: ServerProcess, count: int, flood: bytes,
                           socks: list[socket.socket]) -> None:
    """`count` connections (appended to `socks`) that each send as much of `flood` as the
    socket takes at once and never read (a 4 KiB receive buffer)."""
    for _ in range(count):
        sock = _connect(server, receive_buffer=4096)
        sock.setblocking(False)
        try:
            sock.send(flood)
        except OSError:
            pass
        socks.append(sock)


def _reset(sock: socket.socket) -> None:
    """Closes with a reset (RST) rather than a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _read_answers(sock: socket.socket, count: int) -> list[int]:
    """The statuses of the next `count` answers on `sock` (Content-Length framed)."""
    statuses, buffer = [], b""
    while len(statuses) < count:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            chunk = sock.recv(1 << 20)
            assert chunk, f"closed after {len(statuses)} of {count} answers"
            buffer += chunk
            continue
        head = buffer[:end].decode("latin-1").lower()
        length = int(head.split("content-length: ", 1)[1].split("\r", 1)[0])
        while len(buffer) < end + 4 + length:
            chunk = sock.recv(1 << 20)
            assert chunk, f"closed inside answer {len(statuses) + 1} of {count}"
            buffer += chunk
        statuses.append(int(head.split(" ", 2)[1]))
        buffer = buffer[end + 4 + length:]
    return statuses


def _large_saxpy() -> bytes:
    """A saxpy request of 1 Mi elements (8 MiB of binary inputs, a JSON answer of ~10 MB)."""
    n = 1 << 20
    body, header_length = saxpy_binary_request(
        np.linspace(0.001, 1.0, n, dtype=np.float32).tobytes(), n)
    return (f"POST /v2/models/saxpy/infer HTTP/1.1\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {header_length}\r\n\r\n").encode() + body


_SMALL_INFER = json.dumps({"inputs": [
    {"name": "alpha", "datatype": "FP32", "shape": [1], "data": [2.0]},
    {"name": "x", "datatype": "FP32", "shape": [3], "data": [1.0, 2.0, 3.0]},
    {"name": "y", "datatype": "FP32", "shape": [3], "data": [1.0, 1.0, 1.0]}]}).encode()


def test_thousands_of_pipelined_requests_in_one_segment_are_answered_in_order(server):
    """Tiny requests, infer bodies (some chunked, some over 4 KiB) and heads cut at odd
    places all in one stream: every one answered, in order, with its own status."""
    infer = (b"POST /v2/models/saxpy/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n%b"
             % (len(_SMALL_INFER), _SMALL_INFER))
    chunked = (b"POST /v2/models/saxpy/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"%x\r\n%b\r\n0\r\n\r\n" % (len(_SMALL_INFER), _SMALL_INFER))
    padded = b"GET /v2/health/live HTTP/1.1\r\nX-Pad: " + b"p" * 5000 + b"\r\n\r\n"
    missing = b"GET /v2/models/nothing_here HTTP/1.1\r\n\r\n"
    pattern = [HEALTH] * 40 + [infer, chunked, padded, missing]
    expected = [200] * 40 + [200, 200, 200, 404]
    stream = b"".join(pattern * 50)
    with _connect(server) as sock:
        sock.sendall(stream)
        assert _read_answers(sock, len(expected) * 50) == expected * 50


def test_non_reading_pipelining_clients_hold_a_few_requests_each(server):
    """100 clients each pipeline 8,192 requests in 256 KiB and read nothing: a connection
    parses a slice of what it read at a time, so it holds tens of KiB (not thousands of
    parsed requests), the loop never stalls on a flood, health is served throughout and
    the memory goes back once they leave."""
    flood = HEALTH * ((256 << 10) // len(HEALTH))
    baseline = server.settled_rss()
    stalls = _stalls(server)
    watch = HealthWatch(server, timeout=20, pause=0.05)
    socks: list[socket.socket] = []
    try:
        _flood_without_reading(server, 100, flood, socks)
        time.sleep(2)
        held = server.rss() - baseline
    finally:
        for sock in socks:
            sock.close()
    watch.stop()
    after = server.settled_rss(2.0) - baseline
    # unbounded, each connection held ~2,000 parsed requests of ~250 bytes: +50 MB
    # while they held on, never given back, and a loop stalled for hundreds of ms
    assert held < 24 * MB, f"{held >> 20} MB held for 100 pipelining clients"
    assert after < 16 * MB, f"{after >> 20} MB kept after they left"
    assert _stalls(server) == stalls, "the loop stalled over 50 ms"


def test_bodies_of_one_byte_chunks_from_many_clients_never_stall_the_loop(server):
    """50 clients at once each send a chunked body of 60,000 one-byte chunks (each chunk
    is a parser callback or three): a connection parses a bounded number of lines per
    turn, so the loop's longest stall stays under 50 ms (on the base commit: 656 ms for
    100 such clients) and every body is answered (400: it is no JSON)."""
    data = (b"POST /v2/models/saxpy/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"1\r\nx\r\n" * 60000 + b"0\r\n\r\n")
    stalls = _stalls(server)
    socks = [_connect(server) for _ in range(50)]
    try:
        senders = [threading.Thread(target=sock.sendall, args=(data,)) for sock in socks]
        for sender in senders:
            sender.start()
        assert server.request("GET", "/v2/health/live", timeout=30)[0] == 200
        for sender in senders:
            sender.join(timeout=60)
        assert [_read_answers(sock, 1) for sock in socks] == [[400]] * 50
    finally:
        for sock in socks:
            sock.close()
    assert _stalls(server) == stalls, "the loop stalled over 50 ms"


def _loop_cpu(server: ServerProcess) -> float:
    """CPU seconds of the server's main thread: the one running the event loop."""
    with open(f"/proc/{server.proc.pid}/task/{server.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


@pytest.mark.parametrize("start", [
    b"GET /",
    b"POST /v2/models/saxpy/infer HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n",
], ids=["head", "body"])
def test_requests_dripping_a_byte_at_a_time_cost_the_loop_a_few_reads(server, start):
    """200 clients send their heads (or bodies) a byte every few milliseconds: past a few
    waits that brought little, the loop reads after pauses, taking what arrived
    meanwhile, so its CPU per byte dripped is a fraction of a read (on the base commit
    23-29 us a byte: 200 such clients took a third of the loop); each gets its 408 (at the
    head timeout, or once its body stalls)."""
    socks = [_connect(server) for _ in range(200)]
    dripped = 0
    try:
        for sock in socks:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(start)
        before = _loop_cpu(server)
        deadline = time.monotonic() + 2.5  # within the fixture's 3 s head timeout
        while time.monotonic() < deadline:
            for sock in socks:
                sock.send(b"a")
                dripped += 1
            time.sleep(0.005)
        spent = _loop_cpu(server) - before
        assert [_read_answers(sock, 1) for sock in socks] == [[408]] * 200
    finally:
        for sock in socks:
            sock.close()
    assert dripped > 10000
    assert spent / dripped < 12e-6, f"{spent / dripped * 1e6:.1f} us of the loop per byte"


def test_resets_at_every_phase_leave_nothing_held(server):
    """Connections reset mid-head, mid-body (a large declared body is charged when its
    head is read), while their request runs and mid-answer: the budget is back at zero
    and the memory back within 16 MB of where it was."""
    request = _large_saxpy()
    head_end = request.index(b"\r\n\r\n") + 4
    baseline = server.settled_rss()
    for phase in ("head", "body", "executing", "answer"):
        for _ in range(8):
            sock = _connect(server)
            if phase == "head":
                sock.sendall(request[:head_end // 2])
            elif phase == "body":
                sock.sendall(request[:head_end + (len(request) - head_end) // 2])
            else:
                sock.sendall(request)
                if phase == "answer":
                    sock.recv(65536)
            time.sleep(0.02)
            _reset(sock)
        _wait_for(lambda: _held(server) == 0, what=f"bytes held after resets ({phase})")
    assert server.status_bytes("VmRSS") - baseline < 16 * MB or \
        server.settled_rss(2.0) - baseline < 16 * MB
    assert server.request("GET", "/v2/health/live")[0] == 200


def test_heads_declaring_large_bodies_hold_nothing_until_the_bytes_come(server):
    """Twelve heads declaring 60 MB bodies (with Expect: 100-continue) and sending none:
    only bytes that arrive are charged and allocated, so they hold neither memory nor
    the budget (on the base commit: +480 MB of RSS and the budget, for the whole body
    timeout), and a large request is served meanwhile."""
    baseline = server.settled_rss()
    heads = [_connect(server) for _ in range(12)]
    try:
        for sock in heads:
            sock.sendall(b"POST /v2/models/saxpy/infer HTTP/1.1\r\nContent-Length: %d\r\n"
                         b"Expect: 100-continue\r\n\r\n" % (60 * MB))
        assert all(sock.recv(100).startswith(b"HTTP/1.1 100 Continue") for sock in heads)
        assert _held(server) == 0
        assert server.rss() - baseline < 16 * MB
        with _connect(server) as sock:
            sock.sendall(_large_saxpy())
            assert _read_answers(sock, 1) == [200]
    finally:
        for sock in heads:
            sock.close()


def test_uploads_trickling_to_keep_the_budget_make_way_for_a_client(server):
    """Two uploads send 40 MB of their 48 MB, then a byte every half second (never
    stalling for the 2 s body timeout), holding 80 MB of the 96 MB budget: a client
    declaring 40 MB is refused (503) and the trickling upload that waited longest is
    closed, so its retry is taken (on the base commit the tricklers hold the budget for
    as long as they keep going)."""
    declaring = b"POST /v2/models/saxpy/infer HTTP/1.1\r\nContent-Length: 48000000\r\n\r\n"
    tricklers = [_connect(server) for _ in range(2)]
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.5):
            for sock in tricklers:
                try:
                    sock.send(b"x")
                except OSError:
                    pass

    dripper = threading.Thread(target=trickle)
    try:
        for sock in tricklers:
            sock.sendall(declaring + b"x" * 40_000_000)
        dripper.start()
        _wait_for(lambda: _held(server) >= 79e6, what="the uploads to be charged")
        time.sleep(3)  # a few small reads each: trickling now (uploads at speed stay)
        client = (b"POST /v2/models/saxpy/infer HTTP/1.1\r\nContent-Length: 40000000\r\n"
                  b"\r\n")
        with _connect(server) as sock:
            sock.sendall(client)
            assert _read_answers(sock, 1) == [503]
        _wait_for(lambda: _held(server) < 50e6, what="the longest-waiting upload to go")
        with _connect(server) as sock:
            sock.sendall(client + b"x" * 40_000_000)
            assert _read_answers(sock, 1) == [400]  # taken whole: it is no JSON
    finally:
        stop.set()
        if dripper.is_alive():
            dripper.join(timeout=10)
        for sock in tricklers:
            sock.close()
    _wait_for(lambda: _held(server) == 0, what="the uploads' bytes")
    assert "closing the upload that waited longest" in server.wait_stderr("waited longest")


def test_half_closed_clients_get_their_answers(server):
    """A client that shuts its sending side down after its request (as `nc -N` does)
    still reads the answer, small or large."""
    for request in (HEALTH, _large_saxpy()):
        with _connect(server) as sock:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
            assert _read_answers(sock, 1) == [200]


def test_idle_connections_at_the_cap_and_an_accept_storm_leave_clients_served(server):
    """300 keep-alive connections idle at --max-connections, then connections opened and
    reset as fast as one client can for two seconds: new clients are served all along
    (the oldest idle connection makes way) and nothing is left held."""
    idle = [_connect(server) for _ in range(300)]
    try:
        time.sleep(0.3)
        for _ in range(5):
            assert server.request("GET", "/v2/health/live", timeout=20)[0] == 200
        watch = HealthWatch(server, timeout=20, pause=0.05)
        stormed, deadline = 0, time.monotonic() + 2
        while time.monotonic() < deadline:
            sock = socket.socket()
            sock.connect(("127.0.0.1", server.port))
            _reset(sock)
            stormed += 1
        watch.stop()
    finally:
        for sock in idle:
            sock.close()
    assert stormed > 100
    assert _held(server) == 0


def test_every_failing_request_gives_its_charge_back(server):
    """Requests that fail in each way the budget sees, many times over: 413 declared or
    received over the limit, 503 beyond the budget, 400 for bad JSON, a shape the model
    refuses and a malformed gzip body (all over 64 KiB, so charged), 415 for an unknown
    coding, 408 for a stalled body. Afterwards nothing is held."""
    refused_before = _metric(server, "tinyhal_client_memory_refused_total")
    big_json = b'{"inputs": [' + b" " * (200 << 10) + b"}"
    rows = ",".join(["0.5"] * 40000).encode()
    bad_shape = (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [7, 7], '
                 b'"data": [' + rows + b"]}]}")
    bad_gzip = gzip.compress(b'{"inputs": []}' + b" " * (4 << 20))[:-9]

    def post(body: bytes, extra: str = "") -> bytes:
        return (f"POST /v2/models/saxpy/infer HTTP/1.1\r\nContent-Length: {len(body)}\r\n"
                f"{extra}\r\n").encode() + body

    cases = [
        ((b"POST /v2/models/saxpy/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n"
          % ((64 << 20) + 1)) + b"x" * 1000, 413),
        ((b"POST /v2/models/saxpy/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
          b"4000001\r\n" + b"x" * (5 << 20)), 413),
        (post(big_json), 400),
        (post(bad_shape), 400),
        (post(bad_gzip, "Content-Encoding: gzip\r\n"), 400),
        (post(b"x" * (100 << 10), "Content-Encoding: br\r\n"), 415),
    ]
    for data, status in cases:
        for _ in range(5):
            with _connect(server) as sock:
                try:
                    sock.sendall(data)
                except OSError:
                    pass
                answer = sock.recv(65536)
            assert answer.split(b" ", 2)[1] == str(status).encode(), (status, answer[:300])
    # two uploads declaring 48 MB stall after 40 MB (charged as they arrive): a third
    # declaring as much is beyond what the budget has left (503 at once); a stalled
    # upload gets its 408, or is closed to make way once it stalled for a second
    declaring = b"POST /v2/models/saxpy/infer HTTP/1.1\r\nContent-Length: 48000000\r\n\r\n"
    stalled = [_connect(server) for _ in range(2)]
    for sock in stalled:
        sock.sendall(declaring + b"x" * 40_000_000)
        time.sleep(0.1)
    _wait_for(lambda: _held(server) >= 79e6, what="the stalled uploads to be charged")
    with _connect(server) as sock:
        sock.sendall(declaring + b"x" * 1000)
        assert sock.recv(65536).split(b" ", 2)[1] == b"503"
    for sock in stalled:
        answer = sock.recv(65536)
        assert answer == b"" or answer.split(b" ", 2)[1] == b"408", answer[:100]
        sock.close()
    _wait_for(lambda: _held(server) == 0, what="every charge to be given back")
    assert _metric(server, "tinyhal_client_memory_refused_total") >= refused_before + 1


def test_evicting_non_reading_clients_gives_their_answers_memory_back(tmp_path):
    """Eight clients that read nothing of their 10 MB answers, at --max-connections 9
    (the send timeout is long): once the cap is reached, each new connection evicts
    one, oldest first, and what the evicted held goes back to the budget at once, not
    after the send timeout."""
    with sample_server(tmp_path, ("saxpy",), "--max-connections", "9",
                       "--send-timeout", "60") as server:
        request = _large_saxpy()
        stuck = [_connect(server, receive_buffer=4096) for _ in range(8)]
        try:
            for sock in stuck:
                sock.sendall(request)
            held = [0.0]

            def settled() -> bool:  # every answer made and stuck: the figure stops moving
                held.append(_held(server))
                return held[-1] == held[-2] == held[-3] > 8 * 8 * MB

            _wait_for(settled, what="the answers to be held")
            newcomers = [_connect(server) for _ in range(9)]
            _wait_for(lambda: _held(server) == 0, timeout=10, what="evicted answers' bytes")
            for sock in newcomers:
                sock.close()
            assert server.request("GET", "/v2/health/live", timeout=20)[0] == 200
        finally:
            for sock in stuck:
                sock.close()


def test_pipelining_floods_at_the_descriptor_limit_leave_clients_served(tmp_path):
    """At a limit of 128 open files, 200 clients pipelining floods they never read:
    new clients are served (the oldest stuck connections make way) and nothing stays
    held once the floods end."""
    for sample in ("saxpy",):
        shutil.copytree(SAMPLES / sample, tmp_path / sample)
    server = ServerProcess("--model-repository", str(tmp_path), "--send-timeout", "3",
                           open_files=128).start()
    flood = HEALTH * 8192
    socks: list[socket.socket] = []
    try:
        _flood_without_reading(server, 200, flood, socks)
        for _ in range(10):
            assert server.request("GET", "/v2/health/live", timeout=20)[0] == 200
            status, _, _ = server.request("POST", "/v2/models/saxpy/infer", _SMALL_INFER,
                                          timeout=20)
            assert status == 200
    finally:
        for sock in socks:
            sock.close()
    try:
        _wait_for(lambda: _held(server) == 0, what="the floods' bytes")
    finally:
        server.stop()
