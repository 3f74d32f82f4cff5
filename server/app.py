"""The routes of `tinyhal-serve`: KServe V2 REST over a `Server` (`Server.handle`).

Routes (V2 / Open Inference Protocol, plus the Triton extensions tritonclient uses):

    GET  /v2/health/live                      200 while the process runs
    GET  /v2/health/ready                     200 once every model loaded, 503 draining
    GET  /v2                                  server metadata
    GET  /v2/models/{m}[/versions/{v}]        model metadata (inputs/outputs from the ABI)
    GET  /v2/models/{m}[/versions/{v}]/ready  200 ready, 503 not (404 unknown)
    GET  /v2/models/{m}[/versions/{v}]/config the model's serving configuration
    POST /v2/models/{m}[/versions/{v}]/infer  inference (JSON and binary tensors)
    GET  /v2/models[/{m}[/versions/{v}]]/stats  statistics (Triton's extension; stats.py)
    POST /v2/repository/index                 every model version and its state
    POST /v2/repository/models/{m}/load       (re)load a model (--model-control-mode
                                              explicit; 403 otherwise)
    POST /v2/repository/models/{m}/unload     stop serving a model (after what is admitted)
    GET  /metrics                             Prometheus exposition (API group "metrics";
                                              rendered off the loop, see metrics.py)

Every error body is `{"error": "..."}`. Status codes: 400 malformed request, bad
datatype/shape, unknown input/output, or the program rejecting its input (INVALID_ARGUMENT,
FAILED_PRECONDITION, OUT_OF_RANGE); 404 unknown model/version/route; 405 wrong method;
403 an API group restricted by --http-restricted-api without its header, or model
control refused by --model-control-mode; 408 request head or body too slow; 413 body
over --max-request-bytes (also while inflating); 431 request head over 64 KiB; 415 unknown
Content-Encoding (with Accept-Encoding); 503 model queue full ("Exceeds maximum queue
size", Triton's UNAVAILABLE), draining/not ready or the client memory budget full
(--client-memory-limit; all with Retry-After); 504 deadline exceeded ("Request timeout
expired" when it passed in the queue); 505 a request line that is not HTTP/1.x. A 500 is a bug of
the server or runtime, never an answer to bad input, or a model whose kernel faulted:
that request gets the 500 and every model on the same device becomes UNAVAILABLE (503)
until it is loaded again (on a fresh device); the process keeps serving the rest.

Deadlines: the smallest of the header `Inference-Timeout` (seconds), the request parameter
`timeout` (microseconds, as tritonclient sends it), the model's `timeout_s` and the
server's `--max-timeout`, counted from the request's arrival; 0 means none (as in
Triton).
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
import zlib
from collections.abc import Awaitable, Callable
from threading import get_ident
from typing import Any

import orjson
import trio

from .. import __version__
from ..errors import DeviceLostError, Error, KernelFaultError, StatusCode
from .budget import (
    SMALL_BYTES,
    BudgetExceeded,
    MemoryBudget,
    default_limit,
    release_freed_memory,
)
from .config import ConfigError, parse_json_config
from .http import Request, Response
from .metrics import Metrics, ModelSeries
from .protocol import (
    ProtocolError,
    build_infer_response,
    encodes_in_slices,
    parse_infer_request,
)
from .repository import ModelRepository, ModelVersion
from .scheduling import (
    DeadlineExceeded,
    Overloaded,
    RunningInvocation,
    Scheduler,
    Unavailable,
)

log = logging.getLogger("tinyhal.server")

__all__ = ["Server", "error_response", "json_response"]

JSON = "application/json"
EXTENSIONS = ["binary_tensor_data", "model_repository", "schedule_policy", "sequence",
              "statistics"]

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
        model_control_mode: str = "none",
        restricted: dict[str, tuple[str, str]] | None = None,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.repository = repository
        # bytes held for clients (the HTTP server charges bodies and unread answers to the
        # same budget; inflated bodies and parsed tensors are charged here)
        self.budget = budget or MemoryBudget(default_limit())
        self.max_request_bytes = max_request_bytes
        self.max_timeout = max_timeout
        self.model_control_mode = model_control_mode
        self.restricted = restricted or {}  # API group -> (header, value) it needs
        # bodies this large are inflated and parsed on a worker thread, a few at a time
        self.parse_limiter = trio.CapacityLimiter(2)
        self.loaded = False
        self.draining = False
        self.background: trio.Nursery | None = None
        self.metrics = Metrics(self)
        self.repository_lock = trio.Lock()  # one load/unload at a time
        # awaited before metrics and statistics are read: answers already written by
        # instance threads are counted first (the HTTP server's `settle`)
        self.settle: Callable[[], Awaitable[None]] | None = None
        self._routes = _Routes(self)

    @property
    def ready(self) -> bool:
        """Every model version loaded, at least one of them, and not draining (a server
        with no model to serve is not ready: it would only answer 404s)."""
        versions = [mv for mv in self.repository.all_versions() if not mv.unloaded]
        return self.loaded and not self.draining and bool(versions) and all(
            mv.ready for mv in versions) and not self.repository.unavailable_models()

    def models_loaded(self) -> None:
        """Marks loading done and creates every model's request series at zero, so
        dashboards and alert rules see them before the first request."""
        for mv in self.repository.all_versions():
            self.create_series(mv)
        self.loaded = True

    def create_series(self, mv: ModelVersion) -> None:
        """Creates a (re)loaded version's series, counting its executions on top of those
        counted under its labels before."""
        self.metrics.series(mv.name, mv.version).count_from(mv.stats)

    @property
    def handle(self) -> Callable[[Request], Awaitable[Response]]:
        """The handler answering one HTTP request (never raises: a failure of ours is a
        500): the routes' own, so a request's task awaits one coroutine fewer."""
        return self._routes.handle

    def schedulers(self) -> list[Scheduler]:
        """The scheduler of every model version, those still unloading included."""
        repository = self.repository
        return [mv.scheduler for mv in [*repository.all_versions(), *repository.retiring]
                if mv.scheduler is not None]

    def running_invocations(self) -> list[RunningInvocation]:
        """Every invocation still running, over all model versions, oldest first."""
        running = [r for s in self.schedulers() for r in s.running_invocations()]
        return sorted(running, key=lambda r: r.started)

    def serves_sequences(self) -> bool:
        """Whether a model version here schedules sequences."""
        return any(mv.sequences is not None for mv in self.repository.all_versions())

    def holds_work(self) -> bool:
        """Whether a live sequence or an admitted request remains (the drain keeps the
        listener open meanwhile)."""
        return any(s.in_flight or s.live_sequences for s in self.schedulers())

    def abandon(self, why: str) -> int:
        """Every admitted request not finished is answered now (503 queued, 504 running,
        each logged) and admission ends: the drain's bound ran out."""
        count = 0
        for scheduler in self.schedulers():
            count += scheduler.abandon(why)
            scheduler.close()
        return count

    async def wait_idle(self) -> None:
        """Returns when no invocation runs (detached ones included)."""
        while True:
            schedulers = [s for s in self.schedulers() if s.in_flight]
            if not schedulers:
                return
            for scheduler in schedulers:
                await scheduler.wait_idle()


def json_response(doc: Any, status: int = 200,
                  headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, orjson.dumps(doc), JSON,
                     headers or [])


def error_response(status: int, message: str,
                   headers: list[tuple[str, str]] | None = None) -> Response:
    return json_response({"error": message}, status, headers)


_RETRY = [("retry-after", "1")]
# headers of a refused request, by status: a 503 says when to retry; a 415 for a
# Content-Encoding names the codings taken (RFC 9110 15.5.16, as Triton's frontend)
_ERROR_HEADERS = {503: _RETRY, 415: [("accept-encoding", "gzip, deflate")]}
_DRAINING = "server is draining (shutting down): it takes no new work; retry on another " \
            "replica"
_ROUTES_KEPT = 256  # paths whose route is remembered (forgotten all at once beyond)


class _Routes:
    """The V2 routes of one `Server`: `handle(request)` -> `Response`."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.repo = server.repository
        self.exact = {
            "/v2/health/live": {"GET": self.live},
            "/v2/health/ready": {"GET": self.ready},
            "/v2": {"GET": self.server_metadata},
            "/v2/repository/index": {"POST": self.repository_index,
                                     "GET": self.repository_index},
            "/metrics": {"GET": self.metrics},
            "/v2/models/stats": {"GET": self.model_stats},
        }
        # /v2/models/{m}[/versions/{v}][/<action>]
        self.model_actions = {
            "": {"GET": self.model_metadata},
            "ready": {"GET": self.model_ready},
            "config": {"GET": self.model_config},
            "infer": {"POST": self.infer},
            "stats": {"GET": self.model_stats},
        }
        # path -> its route (the routes are fixed: a model's name is looked up later)
        self._routed: dict[str, tuple[dict, tuple]] = {}
        # the reports of every model, each built once for all who asked meanwhile
        self._index = {only_ready: _SharedReport(functools.partial(self._index_doc,
                                                                   only_ready))
                       for only_ready in (False, True)}
        self._all_stats = _SharedReport(lambda: {"model_stats": [
            _stats_doc(mv) for mv in self.repo.all_versions() if mv.ready]})
        # the run's clock reader (one call, where `trio.current_time()` is three frames);
        # routes made outside a run read the clock of whichever run calls them
        try:
            self._now: Callable[[], float] = trio.lowlevel.current_clock().current_time
        except RuntimeError:
            self._now = trio.current_time

    async def handle(self, request: Request) -> Response:
        try:
            methods, params = self._route(request.path)
            if methods is None:
                return error_response(404, _no_route(request.path))
            handler = methods.get(request.method)
            if handler is None:
                return error_response(
                    405, f"method {request.method} not allowed on {request.path}",
                    [("allow", ", ".join(methods))])
            if self.server.restricted:
                need = self.server.restricted.get(api_group(request.path))
                if need is not None and request.headers.get(need[0]) != need[1]:
                    return error_response(403, f"This API is restricted, expecting "
                                               f"header '{need[0]}'")  # Triton's words
            return await handler(request, *params)
        except ProtocolError as exc:
            return error_response(exc.status, exc.message)
        except Exception as exc:  # a bug of ours: answer 500 and keep serving
            log.exception("internal error on %s %s", request.method, request.path)
            return error_response(500, f"internal server error: {type(exc).__name__}: {exc}")

    def _route(self, path: str) -> tuple[dict | None, tuple]:
        found = self._routed.get(path)
        if found is not None:
            return found
        found = self._route_path(path)
        if found[0] is not None:
            if len(self._routed) >= _ROUTES_KEPT:
                self._routed.clear()
            self._routed[path] = found
        return found

    def _route_path(self, path: str) -> tuple[dict | None, tuple]:
        methods = self.exact.get(path)
        if methods is not None:
            return methods, ()
        if "#" in path:  # routes are remembered only once found: never on the hot path
            raise ProtocolError(400, f"request target {path[:200]!r} has a fragment ('#'): "
                                     f"a fragment is not sent to a server")
        parts = path.split("/")
        # ["", "v2", "repository", "models", name, "load" | "unload"]
        if len(parts) == 6 and parts[1:4] == ["v2", "repository", "models"] and parts[4]:
            action = {"load": self.load_model, "unload": self.unload_model}.get(parts[5])
            return ({"POST": action}, (parts[4],)) if action else (None, ())
        # ["", "v2", "models", name, ("versions", v)?, action?]
        if len(parts) < 4 or parts[1] != "v2" or parts[2] != "models" or not parts[3]:
            return None, ()
        name, rest = parts[3], parts[4:]
        version = None
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = _version(rest[1]), rest[2:]
            if version is None:
                return None, ()
        if len(rest) > 1 or rest == [""]:  # a trailing '/' names no endpoint (Triton's)
            return None, ()
        methods = self.model_actions.get(rest[0] if rest else "")
        if methods is None:
            return None, ()
        return methods, (name, version)

    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        if self.server.ready:
            return json_response({"ready": True})
        return json_response({"ready": False}, 503, _RETRY)

    async def server_metadata(self, request: Request) -> Response:
        return json_response({"name": "tinyhal", "version": __version__,
                              "extensions": EXTENSIONS})

    async def model_metadata(self, request: Request, name: str, version: str | None
                             ) -> Response:
        """The version's inputs and outputs; `versions` as Triton lists them: the version
        asked by the path, else every ready version of the model, in order."""
        mv = self.repo.get(name, version)
        if not mv.ready:
            return _not_ready(mv, version)
        versions = [version] if version else [
            v for v, other in self.repo.models[mv.name].items() if other.ready]
        return json_response(mv.metadata(versions))

    async def model_ready(self, request: Request, name: str, version: str | None
                          ) -> Response:
        mv = self.repo.get(name, version)
        if mv.ready and not self.server.draining:
            return json_response({"name": mv.name, "ready": True})
        return json_response({"name": mv.name, "ready": False}, 503, _RETRY)

    async def model_config(self, request: Request, name: str, version: str | None
                           ) -> Response:
        """The loaded version's configuration, as Triton serves it: a version not loaded
        answers as its metadata does (503 with its state or why it failed; the
        repository index also gives the reason)."""
        mv = self.repo.get(name, version)
        if not mv.ready:
            return _not_ready(mv, version)
        return json_response(mv.describe_config())

    async def model_stats(self, request: Request, name: str | None = None,
                          version: str | None = None) -> Response:
        """Statistics of the ready versions only, as Triton's (a version's statistics go
        with it when it unloads; a reload starts from zero): a model or version with
        none ready is 404, as an unknown one."""
        if self.server.settle is not None:
            await self.server.settle()
        self.server.metrics.fold()
        if name is None:
            return await self._all_stats.answer()
        self.repo.get(name, version)  # 404 for an unknown model or version
        asked = [version] if version else list(self.repo.models[name])
        versions = [mv for v in asked if (mv := self.repo.models[name][v]).ready]
        if not versions:  # Triton's words first (its status is 400)
            what = f"requested model version is not available for model '{name}': " \
                   f"version {version} is not" if version else \
                f"requested model '{name}' is not available: no version of it is"
            return error_response(404, f"{what} loaded (statistics are kept for "
                                       f"loaded versions only)")
        return json_response({"model_stats": [_stats_doc(mv) for mv in versions]})

    def _control(self, action: str) -> None:
        mode = self.server.model_control_mode
        if mode != "explicit":
            raise ProtocolError(403 if mode == "none" else 400,
                                f"explicit model load / unload is not allowed: the server "
                                f"runs with --model-control-mode {mode} (start it with "
                                f"--model-control-mode explicit to {action} models)")

    async def load_model(self, request: Request, name: str) -> Response:
        """Triton's repository `load`: reads the model's directory again and loads the
        versions its policy selects afresh, each swapped in only once it loaded (a failed
        reload keeps the old version serving and answers 400 naming file and reason);
        versions no longer selected unload. The parameter `config` (a JSON string) is
        the model's whole configuration for this load, instead of its config.json files
        (checked by the same schema); Triton's `file:` parameters are refused (400):
        model files come from the repository only."""
        self._control("load")
        override = None
        params = _control_parameters(request, "load")
        if params:
            params = dict(params)
            has_config = "config" in params  # a null config is refused, as Triton
            config = params.pop("config", None)
            if params:
                raise ProtocolError(400, f"load parameters other than 'config' are not "
                                         f"supported ({', '.join(sorted(params))[:200]}): "
                                         f"model files come from the repository")
            if has_config:
                if not isinstance(config, str):
                    raise ProtocolError(400, "load parameter 'config' must be a string "
                                             "holding the model's configuration as JSON")
                try:
                    override = parse_json_config(config, "load parameter 'config'")
                except ConfigError as exc:
                    raise ProtocolError(400, f"failed to load '{name}': {exc}") from None
        server = self.server
        async with server.repository_lock:
            if server.draining:  # what loads now would be closed before it served
                return error_response(503, _DRAINING, _RETRY)
            failed = await self.repo.reload(name, server.background, override=override)
            for mv in self.repo.models.get(name, {}).values():
                server.create_series(mv)
        if failed:  # Triton's words (its L0 lifecycle tests read them)
            return error_response(400, f"load failed for model '{name}': " + "; ".join(
                f"version {mv.version} is at UNAVAILABLE state: {mv.reason}"
                for mv in failed))
        return json_response({})

    async def unload_model(self, request: Request, name: str) -> Response:
        """Triton's repository `unload`: every version of the model stops serving once
        what it admitted finished (new requests get 503 meanwhile). A model that is not
        loaded is already unloaded: 200, as Triton answers."""
        self._control("unload")
        dependents = _control_parameters(request, "unload").get("unload_dependents", False)
        if type(dependents) is not bool:  # no ensembles here: nothing depends on a model
            raise ProtocolError(400, "unload parameter 'unload_dependents' must be true or "
                                     "false")
        async with self.server.repository_lock:  # never held across the wait below
            versions = (self.repo.stop_admitting(name) if name in self.repo.models
                        else [])
            self.repo.forget_problem(name)  # a model that failed to load is unloaded too
        await self.repo.unload_versions(versions)
        return json_response({})

    async def repository_index(self, request: Request) -> Response:
        """Triton's index: every model of the repository, loaded or not (see
        `ModelRepository.index`); `{"ready": true}` keeps only READY versions."""
        only_ready = False
        if request.method == "POST":
            try:
                only_ready = _control_body(request, "index").get("ready", False)
            except ProtocolError:
                if _READY_NESTED.match(request.body):  # too deep for the parser
                    only_ready = None
                else:
                    raise
            if type(only_ready) is not bool:  # Triton's words (its L0_http test reads them)
                raise ProtocolError(400, "Invalid value for 'ready': expected a boolean "
                                         "(true or false)")
        return await self._index[only_ready].answer()

    def _index_doc(self, only_ready: bool) -> list[dict]:
        """The repository index as the repository's directory holds it now (blocking)."""
        try:
            names = self.repo.model_names()
        except OSError as exc:
            log.error("repository index: cannot read the model repository: %s",
                      exc.strerror or exc)
            names = []
        index = self.repo.index(names)
        if only_ready:
            index = [entry for entry in index if entry.get("state") == "READY"]
        return index

    async def metrics(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        if self.server.settle is not None:
            await self.server.settle()
        return Response(200, await self.server.metrics.scrape(), CONTENT_TYPE_LATEST)

    async def infer(self, request: Request, name: str, version: str | None) -> Response:
        server = self.server
        try:
            mv = self.repo.get(name, version)
        except ProtocolError as exc:
            # unknown names are not labels: count them under one bucket
            server.metrics.unknown_model(exc.status)
            return error_response(exc.status, exc.message)
        series = server.metrics.series(mv.name, mv.version)
        try:
            draining = server.draining
            if (draining and mv.sequences is None) or not mv.ready:
                series.finished(503, self._now() - request.arrived)
                return error_response(503, _DRAINING, _RETRY) if draining else \
                    _not_ready(mv, version, _RETRY)
            headers = request.headers
            t_input = time.perf_counter()
            try:
                if len(request.body) > _PARSE_ON_LOOP_BYTES or "content-encoding" in headers:
                    if request.held is None:  # released by the connection with the request
                        request.held = server.budget.hold()
                    async with server.parse_limiter:
                        req = await trio.to_thread.run_sync(
                            _parse_large, request, server.max_request_bytes, mv)
                else:  # no Content-Encoding: the body is the request as it is
                    req = parse_infer_request(
                        request.body, headers.get("inference-header-content-length"))
                args = mv.prepare(req)
                deadline = _deadline(headers.get("inference-timeout"), req.timeout_us, mv,
                                     server.max_timeout, request.arrived)
            except ProtocolError as exc:  # refused before admission: no failure of the
                series.finished(exc.status, self._now() - request.arrived)  # version's
                return error_response(exc.status, exc.message,
                                      _ERROR_HEADERS.get(exc.status))
            if draining and not mv.scheduler.continues_work(req.parameters):
                # the drain contract: no new work; steps without START are still taken
                series.finished(503, self._now() - request.arrived)
                return error_response(503, _DRAINING, _RETRY)
            compute_input = time.perf_counter() - t_input

            # answered on the instance thread when the connection allows it (see
            # `DirectReply`): the client has its answer before the loop wakes up
            answered: list[tuple[Response, float]] = []
            direct = request.direct
            respond = None
            if direct is not None:
                loop_thread = get_ident()

                def respond(results: list, seconds: float) -> None:
                    if get_ident() == loop_thread and encodes_in_slices(req, results):
                        return  # not on the loop: the task encodes it on a worker thread
                    start = time.perf_counter()
                    response = _infer_response(server, mv, req, results, request)
                    direct.send(response)  # a large one is left to the loop
                    answered.append((response, time.perf_counter() - start))

            try:
                label = f"model {mv.name} version {mv.version} request {req.id or '(no id)'}"
                results, queued, compute_infer = await mv.infer(args, deadline, label,
                                                                req.parameters, respond)
            except Exception as exc:  # noqa: BLE001 - mapped to an answer, or raised on
                if isinstance(exc, DeadlineExceeded) and direct is not None:
                    direct.close()
                    if direct.sent is not None:  # its answer went out as the deadline passed
                        return self._succeeded(mv, series, request, direct.sent,
                                               (0.0, compute_input, 0.0, 0.0))
                response = _failure_response(server, mv, exc)
                if response is None:
                    raise
                reason = _failure_reason(exc)
                if reason is None:  # refused at admission, as Triton's enqueue refuses
                    series.finished(response.status, self._now() - request.arrived)
                    return response
                return self._failed(mv, series, request, response, reason)
            if answered:
                response, compute_output = answered[0]
            else:
                t_output = time.perf_counter()
                if encodes_in_slices(req, results):  # see protocol: not on the loop
                    response = await trio.to_thread.run_sync(
                        _infer_response, server, mv, req, results, request)
                else:
                    response = _infer_response(server, mv, req, results, request)
                compute_output = time.perf_counter() - t_output
            if response.status != 200:  # the memory budget could not take the answer
                return self._failed(mv, series, request, response, "OTHER")
            return self._succeeded(mv, series, request, response,
                                   (queued, compute_input, compute_infer, compute_output))
        except BaseException:
            series.finished(500, self._now() - request.arrived)
            raise

    def _succeeded(self, mv: ModelVersion, series: ModelSeries, request: Request,
                   response: Response, phases: tuple[float, float, float, float]
                   ) -> Response:
        series.succeeded(mv.stats, phases, self._now() - request.arrived)
        return response

    def _failed(self, mv: ModelVersion, series: ModelSeries, request: Request,
                response: Response, reason: str) -> Response:
        series.failed(mv.stats, response.status, self._now() - request.arrived, reason)
        return response


_MAX_VERSION = 2**63 - 1


def _version(text: str) -> str | None:
    """The version a path's `/versions/<text>` names, as Triton's frontend reads it:
    ASCII digits only (else no route: None), an integer (`01` is version 1, as the
    repository names the directory `01`) that fits int64 (else 400)."""
    if not (text.isascii() and text.isdigit()):
        return None
    significant = text.lstrip("0")
    if len(significant) > 19 or int(significant or "0") > _MAX_VERSION:
        raise ProtocolError(400, f"model version '{text[:40]}' is out of range: a version "
                                 f"is an integer in [0, {_MAX_VERSION}]")
    return significant or "0"


# Triton's endpoints of the extensions not offered (not in the server metadata's list)
_NOT_OFFERED = (("/v2/systemsharedmemory", "system shared memory"),
                ("/v2/cudasharedmemory", "CUDA shared memory"), ("/v2/trace", "trace"),
                ("/v2/logging", "logging"))


def _no_route(path: str) -> str:
    """The 404's words for a path that names no endpoint; one of an extension not
    offered says so (tritonclient shows only the message)."""
    for prefix, extension in _NOT_OFFERED:
        if path.startswith(prefix):
            return f"no route {path}: the {extension} extension is not offered"
    if path.startswith("/v2/models/") and path.endswith(("/generate", "/generate_stream")):
        return f"no route {path}: the generate extension is not offered"
    return f"no route {path}"


def _not_ready(mv: ModelVersion, asked: str | None,
               headers: list[tuple[str, str]] | None = None) -> Response:
    """503 for a version that is not loaded, naming its state or why it failed, in
    Triton core's words (its qa tests look for them) for a version `asked` by the path
    or for a model asked without one."""
    why = f"{mv.reason or mv.state}"
    if asked is None:
        return error_response(503, f"Request for unknown model: '{mv.name}' has no "
                                   f"available versions (version {mv.version} is not "
                                   f"ready: {why})", headers)
    return error_response(503, f"Request for unknown model: '{mv.name}' version "
                               f"{mv.version} is not at ready state (it is not ready: "
                               f"{why})", headers)


def _failure_reason(exc: Exception) -> str | None:
    """Triton's failure reason of an admitted request that failed with `exc` (its
    statistics' `fail` and `nv_inference_request_failure{reason}`), or None for a
    refusal at admission, which Triton's statistics do not count (its enqueue refuses
    before the model sees the request): a full queue, a sequence's control flow."""
    if isinstance(exc, (Overloaded, ProtocolError)):
        return None
    if isinstance(exc, DeadlineExceeded):  # Triton: "Request timeout expired"
        return "REJECTED"
    if isinstance(exc, Error):  # the program, the runtime or the device
        return "BACKEND"
    return "OTHER"  # unloading or drained before it ran


def _failure_response(server: Server, mv: ModelVersion, exc: Exception) -> Response | None:
    """The answer to a request whose invocation raised `exc` (None: a failure of ours,
    to be raised on)."""
    if isinstance(exc, ProtocolError):  # a bad sequence control flow
        return error_response(exc.status, exc.message)
    if isinstance(exc, Overloaded):  # Triton's UNAVAILABLE "Exceeds maximum queue size"
        return error_response(503, f"model '{mv.name}' is overloaded: {exc}; retry after "
                                   f"{exc.retry_after} s",
                              [("retry-after", str(exc.retry_after))])
    if isinstance(exc, DeadlineExceeded):
        return error_response(504, f"model '{mv.name}': {exc}")
    if isinstance(exc, Unavailable):
        return error_response(503, f"model '{mv.name}' version {mv.version}: {exc}", _RETRY)
    if not isinstance(exc, Error):
        return None
    status = _ERROR_STATUS.get(exc.code, 500)
    if status == 500:
        log.error("model %s version %s failed: %s", mv.name, mv.version, exc)
    if isinstance(exc, (KernelFaultError, DeviceLostError)):
        for lost in server.repository.device_lost(mv.device, exc):
            log.error("model %s version %s is unavailable: its device %s was lost; load it "
                      "again to retry on a new device", lost.name, lost.version,
                      lost.device_name)
    return error_response(status, f"model '{mv.name}' failed: {exc}",
                          _RETRY if status == 503 else None)


def _infer_response(server: Server, mv: ModelVersion, req: Any, results: list,
                    request: Request) -> Response:
    """The 200 answer carrying `results` as `req` asked (any thread); a large one is
    charged to the memory budget until it was written (a 503 when the budget cannot take
    it: the answer is dropped at once)."""
    out, header_length = build_infer_response(mv.name, mv.version, req, results)
    if len(out) > SMALL_BYTES:
        if request.held is None:
            request.held = server.budget.hold()
        try:
            request.held.charge(len(out), "the answer")
        except BudgetExceeded as exc:
            return error_response(503, f"model '{mv.name}': {exc}", _RETRY)
    if header_length is None:
        return Response(200, out, JSON)
    return Response(200, out, "application/octet-stream",
                    [("inference-header-content-length", str(header_length))])


_PARSE_ON_LOOP_BYTES = 64 << 10
_INFLATE_CHUNK = 1 << 20  # inflated a megabyte at a time, counted against the limit
_ZLIB_OR_GZIP = 32 + zlib.MAX_WBITS  # either header, told apart by its first bytes
_GZIP = 16 + zlib.MAX_WBITS
# members of one gzip body at most: each costs a decompressor (a 64 MiB body of empty
# members would be millions); clients send one
_MAX_GZIP_MEMBERS = 16


# an index request whose 'ready' opens an array or object (refused whatever its depth)
_READY_NESTED = re.compile(rb'\s*\{\s*"ready"\s*:\s*[\[{]')


def _control_body(request: Request, what: str) -> dict:
    """The JSON object a repository request (`what`: index, load, unload) carries; {}
    for an empty body; 400 for anything else, as Triton parses each of them."""
    if not request.body.strip():
        return {}
    try:
        doc = orjson.loads(request.body)
    except ValueError as exc:
        raise ProtocolError(400, f"{what} request body is not valid JSON: {exc}") from None
    if type(doc) is not dict:
        raise ProtocolError(400, f"{what} request body must be a JSON object")
    return doc


def _control_parameters(request: Request, what: str) -> dict:
    """The `parameters` object of a load or unload request ({} when absent; null or
    another type is a 400, as Triton)."""
    params = _control_body(request, what).get("parameters", {})
    if type(params) is not dict:
        raise ProtocolError(400, f"{what} request 'parameters' must be an object")
    return params


_REPORT_TRIES = 3


class _PendingReport:
    __slots__ = ("done", "response", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.response: Response | None = None
        self.error: Exception | None = None


class _SharedReport:
    """A report of every model (the repository index, statistics): built on a worker
    thread, one build at a time, and each build's answer given to every request that
    arrived before it began. However many clients ask at once, one build runs and one
    more waits, and each answer is as new as its request. (Built on the loop, each was
    milliseconds of Python with 1,000 models: 40 clients asking for three each stalled
    every other request 364 ms.)"""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._lock = trio.Lock()
        self._next: _PendingReport | None = None  # the build not begun yet

    async def answer(self) -> Response:
        pending = self._next
        if pending is not None:
            await pending.done.wait()
        else:
            pending = self._next = _PendingReport()
            # not cancelled once others joined it: the wait is one build at most
            with trio.CancelScope(shield=True):
                async with self._lock:
                    self._next = None  # who asks from now on waits for a later build
                    try:
                        pending.response = await trio.to_thread.run_sync(
                            _built_report, self._build)
                    except Exception as exc:  # noqa: BLE001 - every waiter raises it
                        pending.error = exc
                    finally:
                        pending.done.set()
        if pending.error is not None:
            raise pending.error
        return pending.response


def _built_report(build: Callable[[], Any]) -> Response:
    """The JSON answer of `build()` (on a worker thread); what the loop changed while it
    was read (a dict resized under iteration) is read again."""
    for _ in range(_REPORT_TRIES - 1):
        try:
            return json_response(build())
        except RuntimeError:  # a dict the loop changed while it was read
            continue
    return json_response(build())


def _stats_doc(mv: ModelVersion) -> dict:
    """Triton's statistics of a version, plus its sequences' when it has any."""
    doc = mv.stats.doc(mv.name, mv.version)
    if mv.sequences is not None:
        doc["sequence_stats"] = mv.sequences.sequence_statistics()
    return doc


def api_group(path: str) -> str | None:
    """The Triton API group (`--http-restricted-api`) a route belongs to."""
    if path.startswith("/v2/health/"):
        return "health"
    if path.startswith("/v2/repository/"):
        return "model-repository"
    if path == "/metrics":
        return "metrics"
    if path.startswith("/v2/models"):
        tail = path.rsplit("/", 1)[-1]
        return {"infer": "inference", "stats": "statistics", "config": "model-config",
                "ready": "health"}.get(tail, "metadata")
    return "metadata"


API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config",
              "model-repository", "statistics", "trace", "logging", "metrics")


def _parse_large(request: Request, limit: int, mv: ModelVersion) -> Any:
    """Parses a large or encoded request on a worker thread: the inflated body and the
    arrays of its JSON tensors charged to the request's hold before they are made, each
    JSON tensor checked against `mv`'s signature before its data is parsed; then the
    memory it freed goes back to the system (a worker thread's malloc arena would
    otherwise keep the freed blocks)."""
    hold = request.held

    def charge(nbytes: int, what: str) -> None:
        try:
            hold.charge(nbytes, what)
        except BudgetExceeded as exc:
            raise ProtocolError(503, str(exc)) from None

    try:
        body = _decode_body(request, limit, charge)
        return parse_infer_request(body, request.headers.get(
            "inference-header-content-length"), check=mv.check_input, charge=charge)
    except ProtocolError as exc:
        # raised afresh, without the traceback whose frames hold the inflated bytes
        failure = ProtocolError(exc.status, exc.message)
    finally:
        body = None
        release_freed_memory()
    raise failure


def _decode_body(request: Request, limit: int, charge: Any) -> bytes | bytearray:
    """The body after Content-Encoding (the HTTP layer already bounded its raw size),
    each piece of an inflated one charged (`charge(nbytes, what)`) before it is made.
    Either coding may carry a zlib or a gzip header, as Triton's frontend reads them; a
    gzip body may hold several members (RFC 1952), read one after the other. A stream
    that ends early (its checksum never arrived) or is followed by other bytes is a
    400: its data cannot be trusted whole."""
    body = request.body
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("identity", ""):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ProtocolError(415, f"Content-Encoding {encoding!r} is not supported "
                                 f"(gzip, deflate)")
    decompressor = zlib.decompressobj(wbits=_ZLIB_OR_GZIP)
    # grown in place (a large buffer is remapped, not copied): no pieces joined at the
    # end, which would hold the body twice
    inflated = bytearray()
    pending = body
    charged = members = 0
    try:
        while True:
            if len(inflated) + _INFLATE_CHUNK > charged:  # room for the next piece
                charge(len(inflated) + _INFLATE_CHUNK - charged, "the inflated request body")
                charged = len(inflated) + _INFLATE_CHUNK
            chunk = decompressor.decompress(pending, _INFLATE_CHUNK)
            if len(inflated) + len(chunk) > limit:
                inflated = None
                raise ProtocolError(413, f"decompressed request body exceeds the limit of "
                                         f"{limit} bytes (--max-request-bytes)")
            inflated += chunk
            pending = decompressor.unconsumed_tail
            if decompressor.eof:
                rest = len(decompressor.unused_data)
                if not rest:
                    break
                members += 1
                if encoding != "gzip" or members == _MAX_GZIP_MEMBERS:
                    raise ProtocolError(400, f"request body has {rest} bytes after the end "
                                             f"of its {encoding} stream" + (
                                                 f" (at most {_MAX_GZIP_MEMBERS} gzip "
                                                 f"members)" if members > 1 else ""))
                pending = memoryview(body)[len(body) - rest:]  # the next gzip member
                decompressor = zlib.decompressobj(wbits=_GZIP)
            elif not pending and len(chunk) < _INFLATE_CHUNK:
                raise ProtocolError(400, f"request body is truncated: its {encoding} "
                                         f"stream ends before its end marker and checksum")
    except zlib.error as exc:
        if members:
            raise ProtocolError(400, f"request body has {rest} bytes after the end of its "
                                     f"gzip stream that are not another gzip member "
                                     f"({exc})") from None
        raise ProtocolError(400, f"request body is not valid {encoding}: {exc}") from None
    return inflated


_SECONDS = re.compile(r"[ \t]*(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t]*")


def _deadline(header: str | None, timeout_us: float | None, mv: ModelVersion,
              max_timeout: float | None, arrived: float) -> float:
    limits = []
    if header is not None:
        # a plain decimal number: float() would also take '1_0', 'inf' and 'nan'
        seconds = float(header) if _SECONDS.fullmatch(header) else -1.0
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
