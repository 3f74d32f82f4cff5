"""Host apps' native modules written in Python, linked into `tinyhal.load` and
`tinyhal-run` and called from compiled code (checked against iree.runtime running the
same module with a `PyModuleInterface`), and exports whose names hold dots."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tinyhal
from support.iree_tools import HOST_FLAGS, compile_mlir
from tinyhal.hal.buffer_view import BufferView
from tinyhal.vm import NativeModule, create_hal_module
from tinyhal.vm.run import run

IREE_RUN = str(Path(sys.executable).with_name("iree-run-module"))

# `func.func private @mymod.fn` declares an import of `fn` from module `mymod`; tensors
# cross as !hal.buffer_view refs, so `process` has calling convention 0r_r.
CUSTOM_MLIR = """
func.func private @mymod.scale(i32, f32) -> i32
func.func private @mymod.process(tensor<4xf32>) -> tensor<4xf32>
func.func @main(%a: i32, %t: tensor<4xf32>) -> (i32, tensor<4xf32>) {
  %c = arith.constant 2.5 : f32
  %0 = call @mymod.scale(%a, %c) : (i32, f32) -> i32
  %1 = call @mymod.process(%t) : (tensor<4xf32>) -> tensor<4xf32>
  %2 = arith.addf %1, %t : tensor<4xf32>
  return %0, %2 : i32, tensor<4xf32>
}
"""

DOTS_MLIR = """
func.func @"i16i16.i32"(%a: tensor<4xi16>, %b: tensor<4xi16>) -> tensor<4xi32> {
  %0 = arith.extsi %a : tensor<4xi16> to tensor<4xi32>
  %1 = arith.extsi %b : tensor<4xi16> to tensor<4xi32>
  %2 = arith.muli %0, %1 : tensor<4xi32>
  return %2 : tensor<4xi32>
}
func.func @"a.b.c"(%a: i32) -> i32 {
  %0 = arith.addi %a, %a : i32
  return %0 : i32
}
func.func @plain(%a: i32) -> i32 {
  return %a : i32
}
"""


@pytest.fixture(scope="module")
def custom_vmfb() -> str:
    return str(compile_mlir(CUSTOM_MLIR, HOST_FLAGS))


@pytest.fixture(scope="module")
def dots_vmfb() -> str:
    return str(compile_mlir(DOTS_MLIR, HOST_FLAGS))


def make_mymod(calls: list) -> NativeModule:
    mymod = NativeModule("mymod")

    @mymod.export("scale", "0if_i")
    def scale(a: int, f: float) -> int:
        calls.append(("scale", a, f))
        return int(a * f)

    @mymod.export("process", "0r_r")
    def process(view: BufferView) -> BufferView:
        calls.append(("process", view.to_numpy().tolist()))
        return view

    return mymod


IREE_SIDE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import iree.runtime as rt

    calls = []
    class MyMod:
        def __init__(self, iface):
            pass
        def scale(self, a, f):
            calls.append(["scale", a, f])
            return int(a * f)
        def process(self, ref):
            view = ref.deref(rt.HalBufferView)
            n = view.byte_length // 4
            calls.append(["process", view.map().asarray([n], np.dtype(np.float32)).tolist()])
            return ref
    iface = rt.PyModuleInterface("mymod", MyMod)
    iface.export("scale", "0if_i", MyMod.scale)
    iface.export("process", "0r_r", MyMod.process)
    config = rt.Config("local-sync")
    ctx = rt.SystemContext(
        vm_modules=[iface.create(), rt.VmModule.mmap(config.vm_instance, sys.argv[1])],
        config=config)
    n, t = ctx.modules.module.main(7, np.array([1.5, -2, 3, 0.25], np.float32))
    print(json.dumps({"n": n, "t": np.asarray(t).tolist(), "calls": calls}))
""")


@pytest.fixture(scope="module")
def iree_custom(custom_vmfb) -> dict:
    proc = subprocess.run([sys.executable, "-c", IREE_SIDE, custom_vmfb], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[0])


@pytest.mark.parametrize("device", ["sync", "task", "emu"])
def test_python_native_module_is_called_from_compiled_code(custom_vmfb, iree_custom, device):
    calls: list = []
    with tinyhal.load(custom_vmfb, device=device, modules=[make_mymod(calls)]) as m:
        n, t = m.main(7, np.array([1.5, -2, 3, 0.25], np.float32))
    assert n == iree_custom["n"] == 17
    assert t.tolist() == iree_custom["t"]
    assert [list(c) for c in calls] == iree_custom["calls"]


def test_module_factories_get_the_device(custom_vmfb):
    seen = []

    def factory(device):
        seen.append(device)
        return make_mymod([])

    with tinyhal.load(custom_vmfb, device="sync", modules=[factory]) as m:
        assert m.main(2, np.ones(4, np.float32))[0] == 5
        assert seen == [m.device]


def test_calling_convention_mismatch_names_the_function(custom_vmfb):
    wrong = NativeModule("mymod")
    wrong.export("scale", "0ii_i")(lambda a, b: a)
    wrong.export("process", "0r_r")(lambda v: v)
    with pytest.raises(tinyhal.Error, match=r"mymod\.scale.*0if_i.*0ii_i"):
        tinyhal.load(custom_vmfb, device="sync", modules=[wrong])


def test_missing_import_and_missing_module_are_named(custom_vmfb):
    partial = NativeModule("mymod")
    partial.export("scale", "0if_i")(lambda a, f: a)
    with pytest.raises(tinyhal.Error, match=r"mymod\.process"):
        tinyhal.load(custom_vmfb, device="sync", modules=[partial])
    with pytest.raises(tinyhal.Error, match="mymod"):
        tinyhal.load(custom_vmfb, device="sync")
    with pytest.raises(tinyhal.Error, match="NativeModule"):
        tinyhal.load(custom_vmfb, device="sync", modules=["mymod"])


def test_hal_module_factory_is_public(custom_vmfb):
    from tinyhal.hal import create_device
    from tinyhal.vm import Context, load_module

    device = create_device("sync")
    try:
        ctx = Context([create_hal_module(device), make_mymod([]), load_module(custom_vmfb)])
        view = BufferView.from_numpy(device, np.ones(4, np.float32))
        n, out = ctx.invoke("module.main", [3, view])
        assert n == 7 and out.to_numpy().tolist() == [2.0] * 4
        ctx.close()
    finally:
        device.close()


def test_tinyhal_run_links_native_modules(custom_vmfb, tmp_path, monkeypatch):
    (tmp_path / "my_native_mods.py").write_text(textwrap.dedent("""
        from tinyhal.vm import NativeModule

        def create(device):
            m = NativeModule("mymod")
            m.export("scale", "0if_i")(lambda a, f: int(a * f))
            m.export("process", "0r_r")(lambda v: v)
            return m
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    out, err = io.StringIO(), io.StringIO()
    rc = run(["--device=sync", f"--module={custom_vmfb}", "--native_module=my_native_mods:create",
              "--input=4", "--input=4xf32=1 2 3 4"], stdout=out, stderr=err)
    assert (rc, err.getvalue()) == (0, "")
    assert out.getvalue() == ("EXEC @main\nresult[0]: i32=10\nresult[1]: hal.buffer_view\n"
                              "4xf32=2 4 6 8\n")
    rc = run(["--device=sync", f"--module={custom_vmfb}", "--native_module=nope:create",
              "--input=4", "--input=4xf32=1"], stdout=io.StringIO(), stderr=err)
    assert rc == 1 and "nope" in err.getvalue()


def test_tinyhal_run_finds_native_modules_in_the_current_directory(custom_vmfb, tmp_path):
    """`--native_module=pkg.mod:factory` as the README writes it, from the folder holding
    `pkg/`, with no PYTHONPATH: resolved as `python -m` resolves modules."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text(textwrap.dedent("""
        from tinyhal.vm import NativeModule

        def factory(device):
            m = NativeModule("mymod")
            m.export("scale", "0if_i")(lambda a, f: int(a * f))
            m.export("process", "0r_r")(lambda v: v)
            return m
    """))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("tinyhal-run")), "--device=sync",
         f"--module={custom_vmfb}", "--native_module=pkg.mod:factory", "--input=4",
         "--input=4xf32=1 2 3 4"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "result[0]: i32=10" in proc.stdout


# -- export names are opaque -----------------------------------------------------------------


@pytest.mark.parametrize("device", ["sync", "task", "emu"])
def test_exports_named_with_dots(dots_vmfb, device):
    import iree.runtime as rt

    oracle = rt.load_vm_flatbuffer_file(dots_vmfb, driver="local-sync")
    a = np.array([1, -2, 300, 4], np.int16)
    b = np.array([-2, 7, 300, 0], np.int16)
    with tinyhal.load(dots_vmfb, device=device) as m:
        assert m.function_names == ["i16i16.i32", "a.b.c", "plain"]
        got = m.invoke("i16i16.i32", a, b)
        np.testing.assert_array_equal(got, np.asarray(oracle["i16i16.i32"](a, b)))
        assert m.invoke("a.b.c", 21) == oracle["a.b.c"](21) == 42
        assert m.plain(5) == 5
        assert "plain" in dir(m) and "a.b.c" not in dir(m)
        with pytest.raises(tinyhal.Error, match="i16i16"):
            m.invoke("i16i16")
        with pytest.raises(AttributeError):
            m.i16i16  # noqa: B018 - the attribute lookup is the test


def test_tinyhal_run_invokes_dotted_exports(dots_vmfb):
    flags = [f"--module={dots_vmfb}", "--function=i16i16.i32", "--input=4xi16=1 2 3 4",
             "--input=4xi16=-2"]
    iree = subprocess.run([IREE_RUN, "--device=local-sync", *flags], capture_output=True,
                          text=True, timeout=60)
    out, err = io.StringIO(), io.StringIO()
    assert run(["--device=sync", *flags], stdout=out, stderr=err) == 0 == iree.returncode
    assert out.getvalue() == iree.stdout


def test_declared_refs_are_checked_before_the_function_runs():
    """An export with declared refs checks them before its body runs, in a generated
    wrapper that then calls it."""
    from tinyhal.errors import InvalidArgumentError
    from tinyhal.vm.native import RefType

    seen = []

    def describe(view, scale):
        seen.append(scale)
        return view.shape[0] * scale

    refs = (RefType(BufferView, "hal.buffer_view", nullable=False), None)
    module = NativeModule("m")
    module.export("wrapped", "0ri_i", refs=refs)(describe)
    wrapped = module.lookup("m.wrapped").fn
    assert wrapped.__code__.co_filename.startswith("<marshal")
    device = tinyhal.hal.create_device("sync")
    try:
        view = BufferView.from_numpy(device, np.zeros(3, np.float32))
        assert wrapped(view, 2) == 6 and seen == [2]
        with pytest.raises(InvalidArgumentError,
                           match="expected a hal.buffer_view ref but got null"):
            wrapped(None, 1)
        with pytest.raises(InvalidArgumentError,
                           match="expected a hal.buffer_view ref but got str"):
            wrapped("view", 1)
        assert seen == [2]
    finally:
        device.close()
