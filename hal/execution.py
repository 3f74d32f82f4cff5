"""Submitting command buffers: record once, validate only the binding table per submit.

The first submission of a finalized command buffer turns it into a `Recording`: its
commands plus, for every binding-table slot it reads, what the slot must satisfy (usage
bits, the bytes it must span, the offsets that must be 64-byte aligned for kernels).
Buffers the commands name directly become extra slots after the table's, so a recording
is a pure function of one list of `(buffer, offset, length)` entries.

Each submission then only checks its binding table against those per-slot requirements
(`Recording.bind`), on the submitting thread, and yields a `Submission`. A driver runs a
submission either as one native stream (`hal.stream.Stream`, which patches binding
addresses into a stream resolved once per recording), or one operation at a time from
`Submission.operations()`: typed `Fill`, `Update`, `Copy`, `Dispatch` and `Barrier`
operations over concrete `Range`s. When a per-slot check fails, the commands are walked
one by one to name the exact command and operand that cannot run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..errors import Error, FailedPreconditionError, InvalidArgumentError, OutOfRangeError
from .buffer import ALIGNMENT, Buffer
from .command_buffer import (
    BarrierCommand,
    BufferRef,
    CommandBuffer,
    CommandBufferMode,
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

_PATTERN_DTYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32}
_DISPATCH_STORAGE = int(BufferUsage.DISPATCH_STORAGE)
_TRANSFER_SOURCE = int(BufferUsage.TRANSFER_SOURCE)
_TRANSFER_TARGET = int(BufferUsage.TRANSFER_TARGET)


class Range(NamedTuple):
    """`length` bytes of `buffer` from `offset` (relative to the buffer's first byte)."""

    buffer: Buffer
    offset: int
    length: int


_new_range = tuple.__new__  # `_new_range(Range, (buffer, offset, length))`: no Python frame


# -- typed operations ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fill:
    """Fill `target` with `pattern` (a 1-, 2- or 4-byte numpy scalar) repeated."""

    target: Range
    pattern: np.generic
    name = "fill"


@dataclass(frozen=True, slots=True)
class Update:
    """Write `data` (captured host bytes) into `target`."""

    target: Range
    data: bytes
    name = "update"


@dataclass(frozen=True, slots=True)
class Copy:
    """Copy `source` into `target` (same length; the ranges may overlap)."""

    source: Range
    target: Range
    name = "copy"


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run every workgroup of a prepared dispatch."""

    prepared: PreparedDispatch
    name = "dispatch"


@dataclass(frozen=True, slots=True)
class Barrier:
    """Everything before completes before anything after starts."""

    name = "barrier"


Operation = Fill | Update | Copy | Dispatch | Barrier
Transfer = Fill | Update | Copy


def range_bytes(r: Range) -> np.ndarray:
    """The bytes of a range of host-visible memory, as a uint8 view."""
    buffer, offset, length = r
    return buffer.host_bytes()[offset : offset + length]


def run_transfer(op: Transfer) -> None:
    """Runs one fill, update or copy on host-visible memory."""
    if type(op) is Fill:
        range_bytes(op.target).view(op.pattern.dtype)[:] = op.pattern
    elif type(op) is Update:
        range_bytes(op.target)[:] = np.frombuffer(op.data, dtype=np.uint8)
    else:
        range_bytes(op.target)[:] = range_bytes(op.source)


def transfer_bytes(op: Operation) -> int:
    """Bytes a transfer writes (0 for dispatches and barriers)."""
    if type(op) is Fill or type(op) is Update or type(op) is Copy:
        return op.target.length
    return 0


# -- binding tables --------------------------------------------------------------------


def normalize_binding_table(table: BindingTable | None, needed: int) -> list[Range]:
    """Validates binding table entries (Buffer or (Buffer, offset, length))."""
    entries: list[Range] = []
    for i, entry in enumerate(table or ()):
        if type(entry) is Buffer and not entry.storage.released:
            entries.append(Range(entry, 0, entry.byte_length))
            continue
        ref = as_buffer_ref(entry, f"binding table entry {i}", 0)
        entries.append(Range(ref.buffer, ref.offset, ref.length))
    _check_table_size(len(entries), needed)
    return entries


def _check_table_size(have: int, needed: int) -> None:
    if needed > have:
        raise InvalidArgumentError(
            f"command buffer uses binding slot {needed - 1} but the binding table has "
            f"{have} entries"
        )


def _resolve(ref: BufferRef, table: list[Range], usage: int) -> Range:
    """Resolves a reference against the binding table; errors name the slot, and the
    caller adds which command and operand it was."""
    if ref.buffer is not None:
        ref.buffer.check_live()
        return Range(ref.buffer, ref.offset, ref.length)
    buffer, base, base_length = table[ref.slot]
    buffer.check_live()
    if buffer.usage_bits & usage != usage:
        buffer.validate_usage(usage, f"binding slot {ref.slot}")
    length = base_length - ref.offset if ref.length == WHOLE_BUFFER else ref.length
    if length < 0 or ref.offset + length > base_length:
        raise OutOfRangeError(
            f"range [{ref.offset}, {ref.offset + max(length, 0)}) overruns binding slot "
            f"{ref.slot} of {base_length} bytes"
        )
    return Range(buffer, base + ref.offset, length)


def _resolve_operand(ref: BufferRef, table: list[Range], usage: int, what: str) -> Range:
    try:
        return _resolve(ref, table, usage)
    except Error as exc:
        raise exc.with_context(what) from None


def _check_each_command(commands: list[Any], table: list[Range]) -> None:
    """Checks every operand of every command against `table`; raises the first failure
    naming its command and operand (the slow path, taken when a slot check fails)."""
    for cmd in commands:
        if type(cmd) is DispatchCommand:
            name = cmd.executable.exports[cmd.ordinal].name
            for i, ref in enumerate(cmd.bindings):
                try:
                    buffer, offset, _length = _resolve(ref, table, _DISPATCH_STORAGE)
                except Error as exc:
                    raise exc.with_context(f"binding {i} of {name!r}") from None
                if ref.buffer is None:
                    check_binding_alignment(buffer, offset, i, name)
        elif type(cmd) is FillCommand:
            dst = _resolve_operand(cmd.target, table, _TRANSFER_TARGET, "fill target")
            n = len(cmd.pattern)
            if dst.length % n:
                raise InvalidArgumentError(
                    f"fill length {dst.length} is not a multiple of the {n}-byte pattern"
                )
        elif type(cmd) is UpdateCommand:
            _resolve_operand(cmd.target, table, _TRANSFER_TARGET, "update target")
        elif type(cmd) is CopyCommand:
            src = _resolve_operand(cmd.source, table, _TRANSFER_SOURCE, "copy source")
            dst = _resolve_operand(cmd.target, table, _TRANSFER_TARGET, "copy target")
            if src.length != dst.length:
                raise OutOfRangeError(
                    f"copy source length {src.length} differs from target length "
                    f"{dst.length}"
                )


# -- recordings ------------------------------------------------------------------------


class Recording:
    """A finalized command buffer resolved once: its commands over numbered slots.

    Slots `0 .. table_slots-1` are the binding table's; the buffers the commands name
    directly follow as slots `table_slots ..` (`direct`). For each table slot the
    recording knows the usage bits its commands need (`slot_usage`), the bytes they
    reach (`slot_end`), and the offsets that dispatches bind inside it (`slot_align`,
    each a residue that must keep the address 64-byte aligned). `streams` is a pool of
    native streams resolved from this recording, owned by `hal.stream`.
    """

    __slots__ = ("commands", "table_slots", "direct", "direct_slot", "slot_usage",
                 "slot_end", "slot_align", "exact", "single_workgroup", "fixed_transfer_bytes",
                 "max_concurrency", "patterns", "streams")

    def __init__(self, command_buffer: CommandBuffer, max_concurrency: int) -> None:
        self.commands = list(command_buffer.commands)
        self.max_concurrency = max_concurrency
        n = self.table_slots = command_buffer.max_slot + 1
        self.direct: list[Buffer] = []
        self.direct_slot: dict[int, int] = {}
        usage = [0] * n
        end = [0] * n
        align: list[set[int]] = [set() for _ in range(n)]
        self.exact = True
        self.single_workgroup = True
        self.fixed_transfer_bytes = 0
        self.patterns: dict[int, np.generic] = {}
        self.streams: list[Any] = []

        def use(ref: BufferRef, bits: int, transfer: bool) -> None:
            if ref.buffer is not None:
                if id(ref.buffer) not in self.direct_slot:
                    self.direct_slot[id(ref.buffer)] = n + len(self.direct)
                    self.direct.append(ref.buffer)
                return
            usage[ref.slot] |= bits
            if ref.length == WHOLE_BUFFER:
                end[ref.slot] = max(end[ref.slot], ref.offset)
                if transfer:
                    self.exact = False  # lengths depend on the table: check each command
            else:
                end[ref.slot] = max(end[ref.slot], ref.offset + ref.length)

        for index, cmd in enumerate(self.commands):
            if type(cmd) is DispatchCommand:
                x, y, z = cmd.workgroups
                if x * y * z > 1:
                    self.single_workgroup = False
                for ref in cmd.bindings:
                    use(ref, _DISPATCH_STORAGE, False)
                    if ref.buffer is None:
                        align[ref.slot].add(ref.offset % ALIGNMENT)
            elif type(cmd) is FillCommand:
                use(cmd.target, _TRANSFER_TARGET, True)
                self.patterns[index] = np.frombuffer(
                    cmd.pattern, dtype=_PATTERN_DTYPES[len(cmd.pattern)])[0]
                self.fixed_transfer_bytes += max(cmd.target.length, 0)
            elif type(cmd) is UpdateCommand:
                use(cmd.target, _TRANSFER_TARGET, True)
                self.fixed_transfer_bytes += len(cmd.source)
            elif type(cmd) is CopyCommand:
                use(cmd.source, _TRANSFER_SOURCE, True)
                use(cmd.target, _TRANSFER_TARGET, True)
                self.fixed_transfer_bytes += max(cmd.target.length, cmd.source.length, 0)
        self.slot_usage = usage
        self.slot_end = end
        self.slot_align = [tuple(sorted(a)) for a in align]

    def slot_of(self, ref: BufferRef) -> int:
        """The slot a reference reads: its table slot, or its direct buffer's slot."""
        return ref.slot if ref.buffer is None else self.direct_slot[id(ref.buffer)]

    def bind(self, table: BindingTable | None) -> list[Range]:
        """Checks `table` against what the recording needs; returns every slot's range
        (table slots, then direct buffers). Only what differs per submission is checked:
        table entries, and that direct buffers are still live."""
        n = self.table_slots
        table = table or ()
        if n > len(table):
            _check_table_size(len(table), n)
        entries: list[Range] = []
        usage, end, align = self.slot_usage, self.slot_end, self.slot_align
        ok = True
        for i in range(n):
            entry = table[i]
            if type(entry) is tuple and len(entry) == 3:
                buffer, base, length = entry
                if (type(buffer) is not Buffer or type(base) is not int
                        or type(length) is not int or base < 0 or length < 0
                        or base + length > buffer.byte_length):
                    buffer, base, length = _normalize_entry(entry, i)
            elif type(entry) is Buffer:
                buffer, base, length = entry, 0, entry.byte_length
            else:
                buffer, base, length = _normalize_entry(entry, i)
            bits = usage[i]
            if (buffer.storage.released or buffer.usage_bits & bits != bits
                    or end[i] > length):
                ok = False
            elif align[i]:
                start = buffer.storage.address + buffer.byte_offset + base
                for residue in align[i]:
                    if (start + residue) % ALIGNMENT:
                        ok = False
            entries.append(_new_range(Range, (buffer, base, length)))
        for buffer in self.direct:
            if buffer.storage.released:
                ok = False
            entries.append(_new_range(Range, (buffer, 0, buffer.byte_length)))
        if not ok or not self.exact:
            _check_each_command(self.commands, entries)
            if not ok:  # pragma: no cover - the per-slot checks only fail what it fails
                raise FailedPreconditionError("binding table rejected")
        return entries

    def operations(self, entries: list[Range]) -> list[Operation]:
        """The recording's typed operations over `entries` (from `bind`), for drivers
        that run operations one at a time; called when the submission starts, since a
        dispatch packs the buffers' addresses."""
        ops: list[Operation] = []

        def resolve(ref: BufferRef) -> Range:
            if ref.buffer is not None:
                return Range(ref.buffer, ref.offset, ref.length)
            buffer, base, length = entries[ref.slot]
            if ref.length != WHOLE_BUFFER:
                length = ref.length
            else:
                length -= ref.offset
            return Range(buffer, base + ref.offset, length)

        for index, cmd in enumerate(self.commands):
            if type(cmd) is DispatchCommand:
                x, y, z = cmd.workgroups
                if not (x and y and z):
                    continue
                ranges = [resolve(ref) for ref in cmd.bindings]
                for r in ranges:
                    r.buffer.check_live()
                    if not r.buffer.storage.address:
                        raise FailedPreconditionError(
                            f"{r.buffer!r} has no memory: its queue_alloca has not run")
                ops.append(Dispatch(cmd.executable.prepare_dispatch(
                    cmd.ordinal, cmd.workgroups, cmd.constants,
                    [b.address + o for b, o, _n in ranges], [n for _b, _o, n in ranges],
                    self.max_concurrency)))
            elif type(cmd) is FillCommand:
                ops.append(Fill(resolve(cmd.target), self.patterns[index]))
            elif type(cmd) is UpdateCommand:
                ops.append(Update(resolve(cmd.target), cmd.source))
            elif type(cmd) is CopyCommand:
                ops.append(Copy(resolve(cmd.source), resolve(cmd.target)))
            elif type(cmd) is BarrierCommand:
                if ops and type(ops[-1]) is not Barrier:
                    ops.append(Barrier())
        return ops


def _normalize_entry(entry: Any, index: int) -> Range:
    if type(entry) is Buffer:
        entry.check_live()
        return Range(entry, 0, entry.byte_length)
    ref = as_buffer_ref(entry, f"binding table entry {index}", 0)
    return Range(ref.buffer, ref.offset, ref.length)


class Submission:
    """Validated command buffers with the slot ranges each reads (`parts`)."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[tuple[Recording, list[Range]]]) -> None:
        self.parts = parts

    def operations(self) -> list[Operation]:
        """Every command buffer's typed operations, in order."""
        ops: list[Operation] = []
        for recording, entries in self.parts:
            ops.extend(recording.operations(entries))
        return ops

    @property
    def single_workgroup(self) -> bool:
        """No dispatch has more than one workgroup (nothing to spread over workers)."""
        return all(recording.single_workgroup for recording, _ in self.parts)

    def transfer_bytes(self) -> int:
        """Bytes the fills, updates and copies write."""
        total = 0
        for recording, entries in self.parts:
            total += (recording.fixed_transfer_bytes if recording.exact
                      else _transfer_bytes_of(recording, entries))
        return total


def _transfer_bytes_of(recording: Recording, entries: list[Range]) -> int:
    total = 0
    for cmd in recording.commands:
        for ref in _transfer_targets(cmd):
            if ref.buffer is None and ref.length == WHOLE_BUFFER:
                total += entries[ref.slot].length - ref.offset
            else:
                total += ref.length
    return total


def _transfer_targets(cmd: Any) -> tuple[BufferRef, ...]:
    if type(cmd) is FillCommand or type(cmd) is UpdateCommand or type(cmd) is CopyCommand:
        return (cmd.target,)
    return ()


def resolve_commands(command_buffers: CommandBuffer | Sequence[CommandBuffer],
                     binding_table: BindingTable | None, max_concurrency: int = 1
                     ) -> Submission:
    """Validates a submission of command buffers against `binding_table`."""
    if type(command_buffers) is list:
        pass
    elif type(command_buffers) is CommandBuffer or not isinstance(command_buffers, Sequence):
        command_buffers = (command_buffers,)
    parts = []
    for cb in command_buffers:
        if type(cb) is not CommandBuffer and not isinstance(cb, CommandBuffer):
            raise InvalidArgumentError(f"submit takes command buffers, not {cb!r}")
        if not cb.finalized:
            raise FailedPreconditionError(f"{cb!r} must be finalized before submit")
        if cb.submitted and cb.mode is CommandBufferMode.ONE_SHOT:
            raise FailedPreconditionError(f"{cb!r} is one-shot and was submitted")
        recording = cb.recording
        if recording is None or recording.max_concurrency != max_concurrency:
            recording = cb.recording = Recording(cb, max_concurrency)
        parts.append((recording, recording.bind(binding_table)))
    for cb in command_buffers:
        cb.submitted = True
    return Submission(parts)
