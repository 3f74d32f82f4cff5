"""The device: the one public layer that validates queue work, over a queue and a driver.

Every entry point (`submit`, the `queue_*` operations) validates its arguments on the
calling thread and raises `tinyhal.Error` for bad input. What passes goes to the
device's `WorkQueue` (`hal/queue.py`), which owns entries, waits, retirement, close and
device loss, and hands the work to the device's driver once its waits are reached; the
driver is an object the device holds (`Device.driver`), implementing the protocol
`tinyhal.hal.queue.Driver` declares: each queue operation is the driver method of the
same name (`submit` -> `execute`, `queue_fill` -> `fill`, `queue_read` / `queue_write`
-> `host_call`, ...). Work whose waits are already met may skip the entry: a ready
`queue_alloca` takes ring space and a ready `queue_dealloca` gives it back in one call
each, a ready barrier only signals, and a ready submission is handed to the driver at
once without an entry (`WorkQueue.perform_ready`; on a driver whose capabilities say it
`completes_inline`, it has run when `submit` returns). What the device exposes of its
driver is its `capabilities` and `queue_for_affinity`; host reads and writes of memory
the host cannot map go to the driver's `read_direct` / `write_direct` first.

**Resource sets.** From the call until the entry retires (signals, fails or is aborted),
the queue holds a strong reference to everything the work touches: the command buffers
(and through them their executables and directly bound buffers), the binding table and
its buffers, the resolved operations, transient buffers, and host memory or files given
to `queue_read` / `queue_write` / `queue_update`. Kernels and transfers address memory by
raw pointer, so this is what makes dropping every host reference while work is in flight
safe: the memory is freed only after the work retires, and the references are released
before the signal semaphores advance, so a waiter that wakes sees the allocator's live
bytes without them. Drivers need not keep anything alive themselves.

**Closing.** `close()` stops accepting work, fails parked `queue_alloca` reservations
with ABORTED, lets running work finish (and work that running work makes ready), then
fails every entry still waiting on its semaphores with ABORTED (it never runs) and lets
the driver stop its threads; `timeout` bounds the wait. Running work is never
interrupted and its memory is never freed under it. At interpreter exit every live
device is closed the same way (an `atexit` hook, `EXIT_DRAIN_SECONDS` in all), so worker
threads are not left running kernels while the interpreter tears down.

**Profiling** is an instrument: while a session is attached the device records each
queue operation (`Profile.record_submission`) and marks the submission so its native
stream timestamps every operation (`Submission.instrument`); the work runs the same way.

`queue_alloca` memory comes from the device's transient ringbuffer (`self.transient`,
capacity set by the `transient_capacity` option): the buffer is returned at once and gets
its memory when the alloca runs, which waits for ringbuffer space if the ring is full.
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import (
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    as_error,
)
from .buffer import Buffer, RingStorage, as_byte_view, pending_buffer
from .command_buffer import CommandBuffer, as_table_range
from .cpu import cpu_feature
from .executable import (
    Executable,
    check_executable_policy,
    executable_formats,
    load_executable_data,
)
from .execution import RecordingCache, Submission, resolve_commands
from .native import core as _core
from .queue import Alloca, Capabilities, Dealloca, Driver, Operation, WorkQueue, no_work
from .ringbuffer import DEFAULT_CAPACITY, TransientRingbuffer
from .semaphore import (
    Fence,
    Semaphore,
    SemaphoreList,
    SemaphorePoint,
    normalize_wait_signal,
)
from .types import WHOLE_BUFFER, BufferUsage, MemoryType

# any_released(buffers) -> bool (C): whether a buffer of the list (an adopted command
# buffer's direct buffers) was released since it was checked; anything not a Buffer counts
_any_released = _core.any_released

if TYPE_CHECKING:
    from .profile import Profile

Points = SemaphoreList  # the former name of the wait/signal type
_HOST_VISIBLE = int(MemoryType.HOST_VISIBLE)
_MAPPING = int(BufferUsage.MAPPING)


class Device:
    """A logical device: allocator, executables, semaphores and one queue, run by a
    driver it holds (`driver`, see `tinyhal.hal.queue`).

    `executable_policy` (every driver takes it) says which executables the device loads:
    `"any"` (the default), or `"portable"`: only formats without machine code (VMVX), so
    that a model from a source that is not fully trusted never runs its machine code;
    the format query then answers no for the native formats and `load_executable`
    refuses them with PERMISSION_DENIED."""

    def __init__(self, driver: Driver, transient_capacity: int = DEFAULT_CAPACITY, *,
                 executable_policy: str = "any", **options: Any) -> None:
        if not isinstance(driver, Driver):
            raise InvalidArgumentError(f"a device takes a hal.queue.Driver, not {driver!r}")
        self.driver = driver
        self.driver_name = driver.name
        self.identifier = driver.identifier
        capabilities = driver.capabilities
        self.capabilities: Capabilities = capabilities
        """What the driver declares (`hal.queue.Capabilities`): read it, not the name."""
        self.queue_count: int = capabilities.queue_count
        """How many queues the device has (the `queue=` argument of queue operations)."""
        self.concurrency: int = capabilities.concurrency
        """Workers a dispatch may spread over (the driver's)."""
        self.default_profiling_modes: tuple[str, ...] = capabilities.default_profiling_modes
        """The profiling modes a session records by default (the driver's)."""
        self.queue_for_affinity: Callable[[int], int] = driver.queue_for_affinity
        """The queue a program's `queue_affinity` mask (a VM i64, read as IREE's u64)
        picks: the driver's rule (`Driver.queue_for_affinity`; IREE's CPU rule, the mask
        modulo the queue count, unless the driver models an accelerator's)."""
        if options:
            raise InvalidArgumentError(
                f"driver {self.driver_name!r} does not take options {sorted(options)}"
            )
        self.executable_policy = check_executable_policy(executable_policy)
        self.allocator = driver.create_allocator()
        self.allocator.device_ref = weakref.ref(self)
        self._executables: weakref.WeakValueDictionary[str, Executable] = (
            weakref.WeakValueDictionary()
        )
        self._executables_lock = threading.Lock()
        self.transient = TransientRingbuffer(self.allocator, transient_capacity)
        self.work_queue = WorkQueue(repr(self), driver, self.transient)
        # Command buffers with equal commands share one recording and its native programs.
        self.recordings = RecordingCache()
        _live_devices.add(self)
        self.profile: Profile | None = None  # set by Profile.attach; hooks test it
        # (memory type, usage) -> (heap memory type, coerced usage) of queue_alloca buffers
        self._alloca_kinds: dict[tuple[Any, Any], tuple[int, int]] = {}

    def __repr__(self) -> str:
        return f"<Device {self.identifier}>"

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float | None = 60.0) -> None:
        """Stops accepting work and releases the driver; safe with work in flight.

        Running work finishes, and so does work it makes ready (waited for up to
        `timeout` seconds in all); its resources are released when it retires, never
        before. Once nothing runs, entries still waiting on semaphores fail with ABORTED
        and never run, as do parked `queue_alloca` reservations. Calling it again does
        nothing.
        """
        if self.work_queue.close(timeout):
            self.recordings.clear()

    def read_array(self, buffer: Buffer, offset: int = 0, length: int = WHOLE_BUFFER,
                   timeout: float | None = 60.0) -> Any:
        """A new uint8 numpy array with the buffer's bytes (see `read_bytes`)."""
        import numpy as np

        data = self._read_host(buffer, offset, length, timeout)
        return np.frombuffer(data if type(data) is bytearray else bytearray(data), np.uint8)

    def read_bytes(self, buffer: Buffer, offset: int = 0, length: int = WHOLE_BUFFER,
                   timeout: float | None = 60.0) -> bytes:
        """Copies buffer contents to the host: directly from host-visible memory, or from
        memory the host cannot map by the driver's `read_direct` where it takes it, else
        by a queue transfer (in order with nothing else: it waits for nothing)."""
        return bytes(self._read_host(buffer, offset, length, timeout))

    def _read_host(self, buffer: Buffer, offset: int, length: int,
                   timeout: float | None) -> memoryview | bytearray:
        """The bytes: a view of host-visible memory itself (the caller copies it), or a
        new bytearray the driver or the transfer filled."""
        if buffer.storage.released:
            buffer.check_live()
        if offset or not 0 <= length <= buffer.byte_length:
            offset, length = buffer.resolve_range(offset, length, "read")
        if buffer.memory_type_bits & _HOST_VISIBLE and buffer.usage_bits & _MAPPING:
            start = buffer.byte_offset + offset
            return buffer.storage.array[start : start + length]
        read_direct = self.driver.read_direct
        if read_direct is not None:
            data = read_direct(buffer, offset, length)
            if data is not None:
                return data
        host = bytearray(length)
        done = Semaphore()
        self.queue_write(buffer, offset, host, 0, length, signal=[(done, 1)])
        done.wait(1, timeout)
        return host

    def write_bytes(self, buffer: Buffer, data: Any, offset: int = 0,
                    timeout: float | None = 60.0) -> None:
        """Copies host bytes into a buffer: directly into host-visible memory, or into
        memory the host cannot map by the driver's `write_direct` where it takes it, else
        by a queue transfer."""
        if buffer.storage.released:
            buffer.check_live()
        view = as_byte_view(data)
        length = len(view)
        if offset or length > buffer.byte_length:
            offset, length = buffer.resolve_range(offset, length, "write")
        if buffer.memory_type_bits & _HOST_VISIBLE and buffer.usage_bits & _MAPPING:
            start = buffer.byte_offset + offset
            buffer.storage.array[start : start + length] = view
            return
        write_direct = self.driver.write_direct
        if write_direct is not None and write_direct(buffer, view, offset):
            return
        done = Semaphore()
        self.queue_update(view, buffer, offset, signal=[(done, 1)])
        done.wait(1, timeout)

    # -- objects ----------------------------------------------------------------------

    def create_semaphore(self, initial: int = 0) -> Semaphore:
        return Semaphore(initial)

    def create_fence(self, points: Sequence[SemaphorePoint] = ()) -> Fence:
        return Fence(points)

    def create_command_buffer(self, mode: str = "one_shot", binding_capacity: int = 0
                              ) -> CommandBuffer:
        return CommandBuffer(self, mode, binding_capacity)

    def load_executable(self, data: bytes | bytearray | memoryview | os.PathLike | str,
                        name: str = "") -> Executable:
        """Loads an executable (format detected from its bytes), cached by content.

        A device whose `executable_policy` is `"portable"` refuses executables that carry
        machine code (PERMISSION_DENIED naming the executable and the policy)."""
        if isinstance(data, (str, os.PathLike)):
            with open(data, "rb") as f:
                name = name or os.path.basename(os.fspath(data))
                data = f.read()
        elif isinstance(data, (bytes, bytearray, memoryview)):
            data = bytes(data)
        else:
            raise InvalidArgumentError(
                f"load_executable takes bytes or a path, not {type(data).__name__}"
            )
        from _blake2 import blake2b  # hashlib would load OpenSSL (3.5 MiB) at start-up

        key = blake2b(data, digest_size=32).hexdigest()
        with self._executables_lock:
            cached = self._executables.get(key)
            if cached is not None:
                return cached
            executable = load_executable_data(data, name, self.executable_policy)
            self._executables[key] = executable
            return executable

    def query(self, category: str, key: str) -> int:
        """Answers IREE's device queries (`hal.device.id`, `hal.executable.format`, ...)."""
        if category == "hal.device.id":
            return int(fnmatch.fnmatchcase(self.identifier, key))
        if category == "hal.executable.format":
            return int(key in executable_formats(self.executable_policy))
        if category == "hal.device" and key == "concurrency":  # IREE: its queue count
            return self.queue_count
        if category == "hal.dispatch" and key == "concurrency":
            return self.concurrency
        if category == "hal.cpu" and (has := cpu_feature(key)) is not None:
            return int(has)
        raise NotFoundError(f"unknown device query {category!r} :: {key!r}")

    def _check_queue(self, queue: int) -> None:
        if type(queue) is not int or not 0 <= queue < self.queue_count:
            raise InvalidArgumentError(
                f"queue {queue!r} out of range: {self!r} has {self.queue_count} queue(s)")

    # -- profiling --------------------------------------------------------------------

    @contextlib.contextmanager
    def profiling(self, modes: str | Sequence[str] | None = None, capacity: int = 1_000_000
                  ) -> Iterator[Profile]:
        """A profiling session of this device for the `with` block; yields the `Profile`
        (export it with `profile.write(path)` after the block). `modes` as
        `--device_profiling_mode` (default: the driver's `default_profiling_modes`)."""
        if self.profile is not None:
            raise FailedPreconditionError(f"{self!r} is already being profiled")
        from .profile import Profile  # only a profiling run pays for it (and for json)

        profile = Profile(self.identifier, modes or self.default_profiling_modes,
                          queue_count=self.queue_count, capacity=capacity)
        profile.attach(self)
        try:
            yield profile
        finally:
            profile.detach(self)

    # -- queue ------------------------------------------------------------------------

    def submit(self, batch: CommandBuffer | Sequence[CommandBuffer], wait: SemaphoreList = (),
               signal: SemaphoreList = (), binding_table: Sequence[Any] | None = None,
               queue: int = 0) -> None:
        """Queues command buffers to run once `wait` is reached; advances `signal` after.

        `wait` and `signal` are `SemaphoreList`s: `[(semaphore, value), ...]`, a `Fence`
        or None. The host learns the work is done from `signal` (`Semaphore.wait`,
        `Fence.wait`, or a later queue operation waiting on it):

        >>> import numpy as np
        >>> from tinyhal.hal import Semaphore, create_device
        >>> device = create_device("sync")
        >>> buffer = device.allocator.allocate(16)
        >>> commands = device.create_command_buffer()
        >>> commands.fill(buffer, 0, 16, np.float32(1.5))
        >>> commands.finalize()
        >>> done = Semaphore(0)
        >>> device.submit(commands, wait=[], signal=[(done, 1)])
        >>> done.wait(1, timeout=10)
        >>> np.frombuffer(device.read_bytes(buffer), np.float32).tolist()
        [1.5, 1.5, 1.5, 1.5]
        >>> device.close()

        Returns at once. Validation errors raise here; errors while running fail the
        signal semaphores. `queue` picks the device queue (0 .. `queue_count`-1); every
        queue operation takes it.

        `batch` may also be the submission that `Recording.adopter` of one of this
        device's recordings binding no table has just given (no `binding_table`): what
        a submit of the command buffer adopting it would run, its buffers checked live
        by that call. It runs once; a profile records it without command buffers.
        """
        wait_points, signal_points, reached = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        driver = self.driver
        if (batch.__class__ is CommandBuffer and batch.bound is not None
                and binding_table is None and not batch.submitted and batch.device is self
                and not _any_released(batch.direct)):
            # a command buffer that adopted a recording: what it binds, checked then (a
            # released buffer goes the other way, where resolve_commands names it)
            batch_list = [batch]
            ops = batch.bound
            batch.bound = None  # its submission goes once
            batch.submitted = True
        elif batch.__class__ is Submission and binding_table is None:
            batch_list, ops = [], batch  # what `Recording.adopter` gave (see below)
        else:
            batch_list = [batch] if isinstance(batch, CommandBuffer) else list(batch)
            ops = resolve_commands(batch_list, binding_table, self.concurrency,
                                   self.recordings)
        submission_id = 0
        profile = self.profile
        if profile is not None:
            submission_id = profile.record_submission("execute", wait_points, signal_points,
                                                      batch_list, queue=queue)
            if profile.records_host_execution:  # its stream timestamps each operation
                ops.instrument = (profile, submission_id, queue)
        work_queue = self.work_queue
        if reached and work_queue.lost is None:
            work_queue.perform_ready(driver.execute, ops, wait_points, signal_points, queue,
                                     submission_id)
            return
        work_queue.accept(driver.execute, ops, wait_points, signal_points, queue,
                          (batch_list, binding_table), submission_id, reached)

    queue_execute = submit

    def queue_barrier(self, wait: SemaphoreList = (), signal: SemaphoreList = (), queue: int = 0) -> None:
        """Advances `signal` once `wait` is reached; no work."""
        wait_points, signal_points, reached = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        submission_id = 0
        if self.profile is not None:
            submission_id = self.profile.record_submission("barrier", wait_points,
                                                           signal_points, queue=queue)
        elif reached and self.work_queue.lost is None:  # ready: nothing to run or hold
            self.work_queue.check_open()
            self.work_queue.complete(signal_points, None)
            return
        self.work_queue.accept(self.driver.barrier, no_work, wait_points, signal_points,
                               queue, None, submission_id, reached)

    def queue_fill(self, target: Buffer, offset: int, length: int, pattern: int | bytes,
                   wait: SemaphoreList = (), signal: SemaphoreList = (), pattern_length: int | None = None,
                   queue: int = 0) -> None:
        cb = self.create_command_buffer()
        cb.fill(target, offset, length, pattern, pattern_length)
        self._queue_transfer(self.driver.fill, cb, wait, signal, queue)

    def queue_update(self, source: Any, target: Buffer, offset: int = 0,
                     wait: SemaphoreList = (), signal: SemaphoreList = (), length: int | None = None,
                     queue: int = 0) -> None:
        """Writes host bytes into `target`; the source is captured at this call."""
        cb = self.create_command_buffer()
        cb.update(source, target, offset, length)
        self._queue_transfer(self.driver.update, cb, wait, signal, queue)

    def queue_copy(self, source: Buffer, source_offset: int, target: Buffer, target_offset: int,
                   length: int, wait: SemaphoreList = (), signal: SemaphoreList = (), queue: int = 0) -> None:
        cb = self.create_command_buffer()
        cb.copy(source, source_offset, target, target_offset, length)
        self._queue_transfer(self.driver.copy, cb, wait, signal, queue)

    def _queue_transfer(self, operation: Operation, cb: CommandBuffer, wait: SemaphoreList,
                        signal: SemaphoreList, queue: int) -> None:
        """Queues the one-command buffer `cb` of a queue transfer for the driver's
        `operation` (its `fill`, `update` or `copy`), as `submit` queues an execute."""
        cb.finalize()
        wait_points, signal_points, reached = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        ops = resolve_commands([cb], None, self.concurrency, self.recordings)
        submission_id = 0
        profile = self.profile
        if profile is not None:
            submission_id = profile.record_submission("execute", wait_points, signal_points,
                                                      [cb], queue=queue)
            if profile.records_host_execution:
                ops.instrument = (profile, submission_id, queue)
        work_queue = self.work_queue
        if reached and work_queue.lost is None:
            work_queue.perform_ready(operation, ops, wait_points, signal_points, queue,
                                     submission_id)
            return
        work_queue.accept(operation, ops, wait_points, signal_points, queue, ([cb], None),
                          submission_id, reached)

    def queue_read(self, source: Any, source_offset: int, target: Buffer, target_offset: int,
                   length: int, wait: SemaphoreList = (), signal: SemaphoreList = (), queue: int = 0) -> None:
        """Reads `length` bytes from a file (path or binary file object) or host memory."""
        _, offset, length = as_table_range((target, target_offset, length), "read target")
        target.validate_usage(BufferUsage.TRANSFER_TARGET, "read target")
        if isinstance(source, (str, os.PathLike)) or hasattr(source, "readinto"):
            def read() -> None:
                dst = target.host_bytes()[offset : offset + length]
                _read_file(source, source_offset, dst)
        else:
            src = as_byte_view(source)
            if source_offset < 0 or source_offset + length > src.nbytes:
                raise InvalidArgumentError(
                    f"read source range [{source_offset}, {source_offset + length}) overruns "
                    f"the {src.nbytes}-byte source"
                )

            def read() -> None:
                target.host_bytes()[offset : offset + length] = (
                    src[source_offset : source_offset + length])
        self._accept_host_transfer("read", wait, signal, queue, length, (source, target), read)

    def queue_write(self, source: Buffer, source_offset: int, target: Any, target_offset: int,
                    length: int, wait: SemaphoreList = (), signal: SemaphoreList = (), queue: int = 0) -> None:
        """Writes buffer bytes to a file (path or binary file object) or writable host memory."""
        _, offset, length = as_table_range((source, source_offset, length), "write source")
        source.validate_usage(BufferUsage.TRANSFER_SOURCE, "write source")

        def data() -> memoryview:
            return source.host_bytes()[offset : offset + length]

        if isinstance(target, (str, os.PathLike)) or hasattr(target, "write"):
            def write() -> None:
                _write_file(target, target_offset, data())
        else:
            dst = as_byte_view(target)
            if dst.readonly:
                raise InvalidArgumentError("write target host memory is read-only")
            if target_offset < 0 or target_offset + length > dst.nbytes:
                raise InvalidArgumentError(
                    f"write target range [{target_offset}, {target_offset + length}) overruns "
                    f"the {dst.nbytes}-byte target"
                )

            def write() -> None:
                dst[target_offset : target_offset + length] = data()
        self._accept_host_transfer("write", wait, signal, queue, length, (source, target), write)

    def _accept_host_transfer(self, operation: str, wait: SemaphoreList, signal: SemaphoreList, queue: int,
                              length: int, resources: Any, work: Callable[[], None]) -> None:
        """Queues `work`, a host-side read or write of `length` bytes holding `resources`."""
        wait_points, signal_points, reached = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        submission_id = 0
        if self.profile is not None:
            submission_id = self.profile.record_submission(
                operation, wait_points, signal_points, payload_length=length, queue=queue)
        self.work_queue.accept(self.driver.host_call, work, wait_points, signal_points, queue,
                               resources, submission_id, reached)

    def queue_alloca(self, size: int, wait: SemaphoreList = (), signal: SemaphoreList = (),
                     memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
                     usage: BufferUsage = BufferUsage.DEFAULT | BufferUsage.MAPPING,
                     queue: int = 0) -> Buffer:
        """A transient buffer usable once `signal` is reached.

        Its memory comes from the transient ringbuffer when the alloca runs; a full ring
        makes it wait for a `queue_dealloca` to retire space. Only a size larger than the
        whole ring fails, here, with RESOURCE_EXHAUSTED.
        """
        wait_points, signal_points, reached = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        if type(size) is not int or size < 0:
            self.transient.check_size(size)  # raises INVALID_ARGUMENT
        kind = self._alloca_kinds.get((memory_type, usage))
        if kind is None:
            heap = self.allocator.select_heap(memory_type)
            kind = (int(heap.memory_type), self.allocator.coerce_usage(memory_type, usage))
            self._alloca_kinds[(memory_type, usage)] = kind
        work_queue = self.work_queue
        if self.profile is None and work_queue.lost is None and reached:
            # Ready now: the ring places it at once (no driver work, so nothing for
            # close() to wait for; a ring closed meanwhile refuses it), or it takes the
            # queue path below; so does one its driver's memory model refuses (the
            # driver's `alloca` fails it there).
            if work_queue.closed:
                raise FailedPreconditionError(f"{self!r} is closed")
            check = self.driver.check_alloca
            if check is None or check(size) is None:
                buffer = self.transient.commit_new(self.allocator, size, *kind)
                if buffer is not None:
                    work_queue.complete(signal_points, None)
                    return buffer
        buffer = pending_buffer(self.allocator, size, *kind)
        self.transient.check_size(size)  # larger than the whole ring: RESOURCE_EXHAUSTED
        submission_id = 0
        if self.profile is not None:
            submission_id = self.profile.record_submission(
                "alloca", wait_points, signal_points, payload_length=size, queue=queue)
        work_queue.accept(self.driver.alloca, Alloca(buffer.storage, self.transient),
                          wait_points, signal_points, queue, buffer, submission_id, reached)
        return buffer

    def queue_dealloca(self, buffer: Buffer, wait: SemaphoreList = (), signal: SemaphoreList = (),
                       queue: int = 0) -> None:
        """Frees a buffer once `wait` is reached; later use of it is rejected."""
        if not isinstance(buffer, Buffer):
            raise InvalidArgumentError(f"queue_dealloca takes a Buffer, not {buffer!r}")
        if buffer.storage.released:
            buffer.check_live()  # raises FAILED_PRECONDITION
        wait_points, signal_points, reached = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        work_queue = self.work_queue
        if (self.profile is None and work_queue.lost is None
                and reached):
            # Ready now: the ring takes the block back inline (host bookkeeping only, as
            # for a ready alloca).
            if work_queue.closed:
                raise FailedPreconditionError(f"{self!r} is closed")
            storage = buffer.storage
            storage.released = True
            try:
                self.transient.release(storage)
            except BaseException as exc:  # noqa: BLE001 - a grant's failure: the signal's
                work_queue.complete(signal_points, as_error(exc))
                return
            work_queue.complete(signal_points, None)
            return
        submission_id = 0
        if self.profile is not None:
            submission_id = self.profile.record_submission(
                "dealloca", wait_points, signal_points, payload_length=buffer.byte_length,
                queue=queue)
        work_queue.accept(self.driver.dealloca, Dealloca(buffer.storage, self.transient),
                          wait_points, signal_points, queue, buffer, submission_id, reached)

    def queue_allocas(self, requests: Sequence[tuple[int, MemoryType, BufferUsage]],
                      wait: SemaphoreList = (), queue: int = 0
                      ) -> tuple[list[Buffer], Fence | None]:
        """`queue_alloca` of each `(size, memory type, usage)` of `requests`, in order,
        all waiting on `wait`: the buffers, and a fence reached once all of them are
        usable, or None when every one was placed before this returned (usable now).

        The same as one `queue_alloca` per request, each signalling a new fence, and
        the join of those fences (what a recurrent program's step does before it records
        over them), in one call: a request that fails raises as its `queue_alloca`
        would, the ones before it made. Allocas that are ready (no profile recording
        them, `wait` reached, the driver's memory model agreeing, room in the ring) are
        placed here at once; from the first that is not, they take `queue_alloca`'s
        path, one by one."""
        buffers: list[Buffer] = []
        work_queue = self.work_queue
        if (normalize_wait_signal(wait, None)[2] and queue.__class__ is int and not queue
                and self.profile is None and work_queue.lost is None and not work_queue.closed):
            commit_new, allocator, kinds = self.transient.commit_new, self.allocator, \
                self._alloca_kinds
            check = self.driver.check_alloca  # the driver's memory model, if it has one
            for size, memory_type, usage in requests:
                kind = kinds.get((memory_type, usage))
                # not here: an unseen kind, one the driver refuses (its `alloca` fails
                # it), or (None from the ring's commit) a size that is not an int >= 0 or
                # no room in the ring
                if kind is None or check is not None and (
                        size.__class__ is not int or size < 0 or check(size) is not None):
                    break
                buffer = commit_new(allocator, size, *kind)
                if buffer is None:
                    break
                buffers.append(buffer)
            else:
                return buffers, None
        signals = []
        for size, memory_type, usage in requests[len(buffers):]:
            signal = Fence.pending()
            buffers.append(self.queue_alloca(size, wait, signal, memory_type, usage, queue))
            signals.append(signal)
        return buffers, Fence.join(signals)

    def queue_execute_dealloca(self, batch: CommandBuffer | Submission, wait: SemaphoreList,
                               buffer: Buffer, queue: int = 0) -> Fence:
        """Submits `batch` once `wait` is reached, then gives `buffer` back
        (`queue_dealloca`; for a buffer that is not `is_transient`, a `queue_barrier`)
        once it has run: the fence that the give-back signals.

        The same as `submit(batch, wait, ran)` and `queue_dealloca(buffer, ran, freed)`
        with `ran` and `freed` new fences (what a recurrent program's step does with its
        scratch buffer), in one call: errors raise, and failures reach `freed`, as
        theirs would. A ready `batch` that adopted a recording (`CommandBuffer.adopted`)
        is handed to the driver here, as `submit` would; if it has run when the driver
        returns (always, on a driver that `completes_inline`), the buffer's memory goes
        back to the ring here too, and the fence returned is already reached.

        `batch` may instead be an adopted recording's submission, as `submit` takes it,
        handed over without a command buffer built for it. A profile names the command
        buffers it records: while one is attached the caller passes the command buffer
        (one attached in between records this execute without it)."""
        work_queue = self.work_queue
        inline = work_queue.completes_inline
        # an inline driver's outcome comes back as the call's: `ran` is made only if needed
        ran = None if inline else Fence.pending()
        wait_points, ran_points, reached = normalize_wait_signal(wait, ran)
        quiet = (self.profile is None and work_queue.lost is None and queue.__class__ is int
                 and not queue)  # nothing records it, on queue 0
        ops = None
        if reached and quiet:
            if batch.__class__ is Submission:
                ops = batch
            elif (batch.__class__ is CommandBuffer and batch.bound is not None
                    and not batch.submitted and batch.device is self
                    and not _any_released(batch.direct)):
                ops = batch.bound
                batch.bound = None  # its submission goes once
                batch.submitted = True
        if ops is not None:
            outcome = work_queue.perform_ready(self.driver.execute, ops, wait_points,
                                               ran_points, 0)
            if ran is None and outcome is not None:
                ran = _failed_fence(outcome)
        else:
            if ran is None:
                ran = Fence.pending()
            self.submit(batch, wait, ran, None, queue)
        # `ran` None: it ran, inline, with no error
        if (quiet and buffer.__class__ is Buffer
                and (ran is None or normalize_wait_signal(ran, None)[2])
                and work_queue.lost is None and not work_queue.closed):
            storage = buffer.storage
            if not storage.released and self.transient.owns(storage):
                # it ran: the ring takes the block back, as a ready `queue_dealloca` does
                storage.released = True
                try:
                    self.transient.release(storage)
                except BaseException as exc:  # noqa: BLE001 - a grant's failure: the signal's
                    return _failed_fence(as_error(exc))
                # reached: `ran` is the dealloca's signal as well
                return Fence.reached() if ran is None else ran
        if ran is None:
            ran = Fence.reached()
        freed = Fence.pending()
        if not isinstance(buffer, Buffer) or self.is_transient(buffer):
            self.queue_dealloca(buffer, ran, freed, queue)  # (refuses what is not a Buffer)
        else:  # other memory lives on while referenced: the give-back only orders
            self.queue_barrier(ran, freed, queue)
        return freed

    def is_transient(self, buffer: Buffer) -> bool:
        """Whether `buffer` is memory this device's `queue_alloca` made: placed in its
        ring, or still waiting for its alloca to run (on a driver that runs allocas
        later). A program's dealloca gives such memory back and only orders the queue
        for any other buffer."""
        storage = buffer.storage
        return self.transient.owns(storage) or (
            storage.__class__ is RingStorage and storage.block is None
            and not storage.released and buffer.allocator is self.allocator)

    # -- in-flight work ---------------------------------------------------------------

    def wait_idle(self, timeout: float | None = 60.0) -> bool:
        """Waits until every accepted queue entry has retired; False on timeout.

        Entries waiting on semaphores that nobody signals keep the device busy; `close()`
        aborts those.
        """
        return self.work_queue.wait_idle(timeout)

    @property
    def in_flight(self) -> int:
        """Queue operations accepted and not yet retired (waiting or running)."""
        return self.work_queue.in_flight

    @property
    def closed(self) -> bool:
        """Whether `close()` was called (the device accepts no more work)."""
        return self.work_queue.closed

    @property
    def lost(self) -> Error | None:
        """The error the device was lost with (`DeviceLostError`), or None."""
        return self.work_queue.lost


_live_devices: weakref.WeakSet[Device] = weakref.WeakSet()
EXIT_DRAIN_SECONDS = 60.0
"""How long interpreter exit waits, in all, for running device work to finish (assign to
change it; 0 exits at once: work still running keeps its memory, held by its resource
set, and its threads stop with the interpreter)."""


def _failed_fence(error: Error) -> Fence:
    """A new fence failed with `error` (a queue operation's signal, failed before it
    returned)."""
    fence = Fence.pending()
    fence.fail(error)
    return fence


def _close_devices_at_exit() -> None:
    deadline = time.monotonic() + EXIT_DRAIN_SECONDS
    for device in list(_live_devices):
        try:
            device.close(timeout=max(0.0, deadline - time.monotonic()))
        except BaseException:  # noqa: BLE001 - nothing to report to at exit
            pass


atexit.register(_close_devices_at_exit)


def _read_file(source: Any, offset: int, dst: memoryview) -> None:
    if hasattr(source, "readinto"):
        source.seek(offset)
        got = source.readinto(memoryview(dst))
    else:
        with open(source, "rb") as f:
            f.seek(offset)
            got = f.readinto(memoryview(dst))
    if got != dst.nbytes:
        raise InvalidArgumentError(
            f"file read at offset {offset} returned {got} of {dst.nbytes} bytes"
        )


def _write_file(target: Any, offset: int, data: memoryview) -> None:
    if hasattr(target, "write"):
        target.seek(offset)
        target.write(memoryview(data))
        return
    mode = "r+b" if os.path.exists(target) else "wb"
    with open(target, mode) as f:
        f.seek(offset)
        f.write(memoryview(data))


__all__ = ["Device"]
