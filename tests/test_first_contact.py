"""What a new user meets first: packaging that installs without warnings, and errors that
say what went wrong (a missing file is NOT_FOUND, MLIR source gets a hint to compile it, a
misspelt keyword is named as one), a driver refusing profiling modes it cannot record as
IREE's local drivers refuse them."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import tinyhal
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
