"""The native `io_parameters` module (version 0): external parameters for compiled programs.

Programs whose globals are `#stream.parameter.named<"scope"::"key">` import
`io_parameters.load` (weights the device uses in place, unified memory) or
`io_parameters.gather` (weights copied into one buffer the program allocated, discrete
memory), and `io_parameters.scatter` to write parameters back. The semantics follow
IREE's `runtime/src/iree/modules/io/parameters/module.c` and its parameter index
provider (`runtime/src/iree/io/parameter_index_provider.c`):

- a scope (a `!vm.buffer` string, null meaning `""`) selects the `ParameterIndex` that
  serves it (exact match; none is NOT_FOUND naming the scope);
- the keys come as a table of `(u32 offset, u32 length)` entries into a key-data buffer,
  the spans as `(u64 parameter_offset, u64 buffer_offset, u64 length)` triples, one per
  key; a span must lie inside its parameter (OUT_OF_RANGE), a splat parameter can only
  be read and a parameter file opened read-only cannot be written (PERMISSION_DENIED);
- every operation waits on the wait fence and the signal fence is reached once all are
  done (or fails with the first failure): each is a queue operation on the device
  (read, fill, write), chained on one private timeline, then a barrier to the signal;
- `load` returns a `!vm.list<!hal.buffer>`, one buffer per key: the parameter's bytes
  used in place when they sit in host memory that can never change or vanish (see
  `tinyhal.vm.parameter_formats`), the target heap is host memory, the program asked for
  an immutable buffer and the bytes are 64-byte aligned (IREE's import path); otherwise a
  new device buffer the parameter is read into (IREE's alloca-and-read fallback).

The module is a declared table (`EXPORTS`: name, calling convention, ref type of each
argument, function) plus an explicit per-context state (`IoParametersState`), as IREE
declares it in `exports.inl` with a state struct; each function takes the state first.
"""

from __future__ import annotations

import os
import struct
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import InvalidArgumentError, NotFoundError, OutOfRangeError, PermissionDeniedError
from ..hal.buffer import Buffer
from ..hal.device import Device
from ..hal.semaphore import Fence
from ..hal.types import BufferUsage, MemoryAccess, MemoryType
from .native import NativeModule
from .native_table import Export, build_module
from .parameter_formats import ParameterEntry, ParameterIndex
from .types import VMBuffer, VMList

__all__ = [
    "EXPORTS",
    "IO_PARAMETERS_MODULE_VERSION",
    "IoParametersState",
    "ParameterStatistics",
    "create_io_parameters_module",
    "parameter_scopes",
]

IO_PARAMETERS_MODULE_VERSION = 0

_KEY_ENTRY = struct.Struct("<II")
_SPAN = struct.Struct("<QQQ")
_HOST_VISIBLE = int(MemoryType.HOST_VISIBLE)
_IMMUTABLE = int(BufferUsage.SHARING_IMMUTABLE)
_TRANSFER = int(BufferUsage.TRANSFER)


class ParameterStatistics(NamedTuple):
    """Memory holding parameters: `live_bytes` / `peak_bytes` of buffers `load`
    returned that are still referenced (`imported_bytes` of them used in place, no
    copy) and of parameters `gather` placed in memory blocks still alive, and
    `read_bytes` copied from parameter storage since the start."""

    live_bytes: int
    peak_bytes: int
    imported_bytes: int
    read_bytes: int


class IoParametersState:
    """One context's `io_parameters` state: the index serving each scope and counters of
    the parameter memory it made."""

    def __init__(self, scopes: Mapping[str, ParameterIndex]) -> None:
        self.scopes = dict(scopes)
        self._lock = threading.Lock()
        self._live = 0
        self._peak = 0
        self._imported = 0
        self._read = 0
        self._gathered: weakref.WeakSet = weakref.WeakSet()

    def index(self, scope: str) -> ParameterIndex:
        index = self.scopes.get(scope)
        if index is None:
            have = ", ".join(f"'{s}'" for s in self.scopes) or "none"
            raise NotFoundError(
                f"no provider registered that handles scopes like '{scope}' (parameter "
                f"scopes given: {have}); pass the program's parameter files with "
                f"parameters={{'{scope}': PATH}} or --parameters={scope}=PATH")
        return index

    def statistics(self) -> ParameterStatistics:
        with self._lock:
            return ParameterStatistics(self._live, self._peak, self._imported, self._read)

    def _count_buffer(self, buffer: Buffer, imported: bool) -> None:
        size = buffer.byte_length
        with self._lock:
            self._live += size
            self._peak = max(self._peak, self._live)
            if imported:
                self._imported += size
        weakref.finalize(buffer.storage, self._uncount, size, imported)

    def _count_gathered(self, target: Buffer, size: int) -> None:
        """Counts `size` gathered bytes of `target`'s memory once per memory block (a
        program gathers its parameters into one block it allocated, once)."""
        storage = target.storage
        with self._lock:
            if storage in self._gathered:
                return
            self._gathered.add(storage)
            self._live += size
            self._peak = max(self._peak, self._live)
        weakref.finalize(storage, self._uncount, size, False)

    def _uncount(self, size: int, imported: bool) -> None:
        with self._lock:
            self._live -= size
            if imported:
                self._imported -= size

    def _count_read(self, size: int) -> None:
        with self._lock:
            self._read += size


# -- arguments ---------------------------------------------------------------------------


class _Span(NamedTuple):
    entry: ParameterEntry
    parameter_offset: int
    buffer_offset: int
    length: int


def _scope(ref: VMBuffer | None) -> str:
    return "" if ref is None else bytes(ref.data).decode("utf-8", errors="replace")


def _spans(index: ParameterIndex, key_table: VMBuffer, key_data: VMBuffer,
           spans: VMBuffer, access: int) -> list[_Span]:
    """Every (key, span) of an operation, resolved and checked before anything runs."""
    span_bytes = spans.data
    if len(span_bytes) % _SPAN.size:
        raise InvalidArgumentError(
            "buffer span storage must be aligned to iree_io_parameters_span_entry_t")
    count = len(span_bytes) // _SPAN.size
    table = key_table.data
    if len(table) < count * _KEY_ENTRY.size:
        raise InvalidArgumentError(
            "key string table must have enough data to service all defined spans")
    data = key_data.data
    out = []
    for i in range(count):
        key_offset, key_length = _KEY_ENTRY.unpack_from(table, i * _KEY_ENTRY.size)
        if key_offset > len(data) or key_offset + key_length > len(data):
            raise OutOfRangeError(
                f"attempted to access an address outside of the valid buffer range "
                f"(offset={key_offset}, length={key_length}, data_capacity={len(data)})")
        key = bytes(data[key_offset : key_offset + key_length]).decode("utf-8", "replace")
        parameter_offset, buffer_offset, length = _SPAN.unpack_from(span_bytes, i * _SPAN.size)
        entry = index.lookup(key)
        _check_access(entry, access)
        if parameter_offset + length > entry.length:
            raise OutOfRangeError(
                f"parameter `{key}` range out of bounds (offset={parameter_offset}, "
                f"length={length}, size={entry.length})")
        out.append(_Span(entry, parameter_offset, buffer_offset, length))
    return out


def _check_access(entry: ParameterEntry, required: int) -> None:
    allowed = 0
    if entry.is_splat:
        allowed = int(MemoryAccess.READ)
    else:
        if entry.source.readable:
            allowed |= int(MemoryAccess.READ)
        if entry.source.writable:
            allowed |= int(MemoryAccess.WRITE | MemoryAccess.DISCARD)
    if allowed & required != required:
        raise PermissionDeniedError(
            f"parameter `{entry.key}` storage does not support the requested access type; "
            f"parameter allows {_access_name(allowed)}, operation requires "
            f"{_access_name(required)}")


def _access_name(access: int) -> str:
    names = [n for n, bit in (("READ", MemoryAccess.READ), ("WRITE", MemoryAccess.WRITE),
                              ("DISCARD", MemoryAccess.DISCARD)) if access & int(bit)]
    return "|".join(names) or "NONE"


# -- queue work --------------------------------------------------------------------------


class _Timeline:
    """Queue operations in order on one private semaphore after `wait`; leaving the
    `with` block reaches `signal` once all are done (a failed operation fails it). An
    error raised inside the block fails the timeline and `signal` at once, so nothing
    queued before it runs and the program's waits end with that error, as IREE fails a
    batch's signal semaphores."""

    def __init__(self, device: Device, wait: Fence | None, signal: Fence | None) -> None:
        self.device = device
        self.wait = wait
        self.signal = signal
        self.semaphore = device.create_semaphore(0)
        self.value = 0

    def step(self) -> tuple[Any, list]:
        wait = self.wait if self.value == 0 else [(self.semaphore, self.value)]
        self.value += 1
        return wait, [(self.semaphore, self.value)]

    def __enter__(self) -> _Timeline:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        if error is None:
            wait = self.wait if self.value == 0 else [(self.semaphore, self.value)]
            self.device.queue_barrier(wait, self.signal)
            return
        self.semaphore.fail(error)
        if self.signal is not None:
            self.signal.fail(error)


class _ParameterFile:
    """A file-like view of one parameter for `Device.queue_read` / `queue_write`: the
    transfer runs when the queue reaches it, through the entry's source (DATA_LOSS if a
    file shrank)."""

    def __init__(self, state: IoParametersState, entry: ParameterEntry) -> None:
        self.state = state
        self.entry = entry
        self.offset = 0

    def seek(self, offset: int) -> None:
        self.offset = offset

    def readinto(self, target: memoryview) -> int:
        array = np.frombuffer(target, np.uint8)
        self.entry.source.read_into(self.offset, array, self.entry.key)
        self.state._count_read(array.nbytes)
        return array.nbytes

    def write(self, data: memoryview) -> int:
        array = np.frombuffer(data, np.uint8)
        self.entry.source.write_from(self.offset, array, self.entry.key)
        return array.nbytes


def _enqueue_fill(timeline: _Timeline, target: Buffer, offset: int, span: _Span) -> None:
    pattern = span.entry.splat
    wait, signal = timeline.step()
    if len(pattern) in (1, 2, 4):
        timeline.device.queue_fill(target, offset, span.length,
                                   int.from_bytes(pattern, "little"), wait, signal,
                                   len(pattern))
    else:  # 8- and 16-byte patterns: the expanded bytes, written by the queue
        reps = -(-(span.parameter_offset + span.length) // len(pattern))
        data = np.frombuffer(pattern * reps, np.uint8)[
            span.parameter_offset : span.parameter_offset + span.length]
        timeline.device.queue_update(data, target, offset, wait, signal)


def _enqueue_read(state: IoParametersState, timeline: _Timeline, target: Buffer,
                  offset: int, span: _Span) -> None:
    wait, signal = timeline.step()
    timeline.device.queue_read(_ParameterFile(state, span.entry),
                               span.entry.offset + span.parameter_offset,
                               target, offset, span.length, wait, signal)


# -- exports -----------------------------------------------------------------------------


def load(state: IoParametersState, device: Device, queue_affinity: int, wait: Fence | None,
         signal: Fence | None, source_scope: VMBuffer | None, target_queue_affinity: int,
         memory_types: int, buffer_usage: int, key_table: VMBuffer, key_data: VMBuffer,
         spans: VMBuffer) -> VMList:
    """One buffer per key holding its parameter span (see the module docstring)."""
    resolved = _spans(state.index(_scope(source_scope)), key_table, key_data, spans,
                      int(MemoryAccess.READ))
    memory_type = MemoryType(memory_types & 0xFFFFFFFF)
    allocator = device.allocator
    host_heap = bool(allocator.select_heap(memory_type).memory_type & _HOST_VISIBLE)
    usage = allocator.coerce_usage(memory_type, buffer_usage & 0xFFFFFFFF)
    result = VMList("hal.buffer", len(resolved))
    with _Timeline(device, wait, signal) as timeline:
        for span in resolved:
            entry = span.entry
            buffer = None
            if host_heap and usage & _IMMUTABLE and not entry.is_splat:
                start = entry.offset + span.parameter_offset
                view = entry.source.host_view(start, span.length)
                if view is not None:
                    buffer = allocator.import_host(view, memory_type, BufferUsage(usage),
                                                   MemoryAccess.READ)
                    if buffer is not None:
                        state._count_buffer(buffer, imported=True)
            if buffer is None:
                buffer = allocator.allocate(span.length, memory_type, usage | _TRANSFER)
                state._count_buffer(buffer, imported=False)
                if entry.is_splat:
                    _enqueue_fill(timeline, buffer, span.buffer_offset, span)
                else:
                    _enqueue_read(state, timeline, buffer, span.buffer_offset, span)
            result.append(buffer)
    return result


def gather(state: IoParametersState, device: Device, queue_affinity: int,
           wait: Fence | None, signal: Fence | None, source_scope: VMBuffer | None,
           target_buffer: Buffer, key_table: VMBuffer, key_data: VMBuffer,
           spans: VMBuffer) -> None:
    """Copies each key's span into `target_buffer` at its buffer offset."""
    resolved = _spans(state.index(_scope(source_scope)), key_table, key_data, spans,
                      int(MemoryAccess.READ))
    for span in resolved:
        target_buffer.resolve_range(span.buffer_offset, span.length, "gather target")
    state._count_gathered(target_buffer, sum(span.length for span in resolved))
    with _Timeline(device, wait, signal) as timeline:
        for span in resolved:
            if span.entry.is_splat:
                _enqueue_fill(timeline, target_buffer, span.buffer_offset, span)
            else:
                _enqueue_read(state, timeline, target_buffer, span.buffer_offset, span)


def scatter(state: IoParametersState, device: Device, queue_affinity: int,
            wait: Fence | None, signal: Fence | None, source_buffer: Buffer,
            target_scope: VMBuffer | None, key_table: VMBuffer, key_data: VMBuffer,
            spans: VMBuffer) -> None:
    """Writes each span of `source_buffer` into its parameter's storage."""
    resolved = _spans(state.index(_scope(target_scope)), key_table, key_data, spans,
                      int(MemoryAccess.WRITE))
    for span in resolved:
        source_buffer.resolve_range(span.buffer_offset, span.length, "scatter source")
    with _Timeline(device, wait, signal) as timeline:
        for span in resolved:
            wait_points, signal_points = timeline.step()
            device.queue_write(source_buffer, span.buffer_offset,
                               _ParameterFile(state, span.entry),
                               span.entry.offset + span.parameter_offset, span.length,
                               wait_points, signal_points)


# -- the table ---------------------------------------------------------------------------


_BUFFER_ARGS = ("vm.buffer", "vm.buffer", "vm.buffer")
EXPORTS: tuple[Export, ...] = (
    Export("gather", "0rIrrrrrrr_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", "vm.buffer?", "hal.buffer",
            *_BUFFER_ARGS), gather),
    Export("load", "0rIrrrIiirrr_r",
           ("hal.device", None, "hal.fence?", "hal.fence?", "vm.buffer?", None, None, None,
            *_BUFFER_ARGS), load),
    Export("scatter", "0rIrrrrrrr_v",
           ("hal.device", None, "hal.fence?", "hal.fence?", "hal.buffer", "vm.buffer?",
            *_BUFFER_ARGS), scatter),
)

_REF_TYPES = {"hal.device": Device, "hal.fence": Fence, "hal.buffer": Buffer,
              "vm.buffer": VMBuffer}


def create_io_parameters_module(parameters: Any = None) -> NativeModule:
    """An `io_parameters` module serving `parameters` (see `parameter_scopes`); its state
    is `module.state` (`module.state.statistics()` for the parameter memory)."""
    state = IoParametersState(parameter_scopes(parameters))
    return build_module("io_parameters", IO_PARAMETERS_MODULE_VERSION, EXPORTS, state,
                        _REF_TYPES)


# -- what `parameters=` accepts ----------------------------------------------------------


def parameter_scopes(parameters: Any) -> dict[str, ParameterIndex]:
    """The index per scope for `parameters`, which is any of:

    - None: no parameters;
    - a path or a `ParameterIndex`: the anonymous scope `""`;
    - a mapping `{scope: source}` whose source is a path, a `ParameterIndex`, a mapping
      `{key: array or bytes}` (an in-memory index) or a list of those (merged in order);
    - a sequence of paths, indexes and `(scope, source)` pairs.

    Several files for one scope are merged into one index (a key found in two resolves
    to the first), as IREE's tools merge repeated `--parameters=` flags.
    """
    scopes: dict[str, ParameterIndex] = {}
    if parameters is None:
        return scopes
    if isinstance(parameters, Mapping):
        items: Iterable[tuple[str, Any]] = parameters.items()
    elif isinstance(parameters, (str, os.PathLike, ParameterIndex)):
        items = [("", parameters)]
    elif isinstance(parameters, Sequence):
        items = [p if isinstance(p, tuple) else ("", p) for p in parameters]
    else:
        raise InvalidArgumentError(
            f"parameters= takes paths, ParameterIndex objects or a mapping scope -> source, "
            f"not {type(parameters).__name__}")
    for item in items:
        if len(item) != 2 or not isinstance(item[0], str):
            raise InvalidArgumentError(f"a parameter scope must be (scope, source), not {item!r}")
        scope, source = item
        sources = source if isinstance(source, list) else [source]
        for one in sources:
            _add_source(scopes, scope, one)
    return scopes


def _add_source(scopes: dict[str, ParameterIndex], scope: str, source: Any) -> None:
    index = scopes.setdefault(scope, ParameterIndex())
    if isinstance(source, ParameterIndex):
        for entry in source:
            index.add(entry)
    elif isinstance(source, (str, os.PathLike)):
        index.load(source)
    elif isinstance(source, Mapping):
        for key, value in source.items():
            index.add_buffer(key, value)
    else:
        raise InvalidArgumentError(
            f"parameter scope '{scope}': a source is a path, a ParameterIndex or a mapping "
            f"key -> array, not {type(source).__name__}")
