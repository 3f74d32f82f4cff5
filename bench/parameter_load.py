"""Loading a program's external parameters: tinyhal beside iree.runtime, same files.

One program reads a `--size-mib` weight from a `.safetensors` file (scope `model`);
each round loads the module with its parameters and makes one call, in alternating
order: tinyhal `file` mode (pread into device memory), tinyhal `preload` (one copy into
private memory at indexing, then used in place), and iree.runtime with the file mapped
(its default: used in place, not safe against truncation) and preloaded. The figure is
the median seconds from "load" to the first result, and the ratio to iree.runtime's
default. Results go to bench/results/parameter_load_FORMAT.json.

    python bench/parameter_load.py [--size-mib 64] [--rounds 5] [--device task]
                                   [--format safetensors|irpa]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from _common import print_table, write_results  # noqa: E402

PROGRAM = """
util.global private @w = #stream.parameter.named<"model"::"w"> : tensor<{rows}x1024xf32>
func.func @main(%x: tensor<1024xf32>) -> tensor<1024xf32> {{
  %w = util.global.load @w : tensor<{rows}x1024xf32>
  %row = tensor.extract_slice %w[{last}, 0] [1, 1024] [1, 1]
      : tensor<{rows}x1024xf32> to tensor<1024xf32>
  %y = arith.addf %x, %row : tensor<1024xf32>
  return %y : tensor<1024xf32>
}}
"""


def _compile(rows: int, directory: str) -> str:
    import subprocess

    source = os.path.join(directory, "program.mlir")
    with open(source, "w") as f:
        f.write(PROGRAM.format(rows=rows, last=rows - 1))
    out = os.path.join(directory, "program.vmfb")
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "iree-compile"), source,
                    "-o", out, "--iree-hal-target-device=local",
                    "--iree-hal-local-target-device-backends=llvm-cpu",
                    "--iree-llvmcpu-target-cpu=host"], check=True, timeout=300)
    return out


def _tinyhal(vmfb: str, weights: str, mode: str, device: str, x: np.ndarray):
    import tinyhal
    from tinyhal.vm import ParameterIndex

    start = time.perf_counter()
    index = ParameterIndex().load(weights, mode=mode)
    with tinyhal.load(vmfb, device=device, parameters={"model": index}) as module:
        y = module.main(x)
        seconds = time.perf_counter() - start
        stats = module.parameter_statistics()
    return seconds, y, stats


def _iree(vmfb: str, weights: str, mmap: bool, x: np.ndarray):
    import iree.runtime as rt

    start = time.perf_counter()
    config = rt.Config("local-task")
    index = rt.ParameterIndex()
    index.load(weights, mmap=mmap)
    params = rt.create_io_parameters_module(config.vm_instance,
                                            index.create_provider(scope="model"))
    main = rt.VmModule.mmap(config.vm_instance, vmfb)
    context = rt.SystemContext(vm_modules=[params, main], config=config)
    y = context.modules.module["main"](x).to_host()
    return time.perf_counter() - start, y, None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="task")
    p.add_argument("--format", default="safetensors", choices=("safetensors", "irpa"),
                   help="irpa: the same weights converted by iree-convert-parameters "
                        "(64-byte-aligned data, so preloaded weights are used in place)")
    args = p.parse_args()
    from safetensors.numpy import save_file

    rows = max(1, args.size_mib * 256)  # 1024 f32 = 4 KiB a row
    with tempfile.TemporaryDirectory() as directory:
        vmfb = _compile(rows, directory)
        weights = os.path.join(directory, "weights.safetensors")
        w = np.random.default_rng(0).standard_normal((rows, 1024), dtype=np.float32)
        save_file({"w": w}, weights)
        if args.format == "irpa":
            import subprocess

            converted = os.path.join(directory, "weights.irpa")
            subprocess.run([os.path.join(os.path.dirname(sys.executable),
                                         "iree-convert-parameters"),
                            f"--parameters={weights}", f"--output={converted}"],
                           check=True, timeout=300, capture_output=True)
            weights = converted
        x = np.linspace(-1, 1, 1024, dtype=np.float32)
        expected = x + w[-1]
        del w
        runners = {
            "tinyhal file": lambda: _tinyhal(vmfb, weights, "file", args.device, x),
            "tinyhal preload": lambda: _tinyhal(vmfb, weights, "preload", args.device, x),
            "iree.runtime mmap": lambda: _iree(vmfb, weights, True, x),
            "iree.runtime preload": lambda: _iree(vmfb, weights, False, x),
        }
        samples: dict[str, list[float]] = {name: [] for name in runners}
        stats: dict[str, object] = {}
        for round_index in range(args.rounds):
            names = list(runners)
            if round_index % 2:
                names.reverse()
            for name in names:
                seconds, y, st = runners[name]()
                assert y.tobytes() == expected.tobytes(), name
                samples[name].append(seconds)
                stats[name] = st
    base = statistics.median(samples["iree.runtime mmap"])
    rows_out = []
    for name, values in samples.items():
        st = stats[name]
        rows_out.append({
            "runner": name, "median_s": statistics.median(values),
            "vs_iree_mmap": statistics.median(values) / base,
            "read_mib": st.read_bytes / 2**20 if st else "",
            "in_place_mib": st.imported_bytes / 2**20 if st else "",
        })
    load = os.getloadavg()
    print(f"{args.size_mib} MiB parameter ({args.format}), {args.rounds} rounds, device "
          f"{args.device}, load average {load[0]:.2f}")
    print_table(rows_out, ["runner", "median_s", "vs_iree_mmap", "read_mib", "in_place_mib"])
    path = write_results(f"parameter_load_{args.format}", rows_out, {
                                                      "size_mib": args.size_mib,
                                                      "format": args.format,
                                                      "rounds": args.rounds,
                                                      "device": args.device,
                                                      "load_average": load[0]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
