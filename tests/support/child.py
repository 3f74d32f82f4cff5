"""Runs test code in a child Python process with a timeout, so a crash is a failed test.

Scenarios that could kill the interpreter (a kernel writing freed memory, teardown with
worker threads running) must not take the test runner down with them: the child's
exit status, a signal or a timeout become an assertion with the child's output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(code: str, *args: str, timeout: float = 120.0) -> str:
    """Runs `code` (dedented) as `python -c`, with `tests/` importable and `args` as
    `sys.argv[1:]`; returns its stdout. Fails the test on a non-zero exit, a signal or
    the timeout, showing what the child printed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS_DIR, env.get("PYTHONPATH")]))
    env.setdefault("PYTHONFAULTHANDLER", "1")
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"child did not finish within {timeout} s\n--- stdout\n{out[-3000:]}\n"
            f"--- stderr\n{err[-3000:]}") from None
    if proc.returncode != 0:
        what = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
                else f"exited with {proc.returncode}")
        raise AssertionError(
            f"child {what}\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}")
    return out
