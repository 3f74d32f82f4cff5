"""Tests that once depended on how pytest was started pass however it is started.

A command started with a shell's `&` runs with SIGINT ignored, and every child inherits
that; a shared machine runs other work at the same time. Both conditions are reproduced
here for the tests they once broke, in a child pytest, so the rest of the suite keeps
its own signal dispositions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SENSITIVE = (
    "tests/vm/test_native_loops.py::test_ctrl_c_interrupts_a_long_native_loop",
    "tests/server/test_strict.py::"
    "test_start_up_logs_each_model_and_warns_about_a_missing_model_vmfb",
)

# exec keeps an ignored disposition, so pytest starts exactly as after `pytest &`
IGNORE_SIGINT_THEN_EXEC = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)

# a busy process per core for at most `argv[1]` seconds
BURN_CPU = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "while time.monotonic() < end:\n"
    "    pass\n"
)


@pytest.mark.timeout(400)
def test_signal_and_load_sensitive_tests_pass_with_sigint_ignored_under_cpu_load():
    burners = [subprocess.Popen([sys.executable, "-c", BURN_CPU, "300"])
               for _ in range(os.cpu_count() or 2)]
    try:
        proc = subprocess.run(
            [sys.executable, "-c", IGNORE_SIGINT_THEN_EXEC, "-m", "pytest", "-q",
             "-p", "no:cacheprovider", *SENSITIVE],
            cwd=ROOT, capture_output=True, text=True, timeout=360)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout, proc.stdout[-2000:]
