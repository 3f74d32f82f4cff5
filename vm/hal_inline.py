"""TinyIREE's inline execution: the native `hal_inline` and `hal_loader` modules.

Programs compiled with `--iree-execution-model=inline-dynamic` import no `hal` module:
they allocate host buffers and read and write them directly through `!vm.buffer`
views (`hal_inline`), and load executables and dispatch them synchronously, one
workgroup grid at a time, on the calling thread (`hal_loader`), as IREE's
`runtime/src/iree/modules/hal/inline/` and `.../hal/loader/` do:

- `hal_inline.buffer.allocate[.initialized]` returns a host-visible buffer of the
  device's allocator and a `!vm.buffer` over its bytes (`buffer.storage` the same for
  any host-visible buffer; memory the host cannot map is FAILED_PRECONDITION);
  `buffer.wrap` is UNIMPLEMENTED as in IREE; the buffer-view exports are the `hal`
  module's; `device.query.i64` answers only `hal.cpu` keys, else `(0, 0)`;
- `hal_loader.executable.dispatch` binds `!vm.buffer` ranges: the storage of an inline
  buffer binds that buffer itself; other bytes (rodata) are bound in place when
  64-byte aligned, else through an aligned copy (written back if the bytes are
  mutable). The dispatch is submitted to the device and waited for before returning,
  so it runs on every driver (on `emu` it is modelled like any dispatch).

Both modules are a declared table plus an explicit state (the device), as in IREE.
"""

from __future__ import annotations

import weakref

import numpy as np

from ..errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnimplementedError,
)
from ..hal.buffer import Buffer
from ..hal.buffer_view import BufferView
from ..hal.device import Device
from ..hal.executable import Executable, executable_formats
from ..hal.types import BufferUsage, MemoryType
from .hal_module import create_hal_module
from .native import NativeModule, RefType, ref_type_error
from .native_table import Export, build_module
from .types import VMBuffer

__all__ = ["HAL_INLINE_EXPORTS", "HAL_LOADER_EXPORTS", "InlineState",
           "create_hal_inline_module", "create_hal_loader_module"]

HAL_LOADER_MODULE_VERSION = 1  # IREE's hal_loader 0.1, which inline programs require
_INLINE_MEMORY = MemoryType.HOST_LOCAL | MemoryType.DEVICE_VISIBLE
_INLINE_USAGE = BufferUsage.TRANSFER | BufferUsage.DISPATCH_STORAGE | BufferUsage.MAPPING
_MAX_BINDINGS = 32


class InlineState:
    """The device both modules use, the `hal` module whose buffer-view exports
    `hal_inline` shares, and which HAL buffer each storage `!vm.buffer` views."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.views = create_hal_module(device)
        self.storage: weakref.WeakKeyDictionary[VMBuffer, Buffer] = (
            weakref.WeakKeyDictionary())

    def view_export(self, name: str):
        return self.views.lookup(f"hal.{name}").fn

    def storage_of(self, buffer: Buffer) -> VMBuffer:
        """A mutable `!vm.buffer` over `buffer`'s bytes, remembered as its storage."""
        view = VMBuffer(memoryview(buffer.host_bytes()), True)
        self.storage[view] = buffer
        return view


def _text(ref: VMBuffer) -> str:
    return bytes(ref.data).decode("utf-8", errors="replace")


# -- hal_inline --------------------------------------------------------------------------


def _allocate(state: InlineState, size: int, initial: memoryview | None) -> tuple:
    if size < 0:
        raise InvalidArgumentError(f"allocation size {size} is negative")
    buffer = state.device.allocator.allocate(size, _INLINE_MEMORY, _INLINE_USAGE)
    if not buffer.mappable:
        raise FailedPreconditionError(
            f"{state.device!r} has no host-visible memory for inline buffers")
    storage = state.storage_of(buffer)
    if initial is not None:
        storage.data[: len(initial)] = initial
    return buffer, storage


def buffer_allocate(state: InlineState, minimum_alignment: int, size: int) -> tuple:
    return _allocate(state, size, None)


def buffer_allocate_initialized(state: InlineState, minimum_alignment: int,
                                source: VMBuffer, offset: int, length: int) -> tuple:
    data = source.data
    if offset < 0 or length < 0 or offset + length > len(data):
        raise InvalidArgumentError(
            f"source range [{offset}, {offset + length}) out of bounds of the "
            f"{len(data)}-byte buffer")
    return _allocate(state, length, data[offset : offset + length])


def buffer_length(state: InlineState, buffer: Buffer) -> int:
    return buffer.byte_length


def buffer_storage(state: InlineState, buffer: Buffer) -> VMBuffer:
    if not buffer.mappable:
        raise FailedPreconditionError(
            f"{buffer!r} is not host-visible memory; inline programs map every buffer")
    return state.storage_of(buffer)


def buffer_subspan(state: InlineState, buffer: Buffer, offset: int, length: int) -> Buffer:
    return state.view_export("buffer.subspan")(buffer, offset, length)


def buffer_wrap(state: InlineState, source: VMBuffer, offset: int, length: int) -> Buffer:
    raise UnimplementedError("vm->hal buffer wrapping not yet implemented")


def buffer_view_assert(state: InlineState, view, message, element_type, encoding_type,
                       shape) -> None:
    state.view_export("buffer_view.assert")(view, message, element_type, encoding_type,
                                            shape)


def buffer_view_buffer(state: InlineState, view: BufferView) -> Buffer:
    return view.buffer


def buffer_view_create(state: InlineState, buffer, offset, length, element_type,
                       encoding_type, shape) -> BufferView:
    return state.view_export("buffer_view.create")(buffer, offset, length, element_type,
                                                   encoding_type, shape)


def buffer_view_dim(state: InlineState, view: BufferView, index: int) -> int:
    return state.view_export("buffer_view.dim")(view, index)


def buffer_view_element_type(state: InlineState, view: BufferView) -> int:
    return view.element_type


def buffer_view_encoding_type(state: InlineState, view: BufferView) -> int:
    return view.encoding_type


def buffer_view_rank(state: InlineState, view: BufferView) -> int:
    return len(view.shape)


def buffer_view_trace(state: InlineState, key, views) -> None:
    state.view_export("buffer_view.trace")(key, views)


def device_query_i64(state: InlineState, category: VMBuffer, key: VMBuffer) -> tuple:
    if _text(category) != "hal.cpu":
        return 0, 0
    try:
        return 1, int(state.device.query("hal.cpu", _text(key)))
    except NotFoundError:
        return 0, 0


HAL_INLINE_EXPORTS: tuple[Export, ...] = (
    Export("buffer.allocate", "0iI_rr", (None, None), buffer_allocate),
    Export("buffer.allocate.initialized", "0irII_rr", (None, "vm.buffer", None, None),
           buffer_allocate_initialized),
    Export("buffer.length", "0r_I", ("hal.buffer",), buffer_length),
    Export("buffer.storage", "0r_r", ("hal.buffer",), buffer_storage),
    Export("buffer.subspan", "0rII_r", ("hal.buffer", None, None), buffer_subspan),
    Export("buffer.wrap", "0rII_r", ("vm.buffer", None, None), buffer_wrap),
    Export("buffer_view.assert", "0rriiCID_v",
           ("hal.buffer_view", None, None, None, None), buffer_view_assert),
    Export("buffer_view.buffer", "0r_r", ("hal.buffer_view",), buffer_view_buffer),
    Export("buffer_view.create", "0rIIiiCID_r",
           ("hal.buffer", None, None, None, None, None), buffer_view_create),
    Export("buffer_view.dim", "0ri_I", ("hal.buffer_view", None), buffer_view_dim),
    Export("buffer_view.element_type", "0r_i", ("hal.buffer_view",),
           buffer_view_element_type),
    Export("buffer_view.encoding_type", "0r_i", ("hal.buffer_view",),
           buffer_view_encoding_type),
    Export("buffer_view.rank", "0r_i", ("hal.buffer_view",), buffer_view_rank),
    Export("buffer_view.trace", "0rCrD_v", (None, None), buffer_view_trace),
    Export("device.query.i64", "0rr_iI", ("vm.buffer", "vm.buffer"), device_query_i64),
)


# -- hal_loader --------------------------------------------------------------------------


def executable_query_support(state: InlineState, executable_format: VMBuffer) -> int:
    return state.device.query("hal.executable.format", _text(executable_format))


def executable_load(state: InlineState, executable_format: VMBuffer, data: VMBuffer,
                    constants: VMBuffer | None) -> Executable:
    fmt = _text(executable_format)
    if fmt not in executable_formats():
        raise NotFoundError(
            f"no executable loader registered for the given executable format '{fmt}'")
    if constants is not None and len(constants.data):
        if len(constants.data) % 4:
            raise InvalidArgumentError(
                "constant buffer data must contain 4-byte elements but data length is "
                f"{len(constants.data)}")
        raise UnimplementedError("executable-level constants are not supported yet")
    return state.device.load_executable(data.data)


def executable_lookup_function(state: InlineState, executable: Executable,
                               name: VMBuffer) -> int:
    return executable.lookup(_text(name))


def _binding(state: InlineState, ref: VMBuffer | None, offset: int, length: int,
             write_back: list) -> tuple:
    if not isinstance(ref, VMBuffer):
        raise ref_type_error(ref, _VM_BUFFER)
    size = len(ref.data)
    if offset < 0 or length < 0 or offset + length > size:
        raise InvalidArgumentError(
            f"binding range [{offset}, {offset + length}) out of bounds of the {size}-byte "
            "buffer")
    hal_buffer = state.storage.get(ref)
    if hal_buffer is not None:
        return hal_buffer, offset, length
    window = np.frombuffer(ref.data, np.uint8)[offset : offset + length]
    allocator = state.device.allocator
    imported = allocator.import_host(window, _INLINE_MEMORY, _INLINE_USAGE)
    if imported is not None:
        return imported, 0, length
    copy = allocator.allocate(length, _INLINE_MEMORY, _INLINE_USAGE, initial=window)
    if ref.mutable:
        write_back.append((copy, window))
    return copy, 0, length


def executable_dispatch(state: InlineState, executable: Executable, function: int,
                        x: int, y: int, z: int, constants: list, bindings: list) -> None:
    if len(bindings) > _MAX_BINDINGS:
        raise ResourceExhaustedError("too many bindings")
    write_back: list = []
    refs = [_binding(state, ref, offset, length, write_back)
            for ref, offset, length in bindings]
    device = state.device
    command_buffer = device.create_command_buffer()
    command_buffer.dispatch(executable, function, (x & 0xFFFFFFFF, y & 0xFFFFFFFF,
                                                   z & 0xFFFFFFFF),
                            [c for (c,) in constants], refs)
    command_buffer.finalize()
    done = device.create_semaphore(0)
    device.submit(command_buffer, signal=[(done, 1)])
    done.wait(1)
    for copy, window in write_back:
        window[:] = copy.host_bytes()


HAL_LOADER_EXPORTS: tuple[Export, ...] = (
    Export("executable.dispatch", "0rIiiiCiDCrIID_v",
           ("hal.executable", None, None, None, None, None, None), executable_dispatch),
    Export("executable.load", "0rrr_r", ("vm.buffer", "vm.buffer", "vm.buffer?"),
           executable_load),
    Export("executable.lookup.function", "0rr_I", ("hal.executable", "vm.buffer"),
           executable_lookup_function),
    Export("executable.query_support", "0r_i", ("vm.buffer",), executable_query_support),
)

_VM_BUFFER = RefType(VMBuffer, "vm.buffer")
_REF_TYPES = {"hal.buffer": Buffer, "hal.buffer_view": BufferView,
              "hal.executable": Executable, "vm.buffer": VMBuffer}


def create_hal_inline_module(device: Device, state: InlineState | None = None
                             ) -> NativeModule:
    """The `hal_inline` module (version 0) over `device`."""
    return build_module("hal_inline", 0, HAL_INLINE_EXPORTS, state or InlineState(device),
                        _REF_TYPES)


def create_hal_loader_module(device: Device, state: InlineState | None = None
                             ) -> NativeModule:
    """The `hal_loader` module (version 1) over `device`."""
    return build_module("hal_loader", HAL_LOADER_MODULE_VERSION, HAL_LOADER_EXPORTS,
                        state or InlineState(device), _REF_TYPES)
