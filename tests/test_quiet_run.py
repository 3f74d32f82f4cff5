"""A test run ends with pytest's summary line: nothing after it (no nanobind leak report of
iree.runtime objects alive at exit, no warnings of threads or files left behind), so the
last line of a run says how it went."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Tests that hold iree.runtime objects in the test process (the oracle beside tinyhal:
# session caches, a module's cache registered in support.oracle_caches, iree.runtime's own
# device and driver caches, its per-call statics), servers in child processes, and a
# command-line test. A longer run of such tests (the suite's own) ended with nanobind's
# leak report until tests/conftest.py released them. An oracle context followed by a test
# that freezes the heap (a model repository loaded in this process) stayed alive too.
SUITE = ["tests/vm/test_vm_core_arith.py", "tests/vm/test_caller_storage.py",
         "tests/server/test_sequences.py::test_32_interleaved_sequences_match_each_sequence_alone",
         "tests/server/test_lifecycle.py::test_no_arguments_serves_the_bundled_samples",
         "tests/server/test_lifecycle.py::test_other_devices_give_the_same_bits",
         "tests/server/test_server.py::test_mlp_matches_iree_runtime",
         "tests/vm/test_run_cli.py::test_console_script_runs_and_fails_cleanly",
         "tests/test_layering.py"]


def test_a_run_ends_with_the_summary_line():
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITE],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        out, _ = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError("the child run did not finish\n" + out[-3000:]) from None
    assert proc.returncode == 0, out[-3000:]
    last = out.rstrip("\n").splitlines()[-1]
    assert re.fullmatch(r"\d+ passed(, \d+ \w+)* in [\d.]+s( \(\d+:\d\d:\d\d\))?", last), \
        out[-3000:]
