"""The `emu` driver's cost model and its presets.

A `CostModel` is the description of an accelerator that does not exist: how much memory
it has, its DMA engines and compute units and what each operation costs on them. It is
pure arithmetic over an operation's size (no clocks, no state), so the same operation
always costs the same, which is what lets the engines (`emu_engines`) model a recorded
command buffer once and replay the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ...errors import InvalidArgumentError
from ..emu_cost import (
    AcceleratorConfig,
    DispatchCost,
    DispatchWork,
    accelerator_config,
    dispatch_cost,
    read_cost_file,
)


@dataclass(frozen=True)
class CostModel:
    """The modelled device. Times in seconds, bandwidths in bytes per second.

    `memory_bandwidth` 0 means unbounded (no roofline); `export_costs` maps an export
    name to its per-workgroup time, overriding `workgroup_time` for that export.

    With an `accelerator` (`hal.emu_cost.AcceleratorConfig`) each compute unit is one
    such accelerator and a dispatch whose work is known (`hal.dispatch_work`) costs
    `launch_latency` plus its cost model's cycles at the accelerator's clock; one whose
    work is not known falls back to the per-workgroup cost. `measured` maps an export
    name to a measured `DispatchCost` (a cost file), which wins over both.
    """

    memory_size: int = 1 << 30
    memory_bandwidth: float = 0.0
    dma_engines: int = 1
    dma_bandwidth: float = 16e9
    dma_latency: float = 2e-6
    launch_latency: float = 5e-6
    compute_units: int = 8
    workgroup_time: float = 1e-7
    export_costs: dict[str, float] = field(default_factory=dict)
    accelerator: AcceleratorConfig | None = None
    measured: dict[str, DispatchCost] = field(default_factory=dict)

    def validate(self) -> None:
        for name in ("memory_size", "dma_engines", "dma_bandwidth", "compute_units"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise InvalidArgumentError(f"emu option {name} must be positive, not {value!r}")
        for name in ("memory_bandwidth", "dma_latency", "launch_latency", "workgroup_time"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise InvalidArgumentError(f"emu option {name} must be >= 0, not {value!r}")
        for name in ("dma_engines", "compute_units", "memory_size"):
            if not isinstance(getattr(self, name), int):
                raise InvalidArgumentError(f"emu option {name} must be an int")
        for name, cost in self.export_costs.items():
            if not isinstance(cost, (int, float)) or cost < 0:
                raise InvalidArgumentError(f"emu export cost of {name!r} must be >= 0")

    def transfer_ns(self, size: int) -> int:
        return round(self.dma_latency * 1e9) + round(size * 1e9 / self.dma_bandwidth)

    def dispatch_ns(self, export: str, workgroups: int, units: int, bound_bytes: int) -> int:
        per_workgroup = self.export_costs.get(export, self.workgroup_time)
        waves = math.ceil(workgroups / units) if units else 0
        compute = waves * per_workgroup * 1e9
        memory = bound_bytes * 1e9 / self.memory_bandwidth if self.memory_bandwidth else 0.0
        return round(self.launch_latency * 1e9) + round(max(compute, memory))

    @property
    def clock_hz(self) -> float:
        """The clock cycles are counted in: the accelerator's, else 1 GHz."""
        return self.accelerator.clock_hz if self.accelerator is not None else 1e9

    def dispatch_time(self, export: str, workgroups: int, units: int, bound_bytes: int,
                      work: DispatchWork | None, overlapping: int = 0
                      ) -> tuple[int, DispatchCost, str]:
        """A dispatch's modelled nanoseconds, its cost in cycles and where its figure came
        from (`cost-file`, the work's source, or `workgroups`). `overlapping` dispatches
        running when it starts share the accelerator's DRAM bandwidth with it."""
        clock = self.clock_hz
        launch = round(self.launch_latency * 1e9)
        measured = self.measured.get(export)
        if measured is not None:
            return launch + round(measured.cycles * 1e9 / clock), measured, "cost-file"
        if self.accelerator is None or work is None or work.kind == "unknown":
            ns = self.dispatch_ns(export, workgroups, units, bound_bytes)
            cycles = round((ns - launch) * clock / 1e9)
            source = "workgroups" if work is None else work.source
            if self.accelerator is not None:
                source = "workgroups"
            return ns, DispatchCost(cycles, 0, bound_bytes, 0.0), source
        cost = dispatch_cost(work, self.accelerator.shared(overlapping + 1))
        return launch + round(cost.cycles * 1e9 / clock), cost, work.source


PRESETS: dict[str, CostModel] = {
    # The defaults (what `emu` was before presets): a generic accelerator.
    "generic": CostModel(),
    # A microcontroller-class NPU: little SRAM, one slow DMA, few units.
    "mcu-npu": CostModel(memory_size=8 << 20, memory_bandwidth=2e9, dma_engines=1,
                         dma_bandwidth=400e6, dma_latency=5e-6, launch_latency=20e-6,
                         compute_units=2, workgroup_time=4e-6),
    # An edge NPU (phone / embedded SoC class): shared LPDDR, two DMA engines.
    "edge-npu": CostModel(memory_size=512 << 20, memory_bandwidth=25e9, dma_engines=2,
                          dma_bandwidth=8e9, dma_latency=2e-6, launch_latency=8e-6,
                          compute_units=16, workgroup_time=1e-6),
    # A datacenter-class accelerator: HBM, many DMA engines and units.
    "datacenter": CostModel(memory_size=16 << 30, memory_bandwidth=2e12, dma_engines=4,
                            dma_bandwidth=50e9, dma_latency=1e-6, launch_latency=3e-6,
                            compute_units=128, workgroup_time=2e-7),
}
"""Named cost models. The figures are illustrative of each class of device, not any
product's datasheet; override any field with the option of the same name."""


def preset_fields() -> list[str]:
    """The cost-model fields a preset sets (each is also an `EmuDevice` option)."""
    return [f.name for f in fields(CostModel)]


def cost_model(preset: str, export_costs: dict[str, float] | None = None,
               accelerator: Any = None, cost_file: str | None = None,
               **overrides: Any) -> CostModel:
    """The preset's model with the fields given (not None) in `overrides` replaced and
    `export_costs` merged over the preset's, validated. With an `accelerator` (see
    `hal.emu_cost.accelerator_config`) `compute_units` defaults to 1 (one accelerator)
    and `launch_latency` to 0; `cost_file` (see `read_cost_file`) gives measured
    per-export costs."""
    if preset not in PRESETS:
        raise InvalidArgumentError(
            f"unknown emu preset {preset!r}; presets: {', '.join(PRESETS)}")
    config = accelerator_config(accelerator)
    if config is not None:
        overrides = {"compute_units": 1, "launch_latency": 0.0,
                     **{k: v for k, v in overrides.items() if v is not None},
                     "accelerator": config}
    if cost_file is not None:
        overrides = {**overrides, "measured": read_cost_file(cost_file)}
    model = replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
    if export_costs is not None:
        if not isinstance(export_costs, dict):
            raise InvalidArgumentError("emu option export_costs must be a dict")
        model = replace(model, export_costs={**model.export_costs, **export_costs})
    model.validate()
    return model


__all__ = ["CostModel", "PRESETS", "cost_model", "preset_fields"]
