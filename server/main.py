"""`tinyhal-serve`: the KServe V2 inference daemon.

    tinyhal-serve [--model-repository DIR] [--host HOST] [--port PORT] [--device DRIVER]

With no arguments it serves the sample models bundled in the package on 127.0.0.1:8000.
HTTP/1.1 is httptools (llhttp) driven directly on trio streams (`server/http.py`); the
event loop only moves bytes and schedules, every model execution runs on its model's
instance threads (`server/instances.py`).

Start-up: the listener opens first (liveness answers at once), then models load in a
worker thread and readiness turns 200. With --exit-on-error (default) a model that fails
to load stops the server with exit code 1; with --no-exit-on-error it is served as
unavailable and readiness stays 503.

SIGTERM (or SIGINT) drains: readiness turns 503, the listener closes (a request already sent
on an open connection is answered, 503 "draining" if it is new work), requests in flight
finish (up to --drain-timeout seconds), invocations still running in the background
finish, then the process exits 0. With sequence models the listener first stays open
while sequences live here or requests are admitted: steps of live sequences are served
until they end or idle out, new work (a stateless request, a START) is answered 503
with Retry-After and "draining", a step of a sequence not live here the usual 400.
Whatever the bound leaves unfinished is answered (503 queued, 504 running) with a log
line each.

Every other signal whose default action would end the process has a meaning of its own,
so no signal kills it with a request in flight:

    SIGTERM, SIGINT, SIGQUIT   drain and exit (as above; QUIT dumps no core)
    SIGHUP                     with --model-control-mode poll: re-read the repository now
                               (a poll out of turn); otherwise logged and ignored
    SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT, SIGXCPU,
    SIGXFSZ, SIGPIPE and the real-time signals
                               ignored (SIGXFSZ: the write fails with EFBIG instead;
                               SIGXCPU: the kernel's SIGKILL at the hard limit remains)

SIGKILL and SIGSTOP cannot be caught; SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT and
SIGSYS report a fault of the process itself and keep their default action.

One model cannot take the server down: a model whose directory, configuration or
program is wrong is UNAVAILABLE with its reason (repository index, log), at start, on a
load and on a poll, and the others serve; with --exit-on-error (the default) such a
model at start-up still stops the server with exit code 1, --no-exit-on-error serves the
others (readiness stays 503 while a model is unavailable).

Exit codes (always one of these, never death by a signal):

    0  clean stop: every invocation finished within the drain budget
    1  start-up failed: a model failed to load (with --exit-on-error)
    2  bad command line or unusable environment (port in use, unreadable repository)
    3  the drain budget ran out with invocations still running
    4  a second SIGTERM/SIGINT during the drain (one after the drain completed is ignored)

With 3 and 4 the invocations still running are abandoned: each is logged (model, version,
request id, seconds it ran), logs are flushed and the process ends at once with
`os._exit`, without closing devices whose memory kernels may still be writing.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import signal
import sys
from functools import partial
from pathlib import Path

import trio

from .. import __version__
from ..errors import Error
from ..hal import available_drivers
from ..vm.files import open_regular_file
from ..vm.run_flags import UsageParser
from . import cpus
from .app import API_GROUPS, Server, error_response
from .budget import MemoryBudget, default_limit, parse_size
from .http import HttpServer
from .lag import LagMonitor
from .protocol import ProtocolError
from .repository import ModelRepository, bundled_models_dir

log = logging.getLogger("tinyhal.server")

__all__ = ["EXIT_DRAIN_TIMEOUT", "EXIT_OK", "EXIT_SECOND_SIGNAL", "EXIT_START_FAILED",
           "EXIT_USAGE", "main", "serve"]

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_USAGE = 2
EXIT_DRAIN_TIMEOUT = 3
EXIT_SECOND_SIGNAL = 4

_DRAIN_POLL_SECONDS = 0.02  # how often a drain looks whether sequences and requests remain
_ANSWER_GRACE_SECONDS = 1.0  # for the answers the drain's bound gave to reach clients
_RESERVED_FDS = 64  # descriptors kept for model files, devices, threads, logs
_MIN_POLL_SECONDS = 0.05
_SWITCH_INTERVAL = 0.0005  # seconds; measured on the bundled models (docs/performance.md)


def _abandon_and_exit(server: Server, code: int, why: str) -> None:
    """Logs every invocation still running, flushes, and ends the process with `code`.

    Device memory is never freed here: kernels of the abandoned invocations may still be
    writing it, so the process ends without tearing anything down.
    """
    running = server.running_invocations()
    now = trio.current_time()
    log.error("%s: abandoning %d invocation(s) still running", why, len(running))
    for r in running:
        log.error("abandoned: %s (running %.3f s%s)", r.label, now - r.started,
                  "; its request already got 504" if r.detached else "")
    say(f"tinyhal-serve: stopped (exit {code})")
    _end_process(code)


def _end_process(code: int) -> None:
    """Flushes logs and stdio and ends the process with `code`, at once: no interpreter
    teardown (which would restore default signal handlers and join threads)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="tinyhal-serve",
        description="Serve IREE-compiled .vmfb models over KServe V2 REST with tinyhal.",
    )
    p.add_argument("--version", action="version", version=f"tinyhal-serve {__version__}")
    p.add_argument("--model-repository", type=Path, action=_Once, default=None,
                   metavar="DIR",
                   help="DIR/<model>/<version>/model.vmfb (+ config.json); default: the "
                        "bundled sample models (one repository: give it once)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000,
                   help="port (default 8000; 0 picks a free one and prints it)")
    p.add_argument("--device", default="task",
                   help="default driver for models whose config names none: task|sync|emu")
    p.add_argument("--executable-policy", default="any", choices=["any", "portable"],
                   help="'portable' refuses executables that carry native machine code: "
                        "only VMVX models load (for model sources not fully trusted)")
    p.add_argument("--max-request-bytes", type=int, default=64 << 20,
                   help="largest request body accepted (413 beyond; default 64 MiB)")
    p.add_argument("--max-timeout", type=float, default=None, metavar="SECONDS",
                   help="upper bound on every request's deadline (504 beyond)")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM, how long in-flight requests may take (default 30)")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="how long an idle client connection stays open between requests "
                        "(default 5)")
    p.add_argument("--request-head-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="time a client has to send a request's head once it began (408 "
                        "beyond; default 10)")
    p.add_argument("--request-body-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="longest pause while a request body arrives (408 beyond; default 30)")
    p.add_argument("--send-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="longest a client may read nothing of an answer being written; "
                        "its connection then closes and the answer is dropped (default 30)")
    p.add_argument("--client-memory-limit", type=_size, default=None, metavar="BYTES",
                   help="bytes held for clients at most: request bodies, inflated bodies, "
                        "parsed tensors and unread answers; a request beyond it gets 503 "
                        "(K/M/G suffixes; default a quarter of the memory available, at "
                        "most 1G)")
    p.add_argument("--python-cpu", default="auto", metavar="auto|none|CPU",
                   help="the CPU the event loop and single model instances share: they "
                        "take turns on the interpreter lock, and handing it between CPUs "
                        "costs more than it saves (default auto: the CPU the server "
                        "starts on; none: any)")
    p.add_argument("--max-connections", type=int, default=1000, metavar="N",
                   help="open connections at most; beyond, the oldest connection that is "
                        "idle, still sending its request or not reading its answer is "
                        "closed (default 1000)")
    p.add_argument("--model-control-mode", choices=["none", "explicit", "poll"],
                   default="none",
                   help="none: repository models load at start, load/unload are refused; "
                        "explicit: the repository API loads and unloads; poll: the "
                        "repository is re-scanned every --repository-poll-secs")
    p.add_argument("--repository-poll-secs", type=float, default=15.0, metavar="SECONDS",
                   help="poll interval of --model-control-mode poll (default 15)")
    p.add_argument("--load-model", action="append", default=None, metavar="NAME",
                   help="with explicit control: the models to load at start (repeat; "
                        "'*' for every one; none by default, as Triton's)")
    p.add_argument("--http-restricted-api", action="append", default=[],
                   metavar="API[,API...]:HEADER=VALUE",
                   help="these API groups (" + ", ".join(API_GROUPS) + ") answer 403 "
                        "unless the request carries HEADER: VALUE (repeatable; VALUE "
                        "@FILE or env:NAME reads it from a file or an environment "
                        "variable, keeping the secret out of the command line)")
    p.add_argument("--exit-on-error", action=argparse.BooleanOptionalAction, default=True,
                   help="exit 1 when a model fails to load (default on)")
    p.add_argument("--access-log", action="store_true", help="log every request to stderr")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"],
                   help="least severe log records written to stderr (default info)")
    return p


class _Once(argparse.Action):
    """A flag that may be given once: argparse would keep the last of several silently
    (an operator giving two repositories would serve only the second's models)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        if getattr(namespace, self.dest) is not None:
            raise argparse.ArgumentError(self, "is given twice; one repository is served "
                                               "(Triton's several repositories are not "
                                               "supported: put the model directories in "
                                               "one)")
        setattr(namespace, self.dest, values)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class StartupError(Exception):
    """A one-line reason the server cannot start (exit code 2)."""


async def serve(args: argparse.Namespace) -> int:
    """Runs the server until SIGTERM/SIGINT; returns the exit code."""
    root = args.model_repository or bundled_models_dir()
    try:
        repository = ModelRepository(root, default_device=args.device,
                                     executable_policy=args.executable_policy)
    except OSError as exc:
        raise StartupError(f"cannot read the model repository {root}: "
                           f"{exc.strerror or exc}") from None
    if args.model_control_mode == "explicit" and "*" not in (args.load_model or ()):
        wanted = set(args.load_model or ())  # none by default, as Triton's
        unknown = sorted(wanted - set(repository.models)
                         - set(repository.problems))
        if unknown:
            raise StartupError(f"--load-model: no model {', '.join(unknown)} in the "
                               f"repository")
        for name in list(repository.models):
            if name not in wanted:
                del repository.models[name]
        for name in list(repository.problems):  # not to load: not a failure here
            if name not in wanted:
                repository.forget_problem(name)
    budget = MemoryBudget(args.client_memory_limit or default_limit())
    server = Server(repository, max_request_bytes=args.max_request_bytes,
                    max_timeout=args.max_timeout, model_control_mode=args.model_control_mode,
                    restricted=args.restricted, budget=budget)
    repository.token = trio.lowlevel.current_trio_token()
    repository.python_cpu = args.python_cpu
    http = HttpServer(server.handle, error_response, max_body=args.max_request_bytes,
                      keep_alive_timeout=args.keep_alive_timeout, access_log=args.access_log,
                      head_timeout=args.request_head_timeout,
                      body_timeout=args.request_body_timeout,
                      max_connections=args.max_connections, send_timeout=args.send_timeout,
                      budget=budget)
    server.settle = http.settle
    lag = LagMonitor()
    server.metrics.registry.register(lag)
    try:
        listeners = await trio.open_tcp_listeners(args.port, host=args.host)
    except OSError as exc:
        raise StartupError(f"cannot listen on {args.host} port {args.port}: "
                           f"{exc.strerror or exc}") from None

    shutdown = trio.Event()
    exit_code = EXIT_OK
    drain_deadline = math.inf  # one budget for the whole drain, set when it starts

    async def watch_signals(task_status=trio.TASK_STATUS_IGNORED) -> None:
        nonlocal drain_deadline
        with trio.open_signal_receiver(*_DRAIN_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                _SIGNALS.drain_started = True
                if not shutdown.is_set():
                    log.info("%s: draining (finishing in-flight requests, up to %g s)",
                             signal.Signals(signum).name, args.drain_timeout)
                    server.draining = True
                    drain_deadline = trio.current_time() + args.drain_timeout
                    shutdown.set()
                else:
                    _abandon_and_exit(server, EXIT_SECOND_SIGNAL,
                                      f"second {signal.Signals(signum).name}")

    poll_now_send, poll_now = trio.open_memory_channel[None](1)

    async def watch_hangup(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGHUP) as signals:
            task_status.started()
            async for _ in signals:
                if args.model_control_mode == "poll":
                    log.info("SIGHUP: reading the model repository again")
                    try:
                        poll_now_send.send_nowait(None)
                    except trio.WouldBlock:
                        pass  # a poll out of turn is already due
                else:
                    log.info("SIGHUP ignored: the repository is re-read on SIGHUP only "
                             "with --model-control-mode poll")

    http_done = trio.Event()

    async def run_http() -> None:
        try:
            await http.serve(listeners)
        finally:
            http_done.set()

    try:
        async with trio.open_nursery() as outer:
            server.background = outer
            await outer.start(watch_signals)
            await outer.start(watch_hangup)
            outer.start_soon(lag.run)
            outer.start_soon(run_http)
            for listener in listeners:
                host, port = listener.socket.getsockname()[:2]
                host = f"[{host}]" if ":" in host else host
                say(f"tinyhal-serve: listening on http://{host}:{port}")
            failed = [f"{mv.name}/{mv.version}" for mv in
                      await trio.to_thread.run_sync(repository.load_all)]
            failed += repository.unavailable_models()
            repository.started = True
            server.models_loaded()
            if failed and args.exit_on_error:
                log.error("%d model(s) or version(s) failed to load; exiting "
                          "(--no-exit-on-error serves the rest)", len(failed))
                exit_code = EXIT_START_FAILED
                server.draining = True
                shutdown.set()
            elif not shutdown.is_set():
                names = [f"{mv.name}/{mv.version}" for mv in repository.all_versions()
                         if mv.ready]
                if failed:
                    say(f"tinyhal-serve: serving ({', '.join(names) or 'no models'}); "
                        f"unavailable: {', '.join(failed)}")
                else:  # readiness answers 503 while no model is loaded: say so
                    say(f"tinyhal-serve: ready ({', '.join(names)})" if names else
                        "tinyhal-serve: serving no models (not ready)")
                if args.model_control_mode == "poll":
                    outer.start_soon(poll_repository, server, args.repository_poll_secs,
                                     poll_now)
            await shutdown.wait()
            if drain_deadline == math.inf:
                drain_deadline = trio.current_time() + args.drain_timeout
            # with sequence models, the listener stays open while sequences live here
            # or requests are admitted: steps of live sequences are served, new work
            # is answered 503 "draining" (app.py); a load balancer retries it elsewhere
            if server.serves_sequences():
                with trio.move_on_at(drain_deadline):
                    while server.holds_work():
                        await trio.sleep(_DRAIN_POLL_SECONDS)
            # the listener closes, idle connections close after a grace, requests in
            # flight finish ...
            http.drain()
            with trio.move_on_at(drain_deadline):
                await http_done.wait()
            # ... what the bound left unfinished is answered now (503 queued, 504
            # running; each logged) and its answer given a moment to go out ...
            abandoned = server.abandon(f"the drain's bound (--drain-timeout "
                                       f"{args.drain_timeout:g} s) ran out")
            if abandoned:
                log.warning("drain: answered %d request(s) the bound left unfinished",
                            abandoned)
                with trio.move_on_after(_ANSWER_GRACE_SECONDS):
                    await http_done.wait()
            # ... then invocations still running in the background (e.g. after a 504),
            # within what is left of the same budget
            with trio.move_on_at(drain_deadline):
                await server.wait_idle()
            if server.running_invocations():
                _abandon_and_exit(server, EXIT_DRAIN_TIMEOUT,
                                  f"drain timeout ({args.drain_timeout:g} s)")
            if not http_done.is_set():
                log.warning("drain: closing %d connection(s) the bound left open (a client "
                            "not reading its answer, or a request still arriving)",
                            http.open_connections)
            outer.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(repository.close)
    say(f"tinyhal-serve: stopped (exit {exit_code})")
    return exit_code


async def poll_repository(server: Server, seconds: float,
                          poll_now: trio.MemoryReceiveChannel | None = None) -> None:
    """`--model-control-mode poll`: every `seconds` (and whenever `poll_now` receives,
    SIGHUP), new models load, changed versions reload (swapped in once loaded), models
    whose directory is gone unload. A model that fails, in any way, fails alone: it is
    logged and left UNAVAILABLE (a version that served keeps serving), and the poll goes
    on with the others."""
    repository = server.repository
    unreadable = ""  # why the last poll could not list the repository (logged once)
    seen: dict[str, tuple] = {}  # model -> its files' signature when last looked at
    while True:
        with trio.move_on_after(seconds):
            if poll_now is not None:
                await poll_now.receive()
            else:
                await trio.sleep_forever()
        try:
            names = await trio.to_thread.run_sync(repository.model_names)
        except OSError as exc:
            why = str(exc.strerror or exc)
            if why != unreadable:
                log.error("poll: cannot read the model repository: %s (the models loaded "
                          "keep serving; logged again once it can be read)", why)
            unreadable = why
            continue
        if unreadable:
            log.info("poll: the model repository can be read again")
            unreadable = ""
        signatures = await trio.to_thread.run_sync(repository.signatures, names)
        async with server.repository_lock:
            if server.draining:
                return
            for name in names:
                if name not in signatures or seen.get(name) == signatures[name]:
                    continue  # its files are as they were: nothing to read again
                seen[name] = signatures[name]
                try:  # a version that fails is logged by the load itself
                    await repository.reload(name, server.background, changed_only=True,
                                            listed=True)
                except ProtocolError:
                    continue  # nothing to load: `scan_model` logged why
                except Exception:  # noqa: BLE001 - one model never ends the polls
                    log.exception("poll: model %s", name)
                    continue
                for mv in repository.models.get(name, {}).values():
                    server.create_series(mv)
            for name in [n for n in repository.models if n not in names]:
                repository.retire_model(name, server.background)  # no wait under the lock
                del repository.models[name]
            for name in [n for n in seen if n not in signatures]:
                del seen[name]


class _SignalState:
    drain_started = False


_SIGNALS = _SignalState()


def say(line: str) -> None:
    """Prints a status line; a closed or broken stdout changes nothing else."""
    try:
        print(line, flush=True)
    except (OSError, ValueError):
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from prometheus_client import disable_created_metrics

    disable_created_metrics()  # no *_created series: they double the exposition
    problem = _command_line_problem(args)
    if problem:
        print(f"tinyhal-serve: {problem}", file=sys.stderr)
        return EXIT_USAGE
    descriptors = _raise_open_files_limit()
    if descriptors is not None and args.max_connections > descriptors - _RESERVED_FDS:
        args.max_connections = max(1, descriptors - _RESERVED_FDS)
        log.warning("--max-connections lowered to %d: the process may open %d files",
                    args.max_connections, descriptors)
    # The event loop and the instance threads share the GIL: with CPython's default 5 ms
    # switch interval, a thread that gave the GIL up for a kernel call waits up to 5 ms to
    # get it back from a busy loop (and the loop as long behind an instance thread).
    sys.setswitchinterval(_SWITCH_INTERVAL)
    cpus.pin_current_thread(args.python_cpu)  # the loop, and the helper threads it starts
    # Until the server's own handler takes over, a signal stops like a second signal;
    # once the drain began, signals the trio handler no longer sees (after it ended)
    # are ignored: the process is already stopping with its own exit code.
    for signum in _DRAIN_SIGNALS:
        signal.signal(signum, _early_signal)
    for signum in _IGNORED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    try:
        code = trio.run(partial(serve, args))
    except (FileNotFoundError, StartupError) as exc:
        print(f"tinyhal-serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        code = EXIT_SECOND_SIGNAL
    # The interpreter's own teardown puts the default signal handlers back, so a signal
    # arriving then would kill the process: end it here, with the code already decided.
    _end_process(code)


_DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
# ignored from the start; SIGHUP only until the server watches it (then it re-polls)
_IGNORED_SIGNALS = tuple(
    getattr(signal, name) for name in (
        "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGIO",
        "SIGPWR", "SIGSTKFLT", "SIGXCPU", "SIGXFSZ", "SIGPIPE")
    if hasattr(signal, name)) + tuple(
    range(signal.SIGRTMIN, signal.SIGRTMAX + 1) if hasattr(signal, "SIGRTMIN") else ())


def _command_line_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line, or None: every flag is checked
    here, before anything starts (no listener, no model, no device), so a mistake exits 2
    at once instead of after "listening". Fills `args.restricted` and `args.python_cpu`."""
    if not 0 <= args.port <= 65535:
        return f"--port {args.port} is out of range (0-65535; 0 picks a free port)"
    drivers = available_drivers()
    if args.device not in drivers and args.device.removeprefix("local-") not in drivers:
        return (f"--device {args.device}: not a driver here; drivers: {', '.join(drivers)} "
                f"(a model's config.json may name its own)")
    root = args.model_repository
    if root is not None:
        if not root.is_dir():
            return f"--model-repository {root} is not a directory"
        if not os.access(root, os.R_OK | os.X_OK):
            return f"--model-repository {root} is not readable"
    if args.max_timeout is not None and not (args.max_timeout > 0 and
                                             math.isfinite(args.max_timeout)):
        return "--max-timeout must be a positive number"
    for flag in ("request_head_timeout", "request_body_timeout", "repository_poll_secs",
                 "keep_alive_timeout", "send_timeout"):
        value = getattr(args, flag)
        if not (value > 0 and math.isfinite(value)):
            return f"--{flag.replace('_', '-')} must be a positive number"
    if args.repository_poll_secs < _MIN_POLL_SECONDS:
        return (f"--repository-poll-secs {args.repository_poll_secs:g} is below "
                f"{_MIN_POLL_SECONDS:g}: each poll lists the repository and stats every "
                f"model, so polls that close together only keep a CPU busy")
    if not (args.drain_timeout >= 0 and math.isfinite(args.drain_timeout)):
        return "--drain-timeout must be a number of seconds >= 0"
    if args.max_request_bytes < 1:
        return "--max-request-bytes must be >= 1"
    if args.max_connections < 1:
        return "--max-connections must be >= 1"
    if args.load_model and args.model_control_mode != "explicit":
        return "--load-model needs --model-control-mode explicit"
    if args.load_model and "*" in args.load_model and len(args.load_model) > 1:
        return "--load-model '*' (every model) must be the only --load-model, as Triton's"
    try:
        args.restricted = _parse_restricted(args.http_restricted_api)
    except ValueError as exc:
        return f"--http-restricted-api: {exc}"
    try:
        args.python_cpu = cpus.choose(args.python_cpu)
    except ValueError as exc:
        return f"--python-cpu: {exc}"
    return None


def _early_signal(signum: int, frame: object) -> None:
    if not _SIGNALS.drain_started:
        raise KeyboardInterrupt


def _parse_restricted(values: list[str], read_secrets: bool = True
                      ) -> dict[str, tuple[str, str]]:
    """`API[,API...]:HEADER=VALUE` flags -> {API group: (lower-case header, value)}.

    VALUE `@PATH` is the content of the file PATH, `env:NAME` the environment variable
    NAME (trailing newlines dropped; empty or missing is an error): the secret stays out
    of the command line, which every process on the host can read. `read_secrets=False`
    checks the syntax and keeps such values as written."""
    restricted: dict[str, tuple[str, str]] = {}
    for value in values:
        groups, sep, rule = value.partition(":")
        header, eq, expected = rule.partition("=")
        if not sep or not eq or not header.strip() or not groups:
            raise ValueError(f"{value!r} is not API[,API...]:HEADER=VALUE")
        if not _HEADER_NAME.fullmatch(header.strip()):
            raise ValueError(f"{header.strip()!r} is not an HTTP header name")
        if read_secrets:
            expected = _secret(expected)
        for group in groups.split(","):
            if group not in API_GROUPS:
                raise ValueError(f"unknown API group {group!r}; groups: "
                                 f"{', '.join(API_GROUPS)}")
            if group in restricted:
                raise ValueError(f"API group {group!r} is restricted twice")
            restricted[group] = (header.strip().lower(), expected)
    return restricted


def _secret(value: str) -> str:
    """A header value as given, or read from `@FILE` / `env:NAME` (see _parse_restricted)."""
    if value.startswith("@"):
        secret = _secret_file(value[1:])
        where = f"the file {value[1:]}"
    elif value.startswith("env:"):
        secret = os.environ.get(value[4:], "").rstrip("\r\n")
        where = f"the environment variable {value[4:]}"
    else:
        secret, where = value, "the command line"
    if not secret:  # an empty header would then open the API
        raise ValueError(f"the header value from {where} is empty (or unset)")
    if not _HEADER_VALUE.fullmatch(secret):  # no request could ever carry it
        raise ValueError(f"the header value from {where} is not one a request can carry: "
                         f"visible ASCII characters, spaces only between them")
    return secret


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
_HEADER_VALUE = re.compile(r"[!-~]+(?:[ \t]+[!-~]+)*")
_MAX_SECRET_BYTES = 4096


def _secret_file(path: str) -> str:
    """The header value held by the file `path`: a regular file (a FIFO or a device is
    refused without blocking) of at most `_MAX_SECRET_BYTES`, trailing newlines
    dropped."""
    try:
        fd, st = open_regular_file(path, "header value file")
        with os.fdopen(fd, "rb") as f:
            data = f.read(_MAX_SECRET_BYTES + 1)
    except Error as exc:
        raise ValueError(f"cannot read the header value from {path}: "
                         f"{exc.message.removeprefix(f'{path}: ')}") from None
    except OSError as exc:
        raise ValueError(f"cannot read the header value from {path}: "
                         f"{exc.strerror or exc}") from None
    if len(data) > _MAX_SECRET_BYTES:
        raise ValueError(f"the header value file {path} is larger than "
                         f"{_MAX_SECRET_BYTES} bytes")
    try:
        return data.decode("ascii").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ValueError(f"the header value file {path} holds bytes that are not "
                         f"ASCII") from None


def _raise_open_files_limit() -> int | None:
    """Lets the process hold as many connections as the hard limit allows (the
    connection cap, not the soft descriptor limit, should bound them); returns the
    descriptors it may open (None when unknown)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 16
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return None


if __name__ == "__main__":
    sys.exit(main())
