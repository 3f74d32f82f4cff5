"""A/B of one zoo model's sync invocation between two tinyhal trees, by thread CPU time.

On a shared machine wall time swings between identical runs; a runtime that runs
everything on the calling thread (tinyhal `sync`) is measured better by that thread's
CPU time, and two trees are compared better side by side than run after run. This
starts one worker process per tree (A: the tree whose parent directory `--a-path` puts
first on `sys.path`, e.g. an unpacked `git archive` of the base with the same built C
extensions copied in; B: the installed tree), loads the model in each, then runs
`--rounds` rounds (A may instead be another interpreter with its own tinyhal installed,
`--a-python`, such as a virtual environment holding the base): per round each worker makes `--calls` calls and reports the median
thread-CPU microseconds per call, the order of A and B alternating from round to round.
Printed: each side's median over rounds and the median of the per-round B/A ratios.

    python bench/zoo_cpu_ab.py (--a-path BASE_TREE | --a-python BASE_PYTHON)
        [--models tiny,gru,lstm]
        [--driver sync] [--rounds 11] [--calls 300]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

WORKER = r'''
import sys, time
sys.path.insert(0, sys.argv[3])
sys.path.insert(0, sys.argv[4])
from zoo_vs_iree import models
import tinyhal
make_vmfb, function, make_inputs = models()[sys.argv[1]]
if len(sys.argv) > 5:  # the module compiled by the parent (this interpreter may lack onnx)
    with open(sys.argv[5], "rb") as f:
        vmfb = f.read()
else:
    vmfb = make_vmfb()
module = tinyhal.load(vmfb, device=sys.argv[2])
fn, inputs = getattr(module, function), make_inputs()
for _ in range(200):
    fn(*inputs)
print("ready", flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        start = time.thread_time_ns()
        fn(*inputs)
        times.append(time.thread_time_ns() - start)
    print(sorted(times)[len(times) // 2] / 1e3, flush=True)
'''


def compare(model: str, driver: str, a_path: str | None, a_python: str | None, rounds: int,
            calls: int) -> tuple:
    env_b = dict(os.environ)
    env_b.pop("PYTHONPATH", None)
    env_a = env_b if a_path is None else dict(env_b, PYTHONPATH=a_path)
    tests = os.path.join(HERE, "..", "tests")
    sys.path[:0] = [HERE, tests]
    from zoo_vs_iree import models

    made = models()[model][0]()  # bytes, or the path of a cached file
    vmfb = tempfile.NamedTemporaryFile(suffix=".vmfb")
    vmfb.write(made if isinstance(made, bytes) else pathlib.Path(made).read_bytes())
    vmfb.flush()
    workers = {}
    for side, env, python in (("A", env_a, a_python or sys.executable),
                              ("B", env_b, sys.executable)):
        workers[side] = subprocess.Popen(
            [python, "-c", WORKER, model, driver, HERE, tests, vmfb.name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=HERE)
    try:
        for worker in workers.values():
            if worker.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a worker for {model} did not start")
        times: dict[str, list[float]] = {"A": [], "B": []}
        for r in range(rounds):
            for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                workers[side].stdin.write(f"{calls}\n")
                workers[side].stdin.flush()
                times[side].append(float(workers[side].stdout.readline()))
    finally:
        for worker in workers.values():
            worker.stdin.close()
            worker.wait(timeout=60)
        vmfb.close()
    ratio = statistics.median(b / a for a, b in zip(times["A"], times["B"]))
    return statistics.median(times["A"]), statistics.median(times["B"]), ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sides = parser.add_mutually_exclusive_group(required=True)
    sides.add_argument("--a-path", help="directory holding the A tree as `tinyhal/`")
    sides.add_argument("--a-python", help="the interpreter of A, its own tinyhal installed")
    parser.add_argument("--models", default="tiny,gru,lstm")
    parser.add_argument("--driver", default="sync")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    print(f"{'model':10} {'A us':>8} {'B us':>8} {'B/A':>6}")
    for model in args.models.split(","):
        a, b, ratio = compare(model, args.driver,
                              args.a_path and os.path.abspath(args.a_path), args.a_python,
                              args.rounds, args.calls)
        print(f"{model:10} {a:8.1f} {b:8.1f} {ratio:6.3f}", flush=True)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
