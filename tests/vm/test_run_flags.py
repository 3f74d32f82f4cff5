"""`tinyhal-run` takes every flag `iree-run-module --help` lists: with its meaning, or
refused in one line saying why it has none here; several `--module=` link in order."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.iree_tools import HOST_FLAGS, compile_mlir
from support.run_compare import assert_same_output
from support.run_compare import tinyhal_run as run_tinyhal
from tinyhal.vm.run_flags import NO_MEANING

BIN = Path(sys.executable).parent

MODULE_A = """
module @module_a {
  func.func @scale(%x: tensor<4xf32>) -> tensor<4xf32> {
    %r = arith.mulf %x, %x : tensor<4xf32>
    return %r : tensor<4xf32>
  }
}
"""
MODULE_B = """
module @module_b {
  func.func private @module_a.scale(tensor<4xf32>) -> tensor<4xf32>
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %s = call @module_a.scale(%x) : (tensor<4xf32>) -> tensor<4xf32>
    %r = arith.addf %s, %x : tensor<4xf32>
    return %r : tensor<4xf32>
  }
}
"""


@pytest.fixture(scope="module")
def linked() -> tuple[Path, Path]:
    return compile_mlir(MODULE_A, HOST_FLAGS), compile_mlir(MODULE_B, HOST_FLAGS)


@pytest.fixture(scope="module")
def iree_help() -> str:
    return subprocess.run([str(BIN / "iree-run-module"), "--help"], capture_output=True,
                          text=True, timeout=60).stdout


def tinyhal_run(*args: str) -> tuple[int, str, str]:
    return run_tinyhal(args)


@pytest.mark.parametrize("device", ["sync", "task", "emu"])
def test_two_linked_modules(linked, device):
    a, b = linked
    flags = [f"--module={a}", f"--module={b}", "--function=main", "--input=4xf32=1,2,3,-4"]
    assert_same_output(flags, [device])
    rc, _, err = tinyhal_run(f"--device={device}", f"--module={b}", "--input=4xf32=1")
    assert rc == 1 and "depends on module 'module_a'" in err and err.count("\n") == 1


def test_every_iree_run_module_flag_is_known(iree_help):
    """Each flag of the help text is an option of tinyhal-run (handled, or listed with
    the reason it has no meaning here)."""
    from tinyhal.vm.run import _parser

    ours = {opt.lstrip("-") for action in _parser()._actions for opt in action.option_strings}
    theirs = set(re.findall(r"^#? ?--([a-z][a-z0-9_]+)", iree_help, re.M))
    assert theirs - ours - {"flagfile"} == set()


def test_defaults_flagfile_runs_as_iree_does(linked, iree_help, tmp_path):
    """A flagfile of every flag at IREE's default value (the --help lines; empty strings
    left out, which iree-run-module 3.13 reads back as two quote characters) gives the
    same run."""
    lines = [line for line in iree_help.splitlines()
             if line.startswith("--") and not line.endswith('=""')]
    flagfile = tmp_path / "defaults.flags"
    flagfile.write_text("\n".join(lines) + "\n")
    a, b = linked
    flags = [f"--flagfile={flagfile}", f"--module={a}", f"--module={b}", "--function=main",
             "--input=4xf32=0.5 -2 3 8"]
    assert_same_output(flags, ["task"])
    assert_same_output(["--task_topology_group_count=1", "--task_worker_spin_us=5", *flags],
                       ["task"])
    (tmp_path / "bad.flags").write_text("--function=main\nnot a flag\n")
    rc, _, err = tinyhal_run(f"--flagfile={tmp_path / 'bad.flags'}", f"--module={b}")
    assert rc == 2 and "bad.flags:2: positional arguments not allowed" in err


@pytest.mark.parametrize("flag", sorted(NO_MEANING))
def test_flags_without_meaning_are_refused_in_one_line(linked, flag):
    default, why = NO_MEANING[flag]
    value = "17" if default in (None, "", "0", "-1") else "x" + (default or "")
    if default in ("true", "false"):
        value = "false" if default == "true" else "true"
    rc, out, err = tinyhal_run(f"--module={linked[1]}", f"--{flag}={value}")
    assert rc == 2 and out == ""
    assert err == f"tinyhal-run: UNIMPLEMENTED: --{flag}={value}: {why}\n"


def test_listing_drivers_and_devices():
    rc, out, _ = tinyhal_run("--list_drivers")
    assert rc == 0 and "task:" in out and "emu:" in out
    rc, out, _ = tinyhal_run("--list_devices")
    assert rc == 0 and out.splitlines()[:3] == ["sync://", "task://", "emu://"]
    rc, out, _ = tinyhal_run("--list_devices=emu")
    assert rc == 0 and "emu://edge-npu" in out and "task://" not in out
    rc, _, err = tinyhal_run("--dump_devices=cuda")
    assert rc == 2 and "no driver of that name" in err
