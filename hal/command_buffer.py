"""Command buffers: validated recordings of fill, update, copy, dispatch and barriers.

Recording validates each command once (ranges, usage bits, alignment, export signature)
so drivers receive only valid work. A buffer reference is either direct (a `Buffer` with
offset and length) or indirect (a slot of the binding table supplied at submit time, with
an offset and length inside that slot's range). Recording from two threads at once is a
misuse and is reported instead of corrupting the recording.
"""

from __future__ import annotations

import enum
import sys
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    OutOfRangeError,
)
from .buffer import ALIGNMENT, Buffer
from .executable import (
    MAX_BINDINGS,
    MAX_CONSTANTS,
    MAX_WORKGROUP_COUNT_Z,
    Executable,
    validate_workgroups,
)
from .types import WHOLE_BUFFER, BufferUsage, float32_bits


class CommandBufferMode(enum.Enum):
    ONE_SHOT = "one_shot"
    REUSABLE = "reusable"


class BufferRef(NamedTuple):
    """A buffer range by slot: `slot` >= 0 is a slot of the binding table supplied at
    submit; a negative slot is the command buffer's own `direct[-1 - slot]`, a buffer the
    commands name directly. Slots make a recording independent of the buffers it binds,
    so recordings with equal commands share one executable form (`hal.execution`)."""

    slot: int
    offset: int
    length: int


# The commands are tuples (NamedTuples), so a recording's content compares and hashes in
# C: `tuple(commands)` is the key under which equal recordings share their native form.
# They describe themselves: `op` names the kind and `operands` lists the buffer ranges
# each reads or writes with the usage bits it needs, so code that reads a recording
# never tests a command's class (tests/test_layering.py keeps it so).

_DISPATCH_STORAGE = int(BufferUsage.DISPATCH_STORAGE)
_TRANSFER_SOURCE = int(BufferUsage.TRANSFER_SOURCE)
_TRANSFER_TARGET = int(BufferUsage.TRANSFER_TARGET)


class FillCommand(NamedTuple):
    target: BufferRef
    pattern: bytes
    op = "fill"

    @property
    def operands(self) -> tuple[tuple[BufferRef, int], ...]:
        return ((self.target, _TRANSFER_TARGET),)


class UpdateCommand(NamedTuple):
    source: bytes
    target: BufferRef
    op = "update"

    @property
    def operands(self) -> tuple[tuple[BufferRef, int], ...]:
        return ((self.target, _TRANSFER_TARGET),)


class CopyCommand(NamedTuple):
    source: BufferRef
    target: BufferRef
    op = "copy"

    @property
    def operands(self) -> tuple[tuple[BufferRef, int], ...]:
        return ((self.source, _TRANSFER_SOURCE), (self.target, _TRANSFER_TARGET))


class DispatchCommand(NamedTuple):
    executable: Executable
    ordinal: int
    workgroups: tuple[int, int, int]
    constants: tuple[int, ...]
    bindings: tuple[BufferRef, ...]
    op = "dispatch"

    @property
    def operands(self) -> tuple[tuple[BufferRef, int], ...]:
        return tuple([(ref, _DISPATCH_STORAGE) for ref in self.bindings])


class BarrierCommand(NamedTuple):
    op = "barrier"
    operands = ()


BARRIER = BarrierCommand()

Command = FillCommand | UpdateCommand | CopyCommand | DispatchCommand | BarrierCommand

_new_tuple = tuple.__new__  # `_new_tuple(BufferRef, (slot, offset, length))`: no frame
# (a NamedTuple's own constructor is a Python function: one frame per command)


def _ref_error(value: Any, what: str) -> InvalidArgumentError:
    if isinstance(value, tuple):
        return InvalidArgumentError(
            f"{what} must be a Buffer, (Buffer, offset, length) or a binding slot, "
            f"not a {len(value)}-tuple"
        )
    return InvalidArgumentError(
        f"{what} must be a Buffer, (Buffer, offset, length) or a binding slot, not {value!r}"
    )


def as_table_range(value: Any, what: str) -> tuple[Buffer, int, int]:
    """A binding-table entry (a Buffer or (Buffer, offset, length)), validated."""
    buffer, offset, length = value, 0, WHOLE_BUFFER
    if isinstance(value, tuple):
        if len(value) != 3:
            raise _ref_error(value, what)
        buffer, offset, length = value
    if not isinstance(buffer, Buffer):
        raise _ref_error(value, what)
    buffer.check_live()
    offset, length = buffer.resolve_range(int(offset), int(length), what)
    return buffer, offset, length


_new_command_buffer = object.__new__


class CommandBuffer:
    """A recording of device commands; submit it with `Device.submit`.

    Life cycle: recording (commands may be added) -> `finalize()` -> submittable. One-shot
    command buffers may be submitted once; reusable ones any number of times, each time
    with a binding table filling their indirect slots.
    """

    # Slots: programs that re-record a command buffer per step make and drop one each.
    __slots__ = ("mode", "device", "binding_capacity", "commands", "direct", "_direct_slots",
                 "finalized", "submitted", "max_slot", "recording", "bound",
                 "_recording_lock", "__weakref__")

    def __init__(self, device: Any, mode: str | CommandBufferMode = "one_shot",
                 binding_capacity: int = 0) -> None:
        try:
            self.mode = mode if mode.__class__ is CommandBufferMode else CommandBufferMode(mode)
        except ValueError:
            raise InvalidArgumentError(
                f"command buffer mode must be 'one_shot' or 'reusable', not {mode!r}"
            ) from None
        if not isinstance(binding_capacity, int) or binding_capacity < 0:
            raise InvalidArgumentError(
                f"binding_capacity must be a non-negative int, not {binding_capacity!r}"
            )
        self.device = device
        self.binding_capacity = binding_capacity
        self.commands: list[Command] = []
        # Buffers the commands name directly, by first use: slot -1 - k is direct[k].
        self.direct: list[Buffer] = []
        self._direct_slots: dict[int, int] = {}
        self.finalized = False
        self.submitted = False
        self.max_slot = -1
        # The submit-time form (`hal.execution.Recording`), found or built by the first
        # submit and shared by every command buffer with the same commands.
        self.recording: Any = None
        # What submit binds for `direct` (a `hal.execution.Submission`), when an adopting
        # block made it while checking them; None: submit binds them itself.
        self.bound: Any = None
        self._recording_lock = threading.Lock()

    def __repr__(self) -> str:
        state = "finalized" if self.finalized else "recording"
        return f"<CommandBuffer {self.mode.value} {state} {len(self.commands)} commands>"

    def _record(self, command: Command) -> None:
        lock = self._recording_lock
        if not lock.acquire(False):
            self._refuse(False)
        if self.finalized:
            self._refuse(True)
        self.commands.append(command)
        lock.release()

    def _refuse(self, holding: bool) -> None:
        """Raises why a command cannot be recorded now (releasing the recording lock if
        `holding` it): the command buffer is finalized, or another thread records."""
        if holding:
            self._recording_lock.release()
            raise FailedPreconditionError(f"{self!r} is finalized; no more commands")
        raise FailedPreconditionError(
            f"{self!r} is being recorded from another thread at the same time"
        )

    def _direct_slot(self, buffer: Buffer) -> int:
        slot = self._direct_slots.get(id(buffer))
        if slot is None:
            self.direct.append(buffer)
            slot = self._direct_slots[id(buffer)] = -len(self.direct)
        return slot

    def _ref(self, value: Any, what: str, usage: BufferUsage | int) -> BufferRef:
        """Validates a Buffer, (Buffer, offset, length), slot or (slot, offset, length)
        operand and gives its slot reference (a direct buffer gets a negative slot)."""
        buffer, offset, length = value, 0, WHOLE_BUFFER
        if isinstance(value, tuple):
            if len(value) != 3:
                raise _ref_error(value, what)
            buffer, offset, length = value
            if (type(buffer) is Buffer and type(offset) is int and type(length) is int
                    and 0 <= offset and 0 <= length and offset + length <= buffer.byte_length
                    and buffer.usage_bits & usage == usage and not buffer.storage.released):
                slot = self._direct_slots.get(id(buffer))
                if slot is None:
                    slot = self._direct_slot(buffer)
                return _new_tuple(BufferRef, (slot, offset, length))
        if isinstance(buffer, Buffer):
            buffer.check_live()
            offset, length = buffer.resolve_range(int(offset), int(length), what)
            buffer.validate_usage(usage, what)
            return BufferRef(self._direct_slot(buffer), offset, length)
        if isinstance(buffer, int) and not isinstance(buffer, bool):
            if not 0 <= buffer < self.binding_capacity:
                raise OutOfRangeError(
                    f"{what} names binding slot {buffer} but the command buffer's binding "
                    f"capacity is {self.binding_capacity}"
                )
            if offset < 0 or (length != WHOLE_BUFFER and length < 0):
                raise OutOfRangeError(f"{what} range ({offset}, {length}) is negative")
            if buffer > self.max_slot:
                self.max_slot = buffer
            return BufferRef(buffer, int(offset), int(length))
        raise _ref_error(value, what)

    def fill(self, target: Any, offset: int, length: int, pattern: int | bytes,
             pattern_length: int | None = None) -> None:
        """Fills [offset, offset+length) of `target` with a 1-, 2- or 4-byte pattern.

        `pattern` is bytes, a numpy scalar (its own width: `np.float32(1.5)`, `np.uint16(7)`)
        or an int encoded little-endian in `pattern_length` bytes (default: the smallest of
        1/2/4 that holds it). Offset and length must be
        multiples of the pattern length.
        """
        if isinstance(pattern, (bytes, bytearray)):
            pattern_bytes = bytes(pattern)
        elif hasattr(pattern, "tobytes") and pattern_length is None:
            pattern_bytes = pattern.tobytes()  # np.uint16(7): its own width
        else:
            if pattern_length is None:
                pattern_length = 1 if 0 <= pattern < 256 else 2 if 0 <= pattern < 65536 else 4
            try:
                pattern_bytes = int(pattern).to_bytes(pattern_length, "little",
                                                      signed=pattern < 0)
            except OverflowError:
                raise InvalidArgumentError(
                    f"fill pattern {pattern} does not fit in {pattern_length} bytes"
                ) from None
        n = len(pattern_bytes)
        if n not in (1, 2, 4):
            raise InvalidArgumentError(f"fill pattern must be 1, 2 or 4 bytes, not {n}")
        ref = self._ref(_subrange(target, offset, length), "fill target",
                        _TRANSFER_TARGET)
        if ref.offset % n or (ref.length != WHOLE_BUFFER and ref.length % n):
            raise InvalidArgumentError(
                f"fill offset {ref.offset} and length {ref.length} must be multiples of "
                f"the {n}-byte pattern"
            )
        self._record(_new_tuple(FillCommand, (ref, pattern_bytes)))

    def update(self, source: Any, target: Any, offset: int = 0, length: int | None = None) -> None:
        """Copies host bytes into `target` at `offset`; the source is captured now."""
        data = _host_bytes(source)
        if length is not None:
            if length < 0 or length > len(data):
                raise OutOfRangeError(
                    f"update length {length} exceeds the {len(data)} source bytes"
                )
            data = data[:length]
        ref = self._ref(_subrange(target, offset, len(data)), "update target",
                        _TRANSFER_TARGET)
        self._record(_new_tuple(UpdateCommand, (data, ref)))

    def copy(self, source: Any, source_offset: int, target: Any, target_offset: int,
             length: int) -> None:
        """Copies `length` bytes between buffers (ranges may be in the same buffer)."""
        if isinstance(source, tuple) or isinstance(target, tuple):
            _subrange(source if isinstance(source, tuple) else target, 0, 0)  # raises
        src = self._ref((source, source_offset, length), "copy source", _TRANSFER_SOURCE)
        dst = self._ref((target, target_offset, length), "copy target", _TRANSFER_TARGET)
        if src.length != dst.length and WHOLE_BUFFER not in (src.length, dst.length):
            raise OutOfRangeError(
                f"copy source length {src.length} differs from target length {dst.length}"
            )
        self._record(_new_tuple(CopyCommand, (src, dst)))

    def dispatch(self, executable: Executable, entry: int | str,
                 workgroups: tuple[int, int, int] = (1, 1, 1), constants: Any = (),
                 bindings: Any = ()) -> None:
        """Records a dispatch of `executable`'s export over a 3D grid of workgroups."""
        if not isinstance(executable, Executable):
            raise InvalidArgumentError(f"dispatch needs an Executable, not {executable!r}")
        exports = executable.exports
        if type(entry) is int and 0 <= entry < len(exports):
            ordinal = entry
        else:
            ordinal = executable.resolve_entry(entry)
        export = exports[ordinal]
        grid = workgroups
        if type(grid) is tuple and len(grid) == 3:
            for v in grid:
                if type(v) is not int or not 0 <= v <= _MAX_GRID:
                    grid = validate_workgroups(workgroups)
                    break
        else:
            grid = validate_workgroups(workgroups)
        consts = constants
        if type(consts) is tuple:
            for v in consts:
                if type(v) is not int or not 0 <= v <= 0xFFFFFFFF:
                    consts = _constants(constants)
                    break
        else:
            consts = _constants(constants)
        if len(consts) > MAX_CONSTANTS:
            raise OutOfRangeError(f"{len(consts)} constants exceed the maximum of {MAX_CONSTANTS}")
        if export.constant_count is not None and len(consts) != export.constant_count:
            raise InvalidArgumentError(
                f"export {export.name!r} takes {export.constant_count} constants, got {len(consts)}"
            )
        bindings = list(bindings)
        if len(bindings) > MAX_BINDINGS:
            raise OutOfRangeError(f"{len(bindings)} bindings exceed the maximum of {MAX_BINDINGS}")
        if export.binding_count is not None and len(bindings) < export.binding_count:
            raise InvalidArgumentError(
                f"export {export.name!r} takes {export.binding_count} bindings, got {len(bindings)}"
            )
        refs = []
        direct = self._direct_slots
        for i, b in enumerate(bindings):
            # the common case inline: (Buffer, offset, length) in range, usable, aligned
            if type(b) is tuple and len(b) == 3:
                buffer, offset, length = b
                if (type(buffer) is Buffer and type(offset) is int and type(length) is int
                        and 0 <= offset and 0 <= length
                        and offset + length <= buffer.byte_length
                        and buffer.usage_bits & _DISPATCH_STORAGE == _DISPATCH_STORAGE
                        and not buffer.storage.released
                        and not (buffer.storage.address + buffer.byte_offset + offset)
                        % ALIGNMENT):
                    slot = direct.get(id(buffer))
                    if slot is None:
                        slot = self._direct_slot(buffer)
                    refs.append(_new_tuple(BufferRef, (slot, offset, length)))
                    continue
            ref = self._ref(b, f"binding {i} of {export.name!r}", _DISPATCH_STORAGE)
            if ref.slot < 0:
                check_binding_alignment(self.direct[-1 - ref.slot], ref.offset, i,
                                        export.name)
            refs.append(ref)
        command = _new_tuple(DispatchCommand, (executable, ordinal, grid, consts, tuple(refs)))
        lock = self._recording_lock  # what `_record` does, without its frame
        if not lock.acquire(False):
            self._refuse(False)
        if self.finalized:
            self._refuse(True)
        self.commands.append(command)
        lock.release()

    def barrier(self) -> None:
        """Orders every command before it ahead of every command after it."""
        lock = self._recording_lock  # what `_record` does, without its frame
        if not lock.acquire(False):
            self._refuse(False)
        if self.finalized:
            self._refuse(True)
        self.commands.append(BARRIER)
        lock.release()

    execution_barrier = barrier

    @classmethod
    def adopted(cls, device: Any, mode: CommandBufferMode, binding_capacity: int,
                commands: Sequence[Command], direct: list[Buffer], table_slots: int,
                recording: Any = None, bound: Any = None) -> CommandBuffer:
        """A new command buffer of `device` (`mode` and `binding_capacity` as another
        command buffer's, so already valid) holding `commands`, recorded and validated
        before over numbered slots, with `direct` as its direct buffers (the caller
        checked them against what the commands need: `hal.execution.Recording.adopter`,
        which gives `bound`, the submission that binds them), as if recorded one by one. Given `recording` (the
        recording of exactly these commands for this device), it is also finalized, its
        submit does not look the recording up and binds `direct` as `bound` says; it
        then shares the recording's commands, which nothing appends to. Built without
        `__init__`: a program re-recording a command buffer per step makes one per
        step."""
        if table_slots > binding_capacity:
            raise OutOfRangeError(
                f"the commands use {table_slots} binding slots but the command buffer's "
                f"binding capacity is {binding_capacity}"
            )
        cb = _new_command_buffer(cls)
        cb.mode = mode
        cb.device = device
        cb.binding_capacity = binding_capacity
        cb.direct = direct
        cb.submitted = False
        cb.max_slot = table_slots - 1
        cb._recording_lock = threading.Lock()
        if recording is not None:  # finalized: nothing records over its slots again
            cb.commands = commands
            cb._direct_slots = {}
            cb.finalized = True
            cb.recording = recording
            # what its submit takes as it is when no binding table is needed (its
            # addresses None while a transient buffer's alloca has not run: the stream
            # reads them when it starts, as for any submission validated then)
            cb.bound = bound if not table_slots else None
        else:
            cb.commands = list(commands)
            cb._direct_slots = dict(zip(map(id, direct), range(-1, -1 - len(direct), -1)))
            cb.finalized = False
            cb.recording = None
            cb.bound = None
        return cb

    def finalize(self) -> None:
        if self.finalized:
            raise FailedPreconditionError(f"{self!r} is already finalized")
        self.finalized = True


def check_binding_alignment(buffer: Buffer, offset: int, index: int, export: str) -> None:
    if (buffer.address + offset) % ALIGNMENT:
        raise InvalidArgumentError(
            f"binding {index} of {export!r} starts at offset {offset}, which is not "
            f"{ALIGNMENT}-byte aligned; IREE kernels require aligned bindings"
        )


def _subrange(target: Any, offset: int, length: int) -> Any:
    if isinstance(target, tuple):
        raise InvalidArgumentError("pass the buffer and the offset/length separately")
    return (target, offset, length)


def _host_bytes(source: Any) -> bytes:
    try:
        return memoryview(source).tobytes()  # C order, whatever the layout
    except TypeError:
        raise InvalidArgumentError(
            f"update source must be bytes-like or a numpy array, not {type(source).__name__}"
        ) from None


_MAX_GRID = min(0xFFFFFFFF, MAX_WORKGROUP_COUNT_Z)


def _constants(constants: Any) -> tuple[int, ...]:
    np = sys.modules.get("numpy")  # an array can only come from a program that loaded it
    if np is not None and isinstance(constants, np.ndarray):
        if constants.dtype.itemsize != 4:
            raise InvalidArgumentError(f"constants must be 32-bit values, not {constants.dtype}")
        return tuple(int(v) for v in constants.view(np.uint32).reshape(-1))
    out = []
    for c in constants:
        if isinstance(c, float):
            c = float32_bits(c)
        c = int(c)
        if not -(1 << 31) <= c < (1 << 32):
            raise OutOfRangeError(f"constant {c} does not fit in 32 bits")
        out.append(c & 0xFFFFFFFF)
    return tuple(out)
