"""Mutation fuzzing of tinyhal's loaders (vmfb, FlatBuffer, bytecode, ELF executables).

Each case is a real `.vmfb` mutated deterministically from a seed (tests/support/
mutations.py: bit flips, byte and word overwrites, truncation, splices, insertions,
deletions, and targeted mutations of the embedded ELFs and of FlatBuffer offsets). Cases
run in batches inside long-lived child processes, each case with a timeout; a child that
dies or hangs is replaced, and its input is saved and re-run alone; so is a child in
which a kernel faulted (contained, but what it wrote before faulting may have damaged the
process). Every case is loaded and run (fixed inputs) on each driver asked for and
classified:

  ran       loaded and ran on every driver
  error     a clean tinyhal.Error (on at least one driver)
  unclear   a tinyhal.Error that is INTERNAL or only repeats a Python exception: a bug
  other     a non-tinyhal exception: a bug
  crash     the child died by a signal
  hang      the case exceeded its timeout

Every crash or hang is run through `iree-run-module` on the same file, to show whether
IREE crashes or hangs too (corrupted machine code cannot be caught by anyone). Writes
bench/results/fuzz_loaders.json, saves reproducers under bench/results/fuzz_repro/ and
prints a table. Seeded and reproducible; uses one child process per `--jobs`.

    python bench/fuzz_loaders.py                       # quick: ~1,200 cases, 2 jobs
    python bench/fuzz_loaders.py --cases 20000 --drivers sync,task,emu   # the full run
    python bench/fuzz_loaders.py --replay small_cnn:123  # one case, in this process
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from _common import RESULTS_DIR, print_table, write_results  # noqa: E402

from support.mutations import Subject, case_seed, mutate, subjects, touches_code  # noqa: E402

PYTHON_INTERNALS = re.compile(
    r"\b(IndexError|KeyError|struct\.error|UnicodeDecodeError|TypeError|ValueError|"
    r"AttributeError|RuntimeError|OverflowError|ZeroDivisionError|AssertionError|"
    r"cannot dereference|Traceback)")


def case_bytes(subject: Subject, seed: int, case: int, base: dict[str, bytes]) -> tuple[bytes,
                                                                                       str]:
    if subject.name not in base:
        with open(subject.path, "rb") as f:
            base[subject.name] = f.read()
    return mutate(base[subject.name], case_seed(seed, subject.name, case))


def run_case(data: bytes, subject: Subject, drivers: list[str]) -> tuple[str, str, bool]:
    """Loads and runs one mutated module on each driver; (outcome, detail, tainted):
    tainted when a kernel faulted, since what it wrote before faulting may have damaged
    this process (the next case must not pay for it)."""
    import tinyhal
    from tinyhal.errors import DeviceLostError, KernelFaultError

    outcome, detail, tainted = "ran", "", False
    for driver in drivers:
        module = None
        try:
            module = tinyhal.load(data, device=driver)
            module.invoke(subject.function, *subject.inputs())
        except tinyhal.Error as exc:
            text = str(exc)
            tainted = tainted or isinstance(exc, (KernelFaultError, DeviceLostError))
            if exc.code == tinyhal.errors.StatusCode.INTERNAL or PYTHON_INTERNALS.search(text):
                return "unclear", f"{driver}: {text}"[:400], tainted
            outcome, detail = "error", f"{driver}: {text}"[:300]
        except Exception as exc:  # noqa: BLE001 - the point is to count these
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            return "other", (f"{driver}: {type(exc).__name__}: {exc} "
                             f"({os.path.basename(tb.filename)}:{tb.lineno})")[:400], tainted
        finally:
            if module is not None:
                try:
                    module.close()
                except Exception:  # noqa: BLE001
                    pass
    return outcome, detail, tainted


def worker(args: argparse.Namespace) -> None:
    """The child: reads `subject case` lines, answers one JSON line per case."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    subs = {s.name: s for s in (Subject(**d) for d in json.loads(args.subjects_json))}
    drivers = args.drivers.split(",")
    base: dict[str, bytes] = {}
    for line in sys.stdin:
        name, case = line.split()
        subject = subs[name]
        data, _ = case_bytes(subject, args.seed, int(case), base)
        outcome, detail, tainted = run_case(data, subject, drivers)
        sys.stdout.write(json.dumps({"outcome": outcome, "detail": detail,
                                     "tainted": tainted}) + "\n")
        sys.stdout.flush()
        if tainted:
            return


class Child:
    """A worker process fed one case at a time, replaced when it dies or hangs."""

    def __init__(self, args: argparse.Namespace, subs: list[Subject]) -> None:
        payload = json.dumps([s.__dict__ for s in subs])
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "--seed", str(args.seed),
             "--drivers", args.drivers, "--subjects-json", payload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1)
        self.pending: tuple[str, int] | None = None
        self.started = 0.0

    def send(self, subject: str, case: int) -> None:
        self.pending = (subject, case)
        self.started = time.monotonic()
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{subject} {case}\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_cases(args: argparse.Namespace, subs: list[Subject], work: list[tuple[str, int]],
              on_result, fresh: bool = False) -> None:
    """Runs `work` over `args.jobs` children; calls on_result(subject, case, outcome, detail)."""
    queue = list(reversed(work))
    children: list[Child] = []
    try:
        while queue or any(c.pending for c in children):
            while len(children) < args.jobs and queue:
                children.append(Child(args, subs))
            for child in children:
                if child.pending is None and queue:
                    child.send(*queue.pop())
            busy = [c for c in children if c.pending]
            if not busy:
                break
            ready, _, _ = select.select([c.proc.stdout for c in busy], [], [], 0.5)
            now = time.monotonic()
            for child in list(busy):
                assert child.pending is not None
                if child.proc.stdout in ready:
                    line = child.proc.stdout.readline()
                    if line:
                        result = json.loads(line)
                        on_result(*child.pending, result["outcome"], result["detail"])
                        child.pending = None
                        if fresh or result["tainted"]:  # the next case starts clean
                            child.stop()
                            children.remove(child)
                        continue
                    rc = child.proc.wait()
                    sig = -rc if rc < 0 else 0
                    name = signal.Signals(sig).name if sig else f"exit {rc}"
                    on_result(*child.pending, "crash", name)
                elif now - child.started > args.timeout:
                    child.stop()
                    on_result(*child.pending, "hang", f"over {args.timeout:.0f} s")
                else:
                    continue
                child.pending = None
                child.stop()
                children.remove(child)
    finally:
        for child in children:
            child.stop()


IREE_DEVICES = ("local-sync", "local-task")


def iree_run(path: str, subject: Subject, device: str, timeout: float) -> tuple[str, bytes]:
    """How `iree-run-module` fares on `path` on one device: (verdict, stdout), the verdict
    being ran, error, crash (signal) or hang."""
    exe = os.path.join(os.path.dirname(sys.executable), "iree-run-module")
    cmd = [exe, f"--module={path}", f"--function={subject.function}", f"--device={device}",
           *subject.iree_inputs(os.path.dirname(path))]
    # A process group of its own: the `iree-run-module` on PATH is a wrapper script, and a
    # timeout must stop the real binary too.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "hang", b""
    if proc.returncode < 0:
        return f"crash ({signal.Signals(-proc.returncode).name})", stdout
    # IREE's tools catch fatal signals and exit with 256 - signal number.
    fatal = {256 - s: s for s in (signal.SIGILL, signal.SIGTRAP, signal.SIGABRT, signal.SIGBUS,
                                  signal.SIGFPE, signal.SIGSEGV)}
    if proc.returncode in fatal and b"error" not in stderr.lower():
        return f"crash ({fatal[proc.returncode].name}, exit {proc.returncode})", stdout
    if proc.returncode == 0:
        return "ran", stdout
    last = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return f"error (exit {proc.returncode}: {last[0][:120]})", stdout


def iree_verdict(path: str, subject: Subject, timeout: float, reference: bytes) -> dict:
    """`iree-run-module` on each CPU device until one crashes or hangs. Where IREE runs the
    file, whether it printed the unmutated module's results (`reference`): a corrupted
    kernel that IREE survives usually computes something else."""
    out: dict = {}
    for device in IREE_DEVICES:
        verdict, stdout = iree_run(path, subject, device, timeout)
        out[device] = verdict
        if verdict == "ran":
            out[f"{device} output"] = "same" if stdout == reference else "different"
        if verdict.startswith(("crash", "hang")):
            out["verdict"] = f"{verdict} on {device}"
            return out
    out["verdict"] = out[IREE_DEVICES[0]]
    return out


def replay(args: argparse.Namespace) -> None:
    name, case = args.replay.split(":")
    subject = subjects([name])[0]
    data, description = case_bytes(subject, args.seed, int(case), {})
    print(f"{name}:{case} {description}")
    print(run_case(data, subject, args.drivers.split(","))[:2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1200, help="total cases over all modules")
    parser.add_argument("--modules", default="tiny,small_cnn,system_elf")
    parser.add_argument("--drivers", default="sync", help="comma list of sync,task,emu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per case")
    parser.add_argument("--iree-timeout", type=float, default=30.0)
    parser.add_argument("--replay", help="SUBJECT:CASE: run one case in this process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--subjects-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.replay:
        return replay(args)

    subs = subjects(args.modules.split(","))
    by_name = {s.name: s for s in subs}
    per = args.cases // len(subs)
    work = [(s.name, c) for c in range(per) for s in subs]
    outcomes = ("ran", "error", "unclear", "other", "crash", "hang")
    counts = {s.name: dict.fromkeys(outcomes, 0) for s in subs}
    findings: list[dict] = []
    start = time.monotonic()
    done = 0

    def on_result(subject: str, case: int, outcome: str, detail: str) -> None:
        nonlocal done
        done += 1
        counts[subject][outcome] += 1
        if outcome in ("unclear", "other", "crash", "hang"):
            findings.append({"subject": subject, "case": case, "outcome": outcome,
                             "detail": detail})
        if done % 500 == 0:
            print(f"  {done}/{len(work)} cases, {time.monotonic() - start:.0f} s", flush=True)

    run_cases(args, subs, work, on_result)
    elapsed = time.monotonic() - start

    repro_dir = os.path.join(RESULTS_DIR, "fuzz_repro")
    os.makedirs(repro_dir, exist_ok=True)
    base: dict[str, bytes] = {}
    for finding in findings:
        subject = by_name[finding["subject"]]
        data, description = case_bytes(subject, args.seed, finding["case"], base)
        path = os.path.join(repro_dir, f"{subject.name}-{args.seed}-{finding['case']}.vmfb")
        with open(path, "wb") as f:
            f.write(data)
        finding.update(mutation=description, reproducer=os.path.relpath(path, HERE),
                       machine_code_changed=touches_code(base[subject.name], data), path=path)
    # Each finding again, alone in a fresh child; crashes and hangs through IREE's tool.
    alone: dict[tuple[str, int], str] = {}
    run_cases(args, subs, [(f["subject"], f["case"]) for f in findings],
              lambda s, c, o, d: alone.__setitem__((s, c), o), fresh=True)
    to_check = [f for f in findings if f["outcome"] in ("crash", "hang")]
    references = {}
    for s in subs:
        if any(f["subject"] == s.name for f in to_check):
            verdict, references[s.name] = iree_run(s.path, s, IREE_DEVICES[0], args.iree_timeout)
            assert verdict == "ran", f"iree-run-module fails on the unmutated {s.name}: {verdict}"
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        verdicts = pool.map(lambda f: iree_verdict(f["path"], by_name[f["subject"]],
                                                   args.iree_timeout, references[f["subject"]]),
                            to_check)
        for finding, verdict in zip(to_check, verdicts):
            finding["iree"] = verdict.pop("verdict")
            finding["iree_devices"] = verdict
    for finding in findings:
        finding["alone"] = alone.get((finding["subject"], finding["case"]), "?")
        del finding["path"]

    rows = []
    for s in subs:
        row = {"module": s.name, "cases": sum(counts[s.name].values()), **counts[s.name]}
        rows.append(row)
    totals = {"module": "total", "cases": sum(r["cases"] for r in rows),
              **{o: sum(r[o] for r in rows) for o in outcomes}}
    rows.append(totals)
    crash_hang = [f for f in findings if f["outcome"] in ("crash", "hang")]
    iree_too = sum(1 for f in crash_hang if f.get("iree", "").startswith(("crash", "hang")))
    iree_clean = [f for f in crash_hang if not f.get("iree", "").startswith(("crash", "hang"))]
    summary = {
        "cases": totals["cases"], "seconds": round(elapsed, 1), "drivers": args.drivers,
        "seed": args.seed, "crash_or_hang": len(crash_hang),
        # run again alone in a fresh child: a batch-only outcome (a slow case on a busy
        # machine, damage left by an earlier case) does not reproduce
        "crash_or_hang_reproduced_alone": sum(1 for f in crash_hang
                                              if f["alone"] in ("crash", "hang")),
        "crash_or_hang_where_iree_also_crashes_or_hangs": iree_too,
        "crash_or_hang_where_iree_is_clean": len(iree_clean),
        "of_which_reproduced_alone": sum(1 for f in iree_clean if f["alone"] in ("crash", "hang")),
        "of_which_machine_code_or_code_pointer_changed": sum(1 for f in iree_clean if f["machine_code_changed"]),
        "non_tinyhal_exceptions": totals["other"],
        "unclear_tinyhal_errors": totals["unclear"],
    }
    path = write_results("fuzz_loaders", rows, {"summary": summary, "findings": findings})
    print_table(rows, ["module", "cases", *outcomes])
    print()
    for f in findings:
        code = " code-changed" if f["machine_code_changed"] else ""
        print(f"{f['outcome']:5} {f['subject']}:{f['case']} alone={f['alone']} "
              f"iree={f.get('iree', '-')} {f.get('iree_devices', '')}{code} [{f['mutation']}] {f['detail'][:160]}")
    print(json.dumps(summary))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
