"""Running a whole submission in C: its recordings resolved once into native streams.

A `NativeProgram` is a recording's operations as an array of `tinyhal_op_t` (dispatches,
fills, copies, updates; barriers need nothing) plus one patch per buffer operand: where
in C memory the operand's address (and length) goes, and which slot it comes from. It
is built once per recording and kept in the recording's pool; every execution takes one
from the pool, and `tinyhal_stream_bind` writes the submission's slot addresses through
the patches, rewinds the cursors and sizes the tiles, in one C call. This is the replay
of a reusable command buffer (IREE's `queue.execute.indirect` with a binding table):
nothing of the command buffer is resolved again, only the binding addresses change.

`tinyhal_run_stream` then runs it: the calling thread leads through the operations in
order, and the native threads of a `StreamHelpers` (the task driver's) help by claiming
tiles of each operation the leader posts (workgroups of a dispatch, 64 KiB of a large
fill or copy). Python runs once per submission (twice
when a leader pauses and another leads on), never per operation or workgroup.

Binding happens when the submission starts (its waits are met), so transient buffers
from `queue_alloca` already have their memory.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import Error, FailedPreconditionError, InternalError, ResourceExhaustedError
from .executable import PreparedDispatch
from .execution import Range, Recording, Submission
from .native import ffi, lib

TILES_PER_PARTICIPANT = 32  # small tiles limit what a descheduled worker holds back
POOL_SIZE = 4  # native programs kept per recording for executions in flight at once
_NULL = ffi.NULL
_WHOLE_SLOT = 0xFFFFFFFFFFFFFFFF


class NativeProgram:
    """One or more recordings' operations in C memory, with their binding patches.

    `slot_bases[k]` is where the k-th recording's slots start in the slot list a bind
    receives (one recording: 0).
    """

    __slots__ = ("ops", "count", "state", "paused", "patches", "patch_count", "dispatches",
                 "names", "local_memory_size", "_keep")

    def __init__(self, recordings: list[Recording]) -> None:
        ops_needed = sum(_op_count(r) for r in recordings)
        ops = ffi.new("tinyhal_op_t[]", max(1, ops_needed))
        sites: list[tuple[int, int, int, Any, Any]] = []
        keep: list[Any] = []
        dispatches: dict[int, PreparedDispatch] = {}
        names: list[str] = []
        lmem = 0
        i = 0
        base = 0
        for recording in recordings:
            def slot(ref: Any, recording: Recording = recording, base: int = base) -> int:
                return base + recording.slot_index(ref)

            for index, cmd in enumerate(recording.commands):
                op = cmd.op
                if op == "dispatch":
                    x, y, z = cmd.workgroups
                    if not (x and y and z):
                        continue
                    count = len(cmd.bindings)
                    prepared = cmd.executable.prepare_dispatch(
                        cmd.ordinal, cmd.workgroups, cmd.constants, [0] * count, [0] * count,
                        recording.max_concurrency)
                    dispatches[i] = prepared
                    c = ops[i]
                    c.kind = lib.TINYHAL_OP_DISPATCH
                    c.length = prepared.total
                    c.fn = prepared.function
                    c.environment = prepared.environment
                    c.state = prepared.state
                    c.local_memory_size = prepared.local_memory_size
                    lmem = max(lmem, prepared.local_memory_size)
                    for j, ref in enumerate(cmd.bindings):
                        sites.append((slot(ref), ref.offset, ref.length,
                                      prepared.binding_addresses + j,
                                      prepared.binding_lengths + j))
                elif op == "fill":
                    pattern = recording.patterns[index]
                    c = ops[i]
                    c.kind = lib.TINYHAL_OP_FILL
                    c.pattern = int.from_bytes(pattern, "little")
                    c.pattern_length = len(pattern)
                    ref = cmd.target
                    sites.append((slot(ref), ref.offset, ref.length,
                                  ffi.addressof(c, "dst"), ffi.addressof(c, "length")))
                elif op == "update":
                    data = ffi.from_buffer(cmd.source)
                    keep.append(data)
                    c = ops[i]
                    c.kind = lib.TINYHAL_OP_COPY
                    c.src = data
                    c.length = len(cmd.source)
                    ref = cmd.target
                    sites.append((slot(ref), ref.offset, ref.length,
                                  ffi.addressof(c, "dst"), ffi.NULL))
                elif op == "copy":
                    c = ops[i]
                    c.kind = lib.TINYHAL_OP_COPY
                    src, dst = cmd.source, cmd.target
                    sites.append((slot(src), src.offset, src.length,
                                  ffi.addressof(c, "src"), ffi.addressof(c, "length")))
                    sites.append((slot(dst), dst.offset, dst.length,
                                  ffi.addressof(c, "dst"), ffi.NULL))
                else:
                    continue
                names.append(op)
                i += 1
            base += recording.slot_count
        patches = ffi.new("tinyhal_patch_t[]", max(1, len(sites)))
        for p, (slot_index, offset, size, address, length) in zip(patches, sites):
            p.slot = slot_index
            p.offset = offset
            p.size = _WHOLE_SLOT if size < 0 else size
            p.address = address
            p.length = length
        self.ops = ops
        self.count = i
        self.state = ffi.new("tinyhal_stream_t*")
        self.paused = ffi.new("int*")
        self.patches = patches
        self.patch_count = len(sites)
        self.dispatches = dispatches
        self.names = names
        self.local_memory_size = lmem
        self._keep = keep  # never the recording: a cycle would outlive its buffers

    def error(self, rc: int) -> Error:
        """The error for a failed run (status `rc`)."""
        if rc == -12:
            return ResourceExhaustedError(
                f"no memory for {self.local_memory_size} bytes of workgroup local memory"
            )
        state = self.state
        prepared = self.dispatches.get(state.failed_op)
        if prepared is None:
            return InternalError(f"stream failed with status {rc}")
        return prepared.error_for(rc, state.failed_workgroup)


def _op_count(recording: Recording) -> int:
    n = 0
    for cmd in recording.commands:
        if cmd.op == "dispatch":
            x, y, z = cmd.workgroups
            n += bool(x and y and z)
        elif cmd.op != "barrier":
            n += 1
    return n


class Stream:
    """One execution of a submission in C: a native program bound to the submission's
    buffers, ready for its participants.

    `Stream.start(submission, participants)` makes one when the submission starts: it
    takes a native program from the recording's pool (building one only when all are in
    flight) and binds the submission's buffers. `lead` makes one of a program it bound
    and paused. Both build it through the one constructor, `Stream(program, pool,
    entries, instrument, times)`: the bound program, the pool it goes back to (None: a
    program of several recordings, not kept), the submission's parts (their buffers stay
    alive while the stream may run), and the instrument and timestamps of a profiled run
    (None otherwise).
    """

    __slots__ = ("_program", "_pool", "_entries", "_instrument", "_times")

    def __init__(self, program: NativeProgram, pool: list[NativeProgram] | None,
                 entries: Any, instrument: tuple | None, times: Any) -> None:
        self._program = program
        self._pool = pool
        self._entries = entries
        self._instrument = instrument
        self._times = times

    @classmethod
    def start(cls, submission: Submission, participants: int = 1) -> Stream:
        """A stream of `submission` (whose waits are met), bound for `participants`
        threads."""
        parts = submission.parts
        if len(parts) == 1:
            recording = parts[0][0]
            program = _take_program(recording)
            pool = recording.streams
        else:
            program = NativeProgram([r for r, _e in parts])
            pool = None
        _bind(program, submission, participants)
        instrument = submission.instrument
        return cls(program, pool, parts, instrument,
                   None if instrument is None else _timestamps(program))

    def run(self, helpers: StreamHelpers | None = None, budget_us: int = 0) -> bool:
        """Leads the stream on the calling thread, with `helpers`' threads joining its
        dispatches (None: alone). Returns True once it is done; raises its error.

        With a nonzero `budget_us` it may return False instead, with work left, once that
        long has passed: the helpers go on with the dispatch in progress and a later
        `run` (on any thread) leads the rest. A paused stream must be run to the end
        (`abort()` first makes that quick).

        A stream that has ended lets go of the submission's buffers here, so a stream
        object its driver still holds after completing the work keeps no memory alive.
        """
        program = self._program
        paused = program.paused
        rc = lib.tinyhal_run_stream(ffi.NULL if helpers is None else helpers.pool,
                                    program.ops, program.count, program.state,
                                    program.local_memory_size, budget_us * 1000, paused)
        if not rc and paused[0]:
            return False
        self._entries = ()
        if self._instrument is not None:
            record_timestamps(program, self._times, self._instrument, rc)
        if rc:
            raise program.error(rc)
        return True

    @property
    def done(self) -> bool:
        return bool(self._program.state.done)

    def abort(self) -> None:
        """Makes the rest of a paused stream skip its remaining operations."""
        self._program.state.abort = 1

    def __del__(self) -> None:
        pool = self._pool
        if pool is not None and len(pool) < POOL_SIZE and not self._program.state.posted:
            pool.append(self._program)


class StreamHelpers:
    """Native threads (no Python, no GIL) that join the dispatches of streams led by
    other threads: `Stream.lead` posts its stream to them and they claim workgroup tiles.

    `idle_spin_us` is how long a helper stays awake after a stream before it sleeps, so
    that back-to-back submissions do not pay a wake-up each. `stop()` joins the threads
    (streams still led then run on without helpers); dropping the object does too.
    """

    __slots__ = ("pool", "count")

    def __init__(self, count: int, idle_spin_us: int = 0, steer: bool = True) -> None:
        started = ffi.new("uint32_t*")
        pool = lib.tinyhal_pool_create(count, idle_spin_us * 1000, int(steer), started)
        if pool == ffi.NULL:
            raise ResourceExhaustedError("no memory for stream helper threads")
        self.pool = ffi.gc(pool, lib.tinyhal_pool_free)
        self.count = int(started[0])

    def stop(self) -> None:
        lib.tinyhal_pool_stop(self.pool)


def lead(submission: Submission, helpers: StreamHelpers | None = None,
         budget_us: int = 0) -> Stream | None:
    """Runs a submission whose waits are met, led by the calling thread, with `helpers`'
    threads joining its dispatches (None: alone): binding and running are one C call.

    Returns None once it ran to the end (raising its error), or, when a nonzero
    `budget_us` passed first with work left, the paused `Stream` whose rest a later
    `Stream.run` (on any thread) leads. `lead(submission)` is the `sync` driver's path."""
    parts = submission.parts
    participants = 1 if helpers is None else 1 + helpers.count
    if len(parts) != 1:
        stream = Stream.start(submission, participants)
        return None if stream.run(helpers, budget_us) else stream
    recording = parts[0][0]
    pool = recording.streams
    program = pool.pop() if pool else NativeProgram([recording])
    addresses = submission.addresses
    if helpers is None and not budget_us and addresses is not None and (
            submission.instrument is None):
        # alone, unbounded, untimed (the sync driver's path): it cannot pause, so the
        # program is back in the pool once the call returns (an interrupt in between
        # only costs the pool that program)
        rc = lib.tinyhal_bind_and_run(_NULL, program.ops, program.count, program.state,
                                      program.patches, program.patch_count, addresses,
                                      submission.lengths, 1, TILES_PER_PARTICIPANT,
                                      program.local_memory_size, _NULL, 0, program.paused)
        error = program.error(rc) if rc else None  # read before another run rebinds it
        if len(pool) < POOL_SIZE:
            pool.append(program)
        if error is not None:
            raise error
        return None
    paused = program.paused
    try:
        instrument = submission.instrument
        times = ffi.NULL if instrument is None else ffi.new(
            "uint64_t[]", 2 * max(1, program.count))
        if addresses is None:
            addresses = _slot_addresses(submission)
        rc = lib.tinyhal_bind_and_run(ffi.NULL if helpers is None else helpers.pool,
                                      program.ops, program.count, program.state,
                                      program.patches, program.patch_count, addresses,
                                      submission.lengths, participants, TILES_PER_PARTICIPANT,
                                      program.local_memory_size, times, budget_us * 1000,
                                      paused)
        if not rc and paused[0]:
            stream = Stream(program, pool, parts, instrument, times)
            program = None  # the stream returns it to the pool once it has run
            return stream
        if instrument is not None:
            record_timestamps(program, times, instrument, rc)
        error = program.error(rc) if rc else None  # read before another run rebinds it
    finally:
        if program is not None:
            if paused[0] and not program.state.done:  # interrupted before it was handed over
                _end_program(program, helpers)
            if len(pool) < POOL_SIZE:
                pool.append(program)
    if error is not None:
        raise error
    return None


def _end_program(program: NativeProgram, helpers: StreamHelpers | None) -> None:
    """Leads a paused program to its end with its remaining operations skipped, so that
    its helpers are free and the program can be bound again."""
    program.state.abort = 1
    lib.tinyhal_run_stream(ffi.NULL if helpers is None else helpers.pool, program.ops,
                           program.count, program.state, program.local_memory_size, 0,
                           program.paused)



def _timestamps(program: NativeProgram) -> Any:
    """Room for the start and end of each of a bound program's operations, which its
    stream then writes (the binding cleared the previous run's)."""
    times = ffi.new("uint64_t[]", 2 * max(1, program.count))
    program.state.times = times
    return times


def record_timestamps(program: NativeProgram, times: Any, instrument: tuple, rc: int) -> None:
    """Records the operations a stream ran, with the times it took, as host spans of the
    profiling session in `instrument` (`(profile, submission_id, queue)`)."""
    profile, submission_id, queue = instrument
    program.state.times = ffi.NULL
    worker = threading.current_thread().name
    failed = program.state.failed_op if rc else -1
    for i, name in enumerate(program.names):
        start, end = times[2 * i], times[2 * i + 1]
        if not start:
            continue  # never reached (an earlier operation failed)
        status = 0 if i != failed else int(program.error(rc).code)
        end = end or start
        prepared = program.dispatches.get(i)
        if prepared is not None:
            state = prepared.state
            groups = (state.workgroup_count_x, state.workgroup_count_y,
                      state.workgroup_count_z)
            profile.record_dispatch(prepared.executable, prepared.export.name, groups, start,
                                    end, submission_id, queue=queue, worker=worker,
                                    status_code=status)
        else:
            profile.record_execution(name, start, end, submission_id, queue=queue,
                                     worker=worker, status_code=status,
                                     payload_length=int(program.ops[i].length))


def _take_program(recording: Recording) -> NativeProgram:
    """An idle native program of `recording` from its pool, or a new one."""
    try:
        return recording.streams.pop()
    except IndexError:
        return NativeProgram([recording])


def _bind(program: NativeProgram, submission: Submission, participants: int) -> None:
    """Patches the submission's slot addresses into `program` for one execution; read
    here when a buffer had no memory at validation (naming a used one that still has
    none)."""
    addresses = submission.addresses
    if addresses is None:
        addresses = _slot_addresses(submission)
    lib.tinyhal_stream_bind(program.ops, program.count, program.state, program.patches,
                            program.patch_count, addresses, submission.lengths, participants,
                            TILES_PER_PARTICIPANT)


def _slot_addresses(submission: Submission) -> list[int]:
    """Every slot's address, read when the submission starts because a buffer had no
    memory at validation (naming a used one that still has none)."""
    addresses = []
    for recording, entries in submission.parts:
        table_slots, usage = recording.table_slots, recording.slot_usage
        for index, (buffer, offset, _length) in enumerate(entries):
            storage_address = buffer.storage.address
            if not storage_address and (index >= table_slots or usage[index]):
                _check_has_memory(buffer)
            addresses.append(storage_address + buffer.byte_offset + offset)
    return addresses


def _check_has_memory(buffer: Any) -> None:
    buffer.check_live()
    if not buffer.storage.address:
        raise FailedPreconditionError(f"{buffer!r} has no memory: its queue_alloca has not run")


__all__ = ["NativeProgram", "Stream", "StreamHelpers", "Range", "TILES_PER_PARTICIPANT",
           "lead"]
