"""Per-dispatch cost models for the `emu` driver: what one dispatch costs on a device.

The interface is one function::

    cost(work: DispatchWork, device: AcceleratorConfig) -> DispatchCost

`DispatchWork` says what the dispatch computes (its root operation, in the GEMM view
SCALE-Sim uses: M output rows, N output columns, K the reduction length, `groups`
independent problems), `AcceleratorConfig` what it runs on, and `DispatchCost` answers
in device cycles (compute, stall) and DRAM bytes. A cost function is pure arithmetic:
the same work on the same device always costs the same, which lets the driver model a
recorded submission once and replay the result. Cost functions are chosen per device
by name (`AcceleratorConfig.cost_model`) from a registry that users add to with
`register_cost_model`.

Built in:

- `"systolic"`: a rows x cols systolic array with output-, weight- or input-stationary
  dataflow, folded as SCALE-Sim folds it (convolutions through im2col), for matmuls
  and convolutions; depthwise convolutions run one channel at a time (as SCALE-Sim's
  `DP` layers do); pooling, element-wise and reduction work runs on the vector unit
  (`vector_cost`). Memory (`memory_stalls`, `ring_reads`, `refill_stalls`,
  `drain_stalls`): double-buffered on-chip SRAMs for ifmap, filter and ofmap, each
  operand laid out in DRAM in the order the array uses it and fetched half an SRAM at
  a time by a window that only moves forward (so an operand that does not fit is
  refetched on every sweep, and data the window passed costs a trip round the
  operand), DRAM bandwidth in words per cycle; the array waits for each refill it
  needs before it has arrived, and for the ofmap SRAM to drain, as SCALE-Sim's
  buffers make it wait.
- `"vector"`: every dispatch on the vector unit alone.

(The per-workgroup model of `hal.drivers.emu_model.CostModel`, used when a device has
no accelerator configuration, is the driver's other model: it prices workgroups in
seconds and knows nothing of the work.)

A word is one element of the operand's type, so DRAM bytes are words times the element
size; SRAM sizes are in words.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

from ..errors import InvalidArgumentError

GEMM_KINDS = ("matmul", "batch_matmul", "conv", "depthwise")
VECTOR_KINDS = ("pool", "elementwise", "reduction", "unknown")
WORK_KINDS = GEMM_KINDS + VECTOR_KINDS
WORK_SOURCES = ("compiler", "export-name", "workgroups", "cost-file", "given")
DATAFLOWS = ("os", "ws", "is")


@dataclass(frozen=True)
class DispatchWork:
    """What one dispatch computes, in the GEMM view of its root operation.

    For a matmul `m` x `k` times `k` x `n`; for a convolution `m` the output pixels
    (times the batch), `k` the window (filter height x width x input channels), `n`
    the filters; a depthwise convolution is `groups` (its channels) convolutions of one
    channel (`k` the filter height x width, `n` 1); a batch matmul `groups` matmuls.
    Vector work (pooling, element-wise, reduction) is `elements` outputs each reading
    `window` inputs. `input_words` / `filter_words` / `output_words` are the elements
    of each operand in memory (unique, not im2col); `source` says where the figures
    came from (`WORK_SOURCES`: `given` when built by hand). Kind `unknown` means only
    the workgroup count (`elements`) is known.
    """

    kind: str
    m: int = 0
    n: int = 0
    k: int = 0
    groups: int = 1
    elements: int = 0
    window: int = 1
    input_words: int = 0
    filter_words: int = 0
    output_words: int = 0
    element_bytes: int = 4
    source: str = "given"

    @property
    def macs(self) -> int:
        """Multiply-accumulates (GEMM kinds) or element operations (vector kinds)."""
        if self.kind in GEMM_KINDS:
            return self.groups * self.m * self.n * self.k
        return self.elements * self.window


class DispatchCost(NamedTuple):
    """A dispatch's cost on the device: `compute_cycles` with memory never in the way,
    `stall_cycles` waiting for DRAM, the bytes it moves to and from DRAM (of which
    `dram_write_bytes` written, the rest read; 0 written when a model does not say)
    and the share of the processing elements' cycles that did useful work."""

    compute_cycles: int
    stall_cycles: int
    dram_bytes: int
    utilisation: float
    dram_write_bytes: int = 0

    @property
    def cycles(self) -> int:
        return self.compute_cycles + self.stall_cycles

    @property
    def dram_read_bytes(self) -> int:
        return self.dram_bytes - self.dram_write_bytes


@dataclass(frozen=True)
class AcceleratorConfig:
    """An accelerator as a cost function sees it.

    `rows` x `cols` processing elements in `dataflow` (os / ws / is) at `clock_hz`;
    SRAMs of `*_sram_words` words each (half of each is the buffer being computed on,
    half the one being filled); DRAM bandwidth per operand in words per cycle (0 =
    unlimited: no stalls); a vector unit of `vector_lanes` lanes (0 = `cols`);
    `cost_model` names the cost function (`register_cost_model`).
    """

    rows: int = 32
    cols: int = 32
    dataflow: str = "os"
    clock_hz: float = 1e9
    ifmap_sram_words: int = 64 * 1024
    filter_sram_words: int = 64 * 1024
    ofmap_sram_words: int = 64 * 1024
    ifmap_bandwidth: float = 0.0
    filter_bandwidth: float = 0.0
    ofmap_bandwidth: float = 0.0
    vector_lanes: int = 0
    cost_model: str = "systolic"

    def validate(self) -> None:
        for name in ("rows", "cols", "ifmap_sram_words", "filter_sram_words",
                     "ofmap_sram_words"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgumentError(f"emu accelerator {name} must be an int >= 1, "
                                           f"not {value!r}")
        for name in ("ifmap_bandwidth", "filter_bandwidth", "ofmap_bandwidth"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise InvalidArgumentError(f"emu accelerator {name} must be >= 0 words per "
                                           f"cycle, not {value!r}")
        if not isinstance(self.clock_hz, (int, float)) or self.clock_hz <= 0:
            raise InvalidArgumentError(f"emu accelerator clock_hz must be > 0, not "
                                       f"{self.clock_hz!r}")
        if not isinstance(self.vector_lanes, int) or self.vector_lanes < 0:
            raise InvalidArgumentError("emu accelerator vector_lanes must be an int >= 0")
        if self.dataflow not in DATAFLOWS:
            raise InvalidArgumentError(f"emu accelerator dataflow must be one of {DATAFLOWS}, "
                                       f"not {self.dataflow!r}")
        if self.cost_model not in _COST_MODELS:
            raise InvalidArgumentError(f"unknown emu cost model {self.cost_model!r}; "
                                       f"registered: {', '.join(_COST_MODELS)}")

    def shared(self, ways: int) -> AcceleratorConfig:
        """This device with its DRAM bandwidth split `ways` ways (dispatches that
        overlap in time share it)."""
        if ways <= 1 or not (self.ifmap_bandwidth or self.filter_bandwidth
                             or self.ofmap_bandwidth):
            return self
        return replace(self, ifmap_bandwidth=self.ifmap_bandwidth / ways,
                       filter_bandwidth=self.filter_bandwidth / ways,
                       ofmap_bandwidth=self.ofmap_bandwidth / ways)


CostFunction = Callable[[DispatchWork, AcceleratorConfig], DispatchCost]
_COST_MODELS: dict[str, CostFunction] = {}


def register_cost_model(name: str, function: CostFunction) -> None:
    """Makes `function` the cost model called `name` (replacing one of that name);
    a device uses it with `AcceleratorConfig(cost_model=name)`."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError("a cost model's name must be a non-empty str")
    if not callable(function):
        raise InvalidArgumentError(f"cost model {name!r} must be callable")
    _COST_MODELS[name] = function


def cost_models() -> list[str]:
    """The registered cost models' names."""
    return list(_COST_MODELS)


def dispatch_cost(work: DispatchWork, device: AcceleratorConfig) -> DispatchCost:
    """`work` priced by the device's cost model, checked to be a `DispatchCost` of
    non-negative ints (a user function answering otherwise is an INVALID_ARGUMENT)."""
    cost = _COST_MODELS[device.cost_model](work, device)
    counts = (*cost[:3], *cost[4:]) if isinstance(cost, tuple) else ()
    if not (isinstance(cost, tuple) and len(cost) in (4, 5)
            and all(isinstance(v, int) and v >= 0 for v in counts)
            and (len(cost) == 4 or cost[4] <= cost[2])):
        raise InvalidArgumentError(f"cost model {device.cost_model!r} answered {cost!r}, "
                                   "not a DispatchCost of non-negative ints (written bytes "
                                   "at most the DRAM bytes)")
    return DispatchCost(*cost)


# -- the systolic array -------------------------------------------------------------------


class Folding(NamedTuple):
    """How one GEMM maps onto the array: `folds` tiles, each `fold_cycles` long, and
    which operand is streamed through the array again on each outer fold."""

    folds: int
    fold_cycles: int
    outer_folds: int
    inner_folds: int


def folding(m: int, n: int, k: int, rows: int, cols: int, dataflow: str) -> Folding:
    """SCALE-Sim's folding of an M x K by K x N product.

    Output stationary: the array holds a rows x cols tile of outputs (rows over M, cols
    over N) while K streams through: a fold is K cycles plus the pipeline's fill and
    drain (rows + cols - 2). Weight stationary: the array holds a rows x cols tile of
    the filter (rows over K, cols over N) after `rows` cycles to load it, and the M
    inputs stream through: 2 rows + cols + M - 2. Input stationary: it holds inputs
    (rows over K, cols over M) and the N filters stream: 2 rows + cols + N - 2. The
    outer loop runs over the column folds, the inner over the row folds.
    """
    if dataflow == "os":
        row_dim, col_dim, stream = m, n, k
        fold_cycles = stream + rows + cols - 2
    elif dataflow == "ws":
        row_dim, col_dim, stream = k, n, m
        fold_cycles = 2 * rows + cols + stream - 2
    else:
        row_dim, col_dim, stream = k, m, n
        fold_cycles = 2 * rows + cols + stream - 2
    inner = math.ceil(row_dim / rows)
    outer = math.ceil(col_dim / cols)
    return Folding(inner * outer, fold_cycles, outer, inner)


def systolic_compute_cycles(work: DispatchWork, device: AcceleratorConfig) -> int:
    """Stall-free cycles of a GEMM-kind dispatch on the array: its folds (times its
    groups, one after another)."""
    fold = folding(work.m, work.n, work.k, device.rows, device.cols, device.dataflow)
    return work.groups * fold.folds * fold.fold_cycles


def _diagonal_start(d: int, width: int) -> int:
    """Where anti-diagonal `d` of a matrix `width` columns wide (and many rows) starts
    when its elements are laid out diagonal after diagonal."""
    if d <= width - 1:
        return d * (d + 1) // 2
    return width * (width - 1) // 2 + (d - (width - 1)) * width


def ring_reads(blocks: int, rows: int, width: int, demands: Any, sram_words: int,
               diagonal: bool = True, data_words: int = 0, fold_cycles: int = 0,
               misses: list[tuple[int, int, int]] | None = None) -> int:
    """Words one operand reads from DRAM through its double-buffered SRAM.

    The operand is laid out in DRAM in the order the array first uses it (SCALE-Sim's
    prefetch order): `blocks` blocks of `rows` x `width` words, one per fold that uses
    a distinct part of it, stacked and read anti-diagonal by anti-diagonal when
    `diagonal` (the array's skew), row by row otherwise. Half the SRAM holds what the
    array computes on; the other half is being filled (with half an SRAM, or with the
    part of an operand smaller than a whole SRAM the computed-on half does not hold). `demands` lists, fold by fold,
    the (block, first row, end row) the fold reads, optionally with a fourth item True
    when it reads those rows last first (a weight-stationary fold loads its weights
    bottom row first). When a fold needs a word the half
    being computed on does not hold, the halves swap and the next half-SRAM of the
    operand, in layout order, is fetched; the window only moves forward, so a fold
    that needs data behind it (an operand swept again, or the start of a fold whose
    diagonals the previous fold's skewed tail already passed) waits until the window
    comes round the operand again. An operand that fits in half its SRAM is read once.
    `data_words`, when given, is the operand's size without padding: the last block
    (the last fold's, over a dimension the array does not divide) is then only as wide
    as it is, its padding left out of the layout as SCALE-Sim leaves it out (row by
    row, its rows are shorter; diagonal by diagonal, the diagonals through it are).

    With `misses` (a list) and `fold_cycles`, each refill is also recorded as
    (fold index, cycle within the fold, refills in that cycle): the ones that bring in
    a piece's first word at the fold's start (several when the window goes round the
    operand), the ones that follow a piece longer than the window as the fold reads
    on (a forward piece is read evenly over the fold; a row of one read last row
    first in the cycle it is loaded in).
    """
    total = blocks * rows * width
    last_width = width
    if data_words and data_words < total:
        # a partial last block (the last fold's columns): narrower, its padding unlaid
        pad, total = total - data_words, data_words
        if pad % rows == 0 and pad // rows < width:
            last_width = width - pad // rows
    active = math.ceil(sram_words / 2)
    refill = sram_words - active
    if total <= active or refill <= 0:
        return total
    # the buffer tracks what it holds in lines of a hundredth of the SRAM
    line = math.ceil(sram_words / 100)
    span = line * math.ceil(active / line)
    ring = line * math.ceil(total / line)  # a partial last line takes a whole one
    # a refill brings in half an SRAM, or what of the operand the window does not hold
    step = min(line * math.ceil(refill / line), ring - span)
    tail_block, tail_base = blocks - 1, (blocks - 1) * rows * width
    tail_row = (blocks - 1) * rows  # the partial last block's first row in the stack

    def holes(d: int) -> int:
        """Padding words laid out before anti-diagonal `d` of the stacked blocks: the
        last block's columns past its width, which SCALE-Sim's layout leaves out."""
        if last_width == width:
            return 0
        return sum(max(0, min(blocks * rows, d - c) - tail_row)
                   for c in range(last_width, width))

    def first(block: int, row: int) -> int:
        g = block * rows + row
        if diagonal:
            at = _diagonal_start(g, width) - holes(g)
        elif block == tail_block:
            at = tail_base + row * last_width
        else:
            at = g * width
        return min(total - 1, at)

    def last(block: int, end: int) -> int:
        g = block * rows + end - 1
        if diagonal:
            at = _diagonal_start(g + width, width) - holes(g + width) - 1
        elif block == tail_block:
            at = tail_base + end * last_width - 1
        else:
            at = (g + 1) * width - 1
        return min(total - 1, at)

    window_end = span
    reads = active
    for fold, (block, row, end, *backwards) in enumerate(demands):
        loaded_by_row = bool(backwards and backwards[0])
        if loaded_by_row:  # one row at a time, the last first
            pieces = [(first(block, r), last(block, r + 1)) for r in range(end - 1, row - 1, -1)]
        else:
            pieces = [(first(block, row), last(block, end))]
        for index, (f, tail) in enumerate(pieces):
            ahead = (f - (window_end - span)) % ring  # from the window's start, forwards
            # to the window holding f (round the operand if behind)
            moves = -(-(ahead - span + 1) // step) if ahead >= span else 0
            ahead -= moves * step
            reach = ahead + (tail - f) + 1
            onward = -(-(reach - span) // step) if reach > span else 0  # to its last word
            if misses is not None:
                at = index if loaded_by_row else 0
                if moves:
                    misses.append((fold, at, moves))
                for later in range(onward):
                    if not loaded_by_row:  # the word that crosses the window's end
                        at = fold_cycles * (span - ahead + later * step) // (tail - f + 1)
                    misses.append((fold, at, 1))
            moves += onward
            window_end += moves * step
            reads += moves * refill
    return reads


def operand_reads(work: DispatchWork, device: AcceleratorConfig,
                  misses: tuple[list, list] | None = None) -> tuple[int, int]:
    """(ifmap, filter) words read from DRAM by one group of a GEMM-kind dispatch, laid
    out and demanded as SCALE-Sim's operand matrices are (`ring_reads`): the outer
    loop over column folds, the inner over row folds.

    Output stationary: the ifmap is one block of K x rows per row fold, every fold
    reading its own; the filter one block of K x cols per column fold. Weight
    stationary: the ifmap is one block of M x rows per row fold (K slice), the filter
    one block of K x cols per column fold, laid out row by row, each fold reading its
    `rows` rows of it, last row first. Input stationary: the ifmap is one block of
    K x cols per column fold (M slice), laid out row by row, each fold reading its rows
    of it, last row first (the stationary operand is loaded as the weights are); the
    filter
    one block of N x rows per row fold. (The layouts not row by row are diagonal by
    diagonal, following the array's skew, as SCALE-Sim lays them out.) With `misses`,
    two lists, each operand's refills are recorded in them (`ring_reads`)."""
    m, n, k = work.m, work.n, work.k
    rows, cols = device.rows, device.cols
    fold = folding(m, n, k, rows, cols, device.dataflow)
    outer, inner = range(fold.outer_folds), range(fold.inner_folds)
    ifmap_sram, filter_sram = device.ifmap_sram_words, device.filter_sram_words
    track: list[dict[str, Any]] = [{}, {}]
    if misses is not None:
        track = [{"fold_cycles": fold.fold_cycles, "misses": misses[0]},
                 {"fold_cycles": fold.fold_cycles, "misses": misses[1]}]
    if device.dataflow == "os":
        ifmap = ring_reads(fold.inner_folds, k, rows,
                           ((fr, 0, k) for _fc in outer for fr in inner), ifmap_sram,
                           data_words=m * k, **track[0])
        filt = ring_reads(fold.outer_folds, k, cols,
                          ((fc, 0, k) for fc in outer for _fr in inner), filter_sram,
                          data_words=k * n, **track[1])
    elif device.dataflow == "ws":
        ifmap = ring_reads(fold.inner_folds, m, rows,
                           ((fr, 0, m) for _fc in outer for fr in inner), ifmap_sram,
                           data_words=m * k, **track[0])
        filt = ring_reads(fold.outer_folds, k, cols,
                          ((fc, fr * rows, min(k, (fr + 1) * rows), True)
                           for fc in outer for fr in inner), filter_sram, diagonal=False,
                          data_words=k * n, **track[1])
    else:
        ifmap = ring_reads(fold.outer_folds, k, cols,
                           ((fc, fr * rows, min(k, (fr + 1) * rows), True)
                            for fc in outer for fr in inner), ifmap_sram, diagonal=False,
                           data_words=m * k, **track[0])
        filt = ring_reads(fold.inner_folds, n, rows,
                          ((fr, 0, n) for _fc in outer for fr in inner), filter_sram,
                          data_words=k * n, **track[1])
    return ifmap, filt


def memory_stalls(work: DispatchWork, device: AcceleratorConfig, compute: int
                  ) -> tuple[int, int, int]:
    """(stall cycles, DRAM words read, DRAM words written) of a GEMM-kind dispatch
    whose array needs `compute` cycles.

    Each read operand has its own DRAM channel and SRAM: the half the array starts on
    is filled before it starts (not counted, as SCALE-Sim does not count it), and each
    refill of the other half (`ring_reads`) takes `ceil(half / bandwidth) + 1` cycles,
    one after another from the start, whether or not the array asked yet. When the
    array needs a refill that has not arrived it stalls, in SCALE-Sim's bookkeeping
    (`refill_stalls`). The outputs drain through the ofmap SRAM at the ofmap bandwidth
    (`drain_stalls`); the array stalls for the slower of the two. Unlimited bandwidth (0) never stalls."""
    g = work.groups
    misses: tuple[list, list] = ([], [])
    ifmap, filt = operand_reads(work, device, misses)
    out = work.m * work.n
    per_group = compute // g
    refill = [(device.ifmap_sram_words - math.ceil(device.ifmap_sram_words / 2),
               device.ifmap_bandwidth),
              (device.filter_sram_words - math.ceil(device.filter_sram_words / 2),
               device.filter_bandwidth)]
    fold = folding(work.m, work.n, work.k, device.rows, device.cols, device.dataflow)
    stall = refill_stalls(misses, [math.ceil(words / bw) + 1 if bw else 0
                                   for words, bw in refill], fold.fold_cycles)
    if device.ofmap_bandwidth:
        stall = max(stall, drain_stalls(out, device.ofmap_sram_words,
                                        device.ofmap_bandwidth, per_group))
    return max(0, stall) * g, g * (ifmap + filt), g * out


def drain_stalls(words: int, sram_words: int, bandwidth: float, compute: int) -> int:
    """Stall cycles of one group writing `words` outputs, evenly over `compute`
    cycles, through an ofmap SRAM drained half at a time, as SCALE-Sim's write buffer
    drains it: once more than half is written a drain of half the SRAM starts
    (`ceil(half / bandwidth)` cycles; the space counts as free as it starts), the array
    waits when the SRAM is full while one runs, and what is left when the array is done
    is drained after it, not counted. So `ceil((words - sram) / half)` drains run back
    to back from the time the first half is written, and the array ends after the
    last one starts and it writes the rest."""
    half = sram_words - math.ceil(sram_words / 2)
    if words <= sram_words or half <= 0 or compute <= 0:
        return 0
    drains = -(-(words - sram_words) // half)
    rate = words / compute
    last_start = (half + 1) / rate + (drains - 1) * math.ceil(half / bandwidth)
    rest = words - sram_words - (drains - 1) * half
    return max(0, math.ceil(last_start + rest / rate) - compute)


def refill_stalls(misses: tuple[list, list], refill_cycles: list[int], fold_cycles: int
                  ) -> int:
    """Stall cycles of one group from its operands' refills (`ring_reads`' `misses`),
    as SCALE-Sim counts them: each operand's refills complete one after another,
    `refill_cycles` apart, from cycle -1; at a cycle needing refills the array's wait
    for that operand is worked out as SCALE-Sim's read buffer does (a refill done
    early gives back waiting owed by the same cycle, one done late is waited for
    twice), the cycle waits for its slowest operand, and the waits add up. An operand
    with unlimited bandwidth (0 cycles) never waits."""
    counts: dict[tuple[int, int], int] = {}
    for operand in (0, 1):
        if refill_cycles[operand]:
            for fold, at, count in misses[operand]:
                key = (fold * fold_cycles + at, operand)
                counts[key] = counts.get(key, 0) + count
    done = [-1, -1]
    stall = 0
    for cycle, group in itertools.groupby(sorted(counts.items()), key=lambda e: e[0][0]):
        wait = 0
        for (_, operand), count in group:
            offset = 1
            for _ in range(count):
                done[operand] += refill_cycles[operand]
                late = done[operand] - (cycle + stall + offset)
                offset += 2 * late if late > 0 else late
            wait = max(wait, offset - 1)
        stall += wait
    return stall


def vector_cost(work: DispatchWork, device: AcceleratorConfig) -> DispatchCost:
    """Work on the vector unit: `lanes` operations per cycle (`vector_lanes`, or one
    per array column), each output reading `window` inputs; its inputs and outputs
    stream through DRAM once (input words, or elements x window when unknown), at the
    ifmap / ofmap bandwidth."""
    lanes = device.vector_lanes or device.cols
    ops = work.macs if work.kind in VECTOR_KINDS else work.groups * work.m * work.n * work.k
    compute = math.ceil(ops / lanes) if ops else 0
    reads = work.input_words or ops
    writes = work.output_words or work.elements
    stall_cycles = 0.0
    if device.ifmap_bandwidth:
        stall_cycles = reads / device.ifmap_bandwidth
    if device.ofmap_bandwidth:
        stall_cycles = max(stall_cycles, writes / device.ofmap_bandwidth)
    stall = max(0, math.ceil(stall_cycles) - compute)
    utilisation = ops / (lanes * (compute + stall)) if compute else 0.0
    return DispatchCost(compute, stall, (reads + writes) * work.element_bytes, utilisation,
                        writes * work.element_bytes)


def systolic_cost(work: DispatchWork, device: AcceleratorConfig) -> DispatchCost:
    """The built-in `"systolic"` model: GEMM kinds on the array (`folding`,
    `memory_stalls`), the rest on the vector unit (`vector_cost`)."""
    if work.kind not in GEMM_KINDS or not (work.m and work.n and work.k):
        return vector_cost(work, device)
    compute = systolic_compute_cycles(work, device)
    stall, read, written = memory_stalls(work, device, compute)
    pes = device.rows * device.cols
    utilisation = work.macs / (pes * (compute + stall)) if compute else 0.0
    return DispatchCost(compute, stall, (read + written) * work.element_bytes, utilisation,
                        written * work.element_bytes)


register_cost_model("systolic", systolic_cost)
register_cost_model("vector", vector_cost)


# -- SCALE-Sim configuration files --------------------------------------------------------

_CFG_KEYS = {
    "arrayheight": "rows", "arraywidth": "cols", "dataflow": "dataflow",
    "ifmapsramszkb": "ifmap_sram_words", "filtersramszkb": "filter_sram_words",
    "ofmapsramszkb": "ofmap_sram_words",
}


def read_scalesim_config(path: str, **overrides: Any) -> AcceleratorConfig:
    """An `AcceleratorConfig` from a SCALE-Sim `.cfg` file.

    Read: `[architecture_presets]` ArrayHeight, ArrayWidth, Dataflow, the three
    `*SramSzkB` (kB x 1024 words: SCALE-Sim addresses one element per word) and, when
    `[run_presets] InterfaceBandwidth` is `USER`, `Bandwidth` (words per cycle; the
    ofmap's, and the ifmap's and filter's unless `[layout]` gives their
    `IfmapSRAMBankBandwidth` / `FilterSRAMBankBandwidth`, which SCALE-Sim uses for
    them); `CALC` means unlimited bandwidth. Ours, in an optional `[emu]` section:
    `ClockHz`, `VectorLanes`, `CostModel`. `overrides` (fields of `AcceleratorConfig`)
    win over the file. A missing or malformed file or key is an INVALID_ARGUMENT naming
    it."""
    import configparser

    parser = configparser.ConfigParser()
    try:
        with open(path) as f:
            parser.read_file(f)
    except (OSError, configparser.Error) as exc:
        raise InvalidArgumentError(f"cannot read SCALE-Sim config {path!r}: {exc}") from None
    values: dict[str, Any] = {}
    try:
        arch = parser["architecture_presets"]
    except KeyError:
        raise InvalidArgumentError(
            f"SCALE-Sim config {path!r} has no [architecture_presets] section") from None
    try:
        for key, field in _CFG_KEYS.items():
            if key not in arch:
                continue
            raw = arch[key].strip()
            if field == "dataflow":
                values[field] = raw.lower()
            elif field.endswith("_words"):
                values[field] = int(raw) * 1024
            else:
                values[field] = int(raw)
        mode = parser.get("run_presets", "InterfaceBandwidth", fallback="CALC").strip().upper()
        if mode == "USER":
            bandwidth = float(arch.get("Bandwidth", "").split(",")[0])
            values["ofmap_bandwidth"] = bandwidth
            layout = parser["layout"] if parser.has_section("layout") else {}
            values["ifmap_bandwidth"] = float(layout.get("IfmapSRAMBankBandwidth", bandwidth))
            values["filter_bandwidth"] = float(layout.get("FilterSRAMBankBandwidth", bandwidth))
        elif mode != "CALC":
            raise ValueError(f"InterfaceBandwidth must be USER or CALC, not {mode!r}")
        if parser.has_section("emu"):
            emu = parser["emu"]
            if "ClockHz" in emu:
                values["clock_hz"] = float(emu["ClockHz"])
            if "VectorLanes" in emu:
                values["vector_lanes"] = int(emu["VectorLanes"])
            if "CostModel" in emu:
                values["cost_model"] = emu["CostModel"].strip()
    except ValueError as exc:
        raise InvalidArgumentError(f"SCALE-Sim config {path!r}: {exc}") from None
    known = {f.name for f in fields(AcceleratorConfig)}
    unknown = set(overrides) - known
    if unknown:
        raise InvalidArgumentError(f"unknown accelerator fields {sorted(unknown)}; "
                                   f"fields: {sorted(known)}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    config = AcceleratorConfig(**values)
    config.validate()
    return config


def _cost_entry(name: str, value: Any, path: str) -> DispatchCost:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = {"cycles": value}
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"cost file {path!r}: the cost of {name!r} must be a number "
                                   f"of cycles or an object, not {value!r}")
    try:
        stall = int(value.get("stall_cycles", 0))
        cycles = int(value["cycles"]) if "cycles" in value else (
            int(value["compute_cycles"]) + stall)
        dram = int(value.get("dram_bytes", 0))
        written = int(value.get("dram_write_bytes", 0))
        utilisation = float(value.get("utilisation", 0.0))
    except (KeyError, TypeError, ValueError):
        raise InvalidArgumentError(f"cost file {path!r}: {name!r} needs `cycles` (or "
                                   "`compute_cycles`) as numbers") from None
    if cycles < 0 or stall < 0 or stall > cycles or dram < 0 or not 0 <= written <= dram:
        raise InvalidArgumentError(f"cost file {path!r}: {name!r} has negative cycles or "
                                   "bytes, more stall cycles than cycles or more bytes "
                                   "written than moved")
    return DispatchCost(cycles - stall, stall, dram, utilisation, written)


def read_cost_file(path: str) -> dict[str, DispatchCost]:
    """Measured per-export costs: a JSON object mapping an export name to its cycles or
    to `{"cycles", "stall_cycles", "dram_bytes", "dram_write_bytes", "utilisation"}`, or a CSV file with a
    column naming the export (`export`, or SCALE-Sim's `Layer name` / `LayerID` when
    its layers are named after the exports) and `cycles` (or SCALE-Sim's
    COMPUTE_REPORT columns `Total Cycles` and `Stall Cycles`)."""
    import csv
    import json

    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read cost file {path!r}: {exc}") from None
    if path.endswith(".json") or text.lstrip().startswith("{"):
        try:
            table = json.loads(text)
        except ValueError as exc:
            raise InvalidArgumentError(f"cost file {path!r} is not JSON: {exc}") from None
        if not isinstance(table, dict):
            raise InvalidArgumentError(f"cost file {path!r} must hold a JSON object")
        return {str(k): _cost_entry(str(k), v, path) for k, v in table.items()}
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise InvalidArgumentError(f"cost file {path!r} is empty")
    header = [h.strip().lower() for h in rows[0]]

    def column(*names: str) -> int:
        for name in names:
            if name in header:
                return header.index(name)
        return -1

    name_at = column("export", "layer name", "layerid", "layer")
    cycles_at = column("cycles", "total cycles")
    stall_at = column("stall_cycles", "stall cycles")
    if name_at < 0 or cycles_at < 0:
        raise InvalidArgumentError(f"cost file {path!r} needs an `export` and a `cycles` "
                                   "column (or SCALE-Sim's LayerID / Total Cycles)")
    table: dict[str, DispatchCost] = {}
    for row in rows[1:]:
        if len(row) <= max(name_at, cycles_at, stall_at) or not row[name_at].strip():
            continue
        entry: dict[str, Any] = {"cycles": _number(row[cycles_at], path)}
        if stall_at >= 0:
            entry["stall_cycles"] = _number(row[stall_at], path)
        name = row[name_at].strip()
        table[name] = _cost_entry(name, entry, path)
    return table


def _number(text: str, path: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidArgumentError(f"cost file {path!r}: {text.strip()!r} is not a number"
                                   ) from None


def accelerator_config(value: Any) -> AcceleratorConfig | None:
    """The `accelerator=` option of an emu device: None, an `AcceleratorConfig`, a
    dict of its fields or the path of a SCALE-Sim `.cfg` file."""
    if value is None:
        return None
    if isinstance(value, AcceleratorConfig):
        config = value
    elif isinstance(value, dict):
        known = {f.name for f in fields(AcceleratorConfig)}
        unknown = set(value) - known
        if unknown:
            raise InvalidArgumentError(f"unknown accelerator fields {sorted(unknown)}; "
                                       f"fields: {sorted(known)}")
        config = AcceleratorConfig(**value)
    elif isinstance(value, str):
        return read_scalesim_config(value)
    else:
        raise InvalidArgumentError("emu option accelerator must be an AcceleratorConfig, a "
                                   f"dict or a SCALE-Sim .cfg path, not {type(value).__name__}")
    config.validate()
    return config


__all__ = ["AcceleratorConfig", "CostFunction", "DATAFLOWS", "DispatchCost", "DispatchWork",
           "Folding", "WORK_KINDS", "WORK_SOURCES", "accelerator_config", "cost_models",
           "dispatch_cost", "folding", "memory_stalls", "operand_reads", "read_cost_file",
           "drain_stalls", "read_scalesim_config", "refill_stalls", "register_cost_model", "ring_reads", "systolic_compute_cycles",
           "systolic_cost", "vector_cost"]
