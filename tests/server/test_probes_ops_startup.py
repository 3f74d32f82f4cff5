"""Probes of tinyhal-serve's start-up as a careless operator (or another user of the
host) leaves it: flag values that cannot work, a header secret read from a FIFO or a
device, and a FIFO where the shared CPU lock directory holds a lock file. Each bad flag
is one line and exit 2 before anything listens; nothing blocks. Child processes, each
bounded by a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import ServerProcess

pytestmark = pytest.mark.timeout(120)


def _start(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tinyhal.server.main", "--port", "0", *args],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, **(env or {})))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("secrets")
    os.mkfifo(root / "fifo")
    (root / "two_lines").write_text("one\ntwo\n")
    (root / "large").write_text("x" * 5000)
    (root / "latin1").write_bytes(b"caf\xe9")
    return root


# (flag values, what the one-line refusal says)
_BAD_FLAGS = [
    (["--http-restricted-api", "inference:x-key=@{root}/fifo"],
     "cannot read the header value from {root}/fifo: header value file: not a regular "
     "file"),
    (["--http-restricted-api", "inference:x-key=@/dev/zero"],
     "cannot read the header value from /dev/zero: header value file: not a regular "
     "file"),
    (["--http-restricted-api", "inference:x-key=@{root}/large"],
     "is larger than 4096 bytes"),
    (["--http-restricted-api", "inference:x-key=@{root}/two_lines"],
     "the header value from the file {root}/two_lines is not one a request can carry"),
    (["--http-restricted-api", "inference:x-key=@{root}/latin1"], "not ASCII"),
    (["--http-restricted-api", "inference:x-key="],
     "the header value from the command line is empty"),
    (["--http-restricted-api", "inference:x key=secret"], "'x key' is not an HTTP header name"),
    (["--http-restricted-api", "inference:x-key= secret"], "not one a request can carry"),
    (["--repository-poll-secs", "1e-300", "--model-control-mode", "poll"],
     "--repository-poll-secs 1e-300 is below 0.05"),
    (["--repository-poll-secs", "nan"], "--repository-poll-secs must be a positive number"),
    (["--drain-timeout", "inf"], "--drain-timeout must be a number of seconds >= 0"),
    (["--max-connections", "0"], "--max-connections must be >= 1"),
    (["--port", "65536"], "--port 65536 is out of range"),
    (["--python-cpu", "-1"], "--python-cpu: CPU -1 is not one this process may use"),
    (["--client-memory-limit", "1e400"], "is not a positive size in bytes"),
    (["--model-repository", "/dev/null"], "--model-repository /dev/null is not a directory"),
    (["--model-control-mode", "explicit", "--load-model", "*", "--load-model", "m"],
     "--load-model '*' (every model) must be the only --load-model"),
    (["--model-repository", "{root}", "--model-repository", "{root}"],
     "argument --model-repository: is given twice; one repository is served"),
]


@pytest.mark.parametrize("args,message", _BAD_FLAGS, ids=[" ".join(a) for a, _ in _BAD_FLAGS])
def test_a_bad_flag_is_one_line_and_exit_2_before_listening(files, args, message):
    done = _start(*[a.format(root=files) for a in args])
    assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
    assert message.format(root=files) in done.stderr, done.stderr[-2000:]
    assert "listening" not in done.stdout
    assert "Traceback" not in done.stderr


def test_a_secret_with_spaces_inside_restricts_as_given(tmp_path):
    """A header value such as `Bearer <token>` is one a request can carry: taken."""
    (tmp_path / "token").write_text("Bearer abc def\n")
    server = ServerProcess("--http-restricted-api",
                           f"model-repository:authorization=@{tmp_path}/token")
    try:
        server.start()
        assert server.request("GET", "/v2/repository/index")[0] == 403
        assert server.request("GET", "/v2/repository/index", headers={
            "Authorization": "Bearer abc def"})[0] == 200
        assert server.request("GET", "/v2/repository/index", headers={
            "Authorization": ""})[0] == 403
    finally:
        server.stop()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--python-cpu auto pins "
                    "only with two CPUs or more")
def test_fifos_in_the_shared_cpu_lock_directory_do_not_block_the_start(tmp_path):
    """The lock directory is every user's (mode 1777): another user can leave a FIFO
    named as a CPU's lock file there. Opening it for the lock blocked the start before
    the listener opened; it is now passed over (nothing claimed) and the server serves."""
    for cpu in os.sched_getaffinity(0):
        os.mkfifo(tmp_path / f"cpu-{cpu}.lock")
    server = ServerProcess("--python-cpu", "auto", env={"TINYHAL_CPU_LOCK_DIR": str(tmp_path)})
    try:
        server.start()
        assert server.request("GET", "/v2/health/ready")[0] == 200
    finally:
        server.stop()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="--python-cpu auto pins "
                    "only with two CPUs or more")
def test_a_link_as_the_default_cpu_lock_directory_makes_no_file_where_it_leads(tmp_path):
    """The default lock directory is `tinyhal-serve-cpus` in the shared temporary
    directory: another user can make it a link to a directory of theirs or of the
    system's, where a server (maybe root) would then create its lock files. A link there
    is not followed: nothing is claimed, the server serves."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "tinyhal-serve-cpus").symlink_to(elsewhere)
    server = ServerProcess("--python-cpu", "auto", env={"TMPDIR": str(tmp_path),
                                                        "TINYHAL_CPU_LOCK_DIR": ""})
    try:
        server.start()
        assert server.request("GET", "/v2/health/ready")[0] == 200
        assert list(elsewhere.iterdir()) == []
    finally:
        server.stop()


_LOCAL_SH = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "local.sh"


@pytest.mark.parametrize("args,message", [
    (["--drain-timeout", "nan"], "--drain-timeout must be a number of seconds >= 0"),
    (["--drain-timeout", "-1"], "--drain-timeout must be a number of seconds >= 0"),
    (["--max-replicas", "100000"], "--max-replicas must be at most 1024"),
])
def test_local_sh_refuses_what_would_fail_after_haproxy_started(args, message):
    """`--drain-timeout nan` started HAProxy, then its replica exited 2 "before it was
    ready"; `--max-replicas 100000` made HAProxy die at start, reported as a busy port.
    Both are refused on the command line (exit 2) before anything starts."""
    done = subprocess.run([str(_LOCAL_SH), "--replicas", "1", "--port", "8000", *args],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHON=sys.executable))
    assert done.returncode == 2 and message in done.stderr, (done.stdout, done.stderr)
    assert "ready" not in done.stdout


def test_version_prints_the_package_version_and_exits_0():
    from tinyhal import __version__

    done = _start("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"tinyhal-serve {__version__}"
