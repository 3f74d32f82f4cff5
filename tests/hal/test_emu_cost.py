"""emu's cost models against cycles worked out by hand for small shapes, the work read
from export names, SCALE-Sim configs and cost files, and a compiled dispatch priced
end to end (still bit-exact)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tinyhal
from support.iree_tools import HOST_FLAGS, compile_mlir
from tinyhal import errors, hal
from tinyhal.hal.dispatch_work import parse_export_name, work_from_name
from tinyhal.hal.emu_cost import (
    AcceleratorConfig,
    DispatchCost,
    DispatchWork,
    accelerator_config,
    cost_models,
    dispatch_cost,
    folding,
    operand_reads,
    read_cost_file,
    read_scalesim_config,
    register_cost_model,
    ring_reads,
    systolic_cost,
    vector_cost,
)

BIG = 1 << 20  # SRAM words that hold everything


def array(dataflow: str, rows: int = 4, cols: int = 4, **fields) -> AcceleratorConfig:
    values = {"ifmap_sram_words": BIG, "filter_sram_words": BIG, "ofmap_sram_words": BIG}
    values.update(fields)
    return AcceleratorConfig(rows, cols, dataflow, **values)


MATMUL = DispatchWork("matmul", m=6, n=5, k=3)  # 90 MACs


@pytest.mark.parametrize("dataflow, folds, fold_cycles", [
    # os: rows over M (6 -> 2), cols over N (5 -> 2); a fold is K + rows + cols - 2 = 9
    ("os", 4, 9),
    # ws: rows over K (3 -> 1), cols over N (5 -> 2); 2 rows + cols + M - 2 = 16
    ("ws", 2, 16),
    # is: rows over K (3 -> 1), cols over M (6 -> 2); 2 rows + cols + N - 2 = 15
    ("is", 2, 15),
])
def test_systolic_folding_by_hand(dataflow, folds, fold_cycles):
    fold = folding(6, 5, 3, 4, 4, dataflow)
    assert (fold.folds, fold.fold_cycles) == (folds, fold_cycles)
    cost = systolic_cost(MATMUL, array(dataflow))
    assert cost == DispatchCost(folds * fold_cycles, 0, (18 + 15 + 30) * 4,
                                90 / (16 * folds * fold_cycles), 30 * 4)
    assert cost.cycles == folds * fold_cycles


def test_depthwise_runs_one_channel_at_a_time():
    """3 channels of a 2x2-output 3x3 depthwise convolution: each is M=4, N=1, K=9, one
    fold of 9 + 4 + 4 - 2 = 15 cycles on a 4x4 os array."""
    work = DispatchWork("depthwise", m=4, n=1, k=9, groups=3)
    assert systolic_cost(work, array("os")).compute_cycles == 3 * 15


def test_batch_matmul_is_its_matmuls_in_turn():
    work = DispatchWork("batch_matmul", m=6, n=5, k=3, groups=2)
    assert systolic_cost(work, array("ws")).compute_cycles == 2 * 2 * 16


def test_vector_unit_by_hand():
    """100 outputs of a 2x2 pooling on 8 lanes: 400 operations, 50 cycles; limited
    bandwidth: 400 input words at 4 words/cycle take 100 cycles, 50 of them stalled."""
    work = DispatchWork("pool", elements=100, window=4, input_words=400, output_words=100)
    assert vector_cost(work, array("os", vector_lanes=8)) == DispatchCost(
        50, 0, 500 * 4, 1.0, 100 * 4)
    slow = vector_cost(work, array("os", vector_lanes=8, ifmap_bandwidth=4.0))
    assert (slow.compute_cycles, slow.stall_cycles) == (50, 50)
    assert slow.utilisation == pytest.approx(0.5)
    # element-wise work with no lanes given: one per column
    assert vector_cost(DispatchWork("elementwise", elements=10), array("os")).compute_cycles == 3


def test_memory_stalls_by_hand():
    """os 2x2, M=4 N=4 K=2: 2 x 2 folds of 2 + 2 + 2 - 2 = 4 cycles, 16 in all. The
    ifmap (2 row folds of K x rows = 2 x 2 words, 8 in all) is laid out diagonal by
    diagonal: fold 0 reads words 0-4 (its skew reaches into the diagonal fold 1 starts
    on), fold 1 words 3-7. An 8-word SRAM computes on 4 words while 4 more come: fold 0
    needs 0-4, so 0-3 then 4-7 (8 words read); fold 1 starts at word 3, behind the
    window, which goes round to 0-3 and on to 4-7 (16); the second column fold does the
    same again (32 words).

    At 1 word per cycle a refill takes 4 + 1 cycles; the first fill is free, so refill
    r is done at cycle 5r - 1. They are needed at cycle 3 (fold 0 reads word 4: done
    at 4, one cycle late, which SCALE-Sim's bookkeeping nets to no wait), two at cycle
    4 (fold 1: done at 9 and 14, waited for 2 x 4 + 2 x 1 = 10 cycles), at cycle 8 (done
    at 19 = 8 + 10 + 1: none), at 11 (24, 2 late: 4) and two at 12 (29 and 34: 2 x 2 +
    2 x 3 = 10): 24 stall cycles."""
    work = DispatchWork("matmul", m=4, n=4, k=2)
    small = array("os", rows=2, cols=2, ifmap_sram_words=8)
    assert operand_reads(work, small) == (32, 8)
    misses: tuple[list, list] = ([], [])
    operand_reads(work, small, misses)
    assert misses[0] == [(0, 3, 1), (1, 0, 1), (1, 0, 1), (2, 0, 1), (2, 3, 1), (3, 0, 1),
                         (3, 0, 1)]
    cost = systolic_cost(work, array("os", rows=2, cols=2, ifmap_sram_words=8,
                                     ifmap_bandwidth=1.0))
    assert (cost.compute_cycles, cost.stall_cycles) == (16, 24)
    assert cost.dram_bytes == (32 + 8 + 16) * 4
    assert (cost.dram_read_bytes, cost.dram_write_bytes) == ((32 + 8) * 4, 16 * 4)
    # an operand that fits in half its SRAM is read once, before the array starts
    assert operand_reads(work, array("os", rows=2, cols=2, ifmap_sram_words=16)) == (8, 8)
    assert systolic_cost(work, array("os", rows=2, cols=2, ifmap_sram_words=16,
                                     ifmap_bandwidth=0.1)).stall_cycles == 0
    # 16 outputs, one a cycle, into a 4-word ofmap SRAM drained 2 words at a time at 0.5
    # words/cycle (4 cycles a drain): the first drain starts once 3 words are written,
    # ceil((16 - 4) / 2) = 6 run back to back, the last starting at 3 + 5 x 4 = 23, and
    # the 2 words after it are written by 25: 9 stall cycles (the rest drains after)
    drain = systolic_cost(work, array("os", rows=2, cols=2, ofmap_sram_words=4,
                                      ofmap_bandwidth=0.5))
    assert drain.stall_cycles == 25 - 16
    # overlapping dispatches share the bandwidth: at 0.5 words/cycle a refill takes 9
    shared = array("os", rows=2, cols=2, ifmap_sram_words=8, ifmap_bandwidth=1.0).shared(2)
    assert systolic_cost(work, shared).stall_cycles == 56


def test_ring_reads_by_hand():
    """Row-by-row layout, 3 blocks of 2 x 2 words (12), a 4-word SRAM (2 + 2): reading
    the blocks in order is one sweep, 2 words at a time (12 words); reading block 0
    again afterwards goes round once more (16); a 12-word SRAM holds it all (12)."""
    assert ring_reads(3, 2, 2, [(0, 0, 2), (1, 0, 2), (2, 0, 2)], 4, diagonal=False) == 12
    assert ring_reads(3, 2, 2, [(0, 0, 2), (1, 0, 2), (2, 0, 2), (0, 0, 2)], 4,
                      diagonal=False) == 16
    assert ring_reads(3, 2, 2, [(0, 0, 2), (2, 0, 2), (0, 0, 2)], 24, diagonal=False) == 12
    # 2 blocks of 2 x 2: block 0 read forwards is words 0-3, 2 + 2 of them (4 read);
    # read last row first, row 1 (words 2-3) moves the window past row 0, which then
    # costs the rest of the way round: 4, 6, 8, 10 words
    assert ring_reads(2, 2, 2, [(0, 0, 2)], 4, diagonal=False) == 4
    assert ring_reads(2, 2, 2, [(0, 0, 2, True)], 4, diagonal=False) == 10


def test_register_a_cost_model_from_python():
    calls = []

    def constant(work: DispatchWork, device: AcceleratorConfig) -> DispatchCost:
        calls.append(work.kind)
        return DispatchCost(1000, 10, 64, 0.5)

    register_cost_model("test-constant", constant)
    assert "test-constant" in cost_models()
    config = AcceleratorConfig(cost_model="test-constant")
    assert dispatch_cost(MATMUL, config).cycles == 1010
    assert calls == ["matmul"]
    register_cost_model("test-bad", lambda work, device: (1.5, 0, 0, 0.0))
    with pytest.raises(errors.InvalidArgumentError, match="test-bad.*not a DispatchCost"):
        dispatch_cost(MATMUL, AcceleratorConfig(cost_model="test-bad"))
    with pytest.raises(errors.InvalidArgumentError, match="unknown emu cost model"):
        AcceleratorConfig(cost_model="nope").validate()
    with pytest.raises(errors.InvalidArgumentError, match="must be callable"):
        register_cost_model("x", 3)


@pytest.mark.parametrize("bad, message", [
    ({"rows": 0}, "rows must be an int >= 1"),
    ({"dataflow": "rs"}, "dataflow must be one of"),
    ({"ifmap_bandwidth": -1}, "ifmap_bandwidth must be >= 0"),
    ({"clock_hz": 0}, "clock_hz must be > 0"),
    ({"colour": 1}, "unknown accelerator fields"),
])
def test_bad_accelerator_options_name_the_field(bad, message):
    with pytest.raises(errors.InvalidArgumentError, match=message):
        accelerator_config(bad)
    with pytest.raises(errors.InvalidArgumentError, match="accelerator must be"):
        accelerator_config(3)


SCALESIM_CFG = """[general]
run_name = example
[architecture_presets]
ArrayHeight:    32
ArrayWidth:     16
IfmapSramSzkB:   64
FilterSramSzkB:  32
OfmapSramSzkB:   16
IfmapOffset:    0
FilterOffset:   10000000
OfmapOffset:    20000000
Bandwidth : 10
Dataflow : ws
MemoryBanks:   1
[layout]
IfmapSRAMBankBandwidth: 8
FilterSRAMBankBandwidth: 12
[run_presets]
InterfaceBandwidth: {mode}
[emu]
ClockHz: 7e8
"""


def test_scalesim_config(tmp_path):
    path = tmp_path / "array.cfg"
    path.write_text(SCALESIM_CFG.format(mode="USER"))
    config = read_scalesim_config(str(path))
    assert (config.rows, config.cols, config.dataflow, config.clock_hz) == (32, 16, "ws", 7e8)
    assert (config.ifmap_sram_words, config.filter_sram_words,
            config.ofmap_sram_words) == (64 * 1024, 32 * 1024, 16 * 1024)
    assert (config.ifmap_bandwidth, config.filter_bandwidth,
            config.ofmap_bandwidth) == (8.0, 12.0, 10.0)
    path.write_text(SCALESIM_CFG.format(mode="CALC"))
    unlimited = read_scalesim_config(str(path), rows=8)
    assert unlimited.rows == 8 and unlimited.ifmap_bandwidth == 0.0
    path.write_text(SCALESIM_CFG.format(mode="SOMETIMES"))
    with pytest.raises(errors.InvalidArgumentError, match="USER or CALC"):
        read_scalesim_config(str(path))
    path.write_text("[general]\nrun_name = x\n")
    with pytest.raises(errors.InvalidArgumentError, match="architecture_presets"):
        read_scalesim_config(str(path))
    path.write_text("not a config")
    with pytest.raises(errors.InvalidArgumentError, match="cannot read SCALE-Sim config"):
        read_scalesim_config(str(path))


def test_cost_files(tmp_path):
    table = tmp_path / "costs.json"
    table.write_text(json.dumps({"a": 100, "b": {"cycles": 50, "stall_cycles": 20,
                                                 "dram_bytes": 8}}))
    costs = read_cost_file(str(table))
    assert costs["a"] == DispatchCost(100, 0, 0, 0.0)
    assert costs["b"] == DispatchCost(30, 20, 8, 0.0)
    report = tmp_path / "COMPUTE_REPORT.csv"
    report.write_text("LayerID, Total Cycles, Stall Cycles, Overall Util %,\n"
                      "main_dispatch_0_matmul_4x4x4_f32, 250, 40, 12.5,\n")
    assert read_cost_file(str(report))["main_dispatch_0_matmul_4x4x4_f32"].cycles == 250
    table.write_text(json.dumps({"a": {"cycles": 1, "stall_cycles": 2}}))
    with pytest.raises(errors.InvalidArgumentError, match="more stall cycles"):
        read_cost_file(str(table))
    report.write_text("name,time\nx,1\n")
    with pytest.raises(errors.InvalidArgumentError, match="needs an `export`"):
        read_cost_file(str(report))


@pytest.mark.parametrize("name, lengths, expected", [
    ("m_dispatch_3_matmul_24x512x128_f32", [24 * 128, 128 * 512, 24 * 512],
     DispatchWork("matmul", m=24, n=512, k=128)),
    ("m_dispatch_0_matmul_Dx40x128_f32", [24 * 128, 128 * 40, 24 * 40],
     DispatchWork("matmul", m=24, n=40, k=128)),
    ("m_dispatch_1_batch_matmul_4x24x24x64_f32", [1, 1, 1],
     DispatchWork("batch_matmul", m=24, n=24, k=64, groups=4)),
    # NHWC convolution, bindings exactly the tensors
    ("m_dispatch_0_conv_7x7x32x3x3x64_f32", [16 * 16 * 64, 9 * 64 * 32, 49 * 32],
     DispatchWork("conv", m=49, n=32, k=576)),
    # NCHW convolution bound from whole buffers (a real model's bindings)
    ("m_dispatch_1_conv_32x112x112x3x3x3_f32", [1 << 22, 1 << 23, 1 << 22],
     DispatchWork("conv", m=12544, n=32, k=27)),
    ("m_dispatch_2_conv_112x112x32x3x3_f32", [1 << 22, 1 << 23, 1 << 22],
     DispatchWork("depthwise", m=12544, n=1, k=9, groups=32)),
    ("m_dispatch_0_conv_8x8x32x2x2_f32", [16 * 16 * 32, 8 * 8 * 32],
     DispatchWork("pool", elements=2048, window=4)),
    ("m_dispatch_4_matmul_like_96x112x112x16_f32", [1 << 22, 1 << 23, 1 << 22],
     DispatchWork("matmul", m=12544, n=96, k=16)),
    # 1x1 convolutions as contractions: NHWC (F last), pixels collapsed, bound exactly
    ("m_dispatch_0_matmul_like_28x28x128x64_f32", [55 * 55 * 64, 64 * 128, 784 * 128],
     DispatchWork("matmul", m=784, n=128, k=64)),
    ("m_dispatch_0_matmul_like_784x192x32_f32", [784 * 32, 32 * 192, 784 * 192],
     DispatchWork("matmul", m=784, n=192, k=32)),
    ("m_dispatch_53_reduction_1280x49_f32", [1 << 22, 1 << 22],
     DispatchWork("reduction", elements=1280, window=49)),
    ("m_dispatch_5_elementwise_D_f16", [10, 10],
     DispatchWork("elementwise", elements=10, element_bytes=2)),
])
def test_work_from_export_names(name, lengths, expected):
    element = parse_export_name(name)[2]
    work = work_from_name(name, [n * element for n in lengths], 7)
    got = {f: getattr(work, f) for f in ("kind", "m", "n", "k", "groups", "elements",
                                         "window", "element_bytes")}
    want = {f: getattr(expected, f) for f in got}
    assert got == want
    assert work.source == "export-name"


def test_work_falls_back_to_workgroups():
    work = work_from_name("m_dispatch_0_slow_memcpy", [64, 64], 5)
    assert (work.kind, work.elements, work.source) == ("unknown", 5, "workgroups")
    assert parse_export_name("not an iree name") is None


MATMUL_MLIR = """
func.func @mm(%a: tensor<64x96xf32>, %b: tensor<96x40xf32>) -> tensor<64x40xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x40xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<64x40xf32>) -> tensor<64x40xf32>
  %r = linalg.matmul ins(%a, %b : tensor<64x96xf32>, tensor<96x40xf32>)
                     outs(%f : tensor<64x40xf32>) -> tensor<64x40xf32>
  return %r : tensor<64x40xf32>
}
"""


def test_compiled_matmul_priced_by_the_array(tmp_path):
    """A matmul compiled by the pinned compiler, on emu with a 16x16 os array: its
    export name gives M=64 N=40 K=96, so 4 x 3 folds of 96 + 30 cycles; the result is
    the host's, bit for bit; the summary and its JSON say so."""
    path = compile_mlir(MATMUL_MLIR, HOST_FLAGS)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 96), dtype=np.float32)
    b = rng.standard_normal((96, 40), dtype=np.float32)
    with tinyhal.load(str(path), device=hal.create_device("sync")) as model:
        expected = np.asarray(model.mm(a, b))
    config = tmp_path / "a.cfg"
    config.write_text(SCALESIM_CFG.format(mode="CALC").replace("ws", "os")
                      .replace("ArrayHeight:    32", "ArrayHeight: 16")
                      .replace("ArrayWidth:     16", "ArrayWidth: 16"))
    emu = hal.create_device("emu", accelerator=str(config))
    try:
        with tinyhal.load(str(path), device=emu) as model:
            got = np.asarray(model.mm(a, b))
            model.mm(a, b)
        assert got.tobytes() == expected.tobytes()
        summary = emu.summary()
        (record,) = summary.dispatch_costs
        assert record.work_source == "export-name"
        assert (record.count, record.cycles, record.stall_cycles) == (2, 12 * 126, 0)
        assert record.utilisation == pytest.approx(64 * 40 * 96 / (256 * 12 * 126))
        assert "export-name" in summary.format()
        as_json = json.loads(json.dumps(summary.as_json()))
        assert as_json["dispatches"][0]["cycles"] == 2 * 12 * 126
        assert as_json["dispatch_count"] == 2
        # modelled time: the cycles at the config's 0.7 GHz
        compute = [e for e in emu.trace() if e.engine == "compute"]
        assert compute[0].duration_ns == round(12 * 126 * 1e9 / 7e8)
    finally:
        emu.close()


def test_cost_file_wins(tmp_path):
    path = compile_mlir(MATMUL_MLIR, HOST_FLAGS)
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"mm_dispatch_0_matmul_64x40x96_f32": 5000}))
    emu = hal.create_device("emu", accelerator={"rows": 8, "cols": 8}, cost_file=str(costs))
    try:
        with tinyhal.load(str(path), device=emu) as model:
            model.mm(np.ones((64, 96), np.float32), np.ones((96, 40), np.float32))
        (record,) = emu.summary().dispatch_costs
        assert (record.cycles, record.work_source) == (5000, "cost-file")
    finally:
        emu.close()


def test_mobilenet_v2_on_a_systolic_array():
    """The whole of MobileNetV2 on a 128x128 weight-stationary array: bit-exact with
    sync; every convolution and matmul priced from its work (only the input copy, which
    names no operation, by its workgroups); the summary accounts for every dispatch."""
    pytest.importorskip("onnx")
    from support.models import mobilenet_input, mobilenet_v2_vmfb

    vmfb, x = str(mobilenet_v2_vmfb()), mobilenet_input()
    with tinyhal.load(vmfb, device=hal.create_device("sync")) as model:
        expected = np.asarray(model.mobilenet_v2(x))
    emu = hal.create_device("emu", accelerator={"rows": 128, "cols": 128, "dataflow": "ws"})
    try:
        with tinyhal.load(vmfb, device=emu) as model:
            got = np.asarray(model.mobilenet_v2(x))
        assert got.tobytes() == expected.tobytes()
        summary = emu.summary()
        records = summary.dispatch_costs
        assert sum(r.count for r in records) == summary.dispatches == 55
        by_source = {r.export.split("_dispatch_")[1]: r.work_source for r in records}
        assert [k for k, v in by_source.items() if v != "export-name"] == ["0_slow_memcpy"]
        kinds = {r.export.split("_dispatch_")[1].split("_", 1)[1].split("_")[0]
                 for r in records}
        assert {"conv", "matmul", "reduction"} <= kinds
        assert all(r.cycles > 0 for r in records)
        compute = [e for e in emu.trace() if e.engine == "compute"]
        assert sum(e.duration_ns for e in compute) == sum(
            r.cycles * r.count for r in records)  # 1 GHz: a cycle is a nanosecond
    finally:
        emu.close()


def test_overlapping_dispatches_share_dram_bandwidth():
    """Two units (two arrays): a dispatch placed while another still runs gets half the
    bandwidth (see test_memory_stalls_by_hand: 56 stall cycles instead of 24); one
    placed after it ended gets all of it."""
    from tinyhal.hal.drivers.emu_engines import place_dispatch
    from tinyhal.hal.drivers.emu_model import cost_model

    work = DispatchWork("matmul", m=4, n=4, k=2)
    accelerator = array("os", rows=2, cols=2, ifmap_sram_words=8, ifmap_bandwidth=1.0)
    model = cost_model("generic", accelerator=accelerator, compute_units=2)
    units = [0, 0]
    first = place_dispatch(units, model, "a", 1, 0, 0, work)
    assert (first[0], first[1], first[3].stall_cycles) == (1, 0, 24)
    second = place_dispatch(units, model, "b", 1, 0, 0, work)
    assert (second[1], second[3].stall_cycles) == (0, 56)
    third = place_dispatch(units, model, "c", 1, 0, 200, work)
    assert (third[1], third[3].stall_cycles) == (200, 24)


CONV_MLIR = """
func.func @dw(%x: tensor<1x10x10x8xf32>, %w: tensor<3x3x8xf32>) -> tensor<1x8x8x8xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x8x8x8xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x8x8x8xf32>) -> tensor<1x8x8x8xf32>
  %r = linalg.depthwise_conv_2d_nhwc_hwc
         {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
         ins(%x, %w : tensor<1x10x10x8xf32>, tensor<3x3x8xf32>)
         outs(%f : tensor<1x8x8x8xf32>) -> tensor<1x8x8x8xf32>
  return %r : tensor<1x8x8x8xf32>
}
func.func @pw(%x: tensor<1x6x6x16xf32>, %w: tensor<1x1x16x12xf32>) -> tensor<1x6x6x12xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x6x6x12xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x6x6x12xf32>) -> tensor<1x6x6x12xf32>
  %r = linalg.conv_2d_nhwc_hwcf
         {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
         ins(%x, %w : tensor<1x6x6x16xf32>, tensor<1x1x16x12xf32>)
         outs(%f : tensor<1x6x6x12xf32>) -> tensor<1x6x6x12xf32>
  return %r : tensor<1x6x6x12xf32>
}
"""


def test_work_from_the_compilers_dumped_source(tmp_path):
    """Compiled with its executables dumped, each export's source location points at
    its configured MLIR; emu reads the root op and shapes from there (`compiler`): the
    depthwise convolution is 8 channels of M=64 N=1 K=9, each 16 folds of 9 + 4 + 4 - 2
    cycles on a 4x4 os array; the 1x1 convolution M=36 N=12 K=16, 9 x 3 folds of 16 + 6.
    Without the dump the export names are read (`export-name`). Results bit-exact."""
    dump = tmp_path / "executables"
    path = compile_mlir(CONV_MLIR, [*HOST_FLAGS,
                                    f"--iree-hal-dump-executable-configurations-to={dump}"])
    rng = np.random.default_rng(1)
    dw_args = (rng.standard_normal((1, 10, 10, 8), dtype=np.float32),
               rng.standard_normal((3, 3, 8), dtype=np.float32))
    pw_args = (rng.standard_normal((1, 6, 6, 16), dtype=np.float32),
               rng.standard_normal((1, 1, 16, 12), dtype=np.float32))
    with tinyhal.load(str(path), device=hal.create_device("sync")) as model:
        expected = (np.asarray(model.dw(*dw_args)), np.asarray(model.pw(*pw_args)))

    def priced() -> dict[str, tuple[str, int]]:
        emu = hal.create_device("emu", accelerator={"rows": 4, "cols": 4, "dataflow": "os"})
        try:
            with tinyhal.load(str(path), device=emu) as model:
                got = (np.asarray(model.dw(*dw_args)), np.asarray(model.pw(*pw_args)))
            assert [g.tobytes() for g in got] == [e.tobytes() for e in expected]
            return {r.export.split("_dispatch")[0]: (r.work_source, r.cycles)
                    for r in emu.summary().dispatch_costs}
        finally:
            emu.close()

    costs = priced()
    assert costs["dw"] == ("compiler", 8 * 16 * 15)
    assert costs["pw"] == ("compiler", 27 * 22)
    for entry in dump.iterdir():
        entry.unlink()
    assert {source for source, _ in priced().values()} == {"export-name"}


def test_work_from_source_needs_the_exports_function(tmp_path):
    """A location naming the user's own source (what the compiler writes without a
    dump), a missing file or a root with run-time sizes give no work: the name is read."""
    from tinyhal.hal.dispatch_work import source_work, work_from_source

    user = tmp_path / "model.mlir"
    user.write_text(MATMUL_MLIR)
    assert source_work((str(user), 2), "mm_dispatch_0_matmul_64x40x96_f32") is None
    assert source_work((str(tmp_path / "gone.mlir"), 1), "x") is None
    assert source_work(None, "x") is None
    dynamic = tmp_path / "dynamic.mlir"
    dynamic.write_text("func.func @e_dispatch_0_matmul_Dx8x4_f32() {\n"
                       "  %7 = linalg.matmul ins(%3, %4 : tensor<?x4xf32>, tensor<4x8xf32>) "
                       "outs(%6 : tensor<?x8xf32>) -> tensor<?x8xf32>\n}\n")
    assert work_from_source(str(dynamic), "e_dispatch_0_matmul_Dx8x4_f32") is None


def test_work_from_source_generic_roots(tmp_path):
    """A reduction with a bias beside it, a pooling (its window operand carries only
    reduction loops) and an element-wise op read from generics the way IREE writes
    them; only the reduction-and-output operands make a contraction."""
    from tinyhal.hal.dispatch_work import work_from_source

    def generic(maps: str, iterators: str, ins: str, outs: str) -> str:
        return (f"  %7 = linalg.generic {{indexing_maps = [{maps}], iterator_types = "
                f"[{iterators}]}} ins({ins}) outs({outs}) {{\n")

    body = {
        "r_dispatch_0_reduction_1280x49_f32": generic(
            "affine_map<(d0, d1) -> (d0, d1)>, #map1, #map1", '"parallel", "reduction"',
            "%3, %4 : tensor<1280x49xf32>, tensor<1280xf32>", "%6 : tensor<1280xf32>"),
        "p_dispatch_0_pool_4x4x8x2x2_f32": generic(
            "affine_map<(d0, d1, d2, d3, d4) -> (d0 * 2 + d3, d1 * 2 + d4, d2)>, "
            "affine_map<(d0, d1, d2, d3, d4) -> (d3, d4)>, "
            "affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2)>",
            '"parallel", "parallel", "parallel", "reduction", "reduction"',
            "%3, %4 : tensor<8x8x8xf32>, tensor<2x2xf32>", "%6 : tensor<4x4x8xf32>"),
        "e_dispatch_0_elementwise_64_f16": generic(
            "#map1, #map1, #map1", '"parallel"',
            "%3, %4 : tensor<64xf16>, tensor<64xf16>", "%6 : tensor<64xf16>"),
    }
    text = "#map1 = affine_map<(d0) -> (d0)>\n" + "".join(
        f"func.func @{name}() {{\n{op}}}\n" for name, op in body.items())
    path = tmp_path / "configured.mlir"
    path.write_text(text)
    r = work_from_source(str(path), "r_dispatch_0_reduction_1280x49_f32")
    assert (r.kind, r.elements, r.window, r.source) == ("reduction", 1280, 49, "compiler")
    p = work_from_source(str(path), "p_dispatch_0_pool_4x4x8x2x2_f32")
    assert (p.kind, p.elements, p.window, p.input_words) == ("pool", 128, 4, 512)
    e = work_from_source(str(path), "e_dispatch_0_elementwise_64_f16")
    assert (e.kind, e.elements, e.input_words, e.element_bytes) == ("elementwise", 64, 128, 2)
