"""The loader rejects bad files with a tinyhal.Error and never crashes, hangs or balloons."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.vm_pairs import vm_compile_source
from tinyhal.errors import Error, IncompatibleError, InvalidArgumentError
from tinyhal.vm import load_module
from tinyhal.vm.bytecode_module_def import _Tab

SOURCE = """
util.global private mutable @g : i32 = 3 : i32
func.func @f(%a: i32, %b: f32) -> (i32, f32) {
  %v = util.global.load @g : i32
  %c = arith.addi %a, %v : i32
  util.global.store %c, @g : i32
  %d = arith.mulf %b, %b : f32
  return %c, %d : i32, f32
}
func.func @g2(%n: i32) -> i32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nn = arith.index_cast %n : i32 to index
  %z = arith.constant 0 : i32
  %r = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %z) -> i32 {
    %ii = arith.index_cast %i : index to i32
    %a = arith.addi %acc, %ii : i32
    scf.yield %a : i32
  }
  return %r : i32
}
"""


@pytest.fixture(scope="module")
def good_bytes() -> bytes:
    with open(vm_compile_source(SOURCE), "rb") as f:
        return f.read()


def _flatbuffer_start(data: bytes) -> int:
    name_len, extra_len = struct.unpack_from("<HH", data, 26)
    return 30 + name_len + extra_len + 4


def test_good_file_loads(good_bytes):
    m = load_module(good_bytes)
    assert set(m.exports) >= {"f", "g2"}
    m2 = load_module(bytearray(good_bytes))
    assert m2.name == m.name


def test_truncated_files_rejected(good_bytes):
    start = _flatbuffer_start(good_bytes)
    end = start + struct.unpack_from("<I", good_bytes, start - 4)[0]
    # Anything cut inside the FlatBuffer is rejected (the trailing ZIP directory is not
    # needed to load, as in IREE).
    for n in list(range(0, 80)) + list(range(80, end, 7)) + [end - 1]:
        with pytest.raises(Error):
            load_module(good_bytes[:n])


def test_wrong_magic(good_bytes):
    data = bytearray(good_bytes)
    start = _flatbuffer_start(data)
    data[start + 4 : start + 8] = b"NOPE"
    with pytest.raises(InvalidArgumentError, match="IREE"):
        load_module(bytes(data))
    with pytest.raises(Error):
        load_module(b"\x00" * 64)
    with pytest.raises(Error):
        load_module(b"PK\x03\x04" + b"\xff" * 40)


def test_a_large_file_that_is_no_module_is_refused_by_its_head(tmp_path, good_bytes):
    """Loading from a path looks at the file's head before reading it whole: a 2 GiB
    file of zeros (sparse: it takes no disk) is refused without 2 GiB of memory."""
    zeros = tmp_path / "zeros.vmfb"
    with open(zeros, "wb") as f:
        f.truncate(2 << 30)
    with pytest.raises(InvalidArgumentError, match="zeros.vmfb: not an IREE module"):
        load_module(str(zeros))
    good = tmp_path / "good.vmfb"
    good.write_bytes(good_bytes)
    assert set(load_module(str(good)).exports) >= {"f", "g2"}


@pytest.mark.parametrize("version", [0x00100000, 0x00110001, 0x00120000, 0])
def test_wrong_bytecode_version(good_bytes, version):
    data = bytearray(good_bytes)
    start = _flatbuffer_start(data)
    fb = memoryview(data)[start:]
    root = struct.unpack_from("<I", fb, 0)[0]
    at = _Tab(fb, root, "module")._field(13, 4)
    assert at and struct.unpack_from("<I", fb, at)[0] == 0x00110000
    struct.pack_into("<I", data, start + at, version)
    with pytest.raises(IncompatibleError, match="bytecode version"):
        load_module(bytes(data))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_mutations(good_bytes, data):
    buf = bytearray(good_bytes)
    start = _flatbuffer_start(buf)
    n = data.draw(st.integers(1, 8))
    for _ in range(n):
        pos = data.draw(st.integers(start, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    try:
        m = load_module(bytes(buf))
    except Error:
        return
    assert m.name  # loaded: the mutation hit something harmless


@settings(max_examples=100, deadline=None)
@given(junk=st.binary(min_size=0, max_size=400))
def test_random_junk(junk):
    with pytest.raises(Error):
        load_module(junk)
