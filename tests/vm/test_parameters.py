"""External parameters (`io_parameters`): programs compiled by the pinned compiler read
their weights from `.irpa`, `.safetensors` and `.gguf` files, and give iree.runtime's
and iree-run-module's bits on every driver, through `tinyhal.load(parameters=...)` and
`tinyhal-run --parameters=`.

The archives are made by IREE's own tools (`iree-create-parameters`, including a splat
archive; `iree-convert-parameters`; `iree-opt --iree-io-export-parameters`;
`iree-import-onnx --externalize-params` on an MLP built with `onnx.helper`) and by the
formats' own writers (`safetensors`, `gguf`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tinyhal
from support.child import run_child
from support.iree_tools import HOST_FLAGS, compile_mlir
from support.run_compare import assert_same_output, tinyhal_run
from tinyhal.errors import (
    DataLossError,
    Error,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    UnimplementedError,
)
from tinyhal.vm.parameter_formats import ParameterIndex

BIN = Path(sys.executable).parent
DRIVERS = ["sync", "task", "emu"]

# Parameters of several element types and sizes: a byte count that is not a multiple of
# 4 (h) shifts the storage of what follows in formats that do not align (safetensors).
def _dense_mlir(x: str, w: str, b: str, rows: int, k: int, n: int) -> str:
    """MLIR lines computing `%r = x @ w + b` (f32, `b` added to every row), the layer both
    programs below run on their parameters."""
    out = f"tensor<{rows}x{n}xf32>"
    return f"""  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {out}
  %f = linalg.fill ins(%z : f32) outs(%e : {out}) -> {out}
  %m = linalg.matmul ins({x}, {w} : tensor<{rows}x{k}xf32>, tensor<{k}x{n}xf32>)
                     outs(%f : {out}) -> {out}
  %r = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>,
                                        affine_map<(i, j) -> (j)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}}
      ins(%m, {b} : {out}, tensor<{n}xf32>) outs(%e : {out}) {{
  ^bb0(%a: f32, %c: f32, %o: f32):
    %sum = arith.addf %a, %c : f32
    linalg.yield %sum : f32
  }} -> {out}
"""


PROGRAM = """
util.global private @w = #stream.parameter.named<"model"::"w"> : tensor<8x4xf32>
util.global private @b = #stream.parameter.named<"model"::"b"> : tensor<4xf32>
util.global private @q = #stream.parameter.named<"model"::"q"> : tensor<4xi8>
util.global private @h = #stream.parameter.named<"model"::"h"> : tensor<5xf16>
func.func @main(%x: tensor<2x8xf32>) -> (tensor<2x4xf32>, tensor<4xi8>, tensor<5xf16>) {
  %w = util.global.load @w : tensor<8x4xf32>
  %b = util.global.load @b : tensor<4xf32>
  %q = util.global.load @q : tensor<4xi8>
  %h = util.global.load @h : tensor<5xf16>
""" + _dense_mlir("%x", "%w", "%b", 2, 8, 4) + """  %q2 = arith.addi %q, %q : tensor<4xi8>
  %h2 = arith.mulf %h, %h : tensor<5xf16>
  return %r, %q2, %h2 : tensor<2x4xf32>, tensor<4xi8>, tensor<5xf16>
}
"""

ARRAYS = {
    "w": (np.arange(32, dtype=np.float32).reshape(8, 4) - 7.5) / 3,
    "b": np.array([0.125, -0.5, 7.0, 1.0], np.float32),
    "q": np.array([-7, 100, 3, -128], np.int8),
    "h": np.array([0.5, -1.25, 3.0, 1e-3, 70.0], np.float16),
}
INPUT = (np.arange(16, dtype=np.float32).reshape(2, 8) - 4) / 5


def _tool(name: str, *args: str, cwd: Path | None = None) -> None:
    proc = subprocess.run([str(BIN / name), *args], capture_output=True, text=True,
                          timeout=240, cwd=cwd)
    assert proc.returncode == 0, f"{name} {args}: {proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def programs() -> dict[str, Path]:
    """The program compiled for unified memory (`io_parameters.load`) and for discrete
    memory (`io_parameters.gather`)."""
    return {"load": compile_mlir(PROGRAM, HOST_FLAGS),
            "gather": compile_mlir(PROGRAM, [*HOST_FLAGS,
                                             "--iree-stream-resource-memory-model=discrete"])}


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> dict[str, Path]:
    """The same four parameters in every format, made by each format's writers."""
    import gguf
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("archives")
    out = {"safetensors": d / "p.safetensors", "gguf": d / "p.gguf"}
    save_file(dict(ARRAYS), str(out["safetensors"]))
    writer = gguf.GGUFWriter(str(out["gguf"]), "tinyhal-test")
    for key, array in ARRAYS.items():
        # IREE 3.13 reads GGML's original type numbering, where integer types are not
        # where today's writers put them: `q` goes in as the f32 holding its four bytes.
        writer.add_tensor(key, array.view(np.float32) if key == "q" else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out["irpa-from-safetensors"] = d / "from_st.irpa"
    _tool("iree-convert-parameters", f"--parameters={out['safetensors']}",
          f"--output={out['irpa-from-safetensors']}")
    out["irpa-from-gguf"] = d / "from_gguf.irpa"
    _tool("iree-convert-parameters", f"--parameters={out['gguf']}",
          f"--output={out['irpa-from-gguf']}")
    out["irpa-created"] = d / "created.irpa"
    # (iree-create-parameters 3.13 fails writing a `--data=` with a pattern: zeroed data)
    _tool("iree-create-parameters", "--data=w=8x4xf32", "--data=b=4xf32",
          "--splat=q=4xi8=5", "--data=h=5xf16", f"--output={out['irpa-created']}")
    out["irpa-splat"] = d / "splat.irpa"
    _tool("iree-create-parameters", "--splat=w=8x4xf32=0.75", "--splat=b=4xf32=-3.5",
          "--splat=q=4xi8=9", "--splat=h=5xf16=1.5", f"--output={out['irpa-splat']}")
    out["mixed"] = d / "mixed.irpa"  # splat and data entries in one archive
    _tool("iree-convert-parameters", f"--parameters={out['safetensors']}",
          "--splat=q=i8=-4", f"--output={out['mixed']}")
    return out


def iree_results(vmfb: Path, parameters: list[tuple[str, Path]], function: str,
                 *args: np.ndarray) -> list[np.ndarray]:
    """What iree.runtime returns with the parameter files indexed by scope."""
    import iree.runtime as rt

    config = rt.Config("local-sync")
    by_scope: dict[str, object] = {}
    for scope, path in parameters:
        index = by_scope.get(scope)
        if index is None:
            index = by_scope[scope] = rt.ParameterIndex()
        index.load(str(path))
    providers = [index.create_provider(scope=scope) for scope, index in by_scope.items()]
    params = rt.create_io_parameters_module(config.vm_instance, *providers)
    main = rt.VmModule.mmap(config.vm_instance, str(vmfb))
    context = rt.SystemContext(vm_modules=[params, main], config=config)
    results = context.modules[main.name][function](*args)
    if not isinstance(results, (tuple, list)):
        results = [results]
    return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]


def _as_list(results) -> list[np.ndarray]:
    return list(results) if isinstance(results, tuple) else [results]


def assert_same_bits(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


FORMATS = ["safetensors", "gguf", "irpa-from-safetensors", "irpa-from-gguf",
           "irpa-created", "irpa-splat", "mixed"]


@pytest.mark.parametrize("form", ["load", "gather"])
@pytest.mark.parametrize("archive", FORMATS)
def test_every_format_gives_iree_bits_on_every_driver(programs, archives, archive, form):
    vmfb, path = programs[form], archives[archive]
    expected = iree_results(vmfb, [("model", path)], "main", INPUT)
    for driver in DRIVERS:
        with tinyhal.load(vmfb, device=driver, parameters={"model": path}) as module:
            assert_same_bits(_as_list(module.main(INPUT)), expected)
            assert_same_bits(_as_list(module.main(INPUT)), expected)
    if archive == "safetensors":  # the weights really came from the file
        np.testing.assert_allclose(expected[0], INPUT @ ARRAYS["w"] + ARRAYS["b"],
                                   rtol=1e-6)


def test_tinyhal_run_prints_what_iree_run_module_prints(programs, archives):
    for archive in ("gguf", "irpa-splat", "safetensors"):
        for form in ("load", "gather"):
            assert_same_output(
                [f"--module={programs[form]}", f"--parameters=model={archives[archive]}",
                 "--function=main", "--input=2x8xf32=1 2 3 4 5 6 7 8 -1 -2 -3 -4 0 0 0 9"],
                DRIVERS)


def test_two_files_in_one_scope_merge_first_wins(programs, archives, tmp_path):
    """Repeated `--parameters=` of one scope merge; a key in both resolves to the first
    file's (here: `q` and `h` from the splat archive, the rest from safetensors)."""
    from safetensors.numpy import save_file

    part = tmp_path / "qh.safetensors"
    save_file({"q": np.array([1, 2, 3, 4], np.int8), "h": np.ones(5, np.float16)}, str(part))
    files = [("model", part), ("model", archives["safetensors"])]
    expected = iree_results(programs["load"], files, "main", INPUT)
    with tinyhal.load(programs["load"], device="sync",
                      parameters={"model": [part, archives["safetensors"]]}) as module:
        assert_same_bits(_as_list(module.main(INPUT)), expected)
    assert_same_output([f"--module={programs['load']}", f"--parameters=model={part}",
                        f"--parameters=model={archives['safetensors']}",
                        "--input=2x8xf32=0.5"], ["task"], iree_device="local-sync")


def test_in_memory_index(programs):
    """A mapping of arrays and a `ParameterIndex` built in memory (zero-copy where the
    program takes the weights in place) give the bits of the same weights in a file."""
    index = ParameterIndex()
    for key, array in ARRAYS.items():
        index.add_buffer(key, array)
    expected = None
    for source in (ARRAYS, index):
        for driver in DRIVERS:
            with tinyhal.load(programs["load"], device=driver,
                              parameters={"model": source}) as module:
                got = _as_list(module.main(INPUT))
                stats = module.parameter_statistics()
            expected = expected or got
            assert_same_bits(got, expected)
            if driver != "emu":  # host memory: every weight used in place
                assert stats.imported_bytes == stats.live_bytes > 0
                assert stats.read_bytes == 0
    np.testing.assert_allclose(expected[0], INPUT @ ARRAYS["w"] + ARRAYS["b"], rtol=1e-6)


_EXPORT_W = ((np.arange(64 * 8) % 13 - 6) / 4).astype(np.float32).reshape(64, 8)


def _export_source() -> str:
    """A program whose weights are globals the exporters move to an archive (kept out
    of the program's inlining, as importers mark their weights)."""
    rows = ",".join("[" + ",".join(repr(float(v)) for v in r) + "]" for r in _EXPORT_W)
    return f"""
util.global private @w <{{inlining_policy = #util.inline.never}}> = dense<[{rows}]>
    : tensor<64x8xf32>
util.global private @s = dense<0.5> : tensor<8xf32>
func.func @main(%x: tensor<2x64xf32>) -> tensor<2x8xf32> {{
  %w = util.global.load @w : tensor<64x8xf32>
  %s = util.global.load @s : tensor<8xf32>
{_dense_mlir("%x", "%w", "%s", 2, 64, 8)}  return %r : tensor<2x8xf32>
}}
"""


def test_iree_opt_exported_archive(tmp_path):
    """`iree-opt --iree-io-export-parameters` moves a program's constants to an archive
    and rewrites the globals into parameters of scope `opt`."""
    (tmp_path / "in.mlir").write_text(_export_source())
    archive = tmp_path / "exported.irpa"
    _tool("iree-opt", str(tmp_path / "in.mlir"),
          f"--pass-pipeline=builtin.module(iree-io-export-parameters"
          f"{{path=opt={archive} minimum-size=0}})", "-o", str(tmp_path / "out.mlir"))
    exported = (tmp_path / "out.mlir").read_text()
    assert '#flow.parameter.named<"opt"::"w">' in exported
    _assert_export_runs(compile_mlir(exported, HOST_FLAGS), "opt", archive)


def _assert_export_runs(vmfb, scope: str, archive) -> None:
    """The exported program with its archive: the weights' result, iree.runtime's bits
    on every driver."""
    x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    expected = iree_results(vmfb, [(scope, archive)], "main", x)
    np.testing.assert_allclose(expected[0], x @ _EXPORT_W + 0.5, rtol=1e-5)
    for driver in DRIVERS:
        with tinyhal.load(vmfb, device=driver, parameters={scope: archive}) as module:
            assert_same_bits([module.main(x)], expected)


def test_compiler_exported_archive(tmp_path):
    """`iree-compile --iree-parameter-export=scope=PATH` writes the weights to an
    archive beside the program it compiles."""
    (tmp_path / "in.mlir").write_text(_export_source())
    archive, vmfb = tmp_path / "exported.irpa", tmp_path / "exported.vmfb"
    _tool("iree-compile", str(tmp_path / "in.mlir"), *HOST_FLAGS,
          f"--iree-parameter-export=model={archive}",
          "--iree-parameter-export-minimum-size=0", "-o", str(vmfb))
    assert "w" in ParameterIndex().load(archive)
    _assert_export_runs(vmfb, "model", archive)


def test_onnx_mlp_with_externalized_params(tmp_path):
    """`iree-import-onnx --externalize-params` on an MLP built with `onnx.helper`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(19)
    weights = {"w1": rng.standard_normal((8, 16)).astype(np.float32),
               "b1": rng.standard_normal(16).astype(np.float32),
               "w2": rng.standard_normal((16, 4)).astype(np.float32),
               "b2": rng.standard_normal(4).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]),
             helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]),
             helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
             helper.make_node("Add", ["h3", "b2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(a, k) for k, a in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(tmp_path / "mlp.onnx"))
    archive = tmp_path / "mlp.irpa"
    _tool("iree-import-onnx", str(tmp_path / "mlp.onnx"), "--externalize-params",
          "--num-elements-threshold=0", f"--save-params-to={archive}",
          "-o", str(tmp_path / "mlp.mlir"))
    vmfb = compile_mlir((tmp_path / "mlp.mlir").read_text(), HOST_FLAGS)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    expected = iree_results(vmfb, [("model", archive)], "mlp", x)
    reference = np.maximum(x @ weights["w1"] + weights["b1"], 0) @ weights["w2"] + weights["b2"]
    np.testing.assert_allclose(expected[0], reference, rtol=1e-5, atol=1e-5)
    for driver in DRIVERS:
        with tinyhal.load(vmfb, device=driver, parameters={"model": archive}) as module:
            assert_same_bits([module.mlp(x)], expected)


# -- the readers ---------------------------------------------------------------------------


def test_index_entries_match_iree_index(archives):
    """Keys, lengths, splat patterns and bytes as iree.runtime's index reads them."""
    import iree.runtime as rt

    for name in FORMATS:
        ours = ParameterIndex().load(archives[name])
        theirs = rt.ParameterIndex()
        theirs.load(str(archives[name]))
        items = dict(theirs.items())
        assert sorted(ours.keys()) == sorted(items), name
        for entry in ours:
            if entry.is_splat:
                assert f"splat {entry.splat!r}:{entry.length}>" in repr(items[entry.key])
            else:
                flat = rt.parameter_index_entry_as_numpy_flat_ndarray(items[entry.key])
                assert entry.read() == flat.tobytes(), (name, entry.key)


def test_malformed_files_are_clean_errors(tmp_path, archives):
    cases = {
        "short.irpa": (b"IRPA", InvalidArgumentError, "not enough bytes"),
        "magic.irpa": (b"XXXX" + bytes(100), InvalidArgumentError, "magic"),
        "short.safetensors": (b"\x01\x02", OutOfRangeError, "header length"),
        "long.safetensors": ((1 << 40).to_bytes(8, "little") + b"{}", OutOfRangeError,
                             "header contents"),
        "offsets.safetensors": (b"\x37\x00\x00\x00\x00\x00\x00\x00"
                                + b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,99]}}',
                                InvalidArgumentError, "outside of the available data"),
        "magic.gguf": (b"GGUX" + bytes(40), InvalidArgumentError, "magic"),
        "version.gguf": (b"GGUF" + (9).to_bytes(4, "little") + bytes(16), UnimplementedError,
                         "version 9"),
        "x.bin": (b"", UnimplementedError, "unsupported file format"),
    }
    for name, (data, cls, needle) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(cls, match=needle):
            ParameterIndex().load(path)
    truncated = tmp_path / "truncated.irpa"
    truncated.write_bytes(archives["irpa-created"].read_bytes()[:200])
    with pytest.raises(OutOfRangeError, match="truncated.irpa"):
        ParameterIndex().load(truncated)
    with pytest.raises(NotFoundError, match="not found"):
        ParameterIndex().load(tmp_path / "missing.irpa")


def test_missing_scope_and_key_are_named(programs, archives):
    with pytest.raises(NotFoundError, match="scopes like 'model'.*pass"):
        tinyhal.load(programs["load"], device="sync")
    with pytest.raises(NotFoundError, match="scopes like 'model'"):
        tinyhal.load(programs["load"], device="sync", parameters={"other": ARRAYS})
    partial = {k: v for k, v in ARRAYS.items() if k != "h"}
    with pytest.raises(NotFoundError, match="key 'h'"):
        tinyhal.load(programs["gather"], device="task", parameters={"model": partial})
    small = dict(ARRAYS, w=np.zeros(3, np.float32))
    with pytest.raises(OutOfRangeError, match="parameter `w` range out of bounds"):
        tinyhal.load(programs["load"], device="task", parameters={"model": small})
    rc, _, err = tinyhal_run([f"--module={programs['load']}", "--input=2x8xf32=1"])
    assert rc == 1 and "scopes like 'model'" in err and err.count("\n") == 1


def test_sealed_memfd_is_used_in_place(programs, archives):
    """A memfd sealed against shrinking and writing can never change: its parameters
    are mapped and used without a copy; a regular file is read instead."""
    import fcntl

    fd = os.memfd_create("params.irpa", os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, archives["irpa-from-safetensors"].read_bytes())
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_WRITE)
        index = ParameterIndex().load(f"/proc/self/fd/{fd}", format="irpa")
        with tinyhal.load(programs["load"], device="task",
                          parameters={"model": index}) as module:
            got = _as_list(module.main(INPUT))
            stats = module.parameter_statistics()
        assert stats.read_bytes == 0 and stats.imported_bytes == stats.live_bytes > 0
    finally:
        os.close(fd)
    with tinyhal.load(programs["load"], device="task",
                      parameters={"model": archives["irpa-from-safetensors"]}) as module:
        assert_same_bits(_as_list(module.main(INPUT)), got)
        stats = module.parameter_statistics()
    assert stats.imported_bytes == 0 and stats.read_bytes > 0


# -- a file that changes under a running program --------------------------------------------

@pytest.mark.parametrize("mode", ["file", "preload"])
def test_truncating_the_file_under_a_running_program_never_crashes(programs, archives,
                                                                   tmp_path, mode):
    """In a child process: the parameter file is truncated (and then overwritten) while
    a module built from it runs calls on two threads; every call either gives the
    weights' bits or fails with a tinyhal.Error, and the process lives on."""
    path = tmp_path / "live.irpa"
    path.write_bytes(archives["irpa-from-safetensors"].read_bytes())
    out = run_child("""
        import sys, threading, os
        import numpy as np
        import tinyhal
        from tinyhal.vm.parameter_formats import ParameterIndex
        vmfb, path, mode = sys.argv[1:4]
        x = (np.arange(16, dtype=np.float32).reshape(2, 8) - 4) / 5
        index = ParameterIndex().load(path, mode=mode)
        module = tinyhal.load(vmfb, device="task", parameters={"model": index})
        expected = module.main(x)[0].tobytes()
        outcomes = {"same": 0, "error": 0}
        stop = threading.Event()

        def calls():
            while not stop.is_set():
                try:
                    got = tinyhal.load(vmfb, device="sync", parameters={"model": index})
                    same = got.main(x)[0].tobytes() == expected
                    outcomes["same" if same else "changed"] = 1
                    got.close()
                except tinyhal.Error:
                    outcomes["error"] += 1
                assert module.main(x)[0].tobytes() == expected

        threads = [threading.Thread(target=calls) for _ in range(2)]
        for t in threads:
            t.start()
        for size in (300, 64, 0):
            os.truncate(path, size)
            for _ in range(3):
                assert module.main(x)[0].tobytes() == expected
        with open(path, "wb") as f:
            f.write(b"\\xff" * 100)
        stop.set()
        for t in threads:
            t.join(60)
        try:
            tinyhal.load(vmfb, device="sync", parameters={"model": index})
            late = "ran"
        except tinyhal.Error as exc:
            late = type(exc).__name__
        print("OK", mode, late, sorted(outcomes))
    """, str(programs["load"]), str(path), mode, timeout=180)
    assert out.startswith("OK")
    if mode == "file":
        assert "DataLossError" in out  # the shrunk file is named as lost data
    else:
        assert " ran " in out  # a preloaded index never reads the file again


def test_a_load_reads_the_file_when_it_runs(programs, archives, tmp_path):
    """The file mode reads when the program loads (IREE's `--parameter_mode=file`):
    a file cut short after it was indexed is DATA_LOSS naming the parameter."""
    path = tmp_path / "cut.safetensors"
    path.write_bytes(archives["safetensors"].read_bytes())
    index = ParameterIndex().load(path)
    os.truncate(path, path.stat().st_size - 4)
    with pytest.raises(DataLossError, match="parameter `q`.*shrank"):
        tinyhal.load(programs["load"], device="task", parameters={"model": index})


def test_parameters_argument_forms(programs, archives):
    expected = None
    forms = [
        {"model": archives["safetensors"]},
        {"model": str(archives["safetensors"])},
        [("model", archives["safetensors"])],
        {"model": [ParameterIndex().load(archives["gguf"])]},
    ]
    for form in forms:
        with tinyhal.load(programs["load"], device="sync", parameters=form) as module:
            got = _as_list(module.main(INPUT))
        expected = expected or got
        assert_same_bits(got, expected)
    with pytest.raises(InvalidArgumentError, match="parameters="):
        tinyhal.load(programs["load"], device="sync", parameters=42)
    with pytest.raises(Error):
        tinyhal.load(programs["load"], device="sync", parameters={"model": 42})


# -- writing parameters (io_parameters.scatter) -------------------------------------------

WRITE_READ = """
func.func @save(%x: tensor<4xf32>) -> tensor<4xf32> {
  %scope = util.buffer.constant : !util.buffer = "model"
  %key = util.buffer.constant : !util.buffer = "w"
  %offset = arith.constant 4 : i64
  %r = flow.parameter.write %x -> %scope::%key[%offset] : tensor<4xf32>
  return %r : tensor<4xf32>
}
func.func @fetch() -> tensor<4xf32> {
  %scope = util.buffer.constant : !util.buffer = "model"
  %key = util.buffer.constant : !util.buffer = "w"
  %offset = arith.constant 0 : i64
  %r = flow.parameter.load %scope::%key[%offset] : tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


def _aligned(values: np.ndarray, shift: int = 0) -> np.ndarray:
    """`values` in writable memory `shift` bytes past a 64-byte boundary."""
    raw = np.empty(values.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + shift
    out = raw[start : start + values.nbytes].view(values.dtype)
    out[:] = values
    return out


def _iree_save_fetch(vmfb, memory: np.ndarray, x: np.ndarray) -> np.ndarray:
    """iree.runtime: `save(x)` into a writable in-memory parameter, then `fetch()`."""
    import iree.runtime as rt

    config = rt.Config("local-sync")
    index = rt.ParameterIndex()
    index.add_buffer("w", memory, writable=True)
    params = rt.create_io_parameters_module(config.vm_instance,
                                            index.create_provider(scope="model"))
    main = rt.VmModule.mmap(config.vm_instance, str(vmfb))
    context = rt.SystemContext(vm_modules=[params, main], config=config)
    context.modules.module["save"](x)
    return context.modules.module["fetch"]().to_host()


def test_scatter_writes_parameters_as_iree_does(tmp_path):
    """`flow.parameter.write` compiles to `io_parameters.scatter`. Into a writable
    in-memory parameter, as iree.runtime: the bytes land in the caller's array, and a
    parameter loaded earlier from 64-byte-aligned host memory is that memory (the
    program sees the write), from other memory a copy (it does not). Into a file opened
    writable the same bytes land in the file (loads copy from files). A read-only file
    or a splat is PERMISSION_DENIED with IREE's message."""
    from safetensors.numpy import save_file

    vmfb = compile_mlir(WRITE_READ, [*HOST_FLAGS, "--iree-opt-const-eval=false"])
    x = np.array([9.5, -1, 2.25, 1e6], np.float32)
    initial = np.arange(8, dtype=np.float32)
    theirs = {shift: _aligned(initial, shift) for shift in (0, 4)}
    fetched = {shift: _iree_save_fetch(vmfb, theirs[shift], x) for shift in theirs}
    assert fetched[0].tobytes() != fetched[4].tobytes()  # aliased vs copied
    written = theirs[0].tobytes()
    assert theirs[4].tobytes() == written

    for driver in DRIVERS:
        for shift in (0, 4):
            memory = _aligned(initial, shift)
            index = ParameterIndex()
            index.add_buffer("w", memory, writable=True)
            with tinyhal.load(vmfb, device=driver, parameters={"model": index}) as module:
                np.testing.assert_array_equal(module.save(x), x)
                # emu's memory is not the host's: its loads always copy
                want = fetched[4 if driver == "emu" else shift]
                assert module.fetch().tobytes() == want.tobytes(), (driver, shift)
            assert memory.tobytes() == written

    original = tmp_path / "w.safetensors"
    save_file({"w": initial}, str(original))
    header = len(original.read_bytes()) - initial.nbytes
    for driver in DRIVERS:
        ours = tmp_path / f"ours_{driver}.safetensors"
        ours.write_bytes(original.read_bytes())
        writable = ParameterIndex().load(ours, writable=True)
        with tinyhal.load(vmfb, device=driver, parameters={"model": writable}) as module:
            np.testing.assert_array_equal(module.save(x), x)
            assert module.fetch().tobytes() == fetched[4].tobytes()
        assert ours.read_bytes()[header:] == written

    with pytest.raises(PermissionDeniedError,
                       match="parameter `w` storage does not support the requested access "
                             "type; parameter allows READ, operation requires WRITE"):
        with tinyhal.load(vmfb, device="task", parameters={"model": original}) as module:
            module.save(x)
    splat = ParameterIndex()
    splat.add_splat("w", np.float32(1.5), 32)
    with tinyhal.load(vmfb, device="sync", parameters={"model": splat}) as module:
        np.testing.assert_array_equal(module.fetch(), [1.5] * 4)
        with pytest.raises(PermissionDeniedError, match="parameter allows READ"):
            module.save(x)


def test_a_load_that_fails_part_way_fails_cleanly(programs):
    """Device memory runs out after the first parameter's read is queued: the load
    fails with RESOURCE_EXHAUSTED at once (its signal fence fails too, so nothing waits
    forever) and the device's memory is given back."""
    from tinyhal.hal import create_device

    device = create_device("emu", memory_size=140)  # w (128 bytes) fits, b does not
    try:
        with pytest.raises(Error, match="RESOURCE_EXHAUSTED.*128 of 140 bytes live"):
            tinyhal.load(programs["load"], device=device, parameters={"model": ARRAYS})
        device.wait_idle(30)
        assert device.allocator.statistics().heaps["device"].live_bytes == 0
    finally:
        device.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", ["file", "preload"])
def test_a_fifo_or_directory_as_parameter_file_is_refused_at_once(tmp_path, mode):
    from tinyhal.vm.parameter_formats import open_source

    fifo = tmp_path / "weights.irpa"
    os.mkfifo(fifo)
    with pytest.raises(InvalidArgumentError, match="parameter file: not a regular file"):
        open_source(fifo, mode)
    with pytest.raises(InvalidArgumentError, match="is a directory, not a parameter file"):
        open_source(tmp_path, mode)
    with pytest.raises(NotFoundError, match="parameter file not found"):
        open_source(tmp_path / "missing.irpa", mode)
