"""The translation cache (`vm/translation_cache.py`): a second load reads what the first
translated, a changed tinyhal or a torn entry translates again, processes loading the same
module at once all succeed, and `TINYHAL_VM_CACHE=off` writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tinyhal
from support.child import run_child
from support.models import VM_LOOP_MLIR
from support.vm_pairs import vm_compile_source
from tinyhal.vm import codegen, translation_cache

TESTS = str(Path(__file__).resolve().parents[1])


@pytest.fixture
def loop_vmfb() -> str:
    return vm_compile_source(VM_LOOP_MLIR)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "vm-cache"
    monkeypatch.setenv("TINYHAL_VM_CACHE", str(folder))
    return folder


@pytest.fixture
def translations(monkeypatch) -> list[str]:
    """The names of the modules `codegen.generate_module` translated from here on."""
    seen: list[str] = []
    generate = codegen.generate_module

    def counting(module, verified):
        seen.append(module.name)
        return generate(module, verified)

    monkeypatch.setattr(codegen, "generate_module", counting)
    return seen


def _entries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("native-"))


def test_a_second_load_reads_the_translation(loop_vmfb, cache, translations):
    with tinyhal.load(loop_vmfb, device="sync") as first:
        expected = first.loop(1000)
    assert len(translations) == 1 and len(_entries(cache)) == 1
    with tinyhal.load(loop_vmfb, device="sync") as second, \
            tinyhal.load(loop_vmfb, device="sync") as third:
        assert second.loop(1000) == third.loop(1000) == expected
    assert len(translations) == 1  # both read the entry
    assert not list(cache.glob("*.tmp"))


def test_a_new_tinyhal_version_or_a_torn_entry_translates_again(loop_vmfb, cache,
                                                                 translations, monkeypatch):
    tinyhal.load(loop_vmfb, device="sync").close()
    (entry,) = _entries(cache)
    entry.write_bytes(entry.read_bytes()[:100])  # a torn write, as after a crash
    with tinyhal.load(loop_vmfb, device="sync") as module:
        assert module.loop(10) == module.loop(10)
    assert len(translations) == 2 and _entries(cache) == [entry]
    monkeypatch.setattr(translation_cache, "__version__", "999.0")
    tinyhal.load(loop_vmfb, device="sync").close()
    assert len(translations) == 3 and len(_entries(cache)) == 2


def test_off_writes_nothing_and_the_default_is_the_user_cache(loop_vmfb, tmp_path,
                                                             monkeypatch, translations):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TINYHAL_VM_CACHE", "off")
    assert translation_cache.cache_directory() is None
    for _ in range(2):
        tinyhal.load(loop_vmfb, device="sync").close()
    assert len(translations) == 2 and not (tmp_path / "xdg").exists()
    monkeypatch.delenv("TINYHAL_VM_CACHE")
    assert translation_cache.cache_directory() == str(tmp_path / "xdg" / "tinyhal" / "vm")
    tinyhal.load(loop_vmfb, device="sync").close()
    assert len(_entries(tmp_path / "xdg" / "tinyhal" / "vm")) == 1


LOAD_AND_PRINT = """
import sys
import tinyhal
with tinyhal.load(sys.argv[1], device="sync") as module:
    print(module.loop(5000))
"""


@pytest.mark.timeout(240)
def test_processes_loading_one_module_at_once_share_one_entry(loop_vmfb, cache):
    env = dict(os.environ, TINYHAL_VM_CACHE=str(cache))
    children = [subprocess.Popen([sys.executable, "-c", LOAD_AND_PRINT, loop_vmfb], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(6)]
    outputs = []
    for child in children:
        out, err = child.communicate(timeout=200)
        assert child.returncode == 0, err
        outputs.append(out)
    assert len(set(outputs)) == 1 and outputs[0].strip()
    assert len(_entries(cache)) == 1 and not list(cache.glob("*.tmp"))


def test_making_a_hal_module_compiles_nothing(cache):
    """The hal module's shims are plain functions (Python's bytecode cache keeps them):
    making a hal module in a new process compiles no code and needs no cache entry."""
    code = """
        import builtins
        import tinyhal.hal as hal
        from tinyhal.vm import create_hal_module

        def refuse(*args, **kwargs):
            raise AssertionError("making a hal module compiled code")
        device = hal.create_device("sync")
        builtins.compile = refuse
        create_hal_module(device)
        device.close()
        print("ok")
    """
    os.environ["TINYHAL_VM_CACHE"] = str(cache)  # monkeypatch restores it
    assert run_child(code).strip() == "ok"
    assert not list(cache.glob("native-*.pickle"))
