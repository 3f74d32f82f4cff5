"""`--python-cpu`: the event loop and single model instances share one CPU; what runs in
parallel (task-device workers, several instances of one model) keeps every CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import trio

from tinyhal.server import cpus
from tinyhal.server.instances import InstanceThread

pytestmark = pytest.mark.timeout(120)

needs_two = pytest.mark.skipif(len(cpus.PROCESS_CPUS) < 2 or not sys.platform.startswith(
    "linux"), reason="needs Linux and at least two CPUs this process may use")


def _allowed(pid: int, tid: int) -> set[int]:
    """The CPUs thread `tid` of `pid` may run on (from /proc)."""
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        text = f.read()
    spec = text.split("Cpus_allowed_list:", 1)[1].split("\n", 1)[0].strip()
    found: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


def test_choose_names_what_it_refuses(tmp_path, monkeypatch):
    # a lock directory of its own: servers running elsewhere on the machine (another
    # suite, a user's) may hold every CPU's lock in the shared one
    monkeypatch.setenv(cpus.LOCK_DIR_ENV, str(tmp_path))
    assert cpus.choose("none") is None
    if len(cpus.PROCESS_CPUS) >= 2:
        assert cpus.choose("auto") in cpus.PROCESS_CPUS
        cpu = min(cpus.PROCESS_CPUS)
        assert cpus.choose(str(cpu)) == cpu
        with pytest.raises(ValueError, match="not one this process may use"):
            cpus.choose(str(max(cpus.PROCESS_CPUS) + 1000))
        with pytest.raises(ValueError, match="not auto, none or a CPU number"):
            cpus.choose("fast")
    else:
        assert cpus.choose("auto") is None


@needs_two
def test_an_instance_thread_runs_on_the_cpu_it_was_given():
    cpu = max(cpus.PROCESS_CPUS)
    seen: list[tuple[set[int], int]] = []

    async def main() -> None:
        done = trio.Event()
        instance = InstanceThread("pinned", trio.lowlevel.current_trio_token(), cpu)
        instance.submit([(lambda: (os.sched_getaffinity(0), os.sched_getscheduler(0)),
                          lambda r: (seen.append(r), done.set()))])
        with trio.fail_after(30):
            await done.wait()
        instance.stop()

    trio.run(main)
    assert seen == [({cpu}, os.SCHED_BATCH)]
    assert os.sched_getaffinity(0) == set(cpus.PROCESS_CPUS)  # the caller is untouched
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/comm"), reason="needs Linux")
def test_an_instance_thread_shows_its_instance_name_to_the_system():
    names = ["gru_step/1#0", "a_model_name_longer_than_fifteen/1#0", "\u00e9" * 8]
    seen: list[str] = []

    async def main() -> None:
        for name in names:
            instance = InstanceThread(name, trio.lowlevel.current_trio_token())
            done = trio.Event()
            instance.submit([(lambda: open("/proc/thread-self/comm").read().strip(),
                              lambda r, done=done: (seen.append(r), done.set()))])
            with trio.fail_after(30):
                await done.wait()
            instance.stop()

    trio.run(main)
    # Linux keeps 15 bytes: a character cut in two is dropped whole
    assert seen == ["gru_step/1#0", "a_model_name_lo", "\u00e9" * 7]


@needs_two
def test_devices_made_for_a_pinned_loop_keep_every_cpu(start_server, repository):
    """The loop is pinned; the task device of `saxpy` (made on a helper thread the loop
    started) still has workers on every CPU, as without the flag."""
    cpu = min(cpus.PROCESS_CPUS)
    server = start_server("--model-repository", str(repository), "--python-cpu", str(cpu))
    pid = server.proc.pid
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    assert _allowed(pid, pid) == {cpu}  # the event loop
    # every thread starts with its creator's CPUs: pinned like the loop unless made by
    # the loader thread, which takes every CPU back (it counts as one of them)
    allowed = [_allowed(pid, t) for t in tids]
    assert sum(a == set(cpus.PROCESS_CPUS) for a in allowed) >= 2, allowed
    # the pinned threads run as batch threads (no wake-up preemption between them); the
    # device workers made for the loop stay ordinary threads
    assert os.sched_getscheduler(pid) == os.SCHED_BATCH
    policies = {os.sched_getscheduler(t) for t, a in zip(tids, allowed)
                if a == set(cpus.PROCESS_CPUS)}
    assert policies == {os.SCHED_OTHER}, policies


@needs_two
def test_a_cpu_the_process_may_not_use_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "tinyhal.server.main", "--port", "0",
                           "--python-cpu", "100000"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "--python-cpu: CPU 100000 is not one this process may use" in proc.stderr


@needs_two
def test_a_policy_the_operator_chose_is_kept():
    """Started with `chrt --idle` (say), pinned threads keep that policy: only an
    ordinary process's pinned threads become batch threads."""
    code = ("import os\n"
            "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
            "from tinyhal.server import cpus\n"
            "cpus.pin_current_thread(min(cpus.PROCESS_CPUS))\n"
            "pinned = os.sched_getscheduler(0)\n"
            "cpus.use_process_cpus()\n"
            "print(pinned == os.SCHED_IDLE, os.sched_getscheduler(0) == os.SCHED_IDLE)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stderr
