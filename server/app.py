"""The ASGI app of `tinyhal-serve`: KServe V2 REST routes over a `Server`.

Routes (V2 / Open Inference Protocol, plus the Triton extensions tritonclient uses):

    GET  /v2/health/live                      200 while the process runs
    GET  /v2/health/ready                     200 once every model loaded, 503 draining
    GET  /v2                                  server metadata
    GET  /v2/models/{m}[/versions/{v}]        model metadata (inputs/outputs from the ABI)
    GET  /v2/models/{m}[/versions/{v}]/ready  200 ready, 503 not (404 unknown)
    GET  /v2/models/{m}[/versions/{v}]/config the model's serving configuration
    POST /v2/models/{m}[/versions/{v}]/infer  inference (JSON and binary tensors)
    POST /v2/repository/index                 every model version and its state
    GET  /metrics                             Prometheus exposition

Every error body is `{"error": "..."}`. Status codes: 400 malformed request, bad
datatype/shape, unknown input/output, or the program rejecting its input (INVALID_ARGUMENT,
FAILED_PRECONDITION, OUT_OF_RANGE); 404 unknown model/version/route; 405 wrong method;
413 body over --max-request-bytes; 415 unknown Content-Encoding; 429 model queue full and
503 draining/not ready (both with Retry-After); 504 deadline exceeded. A 500 is a bug of
the server or runtime, never an answer to bad input.

Deadlines: the smallest of the header `Inference-Timeout` (seconds), the request parameter
`timeout` (microseconds, as tritonclient sends it), the model's `timeout_s` and the
server's `--max-timeout`, counted from the request's arrival; 0 means none (as in
Triton).
"""

from __future__ import annotations

import json
import logging
import math
import zlib
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from ..errors import Error, StatusCode
from .admission import DeadlineExceeded, Overloaded, RunningInvocation
from .metrics import Metrics
from .protocol import ProtocolError, build_infer_response, parse_infer_request
from .repository import ModelRepository, ModelVersion

log = logging.getLogger("tinyhal.server")

__all__ = ["Server", "create_app"]

JSON = "application/json"
EXTENSIONS = ["binary_tensor_data", "model_repository", "schedule_policy", "statistics"]

# program / runtime errors -> HTTP status (the rest are 500: a failure of ours)
_ERROR_STATUS = {
    StatusCode.INVALID_ARGUMENT: 400,
    StatusCode.FAILED_PRECONDITION: 400,
    StatusCode.OUT_OF_RANGE: 400,
    StatusCode.DEADLINE_EXCEEDED: 504,
    StatusCode.RESOURCE_EXHAUSTED: 503,
    StatusCode.UNAVAILABLE: 503,
}


class Server:
    """The state the routes share: the repository, draining flag, background nursery."""

    def __init__(
        self,
        repository: ModelRepository,
        *,
        max_request_bytes: int = 64 << 20,
        max_timeout: float | None = None,
    ) -> None:
        self.repository = repository
        self.max_request_bytes = max_request_bytes
        self.max_timeout = max_timeout
        self.loaded = False
        self.draining = False
        self.background: trio.Nursery | None = None
        self.metrics = Metrics(self)

    @property
    def ready(self) -> bool:
        return self.loaded and not self.draining and all(
            mv.ready for mv in self.repository.all_versions())

    def models_loaded(self) -> None:
        """Marks loading done and creates every model's request series at zero, so
        dashboards and alert rules see them before the first request."""
        m = self.metrics
        for mv in self.repository.all_versions():
            labels = (mv.name, mv.version)
            m.requests.labels(*labels, "200")
            m.duration.labels(*labels)
            m.queue.labels(*labels)
            m.compute.labels(*labels)
        self.loaded = True

    def running_invocations(self) -> list[RunningInvocation]:
        """Every invocation still running, over all model versions, oldest first."""
        running = [r for mv in self.repository.all_versions() if mv.admission is not None
                   for r in mv.admission.running_invocations()]
        return sorted(running, key=lambda r: r.started)

    async def wait_idle(self) -> None:
        """Returns when no invocation runs (detached ones included)."""
        for mv in self.repository.all_versions():
            if mv.admission is not None:
                await mv.admission.wait_idle()


def _json(doc: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(json.dumps(doc, separators=(",", ":")), status, headers, media_type=JSON)


def _error(status: int, message: str, headers: dict | None = None) -> Response:
    return _json({"error": message}, status, headers)


def create_app(server: Server) -> Starlette:
    repo = server.repository

    async def live(request: Request) -> Response:
        return _json({"live": True})

    async def ready(request: Request) -> Response:
        if server.ready:
            return _json({"ready": True})
        return _json({"ready": False}, 503, {"Retry-After": "1"})

    async def server_metadata(request: Request) -> Response:
        return _json({"name": "tinyhal", "version": __version__, "extensions": EXTENSIONS})

    def _model(request: Request) -> ModelVersion:
        params = request.path_params
        return repo.get(params["name"], params.get("version"))

    async def model_metadata(request: Request) -> Response:
        mv = _model(request)
        versions = list(repo.models[mv.name])
        if not mv.ready:
            return _error(503, f"model '{mv.name}' version {mv.version} is not ready: "
                               f"{mv.reason or mv.state}")
        return _json(mv.metadata(versions))

    async def model_ready(request: Request) -> Response:
        mv = _model(request)
        if mv.ready and not server.draining:
            return _json({"name": mv.name, "ready": True})
        return _json({"name": mv.name, "ready": False}, 503)

    async def model_config(request: Request) -> Response:
        mv = _model(request)
        return _json(mv.describe_config())

    async def repository_index(request: Request) -> Response:
        index = []
        for mv in repo.all_versions():
            entry = {"name": mv.name, "version": mv.version, "state": mv.state}
            if mv.reason:
                entry["reason"] = mv.reason
            index.append(entry)
        return _json(index)

    async def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(server.metrics.generate(), media_type=CONTENT_TYPE_LATEST)

    async def infer(request: Request) -> Response:
        arrived = trio.current_time()
        params = request.path_params
        name, version = params["name"], params.get("version") or ""
        try:
            mv = repo.get(name, version or None)
        except ProtocolError as exc:
            # unknown names are not labels: count them under one bucket
            server.metrics.requests.labels("", "", str(exc.status)).inc()
            return _error(exc.status, exc.message)
        labels = (mv.name, mv.version)
        status = 500
        try:
            response = await _infer(request, mv, arrived)
            status = response.status_code
            return response
        finally:
            server.metrics.requests.labels(*labels, str(status)).inc()
            server.metrics.duration.labels(*labels).observe(trio.current_time() - arrived)

    async def _infer(request: Request, mv: ModelVersion, arrived: float) -> Response:
        if server.draining:
            return _error(503, "server is shutting down; retry on another replica",
                          {"Retry-After": "1"})
        if not mv.ready:
            return _error(503, f"model '{mv.name}' version {mv.version} is not ready: "
                               f"{mv.reason or mv.state}", {"Retry-After": "1"})
        try:
            body = await _read_body(request, server.max_request_bytes)
            req = parse_infer_request(body, request.headers.get("inference-header-content-length"))
            args = mv.prepare(req)
            deadline = _deadline(request, req.timeout_us, mv, server.max_timeout, arrived)
        except ProtocolError as exc:
            return _error(exc.status, exc.message)

        labels = (mv.name, mv.version)

        def started(queued: float) -> None:
            server.metrics.queue.labels(*labels).observe(queued)

        async def call() -> Any:
            t0 = trio.current_time()
            out = await mv.invoke(args)
            server.metrics.compute.labels(*labels).observe(trio.current_time() - t0)
            return out

        try:
            label = f"model {mv.name} version {mv.version} request {req.id or '(no id)'}"
            results = await mv.admission.run(call, deadline, server.background, started,
                                             label)
        except Overloaded as exc:
            return _error(429, f"model '{mv.name}' is overloaded: {exc}; retry after "
                               f"{exc.retry_after} s", {"Retry-After": str(exc.retry_after)})
        except DeadlineExceeded as exc:
            return _error(504, f"model '{mv.name}': {exc}")
        except Error as exc:
            status = _ERROR_STATUS.get(exc.code, 500)
            if status == 500:
                log.error("model %s version %s failed: %s", mv.name, mv.version, exc)
            headers = {"Retry-After": "1"} if status == 503 else None
            return _error(status, f"model '{mv.name}' failed: {exc}", headers)
        body, header_length = build_infer_response(mv.name, mv.version, req, results)
        if header_length is None:
            return Response(body, 200, media_type=JSON)
        return Response(body, 200, {"Inference-Header-Content-Length": str(header_length)},
                        media_type="application/octet-stream")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        message = {404: f"no route {request.url.path}",
                   405: f"method {request.method} not allowed on {request.url.path}"}.get(
            exc.status_code, str(exc.detail))
        return _error(exc.status_code, message, getattr(exc, "headers", None))

    async def protocol_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProtocolError)
        return _error(exc.status, exc.message)

    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s %s", request.method, request.url.path,
                      exc_info=exc)
        return _error(500, f"internal server error: {type(exc).__name__}: {exc}")

    model_paths = ["/v2/models/{name}", "/v2/models/{name}/versions/{version}"]
    routes = [
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/repository/index", repository_index, methods=["POST", "GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    for base in model_paths:
        routes += [
            Route(base, model_metadata, methods=["GET"]),
            Route(base + "/ready", model_ready, methods=["GET"]),
            Route(base + "/config", model_config, methods=["GET"]),
            Route(base + "/infer", infer, methods=["POST"]),
        ]
    return Starlette(
        routes=routes,
        exception_handlers={
            HTTPException: http_error,
            ProtocolError: protocol_error,
            Exception: internal_error,
        },
    )


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        try:
            n = int(length)
        except ValueError:
            raise ProtocolError(400, f"Content-Length {length!r} is not an integer") from None
        if n > limit:
            raise ProtocolError(413, f"request body of {n} bytes exceeds the limit of "
                                     f"{limit} bytes (--max-request-bytes)")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ProtocolError(413, f"request body exceeds the limit of {limit} bytes "
                                     f"(--max-request-bytes)")
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("identity", ""):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ProtocolError(415, f"Content-Encoding {encoding!r} is not supported "
                                 f"(gzip, deflate)")
    decompressor = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = decompressor.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ProtocolError(400, f"request body is not valid {encoding}: {exc}") from None
    if len(out) > limit or decompressor.unconsumed_tail:
        raise ProtocolError(413, f"decompressed request body exceeds the limit of {limit} "
                                 f"bytes (--max-request-bytes)")
    return out


def _deadline(request: Request, timeout_us: float | None, mv: ModelVersion,
              max_timeout: float | None, arrived: float) -> float:
    limits = []
    header = request.headers.get("inference-timeout")
    if header is not None:
        try:
            seconds = float(header)
        except ValueError:
            seconds = -1.0
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ProtocolError(400, f"Inference-Timeout must be a non-negative number of "
                                     f"seconds, not {header!r}")
        if seconds:
            limits.append(seconds)
    if timeout_us:
        limits.append(timeout_us / 1e6)
    if mv.timeout_s is not None:
        limits.append(float(mv.timeout_s))
    if max_timeout is not None:
        limits.append(max_timeout)
    return arrived + min(limits) if limits else math.inf
