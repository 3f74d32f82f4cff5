"""The native `hal` module (version 7): what compiled modules import, backed by tinyhal.hal.

The shape of IREE's HAL module (`runtime/src/iree/modules/hal/module.c`): one table,
`EXPORTS` (`native_table.Export` rows: name, calling convention, ref type of each
argument, shim, yields), as IREE's `exports.inl`, and an explicit `HalModuleState` (its
devices), as IREE's `iree_hal_module_state_t`. Shims are plain functions taking the
state first; `create_hal_module(devices)` makes one state and binds every shim to it
(`native_table.build_module`, checking refs in the shims), so each `vm.Context` gets its
own and an import call is one Python frame. Semantics and status
codes follow IREE's:

- each shim first checks the refs its row declares, in a prologue generated from the row
  once at import (`native_table.with_prologues`: inline tests, no extra frame), which
  also gives a queue operation its `queue` from its affinity (`QUEUE_RULE`, the one
  place that rule is applied): a wrong or null ref is INVALID_ARGUMENT naming the
  expected type, so the shims only forward to the HAL, which validates the rest once;
- `*_or_null` buffer arguments turn a null buffer into a binding-table slot reference
  (`command_buffer.dispatch` bindings `(unused, slot, buffer, offset, length)`,
  fill/update/copy targets);
- `device.queue.dealloca` gives back the memory of a buffer the device's `queue_alloca`
  made (whichever module made it) and only orders the queue for any other buffer;
- `device.query.i64` answers `(1, value)` or `(0, 0)` for queries the device does not
  know; `allocator.import` with its try flag returns null instead of failing;
- `fence.await` is yieldable: if a fence is still pending it returns a `Suspend` that
  blocks (`block()`) or suspends the trio task (`wait_async()`); a timeout yields
  DEADLINE_EXCEEDED (4) as the result, a failed fence raises its failure.

`!vm.buffer` arguments (rodata, strings) are taken as any object exposing the bytes
through `.data` or the buffer protocol; read-only memory is treated as immutable, as
IREE treats rodata. Rodata imported with `allocator.import` is wrapped zero-copy (the
HAL's `import_host` needs 64-byte alignment, which rodata has when the module file is
loaded into a 64-byte-aligned buffer), so weights are used in place.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

from ..errors import (
    DeadlineExceededError,
    Error,
    InvalidArgumentError,
    OutOfRangeError,
    PermissionDeniedError,
    StatusCode,
    UnimplementedError,
    error_for_code,
)
from ..hal.allocator import Allocator
from ..hal.buffer import Buffer, Storage, as_byte_view
from ..hal.buffer_view import BufferView
from ..hal.command_buffer import CommandBuffer
from ..hal.device import Device
from ..hal.elf import parse_elf
from ..hal.executable import Executable, executable_formats
from ..hal.semaphore import Fence, join_fence_rows
from ..hal.types import (
    WHOLE_BUFFER,
    BufferUsage,
    MemoryAccess,
    MemoryType,
    format_element_type,
    is_integer_type,
)
from .hal_blocks import block_recorder
from .native import NativeModule, RefType, Suspend, ref_type_error
from .native_table import (
    ALLOCA,
    BEGIN,
    DEALLOCA,
    FINISH,
    INDEPENDENT,
    JOIN_FENCES,
    NEW_FENCE,
    PURE,
    RECORD,
    SUBMIT,
    Export,
    Traits,
    build_module,
    declare_traits,
    with_prologues,
)

HAL_MODULE_VERSION = 7

_COMMAND_BUFFER_MODE_ONE_SHOT = 1 << 0
_SHARING_IMMUTABLE = int(BufferUsage.SHARING_IMMUTABLE)
_STATUS_DEFERRED = int(StatusCode.DEFERRED)
_STATUS_DEADLINE_EXCEEDED = int(StatusCode.DEADLINE_EXCEEDED)
_U32 = 0xFFFFFFFF
_first = operator.itemgetter(0)  # a variadic shape's 1-tuples -> dims, without a frame
_MAX_BINDINGS = 64
_MAX_REMEMBERED_LOOKUPS = 4096


class HalFile:
    """A `!hal.file`: read-only host memory (`ex.file.from_memory`) that queue_read reads."""

    __slots__ = ("data", "access", "source")

    def __init__(self, data: memoryview, access: int, source: Any) -> None:
        self.data = data
        self.access = access
        self.source = source  # keeps the VM buffer alive as long as the file

    def __repr__(self) -> str:
        return f"<HalFile {self.data.nbytes} bytes>"


# -- argument helpers ------------------------------------------------------------------

def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def vm_buffer_view(ref: Any, what: str = "vm.buffer") -> memoryview:
    """The bytes of a `!vm.buffer` ref as a flat byte memoryview (no copy)."""
    if ref is None:
        raise InvalidArgumentError(f"expected a {what} ref but got null")
    data = getattr(ref, "data", ref)
    try:
        view = data if isinstance(data, memoryview) else memoryview(data)
    except TypeError:
        raise InvalidArgumentError(
            f"expected a {what} ref but got {_type_name(ref)}"
        ) from None
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def vm_buffer_string(ref: Any, what: str = "vm.buffer") -> str:
    return bytes(vm_buffer_view(ref, what)).decode("utf-8", errors="replace")


def _vm_buffer_mutable(ref: Any, view: memoryview) -> bool:
    mutable = getattr(ref, "mutable", None)
    if mutable is None:
        mutable = getattr(ref, "is_mutable", None)
    if callable(mutable):
        mutable = mutable()
    if mutable is None:
        return not view.readonly
    return bool(mutable) and not view.readonly


def _byte_range(view: memoryview, offset: int, length: int, what: str) -> memoryview:
    size = view.nbytes
    if length == -1:
        length = size - offset
    if offset < 0 or length < 0 or offset > size or offset + length > size:
        raise OutOfRangeError(
            f"{what} byte range [{offset}, {offset + length}) is out of bounds of the "
            f"{size}-byte buffer"
        )
    return view[offset : offset + length]


def _timeout_seconds(timeout_ms: int) -> float | None:
    timeout_ms &= _U32
    return None if timeout_ms == _U32 else timeout_ms / 1000.0


# -- the module state ---------------------------------------------------------------------


class HalModuleState:
    """What one `hal` module instance holds (IREE's `iree_hal_module_state_t`): its
    devices, the first the default, the ordinals `executable.lookup.function` found
    per (executable, name buffer), holding both so that their ids stay theirs, and the
    memory of its recording-block sites (`vm.hal_blocks`)."""

    __slots__ = ("devices", "ordinals", "block_memos")

    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices
        self.ordinals: dict[tuple[int, int], tuple[Executable, Any, int]] = {}
        self.block_memos: list[dict] = []  # per recording-block site (`vm.hal_blocks`)

    def release(self) -> None:
        """When its context closes: drops what the state, its recording-block sites and
        its devices' recording caches hold of the context's executables (others'
        recordings are rebuilt)."""
        self.ordinals.clear()
        for memo in self.block_memos:
            memo.clear()
        for device in self.devices:
            device.recordings.clear()


# refs that shims check inside variadic segments (`_checked`), which rows do not declare
_BUFFER_OR_NULL = RefType(Buffer, "hal.buffer", True)
_BUFFER_VIEW = RefType(BufferView, "hal.buffer_view")
_DEVICE = RefType(Device, "hal.device")
_FENCE, _FENCE_OR_NULL = RefType(Fence, "hal.fence"), RefType(Fence, "hal.fence", True)


def _checked(value: Any, ref: RefType) -> Any:
    """`value` if it is what `ref` declares (a subclass, or null where allowed): the check
    of refs inside variadic segments, which rows do not declare."""
    if isinstance(value, ref.cls) or (value is None and ref.nullable):
        return value
    raise ref_type_error(value, ref)


# -- the shims ------------------------------------------------------------------------------

def ex_file_from_memory(state: HalModuleState, device, queue_affinity, access, buffer, offset,
                        length, flags):
    if access & ~int(MemoryAccess.READ):
        raise PermissionDeniedError(
            "only read-only memory can be accessed via a file handle (today)"
        )
    view = vm_buffer_view(buffer)
    return HalFile(_byte_range(view, offset, length, "file"), access, buffer)


# -- allocator --------------------------------------------------------------------

def allocator_select(state: HalModuleState, memory_types, buffer_usage, flags, pairs):
    if not pairs:
        raise InvalidArgumentError(
            "at least one device/queue affinity pair must be provided"
        )
    device, affinity = pairs[0]
    return _checked(device, _DEVICE), affinity


def allocator_allocate(state: HalModuleState, allocator, queue_affinity, memory_types, buffer_usage,
                       size):
    try:
        memory_type = MemoryType(memory_types & _U32)
        usage = allocator.coerce_usage(memory_type, buffer_usage & _U32)
        return allocator.allocate(size, memory_type, usage)
    except Error as exc:
        exc.message = f"failed to allocate buffer of length {size}; {exc.message}"
        raise


def allocator_import(state: HalModuleState, allocator, is_try, queue_affinity, memory_types,
                     buffer_usage, source, offset, length):
    view = vm_buffer_view(source)
    size = view.nbytes
    if length == -1:
        length = size
    if length < 0 or offset < 0 or offset > size or offset + length > size:
        raise InvalidArgumentError(
            f"byte range out of bounds (requested {offset}-{offset + length - 1} of "
            f"available {size})"
        )
    usage = buffer_usage & _U32
    access = MemoryAccess.READ
    if not _vm_buffer_mutable(source, view):
        if usage & _SHARING_IMMUTABLE != _SHARING_IMMUTABLE:
            raise PermissionDeniedError(
                "source buffer is immutable and can only be imported for constant usage"
            )
    elif usage & _SHARING_IMMUTABLE != _SHARING_IMMUTABLE:
        access |= MemoryAccess.WRITE
    try:
        buffer = allocator.import_host(
            as_byte_view(view)[offset : offset + length], MemoryType(memory_types & _U32), BufferUsage(usage), access
        )
    except Error:
        if is_try:
            return None
        raise
    if buffer is None and not is_try:
        raise InvalidArgumentError(
            f"host memory at offset {offset} ({length} bytes) cannot be imported: "
            "it must be 64-byte aligned"
        )
    return buffer


# -- buffer -----------------------------------------------------------------------

def buffer_assert(state: HalModuleState, buffer, message, allocator, minimum_length, memory_types,
                  usage):
    types, bits = memory_types & _U32, usage & _U32
    if (buffer.byte_length < minimum_length or buffer.memory_type_bits & types != types
            or buffer.usage_bits & bits != bits):
        _buffer_assert_failure(buffer, vm_buffer_string(message), minimum_length,
                               types, bits)


def buffer_allocation_preserve(state: HalModuleState, buffer):
    return None  # its prologue checks the refs; nothing more to do


def buffer_allocation_discard(state: HalModuleState, buffer):
    # Ownership is tracked by Python references, not an explicit count: the caller
    # never holds the last reference here, so the allocation is never terminal.
    return 0


def buffer_allocation_is_terminal(state: HalModuleState, buffer):
    return 0


def buffer_subspan(state: HalModuleState, buffer, offset, length):
    try:
        return buffer.subspan(offset, length)
    except Error as exc:
        exc.message = (f"invalid subspan of an existing buffer (source_offset={offset}, "
                       f"length={length}); {exc.message}")
        raise


def buffer_length(state: HalModuleState, buffer):
    return buffer.byte_length


def buffer_load(state: HalModuleState, buffer, offset, length):
    if length > 4:
        raise InvalidArgumentError(f"load length byte count {length} exceeds max")
    offset, length = buffer.resolve_range(offset, length, "load")
    return int.from_bytes(
        buffer.allocator.device_ref().read_bytes(buffer, offset, length), "little")


def buffer_store(state: HalModuleState, value, buffer, offset, length):
    if length > 4:
        raise InvalidArgumentError(f"store length byte count {length} exceeds max")
    if offset + length > buffer.byte_length or offset < 0 or length < 0:
        raise OutOfRangeError(
            f"store out of bounds (target_offset={offset}, length={length} into max "
            f"{buffer.byte_length})"
        )
    data = (value & _U32).to_bytes(4, "little")[:length]
    buffer.allocator.device_ref().write_bytes(buffer, data, offset)


# -- buffer view ------------------------------------------------------------------

def buffer_view_create(state: HalModuleState, buffer, offset, length, element_type, encoding_type,
                       shape):
    if offset != 0 or length != buffer.byte_length:
        try:
            buffer = buffer.subspan(offset, length)
        except Error as exc:
            exc.message = (f"invalid subspan of an existing buffer (source_offset="
                           f"{offset}, length={length}); {exc.message}")
            raise
    return BufferView(buffer, tuple(map(_first, shape)), element_type & _U32,
                      encoding_type & _U32)  # checked in C, without a Python frame


def buffer_view_assert(state: HalModuleState, view, message, element_type, encoding_type, shape):
    actual = view.shape
    expected_type = element_type & _U32
    if ((view.encoding_type and view.encoding_type != encoding_type & _U32)
            or (view.element_type != expected_type
                and not _element_types_compatible(view.element_type, expected_type))
            or tuple(map(_first, shape)) != actual):
        _buffer_view_assert_failure(view, vm_buffer_string(message), expected_type,
                                    encoding_type & _U32, tuple(d for (d,) in shape))


def buffer_view_buffer(state: HalModuleState, view):
    return view.buffer


def buffer_view_element_type(state: HalModuleState, view):
    return view.element_type


def buffer_view_encoding_type(state: HalModuleState, view):
    return view.encoding_type


def buffer_view_rank(state: HalModuleState, view):
    return len(view.shape)


def buffer_view_dim(state: HalModuleState, view, index):
    shape = view.shape
    if not 0 <= index < len(shape):
        raise OutOfRangeError(
            f"buffer view dimension {index} out of range of rank {len(shape)}"
        )
    return shape[index]


def buffer_view_trace(state: HalModuleState, key, views):
    for (view,) in views:
        _checked(view, _BUFFER_VIEW)


# -- channels (collectives) -------------------------------------------------------

def channel_create(state: HalModuleState, *args):
    raise UnimplementedError("collective channels are not supported by tinyhal")


def channel_split(state: HalModuleState, *args):
    raise UnimplementedError("collective channels are not supported by tinyhal")


def channel_rank_and_count(state: HalModuleState, *args):
    raise UnimplementedError("collective channels are not supported by tinyhal")


# -- command buffer ---------------------------------------------------------------

def command_buffer_create(state: HalModuleState, device, modes, categories, queue_affinity,
                          binding_capacity):
    mode = "one_shot" if modes & _COMMAND_BUFFER_MODE_ONE_SHOT else "reusable"
    return device.create_command_buffer(mode, binding_capacity)


def command_buffer_finalize(state: HalModuleState, cb):
    cb.finalize()


def command_buffer_begin_debug_group(state: HalModuleState, cb, label):
    return None  # its prologue checks the refs; nothing more to do


def command_buffer_end_debug_group(state: HalModuleState, cb):
    return None  # its prologue checks the refs; nothing more to do


def command_buffer_execution_barrier(state: HalModuleState, cb, source_stage, target_stage, flags):
    cb.barrier()


def command_buffer_advise_buffer(state: HalModuleState, cb, buffer, flags, arg0, arg1, slot):
    return None  # its prologue checks the refs; nothing more to do


def command_buffer_fill_buffer(state: HalModuleState, cb, target, offset, length, slot, pattern,
                               pattern_length, flags):
    if pattern_length not in (1, 2, 4):
        raise InvalidArgumentError(
            f"fill patterns must be 1, 2 or 4 bytes, not {pattern_length}"
        )
    pattern &= (1 << (8 * pattern_length)) - 1
    cb.fill(slot if target is None else target, offset, length, pattern, pattern_length)


def command_buffer_update_buffer(state: HalModuleState, cb, source, source_offset, target,
                                 target_offset, length, slot, flags):
    data = _byte_range(vm_buffer_view(source), source_offset, length, "update source")
    cb.update(data, slot if target is None else target, target_offset)


def command_buffer_copy_buffer(state: HalModuleState, cb, source_slot, target_slot, source,
                               source_offset, target, target_offset, length, flags):
    cb.copy(source_slot if source is None else source, source_offset,
            target_slot if target is None else target, target_offset, length)


def command_buffer_collective(state: HalModuleState, *args):
    raise UnimplementedError("collective operations are not supported by tinyhal")


def command_buffer_dispatch(state: HalModuleState, cb, executable, function, x, y, z, flags,
                            constants, bindings):
    if len(bindings) > _MAX_BINDINGS:
        raise OutOfRangeError(f"binding count {len(bindings)} > {_MAX_BINDINGS}")
    refs = []
    for _unused, slot, buffer, offset, length in bindings:
        if buffer is None:
            refs.append((slot, offset, length))
        elif type(buffer) is Buffer or isinstance(buffer, Buffer):
            refs.append((buffer, offset, length))
        else:
            raise ref_type_error(buffer, _BUFFER_OR_NULL)
    words = []
    for (c,) in constants:
        words.append(c & _U32)
    cb.dispatch(executable, function, (x & _U32, y & _U32, z & _U32), tuple(words), refs)


def command_buffer_dispatch_indirect(state: HalModuleState, *args):
    raise UnimplementedError(
        "indirect dispatch (workgroup counts read from a buffer) is not supported yet"
    )


# -- device -----------------------------------------------------------------------

def device_allocator(state: HalModuleState, device):
    return device.allocator


def device_query_i64(state: HalModuleState, device, category, key):
    category_str = vm_buffer_string(category)
    key_str = vm_buffer_string(key)
    try:
        value = device.query(category_str, key_str)
    except Error:
        return 0, 0
    return 1, int(value)


def device_queue_alloca(state: HalModuleState, device, queue_affinity, wait, signal, pool,
                        memory_types, usage, size, flags, *, queue=0):
    if pool != 0:
        raise UnimplementedError("VM queue allocation pools are not supported")
    return device.queue_alloca(size, wait, signal, memory_types & _U32, usage & _U32, queue)


def device_queue_dealloca(state: HalModuleState, device, queue_affinity, wait, signal, buffer,
                          flags, *, queue=0):
    # queue_alloca memory of this device: placed, or still waiting for its alloca to run
    # (a driver that runs allocas later); its dealloca then waits behind it
    if device.is_transient(buffer):
        device.queue_dealloca(buffer, wait, signal, queue)
    else:
        # Not transient memory: the buffer lives on while referenced; only order.
        device.queue_barrier(wait, signal, queue)


def device_queue_fill(state: HalModuleState, device, queue_affinity, wait, signal, target, offset,
                      length, pattern, pattern_length, flags, *, queue=0):
    if pattern_length not in (1, 2, 4):
        raise InvalidArgumentError(
            f"fill patterns must be 1, 2 or 4 bytes, not {pattern_length}"
        )
    pattern &= (1 << (8 * pattern_length)) - 1
    device.queue_fill(target, offset, length, pattern, wait, signal, pattern_length,
                      queue=queue)


def device_queue_update(state: HalModuleState, device, queue_affinity, wait, signal, source,
                        source_offset, target, target_offset, length, flags, *, queue=0):
    data = _byte_range(vm_buffer_view(source), source_offset, length, "update source")
    device.queue_update(data, target, target_offset, wait, signal,
                        queue=queue)


def device_queue_copy(state: HalModuleState, device, queue_affinity, wait, signal, source,
                      source_offset, target, target_offset, length, flags, *, queue=0):
    device.queue_copy(source, source_offset, target, target_offset, length,
                      wait, signal, queue=queue)


def device_queue_read(state: HalModuleState, device, queue_affinity, wait, signal, source,
                      source_offset, target, target_offset, length, flags, *, queue=0):
    if length == WHOLE_BUFFER:
        length = target.byte_length - target_offset
    device.queue_read(source.data, source_offset, target, target_offset, length,
                      wait, signal, queue=queue)


def device_queue_write(state: HalModuleState, device, queue_affinity, wait, signal, source,
                       source_offset, target, target_offset, length, flags, *, queue=0):
    if target.data.readonly:
        raise PermissionDeniedError("file was imported read-only and cannot be written")
    device.queue_write(source, source_offset, target.data, target_offset, length,
                       wait, signal, queue=queue)


def device_queue_barrier(state: HalModuleState, device, queue_affinity, wait, signal, flags, *,
                         queue=0):
    device.queue_barrier(wait, signal, queue)


def device_queue_execute(state: HalModuleState, device, queue_affinity, wait, signal, cb, flags, *,
                         queue=0):
    device.submit(cb, wait, signal, None, queue)


def device_queue_execute_indirect(state: HalModuleState, device, queue_affinity, wait, signal, cb,
                                  flags, bindings, *, queue=0):
    table = []
    for buffer, offset, length in bindings:
        if buffer is None:
            # An unused slot; any valid range will do, the recording never reads it.
            table.append((_EMPTY_BUFFER, 0, 0))
        elif type(buffer) is Buffer or isinstance(buffer, Buffer):
            table.append((buffer, offset, length))
        else:
            raise ref_type_error(buffer, _BUFFER_OR_NULL)
    device.submit(cb, wait, signal, table, queue)


def device_queue_flush(state: HalModuleState, device, queue_affinity):
    return None  # its prologue checks the refs; nothing more to do


# -- devices ----------------------------------------------------------------------

def devices_count(state: HalModuleState):
    return len(state.devices)


def devices_get(state: HalModuleState, index):
    return state.devices[index] if 0 <= index < len(state.devices) else None


# -- executables ------------------------------------------------------------------

def executable_create(state: HalModuleState, device, queue_affinity, executable_format, data,
                      constants):
    format_str = vm_buffer_string(executable_format)
    if format_str not in executable_formats():
        raise error_for_code(
            StatusCode.NOT_FOUND,
            f"no executable loader can load format `{format_str}`; tinyhal loads "
            + ", ".join(executable_formats()),
        )
    if constants is not None and vm_buffer_view(constants).nbytes:
        size = vm_buffer_view(constants).nbytes
        if size % 4:
            raise InvalidArgumentError(
                "constant buffer data must contain 4-byte elements but data length "
                f"is {size}"
            )
        raise UnimplementedError("executable-level constants are not supported yet")
    view = vm_buffer_view(data, "executable data")
    try:
        if format_str.startswith("embedded-elf") and not parse_elf(
                bytes(view), "embedded ELF").self_contained:
            raise InvalidArgumentError(
                "embedded ELF imports symbols, names libraries or has initializers; "
                "only self-contained libraries load as embedded ELF"
            )
        return device.load_executable(view)
    except Error as exc:
        exc.message = (f"hal.executable.create ({format_str}, {view.nbytes} bytes): "
                       f"{exc.message}")
        exc.args = (exc.message,)
        raise


def executable_lookup_function(state: HalModuleState, executable, name):
    # programs look the same names up on every call: remembered per (executable,
    # name buffer), holding both so that their ids stay theirs
    known = state.ordinals.get((id(executable), id(name)))
    if known is not None and known[0] is executable and known[1] is name:
        return known[2]
    ordinal = executable.lookup(vm_buffer_string(name))
    if len(state.ordinals) >= _MAX_REMEMBERED_LOOKUPS:
        state.ordinals.clear()
    state.ordinals[(id(executable), id(name))] = (executable, name, ordinal)
    return ordinal


# -- fences -----------------------------------------------------------------------

def fence_create(state: HalModuleState, device, flags):
    return Fence.pending()


def fence_join(state: HalModuleState, flags, fences):
    # In C: a join of one fence with points (and nulls or empty fences) is that fence (a
    # fence never changes once made, so sharing it is the same set of points); a join
    # without points is a null fence, as IREE's join.
    joined = join_fence_rows(fences)
    if joined is NotImplemented:  # a row that is not a fence: raises the ref-type error
        for (fence,) in fences:
            if fence is not None and not isinstance(fence, Fence):
                _checked(fence, _FENCE_OR_NULL)
        raise InvalidArgumentError(f"hal.fence.join takes rows of one fence, not {fences!r}")
    return joined


def fence_query(state: HalModuleState, fence):
    try:
        return 0 if fence.query() else _STATUS_DEFERRED
    except Error as exc:
        return int(exc.code)


def fence_signal(state: HalModuleState, fence):
    fence.signal()


def fence_fail(state: HalModuleState, fence, status_code):
    code = status_code & 0x1F
    fence.fail(error_for_code(code, f"fence failed by the program with status {code}"))


def fence_await(state: HalModuleState, timeout_ms, flags, fences):
    pending = []
    for (fence,) in fences:
        if fence is None:
            continue
        if type(fence) is not Fence:
            _checked(fence, _FENCE)
            if not fence.query():  # raises the failure of a failed fence
                pending.append(fence)
            continue
        for sem, value in fence.timeline.items():  # `fence.query()`, inline
            if sem.query() < value:  # raises the failure of a failed semaphore
                pending.append(fence)
                break
    if not pending:
        return 0
    timeout = _timeout_seconds(timeout_ms)
    if timeout == 0:
        return _STATUS_DEADLINE_EXCEEDED
    return Suspend(lambda: _await_block(pending, timeout),
                   lambda: _await_async(pending, timeout))


# -- the declaration --------------------------------------------------------------------

# The hal module's exports, as IREE declares them in exports.inl (`native_table.Export`
# rows; a None ref tuple: nothing declared, the export is UNIMPLEMENTED; `traits`: what
# the import does to a recording, which the VM's translator reads). Each shim checks its
# declared refs in a prologue generated from its row below (`with_prologues`), and is
# bound with `shims_check_refs`, so an import call is one Python frame.
EXPORTS: tuple[Export, ...] = (
    Export("allocator.allocate", "0rIiiI_r",
           ("hal.allocator", None, None, None, None),
           allocator_allocate),
    Export("allocator.import", "0riIiirII_r",
           ("hal.allocator", None, None, None, None, None, None, None),
           allocator_import),
    Export("allocator.select", "0iiICrID_rI", (None, None, None, None), allocator_select),
    Export("buffer.allocation.discard", "0r_i", ("hal.buffer",), buffer_allocation_discard),
    Export("buffer.allocation.is_terminal", "0r_i",
           ("hal.buffer",),
           buffer_allocation_is_terminal),
    Export("buffer.allocation.preserve", "0r_v", ("hal.buffer",), buffer_allocation_preserve),
    Export("buffer.assert", "0rrrIii_v",
           ("hal.buffer", None, "hal.allocator", None, None, None),
           buffer_assert),
    Export("buffer.length", "0r_I", ("hal.buffer",), buffer_length),
    Export("buffer.load", "0rIi_i", ("hal.buffer", None, None), buffer_load),
    Export("buffer.store", "0irIi_v", (None, "hal.buffer", None, None), buffer_store),
    Export("buffer.subspan", "0rII_r", ("hal.buffer", None, None), buffer_subspan),
    Export("buffer_view.assert", "0rriiCID_v",
           ("hal.buffer_view", None, None, None, None),
           buffer_view_assert),
    Export("buffer_view.buffer", "0r_r", ("hal.buffer_view",), buffer_view_buffer),
    Export("buffer_view.create", "0rIIiiCID_r",
           ("hal.buffer", None, None, None, None, None),
           buffer_view_create),
    Export("buffer_view.dim", "0ri_I", ("hal.buffer_view", None), buffer_view_dim),
    Export("buffer_view.element_type", "0r_i", ("hal.buffer_view",), buffer_view_element_type),
    Export("buffer_view.encoding_type", "0r_i", ("hal.buffer_view",), buffer_view_encoding_type),
    Export("buffer_view.rank", "0r_i", ("hal.buffer_view",), buffer_view_rank),
    Export("buffer_view.trace", "0rCrD_v", (None, None), buffer_view_trace),
    Export("channel.create", "0rIIrrii_r", None, channel_create),
    Export("channel.rank_and_count", "0r_ii", None, channel_rank_and_count),
    Export("channel.split", "0riiI_r", None, channel_split),
    Export("command_buffer.advise_buffer", "0rrIIIi_v",
           ("hal.command_buffer", "hal.buffer?", None, None, None, None),
           command_buffer_advise_buffer),
    Export("command_buffer.begin_debug_group", "0rr_v",
           ("hal.command_buffer", None),
           command_buffer_begin_debug_group),
    Export("command_buffer.collective", "0rriiiirrIIIII_v", None, command_buffer_collective),
    Export("command_buffer.copy_buffer", "0riirIrIII_v",
           ("hal.command_buffer", None, None, "hal.buffer?", None, "hal.buffer?", None, None, None),
           command_buffer_copy_buffer,
           traits=Traits(RECORD, 0, ((3, None), (5, None)), ((7, None),))),
    Export("command_buffer.create", "0riiIi_r",
           ("hal.device", None, None, None, None),
           command_buffer_create, traits=Traits(BEGIN)),
    Export("command_buffer.dispatch", "0rrIiiiICiDCiirIID_v",
           ("hal.command_buffer", "hal.executable", None, None, None, None, None, None, None),
           command_buffer_dispatch, traits=Traits(RECORD, 0, ((8, 2),), ((8, 4),))),
    Export("command_buffer.dispatch.indirect", "0rrIirIICiDCiirIID_v",
           None,
           command_buffer_dispatch_indirect),
    Export("command_buffer.end_debug_group", "0r_v",
           ("hal.command_buffer",),
           command_buffer_end_debug_group),
    Export("command_buffer.execution_barrier", "0riiI_v",
           ("hal.command_buffer", None, None, None),
           command_buffer_execution_barrier, traits=Traits(RECORD, 0)),
    Export("command_buffer.fill_buffer", "0rrIIiIiI_v",
           ("hal.command_buffer", "hal.buffer?", None, None, None, None, None, None),
           command_buffer_fill_buffer, traits=Traits(RECORD, 0, ((1, None),), ((3, None),))),
    Export("command_buffer.finalize", "0r_v", ("hal.command_buffer",), command_buffer_finalize,
           traits=Traits(FINISH, 0)),
    Export("command_buffer.update_buffer", "0rrIrIIiI_v",
           ("hal.command_buffer", None, None, "hal.buffer?", None, None, None, None),
           command_buffer_update_buffer),
    Export("device.allocator", "0r_r", ("hal.device",), device_allocator),
    Export("device.query.i64", "0rrr_iI", ("hal.device", None, None), device_query_i64),
    Export("device.queue.alloca", "0rIrrIiiII_r",
           ("hal.device", None, "hal.fence?", "hal.fence?", None, None, None, None, None),
           device_queue_alloca, traits=Traits("", step=ALLOCA, wait=2, signal=3)),
    Export("device.queue.barrier", "0rIrrI_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", None),
           device_queue_barrier),
    Export("device.queue.copy", "0rIrrrIrIII_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", "hal.buffer",
            None, "hal.buffer", None, None, None),
           device_queue_copy),
    Export("device.queue.dealloca", "0rIrrrI_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", "hal.buffer", None),
           device_queue_dealloca, traits=Traits("", step=DEALLOCA, wait=2, signal=3)),
    Export("device.queue.execute", "0rIrrrI_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", "hal.command_buffer", None),
           device_queue_execute, traits=Traits(SUBMIT, 4, wait=2, signal=3)),
    Export("device.queue.execute.indirect", "0rIrrrICrIID_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", "hal.command_buffer", None, None),
           device_queue_execute_indirect),
    Export("device.queue.fill", "0rIrrrIIIiI_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", "hal.buffer",
            None, None, None, None, None),
           device_queue_fill),
    Export("device.queue.flush", "0rI_v", ("hal.device", None), device_queue_flush),
    Export("device.queue.read", "0rIrrrIrIII_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", "hal.file",
            None, "hal.buffer", None, None, None),
           device_queue_read),
    Export("device.queue.update", "0rIrrrIrIII_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", None,
            None, "hal.buffer", None, None, None),
           device_queue_update),
    Export("device.queue.write", "0rIrrrIrIII_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", "hal.buffer",
            None, "hal.file", None, None, None),
           device_queue_write),
    Export("devices.count", "0v_i", (), devices_count),
    Export("devices.get", "0i_r", (None,), devices_get),
    Export("ex.file.from_memory", "0rIirIIi_r",
           ("hal.device", None, None, None, None, None, None),
           ex_file_from_memory),
    Export("executable.create", "0rIrrr_r",
           ("hal.device", None, None, None, None),
           executable_create),
    Export("executable.lookup.function", "0rr_I",
           ("hal.executable", None),
           executable_lookup_function, traits=Traits(PURE)),
    Export("fence.await", "0iICrD_i", (None, None, None), fence_await, yields=True),
    Export("fence.create", "0rI_r", ("hal.device", None), fence_create,
           traits=Traits(INDEPENDENT, step=NEW_FENCE)),
    Export("fence.fail", "0ri_v", ("hal.fence", None), fence_fail),
    Export("fence.join", "0ICrD_r", (None, None), fence_join,
           traits=Traits(INDEPENDENT, step=JOIN_FENCES)),
    Export("fence.query", "0r_i", ("hal.fence",), fence_query),
    Export("fence.signal", "0r_v", ("hal.fence",), fence_signal),
)
# The class of each ref type the rows name.
REF_TYPES: dict[str, type] = {
    "hal.allocator": Allocator, "hal.buffer": Buffer, "hal.buffer_view": BufferView,
    "hal.command_buffer": CommandBuffer, "hal.device": Device, "hal.executable": Executable,
    "hal.fence": Fence, "hal.file": HalFile,
}
# The queue a queue operation runs on: the one place the affinity rule is applied (a
# device of one queue has only queue 0; others map the affinity: `Device.queue_for_affinity`).
QUEUE_RULE = "device.queue_for_affinity(queue_affinity) if device.queue_count > 1 else 0"
EXPORTS = with_prologues(EXPORTS, globals(), __file__, REF_TYPES, {"queue": QUEUE_RULE},
                         subclassed={"hal.device", "hal.allocator"})  # drivers subclass them
declare_traits("hal", EXPORTS)


def create_hal_module(devices: Device | Sequence[Device]) -> NativeModule:
    """A `hal` module instance over `devices` (the first is the default device): each
    export of `EXPORTS` bound to one new `HalModuleState`."""
    device_list: list[Device] = [devices] if isinstance(devices, Device) else list(devices)
    if not device_list:
        raise InvalidArgumentError("the hal module needs at least one device")
    for d in device_list:
        _checked(d, _DEVICE)
    state = HalModuleState(device_list)
    module = build_module("hal", HAL_MODULE_VERSION, EXPORTS, state, shims_check_refs=True)
    module.devices = device_list  # type: ignore[attr-defined]
    module.on_close = state.release
    module.block_recorder = functools.partial(block_recorder, state.block_memos)
    return module


def _await_block(fences: list[Fence], timeout: float | None) -> int:
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for fence in fences:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            fence.wait(remaining)
    except DeadlineExceededError:
        return _STATUS_DEADLINE_EXCEEDED
    return 0


async def _await_async(fences: list[Fence], timeout: float | None) -> int:
    import trio

    if timeout is None:
        for fence in fences:
            await fence.wait_async()
        return 0
    with trio.move_on_after(timeout):
        for fence in fences:
            await fence.wait_async()
        return 0
    return _STATUS_DEADLINE_EXCEEDED


# An always-valid stand-in for null binding-table entries.
_EMPTY_BUFFER = Buffer(
    None,
    Storage(0),
    0,
    0,
    MemoryType.DEVICE_LOCAL | MemoryType.HOST_VISIBLE,
    BufferUsage(0x1FFFFFFF),
)


# -- element types -----------------------------------------------------------------------

def _buffer_assert_failure(buffer: Buffer, label: str, minimum_length: int,
                           required_types: int, required_usage: int) -> None:
    """Raises IREE's error for a failed `buffer.assert` (built only when it fails)."""
    if buffer.byte_length < minimum_length:
        raise InvalidArgumentError(
            f"{label} buffer byte length {buffer.byte_length} less than expected "
            f"minimum {minimum_length}"
        )
    if buffer.memory_type_bits & required_types != required_types:
        raise PermissionDeniedError(
            f"{label} buffer memory type is not compatible; buffer has "
            f"{buffer.memory_type_bits:08X}, operation requires {required_types:08X}"
        )
    raise PermissionDeniedError(
        f"{label} requested usage was not specified when the buffer was "
        f"allocated; buffer allows {buffer.usage_bits:08X}, operation "
        f"requires {required_usage:08X}"
    )


def _buffer_view_assert_failure(view: BufferView, label: str, expected_type: int,
                                expected_encoding: int, expected_shape: tuple) -> None:
    """Raises IREE's error for a failed `buffer_view.assert` (built only when it fails)."""
    if view.encoding_type != 0 and view.encoding_type != expected_encoding:
        raise InvalidArgumentError(
            f"{label} encoding mismatch; expected {expected_encoding:08X} but have "
            f"{view.encoding_type:08X}"
        )
    if not _element_types_compatible(view.element_type, expected_type):
        raise InvalidArgumentError(
            f"{label} element type mismatch; expected {format_element_type(expected_type)}"
            f" ({expected_type:08X}) but have {format_element_type(view.element_type)} "
            f"({view.element_type:08X})"
        )
    actual = view.shape
    if len(actual) != len(expected_shape):
        raise InvalidArgumentError(
            f"{label} shape rank mismatch; expected {len(expected_shape)}"
            f"{' (scalar)' if not expected_shape else ''} but have {len(actual)}"
            f"{' (scalar)' if not actual else ''}; expected shape "
            f"`{_shape_str(expected_shape)}`, actual shape `{_shape_str(actual)}`"
        )
    for i, (have, want) in enumerate(zip(actual, expected_shape)):
        if have != want:
            raise InvalidArgumentError(
                f"{label} shape dimension {i} mismatch; expected {want} but have "
                f"{have}; expected shape `{_shape_str(expected_shape)}`, actual shape "
                f"`{_shape_str(actual)}`"
            )


def _element_types_compatible(actual: int, expected: int) -> bool:
    if (actual >> 24) & 0xFF == 0:  # opaque
        return True
    if (is_integer_type(actual) and is_integer_type(expected)
            and (actual & 0xFF) == (expected & 0xFF)):
        return True
    return actual == expected


def _shape_str(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)

