"""Turning a finalized command buffer plus a binding table into runnable operations.

`resolve_commands` runs at submit time on the submitting thread: it resolves indirect
bindings against the binding table, re-validates ranges and alignment, and packs each
dispatch into a `PreparedDispatch`. The result is a list of plain operations a driver runs
in order (as a `Stream`, or one by one with `run_transfer` and `PreparedDispatch.run`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import Error, FailedPreconditionError, InvalidArgumentError, OutOfRangeError
from .buffer import ALIGNMENT, Buffer
from .command_buffer import (
    BarrierCommand,
    BufferRef,
    CommandBuffer,
    CopyCommand,
    DispatchCommand,
    FillCommand,
    UpdateCommand,
    as_buffer_ref,
    check_binding_alignment,
)
from .executable import PreparedDispatch
from .types import WHOLE_BUFFER, BufferUsage

BindingTable = Sequence[Any]
Resolved = tuple[Buffer, int, int]

FILL, UPDATE, COPY, DISPATCH, BARRIER = range(5)
_PATTERN_DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32}
_DISPATCH_STORAGE = int(BufferUsage.DISPATCH_STORAGE)
_TRANSFER_SOURCE = int(BufferUsage.TRANSFER_SOURCE)
_TRANSFER_TARGET = int(BufferUsage.TRANSFER_TARGET)


def normalize_binding_table(table: BindingTable | None, needed: int) -> list[Resolved]:
    """Validates binding table entries (Buffer or (Buffer, offset, length))."""
    entries: list[Resolved] = []
    for i, entry in enumerate(table or ()):
        if type(entry) is Buffer and not entry.storage.released:
            entries.append((entry, 0, entry.byte_length))
            continue
        ref = as_buffer_ref(entry, f"binding table entry {i}", 0)
        entries.append((ref.buffer, ref.offset, ref.length))
    if needed > len(entries):
        raise InvalidArgumentError(
            f"command buffer uses binding slot {needed - 1} but the binding table has "
            f"{len(entries)} entries"
        )
    return entries


def _resolve(ref: BufferRef, table: list[Resolved], usage: int) -> Resolved:
    """Resolves a reference against the binding table; errors name the slot, and the
    caller adds which command and operand it was (messages are built only on error)."""
    if ref.buffer is not None:
        ref.buffer.check_live()
        return ref.buffer, ref.offset, ref.length
    buffer, base, base_length = table[ref.slot]
    buffer.check_live()
    if buffer.usage_bits & usage != usage:
        buffer.validate_usage(usage, f"binding slot {ref.slot}")
    length = base_length - ref.offset if ref.length == WHOLE_BUFFER else ref.length
    if ref.offset + length > base_length:
        raise OutOfRangeError(
            f"range [{ref.offset}, {ref.offset + length}) overruns binding slot "
            f"{ref.slot} of {base_length} bytes"
        )
    return buffer, base + ref.offset, length


def _with_context(exc: Error, what: str) -> Error:
    err = type(exc)(f"{what}: {exc.message}")
    err.__cause__ = exc
    return err


def _resolve_operand(ref: BufferRef, table: list[Resolved], usage: int, what: str) -> Resolved:
    try:
        return _resolve(ref, table, usage)
    except Error as exc:
        raise _with_context(exc, what) from None


def _bytes(resolved: Resolved) -> np.ndarray:
    buffer, offset, length = resolved
    return buffer.host_bytes()[offset : offset + length]


def resolve_commands(
    command_buffer: CommandBuffer, binding_table: BindingTable | None, max_concurrency: int = 1
) -> list[tuple]:
    """Validates a submission of `command_buffer` and returns its operations."""
    if not isinstance(command_buffer, CommandBuffer):
        raise InvalidArgumentError(f"submit takes command buffers, not {command_buffer!r}")
    if not command_buffer.finalized:
        raise FailedPreconditionError(f"{command_buffer!r} must be finalized before submit")
    if command_buffer.mode.value == "one_shot":
        if command_buffer.submitted:
            raise FailedPreconditionError(f"{command_buffer!r} is one-shot and was submitted")
    table = normalize_binding_table(binding_table, command_buffer.max_slot + 1)
    ops: list[tuple] = []
    for cmd in command_buffer.commands:
        if isinstance(cmd, DispatchCommand):
            resolved = []
            for i, ref in enumerate(cmd.bindings):
                try:
                    buffer, offset, length = _resolve(ref, table, _DISPATCH_STORAGE)
                except Error as exc:
                    name = cmd.executable.exports[cmd.ordinal].name
                    raise _with_context(exc, f"binding {i} of {name!r}") from None
                if ref.buffer is None and (buffer.storage.address + buffer.byte_offset
                                           + offset) % ALIGNMENT:
                    name = cmd.executable.exports[cmd.ordinal].name
                    check_binding_alignment(buffer, offset, i, name)
                resolved.append((buffer, offset, length))
            x, y, z = cmd.workgroups
            if x and y and z:
                if any(not b.storage.address for b, _o, _n in resolved):
                    # A queue_alloca buffer whose memory arrives when its alloca runs:
                    # addresses are taken when the dispatch starts.
                    ops.append((DISPATCH, DeferredDispatch(cmd, resolved, max_concurrency)))
                else:
                    ops.append((DISPATCH, cmd.executable.prepare_dispatch(
                        cmd.ordinal, cmd.workgroups, cmd.constants,
                        [b.address + o for b, o, _n in resolved],
                        [n for _b, _o, n in resolved], max_concurrency)))
        elif isinstance(cmd, FillCommand):
            dst = _resolve_operand(cmd.target, table, _TRANSFER_TARGET, "fill target")
            n = len(cmd.pattern)
            if dst[2] % n:
                raise InvalidArgumentError(
                    f"fill length {dst[2]} is not a multiple of the {n}-byte pattern"
                )
            value = np.frombuffer(cmd.pattern, dtype=_PATTERN_DTYPES[n])[0]
            ops.append((FILL, dst, value))
        elif isinstance(cmd, UpdateCommand):
            dst = _resolve_operand(cmd.target, table, _TRANSFER_TARGET, "update target")
            ops.append((UPDATE, dst, cmd.source))
        elif isinstance(cmd, CopyCommand):
            src = _resolve_operand(cmd.source, table, _TRANSFER_SOURCE, "copy source")
            dst = _resolve_operand(cmd.target, table, _TRANSFER_TARGET, "copy target")
            if src[2] != dst[2]:
                raise OutOfRangeError(
                    f"copy source length {src[2]} differs from target length {dst[2]}"
                )
            ops.append((COPY, src, dst))
        elif isinstance(cmd, BarrierCommand):
            if ops and ops[-1][0] != BARRIER:
                ops.append((BARRIER,))
    command_buffer.submitted = True
    return ops


class DeferredDispatch:
    """A dispatch binding transient memory not yet committed at submit time.

    Behaves like a `PreparedDispatch` (`run`, `raise_for_status`, `total`); the first
    `run` packs the dispatch with the addresses the buffers have by then.
    """

    __slots__ = ("_cmd", "_resolved", "_max_concurrency", "_prepared", "_error", "_lock",
                 "total")

    def __init__(self, cmd: DispatchCommand, resolved: list[Resolved],
                 max_concurrency: int) -> None:
        self._cmd = cmd
        self._resolved = resolved
        self._max_concurrency = max_concurrency
        self._prepared: PreparedDispatch | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        x, y, z = cmd.workgroups
        self.total = x * y * z

    def prepare(self) -> PreparedDispatch:
        with self._lock:
            if self._prepared is None:
                if self._error is not None:
                    raise self._error
                try:
                    for buffer, _offset, _length in self._resolved:
                        buffer.check_live()
                        if not buffer.storage.address:
                            raise FailedPreconditionError(
                                f"{buffer!r} has no memory: its queue_alloca has not run"
                            )
                    cmd = self._cmd
                    self._prepared = cmd.executable.prepare_dispatch(
                        cmd.ordinal, cmd.workgroups, cmd.constants,
                        [b.address + o for b, o, _n in self._resolved],
                        [n for _b, _o, n in self._resolved], self._max_concurrency)
                except BaseException as exc:
                    self._error = exc
                    raise
            return self._prepared

    def run(self, processor_id: int = 0, tile: int = 0) -> int:
        return self.prepare().run(processor_id, tile)

    def raise_for_status(self, rc: int) -> None:
        self.prepare().raise_for_status(rc)


def run_transfer(op: tuple) -> None:
    """Runs one fill, update or copy operation on host-visible memory."""
    kind = op[0]
    if kind == FILL:
        dst = _bytes(op[1])
        value = op[2]
        dst.view(value.dtype)[:] = value
    elif kind == UPDATE:
        _bytes(op[1])[:] = np.frombuffer(op[2], dtype=np.uint8)
    elif kind == COPY:
        _bytes(op[2])[:] = _bytes(op[1])
