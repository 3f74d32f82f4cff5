"""Stress: thousands of queue operations with random wait/signal DAGs over several
semaphores, queued in random order (so most waits precede their signals), on every
driver, several rounds. Every semaphore must end at its expected value and every
operation's write must land; everything is bounded by explicit timeouts.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

T = 60
OPS = 3000
SEMAPHORES = 5


def _plan(rng: random.Random):
    """Operations in definition order: (signal sem, value, waits, kind)."""
    values = [0] * SEMAPHORES
    defined: list[tuple[int, int]] = []
    plan = []
    for i in range(OPS):
        s = rng.randrange(SEMAPHORES)
        waits = []
        if values[s]:
            waits.append((s, values[s]))  # a semaphore's own timeline is ordered
        for _ in range(rng.randint(0, 2)):
            if defined:
                waits.append(rng.choice(defined))
        values[s] += rng.randint(1, 3)
        defined.append((s, values[s]))
        plan.append((s, values[s], waits, rng.choice("fbuc")))
        del i
    return plan, values


@pytest.mark.parametrize("round_", range(3))
def test_random_dags_finish_with_every_semaphore_at_its_value(device, round_):
    rng = random.Random(1000 + round_)
    plan, final = _plan(rng)
    sems = [device.create_semaphore() for _ in range(SEMAPHORES)]
    out = device.allocator.allocate(4 * OPS)
    order = list(range(OPS))
    # Mostly reversed submission order: waits are queued before their signals.
    rng.shuffle(order)
    for i in order:
        s, value, waits, kind = plan[i]
        wait = [(sems[w], v) for w, v in waits]
        signal = [(sems[s], value)]
        if kind == "f":
            device.queue_fill(out, 4 * i, 4, i.to_bytes(4, "little"), wait=wait, signal=signal)
        elif kind == "u":
            device.queue_update(i.to_bytes(4, "little"), out, 4 * i, wait=wait, signal=signal)
        elif kind == "c":
            cb = device.create_command_buffer()
            cb.fill(out, 4 * i, 4, i.to_bytes(4, "little"))
            cb.barrier()
            cb.finalize()
            device.submit(cb, wait=wait, signal=signal)
        else:
            device.queue_barrier(wait=wait, signal=signal)
    for sem, value in zip(sems, final):
        sem.wait(value, timeout=T)
        assert sem.query() == value
    got = np.zeros(OPS, np.uint32)  # read back through the queue: works without mapping
    done = device.create_semaphore()
    device.queue_write(out, 0, got, 0, 4 * OPS, signal=[(done, 1)])
    done.wait(1, timeout=T)
    for i, (_s, _v, _w, kind) in enumerate(plan):
        if kind != "b":
            assert got[i] == i


def test_failure_reaches_every_dependent_in_a_random_dag(device):
    rng = random.Random(7)
    n = 400
    sems = [device.create_semaphore() for _ in range(n)]
    root = device.create_semaphore()
    parents = []
    for i in range(n):
        ps = rng.sample(range(i), k=min(i, rng.randint(1, 3))) if i else []
        parents.append(ps)
    for i in reversed(range(n)):
        wait = [(sems[p], 1) for p in parents[i]] or [(root, 1)]
        device.queue_barrier(wait=wait, signal=[(sems[i], 1)])
    root.fail("root cause")
    for sem in sems:  # everything descends from node 0, which waits on root
        assert sem.statistics().failed or _fails(sem)


def _fails(sem) -> bool:
    try:
        sem.wait(1, timeout=T)
    except Exception as exc:  # noqa: BLE001
        return "root cause" in str(exc)
    return False
