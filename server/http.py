"""HTTP/1.1 for `tinyhal-serve`: httptools (llhttp, Node's parser) driven on trio streams.

One trio task per connection runs a small loop: httptools parses the bytes the socket
delivers (request line, headers, Content-Length or chunked bodies, keep-alive, pipelined
requests; all parsing is llhttp's), the handler turns each `Request` into a `Response`, and
the loop writes the status line, headers and body. The connection stays open for the next
request until `keep_alive_timeout` of idleness. Nothing sits between the socket and the
handler: no ASGI, no routing framework, no per-request middleware stack. (h11 did the same
job at about 150 us of Python per request; llhttp does it in a few.)

A handler that waits long can ask whether its client is still there: the function
`client_gone_probe()` returns (the probe of the connection its task serves) tells,
without reading, whether the peer closed or reset the connection, which the loop itself
only sees when it next reads.

Versions: HTTP/1.1 and 1.0 (a request line of any other is answered 505). An HTTP/1.0
client that asks for keep-alive is told so in the answer (`connection: keep-alive`); its
`Expect: 100-continue` is ignored and a Transfer-Encoding in its request is faulty
framing (400), as RFC 9110 and 9112 say.

Draining (`HttpServer.drain()`): connections already made but not yet accepted are
accepted, then the listeners close (new connections are refused); every answer from then
on says `Connection: close`, and a connection idle between requests closes once it has
stayed idle for `_DRAIN_IDLE_GRACE` seconds since the drain began. A request a client sent
before it could see the drain is so read and answered (by the handler, which knows the
server drains), never cut by a reset: closing a socket with unread bytes resets it, and a
client whose request met a reset cannot tell whether it ran.
"""

from __future__ import annotations

import contextvars
import errno
import logging
import os
import select
import socket
import threading
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools
import trio

from .budget import SMALL_BYTES, BudgetExceeded, Hold, MemoryBudget

log = logging.getLogger("tinyhal.server")

__all__ = ["DirectReply", "HttpServer", "Request", "Response", "client_gone_probe"]

_READ_SIZE = 64 << 10
_MAX_HEAD_BYTES = 64 << 10
# What one turn of a connection parses is bounded: the parser's work, in Python
# callbacks, is about one call per line (a request line, a header, a chunk's size line),
# so a read of 64 KiB of tiny pipelined requests or 1-byte chunks was thousands of calls
# (milliseconds of the loop in one step; for requests, ~8 bytes of objects per byte sent,
# all made before the first is answered). A read is fed at most `_HEAD_SLICE_BYTES` at a
# time where heads are parsed, and at most `_MAX_LINES` lines at a time of a chunked
# body; the body of a declared length is fed at once up to its end (it costs one call).
# The rest waits, as bytes, for the connection's next turn (after the requests parsed
# before it were answered).
_HEAD_SLICE_BYTES = 2 << 10
_MAX_LINES = 256
# A request arrives in segments of hundreds of bytes or more; one that keeps coming a
# byte at a time costs the loop a wake-up, a read and a timer per byte (200 clients
# dripping their heads took a third of it). Past `_SLOW_READS` waits in a row for more of
# one request that each brought less than `_SMALL_READ` bytes, each further read comes
# after a pause, doubling from 50 ms up to 0.5 s, and takes whatever arrived meanwhile
# (a head or body sent that slowly costs a few reads a second, not one per byte); a wait
# that brings more ends the pauses.
_SLOW_READS = 4
_SMALL_READ = 1024
_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.5)
# an upload that brought nothing for this long counts as stalled (see `_relieve`)
_STALLED = 1.0
# chunks of one chunked body at most (Triton's bound): llhttp calls back per chunk
_MAX_CHUNKS = 65536
# pieces of a small body kept apart at most: beyond, they are joined into one bytearray
# (a body of 1-byte chunks would otherwise cost ~35 bytes of objects per byte)
_MAX_PIECES = 16
_COALESCE_BYTES = 64 << 10
_LINGER_SECONDS = 1.0
_LINGER_BYTES = 16 << 20
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# how long a connection idle during a drain may still bring a request: a client that sent
# one just as the drain began has it answered (the answer closes the connection)
_DRAIN_IDLE_GRACE = 1.0
# peer closed (its FIN: POLLRDHUP, Linux), reset or failed; data waiting is not "gone"
_GONE_EVENTS = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR
_client_gone: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "tinyhal_client_gone", default=None)


def client_gone_probe() -> Callable[[], bool] | None:
    """For a handler's task: a function telling, at once and without reading, whether
    the client of the request being handled closed or reset its connection (a client
    that only shut down its sending side counts as gone); None outside a connection."""
    return _client_gone.get()


def _gone_probe(stream: trio.SocketStream) -> Callable[[], bool]:
    fd = stream.socket.fileno()

    def gone() -> bool:
        if stream.socket.fileno() != fd:  # closed here
            return True
        poller = select.poll()
        poller.register(fd, _GONE_EVENTS)
        return bool(poller.poll(0))

    return gone


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


class DirectReply:
    """Lets a thread other than the event loop answer one request by writing the response
    straight to the connection's socket, so the client has its answer without waiting
    for the loop to wake up (an instance thread answers the requests of the execution it
    just ran).

    Exactly one response goes out per request, whoever sends it: `send` (any thread)
    writes only while the reply is open, and the connection closes it (`close`, on the
    loop, under the same lock) as soon as the handler returned, before it sends anything
    itself or the socket can close; a response already sent wins over the one the
    handler returned (say, a 504 at the deadline). A write the socket does not take
    whole leaves the rest for the loop to send. Only responses up to 64 KiB are written
    this way (bigger ones are the loop's, without a copy)."""

    __slots__ = ("_fd", "_lock", "_open", "_server", "_keep_alive", "keep_alive", "sent",
                 "rest", "broken")

    def __init__(self, fd: int, keep_alive: bool, server: HttpServer) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._open = True
        self._server = server
        self._keep_alive = keep_alive
        self.keep_alive = keep_alive
        self.sent: Response | None = None  # the response that went out this way
        self.rest = b""  # what the socket did not take (the loop sends it)
        self.broken = False  # the write failed: the connection is gone

    def send(self, response: Response) -> bool:
        """Writes `response` unless the connection already answered or its reply is too
        big; True when it is this request's answer (the loop sends any rest)."""
        if len(response.body) > _COALESCE_BYTES:
            return False
        with self._lock:
            if not self._open:
                return False
            self._server._count_direct()  # before the client can see it (see `settle`)
            keep_alive = self._keep_alive if not self._server.draining else False
            data = _encode_head(response, keep_alive) + response.body
            try:
                written = os.write(self._fd, data)
            except BlockingIOError:
                written = 0
            except OSError:
                self.broken = True
                written = len(data)
            self.rest = data[written:]
            self.keep_alive = keep_alive
            self.sent = response
            self._open = False
            return True

    def close(self) -> None:
        """No thread writes to the socket after this returns (on the loop)."""
        with self._lock:
            self._open = False


@dataclass
class Request:
    method: str
    path: str  # without the query string
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    arrived: float  # trio clock, when the request head was complete
    direct: DirectReply | None = None  # another thread may answer it (see DirectReply)
    target: str = ""  # the request target as sent (path and query)
    # what it holds charged to the memory budget (its body, when large; the handler adds
    # what it inflates and parses): released by the connection once it is answered
    held: Hold | None = None


Handler = Callable[[Request], Awaitable[Response]]
ErrorResponder = Callable[[int, str], Response]


class _Message:
    __slots__ = ("method", "target", "headers", "body", "size", "too_large", "keep_alive",
                 "arrived", "head_done", "read_on", "buffer", "held", "refused", "declared")

    def __init__(self) -> None:
        self.method = ""
        self.target = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.too_large = False
        # a large body is read into one buffer grown as it arrives (charged to the
        # budget by `held` before each piece is added): no pieces to join, one block
        self.buffer: bytearray | None = None
        self.held: Hold | None = None
        self.refused = ""  # why the memory budget refused its body (answered 503)
        self.keep_alive = True
        self.arrived = 0.0
        self.head_done = False
        self.declared = -1  # its Content-Length, once its head is read (-1: none, chunked)
        self.read_on = False  # the rest of its body was read without waiting once


class _Callbacks:
    """httptools' parser callbacks: collect complete messages in `done`."""

    def __init__(self, max_body: int, fd: int, budget: MemoryBudget | None,
                 relieve: Callable[[_Callbacks], None] | None = None) -> None:
        self.max_body = max_body
        self.budget = budget
        self.relieve = relieve  # told when the budget refused this connection's body
        self.fd = fd  # the connection's socket
        self.parser: httptools.HttpRequestParser | None = None
        self.current: _Message | None = None
        self.head_bytes = 0
        self.done: deque[_Message] = deque()
        self.expect_continue = False
        self.head_too_large = False
        self.malformed = ""  # why a callback stopped the parser (answered 400)
        self.unsupported_version = ""  # the request's, when not 1.x (answered 505)
        self.chunks = 0  # chunks of the body in progress
        # the parser's error, kept until the complete requests before it were answered
        self.failed: httptools.HttpParserError | None = None
        self.chunk_from = -1  # where the chunk whose size line was just read starts
        self.trailer_bytes = 0  # trailer fields of the body in progress (dropped)
        self.head_raw = 0  # bytes received for the head in progress
        self.slow_reads = 0  # waits in a row that brought little (see _SLOW_READS)
        self.head_deadline = 0.0
        self.raw_headers: list[bytes] = []  # name, value, name, ... of the head in progress
        # the last head's raw headers, their size and their dict: a keep-alive client
        # usually sends the same headers every time, decoded once (the dicts are shared:
        # handlers only read them)
        self.last_raw: list[bytes] | None = None
        self.last_raw_bytes = 0
        self.last_headers: dict[str, str] = {}
        self.says_connection = False  # whether the last head has a Connection header
        self.received = 0.0  # trio clock: when the bytes being parsed were read
        # bytes read but not parsed yet (see `_MAX_LINES`): fed before reading more
        self.unfed: bytes | None = None

    def on_message_begin(self) -> None:
        self.current = _Message()
        self.head_bytes = 0
        self.head_raw = 0
        self.slow_reads = 0
        self.raw_headers = []
        self.chunks = self.trailer_bytes = 0

    def on_url(self, url: bytes) -> None:
        self.current.target += url
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # counted and decoded once the head is complete (a head in progress is bounded
        # by the bytes received for it, `head_raw`)
        self.raw_headers += (name, value)

    def on_headers_complete(self) -> None:
        message = self.current
        raw, self.raw_headers = self.raw_headers, []
        if raw == self.last_raw:
            raw_bytes, headers = self.last_raw_bytes, self.last_headers
        else:
            raw_bytes = sum(map(len, raw))
            headers = None
        if self.head_bytes + raw_bytes > _MAX_HEAD_BYTES:
            self.head_too_large = True
            raise httptools.HttpParserError("request head too large")
        if headers is None:
            headers = _header_dict(raw)
            coding = headers.get("transfer-encoding")
            if coding is not None and coding.strip().lower() != "chunked":
                # llhttp takes "gzip, chunked" as chunked: the other codings would be
                # silently ignored (a head that passed is the one kept below)
                self.malformed = (f"Transfer-Encoding '{coding[:100]}' is not supported "
                                  f"(only chunked; compress with Content-Encoding)")
                raise httptools.HttpParserError(self.malformed)
            self.last_raw, self.last_raw_bytes, self.last_headers = raw, raw_bytes, headers
            self.says_connection = "connection" in headers  # the same for the same headers
        message.headers = headers
        method = self.parser.get_method()
        message.method = _METHODS.get(method) or method.decode("latin-1")
        message.arrived = self.received
        message.head_done = True
        length = message.headers.get("content-length", "")
        declared = message.declared = int(length) if length.isdigit() else -1
        if declared > self.max_body:
            message.too_large = True  # answered 413 at once, before any body is read
            return
        if declared > SMALL_BYTES and self.budget is not None:
            # refused at once when the budget could not take it now (before the client
            # sends it); charged as it arrives (see `on_body`)
            try:
                self.budget.check(declared - SMALL_BYTES, "the request body")
            except BudgetExceeded as exc:
                message.refused = str(exc)
                if self.relieve is not None:
                    self.relieve(self)
                return
        if message.headers.get("expect", "").lower() == "100-continue" and \
                self.parser.get_http_version() != "1.0":  # RFC 9110 10.1.1: 1.0 ignores it
            self.expect_continue = True

    def _charge(self, message: _Message, nbytes: int) -> bool:
        """Charges `nbytes` of `message`'s body to the budget; False (and the message
        marked refused, its body dropped) when the budget cannot take them."""
        if message.held is None:
            message.held = self.budget.hold()
        try:
            message.held.charge(nbytes, "the request body")
        except BudgetExceeded as exc:
            message.refused = str(exc)
            message.body.clear()
            message.buffer = None
            if self.relieve is not None:
                self.relieve(self)
            return False
        return True

    def on_body(self, body: bytes) -> None:
        message = self.current
        if message.refused:
            return
        start = message.size
        message.size = end = start + len(body)
        if end > self.max_body:
            message.too_large = True
            message.body.clear()
            message.buffer = None
        elif end > SMALL_BYTES and self.budget is not None:
            # a body beyond what every connection may hold: charged as it arrives (a
            # head declaring 60 MB holds nothing until the bytes come), grown in place
            # (one block: no pieces to join, unmapped when freed; glibc grows a mapped
            # block by remapping it, without a copy)
            if not self._charge(message, end - max(start, SMALL_BYTES)):
                return
            if message.buffer is None:
                message.buffer = bytearray().join(message.body)
                message.body = []
            message.buffer += body
        else:
            pieces = message.body
            pieces.append(body)
            if len(pieces) > _MAX_PIECES:
                joined = pieces[0]
                if type(joined) is not bytearray:
                    joined = bytearray(joined)
                joined += b"".join(pieces[1:])
                message.body = [joined]

    def on_chunk_header(self) -> None:
        self.chunks += 1
        if self.chunks > _MAX_CHUNKS + 1:  # the last, empty chunk is not counted
            self.malformed = (f"chunked request body exceeds {_MAX_CHUNKS} chunks; send "
                              f"fewer, larger chunks")
            raise httptools.HttpParserError(self.malformed)
        self.chunk_from = self.current.size  # the body's size where this chunk starts

    def on_chunk_complete(self) -> None:
        self.chunk_from = -1

    def chunk_declared_too_large(self, data: bytes) -> bool:
        """Whether the chunk whose size line ended in `data` (the bytes just parsed) and
        whose data is still arriving declared more than the body may hold: refused when
        its size line is read, not once its bytes arrived (httptools does not pass the
        size on; the line ends where the chunk's bytes received so far begin)."""
        message, start = self.current, self.chunk_from
        if start < 0 or message is None or message.refused:
            return False
        self.chunk_from = -1  # looked at once, in the read its size line ended in
        end = len(data) - (message.size - start) - 2  # before its CRLF
        line = data[data.rfind(b"\n", 0, end) + 1:end].split(b";", 1)[0].strip()
        try:
            return start + int(line, 16) > self.max_body
        except ValueError:
            return False

    def on_message_complete(self) -> None:
        message, self.current = self.current, None
        keep_alive = self.parser.should_keep_alive()
        if not keep_alive or self.says_connection:  # (HTTP/1.1's default: neither)
            version = self.parser.get_http_version()
            if version == "1.0":
                if "transfer-encoding" in message.headers:  # RFC 9112 6.1
                    self.malformed = ("Transfer-Encoding in an HTTP/1.0 request: its "
                                      "framing is faulty (HTTP/1.0 has no chunked bodies)")
                    raise httptools.HttpParserError(self.malformed)
                if keep_alive:  # a 1.0 client keeps the connection only when the answer
                    keep_alive = _KEEP_ALIVE_SAID  # says so (RFC 9112 9.3)
            elif version[:2] != "1.":  # HTTP/2.0, HTTP/0.9...
                self.unsupported_version = version
                self.malformed = (f"HTTP/{version} is not supported: this server speaks "
                                  f"HTTP/1.1 (and 1.0)")
                raise httptools.HttpParserError(self.malformed)
        message.keep_alive = keep_alive
        self.done.append(message)


class HttpServer:
    """Serves `handler` on trio listeners until `drain()`.

    Work before a request reaches the handler is bounded: a connection's turn parses a
    bounded part of what it read (see `_HEAD_SLICE_BYTES`), a request arriving in tiny
    pieces is read after pauses (see `_SLOW_READS`), the head must arrive within
    `head_timeout` of its first byte and at most 64 KiB of it (431 beyond, counted while
    it arrives), a body may pause at most `body_timeout` (408 for either), a declared or
    received body over `max_body` is 413 at once (`Expect: 100-continue` included), a
    large body the memory `budget` cannot take is 503 (and makes a stalled or trickling
    upload make way, see `_relieve`), an answer its client reads nothing of for
    `send_timeout` is dropped with the connection, and at most `max_connections` are
    open: at the cap a new connection closes the oldest one that is idle, between
    requests, still sending its request or waiting for its client to read (slowloris and
    non-reading clients go first), or is refused with 503 when every connection has a
    request being handled. Reaching the cap is logged.
    """

    def __init__(self, handler: Handler, error: ErrorResponder, *, max_body: int,
                 keep_alive_timeout: float = 5.0, access_log: bool = False,
                 head_timeout: float = 10.0, body_timeout: float = 30.0,
                 max_connections: int = 1000, send_timeout: float = 30.0,
                 budget: MemoryBudget | None = None) -> None:
        self.handler = handler
        self.budget = budget
        self.send_timeout = send_timeout
        self.error = error
        self.max_body = max_body
        self.keep_alive_timeout = keep_alive_timeout
        self.head_timeout = head_timeout
        self.body_timeout = body_timeout
        self.max_connections = max_connections
        self.access_log = access_log
        self.draining = False
        self._listeners: list[trio.SocketListener] = []
        # connections waiting for their next request -> since when (trio clock): the
        # idle sweep closes those idle longer than keep_alive_timeout, drain all of them
        self._idle: dict[trio.CancelScope, float] = {}
        self._sweep_wait = trio.CancelScope()  # the idle sweep's sleep (drain cuts it short)
        self._nursery: trio.Nursery | None = None  # the connections' (see `serve`)
        self._open = 0
        # connections idle, still sending their request or stuck writing an answer their
        # client does not read, the one waiting longest first (evicted at the cap); a
        # connection reading its request maps to its parser's callbacks (see `_relieve`)
        self._waiting: OrderedDict[trio.CancelScope, _Callbacks | None] = OrderedDict()
        self._relieved_logged = -1e9  # trio clock: when eviction for the budget was logged
        self._at_cap_logged = False
        # answers instance threads wrote (under the lock) and those the loop has finished
        self._direct_lock = threading.Lock()
        self._direct_written = 0
        self._direct_finished = 0
        self._settle_waiters: list[trio.Event] = []
        self._now: Callable[[], float] = trio.current_time  # the run's clock (see `serve`)

    async def serve(self, listeners: list[trio.SocketListener],
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Accepts connections until drained and every connection is closed."""
        self._listeners = listeners
        self._now = trio.lowlevel.current_clock().current_time  # read once per request
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for listener in listeners:
                nursery.start_soon(self._accept, listener, nursery)
            nursery.start_soon(self._sweep_idle)
            task_status.started()
        # the accept loops ended (drain); connection tasks finished with the nursery

    @property
    def open_connections(self) -> int:
        return self._open

    def _count_direct(self) -> None:
        with self._direct_lock:
            self._direct_written += 1

    def _finished_direct(self) -> None:
        self._direct_finished += 1
        waiters, self._settle_waiters = self._settle_waiters, []
        for event in waiters:
            event.set()

    async def settle(self, timeout: float = 5.0) -> None:
        """Returns once every answer an instance thread has written so far was finished on
        the loop too (its handler returned: metrics and statistics counted it), so what a
        client already saw is in what it reads next; waits at most `timeout` (long enough
        for a loop that a loaded machine slows many times over, short of a scrape's
        timeout)."""
        with self._direct_lock:
            target = self._direct_written
        with trio.move_on_after(timeout):
            while self._direct_finished < target:
                event = trio.Event()
                self._settle_waiters.append(event)
                await event.wait()

    def _idle_limit(self) -> float:
        return min(self.keep_alive_timeout, _DRAIN_IDLE_GRACE) if self.draining else \
            self.keep_alive_timeout

    async def _sweep_idle(self) -> None:
        """Closes connections idle for longer than they may be: `keep_alive_timeout`, in
        a drain `_DRAIN_IDLE_GRACE` (checked four times per limit, so one closes after 1 to
        1.25 times it): a connection waiting for its next request then needs no timer of
        its own, which would cost a cancel scope per request. Ends once a drain has seen
        every connection close."""
        while not self.draining or self._open:
            self._sweep_wait = trio.CancelScope()
            with self._sweep_wait:
                await trio.sleep(self._idle_limit() / 4)
            expired = trio.current_time() - self._idle_limit()
            for scope, since in list(self._idle.items()):
                if since <= expired:
                    scope.cancel()

    def drain(self) -> None:
        """Stops accepting (what the kernel already accepted for us is taken first);
        from now on every answer closes its connection, and idle connections close
        after the drain's idle grace counted from now (see the module's docstring)."""
        self.draining = True
        for listener in self._listeners:
            self._accept_backlog(listener)
            # closing the socket outright frees the port at once (no new SYN is accepted)
            listener.socket.close()
        began = trio.current_time()
        for scope in self._idle:
            self._idle[scope] = began
        self._sweep_wait.cancel()

    def _accept_backlog(self, listener: trio.SocketListener) -> None:
        """Starts a connection task for every connection waiting in `listener`'s accept
        queue (closing the listener would reset them, requests already sent included)."""
        if self._nursery is None:
            return
        try:
            backlog = socket.socket(fileno=os.dup(listener.socket.fileno()))
        except OSError:
            return
        with backlog:
            backlog.setblocking(False)
            while True:
                try:
                    accepted, _ = backlog.accept()
                except OSError:  # empty (EAGAIN), or out of descriptors: the rest reset
                    return
                self._admit(trio.SocketStream(trio.socket.from_stdlib_socket(accepted)),
                            self._nursery)

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while not self.draining:
            try:
                stream = await listener.accept()
            except (trio.ClosedResourceError, OSError) as exc:
                if self.draining:
                    return
                if getattr(exc, "errno", None) in (errno.EMFILE, errno.ENFILE):
                    self._evict_oldest(f"out of file descriptors ({exc.strerror})")
                await trio.sleep(0.01)  # back off, keep serving
                continue
            self._admit(stream, nursery)

    def _admit(self, stream: trio.SocketStream, nursery: trio.Nursery) -> None:
        """Serves an accepted connection, or at the cap evicts the oldest idle/slow one
        for it, or refuses it (503) when every connection is busy."""
        if self._open >= self.max_connections:
            if not self._evict_oldest(f"{self._open} connections open "
                                      f"(--max-connections)"):
                nursery.start_soon(self._refuse, stream)
                return
        elif self._open < self.max_connections * 9 // 10:
            self._at_cap_logged = False
        self._open += 1  # counted now: the next accept may come before the task starts
        nursery.start_soon(self._connection, stream)

    def _evict_oldest(self, why: str) -> bool:
        """Closes the oldest connection that is idle, still sending its request or waiting
        for its client to read an answer (logged once per episode); False when every
        connection has a request being handled."""
        if not self._at_cap_logged:
            self._at_cap_logged = True
            log.warning("%s: closing the oldest idle, slow or non-reading connections for "
                        "new clients", why)
        if not self._waiting:
            return False
        oldest, _ = self._waiting.popitem(last=False)
        oldest.cancel()
        return True

    def _relieve(self, refused: _Callbacks) -> None:
        """The memory budget refused a request body (503, Retry-After): closes, of the
        connections waiting for more of their request, the one holding body bytes that
        has waited longest among those that stalled (nothing for `_STALLED` seconds) or
        trickle (their last reads all small, see `_SLOW_READS`), so an upload kept just
        short of the body timeout does not keep the budget from every client for as
        long as it keeps going; the refused client's retry finds room. Uploads that
        arrive at speed are left alone (they are refused, not evicted)."""
        stalled = self._now() - _STALLED
        for scope, callbacks in self._waiting.items():
            if callbacks is None or callbacks is refused:
                continue
            message = callbacks.current
            if message is not None and message.held is not None and message.held.nbytes \
                    and (callbacks.received <= stalled or
                         callbacks.slow_reads > _SLOW_READS):
                del self._waiting[scope]  # (the iteration ends here)
                scope.cancel()
                now = trio.current_time()
                if now - self._relieved_logged > 10:
                    self._relieved_logged = now
                    log.warning("client memory budget exhausted: closing the upload that "
                                "waited longest for its client (%d bytes held)",
                                message.held.nbytes)
                return

    async def _refuse(self, stream: trio.SocketStream) -> None:
        with trio.move_on_after(1):
            await self._send_error(stream, 503, "too many connections; retry later")
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()

    async def _connection(self, stream: trio.SocketStream) -> None:
        callbacks = _Callbacks(self.max_body, stream.socket.fileno(), self.budget,
                               self._relieve)
        parser = callbacks.parser = httptools.HttpRequestParser(callbacks)
        _client_gone.set(_gone_probe(stream))  # this task's context: its handlers see it
        scope = trio.CancelScope()
        request = message = response = unsent = None
        try:
            with scope:
                while True:  # until an answer closes it, or its client or a timeout does
                    if not callbacks.done:
                        self._waiting[scope] = callbacks
                        try:
                            if not await self._receive(stream, parser, callbacks, scope):
                                break
                        finally:
                            self._waiting.pop(scope, None)
                        continue
                    message = callbacks.done.popleft()
                    if message.too_large or message.refused:
                        await self._send_refusal(stream, message)
                        break
                    request = self._request(message, callbacks.fd)
                    direct = request.direct
                    try:
                        response = await self.handler(request)
                    finally:
                        if direct is not None:
                            direct.close()
                            if direct.sent is not None:
                                self._finished_direct()
                    keep_alive, unsent = self._reply(message, response, direct, callbacks.fd)
                    if unsent and not await self._send_rest(unsent, callbacks.fd, scope,
                                                            request):
                        break
                    if self.access_log:
                        self._log_access(stream, message, request, response, direct)
                    if request.held is not None:
                        unsent = response = None
                        _release(message, request)
                    if not keep_alive:
                        break
                    if direct is None or direct.sent is None:
                        # the loop answered: the client sends its next request only now,
                        # so the tasks already ready run first (other connections, the
                        # batch that takes what this pass read) and the next read here
                        # usually finds the request instead of waiting on epoll for it.
                        # Its request answered, the connection may be evicted meanwhile
                        # (a client pipelining and reading as slowly as it may would
                        # otherwise look busy whenever the cap is reached)
                        self._waiting[scope] = None
                        try:
                            await trio.lowlevel.checkpoint()
                        finally:
                            self._waiting.pop(scope, None)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass
        except Exception:  # a bug of ours must cost one connection, never the server
            log.exception("connection failed")
        finally:
            self._open -= 1
            if self.draining and not self._open:
                self._sweep_wait.cancel()  # the drain is over: the sweep ends now
            self._waiting.pop(scope, None)
            # whatever ended it (an answer, a timeout, a client gone, eviction), what its
            # requests held goes back to the budget
            response = unsent = None  # dropped before the memory goes back
            for pending in (message, callbacks.current, *callbacks.done):
                if pending is not None:
                    _release(pending, None)
            if request is not None:
                _release(None, request)
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    await stream.aclose()

    async def _send_rest(self, chunks: list[bytes], fd: int, scope: trio.CancelScope,
                         request: Request) -> bool:
        """Writes what the socket did not take of an answer; False when the connection
        must close: its client read nothing for `send_timeout` seconds. Meanwhile the
        connection may be evicted at the connection cap. (A large answer was charged to
        the memory budget when it was made; it is released with the request.)"""
        self._waiting[scope] = None
        try:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                while view:
                    try:
                        written = os.write(fd, view)
                    except BlockingIOError:
                        written = 0
                    if written:
                        view = view[written:]
                        continue
                    with trio.move_on_after(self.send_timeout) as timer:
                        await trio.lowlevel.wait_writable(fd)
                    if timer.cancelled_caught:
                        log.warning("closed a connection whose client read nothing of its "
                                    "answer for %g s (--send-timeout)", self.send_timeout)
                        return False
        finally:
            self._waiting.pop(scope, None)
        return True

    async def _send_refusal(self, stream: trio.SocketStream, message: _Message) -> None:
        """413 (body over the limit) or 503 (the memory budget cannot take it), then a
        short bounded linger that reads and drops what the client is still sending, so
        closing does not reset the connection before it read the answer."""
        if message.refused:
            await self._send_error(stream, 503, message.refused, [("retry-after", "1")])
        else:
            await self._send_error(stream, 413, f"request body exceeds the limit of "
                                                f"{self.max_body} bytes (--max-request-bytes)")
        await _linger(stream)

    async def _receive(self, stream: trio.SocketStream, parser: httptools.HttpRequestParser,
                       callbacks: _Callbacks, scope: trio.CancelScope) -> bool:
        """Feeds the parser what arrives next; False when the connection should close.
        `scope` is the connection's: cancelled while it waits idle, it closes it."""
        if callbacks.failed is not None:  # the requests before it were answered
            await self._send_parse_error(stream, callbacks, callbacks.failed)
            return False
        current = callbacks.current
        if callbacks.unfed is not None:
            data, callbacks.unfed = callbacks.unfed, None
            if current is None or current.declared < 0 or not current.head_done:
                await trio.lowlevel.checkpoint()  # the other connections' turn first
        elif current is None:  # idle between requests: the idle sweep or drain closes it
            fd = callbacks.fd
            data = _read_now(fd)
            if data is None:
                idle = self._idle
                idle[scope] = self._now()
                try:
                    while data is None:
                        await trio.lowlevel.wait_readable(fd)
                        data = _read_now(fd)
                finally:
                    del idle[scope]
            callbacks.received = now = self._now()
            callbacks.head_deadline = now + self.head_timeout
        else:
            data = None
            if current.head_done and not current.read_on:
                # a client that writes the head and the body apart (libcurl: tritonclient,
                # perf_analyzer) has usually sent the body by the time the head is parsed
                current.read_on = True
                data = _read_now(callbacks.fd)
                if data is None:  # its write is usually just behind: the ready tasks
                    # run first, then one more read, before a timed wait (a cancel scope)
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    data = _read_now(callbacks.fd)
            if data is None:
                in_head = not current.head_done
                deadline = callbacks.head_deadline if in_head else \
                    self._now() + self.body_timeout
                slow = callbacks.slow_reads
                with trio.move_on_at(deadline) as timer:
                    if slow > _SLOW_READS:
                        await trio.sleep(_PAUSES[min(slow - _SLOW_READS, len(_PAUSES)) - 1])
                    data = await stream.receive_some(_READ_SIZE)
                callbacks.slow_reads = slow + 1 if len(data or b"") < _SMALL_READ else 0
                if timer.cancelled_caught:
                    what = (f"the request head did not arrive within {self.head_timeout:g} "
                            f"s (--request-head-timeout)" if in_head else
                            f"the request body stalled for {self.body_timeout:g} s "
                            f"(--request-body-timeout)")
                    await self._send_error(stream, 408, what)
                    return False
            callbacks.received = self._now()
        if not data:
            return False
        if len(data) > _HEAD_SLICE_BYTES:
            data = _feed_first(data, current, callbacks)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            await self._send_error(stream, 400, "protocol upgrades are not supported")
            return False
        except httptools.HttpParserError as exc:
            if callbacks.done:  # pipelined requests before it are answered first
                callbacks.failed = exc
                return True
            await self._send_parse_error(stream, callbacks, exc)
            return False
        if callbacks.raw_headers and (callbacks.current is None
                                      or callbacks.current.head_done):
            # trailer fields of a chunked body: unused, counted against the head's bound
            callbacks.trailer_bytes += sum(map(len, callbacks.raw_headers))
            callbacks.raw_headers = []
            if callbacks.trailer_bytes > _MAX_HEAD_BYTES:
                await self._send_head_too_large(stream)
                return False
        current = callbacks.current
        if callbacks.chunk_from >= 0 and callbacks.chunk_declared_too_large(data):
            current.too_large = True
        if current is not None and not current.head_done:
            if callbacks.head_raw == 0:
                callbacks.head_deadline = callbacks.received + self.head_timeout
            callbacks.head_raw += len(data)
            if callbacks.head_raw > _MAX_HEAD_BYTES:
                await self._send_head_too_large(stream)
                return False
        if current is not None and (current.too_large or current.size > self.max_body
                                    or current.refused):
            await self._send_refusal(stream, current)
            return False
        if callbacks.expect_continue:
            callbacks.expect_continue = False
            if current is not None:  # the client waits for this before it sends the body
                await stream.send_all(_CONTINUE)
        return True

    async def _send_parse_error(self, stream: trio.SocketStream, callbacks: _Callbacks,
                                exc: httptools.HttpParserError) -> None:
        if callbacks.head_too_large:
            await self._send_head_too_large(stream)
        else:
            if callbacks.unsupported_version:
                await self._send_error(stream, 505, callbacks.malformed)
            else:
                await self._send_error(stream, 400, f"malformed HTTP request: "
                                                    f"{callbacks.malformed or exc}")
            if callbacks.malformed:  # refused mid-body: it may still be sending
                await _linger(stream)

    async def _send_head_too_large(self, stream: trio.SocketStream) -> None:
        await self._send_error(stream, 431, f"request head exceeds {_MAX_HEAD_BYTES} bytes")

    def _request(self, message: _Message, fd: int) -> Request:
        target = message.target.decode("latin-1")
        if target[:1] != "/":
            target = _origin_form(target)
        if message.buffer is not None:
            body = message.buffer
        else:
            body = message.body[0] if len(message.body) == 1 else b"".join(message.body)
        direct = DirectReply(fd, message.keep_alive, self) \
            if message.method == "POST" else None
        return Request(message.method, target.split("?", 1)[0], message.headers, body,
                       message.arrived, direct, target, message.held)

    def _reply(self, message: _Message, response: Response, direct: DirectReply | None,
               fd: int) -> tuple[bool, list[bytes]]:
        """Writes the answer to one request as far as the socket takes it at once:
        (whether the connection stays open, what is left to send). An answer an
        instance thread already wrote wins; the handler's is then dropped."""
        if direct is not None and direct.sent is not None:
            if direct.broken:
                return False, []
            return direct.keep_alive, [direct.rest] if direct.rest else []
        keep_alive = message.keep_alive if not self.draining else False
        head = _encode_head(response, keep_alive)
        body = response.body
        if message.method == "HEAD" or not body:
            data = head
        elif len(body) <= _COALESCE_BYTES:
            data = head + body
        else:  # large bodies go out as they are, without a copy
            return keep_alive, [head, body]
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            written = 0
        return keep_alive, [data[written:]] if written < len(data) else []

    def _log_access(self, stream: trio.SocketStream, message: _Message, request: Request,
                    response: Response, direct: DirectReply | None) -> None:
        if direct is not None and direct.sent is not None:
            response = direct.sent
        try:
            peer = stream.socket.getpeername()[0]
        except OSError:
            peer = "-"
        log.info('%s "%s %s" %d %d', peer, message.method, request.target, response.status,
                 len(response.body))

    async def _send_error(self, stream: trio.SocketStream, status: int, message: str,
                          headers: list[tuple[str, str]] | None = None) -> None:
        """Sends an error answer before the connection closes (given up when its client
        reads nothing of it for `send_timeout`)."""
        response = self.error(status, message)
        if headers:
            response.headers = [*response.headers, *headers]
        try:
            with trio.move_on_after(self.send_timeout):
                await stream.send_all(_encode_head(response, False) + response.body)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass


async def _linger(stream: trio.SocketStream) -> None:
    """After an answer that refused a request mid-body: reads and drops, for a short
    bounded time, what the client is still sending, so closing does not reset the
    connection before the client read the answer."""
    try:
        await stream.send_eof()
        dropped = 0
        with trio.move_on_after(_LINGER_SECONDS):
            while dropped < _LINGER_BYTES:
                data = await stream.receive_some(_READ_SIZE)
                if not data:
                    break
                dropped += len(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
        pass


def _feed_first(data: bytes, current: _Message | None, callbacks: _Callbacks) -> bytes:
    """What of `data` to parse in this turn (see `_HEAD_SLICE_BYTES`); the rest is kept
    in `callbacks.unfed`."""
    if current is None or not current.head_done:
        end = _HEAD_SLICE_BYTES
    elif current.declared >= 0:
        end = current.declared - current.size  # the rest of its body
        if end >= len(data):
            return data
    elif data.count(b"\r\n") <= _MAX_LINES:  # a chunked body
        return data
    else:
        end = -1
        for _ in range(_MAX_LINES):
            end = data.find(b"\r\n", end + 1)
        end += 2
    callbacks.unfed = data[end:]
    return data[:end]


def _release(message: _Message | None, request: Request | None) -> None:
    """Drops the body of `message` / `request` and gives what they held back to the
        memory budget (after dropping it, so the memory can go back to the system)."""
    held = None
    if message is not None:
        held = message.held
        message.buffer = None
        message.body = []
    if request is not None:
        held = request.held or held
        request.body = b""
    if held is not None:
        held.release()


_METHODS = {m.encode(): m for m in ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS")}


def _origin_form(target: str) -> str:
    """The path and query of an absolute-form target ("http://host:port/path?query"),
    which a server must accept (RFC 9112, 3.2.2; proxies send it); any other target as
    it is (the router answers 404 for it)."""
    scheme, sep, rest = target.partition("://")
    if not sep or not scheme.isalpha():
        return target
    slash = rest.find("/")
    return rest[slash:] if slash >= 0 else "/"


def _header_dict(raw: list[bytes]) -> dict[str, str]:
    """The headers of `raw` (name, value, name, value, ...) by lower-case name, the values
    of a repeated name joined with ", ". Decoded in one pass over all of them when
    nothing holds a line feed (always, from llhttp), else one by one; repeated names
    are gathered and joined once each (joined as they came, 13,000 repeats of one name
    in a 64 KiB head cost the loop 17 ms)."""
    parts = b"\n".join(raw).decode("latin-1").split("\n")
    if len(parts) == len(raw):
        names = "\n".join(parts[0::2]).lower().split("\n")
        values = parts[1::2]
    else:
        names = [name.decode("latin-1").lower() for name in raw[0::2]]
        values = [value.decode("latin-1") for value in raw[1::2]]
    headers = dict(zip(names, values))
    if len(headers) == len(names):
        return headers
    gathered: dict[str, list[str]] = {}
    for name, value in zip(names, values):
        gathered.setdefault(name, []).append(value)
    return {name: ", ".join(found) for name, found in gathered.items()}


def _read_now(fd: int) -> bytes | None:
    """What the socket holds already (b"" at end of stream), None when it holds nothing.
    A keep-alive client usually sent its next request by the time the loop is done with
    the last one (the instance thread answered it directly), so the common case costs one
    read: no cancel scope, no trip through the scheduler, no epoll re-registration. The
    connection still yields once per request (the handler or the send waits)."""
    try:
        return os.read(fd, _READ_SIZE)
    except BlockingIOError:
        return None


# the end of an answer's head by its connection's fate: False closes, True keeps it open
# (HTTP/1.1's default), _KEEP_ALIVE_SAID keeps it open and says so (HTTP/1.0's keep-alive)
_KEEP_ALIVE_SAID = 2
_TAILS = (b"\r\nconnection: close\r\n\r\n", b"\r\n\r\n",
          b"\r\nconnection: keep-alive\r\n\r\n")


def _encode_head(response: Response, keep_alive: bool | int) -> bytes:
    """The status line and headers of `response` (the status line and content type
    encoded once per pair); `keep_alive` False, True or _KEEP_ALIVE_SAID (see `_TAILS`)."""
    key = (response.status, response.content_type)
    start = _HEAD_STARTS.get(key)
    if start is None:
        try:
            reason = HTTPStatus(response.status).phrase
        except ValueError:
            reason = ""
        start = f"HTTP/1.1 {response.status} {reason}\r\ncontent-type: " \
                f"{response.content_type}\r\ncontent-length: ".encode("latin-1")
        if len(_HEAD_STARTS) < 256:
            _HEAD_STARTS[key] = start
    tail = _TAILS[keep_alive]
    if response.headers:
        key = tuple(response.headers)
        extra = _HEAD_EXTRAS.get(key)
        if extra is None:
            extra = "".join([f"\r\n{name}: {value}" for name, value in key]
                            ).encode("latin-1")
            if len(_HEAD_EXTRAS) < 256:
                _HEAD_EXTRAS[key] = extra
        tail = extra + tail
    return b"%b%d%b" % (start, len(response.body), tail)


_HEAD_STARTS: dict[tuple[int, str], bytes] = {}
# the encoded extra headers of answers (the same few come back: the binary header length)
_HEAD_EXTRAS: dict[tuple[tuple[str, str], ...], bytes] = {}
