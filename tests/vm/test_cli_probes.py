"""Probes of tinyhal-run with inputs iree-run-module 3.13 refuses: a dim beyond int64
(INVALID_ARGUMENT while parsing), a tensor of more than 2^64 bytes (OUT_OF_RANGE) and
one larger than the machine's memory (RESOURCE_EXHAUSTED where its allocator fails). tinyhal-run printed a traceback for the
first and tried to build the second in memory; each is now IREE's status on one line,
exit 1. Both tools run as child processes, bounded by a timeout and an address-space
limit (nothing here may take the shared machine's memory)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

SAXPY = Path(__file__).resolve().parents[2] / "server" / "models" / "saxpy" / "1" / \
    "model.vmfb"
_ADDRESS_SPACE = 8 << 30

pytestmark = pytest.mark.timeout(120)


def _limited() -> None:  # in the child
    resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))


def _tool(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name(name)), *args],
                          capture_output=True, text=True, timeout=60, preexec_fn=_limited)


_CASES = [
    ("99999999999999999999xf32=1", "INVALID_ARGUMENT",
     "shape[0] invalid value '99999999999999999999'"),
    ("9223372036854775808xf32=1", "INVALID_ARGUMENT",
     "shape[0] invalid value '9223372036854775808'"),
    ("100000000000xf32=1", "RESOURCE_EXHAUSTED", ""),
    ("4611686018427387904xf32=1", "OUT_OF_RANGE", "packed byte count overflows device size"),
]


@pytest.mark.parametrize("tensor,status,message", _CASES, ids=[c[0] for c in _CASES])
def test_an_input_beyond_int64_or_memory_is_irees_status(tensor, status, message):
    args = [f"--module={SAXPY}", "--device=local-sync", "--function=saxpy", "--input=2",
            f"--input={tensor}", "--input=4xf32=1"]
    iree = _tool("iree-run-module", *args)
    assert iree.returncode == 1 and status in iree.stderr, iree.stderr[-2000:]
    ours = _tool("tinyhal-run", *args)
    assert ours.returncode == 1, ours.stderr[-2000:]
    assert ours.stderr.startswith(f"tinyhal-run: {status}: {message}"), ours.stderr[-2000:]
    assert "Traceback" not in ours.stderr and ours.stderr.count("\n") == 1


def _npy(path: Path, shape: str) -> Path:
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s,), }" % shape
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") +
                     header.encode() + b"\0" * 16)
    return path


_NPY_CASES = [
    ("99999999999999999999999", "INVALID_ARGUMENT",
     "invalid dimension 0 value 99999999999999999999999"),
    ("1099511627776", "RESOURCE_EXHAUSTED", ""),  # 4 TiB promised, 16 bytes held
    ("1073741824", "OUT_OF_RANGE", "end-of-file encountered during read"),  # 4 GiB
]


@pytest.mark.parametrize("shape,iree_status,message", _NPY_CASES,
                         ids=[c[0] for c in _NPY_CASES])
def test_a_npy_header_promising_more_than_its_file_is_refused_unallocated(
        tmp_path, shape, iree_status, message):
    """IREE allocates what the header promises, then reads (RESOURCE_EXHAUSTED when
    the allocation fails, OUT_OF_RANGE at the end of the file); tinyhal-run compares
    it with the file's size first, so nothing is allocated for bytes that are not
    there: OUT_OF_RANGE in both cases (a deviation in the status of the first)."""
    npy = _npy(tmp_path / "x.npy", shape)
    args = [f"--module={SAXPY}", "--device=local-sync", "--function=saxpy", "--input=2",
            f"--input=@{npy}", "--input=4xf32=1"]
    iree = _tool("iree-run-module", *args)
    assert iree.returncode == 1 and iree_status in iree.stderr, iree.stderr[-2000:]
    ours = _tool("tinyhal-run", *args)
    status = "INVALID_ARGUMENT" if iree_status == "INVALID_ARGUMENT" else "OUT_OF_RANGE"
    assert ours.returncode == 1, ours.stderr[-2000:]
    assert ours.stderr.startswith(f"tinyhal-run: {status}: {message}"), ours.stderr[-2000:]
    assert "Traceback" not in ours.stderr and ours.stderr.count("\n") == 1


def test_tinyhal_check_names_a_missing_module_as_tinyhal_run_does(tmp_path):
    missing = tmp_path / "missing.vmfb"
    done = _tool("tinyhal-check", f"--module={missing}")
    run = _tool("tinyhal-run", f"--module={missing}", "--function=main")
    assert done.returncode == run.returncode == 1, (done.stderr, run.stderr)
    line = f"NOT_FOUND: module file not found: {missing}"
    assert line in done.stderr and line in run.stderr, (done.stderr, run.stderr)
