"""Replay of reusable command buffers: recorded once, re-bound per submission.

A reusable command buffer is resolved into a native stream on its first submission; later
submissions only check and patch the binding table. These tests pin what that must keep:
new bindings give new results (also with several executions in flight at once), direct
buffers mixed with table slots still work, and a binding that cannot run (too small,
wrong usage, released, misaligned, missing) is rejected at submit with an error that names
the command and operand.
"""

from __future__ import annotations

import numpy as np
import pytest

from tinyhal import errors
from tinyhal.hal import BufferUsage, BufferView

F32 = 0x21000020


def f32_bits(value: float) -> int:
    return int(np.array(value, np.float32).view(np.uint32))


def as_f32(device, buffer, n):
    return BufferView(buffer, (n,), F32).to_numpy()


def fma_recording(device, exe, workgroups=4):
    """out = a * 2 + b over `4 * workgroups` floats: 16-byte ranges of slots 0, 1, 2."""
    n = 16 * workgroups
    cb = device.create_command_buffer("reusable", binding_capacity=3)
    cb.dispatch(exe, "fma_3d", (workgroups, 1, 1), constants=[f32_bits(2.0), 0],
                bindings=[(0, 0, n), (1, 0, n), (2, 0, n)])
    cb.finalize()
    return cb


def inputs(device, seed, n=16):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    return a, b, BufferView.from_numpy(device, a).buffer, BufferView.from_numpy(device, b).buffer


def test_replay_with_changed_bindings_gives_new_results(device, elementwise_executable_bytes):
    exe = device.load_executable(elementwise_executable_bytes)
    cb = fma_recording(device, exe)
    out = device.allocator.allocate(64)
    seen = []
    for seed in range(4):
        a, b, va, vb = inputs(device, seed)
        # alternate output buffers too: every slot changes between replays
        target = out if seed % 2 else device.allocator.allocate(64)
        sem = device.create_semaphore()
        device.submit(cb, signal=[(sem, 1)], binding_table=[va, vb, target])
        sem.wait(1, timeout=60)
        got = as_f32(device, target, 16)
        assert np.array_equal(got, a * np.float32(2) + b)
        seen.append(got)
    assert not np.array_equal(seen[0], seen[1])


def test_replays_in_flight_at_once_keep_their_own_bindings(device, elementwise_executable_bytes):
    exe = device.load_executable(elementwise_executable_bytes)
    cb = fma_recording(device, exe)
    gate = device.create_semaphore()
    runs = []
    for seed in range(6):
        a, b, va, vb = inputs(device, 100 + seed)
        out = device.allocator.allocate(64)
        done = device.create_semaphore()
        device.submit(cb, wait=[(gate, 1)], signal=[(done, 1)], binding_table=[va, vb, out])
        runs.append((a, b, out, done))
    gate.signal(1)  # all six become ready together
    for a, b, out, done in runs:
        done.wait(1, timeout=60)
        assert np.array_equal(as_f32(device, out, 16), a * np.float32(2) + b)


def test_replay_mixes_direct_buffers_and_sub_ranges(device, elementwise_executable_bytes):
    exe = device.load_executable(elementwise_executable_bytes)
    a, b, va, vb = inputs(device, 7)
    cb = device.create_command_buffer("reusable", binding_capacity=2)
    cb.fill(1, 0, 64, np.float32(-1.0))
    cb.barrier()
    cb.dispatch(exe, "fma_3d", (4, 1, 1), constants=[f32_bits(2.0), 0],
                bindings=[va, (0, 64, 64), 1])
    cb.finalize()
    for round_ in range(2):
        pool = device.allocator.allocate(256)
        device.write_bytes(pool, np.zeros(64, np.float32).tobytes())
        device.write_bytes(pool, b.tobytes(), offset=64)
        out = device.allocator.allocate(64)
        sem = device.create_semaphore()
        device.submit(cb, signal=[(sem, 1)], binding_table=[pool, out])
        sem.wait(1, timeout=60)
        assert np.array_equal(as_f32(device, out, 16), a * np.float32(2) + b), round_


def test_replay_after_alloca_binds_transient_memory(device, elementwise_executable_bytes):
    exe = device.load_executable(elementwise_executable_bytes)
    cb = fma_recording(device, exe)
    for seed in range(3):
        a, b, va, vb = inputs(device, 200 + seed)
        ready = device.create_semaphore()
        out = device.queue_alloca(64, signal=[(ready, 1)])
        done = device.create_semaphore()
        # submitted before the alloca may have run: addresses are bound at start
        device.submit(cb, wait=[(ready, 1)], signal=[(done, 1)], binding_table=[va, vb, out])
        done.wait(1, timeout=60)
        assert np.array_equal(as_f32(device, out, 16), a * np.float32(2) + b)
        device.queue_dealloca(out)


@pytest.mark.parametrize("problem", ["too_small", "wrong_usage", "released", "misaligned",
                                     "missing", "not_a_buffer"])
def test_invalid_binding_in_a_replay_is_rejected(device, elementwise_executable_bytes,
                                                  problem):
    exe = device.load_executable(elementwise_executable_bytes)
    cb = fma_recording(device, exe)
    a, b, va, vb = inputs(device, 1)
    out = device.allocator.allocate(64)
    sem = device.create_semaphore()
    device.submit(cb, signal=[(sem, 1)], binding_table=[va, vb, out])  # a good replay first
    sem.wait(1, timeout=60)

    table = [va, vb, out]
    if problem == "too_small":
        table[2] = device.allocator.allocate(32)
        error, match = errors.OutOfRangeError, r"binding 2 of 'fma_3d'.*overruns binding slot 2"
    elif problem == "wrong_usage":
        table[2] = device.allocator.allocate(64, usage=BufferUsage.TRANSFER | BufferUsage.MAPPING)
        error, match = errors.PermissionDeniedError, r"binding 2 of 'fma_3d'.*DISPATCH_STORAGE"
    elif problem == "released":
        gone = device.allocator.allocate(64)
        gone.storage.release()
        table[0] = gone
        error, match = errors.FailedPreconditionError, r"binding 0 of 'fma_3d'.*deallocated"
    elif problem == "misaligned":
        big = device.allocator.allocate(256)
        table[1] = (big, 4, 64)
        error, match = errors.InvalidArgumentError, r"binding 1 of 'fma_3d'.*64-byte aligned"
    elif problem == "missing":
        table = [va, vb]
        error, match = errors.InvalidArgumentError, "binding slot 2 but the binding table has 2"
    else:
        table[1] = "not a buffer"
        error, match = errors.InvalidArgumentError, "binding table entry 1"
    done = device.create_semaphore()
    with pytest.raises(error, match=match):
        device.submit(cb, signal=[(done, 1)], binding_table=table)
    assert done.query() == 0  # nothing was queued

    # the recording is unharmed: a good table still replays
    a2, b2, va2, vb2 = inputs(device, 2)
    device.submit(cb, signal=[(done, 1)], binding_table=[va2, vb2, out])
    done.wait(1, timeout=60)
    assert np.array_equal(as_f32(device, out, 16), a2 * np.float32(2) + b2)


def _one_shot_fma(device, exe, a, b, out, workgroups=4, scale=2.0):
    n = 16 * workgroups
    cb = device.create_command_buffer("one_shot")
    cb.dispatch(exe, "fma_3d", (workgroups, 1, 1), constants=[f32_bits(scale), 0],
                bindings=[(a, 0, n), (b, 0, n), (out, 0, n)])
    cb.finalize()
    return cb


def test_rerecorded_identical_one_shot_reuses_its_native_program(
        device, elementwise_executable_bytes):
    """A program that records the same one-shot command buffer every call (new buffers
    each time) finds the recording, and the native programs, of the last: only the
    bindings change. A command buffer that differs in any recorded value does not."""
    exe = device.load_executable(elementwise_executable_bytes)
    recordings, programs = [], []
    for seed in range(3):
        a, b, va, vb = inputs(device, seed)
        out = device.allocator.allocate(64)
        cb = _one_shot_fma(device, exe, va, vb, out)
        sem = device.create_semaphore()
        device.submit(cb, signal=[(sem, 1)])
        sem.wait(1, timeout=60)
        assert np.array_equal(as_f32(device, out, 16), a * np.float32(2) + b)
        recordings.append(cb.recording)
        programs.append({id(p) for p in cb.recording.streams})
    assert recordings[0] is recordings[1] is recordings[2]
    assert programs[0] == programs[1] == programs[2]  # empty where a driver runs per op

    a, b, va, vb = inputs(device, 7)
    out = device.allocator.allocate(64)
    changed = [
        _one_shot_fma(device, exe, va, vb, out, workgroups=2),  # workgroup count
        _one_shot_fma(device, exe, va, vb, out, scale=3.0),  # constants
        _one_shot_fma(device, exe, va, va, out),  # binding slots: one buffer twice
    ]
    fused = (a.astype(np.float64) * 3 + b).astype(np.float32)  # the kernel's fma
    for cb, want in zip(changed, [None, fused, a * np.float32(3)]):
        sem = device.create_semaphore()
        device.submit(cb, signal=[(sem, 1)])
        sem.wait(1, timeout=60)
        assert cb.recording is not recordings[0]
        if want is not None:
            assert np.array_equal(as_f32(device, out, 16), want)
    assert len({id(cb.recording) for cb in changed}) == 3
