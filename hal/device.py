"""The device: the one public layer that validates, and the hooks drivers implement.

Every entry point (`submit`, the `queue_*` operations) validates its arguments on the
calling thread and raises `tinyhal.Error` for bad input. What passes becomes a unit of
work gated by the wait semaphores; once they are reached the driver runs it (`_start`)
and the signal semaphores advance, or fail with the work's error. A wait that fails never
runs the work; its failure reaches the signal semaphores instead.

Drivers subclass `Device` and override:
- `_start(work, signal)`: run `work()` (on some thread) and then `self._complete(signal,
  error)`; the default runs inline on whichever thread satisfied the last wait.
- `_enqueue_commands(wait, signal, ops, keep)`: queue a submission's resolved operations;
  the default runs them as one `Stream` on one thread (the task driver spreads the
  stream over its workers; the emu driver runs operations one by one on its clock).
- `_enqueue(wait, signal, work, keep, cheap)` / `_enqueue_async(...)`: queue other work.

`queue_alloca` memory comes from the device's transient ringbuffer (`self.transient`,
capacity set by the `transient_capacity` option): the buffer is returned at once and gets
its memory when the alloca runs, which waits for ringbuffer space if the ring is full.
"""

from __future__ import annotations

import collections
import fnmatch
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import (
    AbortedError,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    as_error,
)
from .allocator import Allocator
from .buffer import Buffer
from .command_buffer import CommandBuffer, as_buffer_ref
from .executable import FORMATS, Executable
from .execution import Submission, resolve_commands
from .ringbuffer import DEFAULT_CAPACITY, TransientRingbuffer
from .semaphore import Fence, Semaphore, SemaphorePoint, normalize_points, when_all_reached
from .stream import Stream
from .types import WHOLE_BUFFER, BufferUsage, MemoryType

Points = Fence | Sequence[SemaphorePoint] | None


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


class Device:
    """A logical device: allocator, executables, semaphores and one queue."""

    driver_name = "base"
    identifier = "local"

    def __init__(self, transient_capacity: int = DEFAULT_CAPACITY, **options: Any) -> None:
        if options:
            raise InvalidArgumentError(
                f"driver {self.driver_name!r} does not take options {sorted(options)}"
            )
        self.allocator = self._create_allocator()
        self.allocator.device_ref = weakref.ref(self)
        self._executables: weakref.WeakValueDictionary[str, Executable] = (
            weakref.WeakValueDictionary()
        )
        self._executables_lock = threading.Lock()
        self._closed = False
        self.transient = TransientRingbuffer(self.allocator, transient_capacity)

    def __repr__(self) -> str:
        return f"<Device {self.identifier}>"

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Releases driver resources; queued work still completes or fails."""
        self._closed = True
        self.transient.close(AbortedError(
            f"{self!r} closed while a queue_alloca waited for ringbuffer space"))

    def _create_allocator(self) -> Allocator:
        """The device's allocator; drivers with their own memory model override this."""
        return Allocator(self.identifier)

    def read_array(self, buffer: Buffer, offset: int = 0, length: int = WHOLE_BUFFER,
                   timeout: float | None = 60.0) -> np.ndarray:
        """A new uint8 array with the buffer's bytes: copied directly from host-visible
        memory, or by a queue transfer from memory the host cannot map (and in order
        with nothing else: it waits for nothing)."""
        buffer.check_live()
        offset, length = buffer.resolve_range(offset, length, "read")
        if buffer.mappable:
            start = buffer.byte_offset + offset
            return buffer.storage.array[start : start + length].copy()
        host = np.empty(length, dtype=np.uint8)
        done = Semaphore()
        self.queue_write(buffer, offset, host, 0, length, signal=[(done, 1)])
        done.wait(1, timeout)
        return host

    def read_bytes(self, buffer: Buffer, offset: int = 0, length: int = WHOLE_BUFFER,
                   timeout: float | None = 60.0) -> bytes:
        """Copies buffer contents to the host (see `read_array`)."""
        return self.read_array(buffer, offset, length, timeout).tobytes()

    def write_bytes(self, buffer: Buffer, data: Any, offset: int = 0,
                    timeout: float | None = 60.0) -> None:
        """Copies host bytes into a buffer: directly into host-visible memory, or by a
        queue transfer into memory the host cannot map."""
        buffer.check_live()
        view = _host_view(data)
        offset, length = buffer.resolve_range(offset, len(view), "write")
        if buffer.mappable:
            start = buffer.byte_offset + offset
            buffer.storage.array[start : start + length] = np.frombuffer(view, np.uint8)
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
        """Loads an executable library (format detected from its bytes), cached by content."""
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
        import hashlib

        key = hashlib.sha256(data).hexdigest()
        with self._executables_lock:
            cached = self._executables.get(key)
            if cached is not None:
                return cached
            executable = Executable(data, name)
            self._executables[key] = executable
            return executable

    def query(self, category: str, key: str) -> int:
        """Answers IREE's device queries (`hal.device.id`, `hal.executable.format`, ...)."""
        if category == "hal.device.id":
            return int(fnmatch.fnmatchcase(self.identifier, key))
        if category == "hal.executable.format":
            return int(key in FORMATS)
        if category in ("hal.device", "hal.dispatch") and key == "concurrency":
            return self.concurrency
        if category == "hal.cpu":
            return int(key.lower() in _cpu_flags())
        raise NotFoundError(f"unknown device query {category!r} :: {key!r}")

    @property
    def concurrency(self) -> int:
        return 1

    # -- queue ------------------------------------------------------------------------

    def submit(self, batch: CommandBuffer | Sequence[CommandBuffer], wait: Points = (),
               signal: Points = (), binding_table: Sequence[Any] | None = None) -> None:
        """Queues command buffers to run once `wait` is reached; advances `signal` after.

        Returns at once. Validation errors raise here; errors while running fail the
        signal semaphores.
        """
        batch_list = [batch] if isinstance(batch, CommandBuffer) else list(batch)
        wait_points = normalize_points(wait, "wait")
        signal_points = normalize_points(signal, "signal")
        ops = resolve_commands(batch_list, binding_table, self.concurrency)
        self._enqueue_commands(wait_points, signal_points, ops, batch_list)

    queue_execute = submit

    def queue_barrier(self, wait: Points = (), signal: Points = ()) -> None:
        """Advances `signal` once `wait` is reached; no work."""
        self._enqueue(normalize_points(wait, "wait"), normalize_points(signal, "signal"),
                      _nothing, cheap=True)

    def queue_fill(self, target: Buffer, offset: int, length: int, pattern: int | bytes,
                   wait: Points = (), signal: Points = (), pattern_length: int | None = None
                   ) -> None:
        cb = self.create_command_buffer()
        cb.fill(target, offset, length, pattern, pattern_length)
        cb.finalize()
        self.submit(cb, wait, signal)

    def queue_update(self, source: Any, target: Buffer, offset: int = 0,
                     wait: Points = (), signal: Points = (), length: int | None = None) -> None:
        """Writes host bytes into `target`; the source is captured at this call."""
        cb = self.create_command_buffer()
        cb.update(source, target, offset, length)
        cb.finalize()
        self.submit(cb, wait, signal)

    def queue_copy(self, source: Buffer, source_offset: int, target: Buffer, target_offset: int,
                   length: int, wait: Points = (), signal: Points = ()) -> None:
        cb = self.create_command_buffer()
        cb.copy(source, source_offset, target, target_offset, length)
        cb.finalize()
        self.submit(cb, wait, signal)

    def queue_read(self, source: Any, source_offset: int, target: Buffer, target_offset: int,
                   length: int, wait: Points = (), signal: Points = ()) -> None:
        """Reads `length` bytes from a file (path or binary file object) or host memory."""
        ref = as_buffer_ref((target, target_offset, length), "read target", 0)
        target.validate_usage(BufferUsage.TRANSFER_TARGET, "read target")
        length = ref.length
        if isinstance(source, (str, os.PathLike)) or hasattr(source, "readinto"):
            def read() -> None:
                dst = target.host_bytes()[ref.offset : ref.offset + length]
                _read_file(source, source_offset, dst)
        else:
            src = np.frombuffer(_host_view(source), dtype=np.uint8)
            if source_offset < 0 or source_offset + length > src.nbytes:
                raise InvalidArgumentError(
                    f"read source range [{source_offset}, {source_offset + length}) overruns "
                    f"the {src.nbytes}-byte source"
                )

            def read() -> None:
                target.host_bytes()[ref.offset : ref.offset + length] = (
                    src[source_offset : source_offset + length])
        self._enqueue(normalize_points(wait, "wait"), normalize_points(signal, "signal"), read)

    def queue_write(self, source: Buffer, source_offset: int, target: Any, target_offset: int,
                    length: int, wait: Points = (), signal: Points = ()) -> None:
        """Writes buffer bytes to a file (path or binary file object) or writable host memory."""
        ref = as_buffer_ref((source, source_offset, length), "write source", 0)
        source.validate_usage(BufferUsage.TRANSFER_SOURCE, "write source")
        length = ref.length

        def data() -> np.ndarray:
            return source.host_bytes()[ref.offset : ref.offset + length]

        if isinstance(target, (str, os.PathLike)) or hasattr(target, "write"):
            def write() -> None:
                _write_file(target, target_offset, data())
        else:
            dst = np.frombuffer(_host_view(target), dtype=np.uint8)
            if not dst.flags.writeable:
                raise InvalidArgumentError("write target host memory is read-only")
            if target_offset < 0 or target_offset + length > dst.nbytes:
                raise InvalidArgumentError(
                    f"write target range [{target_offset}, {target_offset + length}) overruns "
                    f"the {dst.nbytes}-byte target"
                )

            def write() -> None:
                dst[target_offset : target_offset + length] = data()
        self._enqueue(normalize_points(wait, "wait"), normalize_points(signal, "signal"), write)

    def queue_alloca(self, size: int, wait: Points = (), signal: Points = (),
                     memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
                     usage: BufferUsage = BufferUsage.DEFAULT | BufferUsage.MAPPING) -> Buffer:
        """A transient buffer usable once `signal` is reached.

        Its memory comes from the transient ringbuffer when the alloca runs; a full ring
        makes it wait for a `queue_dealloca` to retire space. Only a size larger than the
        whole ring fails, here, with RESOURCE_EXHAUSTED.
        """
        wait_points = normalize_points(wait, "wait")
        signal_points = normalize_points(signal, "signal")
        self.transient.check_size(size)
        buffer = self._alloca(size, memory_type, usage)
        self._enqueue_async(wait_points, signal_points,
                            lambda done: self._commit_alloca(buffer, done))
        return buffer

    def queue_dealloca(self, buffer: Buffer, wait: Points = (), signal: Points = ()) -> None:
        """Frees a buffer once `wait` is reached; later use of it is rejected."""
        if not isinstance(buffer, Buffer):
            raise InvalidArgumentError(f"queue_dealloca takes a Buffer, not {buffer!r}")
        buffer.check_live()
        wait_points = normalize_points(wait, "wait")
        self._enqueue(wait_points, normalize_points(signal, "signal"),
                      lambda: self._dealloca(buffer), cheap=True)

    # -- driver hooks -----------------------------------------------------------------

    def _alloca(self, size: int, memory_type: MemoryType, usage: BufferUsage) -> Buffer:
        """A buffer with no memory yet; `_commit_alloca` gives it ringbuffer memory."""
        heap = self.allocator.select_heap(memory_type)
        storage = TransientRingbuffer.pending_storage(size)
        usage = self.allocator.coerce_usage(memory_type, usage)
        return Buffer(self.allocator, storage, 0, size, heap.memory_type, usage)

    def _commit_alloca(self, buffer: Buffer, done: Callable[[Error | None], None]) -> None:
        storage = buffer.storage

        def granted(block: Any, error: Error | None) -> None:
            if error is None:
                self.transient.commit(storage, block)
            done(error)

        self.transient.reserve(buffer.byte_length, granted)

    def _dealloca(self, buffer: Buffer) -> None:
        buffer.storage.release()
        self.transient.release(buffer.storage)

    def _enqueue_commands(self, wait: list[SemaphorePoint], signal: list[SemaphorePoint],
                          ops: Submission, keep: Any) -> None:
        self._enqueue(wait, signal, lambda: Stream(ops).run(), keep=keep)

    def _enqueue_async(self, wait: list[SemaphorePoint], signal: list[SemaphorePoint],
                       start: Callable[[Callable[[Error | None], None]], None]) -> None:
        """Like `_enqueue`, for work that finishes later: `start(done)` runs once the waits
        are reached and `done(error)` completes it (on whatever thread calls it)."""
        if self._closed:
            raise FailedPreconditionError(f"{self!r} is closed")

        def done(error: Error | None) -> None:
            self._complete(signal, error)

        def on_waits(error: Error | None) -> None:
            if error is not None:
                self._complete(signal, error)
                return
            try:
                start(done)
            except BaseException as exc:  # noqa: BLE001 - becomes the operation's error
                self._complete(signal, as_error(exc))

        when_all_reached(wait, on_waits)

    def _enqueue(self, wait: list[SemaphorePoint], signal: list[SemaphorePoint],
                 work: Callable[[], None], keep: Any = None, cheap: bool = False) -> None:
        """Queues `work` behind `wait`; `cheap` says it takes microseconds, so a driver with
        worker threads may run it on the readying thread rather than wake a worker."""
        if self._closed:
            raise FailedPreconditionError(f"{self!r} is closed")

        def on_waits(error: Error | None) -> None:
            if error is not None:
                self._complete(signal, error)
            else:
                self._start(work, signal)

        when_all_reached(wait, on_waits)

    def _start(self, work: Callable[[], None], signal: list[SemaphorePoint]) -> None:
        self._complete(signal, _run_work(work))

    def _complete(self, signal: list[SemaphorePoint], error: Error | None) -> None:
        """Signals (or fails) `signal`. Trampolined: completions that a signal triggers on
        this thread are queued for the outermost call, so chains of thousands of dependent
        submissions, succeeding or failing, never recurse once per link."""
        pending = getattr(_inline, "pending", None)
        if pending is not None:
            pending.append((signal, error))
            return
        _inline.pending = pending = collections.deque([(signal, error)])
        try:
            while pending:
                _settle(*pending.popleft())
        finally:
            _inline.pending = None



_inline = threading.local()


def _settle(signal: list[SemaphorePoint], error: Error | None) -> None:
    for sem, value in signal:
        if error is not None:
            sem.fail(error)
            continue
        try:
            sem.signal(value)
        except Error as exc:
            sem.fail(exc)


def _run_work(work: Callable[[], None]) -> Error | None:
    try:
        work()
    except BaseException as exc:  # noqa: BLE001 - any failure becomes the submission's error
        return as_error(exc)
    return None


def _nothing() -> None:
    return None


def _host_view(obj: Any) -> memoryview:
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise InvalidArgumentError("host memory must be C-contiguous")
        return memoryview(obj.reshape(-1).view(np.uint8))
    try:
        return memoryview(obj).cast("B")
    except TypeError:
        raise InvalidArgumentError(
            f"expected a file, path or bytes-like host memory, not {type(obj).__name__}"
        ) from None


def _read_file(source: Any, offset: int, dst: np.ndarray) -> None:
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


def _write_file(target: Any, offset: int, data: np.ndarray) -> None:
    if hasattr(target, "write"):
        target.seek(offset)
        target.write(memoryview(data))
        return
    mode = "r+b" if os.path.exists(target) else "wb"
    with open(target, mode) as f:
        f.seek(offset)
        f.write(memoryview(data))


__all__ = ["Device"]
