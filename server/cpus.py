"""Which CPUs the server's threads run on (`tinyhal-serve --python-cpu`).

The event loop and the model instance threads take turns on one interpreter lock: only
one of them runs Python at any moment. Left to the kernel, they sit on different CPUs,
and every hand-over of the lock then wakes a thread on another CPU and moves the objects
it touches between caches; a request makes several such hand-overs (the loop reads and
parses it, the instance thread runs and answers the batch, the loop finishes it). Measured
on the bundled `mlp_classifier` under `hey` and `perf_analyzer` (docs/performance.md),
keeping them on one CPU cuts the server's CPU per request by a quarter to a third and raises
requests/s by 30-60% at 8 connections and more: they lose no parallelism they had.

Threads pinned so also run as batch threads (`SCHED_BATCH`): the kernel then does not let
one of them, woken, preempt the thread running on that CPU. The thread woken is nearly
always one that waits for the interpreter lock the running one holds (an instance thread
given a batch, the loop given an answer), so preempting would only switch to a thread that
cannot run and back: on the gru_step sequence load this cut the server's CPU per step by
3-13% in four A/B runs (docs/performance.md). Time slices and fairness towards other
processes stay. A process started with another policy (`chrt`) keeps it everywhere.

What does run in parallel keeps every CPU: model loading (devices size and place their
worker pools from the CPUs of the thread that creates them) and the workers of `task`
devices, and the instance threads of a model that runs more than one instance (on `sync`
devices their kernels run there, side by side). A single-instance model on a `sync` device
runs its kernels on the shared CPU: with heavy kernels and several models, pass
`--python-cpu none`.

Several servers on one host (replicas, co-located pods) each take a CPU of their own:
`auto` claims the CPU with an advisory lock (`flock`) on a file per CPU in a directory all
of them share (`$TINYHAL_CPU_LOCK_DIR`, default `tinyhal-serve-cpus` in `$TMPDIR` or
`/tmp`; none where it cannot be made: then nothing is claimed), held while the process lives and dropped by the kernel when it ends, so no
stale claim outlives a crash. It prefers the CPU it starts on, then the lowest free one
among those it may use; with every CPU claimed it pins nothing. Sharing a claimed CPU would
put its threads behind another server's pinned ones, which wake-up preemption does not
favour (batch threads): on a host whose CPUs other servers held, a pinned sequence server
served a third of the steps/s it served unpinned (docs/performance.md). A CPU given
by number is claimed too (others then avoid it) but used even when claimed. Containers
share the directory only when it is mounted into each (deploy/README.md).

Linux only (`os.sched_setaffinity`); elsewhere nothing is pinned.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["LOCK_DIR_ENV", "PROCESS_CPUS", "choose", "pin_current_thread",
           "use_process_cpus"]

LOCK_DIR_ENV = "TINYHAL_CPU_LOCK_DIR"


def _process_cpus() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset()


# the CPUs this process could use when the server started, before it pinned anything
PROCESS_CPUS = _process_cpus()


def _batch_pinned() -> bool:
    try:
        return os.sched_getscheduler(0) == os.SCHED_OTHER and hasattr(os, "SCHED_BATCH")
    except (AttributeError, OSError):
        return False


# whether pinned threads become batch threads: only in a process started with the
# ordinary policy (a policy an operator chose with `chrt` is left as it is)
_BATCH_PINNED = _batch_pinned()


def choose(spec: str) -> int | None:
    """The CPU for the server's Python threads from `--python-cpu` (`auto`, `none` or a
    CPU number); None: leave them to the kernel. `auto` picks the CPU the process runs
    on now, among those it may use, when it may use more than one, or a free one if another
    server claimed that, and None when every one is claimed. Raises ValueError
    naming the allowed CPUs for a CPU the process may not use."""
    if spec == "none" or len(PROCESS_CPUS) < 2:
        return None
    if spec == "auto":
        if _CLAIM.cpu is not None:
            return _CLAIM.cpu
        current = _current_cpu()
        first = current if current in PROCESS_CPUS else min(PROCESS_CPUS)
        for cpu in [first, *sorted(PROCESS_CPUS - {first})]:
            claimed = _claim(cpu)
            if claimed is None:  # no lock directory: nothing to coordinate with
                break
            if claimed:
                return cpu
        else:
            return None
        return first
    try:
        cpu = int(spec)
    except ValueError:
        raise ValueError(f"{spec!r} is not auto, none or a CPU number") from None
    if cpu not in PROCESS_CPUS:
        raise ValueError(f"CPU {cpu} is not one this process may use "
                         f"({', '.join(map(str, sorted(PROCESS_CPUS)))})")
    if _CLAIM.cpu is None:
        _claim(cpu)
    return cpu


class _Claim:
    cpu: int | None = None  # the CPU this process holds the lock of
    fd: int | None = None


_CLAIM = _Claim()


def _claim(cpu: int) -> bool | None:
    """Takes the lock of `cpu` for the life of the process: True taken, False another
    process holds it, None the lock directory is unusable."""
    try:
        import fcntl
    except ImportError:
        return None
    chosen = os.environ.get(LOCK_DIR_ENV)
    folder = Path(chosen or Path(os.environ.get("TMPDIR") or "/tmp") / "tinyhal-serve-cpus")
    try:
        if not folder.is_dir():
            folder.mkdir(exist_ok=True)
            os.chmod(folder, 0o1777)  # every user's servers claim CPUs here (as /tmp)
        if not chosen and stat.S_ISLNK(os.lstat(folder).st_mode):
            return None  # another user's link in /tmp: lock files would be made there
        # the directory is every user's: a FIFO or a link left there must neither block
        # the start nor lead elsewhere
        fd = os.open(folder / f"cpu-{cpu}.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC
                     | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError:
        return None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:
        os.close(fd)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _CLAIM.cpu, _CLAIM.fd = cpu, fd
    return True


def pin_current_thread(cpu: int | None) -> None:
    """Runs the calling thread (and the threads it starts later) on `cpu` only, as a
    batch thread; nothing when `cpu` is None or the system refuses."""
    if cpu is not None:
        try:
            os.sched_setaffinity(0, {cpu})
        except (AttributeError, OSError):
            return
        if _BATCH_PINNED:
            _set_policy(os.SCHED_BATCH)


def use_process_cpus() -> None:
    """Allows the calling thread every CPU of `PROCESS_CPUS` again, as an ordinary
    thread: for a helper thread of a pinned loop that creates devices (their worker
    pools take the CPUs and the policy of the creating thread) and model instances."""
    if PROCESS_CPUS:
        try:
            os.sched_setaffinity(0, PROCESS_CPUS)
        except (AttributeError, OSError):
            return
        if _BATCH_PINNED:
            _set_policy(os.SCHED_OTHER)


def _set_policy(policy: int) -> None:
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        pass


def _current_cpu() -> int | None:
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None
