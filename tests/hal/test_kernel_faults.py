"""A kernel that faults fails its dispatch instead of killing the host process.

Host C kernels that store through a null pointer, execute an invalid instruction, divide
by zero, overflow the stack or trap: on every driver the submission fails with
`KernelFaultError` (DATA_LOSS) naming the export, the workgroup and the signal; the
device is lost afterwards (UNAVAILABLE, as a GPU context is after a kernel fault), a new
device works, and the process exits normally. Faults outside kernels still reach the
handlers installed before tinyhal's (here Python's faulthandler) and kill the process as
before. Each scenario runs in a child process, so a fault that escapes is a failed test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from support.child import TESTS_DIR, run_child

FAULTS = r"""
#include <stdint.h>
#include <string.h>
static int null_store(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                      const tinyhal_workgroup_state_t* w) {
  if (w->workgroup_id_x == 3) *(volatile int*)(uintptr_t)d->constants[0] = 1;
  return 0;
}
static int invalid_instruction(const tinyhal_environment_t* env,
                               const tinyhal_dispatch_state_t* d,
                               const tinyhal_workgroup_state_t* w) {
  if (w->workgroup_id_x == 3) __builtin_trap();
  return 0;
}
static int divide_by_zero(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                          const tinyhal_workgroup_state_t* w) {
  volatile int zero = (int)d->constants[0];
  if (w->workgroup_id_x == 3) return 7 / zero;
  return 0;
}
static int recurse(volatile char* p, int depth) {
  volatile char frame[4096];
  frame[0] = p ? p[0] : 0;
  return depth ? recurse(frame, depth - 1) + frame[0] : frame[0];
}
static int stack_overflow(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                          const tinyhal_workgroup_state_t* w) {
  if (w->workgroup_id_x == 3) return recurse(0, 1 << 30);
  return 0;
}
static int breakpoint(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                      const tinyhal_workgroup_state_t* w) {
#if defined(__x86_64__) || defined(__i386__)
  if (w->workgroup_id_x == 3) __asm__ volatile("int3");
#else
  if (w->workgroup_id_x == 3) __builtin_trap();
#endif
  return 0;
}
/* out[i] = i: shows that a device created after a fault computes. */
static int iota(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                const tinyhal_workgroup_state_t* w) {
  ((int*)d->binding_ptrs[0])[w->workgroup_id_x] = (int)w->workgroup_id_x;
  return 0;
}
"""

KERNELS = {"null_store": "SIGSEGV", "invalid_instruction": "SIGILL",
           "divide_by_zero": "SIGFPE", "stack_overflow": "SIGSEGV", "breakpoint": "SIGTRAP"}

PRELUDE = f"FAULTS = {FAULTS!r}\n" + """
import sys
import numpy as np
from tinyhal import errors, hal
from tinyhal.hal import KernelExport, build_executable

LIBRARY = build_executable(FAULTS, [
    *(KernelExport(k, constant_count=1) for k in sys.argv[2].split(",")),
    KernelExport("iota", binding_count=1),
], name="faulting_kernels")

def iota_works(dev):
    exe = dev.load_executable(LIBRARY)
    out = dev.allocator.allocate(64)
    cb = dev.create_command_buffer()
    cb.dispatch(exe, "iota", (16, 1, 1), bindings=[out])
    cb.finalize()
    sem = dev.create_semaphore()
    dev.submit(cb, signal=[(sem, 1)])
    sem.wait(1, timeout=30)
    return np.frombuffer(dev.read_bytes(out), np.int32).tolist() == list(range(16))
"""


def _child(code: str, *args: str) -> str:
    return run_child(PRELUDE + textwrap.dedent(code), *args)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_a_faulting_kernel_fails_its_dispatch_and_loses_the_device(driver, kernel):
    out = _child("""
    dev = hal.create_device(sys.argv[1])
    exe = dev.load_executable(LIBRARY)
    for attempt in range(2):   # the second attempt meets the lost device
        cb = dev.create_command_buffer()
        cb.dispatch(exe, sys.argv[2], (8, 1, 1), constants=[0])
        cb.finalize()
        sem, after = dev.create_semaphore(), dev.create_semaphore()
        try:
            dev.submit(cb, signal=[(sem, 1)])
            dev.queue_barrier(wait=[(sem, 1)], signal=[(after, 1)])
            sem.wait(1, timeout=30)
            print("ran")
        except errors.Error as exc:
            print(type(exc).__name__, exc.code.name, str(exc).replace("\\n", " "))
        try:
            after.wait(1, timeout=30)
        except errors.Error as exc:
            print("after:", exc.code.name)
    dev.close()
    fresh = hal.create_device(sys.argv[1])
    print("fresh device works:", iota_works(fresh))
    fresh.close()
    """, driver, kernel)
    lines = out.splitlines()
    first, after, second = lines[0], lines[1], lines[2]
    assert first.startswith("KernelFaultError DATA_LOSS"), out
    assert f"dispatch of '{kernel}' faulted in workgroup (3, 0, 0)" in first, out
    assert KERNELS[kernel] in first and "faulting_kernels" in first, out
    # the barrier fails with the fault, or with the loss if it came after it
    assert after in ("after: DATA_LOSS", "after: UNAVAILABLE"), out
    assert second.startswith("DeviceLostError UNAVAILABLE") and "a kernel faulted" in second, out
    assert lines[-1] == "fresh device works: True", out


def test_faults_in_a_task_storm_are_all_contained():
    out = _child("""
    import threading
    dev = hal.create_device("task")
    exe = dev.load_executable(LIBRARY)
    errors_seen = []
    def storm():
        for _ in range(20):
            d = hal.create_device("task")
            e = d.load_executable(LIBRARY)
            cb = d.create_command_buffer()
            cb.dispatch(e, "invalid_instruction", (64, 1, 1), constants=[0])
            cb.finalize()
            sem = d.create_semaphore()
            try:
                d.submit(cb, signal=[(sem, 1)])
                sem.wait(1, timeout=30)
            except errors.KernelFaultError as exc:
                errors_seen.append(exc.code.name)
            d.close()
    threads = [threading.Thread(target=storm) for _ in range(3)]
    for t in threads: t.start()
    for t in threads: t.join(60)
    print(len(errors_seen), set(errors_seen))
    print("fresh device works:", iota_works(hal.create_device("task")))
    """, "task", "invalid_instruction")
    assert out.splitlines() == ["60 {'DATA_LOSS'}", "fresh device works: True"], out


def test_faults_outside_kernels_still_reach_the_previous_handler():
    """After tinyhal installed its handler, a fault in Python's own process (not in a
    kernel) still goes to faulthandler, which was installed first, and kills the child."""
    code = "import ctypes, faulthandler\nfaulthandler.enable()\n" + PRELUDE + textwrap.dedent("""
    dev = hal.create_device("sync")
    dev.load_executable(LIBRARY)          # installs tinyhal's handler
    print("iota", iota_works(dev), flush=True)
    ctypes.string_at(0)                   # a fault outside any kernel
    print("survived")
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS_DIR, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code, "sync", "null_store"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout.splitlines() == ["iota True"], proc.stdout
    assert "Fatal Python error: Segmentation fault" in proc.stderr, proc.stderr
