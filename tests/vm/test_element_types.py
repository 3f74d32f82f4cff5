"""bf16, every fp8 type and sub-byte integers across every boundary: the Python API
(bit-identical to iree.runtime on every driver), `tinyhal-run` (byte-for-byte equal to
iree-run-module's output, parsing and printing every bit pattern), `.npy` files and
`--expected_output`."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from element_programs import FP8_TYPES, elements_vmfb, iree_invoke_raw

import tinyhal
from tinyhal.hal.types import (
    ELEMENT_TYPES,
    ElementType,
    element_info_for_mlir,
    element_type_for,
    format_element_type,
    pack_elements,
    parse_element_type,
    unpack_elements,
)
from tinyhal.vm.run import run

IREE_RUN = str(Path(sys.executable).with_name("iree-run-module"))
DRIVERS = ["sync", "task", "emu"]
FP8_DTYPES = {"f8E4M3FN": ml_dtypes.float8_e4m3fn, "f8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
              "f8E5M2": ml_dtypes.float8_e5m2, "f8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz}


@pytest.fixture(scope="module")
def vmfb() -> str:
    return elements_vmfb()


@pytest.fixture(scope="module", params=DRIVERS)
def module(request, vmfb):
    with tinyhal.load(vmfb, device=request.param) as m:
        yield m


def _code(mlir: str) -> int:
    return element_info_for_mlir(mlir).element_type


def _raw(array: np.ndarray, mlir: str) -> tuple:
    code = _code(mlir)
    return (array.shape, code, pack_elements(array, code).tobytes())


def _same_bits(mine: np.ndarray, theirs: tuple) -> None:
    shape, code, data = theirs
    assert mine.shape == shape
    assert mine.dtype == element_info_for_mlir(format_element_type(code)).dtype
    assert pack_elements(mine, code).tobytes() == data


# -- the table -------------------------------------------------------------------------------


def test_table_round_trips_every_entry():
    for info in ELEMENT_TYPES:
        name = format_element_type(info.element_type)
        assert parse_element_type(name) == info.element_type
        if info.numerical_type not in (0x00, 0x23):  # opaque `*8`, complex `cf64`
            assert name == info.mlir
        if info.numerical_type not in (0x00, 0x10):
            assert element_type_for(info.dtype) == info.element_type or info.dtype.kind in "iu"
    assert element_type_for(ml_dtypes.bfloat16) == ElementType.BFLOAT_16
    assert element_type_for(ml_dtypes.int4) == ElementType.SINT_4
    assert element_info_for_mlir("bf16").kserve == "BF16"
    assert element_info_for_mlir("f8E4M3FN").kserve is None


def test_sub_byte_packing_is_low_nibble_first():
    values = np.array([1, 2, 3, -4, 7, -8, -1], ml_dtypes.int4)
    packed = pack_elements(values, ElementType.INT_4)
    assert packed.tobytes() == bytes([0x21, 0xC3, 0x87, 0x0F])
    back = unpack_elements(packed, (7,), ElementType.INT_4)
    assert back.dtype == np.dtype(ml_dtypes.int4) and np.array_equal(back, values)


# -- the Python API, against iree.runtime --------------------------------------------------


def test_bf16_through_the_api(module, vmfb):
    rng = np.random.default_rng(7)
    a = rng.normal(size=8).astype(ml_dtypes.bfloat16)
    b = rng.normal(size=8).astype(ml_dtypes.bfloat16)
    got = module.bf16_add(a, b)
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    _same_bits(got, iree_invoke_raw(vmfb, "bf16_add", [_raw(a, "bf16"), _raw(b, "bf16")])[0])
    x = rng.normal(size=(4, 8)).astype(ml_dtypes.bfloat16)
    y = rng.normal(size=(8, 3)).astype(ml_dtypes.bfloat16)
    got = module.bf16_matmul(x, y)
    theirs = iree_invoke_raw(vmfb, "bf16_matmul", [_raw(x, "bf16"), _raw(y, "bf16")])[0]
    assert got.dtype == np.float32 and got.tobytes() == theirs[2]
    f = np.array([1.5, np.nan, -np.inf, 3.3e38, 1e-40, -0.0, 1.00390625, 65504, 0.1, -7,
                  1e30, 2**-130, 3, 4, 5, 6], np.float32)
    _same_bits(module.bf16_from_f32(f),
               iree_invoke_raw(vmfb, "bf16_from_f32", [_raw(f, "f32")])[0])


def test_bf16_every_bit_pattern_through_the_api(module, vmfb):
    bits = np.arange(65536, dtype=np.uint16).view(np.int16)
    _same_bits(module.bf16_from_bits(bits),
               iree_invoke_raw(vmfb, "bf16_from_bits", [_raw(bits, "i16")])[0])


@pytest.mark.parametrize("t", FP8_TYPES)
def test_fp8_through_the_api(module, vmfb, t):
    s = t.lower()
    every = np.arange(256, dtype=np.uint8).view(FP8_DTYPES[t])
    got = module.invoke(f"{s}_to_f32", every)
    theirs = iree_invoke_raw(vmfb, f"{s}_to_f32", [_raw(every, t)])[0]
    assert got.dtype == np.float32 and got.tobytes() == theirs[2]
    other = np.roll(every, 37)
    _same_bits(module.invoke(f"{s}_mul", every, other),
               iree_invoke_raw(vmfb, f"{s}_mul", [_raw(every, t), _raw(other, t)])[0])
    f = np.array([0.1, -0.1, 1e10, -1e10, np.nan, -np.nan, np.inf, -np.inf, 0.0009, -0.0,
                  1.0625, 448, 464, 57344, 1e-40, 240], np.float32)
    _same_bits(module.invoke(f"{s}_from_f32", f),
               iree_invoke_raw(vmfb, f"{s}_from_f32", [_raw(f, "f32")])[0])


def test_sub_byte_integers_through_the_api(module, vmfb):
    wide = np.arange(-8, 8, dtype=np.int8) * 3
    got = module.i4_narrow(wide)
    assert got.dtype == np.dtype(ml_dtypes.int4)
    _same_bits(got, iree_invoke_raw(vmfb, "i4_narrow", [_raw(wide, "i8")])[0])
    packed = np.array([[1, -2, 3, -4], [5, -6, 7, -8]], ml_dtypes.int4)
    got = module.i4_widen(packed)
    assert got.tobytes() == iree_invoke_raw(vmfb, "i4_widen", [_raw(packed, "i4")])[0][2]
    np.testing.assert_array_equal(got, packed.astype(np.int8))
    a = np.arange(16, dtype=np.int8).astype(ml_dtypes.int4)
    b = np.full(16, 5, ml_dtypes.int4)
    _same_bits(module.i4_add(a, b),
               iree_invoke_raw(vmfb, "i4_add", [_raw(a, "i4"), _raw(b, "i4")])[0])
    u = np.arange(16, dtype=np.uint8).astype(ml_dtypes.uint4)  # signless takes unsigned
    got = module.i4_widen_unsigned(u)
    np.testing.assert_array_equal(got, np.arange(16, dtype=np.int32))


def test_wrong_narrow_dtype_is_named(vmfb):
    with tinyhal.load(vmfb, device="sync") as m:
        with pytest.raises(tinyhal.Error, match="bfloat16"):
            m.bf16_add(np.ones(8, np.float16), np.ones(8, np.float16))
        with pytest.raises(tinyhal.Error, match="float8_e4m3fn"):
            m.f8e4m3fn_mul(np.ones(256, ml_dtypes.float8_e5m2),
                           np.ones(256, ml_dtypes.float8_e5m2))


# -- tinyhal-run against iree-run-module ---------------------------------------------------


def _iree(args: list[str]) -> tuple[int, str]:
    proc = subprocess.run([IREE_RUN, "--device=local-sync", *args], capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stdout


def _ours(args: list[str], device: str = "sync") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = run([f"--device={device}", *args], stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def _fp8_cases() -> list:
    cases = []
    for t in FP8_TYPES:
        s = t.lower()
        cases += [
            (f"{s}_mul", [f"--input=256x{t}=" + " ".join(["1.5 -2 0.3 nan -inf inf 448 1e-3"] * 32),
                          f"--input=256x{t}=0.75"]),
            (f"{s}_from_f32", ["--input=16xf32=0.1 -0.1 1e10 -1e10 nan -nan inf -inf 0.0009 "
                               "-0 1.0625 1.1875 1.3 500 240 57344"]),
            (f"{s}_to_f32", [f"--input=256x{t}=448 464 449 0.001953125 0.0009765625 "
                             f"0.00048828125 1e-40 3 3.5 0x10 1e39 -1e39 0.5 2 4 8 " + " 1" * 240]),
        ]
    return cases


CLI_CASES = [
    ("bf16_add", ["--input=8xbf16=1.5,2,3.14159,-1e30,nan,-inf,65504,0.1", "--input=8xbf16=1"]),
    ("bf16_matmul", ["--input=4x8xbf16=0.3", "--input=8x3xbf16=[1 2 3][4 5 6][7 8 9][1 2 3]"
                     "[4 5 6][7 8 9][1 2 3][4 5 6]"]),
    ("bf16_from_f32", ["--input=16xf32=1e-40 1e-45 3 3.5 0x10 1e39 -1e39 0.5 2 4 8 1.5abc 6e-8 "
                       "3e-8 1e5 9"]),
    ("i4_widen", ["--input=2x4xi4=21 43 65 87"]),
    ("i4_widen", ["--input=2x4xi4=F0"]),
    ("i4_narrow", ["--input=16xi8=-8 -7 -6 -5 -4 -3 -2 -1 0 1 2 3 4 5 6 7",
                   "--output_max_element_count=8"]),
    ("i4_narrow", ["--input=16xi8=1", "--output_max_element_count=3"]),
    ("i4_add", ["--input=16xi4=21 43 65 87 A9 CB ED 0F", "--input=16xi4=11",
                "--output_max_element_count=8"]),
    ("i4_widen_unsigned", ["--input=16xi4=21 43 65 87 A9 CB ED 0F"]),
    *_fp8_cases(),
]


@pytest.mark.parametrize("function,args", CLI_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CLI_CASES)])
@pytest.mark.parametrize("device", ["sync", "task", "emu"])
def test_tinyhal_run_prints_what_iree_run_module_prints(vmfb, function, args, device):
    flags = [f"--module={vmfb}", f"--function={function}", *args]
    rc_iree, out_iree = _iree(flags)
    rc, out, err = _ours(flags, device)
    assert rc_iree == 0 and (rc, err) == (0, ""), (out_iree, err)
    assert out == out_iree


def test_every_bit_pattern_prints_as_iree_prints_it(vmfb, tmp_path):
    all8 = tmp_path / "all8.bin"
    np.arange(256, dtype=np.uint8).tofile(all8)
    all16 = tmp_path / "all16.bin"
    np.arange(65536, dtype=np.uint16).tofile(all16)
    runs = [[f"--function={t.lower()}_from_bits", f"--input=256xi8=@{all8}"] for t in FP8_TYPES]
    runs.append(["--function=bf16_from_bits", f"--input=65536xi16=@{all16}",
                 "--output_max_element_count=65536"])
    for args in runs:
        flags = [f"--module={vmfb}", *args]
        rc_iree, out_iree = _iree(flags)
        rc, out, err = _ours(flags)
        assert rc_iree == 0 and (rc, err) == (0, "")
        assert out == out_iree


def test_sub_byte_results_fail_to_print_as_in_iree(vmfb):
    # IREE prints a dense byte per element but an i4 buffer holds two to a byte.
    flags = [f"--module={vmfb}", "--function=i4_narrow", "--input=16xi8=1"]
    rc_iree, out_iree = _iree(flags)
    rc, out, err = _ours(flags)
    assert rc_iree != 0 and rc != 0
    assert out == out_iree == "EXEC @i4_narrow\n"
    assert "OUT_OF_RANGE" in err


def test_npy_outputs_match_iree_and_narrow_floats_round_trip(vmfb, tmp_path):
    common = [f"--module={vmfb}", "--function=bf16_matmul", "--input=4x8xbf16=0.3",
              "--input=8x3xbf16=2"]
    assert _iree([*common, f"--output=@{tmp_path}/iree.npy"])[0] == 0
    assert _ours([*common, f"--output=@{tmp_path}/ours.npy"])[0] == 0
    assert (tmp_path / "ours.npy").read_bytes() == (tmp_path / "iree.npy").read_bytes()
    # iree-run-module refuses to write bf16/fp8 .npy; tinyhal writes numpy's bytes for
    # them, which np.load, tinyhal and iree-run-module read back.
    for function, inputs in [("bf16_add", ["--input=8xbf16=1.5 2 3 4 5 6 7 8",
                                           "--input=8xbf16=0.25"]),
                             ("f8e4m3fnuz_mul", ["--input=256xf8E4M3FNUZ=1.5",
                                                 "--input=256xf8E4M3FNUZ=0.5"]),
                             ("i4_add", ["--input=16xi4=21 43 65 87 A9 CB ED 0F",
                                         "--input=16xi4=11"])]:
        flags = [f"--module={vmfb}", f"--function={function}", *inputs]
        out = tmp_path / f"{function}.npy"
        if not function.startswith("i4"):
            assert _iree([*flags, f"--output=@{tmp_path}/x.npy"])[0] != 0
        assert _ours([*flags, f"--output=@{out}"])[:1] == (0,)
        assert _ours([*flags, f"--expected_output=@{out}"]) == (
            0, f"EXEC @{function}\n[SUCCESS] all function outputs matched their expected "
               "values.\n", "")
    # A signless integer result read back from .npy (which cannot say "signless"):
    # iree-run-module 3.13 reports a metadata mismatch (si8 vs i8), tinyhal matches it.
    flags = [f"--module={vmfb}", "--function=i4_widen", "--input=2x4xi4=21 43 65 87"]
    assert _iree([*flags, f"--output=@{tmp_path}/w.npy"])[0] == 0
    rc_iree, out_iree = _iree([*flags, f"--expected_output=@{tmp_path}/w.npy"])
    assert rc_iree == 1 and "expected that the view matches 2x4xsi8" in out_iree
    assert _ours([*flags, f"--expected_output=@{tmp_path}/w.npy"])[:2] == (
        0, "EXEC @i4_widen\n[SUCCESS] all function outputs matched their expected values.\n")
    loaded = np.load(tmp_path / "bf16_add.npy").view(ml_dtypes.bfloat16)
    assert loaded.tolist() == [1.75, 2.25, 3.25, 4.25, 5.25, 6.25, 7.25, 8.25]
    assert np.load(tmp_path / "i4_add.npy").tolist() == [
        2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1, 0, 1]
    flags = [f"--module={vmfb}", "--function=bf16_add", f"--input=@{tmp_path}/bf16_add.npy",
             "--input=8xbf16=0"]
    rc_iree, out_iree = _iree(flags)
    assert rc_iree == 0 and _ours(flags) == (0, out_iree, "")


EXPECTED_CASES = [
    ("bf16_add", ["--input=8xbf16=1.5", "--input=8xbf16=1", "--expected_output=8xbf16=2.5"]),
    ("bf16_add", ["--input=8xbf16=1.5", "--input=8xbf16=1", "--expected_output=8xbf16=2.505"]),
    ("bf16_add", ["--input=8xbf16=1.5", "--input=8xbf16=1", "--expected_output=8xbf16=2.6"]),
    ("bf16_add", ["--input=8xbf16=1.5", "--input=8xbf16=1", "--expected_output=8xbf16=2.6",
                  "--expected_bf16_threshold=0.2"]),
    ("bf16_add", ["--input=8xbf16=1.5", "--input=8xbf16=1", "--expected_output=8xbf16=2.51",
                  "--equality_mode=exact"]),
    ("bf16_add", ["--input=8xbf16=nan", "--input=8xbf16=1", "--expected_output=8xbf16=nan"]),
    ("bf16_matmul", ["--input=4x8xbf16=0.3", "--input=8x3xbf16=2",
                     "--expected_output=4x3xf32=4.8"]),
    ("bf16_matmul", ["--input=4x8xbf16=0.3", "--input=8x3xbf16=2",
                     "--expected_output=4x3xf32=4.81"]),
    ("bf16_matmul", ["--input=4x8xbf16=0.3", "--input=8x3xbf16=2",
                     "--expected_output=3x4xf32=4.8"]),
    ("bf16_matmul", ["--input=4x8xbf16=0.3", "--input=8x3xbf16=2",
                     "--expected_output=4x3xbf16=4.8"]),
    ("f8e5m2_mul", ["--input=256xf8E5M2=1.5", "--input=256xf8E5M2=2",
                    "--expected_output=256xf8E5M2=3"]),
    ("f8e5m2_mul", ["--input=256xf8E5M2=1.5", "--input=256xf8E5M2=2",
                    "--expected_output=256xf8E5M2=3.5"]),
    ("i4_widen", ["--input=2x4xi4=21 43 65 87", "--expected_output=2x4xi8=1 2 3 4 5 6 7 -8"]),
    ("i4_widen", ["--input=2x4xi4=21 43 65 87", "--expected_output=2x4xi8=1 2 3 4 5 6 7 8"]),
    ("i4_widen", ["--input=2x4xi4=21 43 65 87", "--expected_output=(ignored)"]),
    ("i4_widen", ["--input=2x4xi4=21 43 65 87", "--expected_output=(ignored)",
                  "--expected_output=(ignored)"]),
]


@pytest.mark.parametrize("function,args", EXPECTED_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(EXPECTED_CASES)])
def test_expected_output_reports_as_iree_does(vmfb, function, args):
    flags = [f"--module={vmfb}", f"--function={function}", *args]
    rc_iree, out_iree = _iree(flags)
    rc, out, err = _ours(flags)
    assert (rc, out) == (rc_iree, out_iree)
    assert (err == "") == ("[" in out_iree)  # a report on stdout, or an error on stderr


OTHER_MLIR = """
func.func @c(%a: tensor<2xcomplex<f32>>, %b: tensor<3xf64>, %d: tensor<2x2xui16>,
             %e: tensor<2xsi64>, %f: tensor<3xi1>)
    -> (tensor<2xcomplex<f32>>, tensor<3xf64>, tensor<2x2xui16>, tensor<2xsi64>, tensor<3xi1>) {
  return %a, %b, %d, %e, %f
      : tensor<2xcomplex<f32>>, tensor<3xf64>, tensor<2x2xui16>, tensor<2xsi64>, tensor<3xi1>
}
"""


def test_complex_f64_and_signed_types_print_and_save_as_iree(tmp_path):
    from support.iree_tools import HOST_FLAGS, compile_mlir

    vmfb = compile_mlir(OTHER_MLIR, [*HOST_FLAGS, "--iree-input-demote-f64-to-f32=false"])
    inputs = [f"--module={vmfb}", "--function=c", "--input=2xcf64=0000C03F00000040 0000803F000080BF",
              "--input=3xf64=1e300 -2.5e-310 nan", "--input=2x2xui16=65535 0 1 2",
              "--input=2xsi64=-9223372036854775808 5", "--input=3xi1=01 00 01"]
    rc_iree, out_iree = _iree(inputs)
    assert rc_iree == 0 and _ours(inputs) == (0, out_iree, "")
    for tool, run_tool in (("iree", _iree), ("ours", _ours)):
        outputs = [f"--output=@{tmp_path}/{tool}1.npy", f"--output=@{tmp_path}/{tool}2.npy",
                   "--output=-", f"--output=+{tmp_path}/{tool}2.npy", "--output="]
        assert run_tool([*inputs, *outputs])[0] == 0
    for n in (1, 2):
        assert (tmp_path / f"ours{n}.npy").read_bytes() == \
            (tmp_path / f"iree{n}.npy").read_bytes()


E8M0_MLIR = """
func.func @from_bits(%a: tensor<256xi8>) -> tensor<256xf8E8M0FNU> {
  %0 = arith.bitcast %a : tensor<256xi8> to tensor<256xf8E8M0FNU>
  return %0 : tensor<256xf8E8M0FNU>
}
func.func @to_bits(%a: tensor<16xf8E8M0FNU>) -> tensor<16xi8> {
  %0 = arith.bitcast %a : tensor<16xf8E8M0FNU> to tensor<16xi8>
  return %0 : tensor<16xi8>
}
"""


def test_f8e8m0fnu_scales(tmp_path):
    from support.iree_tools import HOST_FLAGS, compile_mlir

    vmfb = str(compile_mlir(E8M0_MLIR, HOST_FLAGS))
    bits = np.arange(256, dtype=np.uint8).view(np.int8)
    with tinyhal.load(vmfb, device="sync") as m:
        _same_bits(m.from_bits(bits), iree_invoke_raw(vmfb, "from_bits", [_raw(bits, "i8")])[0])
    all8 = tmp_path / "all8.bin"
    bits.tofile(all8)
    for args in (["--function=from_bits", f"--input=256xi8=@{all8}"],
                 ["--function=to_bits", "--input=16xf8E8M0FNU=0.1 -0.1 1e10 nan inf 0.0009 -0 "
                  "1.0625 1.5 1.3 500 3 0 1e-38 5.9e-39 3e38"]):
        flags = [f"--module={vmfb}", *args]
        rc_iree, out_iree = _iree(flags)
        assert rc_iree == 0 and _ours(flags) == (0, out_iree, "")


I2_MLIR = """
func.func @narrow(%a: tensor<8xi8>) -> tensor<8xi2> {
  %0 = arith.trunci %a : tensor<8xi8> to tensor<8xi2>
  return %0 : tensor<8xi2>
}
func.func @widen(%a: tensor<8xi2>) -> tensor<8xi8> {
  %0 = arith.extsi %a : tensor<8xi2> to tensor<8xi8>
  return %0 : tensor<8xi8>
}
"""


@pytest.mark.parametrize("device", DRIVERS)
def test_i2_packs_four_to_a_byte(device):
    from support.iree_tools import HOST_FLAGS, compile_mlir

    vmfb = str(compile_mlir(I2_MLIR, HOST_FLAGS))
    wide = np.array([0, 1, 2, 3, -1, -2, 1, 0], np.int8)
    theirs = iree_invoke_raw(vmfb, "narrow", [_raw(wide, "i8")])[0]
    assert theirs[2] == bytes([0xE4, 0x1B])
    with tinyhal.load(vmfb, device=device) as m:
        got = m.narrow(wide)
        assert got.dtype == np.dtype(ml_dtypes.int2)
        _same_bits(got, theirs)
        np.testing.assert_array_equal(m.widen(got), [0, 1, -2, -1, -1, -2, 1, 0])


def test_buffer_views_pack_and_unpack_sub_byte_arrays():
    from tinyhal.hal import create_device
    from tinyhal.hal.buffer_view import BufferView

    device = create_device("sync")
    try:
        values = np.array([[1, -2, 3], [-4, 5, -6]], ml_dtypes.int4)
        view = BufferView.from_numpy(device, values)
        assert (view.element_type, view.byte_length) == (ElementType.SINT_4, 3)
        back = view.to_numpy()
        assert back.dtype == np.dtype(ml_dtypes.int4) and np.array_equal(back, values)
        bf = BufferView.from_numpy(device, np.array([1.5, -2], ml_dtypes.bfloat16))
        assert bf.element_type == ElementType.BFLOAT_16 and bf.to_numpy().tolist() == [1.5, -2]
    finally:
        device.close()
