"""Submitting command buffers: record once, validate only the binding table per submit.

The first submission of a finalized command buffer turns it into a `Recording`: its
commands plus, for every binding-table slot it reads, what the slot must satisfy (usage
bits, the bytes it must span, the offsets that must be 64-byte aligned for kernels).
Buffers the commands name directly are numbered by the command buffer as it records
and become extra slots after the table's, so a recording holds no buffer and is a pure
function of one list of `(buffer, offset, length)` entries: command buffers with equal
commands share one recording (`RecordingCache`), and a one-shot command buffer that a
program re-records each call finds the recording, and the native programs, of the last.

Each submission then only checks its binding table against those per-slot requirements
(`Recording.bind`), on the submitting thread, and yields a `Submission`. A driver runs a
submission either as one native stream (`hal.stream.Stream`, which patches binding
addresses into a stream resolved once per recording), or one operation at a time from
`Submission.operations()`: typed `Fill`, `Update`, `Copy`, `Dispatch` and `Barrier`
operations over concrete `Range`s. When a per-slot check fails, the commands are walked
one by one to name the exact command and operand that cannot run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..errors import Error, FailedPreconditionError, InvalidArgumentError, OutOfRangeError
from .buffer import ALIGNMENT, Buffer
from .command_buffer import (
    BufferRef,
    CommandBuffer,
    CommandBufferMode,
    as_table_range,
    check_binding_alignment,
)
from .executable import PreparedDispatch
from .native import core as _core
from .types import WHOLE_BUFFER, BufferUsage

BindingTable = Sequence[Any]

SHARED_UPDATE_BYTES = 256  # recordings whose updates capture more are not shared
_DISPATCH_STORAGE = int(BufferUsage.DISPATCH_STORAGE)
_TRANSFER_SOURCE = int(BufferUsage.TRANSFER_SOURCE)
_TRANSFER_TARGET = int(BufferUsage.TRANSFER_TARGET)


class Range(NamedTuple):
    """`length` bytes of `buffer` from `offset` (relative to the buffer's first byte)."""

    buffer: Buffer
    offset: int
    length: int


Entry = tuple  # `(buffer, offset, length)`: a submission's slot, a `Range` by position
"""What `Recording.bind` gives per slot: a plain tuple, which every reader unpacks, since
a named one costs a call to make and a submission makes one per slot."""



# -- typed operations ------------------------------------------------------------------
# (NamedTuples: immutable, told apart by `type(op) is`, and they define several times
# faster than frozen dataclasses, at every start-up)


class Fill(NamedTuple):
    """Fill `target` with `pattern` (1, 2 or 4 bytes) repeated."""

    target: Range
    pattern: bytes
    name = "fill"


class Update(NamedTuple):
    """Write `data` (captured host bytes) into `target`."""

    target: Range
    data: bytes
    name = "update"


class Copy(NamedTuple):
    """Copy `source` into `target` (same length; the ranges may overlap)."""

    source: Range
    target: Range
    name = "copy"


class Dispatch(NamedTuple):
    """Run every workgroup of a prepared dispatch."""

    prepared: PreparedDispatch
    name = "dispatch"


class Barrier(NamedTuple):
    """Everything before completes before anything after starts."""

    name = "barrier"


Operation = Fill | Update | Copy | Dispatch | Barrier
Transfer = Fill | Update | Copy


def range_bytes(r: Range) -> memoryview:
    """The bytes of a range of host-visible memory, as a byte memoryview."""
    buffer, offset, length = r
    return buffer.host_bytes()[offset : offset + length]


def run_transfer(op: Transfer) -> None:
    """Runs one fill, update or copy on host-visible memory."""
    if type(op) is Fill:
        fill_bytes(range_bytes(op.target), op.pattern)
    elif type(op) is Update:
        range_bytes(op.target)[:] = op.data
    else:
        range_bytes(op.target)[:] = range_bytes(op.source)


def fill_bytes(target: memoryview, pattern: bytes) -> None:
    """Repeats `pattern` over `target` (whose length is a multiple of it): the pattern
    once, then the filled prefix copied after itself, doubling, so a fill of n bytes is
    log2(n) copies and no temporary."""
    length = len(target)
    if not length:
        return
    filled = len(pattern)
    target[:filled] = pattern
    while filled < length:
        step = min(filled, length - filled)
        target[filled : filled + step] = target[:step]
        filled += step


# -- binding tables --------------------------------------------------------------------


def _check_table_size(have: int, needed: int) -> None:
    if needed > have:
        raise InvalidArgumentError(
            f"command buffer uses binding slot {needed - 1} but the binding table has "
            f"{have} entries"
        )


def _resolve(ref: BufferRef, table: list[Entry], usage: int) -> Range:
    """Resolves a reference against the slots of a submission (table entries, then the
    direct buffers, which negative slots index from the end); errors name the slot, and
    the caller adds which command and operand it was."""
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


def _resolve_operand(ref: BufferRef, table: list[Entry], usage: int, what: str) -> Range:
    try:
        return _resolve(ref, table, usage)
    except Error as exc:
        raise exc.with_context(what) from None


def _check_each_command(commands: list[Any], table: list[Entry]) -> None:
    """Checks every operand of every command against `table`; raises the first failure
    naming its command and operand (the slow path, taken when a slot check fails)."""
    for cmd in commands:
        op = cmd.op
        dispatch = op == "dispatch"
        name = cmd.executable.exports[cmd.ordinal].name if dispatch else ""
        ranges = []
        for i, (ref, usage) in enumerate(cmd.operands):
            what = (f"binding {i} of {name!r}" if dispatch
                    else f"{op} {'source' if op == 'copy' and i == 0 else 'target'}")
            r = _resolve_operand(ref, table, usage, what)
            if dispatch:
                check_binding_alignment(r.buffer, r.offset, i, name)
            ranges.append(r)
        if op == "fill" and ranges[0].length % len(cmd.pattern):
            raise InvalidArgumentError(
                f"fill length {ranges[0].length} is not a multiple of the "
                f"{len(cmd.pattern)}-byte pattern"
            )
        if op == "copy" and ranges[0].length != ranges[1].length:
            raise OutOfRangeError(
                f"copy source length {ranges[0].length} differs from target length "
                f"{ranges[1].length}"
            )


# -- recordings ------------------------------------------------------------------------


class Recording:
    """A finalized command buffer's commands resolved once, over numbered slots.

    Slots `0 .. table_slots-1` are the binding table's; the buffers the commands name
    directly follow, last first: a command's negative slot -1 - k (the command buffer's
    `direct[k]`) indexes a submission's slot list from its end. A recording holds no buffer: every command buffer with the same
    commands shares one (`RecordingCache`), and with it its pool of native programs
    (`streams`, owned by `hal.stream`), so re-recording the same commands costs what a
    replay costs. For each table slot the recording knows the usage bits its commands
    need (`slot_usage`), the bytes they reach (`slot_end`) and the offsets that
    dispatches bind inside it (`slot_align`, residues that must keep the address 64-byte
    aligned); the same for each direct buffer, which recording checked and `adopter`
    checks of other buffers standing in for them.
    """

    __slots__ = ("commands", "table_slots", "direct_count", "slot_count", "slot_usage",
                 "slot_end", "slot_align", "exact", "max_concurrency",
                 "patterns", "streams", "shareable", "table_needs", "direct_needs")

    def __init__(self, commands: Sequence[Any], table_slots: int, direct_count: int,
                 max_concurrency: int) -> None:
        self.commands = commands
        self.max_concurrency = max_concurrency
        n = self.table_slots = table_slots
        self.direct_count = direct_count
        count = self.slot_count = n + direct_count
        usage = [0] * count
        end = [0] * count
        align: list[set[int]] = [set() for _ in range(count)]
        self.exact = True
        self.patterns: dict[int, bytes] = {}
        self.streams: list[Any] = []
        self.shareable = True  # False: it captured too many host bytes to keep around

        def use(ref: BufferRef, bits: int, transfer: bool) -> None:
            slot = ref.slot
            if slot < 0:
                slot += count
            usage[slot] |= bits
            if ref.length == WHOLE_BUFFER:
                end[slot] = max(end[slot], ref.offset)
                if transfer:
                    self.exact = False  # lengths depend on the table: check each command
            else:
                end[slot] = max(end[slot], ref.offset + ref.length)

        for index, cmd in enumerate(commands):
            op = cmd.op
            dispatch = op == "dispatch"
            for ref, bits in cmd.operands:
                use(ref, bits, not dispatch)
                if dispatch:
                    align[ref.slot].add(ref.offset % ALIGNMENT)  # negative: from the end
            if op == "fill":
                self.patterns[index] = cmd.pattern
            elif op == "update" and len(cmd.source) > SHARED_UPDATE_BYTES:
                self.shareable = False
        self.slot_usage = usage
        self.slot_end = end
        self.slot_align = [tuple(sorted(a)) for a in align]
        # per slot, table slots then direct buffers in slot order (slot -1 last): (usage,
        # end, alignments), what `_core.bind_slots` and `_core.adopt` check
        needs = tuple((int(usage[i]), end[i], self.slot_align[i]) for i in range(count))
        self.table_needs = needs[:n]
        self.direct_needs = needs[n:]

    def adopter(self) -> Callable[[list[Any]], Submission | None]:
        """A function `adopt(direct)`: what a submit of a command buffer holding these
        commands over `direct` (its direct buffers) binds, or None if they may not be
        its direct buffers: each must be a live `Buffer` with the usage bits, the bytes
        and the 64-byte aligned addresses the commands need, which is what recording
        each command checks of its buffers. So a program re-recording equal commands
        over new buffers adopts the recording after this one check per buffer
        (`CommandBuffer.adopted`, given what it returns). The submission's entries,
        addresses and lengths are read in the same pass (the addresses None while a
        buffer has no memory yet); a buffer's bytes, usage and address never change
        once given, so a submit of the adopting command buffer only tests that none
        was released since.

        The check is one C function (`_core.adopt`, which reads the buffers' fields
        where C keeps them) with the recording and its needs bound as data
        (`functools.partial`: no Python frame). It runs once per re-recorded command
        buffer. The caller keeps it; the recording does not, so no cycle holds the
        recording."""
        return functools.partial(_core.adopt, self, self.direct_needs)

    def slot_index(self, ref: BufferRef) -> int:
        """The slot a reference reads, counted from the first table slot."""
        slot = ref.slot
        return slot if slot >= 0 else self.slot_count + slot

    def bind(self, table: BindingTable | None, direct: list[Buffer], addresses: list[int],
             lengths: list[int]) -> tuple[list[Entry], bool]:
        """Checks `table` against what the recording needs; returns every slot's range
        as an `Entry` (table slots, then the `direct` buffers of the command buffer
        submitted, last first), and whether every slot's buffer has memory. Only what
        differs per submission is checked: table entries, and that direct buffers are
        still live.

        The same pass appends each slot's address and length to `addresses` and
        `lengths`, what a native stream binds; they hold when every buffer had memory (an
        address, once given, never changes), otherwise the stream reads them again when
        the submission starts (a transient buffer's `queue_alloca` has run by then)."""
        n = self.table_slots
        table = table or ()
        if n > len(table):
            _check_table_size(len(table), n)
        entries, has_memory, ok = _core.bind_slots(self.table_needs, table, direct, addresses,
                                                   lengths, _normalize_entry)
        if not ok or not self.exact:
            _check_each_command(self.commands, entries)
            if not ok:  # pragma: no cover - the per-slot checks only fail what it fails
                raise FailedPreconditionError("binding table rejected")
        return entries, has_memory

    def operations(self, entries: list[Entry]) -> list[Operation]:
        """The recording's typed operations over `entries` (from `bind`), for drivers
        that run operations one at a time; called when the submission starts, since a
        dispatch packs the buffers' addresses."""
        ops: list[Operation] = []

        def resolve(ref: BufferRef) -> Range:
            buffer, base, length = entries[ref.slot]
            if ref.length != WHOLE_BUFFER:
                length = ref.length
            else:
                length -= ref.offset
            return Range(buffer, base + ref.offset, length)

        for index, cmd in enumerate(self.commands):
            op = cmd.op
            if op == "dispatch":
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
            elif op == "fill":
                ops.append(Fill(resolve(cmd.target), self.patterns[index]))
            elif op == "update":
                ops.append(Update(resolve(cmd.target), cmd.source))
            elif op == "copy":
                ops.append(Copy(resolve(cmd.source), resolve(cmd.target)))
            elif op == "barrier":
                if ops and type(ops[-1]) is not Barrier:
                    ops.append(Barrier())
        return ops


class RecordingCache:
    """A device's recordings by content: command buffers whose commands are equal (same
    executables, ordinals, workgroup counts, constants and slots, with direct buffers
    numbered by first use) share one `Recording` and its native programs.

    Bounded: past `capacity` recordings the least recently used is dropped (its native
    programs with it); `clear()` drops all, as a device does when it closes.
    """

    __slots__ = ("_entries", "capacity")

    def __init__(self, capacity: int = 256) -> None:
        self._entries: dict[Any, Recording] = {}
        self.capacity = capacity

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, command_buffer: CommandBuffer, max_concurrency: int) -> Recording:
        """The recording of `command_buffer`'s commands, found or made."""
        commands = tuple(command_buffer.commands)
        key = (max_concurrency, commands)
        entries = self._entries
        recording = entries.pop(key, None)
        if recording is None:
            recording = Recording(commands, command_buffer.max_slot + 1,
                                  len(command_buffer.direct), max_concurrency)
            if not recording.shareable:
                return recording
            if len(entries) >= self.capacity:
                try:
                    del entries[next(iter(entries))]
                except (StopIteration, KeyError, RuntimeError):
                    pass  # another thread evicted it
        entries[key] = recording
        return recording

    def clear(self) -> None:
        self._entries.clear()


def _normalize_entry(entry: Any, index: int) -> Range:
    buffer, offset, length = as_table_range(entry, f"binding table entry {index}")
    return Range(buffer, offset, length)


class Submission(_core.SubmissionCore):
    """Validated command buffers with the slot ranges each reads (`parts`).

    `addresses` and `lengths` are every part's slot addresses and lengths in order, as a
    native stream binds them, read when the submission was validated; `addresses` is None
    when a buffer had no memory then (the stream reads them when it starts).
    `instrument` is None, or `(profile, submission_id, queue)` while a profiling session
    records: the stream that runs it then timestamps each operation into the profile.

    `Submission(parts, addresses=None, lengths=[])`: its fields live in C
    (`SubmissionCore`), whose one constructor also makes the submissions that
    `Recording.adopter` checks."""

    __slots__ = ()

    def operations(self) -> list[Operation]:
        """Every command buffer's typed operations, in order."""
        ops: list[Operation] = []
        for recording, entries in self.parts:
            ops.extend(recording.operations(entries))
        return ops

    def release(self) -> None:
        """Drops the submission's buffer references once its work has retired: a driver
        thread may still hold the submission (in a frame, a task or a closure) when its
        signal wakes a waiter, and must not keep the buffers' memory alive then."""
        self.parts = ()


_core.register(submission=Submission)


def resolve_commands(command_buffers: CommandBuffer | Sequence[CommandBuffer],
                     binding_table: BindingTable | None, max_concurrency: int = 1,
                     recordings: RecordingCache | None = None) -> Submission:
    """Validates a submission of command buffers against `binding_table`; recordings
    come from `recordings` (shared by content) or are made per command buffer."""
    if type(command_buffers) is list:
        pass
    elif type(command_buffers) is CommandBuffer or not isinstance(command_buffers, Sequence):
        command_buffers = (command_buffers,)
    parts = []
    addresses: list[int] = []
    lengths: list[int] = []
    has_memory = True
    for cb in command_buffers:
        if type(cb) is not CommandBuffer and not isinstance(cb, CommandBuffer):
            raise InvalidArgumentError(f"submit takes command buffers, not {cb!r}")
        if not cb.finalized:
            raise FailedPreconditionError(f"{cb!r} must be finalized before submit")
        if cb.submitted and cb.mode is CommandBufferMode.ONE_SHOT:
            raise FailedPreconditionError(f"{cb!r} is one-shot and was submitted")
        recording = cb.recording
        if recording is None or recording.max_concurrency != max_concurrency:
            if recordings is not None:
                recording = recordings.get(cb, max_concurrency)
            else:
                recording = Recording(tuple(cb.commands), cb.max_slot + 1, len(cb.direct),
                                      max_concurrency)
            cb.recording = recording
        bound = cb.bound  # what adopting the recording bound (`Recording.adopter`)
        if bound is not None:
            for buffer in cb.direct:
                if buffer.storage.released:
                    break  # bind names it
            else:
                if bound.addresses is None:  # a buffer had no memory when it was adopted
                    has_memory = False
                else:
                    addresses += bound.addresses
                lengths += bound.lengths
                parts.append((recording, bound.parts[0][1]))
                continue
        entries, bound_all = recording.bind(binding_table, cb.direct, addresses, lengths)
        parts.append((recording, entries))
        has_memory = has_memory and bound_all
    for cb in command_buffers:
        cb.submitted = True
    return Submission(parts, addresses if has_memory else None, lengths)
