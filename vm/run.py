"""`tinyhal-run`: run a function of a compiled module, with `iree-run-module`'s flags and output.

    tinyhal-run --module=m.vmfb --function=main --input=2x2xf32=1,2,3,4 --input=@x.npy

Inputs (`--input=`, once per argument, in order):
- `[shape x]type=values` builds a tensor: `2x3xf32=1 2 3 4 5 6`, `2x2xi32=[1 2][3 4]`,
  `f32=2.5` (rank 0); one value is splatted, no values give zeros; `...=@file.bin`
  reads raw bytes;
- `@file.npy` reads a numpy file (`+file.npy` the next array of one opened before);
- a scalar argument takes a number (`5`, `2.5`); tinyhal also accepts `i32=5`;
- `(null)` / `(ignored)` give a null ref (or zero for a scalar).

Results print as `iree-run-module` prints them (`result[0]: hal.buffer_view` then
`2x2xf32=[1 2][3 4]`, scalars as `i32=5`); `--output=` (once per result) redirects:
`-` prints without the `result[i]:` label, `@f.npy` / `+f.npy` write / append a numpy
file, `@f.bin` raw bytes, an empty value drops the result. Errors print one line to stderr
and exit with status 1.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import Error, InvalidArgumentError, OutOfRangeError, UnimplementedError
from ..hal.buffer_view import BufferView
from ..hal.types import ElementType, numpy_dtype

_ELEMENT_TYPES: dict[str, int] = {
    "i1": ElementType.BOOL_8,
    "i8": ElementType.INT_8, "si8": ElementType.SINT_8, "ui8": ElementType.UINT_8,
    "i16": ElementType.INT_16, "si16": ElementType.SINT_16, "ui16": ElementType.UINT_16,
    "i32": ElementType.INT_32, "si32": ElementType.SINT_32, "ui32": ElementType.UINT_32,
    "i64": ElementType.INT_64, "si64": ElementType.SINT_64, "ui64": ElementType.UINT_64,
    "f16": ElementType.FLOAT_16, "f32": ElementType.FLOAT_32, "f64": ElementType.FLOAT_64,
    "bf16": ElementType.BFLOAT_16,
}
_PREFIX = {0x10: "i", 0x11: "si", 0x12: "ui", 0x21: "f", 0x22: "bf", 0x23: "cf"}


# -- formatting (as IREE's string utilities do) ------------------------------------------


def format_element_type(element_type: int) -> str:
    numerical = (element_type >> 24) & 0xFF
    bits = element_type & 0xFF
    if numerical == 0x13:
        return "i1"
    return f"{_PREFIX.get(numerical, '*')}{bits}"


def _c_float(value: float, spec: str) -> str:
    if math.isnan(value):
        text = "nan" if spec == "g" else "NAN"
        return ("-" if math.copysign(1.0, value) < 0 else "") + text
    return ("%" + spec) % value


def _element_formatter(element_type: int, dtype: np.dtype | None):
    numerical = (element_type >> 24) & 0xFF
    if numerical in (0x10, 0x11, 0x12) and dtype is not None:
        return lambda v: str(int(v))
    if numerical == 0x21 and dtype is not None:
        return lambda v: _c_float(float(v), "G")
    size = max(1, ((element_type & 0xFF) + 7) // 8)
    return lambda raw: raw.hex().upper() if isinstance(raw, bytes) else \
        bytes(np.asarray(raw).tobytes()[:size]).hex().upper()


def format_buffer_view(view: BufferView, max_elements: int = 1024) -> str:
    """`2x2xf32=[1 2][3 4]`, exactly as `iree_hal_buffer_view_format` writes it."""
    shape = view.shape
    element_type = view.element_type
    head = "x".join(str(d) for d in shape)
    head = (head + "x" if head else "") + format_element_type(element_type) + "="
    numerical = (element_type >> 24) & 0xFF
    try:
        dtype = numpy_dtype(element_type) if numerical in (0x10, 0x11, 0x12, 0x21) else None
    except Error:
        dtype = None
    size = max(1, ((element_type & 0xFF) + 7) // 8)
    count = math.prod(shape)
    raw = view.buffer.allocator.device_ref().read_array(view.buffer, 0, count * size)
    if dtype is not None:
        flat: Any = raw.view(dtype)
        fmt = _element_formatter(element_type, dtype)
    else:
        flat = [raw[i * size : (i + 1) * size].tobytes() for i in range(count)]
        fmt = _element_formatter(element_type, None)
    budget = [max_elements]
    out: list[str] = []

    def rec(offset: int, dims: tuple[int, ...]) -> None:
        if len(dims) > 1:
            stride = math.prod(dims[1:])
            for i in range(dims[0]):
                out.append("[")
                rec(offset + i * stride, dims[1:])
                out.append("]")
            return
        n = dims[0]
        shown = min(budget[0], n)
        budget[0] -= shown
        out.append(" ".join(fmt(flat[offset + i]) for i in range(shown)))
        if shown < n:
            out.append("...")

    rec(0, shape if shape else (1,))
    return head + "".join(out)


def format_scalar(value: Any, cconv: str) -> str:
    if value is None:
        return "(null)"
    if cconv == "i":
        return f"i32={int(value)}"
    if cconv == "I":
        return f"i64={int(value)}"
    if cconv == "f":
        return "f32=" + _c_float(float(value), "g")
    if cconv == "F":
        return "f64=" + _c_float(float(value), "g")
    return "?"


def format_result(value: Any, cconv: str, max_elements: int) -> str:
    if value is None:
        return "(null)"
    if isinstance(value, BufferView):
        return "hal.buffer_view\n" + format_buffer_view(value, max_elements)
    if cconv in "iIfF":
        return format_scalar(value, cconv)
    name = getattr(type(value), "type_name", type(value).__name__)
    return f"{name}\n(no printer)"


# -- parsing -------------------------------------------------------------------------------


def parse_shape_and_type(text: str) -> tuple[tuple[int, ...], int]:
    text = text.strip().strip('"')
    if not text:
        raise InvalidArgumentError("empty string input")
    shape_text, _, type_text = text.rpartition("x") if "x" in text else ("", "", text)
    shape: list[int] = []
    if shape_text:
        for dim in shape_text.split("x"):
            if not re.fullmatch(r"\d+", dim.strip()):
                raise InvalidArgumentError(f"shape[{len(shape)}] invalid value '{dim}' of "
                                           f"'{shape_text}'")
            shape.append(int(dim))
    element_type = _ELEMENT_TYPES.get(type_text.strip())
    if element_type is None:
        raise InvalidArgumentError(f"unsupported element type '{type_text}'")
    return tuple(shape), int(element_type)


def _parse_int(token: str) -> int:
    try:
        return int(token, 10)
    except ValueError:
        raise InvalidArgumentError(f"invalid integer value '{token}'") from None


def _parse_float(token: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise InvalidArgumentError(f"invalid floating-point value '{token}'") from None


def parse_elements(data: str, shape: tuple[int, ...], element_type: int) -> np.ndarray:
    """Parses `1 2,3 [4 5]` into an array of `shape` (one value splats, none is zeros)."""
    count = math.prod(shape)
    tokens = [t for t in re.split(r"[\s,\[\]]+", data) if t]
    numerical = (element_type >> 24) & 0xFF
    if numerical in (0x10, 0x11, 0x12, 0x21):
        dtype = numpy_dtype(element_type)
        if not tokens:
            return np.zeros(shape, dtype)
        if len(tokens) > count:
            raise OutOfRangeError(
                f"output data buffer overflow: element_capacity={count} < dst_i={count}+"
            )
        if numerical == 0x21:
            values = np.array([_parse_float(t) for t in tokens], dtype=np.float64)
            with np.errstate(over="ignore"):
                array = values.astype(dtype)
        else:
            ints = [_parse_int(t) for t in tokens]
            info = np.iinfo(dtype)
            lo = info.min if numerical != 0x10 else -(1 << (dtype.itemsize * 8 - 1))
            hi = info.max if numerical != 0x10 else (1 << (dtype.itemsize * 8)) - 1
            for v in ints:
                if not lo <= v <= hi:
                    raise InvalidArgumentError(
                        f"value {v} does not fit element type {format_element_type(element_type)}"
                    )
            mask = (1 << (dtype.itemsize * 8)) - 1
            array = np.array([v & mask for v in ints],
                             dtype=np.dtype(f"u{dtype.itemsize}")).view(dtype)
    else:  # booleans and opaque types are written as hex bytes, as IREE does
        size = max(1, ((element_type & 0xFF) + 7) // 8)
        dtype = np.dtype(np.bool_) if numerical == 0x13 else np.dtype(f"V{size}")
        if not tokens:
            return np.zeros(shape, dtype)
        if len(tokens) > count:
            raise OutOfRangeError(
                f"output data buffer overflow: element_capacity={count} < dst_i={count}+"
            )
        raw = bytearray()
        for t in tokens:
            if len(t) != 2 * size or not re.fullmatch(r"[0-9A-Fa-f]+", t):
                raise InvalidArgumentError(
                    f"binary hex element count mismatch: '{t}' is not {size} hex byte(s)"
                )
            raw += bytes.fromhex(t)
        array = np.frombuffer(bytes(raw), dtype=np.uint8).view(dtype) if numerical != 0x13 \
            else np.frombuffer(bytes(raw), dtype=np.uint8).astype(bool)
    if array.size == 1 and count > 1:
        array = np.full(count, array[0], dtype=array.dtype)
    elif array.size < count:
        raise OutOfRangeError(
            f"input data string underflow: dst_i={array.size} < element_capacity={count}"
        )
    return array.reshape(shape)


class _NpyStreams:
    """Open .npy files so `+file.npy` reads the next array of a file read before."""

    def __init__(self) -> None:
        self.files: dict[str, Any] = {}

    def read(self, path: str, append: bool) -> np.ndarray:
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
        try:
            return np.load(f, allow_pickle=False)
        except (ValueError, EOFError, OSError) as exc:
            raise InvalidArgumentError(f"cannot read a numpy array from {path}: {exc}") from None

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def parse_input(text: str, spec: Any, streams: _NpyStreams) -> list[Any]:
    """One `--input=` value as the argument value(s) it provides."""
    text = text.strip()
    if not text:
        raise InvalidArgumentError("no value specified for input")
    if text in ("(null)", "(ignored)"):
        return [0 if spec is not None and spec.kind == "scalar" else None]
    if text[0] in "@+*":
        path = text[1:]
        if text[0] == "*":
            out = []
            with open(path, "rb") as f:
                while f.peek(1) if hasattr(f, "peek") else f.read(1):
                    out.append(np.load(f, allow_pickle=False))
            return out
        return [streams.read(path, append=text[0] == "+")]
    if text.startswith("&"):
        raise UnimplementedError("storage (`&`) inputs are not supported by tinyhal-run")
    if spec is not None and spec.kind == "scalar":
        value_text = text
        m = re.fullmatch(r"(i1|i8|i16|i32|i64|si32|ui32|si64|ui64|index|f16|f32|f64)=(.*)",
                         text)
        if m:
            value_text = m.group(2).strip()
        if spec.type.startswith("f"):
            return [_parse_float(value_text)]
        return [_parse_int(value_text)]
    if "=" not in text and "x" not in text:
        raise InvalidArgumentError(
            "invalid tensor specification, requires at least a shape/type (`4x2xf32=...`)"
        )
    meta, _, data = text.partition("=")
    shape, element_type = parse_shape_and_type(meta)
    data = data.strip()
    if data.startswith("@") or data.startswith("+"):
        size = max(1, ((element_type & 0xFF) + 7) // 8)
        try:
            with open(data[1:], "rb") as f:
                raw = f.read(math.prod(shape) * size)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot open {data[1:]}: {exc.strerror}") from None
        if len(raw) < math.prod(shape) * size:
            raise OutOfRangeError(
                f"file {data[1:]} has {len(raw)} bytes, {math.prod(shape) * size} needed"
            )
        dtype = numpy_dtype(element_type)
        return [np.frombuffer(raw, dtype=dtype).reshape(shape).copy()]
    return [parse_elements(data, shape, element_type)]


# -- outputs ---------------------------------------------------------------------------------


def _as_numpy(value: Any, cconv: str) -> np.ndarray:
    if isinstance(value, BufferView):
        raw = value.buffer.allocator.device_ref().read_array(value.buffer, 0, value.byte_length)
        try:
            dtype = numpy_dtype(value.element_type)
        except Error:
            dtype = np.dtype(np.int8)
            return raw.view(dtype).copy()
        if (value.element_type >> 24) & 0xFF == 0x13:
            dtype = np.dtype(np.bool_)
        return raw.view(dtype).reshape(value.shape).copy()
    if value is None:
        return np.zeros(0, np.int8)
    dtype = {"i": np.int32, "I": np.int64, "f": np.float32, "F": np.float64}.get(cconv)
    if dtype is None:
        raise InvalidArgumentError(
            "unsupported output source type; expected: !hal.buffer, !hal.buffer_view, "
            "!vm.buffer"
        )
    return np.array(value, dtype=dtype)


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
    array = _as_numpy(value, cconv)
    try:
        with open(path, mode) as f:
            if path.endswith(".npy"):
                np.save(f, array, allow_pickle=False)
            else:
                f.write(np.ascontiguousarray(array).tobytes())
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write {path}: {exc.strerror}") from None


# -- main ------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tinyhal-run",
        description="Runs a function of a compiled IREE module (iree-run-module's flags).",
    )
    p.add_argument("--module", action="append", default=[], help="the .vmfb to load")
    p.add_argument("--function", default="", help="function to run")
    p.add_argument("--input", action="append", default=[], help="an input value")
    p.add_argument("--output", action="append", default=None, help="where a result goes")
    p.add_argument("--device", default="task",
                   help="sync, task or emu (local-sync/local-task accepted)")
    p.add_argument("--output_max_element_count", type=int, default=1024)
    p.add_argument("--print_statistics", action="store_true",
                   help="print device allocator statistics to stderr")
    return p


def _device_name(name: str) -> str:
    name = name.strip()
    if "://" in name:
        name = name.split("://", 1)[0]
    return name


def run(argv: Sequence[str], stdout=None, stderr=None) -> int:
    from .api import Module

    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = _parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    if not args.module:
        stderr.write("tinyhal-run: error: --module= is required\n")
        return 1
    streams = _NpyStreams()
    module = None
    try:
        if len(args.module) > 1:
            raise UnimplementedError("tinyhal-run loads one module (one --module=)")
        path = args.module[0]
        if not os.path.exists(path):
            raise InvalidArgumentError(f"module file {path!r} does not exist")
        module = Module(path, _device_name(args.device))
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
                values.extend(parse_input(text, spec, streams))
            except Error as exc:
                exc.message = f"{exc.message}; parsing input `{text.strip()}`"
                raise
        stdout.write(f"EXEC @{name}\n")
        stdout.flush()
        results = module.invoke_raw(name, *values)
        cconvs = vmf.cconv.results
        if args.output is None:
            for i, value in enumerate(results):
                cc = cconvs[i] if i < len(cconvs) else "r"
                stdout.write(f"result[{i}]: "
                             + format_result(value, cc, args.output_max_element_count) + "\n")
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
            stats = module.statistics()
            stderr.write(f"Device: {module.device.identifier}\n")
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
    finally:
        streams.close()
        if module is not None:
            module.close()


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
