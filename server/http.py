"""HTTP/1.1 for `tinyhal-serve`: h11 driven directly on trio streams.

One trio task per connection runs a small loop: h11 parses the request (head, then body,
chunked or not; h11 does all parsing and framing), the handler turns a `Request` into a
`Response`, h11 frames the answer, and the connection is kept alive for the next request
until `keep_alive_timeout` of idleness. Nothing sits between the socket and the handler
but h11: no ASGI, no routing framework, no per-request middleware stack.

Draining (`HttpServer.drain()`): the listeners close at once (new connections are refused),
connections idle between requests close, and a connection with a request in progress
answers it with `Connection: close`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h11
import trio

log = logging.getLogger("tinyhal.server")

__all__ = ["BodyTooLarge", "HttpServer", "Request", "Response"]

_READ_SIZE = 64 << 10
_MAX_HEAD_BYTES = 64 << 10
_DISCARD_BYTES = 256 << 20
_COALESCE_BYTES = 64 << 10
_DISCARD_SECONDS = 10.0


@dataclass
class Request:
    method: str
    path: str  # without the query string
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    arrived: float  # trio clock, when the request head was complete


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


class BodyTooLarge(Exception):
    """The request body exceeds the server's limit (the handler answers 413)."""


Handler = Callable[[Request], Awaitable[Response]]
ErrorResponder = Callable[[int, str], Response]


class HttpServer:
    """Serves `handler` on trio listeners until `drain()`."""

    def __init__(self, handler: Handler, error: ErrorResponder, *, max_body: int,
                 keep_alive_timeout: float = 5.0, access_log: bool = False) -> None:
        self.handler = handler
        self.error = error
        self.max_body = max_body
        self.keep_alive_timeout = keep_alive_timeout
        self.access_log = access_log
        self.draining = False
        self._listeners: list[trio.SocketListener] = []
        self._idle: set[trio.CancelScope] = set()

    async def serve(self, listeners: list[trio.SocketListener],
                    task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Accepts connections until drained and every connection is closed."""
        self._listeners = listeners
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, nursery)
            task_status.started()
        # the accept loops ended (drain); connection tasks finished with the nursery

    def drain(self) -> None:
        """Stops accepting, closes idle connections; busy ones close after their answer."""
        self.draining = True
        for listener in self._listeners:
            # closing the socket outright frees the port at once (no new SYN is accepted)
            listener.socket.close()
        for scope in list(self._idle):
            scope.cancel()

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while not self.draining:
            try:
                stream = await listener.accept()
            except (trio.ClosedResourceError, OSError):
                if self.draining:
                    return
                await trio.sleep(0.01)  # e.g. EMFILE: back off, keep serving
                continue
            nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD_BYTES)
        try:
            while not self.draining:
                if not await self._one_request(stream, conn):
                    break
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    break
                try:
                    conn.start_next_cycle()
                except h11.LocalProtocolError:
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass
        except Exception:  # a bug of ours must cost one connection, never the server
            log.exception("connection failed")
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    await stream.aclose()

    async def _next_event(self, stream: trio.SocketStream, conn: h11.Connection):
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await stream.receive_some(_READ_SIZE)
            conn.receive_data(data)  # b"" tells h11 the peer closed

    async def _one_request(self, stream: trio.SocketStream, conn: h11.Connection) -> bool:
        """Serves one request; False when the connection should close."""
        idle = trio.CancelScope(deadline=trio.current_time() + self.keep_alive_timeout)
        self._idle.add(idle)
        try:
            with idle:
                try:
                    event = await self._next_event(stream, conn)
                except h11.RemoteProtocolError as exc:
                    await self._send_error(stream, conn, exc.error_status_hint, str(exc))
                    return False
        finally:
            self._idle.discard(idle)
        if idle.cancelled_caught or not isinstance(event, h11.Request):
            return False  # keep-alive timeout, drain, or the peer closed
        arrived = trio.current_time()
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("latin-1")
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        target = event.target.decode("latin-1")
        path = target.split("?", 1)[0]
        method = event.method.decode("latin-1")
        try:
            body = await self._read_body(stream, conn)
        except h11.RemoteProtocolError as exc:
            await self._send_error(stream, conn, exc.error_status_hint, str(exc))
            return False
        except BodyTooLarge:
            await self._send_error(stream, conn, 413,
                                   f"request body exceeds the limit of {self.max_body} bytes "
                                   f"(--max-request-bytes)")
            return False
        response = await self.handler(Request(method, path, headers, body, arrived))
        await self._send(stream, conn, response)
        if self.access_log:
            try:
                peer = stream.socket.getpeername()[0]
            except OSError:
                peer = "-"
            log.info('%s "%s %s" %d %d', peer, method, target, response.status,
                     len(response.body))
        return True

    async def _read_body(self, stream: trio.SocketStream, conn: h11.Connection) -> bytes:
        if conn.they_are_waiting_for_100_continue:
            await stream.send_all(conn.send(h11.InformationalResponse(status_code=100,
                                                                       headers=[])))
        chunks: list[bytes] = []
        total = 0
        while True:
            event = await self._next_event(stream, conn)
            if isinstance(event, h11.Data):
                total += len(event.data)
                if total > self.max_body:
                    await self._discard_body(stream, conn)
                    raise BodyTooLarge
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise trio.BrokenResourceError("peer closed mid-body")

    async def _discard_body(self, stream: trio.SocketStream, conn: h11.Connection) -> None:
        """Reads the rest of an oversized body (bounded) so the client, which sends it all
        before it reads, sees the 413 rather than a reset."""
        budget = max(self.max_body, _DISCARD_BYTES)
        with trio.move_on_after(_DISCARD_SECONDS):
            while budget > 0:
                event = await self._next_event(stream, conn)
                if not isinstance(event, h11.Data):
                    return
                budget -= len(event.data)

    async def _send(self, stream: trio.SocketStream, conn: h11.Connection,
                    response: Response) -> None:
        headers = [("content-type", response.content_type),
                   ("content-length", str(len(response.body))), *response.headers]
        if self.draining:
            headers.append(("connection", "close"))
        head = conn.send(h11.Response(status_code=response.status, headers=headers))
        body = response.body
        pieces = conn.send_with_data_passthrough(h11.Data(data=body)) if body else []
        tail = conn.send(h11.EndOfMessage())
        if len(body) <= _COALESCE_BYTES:
            await stream.send_all(b"".join((head, *pieces, tail)))
            return
        await stream.send_all(head)  # large bodies go out as they are, without a copy
        for piece in pieces:
            await stream.send_all(piece)
        if tail:
            await stream.send_all(tail)

    async def _send_error(self, stream: trio.SocketStream, conn: h11.Connection, status: int,
                          message: str) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        response = self.error(status, message)
        response.headers.append(("connection", "close"))
        try:
            await self._send(stream, conn, response)
        except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
