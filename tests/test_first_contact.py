"""What a new user meets first: packaging that installs without warnings, and errors that
say what went wrong (a missing file is NOT_FOUND, MLIR source gets a hint to compile it, a
misspelt keyword is named as one), a driver refusing profiling modes it cannot record as
IREE's local drivers refuse them, every command-line mistake of the three commands
refused before anything starts with exit status 2 and one line naming it, and nothing in
the package that fails to import."""

from __future__ import annotations

import io
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest

import tinyhal
from support.child import run_child
from tinyhal.errors import InvalidArgumentError, NotFoundError, UnimplementedError
from tinyhal.hal import create_device
from tinyhal.vm.run import run

ROOT = Path(__file__).resolve().parents[1]
SAXPY = ROOT / "server" / "models" / "saxpy" / "1" / "model.vmfb"
SAXPY_ARGS = [f"--module={SAXPY}", "--function=saxpy", "--input=2", "--input=3xf32=1,2,3",
              "--input=3xf32=1,1,1"]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_license_is_an_spdx_string():
    """A TOML table there is deprecated by setuptools (unsupported from 2027)."""
    project = _pyproject()
    assert isinstance(project["project"]["license"], str)
    assert any(r.startswith("setuptools>=77") for r in project["build-system"]["requires"])


def test_every_folder_python_would_import_as_a_package_is_listed():
    """setuptools warns about each folder holding package data whose name Python could
    import but that `packages` leaves out (the bundled models' folders)."""
    setuptools = _pyproject()["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    assert setuptools["package-dir"] == {"tinyhal": "."}
    missing = []
    for top in ("hal", "vm", "scheduler", "server"):
        for folder in [ROOT / top, *(ROOT / top).rglob("*")]:
            relative = folder.relative_to(ROOT)
            if (not folder.is_dir() or "__pycache__" in relative.parts
                    or not all(part.isidentifier() for part in relative.parts)
                    or not any(f.is_file() for f in folder.rglob("*")
                               if "__pycache__" not in f.parts)):
                continue
            name = ".".join(("tinyhal", *relative.parts))
            if name not in listed:
                missing.append(name)
    assert missing == []


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return run(list(argv), stdout=out, stderr=err), out.getvalue(), err.getvalue()


def test_a_missing_module_file_is_not_found_in_the_api_and_the_cli(tmp_path):
    missing = tmp_path / "model.vmfb"
    with pytest.raises(NotFoundError):
        tinyhal.load(missing)
    code, _, err = _run(f"--module={missing}")
    assert code == 1 and err.startswith("tinyhal-run: NOT_FOUND: ") and str(missing) in err


def test_mlir_source_passed_as_a_module_gets_a_hint_to_compile_it(tmp_path):
    source = tmp_path / "model.mlir"
    source.write_text("func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
                      "  return %x : tensor<4xf32>\n}\n")
    with pytest.raises(InvalidArgumentError, match="MLIR source text.*iree-compile"):
        tinyhal.load(source)
    code, _, err = _run(f"--module={source}")
    assert code == 1 and "compile it with iree-compile first" in err, err


def test_a_misspelt_load_keyword_is_named_as_one():
    with pytest.raises(InvalidArgumentError) as error:
        tinyhal.load(SAXPY, devce="task")
    message = str(error.value)
    assert "unknown keyword argument 'devce'" in message and "did you mean 'device'" in message


@pytest.mark.parametrize("driver", ["sync", "task"])
@pytest.mark.parametrize("mode", ["dispatch-events", "device-queue-events"])
def test_host_drivers_refuse_device_time_modes_as_iree_local_drivers_do(tmp_path, driver,
                                                                       mode):
    """iree-run-module --device=local-sync|local-task answers UNIMPLEMENTED for these;
    recording nothing instead would look like a run without dispatches."""
    device = create_device(driver)
    try:
        with pytest.raises(UnimplementedError, match=mode), device.profiling(mode):
            pass
    finally:
        device.close()
    code, _, err = _run(*SAXPY_ARGS, f"--device={driver}", f"--device_profiling_mode={mode}",
                        f"--device_profiling_output={tmp_path / 'p.jsonl'}")
    assert code == 1 and "UNIMPLEMENTED" in err and mode in err, err
    code, _, err = _run(*SAXPY_ARGS, f"--device={driver}",
                        "--device_profiling_mode=host-execution,queue-events",
                        f"--device_profiling_output={tmp_path / 'p.jsonl'}")
    assert code == 0, err


def test_everything_importable_in_the_package_imports():
    """`help(tinyhal)` and tools walking the package import every module they list: none
    may fail (the build hook at the root is listed as `tinyhal.setup`). `__main__`
    modules start a command, so only their presence is checked."""
    out = run_child("""
        import importlib, pkgutil
        import tinyhal

        failed = []
        names = [m.name for m in pkgutil.walk_packages(tinyhal.__path__, "tinyhal.",
                                                       onerror=failed.append)]
        for name in names:
            if name.rpartition(".")[2] != "__main__":
                try:
                    importlib.import_module(name)
                except Exception as exc:
                    failed.append(f"{name}: {exc!r}")
        print(len(names), failed)
    """)
    count, failed = out.split(" ", 1)
    assert int(count) > 50 and failed.strip() == "[]", out


def _one_line_exit_2(code: int, err: str, needle: str, prog: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"{prog}: ") and needle in err, err


CLI_MISTAKES = [  # (flags, what the one line must name)
    (["--device=cuda"], "unknown driver 'cuda'"),
    (["--device=emu://nosuch"], "unknown emu preset 'nosuch'"),
    (["--device=emu://edge-npu?lanes=2"], "queues=N"),
    (["--bogus=1"], "unrecognized arguments: --bogus=1"),
    (["--output_max_element_count=x"], "invalid int value: 'x'"),
    (["--device_allocator=bogus"], "unrecognized allocator 'bogus'"),
    (["--device_allocator=caching:x=1"], "no caching layer to configure"),
    (["--flagfile=/nonexistent/x.flags"], "--flagfile=/nonexistent/x.flags"),
]


@pytest.mark.parametrize("flags,needle", CLI_MISTAKES, ids=[f[0] for f, _ in CLI_MISTAKES])
def test_tinyhal_run_command_line_mistakes_exit_2_in_one_line(flags, needle, capfd):
    code, out, err = _run(*SAXPY_ARGS, *flags)
    err += capfd.readouterr().err  # argparse writes its own errors to sys.stderr
    _one_line_exit_2(code, err, needle, "tinyhal-run")
    assert out == ""


@pytest.mark.parametrize("flags,needle", [
    (["--device=cuda"], "unknown driver 'cuda'"),
    (["--device=emu://nosuch"], "unknown emu preset"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    ([], "takes one --module="),
])
def test_tinyhal_check_command_line_mistakes_exit_2_in_one_line(flags, needle, capfd):
    from tinyhal.vm.check import run as check

    err = io.StringIO()
    args = [*flags] if not flags else [f"--module={SAXPY}", *flags]
    code = check(args, stdout=io.StringIO(), stderr=err)
    _one_line_exit_2(code, err.getvalue() + capfd.readouterr().err, needle, "tinyhal-check")


SERVE_MISTAKES = [
    (["--device", "cuda"], "--device cuda: not a driver here"),
    (["--device", "emu://edge-npu"], "not a driver here"),
    (["--model-repository", "/nonexistent/models"], "is not a directory"),
    (["--keep-alive-timeout", "-1"], "--keep-alive-timeout must be a positive number"),
    (["--drain-timeout", "nan"], "--drain-timeout"),
    (["--port", "70000"], "out of range"),
    (["--port", "http"], "invalid int value: 'http'"),
    (["--max-request-bytes", "0"], "--max-request-bytes"),
    (["--load-model", "saxpy"], "needs --model-control-mode explicit"),
    (["--http-restricted-api", "nope"], "--http-restricted-api"),
    (["--log-level", "loud"], "invalid choice: 'loud'"),
]


@pytest.mark.parametrize("flags,needle", SERVE_MISTAKES,
                         ids=["-".join(f) for f, _ in SERVE_MISTAKES])
def test_tinyhal_serve_command_line_mistakes_exit_2_before_anything_starts(flags, needle):
    """Nothing starts first: no "listening" line, no model loaded, one line on stderr."""
    proc = subprocess.run([sys.executable, "-m", "tinyhal.server", "--port", "0", *flags],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout == ""
    _one_line_exit_2(proc.returncode, proc.stderr, needle, "tinyhal-serve")


def test_emu_timeline_without_the_plot_extra_says_so_in_one_line():
    script = ROOT / "bench" / "emu_timeline.py"
    proc = subprocess.run(
        [sys.executable, "-c", "import runpy, sys; sys.modules['matplotlib'] = None; "
         f"sys.argv = [{str(script)!r}]; runpy.run_path(sys.argv[0], run_name='__main__')"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and "pip install '.[plot]'" in proc.stderr


def test_the_public_api_docstrings_run_as_written():
    """`help()` on the entry points shows a self-contained example; each one runs."""
    import doctest

    from tinyhal.hal import Device, Fence, Semaphore, SemaphoreList  # noqa: F401

    finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner()
    examples = 0
    for obj in (tinyhal.load, Device.submit, Semaphore, Fence):
        for test in finder.find(obj, obj.__qualname__, globs={}):
            examples += len(test.examples)
            runner.run(test)
    assert examples >= 20 and runner.failures == 0
    assert "Points" not in str(Device.submit.__annotations__)


def test_every_flag_of_the_commands_is_described_in_help(capsys):
    """`--help` of each command describes every flag it takes, names the syntax a newcomer
    needs (`--input=` values, `--flagfile=`, `emu://PRESET`) and the exit statuses."""
    from tinyhal.server.main import _parser as serve_parser
    from tinyhal.vm.check import run as check
    from tinyhal.vm.run import _parser as run_parser

    for parser in (run_parser(), serve_parser()):
        undescribed = [a.option_strings for a in parser._actions if not a.help]
        assert undescribed == [], parser.prog
    texts = {}
    for name, show in (("tinyhal-run", lambda: run_parser().parse_args(["--help"])),
                       ("tinyhal-serve", lambda: serve_parser().parse_args(["--help"])),
                       ("tinyhal-check", lambda: check(["--help"]))):
        with pytest.raises(SystemExit) if name != "tinyhal-check" else nullcontext():
            show()
        texts[name] = capsys.readouterr().out
    run_help = texts["tinyhal-run"]
    for needle in ("--flagfile", "2x2xf32=1,2,3,4", "@file.npy", "emu://PRESET",
                   "--device_allocator", "exits 2"):
        assert needle in run_help, needle
    assert "emu://PRESET" in texts["tinyhal-check"] and "exits 2" in texts["tinyhal-check"]
    assert "idle client connection" in texts["tinyhal-serve"]


@pytest.mark.parametrize("allocator", ["caching", "debug"])
def test_iree_allocator_layers_run_as_iree_run_module_runs_them(allocator):
    from support.run_compare import assert_same_output

    assert_same_output([*SAXPY_ARGS, f"--device_allocator={allocator}"], ["sync", "task"])
