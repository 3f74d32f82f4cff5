"""`tinyhal.load`: run a compiled `.vmfb` from Python with numpy arrays in and out.

    module = tinyhal.load("model.vmfb", device="task")
    y = module.main(x)                     # or module.invoke("main", x)
    y = await module.invoke_async("main", x)

A `Module` is one `vm.Context` (the `hal` module plus the bytecode module) on one device,
so module globals persist across calls. Arguments are converted by each function's ABI
declaration (the `iree.abi.declaration` reflection attribute, or the calling convention
when a module carries none): numpy arrays (or anything `numpy.asarray` accepts) become
buffer views after their dtype and shape are checked against the declaration, Python
numbers become VM scalars; results come back as numpy arrays (copies, so they outlive
the device memory) and Python scalars, one value bare and several as a tuple. Bad input
raises `tinyhal.Error` (INVALID_ARGUMENT) naming the argument. Element types follow the
table in `tinyhal.hal.types` (bf16 and fp8 as ml_dtypes arrays; i4/ui4 as ml_dtypes
int4/uint4, one element per byte in numpy and packed on the device). Export names are
opaque: `invoke("i16i16.i32", ...)` calls the export of that name.

`load(path, modules=[...])` links extra modules (host apps' `NativeModule`s, or factories
called with the device) between `hal` and the program, as IREE's tools link theirs.

Functions compiled with the `coarse-fences` ABI (`f$async`, or `async func` exports) take
a wait and a signal fence after their inputs; `invoke` and `invoke_async` add those and
wait on the signal fence before reading results. `invoke_async` runs on trio: every
`hal.fence.await` the program reaches suspends only this invocation.

Cancellation. Cancelling `invoke_async` (a trio cancel scope, `move_on_after`,
`fail_after`, a server's deadline) abandons the invocation; it never frees memory that
device work still uses, on any driver:

- before anything is submitted (the scope is already cancelled when `invoke_async` is
  called): `trio.Cancelled` is raised at once; the program does not run and the device
  is not touched;
- while the program waits on a fence (`hal.fence.await`, or the signal fence of a
  coarse-fences function): the wait ends with `trio.Cancelled` and the program stops
  there. Work it already submitted is not interrupted: it runs to completion (or
  failure), and what it uses (buffers, transients, command buffers, executables, host
  memory) stays alive until it retires, then is released, so the allocator's live bytes
  return to where they were. Work it would have submitted later is never submitted;
- during a deferred context's initialization (`__init`): initialization is never
  abandoned half way; the cancel takes effect when it is done;
- while a dispatch runs: device work is never stopped part way. On `task` and `emu` the
  invocation is already suspended on a fence, as above. On `sync`, device work runs on
  the calling thread inside the call, so a cancel takes effect at the first suspension
  after it, once that work is done.

Afterwards the module, its globals and the device stay usable: later calls give the
same results. `device.wait_idle()` waits for abandoned work to retire. `Module.close()`
and `Device.close()` with work in flight let running work finish and abort work that
can no longer start (see `tinyhal.hal.device`); at interpreter exit every device is
closed that way, so the process exits normally.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import re
import sys
import weakref
from collections.abc import Iterator, Sequence
from sys import getrefcount
from typing import IO, TYPE_CHECKING, Any, NamedTuple

from ..errors import (
    Error,
    IncompatibleError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from ..hal import Device, create_device
from ..hal.buffer import Buffer, host_block, views_of_block
from ..hal.buffer_view import BufferView
from ..hal.native import ffi
from ..hal.semaphore import Fence
from ..hal.types import (
    BufferUsage,
    MemoryType,
    copy_elements,
    element_info_for_mlir,
    element_type_for,
    pack_elements,
    unpack_elements,
)
from .context import Context
from .hal_module import create_hal_module
from .lists import is_list_type, list_input, list_output
from .loader import BytecodeModule, load_module
from .native import NativeModule
from .numbers import f32_from_bits
from .types import VMList

if TYPE_CHECKING:
    import numpy as np

    from .io_parameters import ParameterStatistics

__all__ = ["ArgSpec", "FunctionInfo", "Module", "load", "parse_declaration"]

_INPUT_MEMORY = int(MemoryType.DEVICE_LOCAL)  # ints: IntFlag arithmetic is slow per call
_INLINE_INPUT_MEMORY = int(MemoryType.HOST_LOCAL | MemoryType.DEVICE_VISIBLE)
_INPUT_USAGE = int(BufferUsage.DEFAULT | BufferUsage.MAPPING)
_HOST_VISIBLE = int(MemoryType.HOST_VISIBLE)
_memmove = ffi.memmove
_MAPPING = int(BufferUsage.MAPPING_SCOPED | BufferUsage.MAPPING_PERSISTENT)

_SCALARS = {"i1", "i8", "i16", "i32", "i64", "si32", "ui32", "si64", "ui64", "index",
            "f16", "f32", "f64"}
_INT_BITS = {"i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64, "index": 64, "si32": 32,
             "ui32": 32, "si64": 64, "ui64": 64}


class ArgSpec(NamedTuple):
    """One argument or result: a tensor (shape with None for dynamic dims) or a scalar."""

    name: str
    kind: str  # "tensor" | "scalar" | "ref" (opaque: buffer views, lists, ...)
    type: str  # the MLIR element or scalar type ("f32", "i1", ...) or the ref type
    shape: tuple[int | None, ...] | None = None

    @property
    def dtype(self) -> np.dtype | None:
        info = element_info_for_mlir(self.type)
        return info.dtype if info else None

    def describe(self) -> str:
        if self.kind == "tensor":
            dims = "x".join("?" if d is None else str(d) for d in self.shape or ())
            return f"tensor<{dims + 'x' if dims else ''}{self.type}>"
        return self.type


class FunctionInfo(NamedTuple):
    """What a module export takes and returns, from its ABI declaration."""

    name: str
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    is_async: bool  # coarse-fences ABI: (inputs..., wait_fence, signal_fence)
    declaration: str


# -- declaration parsing -------------------------------------------------------------------


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "<([{":
            depth += 1
        elif c in ">)]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def _parse_type(name: str, text: str) -> ArgSpec:
    text = text.strip()
    m = re.fullmatch(r"tensor<(.*)>", text)
    if m:
        body = m.group(1).split(",")[0].strip()  # drop an encoding attribute
        pieces = body.split("x")
        # element types never contain 'x' except complex<...>: rejoin from the end
        dims: list[int | None] = []
        idx = 0
        while idx < len(pieces) - 1 and re.fullmatch(r"\?|\d+", pieces[idx]):
            dims.append(None if pieces[idx] == "?" else int(pieces[idx]))
            idx += 1
        element = "x".join(pieces[idx:])
        return ArgSpec(name, "tensor", element, tuple(dims))
    if text in _SCALARS:
        return ArgSpec(name, "scalar", text)
    return ArgSpec(name, "ref", text)


def parse_declaration(decl: str) -> tuple[str, list[ArgSpec], list[ArgSpec], bool]:
    """Parses `sync func @f(%input0: tensor<4xf32>, ...) -> (%output0: ..., ...)`."""
    m = re.match(r"\s*(sync|async)?\s*func\s+@([^(\s]+)\(", decl)
    if not m:
        raise InvalidArgumentError(f"unrecognized ABI declaration: {decl!r}")
    is_async = m.group(1) == "async"
    name = m.group(2)
    depth, end = 1, m.end()
    while end < len(decl) and depth:
        depth += {"(": 1, "<": 1, ")": -1, ">": -1}.get(decl[end], 0)
        end += 1
    if depth:
        raise InvalidArgumentError(f"unbalanced ABI declaration: {decl!r}")
    args_text = decl[m.end() : end - 1]
    rest = decl[end:].strip()
    results_text = rest[2:].strip() if rest.startswith("->") else ""
    if results_text.startswith("(") and results_text.endswith(")"):
        results_text = results_text[1:-1]

    def specs(text: str, prefix: str) -> list[ArgSpec]:
        out = []
        for i, part in enumerate(_split_top(text)):
            if ":" in part and part.lstrip().startswith("%"):
                label, _, type_text = part.partition(":")
                label = label.strip().lstrip("%")
            else:
                label, type_text = f"{prefix}{i}", part
            # drop argument attributes like {iree.abi.name = "x"}
            type_text = re.sub(r"\{.*\}\s*$", "", type_text).strip()
            out.append(_parse_type(label, type_text))
        return out

    return name, specs(args_text, "input"), specs(results_text, "output"), is_async


_CCONV_SCALAR = {"i": "i32", "I": "i64", "f": "f32", "F": "f64"}


def _info_from_cconv(name: str, cconv: Any) -> FunctionInfo:
    def specs(types: Any, prefix: str) -> tuple[ArgSpec, ...]:
        return tuple(
            ArgSpec(f"{prefix}{i}", "scalar", _CCONV_SCALAR[t]) if t in _CCONV_SCALAR
            else ArgSpec(f"{prefix}{i}", "ref", "!vm.ref<?>")
            for i, t in enumerate(types)
        )

    return FunctionInfo(name, specs(cconv.args, "input"), specs(cconv.results, "output"),
                        False, "")


# -- the module ----------------------------------------------------------------------------


def _aligned_copy(data: bytes | bytearray | memoryview) -> memoryview:
    """`data` copied into 64-byte-aligned memory (so rodata can be imported in place)."""
    view = memoryview(data).cast("B")
    aligned, _ = host_block(view.nbytes)
    aligned[:] = view
    return aligned.toreadonly()


def _resolve_devices(device: Any, options: dict) -> list[tuple[Device, bool]]:
    """(device, created here) for `device`: one driver name or Device, or a list of
    them for a program compiled for several devices (IREE's `--device=A --device=B`:
    the program's devices are taken from it in order)."""
    if not isinstance(device, (list, tuple)):
        return [_resolve_device(device, options)]
    if not device:
        raise InvalidArgumentError("device=[] names no device")
    if options:
        raise InvalidArgumentError(
            f"device options {sorted(options)} given with a list of devices (make each "
            "with tinyhal.hal.create_device instead)")
    out: list[tuple[Device, bool]] = []
    try:
        for one in device:
            out.append(_resolve_device(one, {}))
    except BaseException:
        for made, owned in out:
            if owned:
                made.close()
        raise
    return out


def _resolve_device(device: Any, options: dict) -> tuple[Device, bool]:
    if isinstance(device, Device):
        if options:
            raise InvalidArgumentError(
                f"device options {sorted(options)} given with an existing device"
            )
        return device, False
    if not isinstance(device, str):
        raise InvalidArgumentError(
            f"device must be a driver name ('sync', 'task', ...) or a Device, not {device!r}"
        )
    for name in options:  # a misspelt keyword of load() would read as a driver option
        import difflib

        near = difflib.get_close_matches(name, ("device", "modules"), n=1, cutoff=0.7)
        if near:
            raise InvalidArgumentError(
                f"unknown keyword argument {name!r} (did you mean {near[0]!r}?); other "
                f"keywords are options of the {device!r} driver")
    return create_device(device, **options), True


class _Bound(functools.partial):
    """`module.invoke` with the export's name bound: a `functools.partial`, so calling
    it enters `Module.invoke` directly (no Python frame of its own)."""

    def __new__(cls, module: Module, name: str) -> _Bound:
        self = super().__new__(cls, module.invoke, name)
        self.__doc__ = module.functions[name].declaration or name
        return self

    def __repr__(self) -> str:
        return f"<function {self.args[0]} of {self.func.__self__!r}>"


class Module:
    """A loaded `.vmfb` on a device; call its exports with numpy arrays and scalars."""

    def __init__(self, source: Any, device: Any = "task", *,
                 modules: Sequence[Any] = (), parameters: Any = None, mapped: bool = False,
                 trace_execution: IO[str] | None = None, **options: Any) -> None:
        if isinstance(source, (bytes, bytearray, memoryview)):
            data: Any = _aligned_copy(source)
            self.path = None
        elif isinstance(source, (str, os.PathLike)):
            data = os.fspath(source)
            self.path = data
        else:
            raise InvalidArgumentError(
                f"tinyhal.load takes a path or the module's bytes, not {type(source).__name__}"
            )
        resolved = _resolve_devices(device, options)
        self.devices: list[Device] = [d for d, _ in resolved]
        self._owned_devices = [d for d, owned in resolved if owned]
        self.device = self.devices[0]
        try:
            self.bytecode = load_module(data, mapped=mapped)
            self.hal_module = create_hal_module(self.devices)
            user_modules = [_user_module(m, self.device) for m in modules]
            self.parameters_module = _parameters_module(parameters, self.bytecode,
                                                        user_modules)
            linked = [self.hal_module, *_inline_modules(self.bytecode, self.device),
                      *self.parameters_module, *user_modules, self.bytecode]
            self.context = Context(linked, trace_execution=trace_execution)
            self._instance = next(i for i in self.context.instances
                                  if i.module is self.bytecode)
        except BaseException as exc:
            self.close()
            origin = self.path or "<bytes>"
            if isinstance(exc, (IncompatibleError, UnavailableError)):
                _explain_policy(exc, self.devices)
            if isinstance(exc, Error) and not exc.message.startswith(origin):
                raise exc.with_context(origin) from exc
            raise
        self.name = self.bytecode.name
        # Inputs go to device memory, or host memory for an inline program (which maps
        # every buffer it is given).
        self._input_memory = _INPUT_MEMORY if not any(
            m.name == "hal_inline" for m in self.context.modules) else _INLINE_INPUT_MEMORY
        # Whether input buffers are host memory the host may write (else: a transfer).
        input_heap = self.device.allocator.select_heap(self._input_memory)
        self._inputs_mappable = bool(input_heap.memory_type & _HOST_VISIBLE
                                     and _INPUT_USAGE & _MAPPING)
        self.functions: dict[str, FunctionInfo] = {}
        self._vm_functions: dict[str, Any] = {}
        # name -> (info, VM function, one input plan per argument, one stack of idle
        # input views per argument (see `_park_inputs`)), built on first call
        self._resolved: dict[str, tuple[FunctionInfo, Any, tuple, tuple]] = {}
        self._idle_inputs: list[list[BufferView]] = []  # every stack, for `close`
        self._release_idle = weakref.finalize(self, _release_idle_inputs, self._idle_inputs)
        for export_name in self.bytecode.exports:
            if export_name.startswith("__"):
                continue
            self.functions[export_name] = self._function_info(export_name)

    def _function_info(self, name: str) -> FunctionInfo:
        export = self.bytecode.exports[name]
        reflection = export.reflection or {}
        decl = reflection.get("iree.abi.declaration")
        model = reflection.get("iree.abi.model", "")
        if decl:
            try:
                _, inputs, outputs, is_async = parse_declaration(decl)
            except Error:
                return _info_from_cconv(name, export.cconv)
            is_async = is_async or model == "coarse-fences"
            return FunctionInfo(name, tuple(inputs), tuple(outputs), is_async, decl)
        info = _info_from_cconv(name, export.cconv)
        sync_export = self.bytecode.exports.get(name[: -len("$async")]) \
            if name.endswith("$async") else None
        if model == "coarse-fences" or (
            sync_export is not None
            and export.cconv.args == sync_export.cconv.args + ("r", "r")
        ):
            return FunctionInfo(name, info.inputs[:-2], info.outputs, True, "")
        return info

    def __repr__(self) -> str:
        return f"<tinyhal.Module {self.name} on {self.device!r}>"

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {n for n in self.functions if n.isidentifier()})

    def __getattr__(self, name: str) -> Any:
        functions = self.__dict__.get("functions")
        if functions is not None and name in functions:
            return _Bound(self, name)
        raise AttributeError(
            f"{type(self).__name__} {self.__dict__.get('name', '?')!r} has no function "
            f"{name!r}" + (f"; functions: {sorted(functions)}" if functions else "")
        )

    @property
    def input_memory_type(self) -> int:
        """The memory type of the buffers inputs are placed in: device memory, or host
        memory for an inline program (which maps every buffer it is given)."""
        return self._input_memory

    @property
    def function_names(self) -> list[str]:
        return list(self.functions)

    # -- invocation -------------------------------------------------------------------

    def lookup(self, name: str) -> tuple[FunctionInfo, Any]:
        """The export `name`'s signature and VM function (NOT_FOUND names the exports)."""
        return self._lookup(name)

    def _lookup(self, name: str) -> tuple[FunctionInfo, Any]:
        info = self.functions.get(name)
        if info is None:
            raise NotFoundError(
                f"module {self.name!r} has no function {name!r}; functions: "
                f"{', '.join(self.functions) or '(none)'}"
            )
        vmf = self._vm_functions.get(name)
        if vmf is None:
            # Export names are opaque (`i16i16.i32` is one name): find it in this module's
            # instance rather than splitting a qualified name at a dot.
            vmf = self._instance.function(name)
            if vmf is None:
                raise NotFoundError(f"module {self.name!r} has no function {name!r}")
            self._vm_functions[name] = vmf
        return info, vmf

    def _resolve(self, name: str) -> tuple[FunctionInfo, Any, tuple, tuple]:
        """`_lookup` plus the export's input plans (see `_input_plan`) and idle-input
        stacks, cached."""
        resolved = self._resolved.get(name)
        if resolved is None:
            info, vmf = self._lookup(name)
            stacks = tuple([] for _ in info.inputs)
            self._idle_inputs.extend(stacks)
            resolved = self._resolved[name] = (
                info, vmf, tuple(_input_plan(spec) for spec in info.inputs), stacks)
        return resolved

    def invoke(self, name: str, *args: Any) -> Any:
        """Calls export `name` and waits for its results (numpy arrays / scalars)."""
        info, vmf, plans, stacks = self._resolved.get(name) or self._resolve(name)
        made: list = []
        vm_args = self._convert_inputs(info, args, plans, stacks, made)
        signal = None
        if info.is_async:
            signal = self._append_fences(vm_args)
        results = self.context.invoke(vmf, vm_args)
        if signal is not None:
            signal.wait()
        outputs = self._convert_outputs(info, results)
        if made:
            vm_args = results = None
            self._park_inputs(made, stacks)
        return outputs

    def invoke_raw(self, name: str, *args: Any, wait: Fence | None = None) -> list:
        """Like `invoke` but returns the VM's results as they are (buffer views, ints):
        device-resident values a later call can take as arguments without a host copy.
        `wait` (a `Fence`) is what the call's device work must wait for: the wait fence
        of a coarse-fences function (the device orders the work, the host does not
        wait), else waited for on the host before the call. Arguments take the general
        path (no input plans): its callers pass buffer views and numbers, and then
        nothing here imports numpy."""
        info, vmf = self._lookup(name)
        vm_args = self._convert_inputs(info, args)
        if info.is_async:
            signal = self._append_fences(vm_args, wait)
        else:
            signal = None
            if wait is not None:
                wait.wait()
        results = self.context.invoke(vmf, vm_args)
        if signal is not None:
            signal.wait()
        return results

    async def invoke_async(self, name: str, *args: Any) -> Any:
        """Calls export `name` on trio (prefers its `name$async` variant if present)."""
        async_name = f"{name}$async"
        if async_name in self.functions and not self.functions[name].is_async:
            name = async_name
        info, vmf, plans, stacks = self._resolved.get(name) or self._resolve(name)
        made: list = []
        vm_args = self._convert_inputs(info, args, plans, stacks, made)
        signal = None
        if info.is_async:
            signal = self._append_fences(vm_args)
        results = await self.context.invoke_async(vmf, vm_args)
        if signal is not None:
            await signal.wait_async()
        outputs = self._convert_outputs(info, results)
        if made:
            vm_args = results = None
            self._park_inputs(made, stacks)
        return outputs

    def _park_inputs(self, made: list, stacks: tuple) -> None:
        """Keeps the input views this invocation made for the next call of the export,
        each only if nothing but `made` refers to it, its buffer, its storage or its
        memory any more (no global, result, subspan, mapping or in-flight work), so a
        later call can never write bytes anyone still reads, and only small ones (at most
        `_IDLE_INPUT_BYTES`). An idle view's memory is real memory: it stays live in the
        allocator's statistics."""
        while made:
            index, view = made.pop()
            buffer = view.buffer
            storage = buffer.storage
            # References: `view` here and the getrefcount argument (+ view.buffer for
            # the buffer, + buffer.storage for the storage, + the storage and `array`
            # for its memoryview); no other view of the memory.
            array = storage.array
            if (getrefcount(view) == 2 and getrefcount(buffer) == 3
                    and getrefcount(storage) == 3 and getrefcount(array) == 3
                    and views_of_block(array) == 1
                    and buffer.byte_length <= _IDLE_INPUT_BYTES
                    and len(stacks[index]) < _IDLE_INPUTS_PER_ARGUMENT):
                stacks[index].append(view)

    def _append_fences(self, vm_args: list, wait: Fence | None = None) -> Fence:
        if wait is None:
            wait = Fence()
        signal = Fence.single(self.device.create_semaphore(0), 1)
        vm_args.append(wait)
        vm_args.append(signal)
        return signal

    # -- conversion -------------------------------------------------------------------

    def _convert_inputs(self, info: FunctionInfo, args: tuple, plans: tuple = (),
                        stacks: tuple = (), made: list | None = None) -> list:
        """The VM arguments for `args`. With `stacks` (one per argument) and `made`, an
        array input reuses an idle view of its argument when one matches (see
        `_park_inputs`) and every view made or reused is listed in `made`."""
        specs = info.inputs
        if len(args) != len(specs):
            raise InvalidArgumentError(
                f"{info.name} takes {len(specs)} argument{'s' if len(specs) != 1 else ''} "
                f"({', '.join(s.name + ': ' + s.describe() for s in specs)}), "
                f"{len(args)} given"
            )
        device = self.device
        input_memory = self._input_memory
        mappable = self._inputs_mappable
        if plans:  # made by `_resolve` for `invoke`, whose arguments are arrays
            import numpy as np
        out = []
        for i, (spec, value) in enumerate(zip(specs, args)):
            plan = plans[i] if plans else None
            if plan is not None and type(value) is np.ndarray and value.flags.c_contiguous:
                # The common case, checked against the plan: a non-empty array of the
                # declared dtype whose dims match the declaration (or, with no
                # declaration, of a dtype with whole-byte elements) is copied straight
                # into an idle view's buffer or a new one (by one `memmove` into host
                # memory, or a device write into memory only the device sees, such as
                # emu's, which that driver models as the transfer it stands for). Views
                # of a dynamic shape are kept too: a call of the same shape (a recurrent
                # step's batch) reuses one, whose shape was checked when it was made; a
                # call of another shape frees it.
                parks = bool(stacks)
                if plan is _UNDECLARED:
                    element_type = _WHOLE_BYTE_TYPES.get(value.dtype)
                    if element_type is None:
                        element_type = _whole_byte_element_type(value.dtype)
                elif value.dtype == plan[0] and value.shape == plan[1]:
                    element_type = plan[2]
                elif value.dtype == plan[0] and plan[3] and value.size and (
                        # (a slice: another thread may pop the stack meanwhile)
                        (parks and (top := stacks[i][-1:]) and top[0].shape == value.shape)
                        or _dims_match(value.shape, plan[1])):
                    element_type = plan[2]
                else:
                    element_type = 0
                if element_type:
                    # Whole-byte elements: the array's own bytes are the buffer's.
                    view = None
                    if parks:  # an idle view of this argument, when one matches
                        stack = stacks[i]
                        view = stack.pop() if stack else None
                        if view is not None and (view.shape != value.shape
                                                 or view.element_type != element_type):
                            view = None  # another shape: freed as usual
                    if view is None:
                        if mappable:  # host memory: copied in as it is made
                            buffer = device.allocator.allocate(value.nbytes, input_memory,
                                                               _INPUT_USAGE, initial=value)
                        else:
                            buffer = device.allocator.allocate(value.nbytes, input_memory,
                                                               _INPUT_USAGE)
                            device.write_bytes(buffer, value.reshape(-1).view(np.uint8))
                        view = BufferView(buffer, value.shape, element_type)
                    elif mappable:
                        _memmove(view.buffer.storage.array, value, value.nbytes)
                    else:  # memory only the device sees: a transfer, as a new buffer's
                        device.write_bytes(view.buffer, value.reshape(-1).view(np.uint8))
                    out.append(view)
                    if parks:
                        made.append((i, view))
                    continue
            kind = spec.kind
            if kind == "tensor":
                out.append(_tensor_input(device, info.name, spec, value, input_memory))
            elif kind == "scalar":
                out.append(_scalar_input(info.name, spec, value))
            elif value is None or isinstance(value, (BufferView, Buffer)) or hasattr(
                    value, "type_name"):
                out.append(value)
            elif isinstance(value, (list, tuple)) and (
                    is_list_type(spec.type) or spec.type == "!vm.ref<?>"):
                out.append(list_input(value, spec.type, functools.partial(
                    _tensor_input, device, info.name, _UNTYPED, memory=input_memory),
                    f"{info.name} argument {spec.name}"))
            else:  # no declaration: arrays and numbers go in as tensors of their dtype
                out.append(_tensor_input(device, info.name, spec, value, input_memory))
        return out

    def _convert_outputs(self, info: FunctionInfo, results: list) -> Any:
        specs = info.outputs
        out = []
        for i, value in enumerate(results):
            spec = specs[i] if i < len(specs) else None
            if isinstance(value, BufferView):
                buffer = value.buffer
                if (buffer.memory_type_bits & _HOST_VISIBLE and buffer.usage_bits & _MAPPING
                        and not buffer.storage.released):  # `buffer.mappable`, inline
                    # A copy of the view's elements (in range: checked when it was made).
                    out.append(copy_elements(buffer.storage.array, buffer.byte_offset,
                                             value.shape, value.element_type))
                else:
                    out.append(_read_to_numpy(value))
            elif spec is not None and spec.kind == "scalar":
                out.append(_scalar_output(spec, value))
            elif isinstance(value, VMList):
                out.append(list_output(value, _read_to_numpy))
            else:
                out.append(value)
        if not out:
            return None
        return out[0] if len(out) == 1 else tuple(out)

    # -- lifetime ---------------------------------------------------------------------

    def statistics(self) -> Any:
        """The (first) device allocator's statistics (live and peak bytes per heap)."""
        return self.device.allocator.statistics()

    def device_statistics(self) -> list[Any]:
        """Each device's allocator statistics, in the order of `devices` (the program's
        device order): a program on several devices has a peak per device."""
        return [device.allocator.statistics() for device in self.devices]

    @contextlib.contextmanager
    def profiling(self, modes: str | Sequence[str] | None = None, capacity: int = 1_000_000
                  ) -> Iterator[list[Any]]:
        """Profiles every device of the program for the `with` block, as iree-run-module
        does for its device list; yields one `Profile` per device (its
        `physical_device_ordinal` is the device's position). Write them to one file with
        `tinyhal.hal.profile.write_profiles(profiles, path)`."""
        with contextlib.ExitStack() as stack:
            profiles = [stack.enter_context(device.profiling(modes, capacity))
                        for device in self.devices]
            for ordinal, profile in enumerate(profiles):
                profile.physical_device_ordinal = ordinal
            yield profiles

    def parameter_statistics(self) -> ParameterStatistics | None:
        """The parameter memory the program holds (see `ParameterStatistics`), or None
        when it uses no external parameters."""
        for module in self.__dict__.get("parameters_module", ()):
            return module.state.statistics()
        return None

    def trim(self) -> None:
        """Frees the input buffers kept for the next calls (see `_park_inputs`): memory
        a long-lived module holds between calls, which `statistics()` counts as live."""
        _release_idle_inputs(self._idle_inputs)

    def close(self) -> None:
        release_idle = self.__dict__.get("_release_idle")
        if release_idle is not None:
            release_idle()
        context = self.__dict__.pop("context", None)
        if context is not None:
            try:
                context.close()
            except Error:
                pass
        program = getattr(self.__dict__.get("bytecode"), "program", None)
        if program is not None:  # its generated source is only kept for tracebacks
            linecache.cache.pop(program.filename, None)
        owned = self.__dict__.get("_owned_devices", [])
        while owned:
            owned.pop().close()

    def __enter__(self) -> Module:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_IDLE_INPUTS_PER_ARGUMENT = 4  # idle views kept per argument (calls running at once)
# Larger inputs are freed after their call: copying them in costs far more than a new
# buffer, and a kept one would hold a large request's memory after it ended.
_IDLE_INPUT_BYTES = 256 << 10


def _release_idle_inputs(stacks: list[list[BufferView]]) -> None:
    """Drops every idle input view (their storage's release counts them freed)."""
    for stack in stacks:
        stack.clear()


def _tensor_input(device: Device, fn: str, spec: ArgSpec, value: Any,
                  memory: int = _INPUT_MEMORY) -> BufferView:
    if type(value) is BufferView:
        return value
    if isinstance(value, Buffer):
        raise InvalidArgumentError(
            f"argument {spec.name} of {fn} is a {spec.describe()}: pass an array or a "
            f"BufferView, not a bare hal.buffer (it has no shape or element type)")
    import numpy as np

    info = element_info_for_mlir(spec.type)
    dtype = info.dtype if info is not None else None
    if type(value) is not np.ndarray:
        if isinstance(value, BufferView):
            return value
        try:
            value = np.asarray(value, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"argument {spec.name} of {fn} must be a {spec.describe()} array: {exc}"
            ) from None
    elif dtype is not None and value.dtype != dtype and not _same_integer_width(
        value.dtype, info
    ):
        raise InvalidArgumentError(
            f"argument {spec.name} of {fn} has dtype {value.dtype} but {spec.describe()} "
            f"needs {dtype}"
        )
    shape = spec.shape
    if shape is not None:
        have = value.shape
        if len(have) != len(shape) or any(
            want is not None and want != got for want, got in zip(shape, have)
        ):
            raise InvalidArgumentError(
                f"argument {spec.name} of {fn} has shape "
                f"{'x'.join(map(str, have)) or '(scalar)'} but {spec.describe()} needs "
                f"{'x'.join('?' if d is None else str(d) for d in shape) or '(scalar)'}"
            )
    element_type = info.element_type if info is not None else element_type_for(value.dtype)
    data = pack_elements(value, element_type) if value.size else None
    buffer = device.allocator.allocate(0 if data is None else data.nbytes, memory,
                                       _INPUT_USAGE)
    if data is not None:
        device.write_bytes(buffer, data)
    return BufferView(buffer, value.shape, element_type)


def _same_integer_width(have: np.dtype, info: Any) -> bool:
    """Signless MLIR integers (`i8`, `i4`, ...) take either signedness of the same width."""
    if info.numerical_type != 0x10:
        return False
    try:
        have_info = element_type_for(have)
    except Error:
        return False
    return (have_info & 0xFF) == info.bit_count and (have_info >> 24) in (0x11, 0x12)


def _scalar_input(fn: str, spec: ArgSpec, value: Any) -> Any:
    t = spec.type
    np = sys.modules.get("numpy")  # an array can only come from a program that loaded it
    if np is not None and isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise InvalidArgumentError(
                f"argument {spec.name} of {fn} is a {t} scalar, not an array of shape "
                f"{'x'.join(map(str, value.shape))}"
            )
        value = value[()]
    if np is not None and isinstance(value, np.float32) and t == "f32":
        return f32_from_bits(int(value.view(np.uint32)))
    if np is not None and isinstance(value, np.generic):
        value = value.item()
    if t.startswith("f"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgumentError(
                f"argument {spec.name} of {fn} must be a {t} number, not "
                f"{type(value).__name__}"
            )
        return float(value)
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, int):
        raise InvalidArgumentError(
            f"argument {spec.name} of {fn} must be an {t} integer, not {type(value).__name__}"
        )
    bits = _INT_BITS.get(t, 64)
    lo = 0 if t.startswith("ui") else -(1 << (bits - 1)) if bits > 1 else 0
    hi = (1 << (bits - 1)) - 1 if t.startswith("si") else (1 << bits) - 1
    if not lo <= value <= hi:
        raise InvalidArgumentError(
            f"argument {spec.name} of {fn} ({value}) does not fit in {t}"
        )
    return value


def _scalar_output(spec: ArgSpec, value: Any) -> Any:
    t = spec.type
    # i1 comes back as the VM's i32 (0 or 1), as iree.runtime returns it.
    if t.startswith("ui") and value < 0:
        return value + (1 << _INT_BITS[t])
    return value


_UNDECLARED = ()
"""The input plan of an argument with no declaration: any array of whole-byte elements
goes in as a tensor of its own dtype and shape."""
_WHOLE_BYTE_TYPES: dict[np.dtype, int] = {}  # dtype -> HAL element type (0: not whole-byte)


def _whole_byte_element_type(dtype: np.dtype) -> int:
    """The HAL element type of `dtype` if its elements are whole bytes, else 0 (cached;
    0 sends the array down the general path, which reports unsupported dtypes)."""
    try:
        element_type = int(element_type_for(dtype))
    except Error:
        return 0
    bits = element_type & 0xFF
    if bits < 8 or bits % 8:
        element_type = 0
    _WHOLE_BYTE_TYPES[dtype] = element_type
    return element_type


def _input_plan(spec: ArgSpec) -> tuple[np.dtype, tuple, int, bool] | tuple[()] | None:
    """(dtype, declared shape (None for a dynamic dim), HAL element type, whether any dim
    is dynamic) for a tensor argument of declared rank whose elements are whole bytes: a
    non-empty array of that dtype whose dims match needs no other check or conversion.
    `_UNDECLARED` for a ref argument with no declaration. None for everything else (those
    take `_tensor_input`'s general path)."""
    if spec.kind == "ref" and spec.shape is None:
        return _UNDECLARED
    if spec.kind != "tensor" or spec.shape is None:
        return None
    info = element_info_for_mlir(spec.type)
    if info is None or info.bit_count < 8 or info.bit_count % 8:
        return None
    shape = tuple(spec.shape)
    return info.dtype, shape, info.element_type, None in shape


def _dims_match(have: tuple[int, ...], declared: tuple) -> bool:
    """Whether an array's shape has the declared rank and every static dim."""
    return len(have) == len(declared) and all(
        want is None or want == got for want, got in zip(declared, have))


_UNTYPED = ArgSpec("element", "ref", "!vm.ref<?>")
"""A list element: an array goes in as a tensor of its own dtype and shape."""


def _read_to_numpy(view: BufferView) -> np.ndarray:
    """A copy of the contents of a view the host cannot map (or whose storage was
    released: the read reports it), by a transfer; `_convert_outputs` copies host
    memory itself. Sub-byte elements come back one per byte, in ml_dtypes'
    int4/uint4/int2/uint2."""
    buffer = view.buffer
    element_type = view.element_type
    count = 1
    for dim in view.shape:
        count *= dim
    data = buffer.allocator.device_ref().read_array(
        buffer, 0, (count * (element_type & 0xFF) + 7) // 8)  # `view.byte_length`
    return unpack_elements(data, view.shape, element_type)


def _user_module(module: Any, device: Device) -> NativeModule | BytecodeModule:
    """A module a host app passes to `load(..., modules=[...])`: a `NativeModule` (or a
    loaded `BytecodeModule`) as it is, or a factory called with the device."""
    if isinstance(module, (NativeModule, BytecodeModule)):
        return module
    if callable(module):
        made = module(device)
        if isinstance(made, (NativeModule, BytecodeModule)):
            return made
        raise InvalidArgumentError(
            f"module factory {module!r} returned {type(made).__name__}, not a NativeModule"
        )
    raise InvalidArgumentError(
        f"modules= takes NativeModule objects or factories device -> NativeModule, "
        f"not {type(module).__name__}"
    )


def _inline_modules(bytecode: BytecodeModule, device: Device) -> list[NativeModule]:
    """`hal_inline` and `hal_loader` for a program compiled for TinyIREE's inline
    execution (`--iree-execution-model=inline-dynamic`), which imports them instead of
    `hal`."""
    wanted = {d.name for d in bytecode.dependencies} & {"hal_inline", "hal_loader"}
    if not wanted:
        return []
    from .hal_inline import InlineState, create_hal_inline_module, create_hal_loader_module

    state = InlineState(device)
    makers = {"hal_inline": create_hal_inline_module, "hal_loader": create_hal_loader_module}
    return [makers[name](device, state) for name in sorted(wanted)]


def _parameters_module(parameters: Any, bytecode: BytecodeModule,
                       user_modules: list) -> list[NativeModule]:
    """The `io_parameters` module serving `parameters`, when given or when the program
    depends on it (then a missing scope is named when the program asks for it), unless
    the host app links its own."""
    if any(m.name == "io_parameters" for m in user_modules):
        if parameters is not None:
            raise InvalidArgumentError(
                "parameters= given together with an io_parameters module in modules=")
        return []
    if parameters is None and not any(d.name == "io_parameters"
                                       for d in bytecode.dependencies):
        return []
    from .io_parameters import create_io_parameters_module  # and its formats' json

    return [create_io_parameters_module(parameters)]


def _explain_policy(exc: Error, devices: list[Device]) -> None:
    """Says why a device was unavailable (or, inline, no executable loadable) when an
    executable policy refused the formats the program's executables come in: the
    program itself only finds nothing it can use."""
    refusing = sorted({d.executable_policy for d in devices} - {"any"})
    if refusing:
        from ..hal.executable import FORMATS

        exc.message += (f" (the device's executable policy {refusing[0]!r} refuses "
                        f"executables with native machine code: {', '.join(FORMATS)}; "
                        "compile with --iree-hal-local-target-device-backends=vmvx)")
        exc.args = (exc.message,)


def load(path_or_bytes: Any, device: Any = "task", *, modules: Sequence[Any] = (),
         parameters: Any = None, mapped: bool = False, trace_execution: IO[str] | None = None,
         **options: Any) -> Module:
    """Loads a `.vmfb` (path or bytes) onto a device (a driver name or a `Device`), or
    onto several (a list of them, in the order the program's devices take them: a
    program compiled with `--iree-hal-target-device=a=local[0]
    --iree-hal-target-device=b=local[1]` runs `a` on the first and `b` on the second;
    drivers may be mixed, such as a `task` CPU beside an `emu` accelerator). Inputs are
    placed on the first device (`Module.device`); `Module.devices` lists them all.

    The module owns its bytes: a path is read into private memory (regular files only),
    so later writes, truncation or deletion of the file change nothing it runs.
    `mapped=True` maps the file instead (zero-copy, copy-on-write): faster to load a large
    file, but the file must not change while the module lives — a truncation makes the
    program fault on the lost pages.

    `modules` are extra modules the program imports from, linked between `hal` and the
    program as IREE's tools link them: `NativeModule` objects (functions written in
    Python, see `tinyhal.vm.native`) or factories called with the device. Every import is
    checked against its provider's calling convention when the module loads; a mismatch
    raises `tinyhal.Error` (INCOMPATIBLE) naming the function.

    `parameters` feeds a program compiled with external parameters (its
    `#stream.parameter.named` globals, IREE's `io_parameters` module): a parameter file
    (`.irpa`, `.safetensors`, `.gguf`) or `ParameterIndex` for the anonymous scope, or a
    mapping `{scope: path | ParameterIndex | {key: array} | [several]}`; see
    `tinyhal.vm.io_parameters.parameter_scopes`. `Module.parameter_statistics()` tells
    the parameter memory the program holds.

    Driver options pass through to the device made here, among them
    `executable_policy="portable"`: the device then loads only executables without
    machine code (VMVX, `--iree-hal-local-target-device-backends=vmvx`), so a model whose
    source is not fully trusted runs without running its machine code; a program with
    only native executables fails with the policy named.

    `trace_execution`, a text stream (`sys.stderr`), prints each VM instruction the
    program runs to it as IREE's `--trace_execution` does (see `tinyhal.vm.trace`); the
    module then runs a slower, plain translation of its bytecode.
    """
    return Module(path_or_bytes, device, modules=modules, parameters=parameters,
                  mapped=mapped, trace_execution=trace_execution, **options)
