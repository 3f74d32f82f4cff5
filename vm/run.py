"""`tinyhal-run`: run a function of a compiled module, with `iree-run-module`'s flags and output.

    tinyhal-run --module=m.vmfb --function=main --input=2x2xf32=1,2,3,4 --input=@x.npy

Inputs (`--input=`, once per argument, in order):
- `[shape x]type=values` builds a tensor of any IREE element type: `2x3xf32=1 2 3 4 5 6`,
  `2x2xi32=[1 2][3 4]`, `2xbf16=1.5,2`, `4xf8E4M3FN=0.5`, `f32=2.5` (rank 0); one value
  is splatted, no values give zeros; `...=@file.bin` reads raw bytes. i1, sub-byte
  integers (`8xi4=21 43 65 87`: packed bytes, the first element in the low nibble),
  complex and opaque types take hex bytes, as IREE reads them;
- `@file.npy` reads a numpy file (`+file.npy` the next array of one opened before),
  typed by its `descr` as IREE types it (`<V2` is opaque 16-bit, which any 16-bit
  element type accepts, so bf16 arrays numpy and ml_dtypes wrote load as they are);
- a scalar argument takes a number (`5`, `2.5`); tinyhal also accepts `i32=5`;
- `&[shape x]type=values` is caller-provided storage: the argument is the tensor's bare
  `!hal.buffer` (`--input=&4096xi8=0` for an `iree.abi.transients` or an
  `iree.abi.output` argument);
- `(null)` / `(ignored)` give a null ref (or zero for a scalar).

Results print as `iree-run-module` prints them (`result[0]: hal.buffer_view` then
`2x2xf32=[1 2][3 4]`, scalars as `i32=5`); `--output=` (once per result) redirects:
`-` prints without the `result[i]:` label, `@f.npy` / `+f.npy` write / append a numpy
file, `@f.bin` raw bytes, an empty value drops the result. `.npy` files are written byte
for byte as IREE writes them; bf16 and fp8 results, which iree-run-module 3.13 refuses
to write (UNIMPLEMENTED), are written as numpy writes ml_dtypes arrays of them (`<V2`,
`|V1`: raw bits that `--input=@` and `--expected_output=@` read back).

`--expected_output=` (once per result, the `--input=` syntax, `(ignored)` to skip one)
compares instead of printing, as iree-run-module does: integers, i1 and opaque types
exactly, f16/f32/f64/bf16 within `abs(actual - expected) <= atol + rtol * abs(expected)`
(`--expected_{f16,f32,f64,bf16}_threshold`, `--expected_rtol`; NaN equals NaN), or
byte-exact with `--equality_mode=exact`. Mismatches print `[FAILED] result[i]: ...` with
both values and exit 1; a match prints `[SUCCESS] ...` and exits 0. Two deliberate
differences from iree-run-module 3.13, which fails every scalar comparison ("variant
types mismatch; expected i32 but got i32") and every integer tensor read back from its
own `--output=@x.npy` (an `.npy` file cannot say "signless"): tinyhal compares scalars
by value, and takes an expected `.npy` integer or opaque type as the result's type when
the widths agree, so `--output=@x.npy` round-trips through `--expected_output=@x.npy`;
sub-byte integer results go to `.npy` one element per byte (`|i1`, `|u1`), where IREE
3.13 writes packed bytes under a header promising twice as many, and read back into the
packed type when compared.

Several `--device=` flags give a program compiled for several devices
(`--iree-hal-target-device=a=local[0] --iree-hal-target-device=b=local[1]`) its
devices in order; drivers may be mixed (`--device=task --device=emu://edge-npu`).

`--executable_policy=portable` (tinyhal's own flag) makes every device refuse executables
that carry native machine code: a program compiled for VMVX
(`--iree-hal-local-target-device-backends=vmvx`) runs, one with llvm-cpu executables
fails with PERMISSION_DENIED naming the executable and the policy.

`--native_module=package.module:factory` (repeatable) links a native module written in
Python: `factory(device)` returns a `tinyhal.vm.NativeModule`.

Every other flag `iree-run-module --help` lists is accepted with its meaning or refused
with one line saying why it has no meaning here (`tinyhal.vm.run_flags`), so a
flagfile (`--flagfile=PATH`) written for iree-run-module runs unchanged.

`--device_allocator=caching|debug` (IREE's allocator layers) is accepted and changes
nothing here (tinyhal has neither layer: `run_flags.DEVICE_ALLOCATORS` says why each is
not missed); other allocator names are refused.

Errors print one line to stderr: a run that fails (a missing or bad module file, inputs
the function does not take) exits with status 1, as iree-run-module's does; a mistake on
the command line (an unknown flag or driver, a bad flag value, a flag refused as
meaningless here) with 2, where iree-run-module 3.13 exits 1 for those too (a deliberate
difference: a script can tell a wrong invocation from a failed run, as with argparse
tools and tinyhal-serve).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
import os
import re
import struct
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import (
    Error,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
    UnimplementedError,
)
from ..hal.allocator import physical_memory
from ..hal.buffer_view import BufferView
from ..hal.executable import EXECUTABLE_POLICIES
from ..hal.text import (
    dense_byte_count,
    format_buffer_elements,
    format_c_float,
    format_shape_and_element_type,
    parse_buffer_elements,
    parse_shape_and_element_type,
)
from ..hal.types import (
    BufferUsage,
    ElementType,
    MemoryType,
    element_info,
    float32_bits,
    pack_elements,
    packed_byte_length,
    unpack_elements,
)
from .loader import load_module
from .run_flags import (
    EXIT_USAGE,
    MODULE_MODES,
    NO_MEANING,
    TASK_FLAGS,
    UsageParser,
    check_device_allocators,
    check_no_meaning,
    expand_flagfiles,
    list_devices,
    list_drivers,
    task_options,
)

if TYPE_CHECKING:
    import numpy as np

# -- formatting (as IREE's tools do) -------------------------------------------------------


def _read_bytes(view: BufferView) -> bytes:
    device = view.buffer.allocator.device_ref()
    return device.read_bytes(view.buffer, 0, view.byte_length)


def format_buffer_view(view: BufferView, max_elements: int = 1024) -> str:
    """`2x2xf32=[1 2][3 4]`, exactly as `iree_hal_buffer_view_format` writes it."""
    head = format_shape_and_element_type(view.shape, view.element_type) + "="
    return head + format_buffer_elements(_read_bytes(view), view.shape, view.element_type,
                                         max_elements)


def format_scalar(value: Any, cconv: str) -> str:
    if value is None:
        return "(null)"
    if cconv == "i":
        return f"i32={int(value)}"
    if cconv == "I":
        return f"i64={int(value)}"
    if cconv == "f":
        return "f32=" + _c_g(value)
    if cconv == "F":
        return "f64=" + _c_g(value)
    return "?"


def _c_g(value: float) -> str:
    """C's `%g` of a double, keeping a NaN's sign as C does."""
    value = float(value)
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return "%g" % value


def format_result(value: Any, cconv: str, max_elements: int) -> str:
    if value is None:
        return "(null)"
    if isinstance(value, BufferView):
        return "hal.buffer_view\n" + format_buffer_view(value, max_elements)
    if cconv in "iIfF":
        return format_scalar(value, cconv)
    name = getattr(type(value), "type_name", type(value).__name__)
    return f"{name}\n(no printer)"


# -- numpy files (IREE's tooling/numpy_io rules) -----------------------------------------------


def _npy_descr_element_type(descr: str) -> int:
    if not descr or descr[0] not in "|=<":
        raise InvalidArgumentError(f"unsupported npy byte order in descr '{descr}'")
    kind, width = descr[1:2], descr[2:]
    numerical = {"b": 0x13, "i": 0x11, "u": 0x12, "f": 0x21, "c": 0x23, "V": 0x00}.get(kind)
    if numerical is None:
        raise UnimplementedError(f"unsupported data type {kind}")
    if not width.isdigit():
        raise InvalidArgumentError("invalid descr byte width")
    return (numerical << 24) | (int(width) * 8)


def read_npy(f: Any, path: str) -> tuple[tuple[int, ...], int, bytes]:
    """(shape, element type, bytes) of the next array in an open `.npy` file."""
    magic = f.read(8)
    if len(magic) < 8:
        raise OutOfRangeError(f"end-of-file encountered reading a numpy header from {path}")
    if magic[:6] != b"\x93NUMPY" or magic[6] not in (1, 2, 3):
        raise InvalidArgumentError(f"{path} is not a numpy .npy file")
    length_size = 2 if magic[6] == 1 else 4
    header_length = int.from_bytes(f.read(length_size), "little")
    try:
        import ast  # only a .npy input pays for it

        header = ast.literal_eval(f.read(header_length).decode("latin-1").strip())
        descr, shape = header["descr"], tuple(int(d) for d in header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError):
        raise InvalidArgumentError(f"malformed numpy header in {path}") from None
    if header.get("fortran_order"):
        raise UnimplementedError("fortran_order npy files are not supported")
    if not isinstance(descr, str):
        raise UnimplementedError(f"structured numpy dtypes are not supported ({path})")
    for i, dim in enumerate(shape):
        if not 0 <= dim < 1 << 63:  # int64, as iree-run-module reads them
            raise InvalidArgumentError(f"invalid dimension {i} value {dim}")
    element_type = _npy_descr_element_type(descr)
    nbytes = math.prod(shape) * dense_byte_count(element_type)
    try:  # a header may promise more than the file holds: not allocated for it
        left = os.fstat(f.fileno()).st_size - f.tell()
    except (AttributeError, OSError, ValueError):
        left = nbytes
    data = f.read(nbytes) if nbytes <= left else b""
    if len(data) < nbytes:
        raise OutOfRangeError(
            f"end-of-file encountered during read; failed to read npy contents of "
            f"{nbytes} bytes")
    return shape, element_type, data


_NPY_KIND = {0x00: "V", 0x13: "b", 0x10: "i", 0x11: "i", 0x12: "u", 0x21: "f", 0x23: "c"}


def npy_bytes(shape: Sequence[int], element_type: int, data: bytes) -> bytes:
    """A `.npy` file for a tensor, byte for byte as iree-run-module writes it."""
    numerical = (element_type >> 24) & 0xFF
    size = dense_byte_count(element_type)
    if (element_type & 0xFF) < 8 and numerical in (0x10, 0x11, 0x12):
        # one element per byte (IREE 3.13 writes the packed bytes under a header that
        # promises one byte per element, a file neither numpy nor IREE can read)
        import numpy as np

        wide = np.uint8 if numerical == 0x12 else np.int8
        data = unpack_elements(np.frombuffer(data, np.uint8), tuple(shape),
                               element_type).astype(wide).tobytes()
    kind = _NPY_KIND.get(numerical)
    if kind is None and element_info(element_type) is not None and size in (1, 2):
        kind = "V"  # bf16 / fp8: raw bits, as numpy writes ml_dtypes arrays
    if kind is None:
        raise UnimplementedError("unsupported data encoding")
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    descr = ("|" if size == 1 else "<") + kind + str(size)
    head = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}"
    big = len(head) > 65535
    prefix = 8 + (4 if big else 2)
    padding = -(prefix + len(head) + 1) % 64
    body = head + " " * padding + "\n"
    return (b"\x93NUMPY" + bytes([2 if big else 1, 0])
            + len(body).to_bytes(4 if big else 2, "little") + body.encode("latin-1")
            + bytes(data))


_SCALAR_NPY = {"i": (ElementType.SINT_32, "<i"), "I": (ElementType.SINT_64, "<q"),
               "f": (ElementType.FLOAT_32, "<I"), "F": (ElementType.FLOAT_64, "<d")}


def _output_tensor(value: Any, cconv: str) -> tuple[tuple[int, ...], int, bytes]:
    if isinstance(value, BufferView):
        return tuple(value.shape), int(value.element_type), _read_bytes(value)
    if value is None:
        return (0,), int(ElementType.SINT_8), b""
    entry = _SCALAR_NPY.get(cconv)
    if entry is None:
        raise InvalidArgumentError(
            "unsupported output source type; expected: !hal.buffer, !hal.buffer_view, "
            "!vm.buffer"
        )
    element_type, code = entry
    if cconv == "f":
        value = float32_bits(value)
    elif cconv in "iI":  # wrapped to the width, as a C cast
        bits = 32 if cconv == "i" else 64
        value = ((int(value) + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))
    return (), int(element_type), struct.pack(code, value)


def write_output(value: Any, cconv: str, spec: str, max_elements: int, out) -> None:
    if spec == "":
        return
    if spec == "-":
        out.write(format_result(value, cconv, max_elements) + "\n")
        return
    if spec[0] == "@":
        mode = "wb"
    elif spec[0] == "+":
        mode = "ab"
    else:
        raise UnimplementedError(f"unsupported output mode specification '{spec}'")
    path = spec[1:]
    shape, element_type, data = _output_tensor(value, cconv)
    blob = npy_bytes(shape, element_type, data) if path.endswith(".npy") else data
    try:
        with open(path, mode) as f:
            f.write(blob)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write {path}: {exc.strerror}") from None


# -- inputs ----------------------------------------------------------------------------------


class Tensor(NamedTuple):
    """A parsed tensor value: shape, HAL element type and its buffer bytes."""

    shape: tuple[int, ...]
    element_type: int
    data: bytes | bytearray
    from_npy: bool = False
    storage: bool = False  # `&...`: the argument is the tensor's bare hal.buffer

    def to_numpy(self) -> np.ndarray:
        import numpy as np

        return unpack_elements(np.frombuffer(self.data, np.uint8), self.shape,
                               self.element_type)


class _NpyStreams:
    """Open .npy files so `+file.npy` reads the next array of a file read before."""

    def __init__(self) -> None:
        self.files: dict[str, Any] = {}

    def read(self, path: str, append: bool) -> Tensor:
        if not path.endswith(".npy"):
            raise UnimplementedError(
                "only numpy (.npy) files are supported for metadata-less variant I/O"
            )
        f = self.files.get(path) if append else None
        if f is None:
            old = self.files.pop(path, None)
            if old is not None:
                old.close()
            try:
                f = self.files[path] = open(path, "rb")
            except OSError as exc:
                raise InvalidArgumentError(f"cannot open {path}: {exc.strerror}") from None
        shape, element_type, data = read_npy(f, path)
        return Tensor(shape, element_type, data, from_npy=True)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _parse_float(token: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise InvalidArgumentError(f"invalid floating-point value '{token}'") from None


def _parse_int(token: str) -> int:
    try:
        return int(token, 10)
    except ValueError:
        raise InvalidArgumentError(f"invalid integer value '{token}'") from None


def parse_tensor(text: str) -> Tensor:
    """`2x2xf32=1,2,3,4` (or `...=@raw.bin`) as a tensor."""
    if "=" not in text and "x" not in text:
        raise InvalidArgumentError(
            "invalid tensor specification, requires at least a shape/type (`4x2xf32=...`)"
        )
    meta, _, data = text.partition("=")
    shape, element_type = parse_shape_and_element_type(meta)
    data = data.strip()
    nbytes = packed_byte_length(math.prod(shape), element_type)
    if nbytes >= 1 << 64:  # iree_device_size_t
        raise OutOfRangeError("packed byte count overflows device size")
    memory = physical_memory()
    if memory is not None and nbytes > memory:  # where iree-run-module's allocation fails
        raise ResourceExhaustedError(f"{nbytes} bytes for one input are more than the "
                                     f"memory of this machine")
    if data.startswith("@") or data.startswith("+"):
        try:
            with open(data[1:], "rb") as f:
                raw = f.read(nbytes)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot open {data[1:]}: {exc.strerror}") from None
        if len(raw) < nbytes:
            raise OutOfRangeError(f"file {data[1:]} has {len(raw)} bytes, {nbytes} needed")
        return Tensor(shape, element_type, raw)
    try:
        return Tensor(shape, element_type, parse_buffer_elements(data, shape, element_type))
    except InvalidArgumentError as exc:
        m = re.match(r"invalid (\w+) value '(.*)'$", exc.message)
        if m and m.group(1).startswith(("f", "bf")):
            raise InvalidArgumentError(f"invalid floating-point value '{m.group(2)}'") \
                from None
        if m:
            raise InvalidArgumentError(f"invalid integer value '{m.group(2)}'") from None
        raise


def parse_value(text: str, spec: Any, streams: _NpyStreams) -> list[Any]:
    """One `--input=` (or `--expected_output=`) value as the value(s) it provides: a
    `Tensor`, a Python number for a scalar, or None for a null ref."""
    text = text.strip()
    if not text:
        raise InvalidArgumentError("no value specified for input")
    if text in ("(null)", "(ignored)"):
        return [0 if spec is not None and spec.kind == "scalar" else None]
    if text[0] in "@+*":
        path = text[1:]
        if text[0] == "*":
            out = []
            try:
                with open(path, "rb") as f:
                    while f.peek(1):
                        shape, element_type, data = read_npy(f, path)
                        out.append(Tensor(shape, element_type, data, from_npy=True))
            except OSError as exc:
                raise InvalidArgumentError(f"cannot open {path}: {exc.strerror}") from None
            return out
        return [streams.read(path, append=text[0] == "+")]
    if text.startswith("&"):  # caller-provided storage: the buffer, not a view
        tensor = parse_tensor(text[1:])
        return [Tensor(tensor.shape, tensor.element_type, tensor.data, storage=True)]
    if spec is not None and spec.kind == "scalar":
        value_text = text
        m = re.fullmatch(r"(i1|i8|i16|i32|i64|si32|ui32|si64|ui64|index|f16|f32|f64)=(.*)",
                         text)
        if m:
            value_text = m.group(2).strip()
        if spec.type.startswith("f"):
            return [_parse_float(value_text)]
        return [_parse_int(value_text)]
    return [parse_tensor(text)]


_INPUT_MEMORY = MemoryType.DEVICE_LOCAL
_INPUT_USAGE = BufferUsage.DEFAULT | BufferUsage.MAPPING


def to_buffer_view(device: Any, tensor: Tensor,
                   memory_type: int = _INPUT_MEMORY) -> BufferView:
    """The tensor in a new device buffer, with exactly its element type."""
    buffer = device.allocator.allocate(len(tensor.data), memory_type, _INPUT_USAGE)
    if tensor.data:
        device.write_bytes(buffer, tensor.data)
    return BufferView(buffer, tensor.shape, tensor.element_type)


# -- expected outputs --------------------------------------------------------------------------


class Equality(NamedTuple):
    """How `--expected_output` compares tensors (iree-run-module's flags and defaults)."""

    mode: str = "approximate"
    f16_atol: float = 0.001
    f32_atol: float = 0.0001
    f64_atol: float = 0.0001
    bf16_atol: float = 0.01
    rtol: float = 1e-5

    def atol(self, element_type: int) -> float | None:
        """The absolute tolerance for a floating type, None where comparison is exact."""
        if self.mode != "approximate":
            return None
        return {int(ElementType.FLOAT_16): self.f16_atol,
                int(ElementType.FLOAT_32): self.f32_atol,
                int(ElementType.FLOAT_64): self.f64_atol,
                int(ElementType.BFLOAT_16): self.bf16_atol}.get(int(element_type))


def _fuzzy_equal(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float
                 ) -> np.ndarray:
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(actual - expected) <= atol + rtol * np.abs(expected)
    return (actual == expected) | (np.isnan(actual) & np.isnan(expected)) | (
        np.isfinite(expected) & close)


def _element_text(data: Any, index: int, element_type: int) -> str:
    size = dense_byte_count(element_type)
    return format_buffer_elements(data[index * size : (index + 1) * size], (1,), element_type)


def compare_tensor(index: int, expected: Tensor, actual: BufferView, equality: Equality,
                   max_elements: int = 1024) -> str:
    """'' when `actual` matches, else iree-run-module's `[FAILED] result[i]: ...` text."""
    import numpy as np

    expected_type = expected.element_type
    actual_type = int(actual.element_type)
    if expected.from_npy and (expected_type & 0xFF) == (actual_type & 0xFF) and (
            (expected_type >> 24) in (0x00, 0x11, 0x12)) and (
            (actual_type >> 24) in (0x10, 0x11, 0x12) or element_info(actual_type)):
        expected = Tensor(expected.shape, actual_type, expected.data)
        expected_type = actual_type
    elif expected.from_npy and (expected_type & 0xFF) == 8 and (
            (expected_type >> 24) in (0x11, 0x12)) and (actual_type & 0xFF) < 8 and (
            (actual_type >> 24) in (0x10, 0x11, 0x12)) and expected.shape == tuple(actual.shape):
        expected = Tensor(expected.shape, actual_type, pack_elements(
            np.frombuffer(expected.data, np.uint8), actual_type).tobytes())
        expected_type = actual_type
    actual_data = np.frombuffer(_read_bytes(actual), np.uint8)
    expected_data = np.frombuffer(expected.data, np.uint8)
    expected_view = format_shape_and_element_type(expected.shape, expected_type)
    reason = ""
    if tuple(actual.shape) != expected.shape or actual_type != expected_type:
        reason = (f"metadata is {format_shape_and_element_type(actual.shape, actual_type)}; "
                  f"expected that the view matches {expected_view}")
    else:
        count = math.prod(expected.shape)
        atol = equality.atol(expected_type)
        size = dense_byte_count(expected_type)
        if atol is None or count == 0:
            # exact: element by element of the buffer (a packed byte at a time for i4)
            units = packed_byte_length(count, expected_type) // size if size else 0
            a = actual_data[: units * size].reshape(units, size)
            e = expected_data[: units * size].reshape(units, size)
            bad = np.nonzero(np.any(a != e, axis=1))[0]
        else:
            wide = np.float64 if expected_type == ElementType.FLOAT_64 else np.float32
            a = unpack_elements(actual_data, (count,), expected_type).astype(wide)
            e = unpack_elements(expected_data, (count,), expected_type).astype(wide)
            bad = np.nonzero(~_fuzzy_equal(a.astype(np.float64), e.astype(np.float64),
                                           atol, equality.rtol))[0]
        if len(bad):
            i = int(bad[0])
            reason = (f"element at index {i} ({_element_text(actual_data, i, expected_type)})"
                      f" does not match the expected "
                      f"({_element_text(expected_data, i, expected_type)})")
    if not reason:
        return ""
    expected_text = expected_view + "=" + format_buffer_elements(
        expected.data, expected.shape, expected_type, max_elements)
    return (f"[FAILED] result[{index}]: {reason}; expected that the view is equal to "
            f"contents of a view of {expected_view}\n  expected:\n{expected_text}\n"
            f"  actual:\n{format_buffer_view(actual, max_elements)}\n")


_SCALAR_NAMES = {"i": "i32", "I": "i64", "f": "f32", "F": "f64"}


def compare_results(expected: list[Any], results: list[Any], cconvs: str,
                    equality: Equality) -> str:
    """'' when every result matches its expected value, else the `[FAILED]` report."""
    if len(expected) != len(results):
        return f"[FAILED] expected {len(expected)} list elements but {len(results)} provided\n"
    out = []
    for i, (want, have) in enumerate(zip(expected, results)):
        cc = cconvs[i] if i < len(cconvs) else "r"
        if want is None:
            continue
        if isinstance(want, Tensor) and isinstance(have, BufferView):
            out.append(compare_tensor(i, want, have, equality))
        elif cc in _SCALAR_NAMES and not isinstance(want, Tensor) and have is not None:
            name = _SCALAR_NAMES[cc]
            if want != have:
                show = (lambda v: format_c_float(float(v))) if cc in "fF" else \
                    (lambda v: str(int(v)))
                out.append(f"[FAILED] result[{i}]: {name} values differ\n  expected: "
                           f"{show(want)}\n  actual: {show(have)}\n")
        else:
            want_name = "hal.buffer_view" if isinstance(want, Tensor) else \
                _SCALAR_NAMES.get(cc, "?")
            have_name = "empty" if have is None else (
                _SCALAR_NAMES[cc] if cc in _SCALAR_NAMES else
                getattr(type(have), "type_name", type(have).__name__))
            out.append(f"[FAILED] result[{i}]: variant types mismatch; expected {want_name} "
                       f"but got {have_name}\n")
    return "".join(out)


# -- native modules --------------------------------------------------------------------------


def native_module_factory(spec: str) -> Any:
    """`package.module:factory` -> the factory (called later with the device)."""
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise InvalidArgumentError(
            f"--native_module takes package.module:factory, not {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        # as `python -m` does: modules of the current directory come first
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgumentError(f"cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidArgumentError(f"{module_name!r} has no attribute {attr!r}") from None
    return target


# -- parameters ------------------------------------------------------------------------------


def parameter_flags(flags: Sequence[str], mode: str) -> dict[str, Any] | None:
    """`--parameters=[scope=]PATH` flags as one index per scope (IREE splits at the
    first `=`; no `=` is the anonymous scope), or None when there are none."""
    if not flags:
        return None
    from .parameter_formats import ParameterIndex

    scopes: dict[str, Any] = {}
    for flag in flags:
        scope, eq, path = flag.partition("=")
        if not eq:
            scope, path = "", flag
        scopes.setdefault(scope, ParameterIndex()).load(path, mode=mode)
    return scopes


# -- main ------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    # argparse makes a help formatter per add_argument just to check it, and the default
    # one imports shutil (2 ms) to ask the terminal's width; a fixed width while building,
    # the default again for --help and usage errors.
    p = UsageParser(
        prog="tinyhal-run",
        description="Runs a function of a compiled IREE module (iree-run-module's flags).",
        epilog="iree-run-module's other flags are accepted at their default or refused in "
               "one line saying why. A mistake on the command line exits 2, a failed run 1.",
        formatter_class=functools.partial(argparse.HelpFormatter, width=80),
        allow_abbrev=False,
    )
    p.add_argument("--flagfile", metavar="PATH",
                   help="read flags from PATH where this flag stands (one a line, # "
                        "comments), as IREE's tools do")
    p.add_argument("--module", action="append", default=[],
                   help="a .vmfb to load; several are linked in order (each may import "
                        "from the ones before), the function is looked up in the last")
    p.add_argument("--module_mode", default="preload", choices=MODULE_MODES,
                   help="accepted for iree-run-module's sake: tinyhal maps every module "
                        "file privately (copy-on-write) either way")
    p.add_argument("--native_module", action="append", default=[],
                   help="package.module:factory of a Python native module to link")
    p.add_argument("--parameters", action="append", default=[],
                   help="[scope=]PATH of a parameter file (.irpa, .safetensors, .gguf) the "
                        "program reads its weights from; repeatable, files of one scope merge")
    p.add_argument("--parameter_mode", default="file", choices=("file", "preload"),
                   help="file: read parameters from the file when the program loads them; "
                        "preload: copy each file into memory at startup")
    p.add_argument("--function", default="", help="function to run")
    p.add_argument("--input", action="append", default=[], metavar="VALUE",
                   help="the next argument, in order: [SHAPEx]TYPE=VALUES "
                        "(2x2xf32=1,2,3,4; one value splats; =@raw.bin reads bytes), "
                        "@file.npy (+file.npy: its next array), a scalar (5, 2.5), "
                        "&[SHAPEx]TYPE=VALUES for caller storage (a bare !hal.buffer), or "
                        "(null)")
    p.add_argument("--output", action="append", default=None, metavar="WHERE",
                   help="where the next result goes: - (print unlabelled), @f.npy / "
                        "+f.npy (write / append), @f.bin (raw bytes), empty (drop it)")
    p.add_argument("--expected_output", action="append", default=None,
                   help="an expected result (the --input syntax; `(ignored)` skips one)")
    p.add_argument("--equality_mode", default="approximate",
                   choices=("approximate", "exact"),
                   help="compare floats within the thresholds below, or bytes exactly")
    for kind, default in (("f16", 0.001), ("f32", 0.0001), ("f64", 0.0001), ("bf16", 0.01)):
        p.add_argument(f"--expected_{kind}_threshold", type=float, default=default,
                       metavar="ATOL", help=f"{kind} results match within ATOL + RTOL * "
                                            f"|expected| (default {default:g})")
    p.add_argument("--expected_rtol", type=float, default=1e-5, metavar="RTOL",
                   help="relative tolerance of every float comparison (default 1e-05)")
    p.add_argument("--device", action="append", default=[], metavar="DEVICE",
                   help="sync, task (default) or emu, local-sync/local-task as IREE spells "
                        "them, emu://PRESET (generic, mcu-npu, edge-npu, datacenter) and "
                        "emu://PRESET?queues=N; repeat for a program compiled for several "
                        "devices")
    p.add_argument("--executable_policy", default="any", choices=EXECUTABLE_POLICIES,
                   help="which executables the devices load: 'any', or 'portable' to "
                        "refuse executables that carry native machine code (VMVX only)")
    p.add_argument("--output_max_element_count", type=int, default=1024, metavar="N",
                   help="elements printed per result before `...` (default 1024)")
    p.add_argument("--device_profiling_mode", default="",
                   help="profile the device during the call: comma-separated modes "
                        "(queue-events, host-execution, memory-events, dispatch-events, ...)")
    p.add_argument("--device_profiling_output", default="",
                   help="where the profile goes; .json is Chrome trace JSON, .jsonl is "
                        "IREE's ireeperf-jsonl")
    p.add_argument("--emu_summary", nargs="?", const="true", default="false",
                   type=_summary_format,
                   help="on emu: print the run's modelled-time summary to stderr "
                        "(`json`: one JSON object per emu device, with its dispatches)")
    p.add_argument("--emu_config", default="",
                   help="on emu: the accelerator, a SCALE-Sim .cfg file (array, SRAMs, "
                        "bandwidth; an [emu] section for ClockHz, VectorLanes, CostModel)")
    p.add_argument("--emu_cost_file", default="",
                   help="on emu: measured per-export cycles (JSON, or CSV with export and "
                        "cycles columns)")
    p.add_argument("--print_statistics", nargs="?", const="true", default="false",
                   type=_flag_bool, help="print device allocator statistics to stderr")
    p.add_argument("--device_allocator", action="append", default=None, metavar="NAME",
                   help="IREE's allocator layers caching and debug are accepted and change "
                        "nothing here (tinyhal has neither layer; its queue allocations come "
                        "from a transient ringbuffer); other names are refused")
    p.add_argument("--trace_execution", nargs="?", const="true", default="false",
                   type=_flag_bool,
                   help="print each VM instruction as it runs to stderr, in IREE's format "
                        "(the module runs a slower, plain translation of its bytecode)")
    p.add_argument("--list_drivers", action="store_true", help="list the drivers and exit")
    for name in ("list_devices", "dump_devices"):
        p.add_argument(f"--{name}", nargs="?", const="", default=None,
                       help="list the devices (of one driver) and exit")
    for name in TASK_FLAGS:
        p.add_argument(f"--{name}", default=None, help="task driver: see tinyhal.vm.run_flags")
    for name in NO_MEANING:
        p.add_argument(f"--{name}", action="append", nargs="?", const="true", default=None,
                       help=argparse.SUPPRESS)
    p.formatter_class = argparse.HelpFormatter
    return p


def _flag_bool(text: str) -> bool:
    """An IREE boolean flag's value (`--flag`, `--flag=true`, `--flag=false`)."""
    lowered = text.strip().lower()
    if lowered in ("true", "1", ""):
        return True
    if lowered in ("false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def _summary_format(text: str) -> str:
    """`--emu_summary`'s value: "" (none), "text" or "json"."""
    if text.strip().lower() == "json":
        return "json"
    return "text" if _flag_bool(text) else ""


def device_name(name: str) -> str:
    """The driver of an IREE `--device=` value (`local-task`, `emu://edge-npu`)."""
    name = name.strip()
    if "://" in name:
        name = name.split("://", 1)[0]
    return name


def _accelerator_options(args: argparse.Namespace) -> dict[str, str]:
    """`accelerator` / `cost_file` from `--emu_config` / `--emu_cost_file`, for the devices
    whose driver takes them; either without such a `--device` is an INVALID_ARGUMENT."""
    from ..hal import driver_options

    options = {}
    if args.emu_config:
        options["accelerator"] = args.emu_config
    if args.emu_cost_file:
        options["cost_file"] = args.emu_cost_file
    if options and not any(set(options) <= driver_options(device_name(d))
                           for d in args.device):
        flag = "--emu_config" if args.emu_config else "--emu_cost_file"
        raise InvalidArgumentError(f"{flag} needs a device that models an accelerator "
                                   f"(--device=emu)")
    return options


def create_devices(flags: list[str], task: dict[str, str], policy: str = "any",
                   accelerator: dict[str, str] | None = None) -> list[Any]:
    """One device per `--device=` flag, in order (the task driver without one), as IREE
    gives a program compiled for several devices its devices in flag order; each with
    executable policy `policy`."""
    from ..hal import create_device, driver_options

    devices: list[Any] = []
    try:
        for flag in flags or ["task"]:
            driver = device_name(flag)
            extra = {k: v for k, v in (accelerator or {}).items()
                     if k in driver_options(driver)}
            devices.append(create_device(flag, **task_options(task, driver), **extra,
                                         executable_policy=policy))
    except BaseException:
        for device in devices:
            device.close()
        raise
    return devices


def _as_argument(module: Any, value: Any) -> Any:
    if not isinstance(value, Tensor):
        return value
    view = to_buffer_view(module.device, value, module.input_memory_type)
    return view.buffer if value.storage else view


def run(argv: Sequence[str], stdout=None, stderr=None) -> int:
    from .api import Module

    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = _parser()
    try:
        args = parser.parse_args(expand_flagfiles(list(argv)))
        check_no_meaning({name: getattr(args, name) for name in NO_MEANING
                          if getattr(args, name) is not None})
        if args.flagfile is not None:
            raise InvalidArgumentError(f"--flagfile {args.flagfile}: write --flagfile=PATH")
        check_device_allocators(args.device_allocator or [])
        if args.list_drivers or args.list_devices is not None or \
                args.dump_devices is not None:
            stdout.write(list_drivers() if args.list_drivers else list_devices(
                args.list_devices if args.list_devices is not None else args.dump_devices))
            return 0
        if not args.module:
            raise InvalidArgumentError("--module= is required")
    except SystemExit as exc:
        return int(exc.code or 0)
    except Error as exc:
        stderr.write(f"tinyhal-run: {exc}\n")
        return EXIT_USAGE
    streams = _NpyStreams()
    module = None
    devices: list[Any] = []
    try:
        for path in args.module:
            if not os.path.exists(path):  # NOT_FOUND, as tinyhal.load and iree-run-module
                raise NotFoundError(f"module file not found: {path}")
        *linked, path = args.module
        factories = [native_module_factory(s) for s in args.native_module]
        factories += [load_module(p) for p in linked]
        profile_output = args.device_profiling_output
        if args.device_profiling_mode and not profile_output:
            raise InvalidArgumentError("--device_profiling_mode needs --device_profiling_output")
        if profile_output and not profile_output.endswith((".json", ".jsonl")):
            raise InvalidArgumentError(
                f"--device_profiling_output={profile_output}: the extension picks the format, "
                "'.json' (Chrome trace) or '.jsonl' (ireeperf-jsonl)")
        task = {n: getattr(args, n) for n in TASK_FLAGS if getattr(args, n) is not None}
        try:
            devices = create_devices(args.device, task, args.executable_policy,
                                     _accelerator_options(args))
        except InvalidArgumentError as exc:  # an unknown driver, preset or option
            stderr.write(f"tinyhal-run: {exc}\n")
            return EXIT_USAGE
        module = Module(path, devices if len(devices) > 1 else devices[0], modules=factories,
                        parameters=parameter_flags(args.parameters, args.parameter_mode),
                        trace_execution=stderr if args.trace_execution else None)
        name = args.function
        if not name:
            names = [n for n in module.functions if "$" not in n]
            if len(names) != 1:
                raise InvalidArgumentError(
                    "more than one exported function present; --function= must be "
                    "specified explicitly" if names else "no exported functions in the module"
                )
            name = names[0]
        info, vmf = module.lookup(name)
        values: list[Any] = []
        for text in args.input:
            spec = info.inputs[len(values)] if len(values) < len(info.inputs) else None
            if spec is None:
                raise InvalidArgumentError(
                    f"function expected fewer input values (it takes {len(info.inputs)})"
                )
            try:
                values.extend(parse_value(text, spec, streams))
            except Error as exc:
                exc.message = f"{exc.message}; parsing input `{text.strip()}`"
                raise
        stdout.write(f"EXEC @{name}\n")
        stdout.flush()
        arguments = [_as_argument(module, v) for v in values]
        if profile_output:
            from ..hal.profile import write_profiles  # only a profiling run pays for json

            with module.profiling(args.device_profiling_mode or None) as profiles:
                results = module.invoke_raw(name, *arguments)
            write_profiles(profiles, profile_output)
        else:
            results = module.invoke_raw(name, *arguments)
        if args.emu_summary:
            summaries = [d.summary() for d in module.devices if d.capabilities.modelled_time]
            if not summaries:
                raise InvalidArgumentError("--emu_summary needs --device=emu")
            for summary in summaries:
                if args.emu_summary == "json":
                    import json

                    stderr.write(json.dumps(summary.as_json()) + "\n")
                else:
                    stderr.write(summary.format())
        cconvs = vmf.cconv.results
        if args.expected_output is not None:
            expected: list[Any] = []
            for text in args.expected_output:
                spec = info.outputs[len(expected)] if len(expected) < len(info.outputs) \
                    else None
                if spec is None and len(expected) >= len(results):
                    raise InvalidArgumentError(
                        f"function expected fewer input values; parsing input `{text}`; "
                        "parsing expected function outputs")
                expected.extend(parse_value(text, spec, streams))
            equality = Equality(args.equality_mode, args.expected_f16_threshold,
                                args.expected_f32_threshold, args.expected_f64_threshold,
                                args.expected_bf16_threshold, args.expected_rtol)
            report = compare_results(expected, results, cconvs, equality)
            if report:
                stdout.write(report)
                stdout.flush()
                return 1
            stdout.write("[SUCCESS] all function outputs matched their expected values.\n")
        elif args.output is None:
            for i, value in enumerate(results):
                cc = cconvs[i] if i < len(cconvs) else "r"
                text = format_result(value, cc, args.output_max_element_count)
                stdout.write(f"result[{i}]: {text}\n")
        else:
            if len(args.output) != len(results):
                raise OutOfRangeError(
                    f"{len(args.output)} outputs specified but the provided variant list "
                    f"only has {len(results)} elements"
                )
            for i, (value, spec) in enumerate(zip(results, args.output)):
                cc = cconvs[i] if i < len(cconvs) else "r"
                write_output(value, cc, spec, args.output_max_element_count, stdout)
        stdout.flush()
        if args.print_statistics:
            for device in module.devices:  # each of several devices, in --device order
                stats = device.allocator.statistics()
                stderr.write(f"Device: {device.identifier}\n")
                for heap, h in stats.heaps.items():
                    stderr.write(f"  {heap}: {h.live_bytes} live, {h.peak_bytes} peak bytes\n")
        return 0
    except Error as exc:
        stdout.flush()
        decl = ""
        if module is not None and args.function in getattr(module, "functions", {}):
            decl = module.functions[args.function].declaration
        stderr.write(f"tinyhal-run: {exc}" + (f"; `{decl}`" if decl else "") + "\n")
        return 1
    except (OSError, ValueError) as exc:
        stderr.write(f"tinyhal-run: {type(exc).__name__}: {exc}\n")
        return 1
    except MemoryError:  # as iree-run-module's allocator failing
        stderr.write("tinyhal-run: RESOURCE_EXHAUSTED: out of memory\n")
        return 1
    finally:
        streams.close()
        if module is not None:
            module.close()
        for device in devices:
            device.close()


def main(argv: Sequence[str] | None = None) -> None:
    """The `tinyhal-run` command. Run as the command (no `argv`), it leaves without the
    interpreter's teardown (collecting every module's objects, ~10-20 ms): `run` has
    closed the module and its device and written every output, and stdout and stderr are
    flushed here."""
    code = run(sys.argv[1:] if argv is None else argv)
    if argv is None:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:  # e.g. a closed pipe: the interpreter reports it as usual
            sys.exit(code)
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
