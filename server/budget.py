"""The memory budget of `tinyhal-serve`: bytes held on behalf of clients.

Everything a client can make the server hold while a request is in progress is charged to
one `MemoryBudget` before the bytes are taken: a request body being read (each piece as
it arrives past the first 64 KiB; a declared length the budget could not take now is
refused before the client sends the body, but not charged: a head alone holds nothing,
so heads declaring 60 MB each can pin neither memory nor the budget), an inflated body (each
megabyte before it is inflated), the arrays parsed from JSON tensor data (their declared
bytes, before they are made) and an answer until its client has read it (charged once it
is encoded, before it is handed to the connection: one answer per model instance is
in the making at a time). A request whose charge would go over the limit is refused (503
with Retry-After, naming the budget) and what it took is dropped.

Charges are grouped per request in a `Hold`, which its owner releases once, on whatever
path the request ends (answered, failed, timed out, its client gone): the release is
idempotent and also happens from `finally` blocks.

Memory freed goes back to the operating system, by construction rather than by chance:

- A budget makes the C allocator give every block of `OWN_MAP_BYTES` or more a memory map
  of its own (glibc's `M_MMAP_THRESHOLD`, set once per process), unmapped when it is freed:
  request bodies, inflated bodies, tensors and answers of large requests. Left to itself,
  glibc raises that threshold to the size of each large block freed (up to 32 MiB), so
  after the first 10 MB answer every later one went to a heap or a worker thread's arena
  and stayed there, fragmented, after its request ended (the chaos bench: +10-30 MB per
  class of large request, never returned). Small blocks, and so the request path of small
  requests, are not affected.
- Releasing a large amount trims the heaps (glibc's `malloc_trim`, on a thread of its own,
  see `_Trimmer`): what is left there is the small blocks that large requests' parsing and
  encoding passed through; and it asks the devices' transient rings to give back pages
  above their live blocks (`hal.ringbuffer.give_back_all`).

Small requests (bodies up to `SMALL_BYTES`) are not charged: at most one of them is in
progress per connection, so the connection cap bounds them, and the request path of
small requests pays nothing for the budget.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

from ..hal.allocator import physical_memory
from ..hal.ringbuffer import give_back_all

__all__ = ["BudgetExceeded", "Hold", "MemoryBudget", "SMALL_BYTES", "default_limit", "parse_size",
           "release_freed_memory"]

SMALL_BYTES = 64 << 10
OWN_MAP_BYTES = 256 << 10
"""Blocks this large or larger are mapped on their own and unmapped when freed (see above):
four times `SMALL_BYTES`, so no block of a small request's path is one."""
_TRIM_BYTES = 4 << 20  # releases of at least this much give memory back to the system


class BudgetExceeded(Exception):
    """A charge the budget cannot take; its message names the budget and the figures."""


class MemoryBudget:
    """At most `limit` bytes held on behalf of clients (thread-safe: bodies are inflated
    and parsed on worker threads). `held` and `peak` are what the metrics expose."""

    def __init__(self, limit: int, flag: str = "--client-memory-limit") -> None:
        _map_large_blocks_on_their_own()
        self.limit = limit
        self.flag = flag
        self.held = 0
        self.peak = 0
        self.refused = 0  # charges refused since start
        self._lock = threading.Lock()

    def hold(self) -> Hold:
        """A new, empty group of charges (one request's)."""
        return Hold(self)

    def check(self, nbytes: int, what: str) -> None:
        """Raises BudgetExceeded (counted as refused) when `nbytes` more would not fit
        now; charges nothing (bytes announced, not taken yet: a request body's declared
        length, refused before the client sends it)."""
        if self.held + nbytes > self.limit:
            with self._lock:
                self._refuse(nbytes, what)

    def _refuse(self, nbytes: int, what: str) -> None:
        self.refused += 1
        raise BudgetExceeded(
            f"server memory for client data is exhausted: {what} needs {nbytes} bytes, "
            f"{self.held} of {self.limit} are held ({self.flag}); retry later")

    def _take(self, nbytes: int, what: str) -> None:
        with self._lock:
            held = self.held + nbytes
            if held > self.limit:
                self._refuse(nbytes, what)
            self.held = held
            if held > self.peak:
                self.peak = held

    def _give_back(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes
        if nbytes >= _TRIM_BYTES:
            _TRIMMER.request()


class Hold:
    """The bytes charged for one request; `release()` returns all of them (once)."""

    __slots__ = ("budget", "nbytes")

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.nbytes = 0

    def charge(self, nbytes: int, what: str) -> None:
        """Charges `nbytes` more for `what` (named in the refusal) before they are taken;
        raises BudgetExceeded, charging nothing, when the budget cannot take them."""
        if nbytes > 0:
            self.budget._take(nbytes, what)
            self.nbytes += nbytes

    def release(self) -> None:
        nbytes, self.nbytes = self.nbytes, 0
        if nbytes:
            self.budget._give_back(nbytes)


def default_limit() -> int:
    """A quarter of the memory this process may use (the cgroup's limit when it has one,
    else physical memory), at most 1 GiB: room for a dozen bodies of the default
    --max-request-bytes while leaving the rest to models and device memory."""
    total = physical_memory() or 0
    cgroup = _cgroup_limit()
    if cgroup is not None:
        total = min(total, cgroup) if total else cgroup
    if not total:
        return 1 << 30
    return min(1 << 30, total // 4)


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def release_freed_memory() -> None:
    """Hands memory freed by the process back to the operating system (glibc: every
    arena's free pages; nothing elsewhere)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list = []
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def _map_large_blocks_on_their_own() -> None:
    """Fixes glibc's mmap threshold at `OWN_MAP_BYTES` (which also stops its dynamic
    growth, and that of the trim threshold); nothing on other C libraries."""
    if _malloc_trim() is None or _MAPPED_ON_THEIR_OWN:
        return
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    _MAPPED_ON_THEIR_OWN.append(bool(mallopt(_M_MMAP_THRESHOLD, OWN_MAP_BYTES)))


_MAPPED_ON_THEIR_OWN: list[bool] = []


class _Trimmer:
    """Hands freed memory back on a thread of its own when asked: a trim of a heap left
    fragmented by many freed blocks takes tens of milliseconds (66 ms for 200 MB freed in
    64 KiB blocks), which the event loop must not wait through; then the transient rings'
    pages above their live blocks (a step at a time under each ring's lock, see
    `TransientRingbuffer.give_back`). Requests made while it trims are served by one more
    trim."""

    def __init__(self) -> None:
        self._wanted = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tinyhal-trim",
                                                daemon=True)
                self._thread.start()
        self._wanted.set()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            release_freed_memory()
            give_back_all()


_TRIMMER = _Trimmer()


def _malloc_trim():  # noqa: ANN202 - a ctypes function or None
    if not _TRIM:
        try:
            _TRIM.append(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                         .malloc_trim)
        except (OSError, AttributeError):  # not glibc
            _TRIM.append(None)
    return _TRIM[0]


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """A byte count as the command line gives it: an integer, optionally with a binary
    unit K, M, G or T (`512M`, `2G`); ValueError when it is not one or not positive."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in _UNITS else ""
    digits = value[:len(value) - len(unit)]
    if not digits.isdigit() or int(digits) <= 0:
        raise ValueError(f"{text!r} is not a positive size in bytes (for example "
                         f"268435456, 256M or 1G)")
    return int(digits) * _UNITS[unit]
