"""The device: the one public layer that validates, retains and completes queue work.

Every entry point (`submit`, the `queue_*` operations) validates its arguments on the
calling thread and raises `tinyhal.Error` for bad input. What passes becomes a queue
entry gated by its wait semaphores; once they are reached the device hands the entry to
its driver, and when the driver reports it done the signal semaphores advance, or fail
with the work's error. A wait that fails never runs the work; its failure reaches the
signal semaphores instead.

**Resource sets.** From the call until the entry retires (signals, fails or is aborted),
the device holds a strong reference to everything the work touches: the command buffers
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

The driver contract (what `hal/drivers/*` implement) is documented in `tinyhal.hal.drivers`.

`queue_alloca` memory comes from the device's transient ringbuffer (`self.transient`,
capacity set by the `transient_capacity` option): the buffer is returned at once and gets
its memory when the alloca runs, which waits for ringbuffer space if the ring is full.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import fnmatch
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import (
    AbortedError,
    DeviceLostError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    KernelFaultError,
    NotFoundError,
    UnimplementedError,
    as_error,
)
from .allocator import Allocator
from .buffer import Buffer, Storage, as_byte_view
from .command_buffer import CommandBuffer, as_table_range
from .cpu import cpu_feature
from .executable import (
    Executable,
    check_executable_policy,
    executable_formats,
    load_executable_data,
)
from .execution import RecordingCache, Submission, resolve_commands
from .ringbuffer import DEFAULT_CAPACITY, TransientRingbuffer
from .semaphore import (
    Fence,
    Semaphore,
    SemaphorePoint,
    all_reached,
    normalize_wait_signal,
    when_all_reached,
)
from .types import WHOLE_BUFFER, BufferUsage, MemoryType

if TYPE_CHECKING:
    from .profile import Profile

Points = Fence | Sequence[SemaphorePoint] | None


class Device:
    """A logical device: allocator, executables, semaphores and one queue.

    `executable_policy` (every driver takes it) says which executables the device loads:
    `"any"` (the default), or `"portable"`: only formats without machine code (VMVX), so
    that a model from a source that is not fully trusted never runs its machine code;
    the format query then answers no for the native formats and `load_executable`
    refuses them with PERMISSION_DENIED."""

    driver_name = "base"
    identifier = "local"

    def __init__(self, transient_capacity: int = DEFAULT_CAPACITY, *,
                 executable_policy: str = "any", **options: Any) -> None:
        if options:
            raise InvalidArgumentError(
                f"driver {self.driver_name!r} does not take options {sorted(options)}"
            )
        self.executable_policy = check_executable_policy(executable_policy)
        self.allocator = self._create_allocator()
        self.allocator.device_ref = weakref.ref(self)
        self._executables: weakref.WeakValueDictionary[str, Executable] = (
            weakref.WeakValueDictionary()
        )
        self._executables_lock = threading.Lock()
        self._closed = False
        self._in_flight: set[_Entry] = set()
        self._running = 0
        # Re-entrant: a garbage collection under the lock may free a transient buffer whose
        # ringbuffer retirement grants a parked queue_alloca, which retires its entry.
        self._entries_lock = threading.RLock()
        self._idle = threading.Condition(self._entries_lock)  # for wait_idle() and close()
        self._watchers = 0  # threads waiting on `_idle`; retiring notifies only if any
        self.transient = TransientRingbuffer(self.allocator, transient_capacity)
        # Command buffers with equal commands share one recording and its native programs.
        self.recordings = RecordingCache()
        _live_devices.add(self)
        self.profile: Profile | None = None  # set by Profile.attach; hooks test it
        self._lost: Error | None = None  # set by `_lose`: every entry fails with it
        # (memory type, usage) -> (heap memory type, coerced usage) of queue_alloca buffers
        self._alloca_kinds: dict[tuple[Any, Any], tuple[int, int]] = {}
        # A driver that adds its own checks to an alloca's commit takes the queue path.
        self._inline_alloca = type(self)._commit_alloca is Device._commit_alloca

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
        with self._entries_lock:
            if self._closed:
                return
            self._closed = True
        self.transient.close(AbortedError(
            f"{self!r} closed while a queue_alloca waited for ringbuffer space"))
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait_until(lambda: not self._running, timeout)
        waiting: list[_Entry] = []
        with self._entries_lock:
            for entry in tuple(self._in_flight):
                if entry.state is _WAITING:  # claimed: a late `ready` finds it retired
                    entry.state = _RETIRED
                    self._in_flight.discard(entry)
                    waiting.append(entry)
        for entry in waiting:
            self._finish(entry, AbortedError(f"{self!r} closed before the work ran"))
        self.wait_idle(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self._stop(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.recordings.clear()

    def _create_allocator(self) -> Allocator:
        """The device's allocator; drivers with their own memory model override this."""
        return Allocator(self.identifier)

    def read_array(self, buffer: Buffer, offset: int = 0, length: int = WHOLE_BUFFER,
                   timeout: float | None = 60.0) -> Any:
        """A new uint8 numpy array with the buffer's bytes (see `read_bytes`)."""
        import numpy as np

        data = self._read_host(buffer, offset, length, timeout)
        return np.frombuffer(data if type(data) is bytearray else bytearray(data), np.uint8)

    def read_bytes(self, buffer: Buffer, offset: int = 0, length: int = WHOLE_BUFFER,
                   timeout: float | None = 60.0) -> bytes:
        """Copies buffer contents to the host: directly from host-visible memory, or by
        a queue transfer from memory the host cannot map (and in order with nothing
        else: it waits for nothing)."""
        return bytes(self._read_host(buffer, offset, length, timeout))

    def _read_host(self, buffer: Buffer, offset: int, length: int,
                   timeout: float | None) -> memoryview | bytearray:
        """The bytes: a view of host-visible memory itself (the caller copies it), or a
        new bytearray the transfer filled."""
        buffer.check_live()
        offset, length = buffer.resolve_range(offset, length, "read")
        if buffer.mappable:
            start = buffer.byte_offset + offset
            return buffer.storage.array[start : start + length]
        host = bytearray(length)
        done = Semaphore()
        self.queue_write(buffer, offset, host, 0, length, signal=[(done, 1)])
        done.wait(1, timeout)
        return host

    def write_bytes(self, buffer: Buffer, data: Any, offset: int = 0,
                    timeout: float | None = 60.0) -> None:
        """Copies host bytes into a buffer: directly into host-visible memory, or by a
        queue transfer into memory the host cannot map."""
        buffer.check_live()
        view = as_byte_view(data)
        offset, length = buffer.resolve_range(offset, len(view), "write")
        if buffer.mappable:
            start = buffer.byte_offset + offset
            buffer.storage.array[start : start + length] = view
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

    concurrency = 1
    """Workers a dispatch may spread over (a class attribute or a property per driver)."""

    @property
    def queue_count(self) -> int:
        """How many queues the device has (the `queue=` argument of queue operations)."""
        return 1

    def queue_for_affinity(self, affinity: int) -> int:
        """The queue a program's `queue_affinity` mask (a VM i64, read as IREE's u64) picks.

        IREE's CPU devices (local-task, local-sync) never reject an affinity: the queue
        is the mask modulo the queue count, so on a one-queue device every mask, ANY
        (-1) and bits of queues that do not exist included, is queue 0. A driver
        modelling an accelerator overrides this with IREE's accelerator rule."""
        count = self.queue_count
        return (affinity & 0xFFFF_FFFF_FFFF_FFFF) % count if count > 1 else 0

    def _check_queue(self, queue: int) -> None:
        if type(queue) is not int or not 0 <= queue < self.queue_count:
            raise InvalidArgumentError(
                f"queue {queue!r} out of range: {self!r} has {self.queue_count} queue(s)")

    def _driver_start(self, method: Callable[..., None], payload: Any,
                      wait: list[SemaphorePoint], signal: list[SemaphorePoint], queue: int
                      ) -> Callable[[Completion], None]:
        """How a queue entry starts its driver work: `method(payload, done)`. A driver
        that models queues or dependencies overrides this to pass them along."""
        return functools.partial(method, payload)

    # -- profiling --------------------------------------------------------------------

    completes_inline = False
    """True for a driver whose `_execute` always calls `done` before it returns (`sync`):
    a submission whose waits are met then runs without a queue entry (`_run_ready`)."""

    default_profiling_modes: tuple[str, ...] = ("queue-events", "host-execution", "memory-events")
    profiles_submissions = False
    """True for a driver whose `_execute` takes `submission_id=` while a session records
    (the profile's id of the submission), to tie its spans to the queue submission."""

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

    def submit(self, batch: CommandBuffer | Sequence[CommandBuffer], wait: Points = (),
               signal: Points = (), binding_table: Sequence[Any] | None = None,
               queue: int = 0) -> None:
        """Queues command buffers to run once `wait` is reached; advances `signal` after.

        Returns at once. Validation errors raise here; errors while running fail the
        signal semaphores. `queue` picks the device queue (0 .. `queue_count`-1); every
        queue operation takes it.
        """
        batch_list = [batch] if isinstance(batch, CommandBuffer) else list(batch)
        wait_points, signal_points = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        ops = resolve_commands(batch_list, binding_table, self.concurrency, self.recordings)
        if (self.completes_inline and self.profile is None and self._lost is None
                and (not wait_points or all_reached(wait_points))):
            self._run_ready(signal_points, self._execute, ops)
            return
        if type(self)._driver_start is Device._driver_start:  # the default: no frame
            start = functools.partial(self._execute, ops)
        else:
            start = self._driver_start(self._execute, ops, wait_points, signal_points, queue)
        if self.profile is not None:
            submission_id = self.profile.record_submission(
                "execute", wait_points, signal_points, batch_list, queue=queue)
            if submission_id and self.profiles_submissions:
                start = functools.partial(start, submission_id=submission_id)
        self._accept(wait_points, signal_points, (ops, batch_list, binding_table), start)

    queue_execute = submit

    def queue_barrier(self, wait: Points = (), signal: Points = (), queue: int = 0) -> None:
        """Advances `signal` once `wait` is reached; no work."""
        wait_points, signal_points = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        if self.profile is not None:
            self.profile.record_submission("barrier", wait_points, signal_points, queue=queue)
        self._accept(wait_points, signal_points,
                     None, _no_work)

    def queue_fill(self, target: Buffer, offset: int, length: int, pattern: int | bytes,
                   wait: Points = (), signal: Points = (), pattern_length: int | None = None,
                   queue: int = 0) -> None:
        cb = self.create_command_buffer()
        cb.fill(target, offset, length, pattern, pattern_length)
        cb.finalize()
        self.submit(cb, wait, signal, queue=queue)

    def queue_update(self, source: Any, target: Buffer, offset: int = 0,
                     wait: Points = (), signal: Points = (), length: int | None = None,
                     queue: int = 0) -> None:
        """Writes host bytes into `target`; the source is captured at this call."""
        cb = self.create_command_buffer()
        cb.update(source, target, offset, length)
        cb.finalize()
        self.submit(cb, wait, signal, queue=queue)

    def queue_copy(self, source: Buffer, source_offset: int, target: Buffer, target_offset: int,
                   length: int, wait: Points = (), signal: Points = (), queue: int = 0) -> None:
        cb = self.create_command_buffer()
        cb.copy(source, source_offset, target, target_offset, length)
        cb.finalize()
        self.submit(cb, wait, signal, queue=queue)

    def queue_read(self, source: Any, source_offset: int, target: Buffer, target_offset: int,
                   length: int, wait: Points = (), signal: Points = (), queue: int = 0) -> None:
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
                    length: int, wait: Points = (), signal: Points = (), queue: int = 0) -> None:
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

    def _accept_host_transfer(self, operation: str, wait: Points, signal: Points, queue: int,
                              length: int, resources: Any, work: Callable[[], None]) -> None:
        """Queues `work`, a host-side read or write of `length` bytes holding `resources`."""
        wait_points, signal_points = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        if self.profile is not None:
            self.profile.record_submission(operation, wait_points, signal_points,
                                           payload_length=length, queue=queue)
        self._accept(wait_points, signal_points, resources,
                     self._driver_start(self._call, work, wait_points, signal_points, queue))

    def queue_alloca(self, size: int, wait: Points = (), signal: Points = (),
                     memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
                     usage: BufferUsage = BufferUsage.DEFAULT | BufferUsage.MAPPING,
                     queue: int = 0) -> Buffer:
        """A transient buffer usable once `signal` is reached.

        Its memory comes from the transient ringbuffer when the alloca runs; a full ring
        makes it wait for a `queue_dealloca` to retire space. Only a size larger than the
        whole ring fails, here, with RESOURCE_EXHAUSTED.
        """
        wait_points, signal_points = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        if type(size) is not int or size < 0:
            self.transient.check_size(size)  # raises INVALID_ARGUMENT
        kind = self._alloca_kinds.get((memory_type, usage))
        if kind is None:
            heap = self.allocator.select_heap(memory_type)
            kind = (int(heap.memory_type), self.allocator.coerce_usage(memory_type, usage))
            self._alloca_kinds[(memory_type, usage)] = kind
        buffer = Buffer(self.allocator, Storage(size, array=_NO_BYTES, address=0), 0, size,
                        *kind)
        if (self.profile is None and self._lost is None and self._inline_alloca
                and (not wait_points or all_reached(wait_points))):
            # Ready now: the ring places it at once (no driver work, so nothing for
            # close() to wait for; a ring closed meanwhile refuses it), or it takes the
            # queue path below.
            if self._closed:
                raise FailedPreconditionError(f"{self!r} is closed")
            if self.transient.try_commit(buffer.storage):
                self._complete(signal_points, None)
                return buffer
        self.transient.check_size(size)  # larger than the whole ring: RESOURCE_EXHAUSTED
        if self.profile is not None:
            self.profile.record_submission("alloca", wait_points, signal_points, payload_length=size,
                                           queue=queue)
        self._accept(wait_points, signal_points, buffer,
                     functools.partial(self._commit_alloca, buffer))
        return buffer

    def queue_dealloca(self, buffer: Buffer, wait: Points = (), signal: Points = (),
                       queue: int = 0) -> None:
        """Frees a buffer once `wait` is reached; later use of it is rejected."""
        if not isinstance(buffer, Buffer):
            raise InvalidArgumentError(f"queue_dealloca takes a Buffer, not {buffer!r}")
        if buffer.storage.released:
            buffer.check_live()  # raises FAILED_PRECONDITION
        wait_points, signal_points = normalize_wait_signal(wait, signal)
        if type(queue) is not int or queue:  # queue 0 always exists
            self._check_queue(queue)
        if (self.profile is None and self._lost is None
                and (not wait_points or all_reached(wait_points))):
            # Ready now: `_dealloca` inline (host bookkeeping only, as for a ready alloca).
            if self._closed:
                raise FailedPreconditionError(f"{self!r} is closed")
            try:
                self._dealloca(buffer, functools.partial(self._complete, signal_points))
            except BaseException as exc:  # noqa: BLE001 - a grant's failure: the signal's
                self._complete(signal_points, as_error(exc))
            return
        if self.profile is not None:
            self.profile.record_submission("dealloca", wait_points, signal_points,
                                           payload_length=buffer.byte_length, queue=queue)
        self._accept(wait_points, signal_points, buffer,
                     functools.partial(self._dealloca, buffer))

    # -- in-flight work ---------------------------------------------------------------

    def wait_idle(self, timeout: float | None = 60.0) -> bool:
        """Waits until every accepted queue entry has retired; False on timeout.

        Entries waiting on semaphores that nobody signals keep the device busy; `close()`
        aborts those.
        """
        return self._wait_until(lambda: not self._in_flight and not self._running, timeout)

    def _wait_until(self, condition: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            self._watchers += 1
            try:
                while not condition():
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._idle.wait(left)
            finally:
                self._watchers -= 1
        return True

    @property
    def in_flight(self) -> int:
        """Queue entries accepted and not yet retired (waiting or running)."""
        with self._entries_lock:
            return len(self._in_flight)

    def _accept(self, wait: list[SemaphorePoint], signal: list[SemaphorePoint],
                resources: Any, start: Callable[[Completion], None]) -> None:
        """Registers a queue entry holding `resources`; once `wait` is reached calls
        `start(done)`, and `done(error)` (on any thread, once) retires the entry."""
        runs_now = not wait or all_reached(wait)  # a failed wait takes the slow path
        entry = _Entry(signal, resources, None if runs_now else start)
        with self._entries_lock:
            if self._closed:
                raise FailedPreconditionError(f"{self!r} is closed")
            self._in_flight.add(entry)
            if runs_now:  # nothing left to wait for: it runs now
                entry.state = _RUNNING
                self._running += 1
        done = functools.partial(self._retire, entry)
        if self._lost is not None:
            self._retire(entry, self._lost)
            return
        if runs_now:
            try:
                start(done)
            except BaseException as exc:  # noqa: BLE001 - becomes the entry's error
                self._retire(entry, as_error(exc))
            return

        for sem, value in signal:
            sem.offer_waits(value, wait)

        def ready(error: Error | None) -> None:
            error = error or self._lost
            if error is not None:
                self._retire(entry, error)
                return
            with self._entries_lock:
                if entry.state is not _WAITING:
                    return  # aborted by close() while it waited
                entry.state = _RUNNING
                self._running += 1
                start = entry.start
                entry.start = None
            try:
                start(done)
            except BaseException as exc:  # noqa: BLE001 - becomes the entry's error
                self._retire(entry, as_error(exc))

        when_all_reached(wait, ready)

    def _run_ready(self, signal: list[SemaphorePoint], method: Callable[[Any, Completion], None],
                   payload: Any) -> None:
        """Runs work whose waits are already met on this thread, without a queue entry:
        `method(payload, done)` must call `done` before it returns (`_execute` of a
        driver that `completes_inline`). It counts as running (so
        `close()` and `wait_idle()` wait for it), and the work's references are dropped
        before `signal` advances, as an entry's resource set is."""
        with self._entries_lock:
            if self._closed:
                raise FailedPreconditionError(f"{self!r} is closed")
            self._running += 1
        try:
            outcome: list[Error | None] = []
            try:
                method(payload, outcome.append)
            except BaseException as exc:  # noqa: BLE001 - becomes the work's error
                outcome.append(as_error(exc))
            if type(payload) is Submission:  # the submitting frame still holds it
                payload.release()
            payload = None
            error = outcome[0] if outcome else InternalError(
                f"{self!r} finished inline work without completing it")
            self._complete(signal, error)
        finally:
            with self._entries_lock:
                self._running -= 1
                if self._watchers and not self._running:
                    self._idle.notify_all()
        if type(error) is KernelFaultError:
            self._lose_to_fault(error)

    def _retire(self, entry: _Entry, error: Error | None) -> None:
        with self._entries_lock:
            state = entry.state
            if state is _RETIRED:
                return
            entry.state = _RETIRED
        _release_resources(entry)  # before the signal: a woken waiter sees it
        try:
            self._complete(entry.signal, error)
        finally:
            # Counted as in flight until its signal has readied what depends on it, so
            # close() sees work made ready by running work as running, never as waiting.
            with self._entries_lock:
                self._in_flight.discard(entry)
                if state is _RUNNING:
                    self._running -= 1
                if self._watchers and (not self._running or not self._in_flight):
                    self._idle.notify_all()
        if type(error) is KernelFaultError:
            self._lose_to_fault(error)

    def _lose_to_fault(self, fault: Error) -> None:
        """A kernel faulted: what it wrote before faulting cannot be trusted, so the
        device is lost (as a GPU context is after a kernel fault)."""
        self._lose(DeviceLostError(f"{self!r} lost: a kernel faulted ({fault.message})"))

    def _lose(self, error: Error) -> None:
        """Loses the device: entries waiting on semaphores fail with `error` now, as do
        parked `queue_alloca` reservations and every later entry; the driver fails the
        work it holds. The device stays usable only for `close()`."""
        with self._entries_lock:
            if self._lost is not None:
                return
            self._lost = error
            waiting = [e for e in self._in_flight if e.state is _WAITING]
            for entry in waiting:
                entry.state = _RETIRED
                self._in_flight.discard(entry)
            if self._watchers:
                self._idle.notify_all()
        self.transient.close(error)
        for entry in waiting:
            self._finish(entry, error)

    def _finish(self, entry: _Entry, error: Error | None) -> None:
        # The resource set goes before the signal, so a woken waiter sees it released.
        # (A semaphore that never reaches the wait may keep `ready`, never the set.)
        _release_resources(entry)
        self._complete(entry.signal, error)

    def _complete(self, signal: list[SemaphorePoint], error: Error | None) -> None:
        """Signals (or fails) `signal`. Trampolined: completions that a signal triggers on
        this thread are queued for the outermost call, so chains of thousands of dependent
        submissions, succeeding or failing, never recurse once per link."""
        inline = _inline
        pending = getattr(inline, "pending", None)
        if pending is not None:
            pending.append((signal, error))
            return
        ready: Sequence[Any] = ()
        if error is None:  # the common case: nothing waits on the points, no trampoline
            for index, (sem, value) in enumerate(signal):
                try:
                    ready = sem.advance(value)
                except Error as exc:
                    sem.fail(exc)
                    continue
                if ready:
                    signal = signal[index + 1:]
                    break
            else:
                return
        inline.pending = pending = collections.deque()
        try:
            for tp in ready:  # what the last point advanced reached, before the next point
                tp.callback(None)
            while True:
                for sem, value in signal:
                    if error is not None:
                        sem.fail(error)
                        continue
                    try:
                        sem.signal(value)
                    except Error as exc:
                        sem.fail(exc)
                if not pending:
                    break
                signal, error = pending.popleft()
        finally:
            inline.pending = None

    # -- transient memory -------------------------------------------------------------

    def _commit_alloca(self, buffer: Buffer, done: Completion) -> None:
        storage = buffer.storage

        def granted(block: Any, error: Error | None) -> None:
            if error is None:
                self.transient.commit(storage, block)
            done(error)

        self.transient.reserve(buffer.byte_length, granted)

    def _dealloca(self, buffer: Buffer, done: Completion) -> None:
        storage = buffer.storage
        storage.released = True
        self.transient.release(storage)
        done(None)

    # -- the driver contract (see tinyhal.hal.drivers) --------------------------------

    def _execute(self, ops: Submission, done: Completion) -> None:
        """Runs a submission's resolved operations (its waits are reached) in order, then
        calls `done(error)` once."""
        raise UnimplementedError(f"driver {self.driver_name!r} cannot execute commands")

    def _call(self, work: Callable[[], None], done: Completion) -> None:
        """Runs host work (a file or host-memory transfer; its waits are reached), then
        calls `done(error)` once."""
        raise UnimplementedError(f"driver {self.driver_name!r} cannot run host work")

    def _stop(self, timeout: float | None) -> None:
        """Stops the driver's threads; called by `close()` once no work is running."""


Completion = Callable[[Error | None], None]
_WAITING, _RUNNING, _RETIRED = "waiting", "running", "retired"


class _Entry:
    """One accepted queue entry: its signal points, its resource set and its state."""

    __slots__ = ("signal", "resources", "start", "state")

    def __init__(self, signal: list[SemaphorePoint], resources: Any,
                 start: Callable[[Completion], None] | None) -> None:
        self.signal = signal
        self.resources = resources
        self.start = start  # captures the work; dropped with the resource set
        self.state = _WAITING


def _release_resources(entry: _Entry) -> None:
    """Drops an entry's resource set and its start. A submission is emptied as well:
    driver frames, tasks and closures that ran it may outlive its completion by a
    moment, and what they still hold must not keep its buffers' memory alive."""
    resources = entry.resources
    entry.resources = entry.start = None
    if type(resources) is tuple and resources and type(resources[0]) is Submission:
        resources[0].release()


_inline = threading.local()
_NO_BYTES = memoryview(bytearray())  # the array of a transient storage before its commit
_live_devices: weakref.WeakSet[Device] = weakref.WeakSet()
EXIT_DRAIN_SECONDS = 60.0
"""How long interpreter exit waits, in all, for running device work to finish (assign to
change it; 0 exits at once: work still running keeps its memory, held by its resource
set, and its threads stop with the interpreter)."""


def _close_devices_at_exit() -> None:
    deadline = time.monotonic() + EXIT_DRAIN_SECONDS
    for device in list(_live_devices):
        try:
            device.close(timeout=max(0.0, deadline - time.monotonic()))
        except BaseException:  # noqa: BLE001 - nothing to report to at exit
            pass


atexit.register(_close_devices_at_exit)


def run_capturing(work: Callable[[], None]) -> Error | None:
    """Runs `work`; returns its failure as a `tinyhal.Error` (None on success). Drivers
    use it to turn a queue entry's exception into the error its signals fail with."""
    try:
        work()
    except BaseException as exc:  # noqa: BLE001 - any failure becomes the submission's error
        return as_error(exc)
    return None


def _no_work(done: Completion) -> None:
    done(None)


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


__all__ = ["Completion", "Device", "run_capturing"]
