"""Calibrating the emu cost model on MobileNetV2: per-dispatch prediction error.

    python bench/emu_calibration.py [--fit-runs 3] [--preset edge-npu]

Runs MobileNetV2 on `emu` in calibration mode (each dispatch on one host thread, timed):
one warm-up invocation, `--fit-runs` invocations whose samples fit each export's
per-workgroup cost (median), then one held-out invocation whose 55 dispatches are
predicted by the fitted model and compared with their measured host time. Prints the
error table and writes bench/results/emu_calibration.json. Host timings on a shared
machine are noisy; the held-out error includes that noise.
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from _common import print_table, write_results  # noqa: E402

import tinyhal  # noqa: E402
from support.models import mobilenet_input, mobilenet_v2_vmfb  # noqa: E402
from tinyhal import hal  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit-runs", type=int, default=3)
    parser.add_argument("--preset", default="edge-npu")
    args = parser.parse_args()
    x = mobilenet_input()
    emu = hal.create_device("emu", preset=args.preset, calibrate=True)
    with tinyhal.load(mobilenet_v2_vmfb(), device=emu) as module:
        module.mobilenet_v2(x)
        warm = len(emu.calibration_samples())
        for _ in range(args.fit_runs):
            module.mobilenet_v2(x)
        fit = emu.calibration_samples()[warm:]
        emu.fit_calibration(fit)
        module.mobilenet_v2(x)
        held_out = emu.calibration_samples()[warm + len(fit):]
        report = emu.calibration_report(held_out)
        summary = emu.summary()
    emu.close()
    rows = [{"export": e.split("_dispatch_")[-1][:40], "workgroups": wg,
             "predicted_us": p / 1e3, "measured_us": m / 1e3, "error_pct": err * 100}
            for e, wg, p, m, err in report.rows]
    print_table(rows, ["export", "workgroups", "predicted_us", "measured_us", "error_pct"])
    print(report.format())
    print(summary.format())
    path = write_results("emu_calibration", rows, {
        "preset": args.preset, "fit_runs": args.fit_runs,
        "mean_abs_error": report.mean_abs_error, "median_abs_error": report.median_abs_error,
        "max_abs_error": report.max_abs_error, "total_error": report.total_error,
        "note": "fit on the fit runs' samples, errors on a held-out run; host time on a "
                "shared 2-core machine (noisy)",
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
