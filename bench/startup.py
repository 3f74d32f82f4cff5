"""Start-up cost, side by side with IREE's tools and runtime, in alternating rounds.

1. Whole process: `tinyhal-run` vs `iree-run-module` (local-task, same module, same inputs)
   on a small module (the bundled `saxpy` sample) and on MobileNetV2: wall time, CPU time
   (user + system) and peak RSS of the child, from `wait4`. tinyhal is measured with its
   translation cache warm (the usual case) and cold (a fresh cache directory per run).
2. `tinyhal-check` on a check-dialect suite. The pinned runtime wheel ships no
   `iree-check-module`, so the baseline is `iree-run-module` running one export of the same
   suite compiled without its check ops: the floor of any IREE tool's process.
3. In one fresh process per round: `tinyhal.load` + the first call vs iree.runtime's
   `VmModule.mmap` + `SystemContext` + the first call, on MobileNetV2, a small CNN and a
   keyword-spotting CNN, with the translation cache cold and warm. `tinyhal.load` reads
   the file into private memory by default (a later change to the file cannot reach the
   loaded module); the `mapped` row maps it privately as `VmModule.mmap` does, the same
   file access on both sides. Besides wall times the child reports its CPU time (every
   thread's, from the start of the timed part), which a loaded machine disturbs less.

Python's bytecode cache is on for every child (as after `pip install`, which byte-compiles
the package), whatever PYTHONDONTWRITEBYTECODE says here.

Both install kinds are measured in part 1: the environment running this script (an
editable install, `pip install -e .`, when run from a checkout as contributors do) and a
regular install (`pip install .` of this checkout into a fresh virtual environment made
for the run; `--regular-venv DIR` reuses one). `--small-only` measures part 1 on the
small module only (a few minutes instead of half an hour).

Models are built by the tests' builders (`tests/support/models.py`, compiled by the pinned
iree-compile and cached by content hash). Writes `bench/results/startup.json` and prints a
table; ratios are tinyhal / IREE, medians over the rounds.

    python bench/startup.py [--rounds 7] [--small-only] [--regular-venv DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from _common import print_table, write_results  # noqa: E402

from support.iree_tools import HOST_FLAGS, compile_mlir  # noqa: E402
from support.models import (  # noqa: E402
    ds_cnn_kws_vmfb,
    kws_input,
    mobilenet_input,
    mobilenet_v2_vmfb,
    small_cnn_vmfb,
)

BIN = Path(sys.executable).parent
SAXPY = HERE.parent / "server" / "models" / "saxpy" / "1" / "model.vmfb"

CHECK_SUITE = """
func.func @adds() {{
  %a = util.unfoldable_constant dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
  %b = arith.addf %a, %a : tensor<4xf32>
  {check_add}
  return
}}
func.func @counts() {{
  %c = util.unfoldable_constant 3 : i32
  {check_count}
  return
}}
"""


def _check_suite(with_checks: bool) -> Path:
    checks = {
        "check_add": "check.expect_almost_eq_const(%b, dense<[2.0, 4.0, 6.0, 8.0]> : "
                     "tensor<4xf32>) : tensor<4xf32>" if with_checks else "",
        "check_count": "check.expect_true(%c) : i32" if with_checks else "",
    }
    return compile_mlir(CHECK_SUITE.format(**checks), HOST_FLAGS)


# Linux keeps a process's peak RSS across exec, so a child forked from this (large) Python
# process reports at least this process's RSS. GNU time forks the measured program from a
# small process of its own and reports that program's peak alone.
GNU_TIME = "/usr/bin/time"  # Debian: apt-get install time


def run_process(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Wall seconds, CPU seconds and peak RSS (MiB) of one child process."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        wrapped = [GNU_TIME, "-f", "%M", "-o", rss.name, *argv]
        start = time.perf_counter()
        proc = subprocess.Popen(wrapped, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        error = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {error[-2000:]}")
        peak_kib = int(rss.read().split()[-1])
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mib": peak_kib / 1024}


LOAD_AND_CALL = r"""
import json, sys, time
import numpy as np
kind, vmfb, function, inputs = sys.argv[1:5]
x = np.load(inputs)
cpu_start = time.process_time()
start = time.perf_counter()
if kind.startswith("tinyhal"):
    import tinyhal
    module = tinyhal.load(vmfb, device="task", mapped=kind == "tinyhal-mapped")
    loaded = time.perf_counter()
    module.invoke(function, x)
else:
    import iree.runtime as rt
    ctx = rt.SystemContext(config=rt.Config("local-task"))
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, vmfb))
    loaded = time.perf_counter()
    ctx.modules.module[function](x).to_host()
end = time.perf_counter()
cpu = time.process_time() - cpu_start
print(json.dumps({"load_s": loaded - start, "first_call_s": end - loaded,
                  "total_s": end - start, "cpu_s": cpu}))
"""


def install_kind() -> str:
    """`editable` when the tinyhal this script runs is the checkout itself, else
    `regular`."""
    import tinyhal

    return "editable" if Path(tinyhal.__file__).resolve().parent == HERE.parent else "regular"


def regular_install(venv: Path) -> Path:
    """The `bin` folder of a virtual environment holding a regular (non-editable) install
    of this checkout, made at `venv` unless it already has `tinyhal-run`."""
    bin_dir = venv / "bin"
    if not (bin_dir / "tinyhal-run").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q",
                        str(HERE.parent)], check=True, timeout=1800)
    return bin_dir


def load_and_call(kind: str, vmfb: Path, function: str, inputs: Path,
                  env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", LOAD_AND_CALL, kind, str(vmfb), function,
                          str(inputs)], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout)


def _median(samples: list[dict[str, float]], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--small-only", action="store_true",
                        help="only tinyhal-run vs iree-run-module on the small module")
    parser.add_argument("--regular-venv", type=Path, default=None, metavar="DIR",
                        help="a virtual environment for the regular install (made if "
                             "missing; default: a temporary one)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tinyhal-startup-"))
    warm_cache = work / "vm-cache-warm"
    # Python's own bytecode cache on, as after `pip install` (which byte-compiles): an
    # editable or source checkout run with PYTHONDONTWRITEBYTECODE=1 would otherwise
    # compile every tinyhal module from source in every process. The untimed first runs
    # fill it.
    python_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    python_env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    base_env = dict(python_env, TINYHAL_VM_CACHE=str(warm_cache))
    this_kind = install_kind()
    installs = {this_kind: BIN}
    if this_kind == "editable":
        installs["regular"] = regular_install(args.regular_venv or work / "regular-venv")
    run_cases = {
        "small module (saxpy)": (
            [f"--module={SAXPY}", "--function=saxpy", "--input=2",
             "--input=3xf32=1,2,3", "--input=3xf32=1,1,1"]),
    }
    if not args.small_only:
        mobilenet = mobilenet_v2_vmfb()
        np.save(work / "mobilenet_x.npy", mobilenet_input())
        small_cnn = small_cnn_vmfb()
        np.save(work / "small_cnn_x.npy", mobilenet_input()[:, :, :64, :64].copy())
        kws = ds_cnn_kws_vmfb()
        np.save(work / "kws_x.npy", kws_input())
        check_suite, plain_suite = _check_suite(True), _check_suite(False)
        run_cases["MobileNetV2"] = [f"--module={mobilenet}", "--function=mobilenet_v2",
                                    f"--input=@{work / 'mobilenet_x.npy'}"]
    processes: dict[str, dict[str, list]] = {}
    cold_count = [0]

    def cold_env() -> dict[str, str]:
        cold_count[0] += 1
        return dict(python_env, TINYHAL_VM_CACHE=str(work / f"vm-cache-cold-{cold_count[0]}"))

    def sides(flags: list[str]) -> dict[str, tuple]:
        out = {}
        for kind, bin_dir in installs.items():
            run = [str(bin_dir / "tinyhal-run"), *flags, "--device=local-task"]
            out[f"tinyhal-run ({kind} install, cache warm)"] = (run, lambda: base_env)
            out[f"tinyhal-run ({kind} install, cache cold)"] = (run, cold_env)
        out["iree-run-module"] = ([str(BIN / "iree-run-module"), *flags,
                                   "--device=local-task"], lambda: base_env)
        return out

    cases = {name: sides(flags) for name, flags in run_cases.items()}
    if not args.small_only:
        cases["check suite"] = {
            "tinyhal-check (cache warm)": ([str(BIN / "tinyhal-check"),
                                            f"--module={check_suite}",
                                            "--device=local-task"], lambda: base_env),
            "iree-run-module (no iree-check-module)": (
                [str(BIN / "iree-run-module"), f"--module={plain_suite}", "--function=adds",
                 "--device=local-task"], lambda: base_env),
        }
    for tools in cases.values():  # one untimed run each: page cache, warm cache
        for argv, env in tools.values():
            run_process(argv, env())
    for _ in range(args.rounds):
        for case, tools in cases.items():
            for tool, (argv, env) in tools.items():
                processes.setdefault(case, {}).setdefault(tool, []).append(
                    run_process(argv, env()))

    models = {} if args.small_only else {
        "MobileNetV2": (mobilenet, "mobilenet_v2", work / "mobilenet_x.npy"),
        "small CNN": (small_cnn, "small_cnn", work / "small_cnn_x.npy"),
        "DS-CNN KWS": (kws, "ds_cnn_kws", work / "kws_x.npy")}
    loads: dict[str, dict[str, list]] = {}
    for vmfb, function, inputs in models.values():
        load_and_call("tinyhal", vmfb, function, inputs, base_env)  # warms the cache
    for _ in range(args.rounds):
        for model, (vmfb, function, inputs) in models.items():
            per = loads.setdefault(model, {})
            per.setdefault("iree.runtime", []).append(
                load_and_call("iree", vmfb, function, inputs, base_env))
            per.setdefault("tinyhal (cache cold)", []).append(
                load_and_call("tinyhal", vmfb, function, inputs, cold_env()))
            per.setdefault("tinyhal (cache warm)", []).append(
                load_and_call("tinyhal", vmfb, function, inputs, base_env))
            per.setdefault("tinyhal (cache warm, mapped)", []).append(
                load_and_call("tinyhal-mapped", vmfb, function, inputs, base_env))

    rows = []
    for case, tools in processes.items():
        baseline = next(samples for tool, samples in tools.items() if tool.startswith("iree"))
        for tool, samples in tools.items():
            rows.append({
                "what": case, "tool": tool,
                "wall_ms": 1e3 * _median(samples, "wall_s"),
                "cpu_ms": 1e3 * _median(samples, "cpu_s"),
                "peak_rss_mib": _median(samples, "rss_mib"),
                "wall_x": _median(samples, "wall_s") / _median(baseline, "wall_s"),
                "cpu_x": _median(samples, "cpu_s") / _median(baseline, "cpu_s"),
                "rss_x": _median(samples, "rss_mib") / _median(baseline, "rss_mib"),
            })
    print("whole process (medians of", args.rounds, "alternating rounds; x = / IREE)")
    print_table(rows, ["what", "tool", "wall_ms", "cpu_ms", "peak_rss_mib", "wall_x", "cpu_x",
                       "rss_x"])

    load_rows = []
    for model, sides_ in loads.items():
        baseline = sides_["iree.runtime"]
        for side, samples in sides_.items():
            load_rows.append({
                "model": model, "runtime": side,
                "load_ms": 1e3 * _median(samples, "load_s"),
                "first_call_ms": 1e3 * _median(samples, "first_call_s"),
                "total_ms": 1e3 * _median(samples, "total_s"),
                "total_x": _median(samples, "total_s") / _median(baseline, "total_s"),
                "cpu_ms": 1e3 * _median(samples, "cpu_s"),
                "cpu_x": _median(samples, "cpu_s") / _median(baseline, "cpu_s"),
            })
    if load_rows:
        print("\nload + first call in a fresh process (medians; x = / iree.runtime)")
        print_table(load_rows, ["model", "runtime", "load_ms", "first_call_ms", "total_ms",
                                "total_x", "cpu_ms", "cpu_x"])
    load_average = os.getloadavg()
    print(f"\nload average during the run: {load_average[0]:.2f} {load_average[1]:.2f} "
          f"{load_average[2]:.2f}")
    path = write_results("startup", rows + load_rows, {
        "rounds": args.rounds, "load_average": load_average,
        "samples": {"processes": processes, "loads": loads},
    })
    print("wrote", path)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
