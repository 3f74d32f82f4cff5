"""`tinyhal-run` beside `iree-run-module`: the same flags must print the same text."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

IREE_RUN_MODULE = str(Path(sys.executable).with_name("iree-run-module"))


def iree_run_module(flags: Sequence[str]) -> tuple[int, str]:
    """(exit code, stdout) of iree-run-module with `flags`."""
    proc = subprocess.run([IREE_RUN_MODULE, *flags], capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, proc.stdout


def tinyhal_run(flags: Sequence[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of tinyhal-run with `flags`, in this process."""
    from tinyhal.vm.run import run

    out, err = io.StringIO(), io.StringIO()
    rc = run(list(flags), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def assert_same_output(flags: Sequence[str], drivers: Sequence[str],
                       iree_device: str = "local-task") -> None:
    """iree-run-module succeeds with `flags` and tinyhal-run prints exactly its output
    on each of `drivers`."""
    rc, expected = iree_run_module([f"--device={iree_device}", *flags])
    assert rc == 0, expected
    for driver in drivers:
        assert tinyhal_run([f"--device={driver}", *flags]) == (0, expected, ""), driver
