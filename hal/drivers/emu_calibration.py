"""Calibrating the `emu` cost model against the host: samples, the fit and its report.

In calibration mode each dispatch runs on one host thread and is measured
(`DispatchSample`); `fit_costs` turns samples into per-export per-workgroup costs and
`calibration_report` compares what a model predicts with what was measured, so a model
fitted on one invocation can be checked on another (held out).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ...errors import FailedPreconditionError
from .emu_model import CostModel


@dataclass(frozen=True)
class DispatchSample:
    """One dispatch measured in calibration mode, run on one host thread: `measured_ns`
    is that thread's CPU time (what the kernels cost, not what other processes on a
    shared host took from it), `wall_ns` the wall time."""

    export: str
    workgroups: int
    measured_ns: int
    wall_ns: int = 0


@dataclass(frozen=True)
class CalibrationReport:
    """Predicted against measured host time per dispatch, and the relative errors."""

    rows: list[tuple[str, int, int, int, float]]  # export, workgroups, predicted, measured, err
    mean_abs_error: float
    median_abs_error: float
    max_abs_error: float
    total_error: float  # |sum predicted - sum measured| / sum measured

    def format(self) -> str:
        return (f"calibration: {len(self.rows)} dispatches, per-dispatch |error| mean "
                f"{self.mean_abs_error:.1%}, median {self.median_abs_error:.1%}, max "
                f"{self.max_abs_error:.1%}; total {self.total_error:.1%}")


def fit_costs(samples: list[DispatchSample]) -> dict[str, float]:
    """Per export, the median over its samples of measured time per workgroup, in
    seconds (the median is robust to a sample the host preempted)."""
    if not samples:
        raise FailedPreconditionError("no calibration samples: create the device with "
                                      "calibrate=True and run dispatches first")
    per_export: dict[str, list[float]] = {}
    for s in samples:
        if s.workgroups:
            per_export.setdefault(s.export, []).append(s.measured_ns / s.workgroups)
    return {name: statistics.median(values) / 1e9 for name, values in per_export.items()}


def calibration_report(samples: list[DispatchSample], model: CostModel) -> CalibrationReport:
    """What `model` predicts for each sample on one unit, against what was measured."""
    rows = []
    costs = model.export_costs
    for s in samples:
        per = costs.get(s.export, model.workgroup_time)
        predicted = int(per * s.workgroups * 1e9)
        err = abs(predicted - s.measured_ns) / s.measured_ns if s.measured_ns else 0.0
        rows.append((s.export, s.workgroups, predicted, s.measured_ns, err))
    if not rows:
        raise FailedPreconditionError("no calibration samples to report on")
    errors = sorted(r[4] for r in rows)
    measured = sum(r[3] for r in rows)
    return CalibrationReport(rows, sum(errors) / len(errors), errors[len(errors) // 2],
                             errors[-1], abs(sum(r[2] for r in rows) - measured) / measured)


__all__ = ["CalibrationReport", "DispatchSample", "calibration_report", "fit_costs"]
