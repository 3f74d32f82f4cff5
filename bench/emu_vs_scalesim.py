"""emu's systolic-array model against SCALE-Sim 3.0.0, layer by layer.

    pip install '.[bench-emu]'      # scalesim 3.0.0 (it needs numpy < 2.4)
    python bench/emu_vs_scalesim.py [--configs os32,ws128,...] [--layers a,b] [--jobs 2]
                                    [--held-out | --full] [--scalesim-results earlier.json]

Layers of three real networks (ResNet-18 convolutions, MobileNetV2 pointwise
convolutions, BERT-mini GEMMs of 24 tokens; with `--full` also ResNet-18's 7x7 and 3x3
convolutions, a MobileNetV2 depthwise one and BERT-base GEMMs) are the set the model
was tuned on. `--held-out` runs others, never used for tuning, on other configs:
layers of VGG-16 (CIFAR-10), ResNet-50's bottleneck, MobileNetV3-Small's 5x5 depthwise
convolution and BERT-small's GEMMs at 128 tokens, on 64x64 OS, 64x64 WS and 32x32 IS
arrays and at 5, 10 and 40 words per cycle with SRAMs of 64, 16 and 8 kB; `--full` runs both sets
(each on its own configs). The layers are written as one MLIR
module, one function per layer, and compiled by the pinned iree-compile; each runs on
`emu` with the accelerator read from a SCALE-Sim .cfg file, and emu reads each
dispatch's work from the compiled program itself (the MLIR the compiler dumped for each
export, which the executable's source locations name). The same layers go to SCALE-Sim as a
topology (depthwise layers as its `DP` layers: one single-channel convolution per
channel), with the same .cfg files. Stall-free configs (`InterfaceBandwidth: CALC`)
compare emu's compute cycles with SCALE-Sim's Total Cycles; limited-bandwidth ones
(`USER`) compare total cycles (compute + stall). Writes bench/results/emu_vs_scalesim.json
and prints a table per config: cycles per layer, relative error, the time each tool
took (SCALE-Sim's CPU seconds; emu's wall seconds to run the layer, the real kernel
included), and the mean absolute error. Without scalesim it prints why and exits 0.

SCALE-Sim runs one process per (config, layer), `--jobs` at once under `nice`, and its
answer is kept in bench/results/scalesim_cache/ under a hash of the .cfg text and the
topology, so a second run (or one that was stopped) only simulates what is new. Its
memory model slows down with every SRAM refill (a layer that refills tens of thousands
of times takes hours), so each layer gets `--scalesim-budget` CPU seconds; one over it
is listed, with the budget, and left out of the errors. `--cached-only` compares what
SCALE-Sim has answered so far and lists the rest.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import hashlib
import io
import json
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from _common import RESULTS_DIR, print_table, write_results  # noqa: E402


class Layer(NamedTuple):
    """A convolution (out_h x out_w outputs of `filters` channels, an r x s window over
    `channels` input channels, `stride`), a depthwise one (`filters` = 0) or a GEMM
    (`m` x `k` by `k` x `n`: out_h = m, channels = k, filters = n, r = s = 0)."""

    name: str
    network: str
    out_h: int
    out_w: int
    r: int
    s: int
    channels: int
    filters: int
    stride: int = 1

    @property
    def gemm(self) -> bool:
        return self.r == 0

    @property
    def depthwise(self) -> bool:
        return self.filters == 0

    @property
    def in_h(self) -> int:
        return (self.out_h - 1) * self.stride + self.r

    @property
    def in_w(self) -> int:
        return (self.out_w - 1) * self.stride + self.s


# Layers SCALE-Sim simulates in seconds each (on a shared 2-core machine a few
# minutes for all configs); `--full` adds the large ones (tens of minutes).
LAYERS = [
    Layer("resnet18_down_3x3s2_28", "ResNet-18", 28, 28, 3, 3, 64, 128, 2),
    Layer("resnet18_down_1x1s2_28", "ResNet-18", 28, 28, 1, 1, 64, 128, 2),
    Layer("mobilenetv2_pw_expand_28", "MobileNetV2", 28, 28, 1, 1, 32, 192),
    Layer("mobilenetv2_pw_project_14", "MobileNetV2", 14, 14, 1, 1, 384, 64),
    Layer("bert_mini_qkv_24", "BERT-mini", 24, 1, 0, 0, 256, 768),
    Layer("bert_mini_ffn_up_24", "BERT-mini", 24, 1, 0, 0, 256, 1024),
    Layer("bert_mini_ffn_down_24", "BERT-mini", 24, 1, 0, 0, 1024, 256),
]
FULL_LAYERS = LAYERS + [
    Layer("resnet18_conv1_7x7s2", "ResNet-18", 112, 112, 7, 7, 3, 64, 2),
    Layer("resnet18_conv2_3x3_56", "ResNet-18", 56, 56, 3, 3, 64, 64),
    Layer("resnet18_conv3_3x3_28", "ResNet-18", 28, 28, 3, 3, 128, 128),
    Layer("resnet18_conv4_3x3_14", "ResNet-18", 14, 14, 3, 3, 256, 256),
    Layer("resnet18_conv5_3x3_7", "ResNet-18", 7, 7, 3, 3, 512, 512),
    Layer("mobilenetv2_dw_3x3_28", "MobileNetV2", 28, 28, 3, 3, 192, 0),
    Layer("bert_qkv_24", "BERT-base", 24, 1, 0, 0, 768, 2304),
    Layer("bert_ffn_up_24", "BERT-base", 24, 1, 0, 0, 768, 3072),
    Layer("bert_ffn_down_24", "BERT-base", 24, 1, 0, 0, 3072, 768),
]


class Config(NamedTuple):
    rows: int
    cols: int
    dataflow: str
    bandwidth: int  # words per cycle; 0 = CALC (stall-free)
    sram_kb: int = 64


CONFIGS = {
    "os32": Config(32, 32, "os", 0),
    "ws128": Config(128, 128, "ws", 0),
    "is64": Config(64, 64, "is", 0),
    "os32_bw10": Config(32, 32, "os", 10),
    "ws128_bw20": Config(128, 128, "ws", 20),
}

# Never used to tune the model: other networks' layers, other arrays, other bandwidths,
# SRAMs that force refetches. Sized so SCALE-Sim gets through them in minutes (its
# time grows with the array's width times the stall-free cycles).
HELD_OUT_LAYERS = [
    Layer("vgg16_cifar_conv3_3x3_8", "VGG-16 (CIFAR-10)", 8, 8, 3, 3, 256, 256),
    Layer("resnet50_conv3_3x3s2_28", "ResNet-50", 28, 28, 3, 3, 128, 128, 2),
    Layer("resnet50_1x1_reduce_14", "ResNet-50", 14, 14, 1, 1, 1024, 256),
    Layer("mobilenetv3s_dw_5x5s2_14", "MobileNetV3-Small", 14, 14, 5, 5, 96, 0, 2),
    Layer("bert_small_qkv_128", "BERT-small", 128, 1, 0, 0, 512, 1536),
    Layer("bert_small_attn_out_128", "BERT-small", 128, 1, 0, 0, 512, 512),
]
HELD_OUT_CONFIGS = {
    "os64": Config(64, 64, "os", 0),
    "ws64": Config(64, 64, "ws", 0),
    "is32": Config(32, 32, "is", 0),
    "os64_bw5": Config(64, 64, "os", 5),
    "ws64_bw40": Config(64, 64, "ws", 40),
    "is32_bw10_sram16": Config(32, 32, "is", 10, 16),
    "os32_bw40_sram8": Config(32, 32, "os", 40, 8),
}
ALL_CONFIGS = {**CONFIGS, **HELD_OUT_CONFIGS}


def config_text(name: str, c: Config) -> str:
    """A complete SCALE-Sim 3.0.0 .cfg (it requires the layout and sparsity sections)."""
    mode = "USER" if c.bandwidth else "CALC"
    bandwidth = c.bandwidth or 10
    return f"""[general]
run_name = {name}

[architecture_presets]
ArrayHeight: {c.rows}
ArrayWidth: {c.cols}
IfmapSramSzkB: {c.sram_kb}
FilterSramSzkB: {c.sram_kb}
OfmapSramSzkB: {c.sram_kb}
IfmapOffset: 0
FilterOffset: 10000000
OfmapOffset: 20000000
Bandwidth : {bandwidth}
Dataflow : {c.dataflow}
MemoryBanks: 1
ReadRequestBuffer: 32
WriteRequestBuffer: 32

[layout]
IfmapCustomLayout: False
IfmapSRAMBankBandwidth: {bandwidth}
IfmapSRAMBankNum: 1
IfmapSRAMBankPort: 2
FilterCustomLayout: False
FilterSRAMBankBandwidth: {bandwidth}
FilterSRAMBankNum: 1
FilterSRAMBankPort: 2

[sparsity]
SparsitySupport: false
SparseRep: ellpack_block
OptimizedMapping: false
BlockSize: 8
RandomNumberGeneratorSeed: 40

[run_presets]
InterfaceBandwidth: {mode}
UseRamulatorTrace: False

[emu]
ClockHz: 1e9
"""


# -- the layers as IREE programs -------------------------------------------------------


def input_shapes(layer: Layer) -> list[tuple[int, ...]]:
    if layer.gemm:
        return [(layer.out_h, layer.channels), (layer.channels, layer.filters)]
    x = (1, layer.in_h, layer.in_w, layer.channels)
    if layer.depthwise:
        return [x, (layer.r, layer.s, layer.channels)]
    return [x, (layer.r, layer.s, layer.channels, layer.filters)]


def layer_mlir(layer: Layer) -> str:
    f32 = "f32"
    if layer.gemm:
        m, k, n = layer.out_h, layer.channels, layer.filters
        a, b, o = f"tensor<{m}x{k}x{f32}>", f"tensor<{k}x{n}x{f32}>", f"tensor<{m}x{n}x{f32}>"
        body = f"linalg.matmul ins(%x, %w : {a}, {b}) outs(%f : {o}) -> {o}"
    else:
        c = layer.channels
        x = f"tensor<1x{layer.in_h}x{layer.in_w}x{c}x{f32}>"
        if layer.depthwise:
            w = f"tensor<{layer.r}x{layer.s}x{c}x{f32}>"
            o = f"tensor<1x{layer.out_h}x{layer.out_w}x{c}x{f32}>"
            op = "linalg.depthwise_conv_2d_nhwc_hwc"
        else:
            w = f"tensor<{layer.r}x{layer.s}x{c}x{layer.filters}x{f32}>"
            o = f"tensor<1x{layer.out_h}x{layer.out_w}x{layer.filters}x{f32}>"
            op = "linalg.conv_2d_nhwc_hwcf"
        a, b = x, w
        attrs = (f"{{dilations = dense<1> : tensor<2xi64>, "
                 f"strides = dense<{layer.stride}> : tensor<2xi64>}}")
        body = f"{op} {attrs} ins(%x, %w : {a}, {b}) outs(%f : {o}) -> {o}"
    return f"""
func.func @{layer.name}(%x: {a}, %w: {b}) -> {o} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {o}
  %f = linalg.fill ins(%z : f32) outs(%e : {o}) -> {o}
  %r = {body}
  return %r : {o}
}}
"""


def compile_layers(layers: list[Layer]) -> str:
    """The layers compiled with their executables dumped beside the results, so each
    export's source location names its configured MLIR and emu reads the work there
    (work source `compiler`)."""
    from support.iree_tools import HOST_FLAGS, compile_mlir

    dump = os.path.join(RESULTS_DIR, "emu_vs_scalesim_executables")
    flags = [*HOST_FLAGS, f"--iree-hal-dump-executable-configurations-to={dump}"]
    source = "".join(layer_mlir(layer) for layer in layers)
    path = compile_mlir(source, flags)
    if not os.path.isdir(dump):  # compiled earlier, its dump since removed
        path.unlink()
        path = compile_mlir(source, flags)
    return str(path)


def run_emu(vmfb: str, layers: list[Layer], config_path: str) -> dict[str, dict[str, Any]]:
    """Each layer once on an emu device with the accelerator of `config_path`: its
    dispatch's cycles as emu's summary reports them, and the call's wall time."""
    import numpy as np

    import tinyhal
    from tinyhal import hal

    out: dict[str, dict[str, Any]] = {}
    rng = np.random.default_rng(0)
    for layer in layers:
        emu = hal.create_device("emu", accelerator=config_path)
        try:
            with tinyhal.load(vmfb, device=emu) as module:
                fn = getattr(module, layer.name)
                args = [rng.standard_normal(s, dtype=np.float32) for s in input_shapes(layer)]
                began = time.perf_counter()
                fn(*args)
                seconds = time.perf_counter() - began
            records = [r for r in emu.summary().dispatch_costs if layer.name in r.export]
        finally:
            emu.close()
        out[layer.name] = {
            "exports": [r.export for r in records],
            "compute_cycles": sum(r.compute_cycles * r.count for r in records),
            "stall_cycles": sum(r.stall_cycles * r.count for r in records),
            "dram_bytes": sum(r.dram_bytes * r.count for r in records),
            "work_source": ",".join(sorted({r.work_source for r in records})),
            "seconds": seconds,
        }
    return out


# -- SCALE-Sim ---------------------------------------------------------------------------


def topology_rows(layer: Layer) -> list[str]:
    """The layer in SCALE-Sim's topology CSV: a GEMM as SCALE-Sim's own GEMM reader
    writes one (an M x K input, N filters of 1 x K), a depthwise convolution as a `DP`
    layer of one filter per channel (SCALE-Sim expands it into single-channel layers)."""
    if layer.gemm:
        m, k, n = layer.out_h, layer.channels, layer.filters
        return [f"{layer.name},{m},{k},1,{k},1,{n},1,"]
    if layer.depthwise:
        return [f"DP{layer.name},{layer.in_h},{layer.in_w},{layer.r},{layer.s},"
                f"{layer.channels},1,{layer.stride},"]
    return [f"{layer.name},{layer.in_h},{layer.in_w},{layer.r},{layer.s},{layer.channels},"
            f"{layer.filters},{layer.stride},"]


CACHE_DIR = os.path.join(RESULTS_DIR, "scalesim_cache")
TOPOLOGY_HEADER = ("Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, "
                   "Channels, Num Filter, Strides,\n")


def scalesim_cache_path(config_name: str, layer: Layer) -> str:
    """Where SCALE-Sim's answer for this config and layer is kept: a hash of exactly
    what SCALE-Sim reads (the .cfg text less its run name, the topology)."""
    cfg = config_text("run", ALL_CONFIGS[config_name])
    key = hashlib.sha256((cfg + TOPOLOGY_HEADER + "\n".join(topology_rows(layer)))
                         .encode()).hexdigest()[:24]
    return os.path.join(CACHE_DIR, f"{key}.json")


class OverBudget(Exception):
    """SCALE-Sim ran past its CPU budget on one layer."""


def _over_budget(_signum: int, _frame: Any) -> None:
    raise OverBudget


def run_scalesim(config_name: str, layer: Layer, budget: float = 0.0) -> dict[str, Any]:
    """SCALE-Sim on one layer (in its own process, so each gets its CPU time): its Total
    Cycles and Stall Cycles, summed over a depthwise layer's channels; cached (and
    taken from the cache if another run put it there meanwhile). With a `budget` of CPU
    seconds (SCALE-Sim's memory model slows down with every SRAM refill: a layer that
    refills tens of thousands of times takes hours) a layer that needs more answers
    `{"over_budget": budget}`, cached too, and is simulated again only with a larger
    budget."""
    earlier = cached_scalesim(config_name, layer, budget)
    if earlier is not None:
        return earlier
    with contextlib.suppress(OSError):
        os.nice(10)
    from scalesim.scale_sim import scalesim

    limits = resource.getrlimit(resource.RLIMIT_CPU)
    if budget:
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        resource.setrlimit(resource.RLIMIT_CPU, (int(used + budget) + 1, limits[1]))
        signal.signal(signal.SIGXCPU, _over_budget)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = os.path.join(tmp, "array.cfg")
            with open(cfg, "w") as f:
                f.write(config_text("run", ALL_CONFIGS[config_name]))
            topology = os.path.join(tmp, f"{layer.name}.csv")
            with open(topology, "w") as f:
                f.write(TOPOLOGY_HEADER + "\n".join(topology_rows(layer)) + "\n")
            began = time.process_time()
            with contextlib.redirect_stdout(io.StringIO()):
                sim = scalesim(save_disk_space=True, verbose=False, config=cfg,
                               topology=topology, layout=topology)
                sim.run_scale(top_path=tmp)
            seconds = time.process_time() - began
            with open(os.path.join(tmp, "run", "COMPUTE_REPORT.csv")) as f:
                rows = list(csv.reader(f))[1:]
        result: dict[str, Any] = {"cycles": sum(int(r[2]) for r in rows),
                                  "stall_cycles": sum(int(r[3]) for r in rows),
                                  "seconds": seconds}
    except OverBudget:
        result = {"over_budget": budget}
    finally:
        if budget:
            signal.signal(signal.SIGXCPU, signal.SIG_DFL)
            resource.setrlimit(resource.RLIMIT_CPU, limits)
    path = scalesim_cache_path(config_name, layer)
    os.makedirs(CACHE_DIR, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return result


def cached_scalesim(config_name: str, layer: Layer, budget: float = 0.0
                    ) -> dict[str, Any] | None:
    """The cached answer, unless it ran out of a budget smaller than `budget` (0: no
    limit)."""
    try:
        with open(scalesim_cache_path(config_name, layer)) as f:
            result = json.load(f)
    except (OSError, ValueError):
        return None
    if "over_budget" in result and (not budget or budget > result["over_budget"]):
        return None
    return result


def earlier_scalesim(path: str) -> dict[tuple[str, str], dict[str, Any]]:
    """SCALE-Sim's figures per (config, layer) from an earlier run's JSON."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {(r["config"], r["layer"]): {"cycles": r["scalesim_cycles"],
                                        "stall_cycles": r["scalesim_stall"],
                                        "seconds": r["scalesim_s"]} for r in rows}


# -- the comparison ------------------------------------------------------------------------


def plan(args: argparse.Namespace) -> list[tuple[str, str, list[Layer]]]:
    """(set name, config, layers) to compare, from the command line."""
    suites = []
    if not args.held_out:
        suites.append(("tuning", CONFIGS, FULL_LAYERS if args.full else LAYERS))
    if args.held_out or args.full:
        suites.append(("held-out", HELD_OUT_CONFIGS, HELD_OUT_LAYERS))
    wanted_configs = set(filter(None, args.configs.split(",")))
    wanted_layers = set(filter(None, args.layers.split(",")))
    runs = []
    for name, configs, layers in suites:
        if wanted_layers:
            layers = [x for x in FULL_LAYERS + HELD_OUT_LAYERS if x.name in wanted_layers]
        for c in configs:
            if (not wanted_configs or c in wanted_configs) and layers:
                runs.append((name, c, layers))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="",
                        help=f"comma-separated, of {', '.join(ALL_CONFIGS)} (those of the set)")
    parser.add_argument("--layers", default="", help="comma-separated layer names (all)")
    parser.add_argument("--full", action="store_true",
                        help="the large tuning layers (ResNet-18's 7x7 and 3x3 convolutions, "
                             "a depthwise one, BERT-base GEMMs) and the held-out set")
    parser.add_argument("--held-out", action="store_true",
                        help="only the held-out layers and configs, never used for tuning")
    parser.add_argument("--jobs", type=int, default=2, help="SCALE-Sim processes at once")
    parser.add_argument("--cached-only", action="store_true",
                        help="compare only what SCALE-Sim has answered (cached), listing "
                             "the rest, e.g. while a long run is still going")
    parser.add_argument("--scalesim-budget", type=float, default=900.0,
                        help="CPU seconds SCALE-Sim may take on one layer (0: no limit); "
                             "a layer over it is reported, not compared")
    parser.add_argument("--scalesim-results", default="",
                        help="reuse SCALE-Sim's cycles from this earlier JSON output (its "
                             "runs take minutes) instead of running it again")
    args = parser.parse_args()
    try:
        import scalesim  # noqa: F401
    except ImportError as exc:
        print(f"skipped: scalesim is not installed ({exc}); pip install '.[bench-emu]'")
        return 0
    unknown = [c for c in args.configs.split(",") if c and c not in ALL_CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; known: {list(ALL_CONFIGS)}")
    runs = plan(args)
    if not runs:
        parser.error("no layer and config left to compare")
    layers = list({x.name: x for _s, _c, run_layers in runs for x in run_layers}.values())
    vmfb = compile_layers(layers)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    reused = earlier_scalesim(args.scalesim_results) if args.scalesim_results else {}
    sim_results: dict[tuple[str, str], Any] = {}
    for _s, c, run_layers in runs:
        for x in run_layers:
            sim_results[c, x.name] = (reused.get((c, x.name))
                                      or cached_scalesim(c, x, args.scalesim_budget))
    missing = [(c, x) for _s, c, run_layers in runs for x in run_layers
               if sim_results[c, x.name] is None]
    print(f"SCALE-Sim: {len(sim_results) - len(missing)} results reused, "
          f"{0 if args.cached_only else len(missing)} to simulate", flush=True)
    if args.cached_only:  # compare what SCALE-Sim has answered, list the rest
        for c, x in missing:
            sim_results[c, x.name] = {"not_simulated": True}
        missing = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        pending = {pool.submit(run_scalesim, c, x, args.scalesim_budget): (c, x.name)
                   for c, x in missing}
        emu_results = {}
        for _s, c, run_layers in runs:
            path = os.path.join(RESULTS_DIR, f"emu_vs_scalesim_{c}.cfg")
            with open(path, "w") as f:
                f.write(config_text(c, ALL_CONFIGS[c]))
            emu_results[c] = run_emu(vmfb, run_layers, path)
        for future in concurrent.futures.as_completed(pending):
            sim_results[pending[future]] = future.result()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for suite, c, run_layers in runs:
        limited = ALL_CONFIGS[c].bandwidth > 0
        errors = []
        over = []
        for layer in run_layers:
            e, s = emu_results[c][layer.name], sim_results[c, layer.name]
            ours = e["compute_cycles"] + (e["stall_cycles"] if limited else 0)
            row = {"set": suite, "config": c, "layer": layer.name, "network": layer.network,
                   "emu_cycles": ours, "emu_stall": e["stall_cycles"],
                   "emu_work_source": e["work_source"], "emu_exports": e["exports"],
                   "emu_s": e["seconds"]}
            if "over_budget" in s or "not_simulated" in s:  # not compared
                over.append(layer.name)
                row.update(scalesim_cycles="over budget" if "over_budget" in s
                           else "not simulated", scalesim_s=s.get("over_budget", 0.0))
            else:
                error = (ours - s["cycles"]) / s["cycles"]
                errors.append(abs(error))
                row.update(scalesim_cycles=s["cycles"], error=error,
                           scalesim_stall=s["stall_cycles"], scalesim_s=s["seconds"])
            rows.append(row)
        summary[c] = {"set": suite,
                      "compared": "total cycles" if limited else "stall-free compute cycles",
                      "layers": len(errors), "scalesim_over_budget": over,
                      "mean_abs_error": statistics.fmean(errors) if errors else None,
                      "max_abs_error": max(errors, default=None),
                      "scalesim_seconds": sum(r["scalesim_s"] for r in rows
                                              if r["config"] == c),
                      "emu_seconds": sum(emu_results[c][x.name]["seconds"] for x in run_layers)}
    name = "emu_vs_scalesim" + ("_full" if args.full else "_held_out" if args.held_out else "")
    path = write_results(name, rows, {"summary": summary,
                                      "configs": {c: ALL_CONFIGS[c]._asdict()
                                                  for _s, c, _l in runs}})
    for suite, c, _l in runs:
        done = summary[c]
        errors_text = (f"mean |error| {done['mean_abs_error']:.1%}, max "
                       f"{done['max_abs_error']:.1%}" if done["layers"] else "nothing compared")
        if done["scalesim_over_budget"]:
            why = ("not simulated yet" if args.cached_only else
                   f"SCALE-Sim over its {args.scalesim_budget:g} s budget")
            errors_text += (f" ({done['layers']} layers; {why} or over budget: "
                            f"{', '.join(done['scalesim_over_budget'])})")
        print(f"\n{c} [{suite}] ({done['compared']}): {errors_text}; SCALE-Sim "
              f"{done['scalesim_seconds']:.1f} s CPU, emu {done['emu_seconds']:.2f} s wall")
        print_table([r for r in rows if r["config"] == c],
                    ["layer", "scalesim_cycles", "emu_cycles", "error", "scalesim_s", "emu_s",
                     "emu_work_source"])
    print(f"\nwrote {path} (the machine was shared with other work: times are indicative)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
