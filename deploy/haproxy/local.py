"""tinyhal-serve replicas behind HAProxy on 127.0.0.1: what `local.sh` runs.

    local.sh --replicas N --port P [--drain-timeout S] [--run-dir DIR]
             [--haproxy-config FILE] [tinyhal-serve flags...]

Starts N `tinyhal-serve` replicas on ports of their own (127.0.0.1, picked by each
replica) and HAProxy (deploy/haproxy/haproxy.cfg, unchanged) on port P; each replica is
put in an empty server slot of HAProxy (`slot1` ... `slot<--max-replicas>`) through its
runtime API once it printed "ready", and one line says when every replica is ready and P
answers V2. While it runs (the pid is in that line):

    kill -USR1 PID   adds a replica (added to HAProxy once ready)
    kill -USR2 PID   drains the newest replica: HAProxy sends it only steps of the
                     sequences it holds; once it holds none (or --drain-timeout passed)
                     it gets SIGTERM, and is removed once it exited
    kill -TERM PID   drains every replica that way, stops them and HAProxy, exits 0
                     (1 when a replica exited with another code)

The runtime API socket (DIR/haproxy.sock) takes HAProxy's own commands too, e.g.
`show servers state replicas`, `set server replicas/slot2 state drain`, `show table replicas`.
Only the standard library: any python3 runs it; `tinyhal-serve` is found on PATH (or the
command in $TINYHAL_SERVE), `haproxy` likewise (or $HAPROXY).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

CONFIG = Path(__file__).resolve().parent / "haproxy.cfg"
BACKEND = "replicas"
# the replicas' idle keep-alive outlives HAProxy's (4 s), so HAProxy never reuses a
# connection a replica is closing
REPLICA_FLAGS = ["--keep-alive-timeout", "60"]
START_TIMEOUT = 120.0
MAX_SLOTS = 1024  # HAProxy server slots (--max-replicas) at most


def say(line: str) -> None:
    print(f"local.sh: {line}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RuntimeApi:
    """HAProxy's runtime API over its unix socket: one command per connection."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, command: str, timeout: float = 10.0) -> str:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            s.connect(str(self.path))
            s.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def server_states(self) -> dict[str, int]:
        """{server name: operational state} (0 stopped, 2 running)."""
        states = {}
        for line in self(f"show servers state {BACKEND}").splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[0].isdigit():
                states[fields[3]] = int(fields[5])
        return states


class Replica:
    """One tinyhal-serve process; its port once it listens."""

    def __init__(self, name: str, command: list[str], flags: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", "0", *REPLICA_FLAGS, *flags],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.port = 0
        self.slot = ""  # its HAProxy server, once added
        self.ready = threading.Event()
        self.listening = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            sys.stdout.write(f"[{self.name}] {line}")
            sys.stdout.flush()
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                self.listening.set()
            if "tinyhal-serve: ready" in line or "tinyhal-serve: serving" in line:
                self.ready.set()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.2):
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited {self.proc.returncode} "
                                   f"before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {self.name} not ready after {timeout:g} s")

    def load(self) -> float:
        """Live sequences + invocations running + requests queued, from /metrics."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(("tinyhal_sequences_live{", "tinyhal_inference_in_flight{",
                                "tinyhal_inference_queued{")):
                total += float(line.rsplit(" ", 1)[1])
        return total


class ReplicaSet:
    def __init__(self, args: argparse.Namespace, flags: list[str], run_dir: Path) -> None:
        self.args = args
        self.flags = flags
        self.command = shlex.split(os.environ.get("TINYHAL_SERVE", "tinyhal-serve"))
        self.api = RuntimeApi(run_dir / "haproxy.sock")
        self.replicas: list[Replica] = []
        self.free_slots = [f"slot{i}" for i in range(1, args.max_replicas + 1)]
        self.count = 0
        self.lock = threading.Lock()
        haproxy = os.environ.get("HAPROXY") or shutil.which("haproxy")
        if haproxy is None:
            raise RuntimeError("haproxy not found (Debian: apt-get install haproxy)")
        env = dict(os.environ, TINYHAL_LB_BIND=f"127.0.0.1:{args.port}",
                   TINYHAL_LB_RUNTIME_API=str(self.api.path),
                   TINYHAL_LB_PEER=f"127.0.0.1:{free_port()}",
                   TINYHAL_MAX_REPLICAS=str(args.max_replicas))
        env.pop("TINYHAL_REPLICAS_DNS", None)
        self.haproxy = subprocess.Popen([haproxy, "-db", "-f", str(args.haproxy_config)],
                                        env=env,
                                        start_new_session=True)
        deadline = time.monotonic() + 30
        while not self._listening():  # its runtime API comes up before its listener
            if self.haproxy.poll() is not None or time.monotonic() > deadline:
                self.stop_haproxy()
                raise RuntimeError(f"haproxy did not start (exit {self.haproxy.poll()}); "
                                   f"is port {args.port} free?")
            time.sleep(0.05)

    def _listening(self) -> bool:
        if self.haproxy.poll() is not None:
            return False
        try:
            self.api("show info")
            with socket.create_connection(("127.0.0.1", self.args.port), timeout=1):
                return self.haproxy.poll() is None
        except OSError:
            return False

    def api_quietly(self, command: str) -> None:
        """A runtime API command whose failure (HAProxy gone) must not stop a shutdown."""
        try:
            self.api(command)
        except OSError as exc:
            say(f"runtime API: {command}: {exc}")

    def start(self, n: int) -> list[Replica]:
        # a replica's own drain (SIGTERM from here, or from an operator) has the same bound
        flags = ["--drain-timeout", f"{self.args.drain_timeout:g}", *self.flags]
        with self.lock:
            started = []
            for _ in range(n):
                self.count += 1
                started.append(Replica(f"r{self.count}", self.command, flags))
            self.replicas.extend(started)
            return started

    def add(self, replica: Replica) -> None:
        """Puts a ready replica in a free slot and waits until HAProxy's check says it is
        up."""
        replica.wait_ready()
        with self.lock:
            if not self.free_slots:
                raise RuntimeError(f"no free server slot (--max-replicas "
                                   f"{self.args.max_replicas})")
            replica.slot = self.free_slots.pop(0)
        server = f"{BACKEND}/{replica.slot}"
        self.api(f"set server {server} addr 127.0.0.1 port {replica.port}")
        self.api(f"set server {server} state ready")
        deadline = time.monotonic() + 30
        while self.api.server_states().get(replica.slot) != 2:
            if time.monotonic() > deadline:
                raise RuntimeError(f"HAProxy never saw replica {replica.name} ready")
            time.sleep(0.1)
        say(f"replica {replica.name} ready on 127.0.0.1:{replica.port} (pid "
            f"{replica.proc.pid}; {len(self.replicas)} replicas; server {server})")

    def drain(self, replica: Replica) -> int:
        """HAProxy stops sending it new work but keeps sending steps of sequences it
        holds; once it holds none (or the drain timeout passed) it drains itself on
        SIGTERM and leaves its slot once it exited. Its exit code."""
        server = f"{BACKEND}/{replica.slot}"
        if replica.proc.poll() is None and replica.slot:
            self.api_quietly(f"set server {server} state drain")
            deadline = time.monotonic() + self.args.drain_timeout
            while time.monotonic() < deadline and replica.proc.poll() is None:
                try:
                    if replica.load() == 0:
                        break
                except (OSError, urllib.error.URLError):
                    pass  # a slow or refused read on a loaded host: keep waiting
                time.sleep(0.2)
        if replica.proc.poll() is None:
            replica.proc.send_signal(signal.SIGTERM)
        try:
            code = replica.proc.wait(timeout=self.args.drain_timeout + 30)
        except subprocess.TimeoutExpired:
            replica.proc.kill()
            code = replica.proc.wait(timeout=30)
        with self.lock:
            if replica in self.replicas:
                self.replicas.remove(replica)
            if replica.slot:
                self.api_quietly(f"set server {server} state maint")
                self.free_slots.append(replica.slot)
        return code

    def answers_v2(self) -> bool:
        url = f"http://127.0.0.1:{self.args.port}/v2"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop_haproxy(self) -> None:
        if self.haproxy.poll() is None:
            self.haproxy.send_signal(signal.SIGUSR1)  # soft stop: finish what is open
            try:
                self.haproxy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.haproxy.kill()
                self.haproxy.wait(timeout=10)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(
        prog="local.sh", description="tinyhal-serve replicas behind HAProxy on 127.0.0.1; "
        "other flags go to every tinyhal-serve")
    p.add_argument("--replicas", type=int, required=True, metavar="N")
    p.add_argument("--port", type=int, required=True, metavar="P",
                   help="HAProxy's port, where clients connect")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="how long a replica leaving keeps serving its live sequences "
                        "(default 30); also each replica's own --drain-timeout, the bound "
                        "of its drain on SIGTERM")
    p.add_argument("--max-replicas", type=int, default=16, metavar="N",
                   help="HAProxy's server slots: replicas at most (default 16)")
    p.add_argument("--run-dir", type=Path, default=None, metavar="DIR",
                   help="where the runtime API socket lives (default: a new temporary "
                        "directory)")
    p.add_argument("--haproxy-config", type=Path, default=CONFIG, metavar="FILE",
                   help="HAProxy's configuration (default: the shipped haproxy.cfg beside "
                        "this script; a replacement keeps its `replicas` backend and "
                        "environment variables)")
    args, flags = p.parse_known_args(argv)
    if args.replicas < 1:
        p.error("--replicas must be at least 1")
    if args.max_replicas < args.replicas:
        p.error("--max-replicas must be at least --replicas")
    if args.max_replicas > MAX_SLOTS:  # HAProxy fails to start with 100,000 slots
        p.error(f"--max-replicas must be at most {MAX_SLOTS}")
    if not 1 <= args.port <= 65535:
        p.error("--port must be 1-65535")
    if not 0 <= args.drain_timeout < float("inf"):  # NaN fails both
        p.error("--drain-timeout must be a number of seconds >= 0")
    return args, flags


def main(argv: list[str] | None = None) -> int:
    args, flags = parse(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="tinyhal-replicas-") as tmp:
        run_dir = args.run_dir or Path(tmp)
        run_dir.mkdir(parents=True, exist_ok=True)
        stop = threading.Event()
        requests: list[str] = []
        wake = threading.Event()

        def on_signal(signum: int, frame: object) -> None:
            if signum in (signal.SIGTERM, signal.SIGINT):
                stop.set()
            else:
                requests.append("add" if signum == signal.SIGUSR1 else "drain")
            wake.set()

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, on_signal)
        try:
            replicas = ReplicaSet(args, flags, run_dir)
        except RuntimeError as exc:
            say(str(exc))
            return 2
        code = 0
        try:
            for replica in replicas.start(args.replicas):
                replicas.add(replica)
            deadline = time.monotonic() + 30
            while not replicas.answers_v2():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"port {args.port} does not answer V2 through HAProxy")
                time.sleep(0.1)
            say(f"{args.replicas} replicas ready behind http://127.0.0.1:{args.port} "
                f"(pid {os.getpid()}; runtime API {replicas.api.path})")
            while not stop.is_set():
                wake.wait(1.0)
                wake.clear()
                while requests and not stop.is_set():
                    if requests.pop(0) == "add":
                        (replica,) = replicas.start(1)
                        replicas.add(replica)
                    elif len(replicas.replicas) > 1:
                        replica = replicas.replicas[-1]
                        exit_code = replicas.drain(replica)
                        say(f"replica {replica.name} drained (exit {exit_code}; "
                            f"{len(replicas.replicas)} replicas)")
                    else:
                        say("not draining the last replica (stop with SIGTERM)")
                for replica in list(replicas.replicas):
                    if replica.proc.poll() is not None:
                        say(f"replica {replica.name} exited {replica.proc.returncode} (it "
                            f"stays in HAProxy, down: its sequences get a clear error)")
                        replicas.replicas.remove(replica)
        except (RuntimeError, OSError) as exc:
            say(str(exc))
            code = 1
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            leaving = list(replicas.replicas)
            for replica in leaving:  # none takes new work while the others drain
                if replica.slot and replica.proc.poll() is None:
                    replicas.api_quietly(f"set server {BACKEND}/{replica.slot} state drain")
            threads = []
            codes: dict[str, int] = {}
            for replica in leaving:
                t = threading.Thread(target=lambda r=replica: codes.__setitem__(
                    r.name, replicas.drain(r)))
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
            replicas.stop_haproxy()
            if any(c != 0 for c in codes.values()):
                code = code or 1
            say(f"stopped (exit {code}; replicas: "
                f"{', '.join(f'{n} exit {c}' for n, c in codes.items()) or 'none'})")
        return code


if __name__ == "__main__":
    sys.exit(main())
