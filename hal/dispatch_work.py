"""What each dispatch computes, read from what the compiler leaves in the program.

IREE 3.13's llvm-cpu libraries carry, per export, its name, workgroup size, binding
and constant counts; `--iree-hal-executable-debug-level` adds source locations (file
and line) but, with the pinned compiler, no embedded source or shapes. What it does
write is the export name, built from the dispatch's root operation and its loop
ranges: `<function>_dispatch_<n>_<op>_<d0>x<d1>x..._<types>`, for example
`main_dispatch_3_matmul_24x512x128_f32` (M x N x K), `..._batch_matmul_4x24x24x64_f32`
(B x M x N x K), `..._conv_112x112x64x7x7x3_f32` (the output's loops, then the
reduction's: output rows, columns, channels, filter rows, columns, input channels;
the unit batch dropped; NCHW puts the channels first), `..._reduction_24x768_f32`,
`..._elementwise_1024_f32`; a size known only at run time is written `D`.

`dispatch_work` reads that, together with what the dispatch binds (each binding's
length, known at dispatch time), into a `DispatchWork`:

- which loops are the output's: the longest run of leading loops whose product is
  the element count of the last binding (IREE binds results after operands), else of
  another binding;
- a convolution's reduction length K is the product of the rest; its output channels
  N = its filter's elements / K (the binding of that size); M = output elements / N.
  Two reduction loops with a filter of K x channels is a depthwise convolution (its
  channels are the groups), with no such filter a pooling;
- a matmul's last loop is K; N the output loop whose product with K is a bound
  operand's size (the weights), else by the name's order (see `_matmul`); M the
  output's elements / N;
- a `D` (one per name) is completed from the last binding (IREE binds results after
  operands) divided by the known loops of the output.

When the name says nothing usable the work is only the dispatch's workgroup count
(`source="workgroups"`), priced by the per-workgroup model.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from .emu_cost import DispatchWork

ELEMENT_BYTES = {"i1": 1, "i4": 1, "i8": 1, "ui8": 1, "si8": 1, "f8E4M3FN": 1, "f8E5M2": 1,
                 "i16": 2, "f16": 2, "bf16": 2, "i32": 4, "f32": 4, "i64": 8, "f64": 8}
_NAME = re.compile(r"_dispatch_\d+_(?P<op>[a-z_]+?)_(?P<dims>(?:\d+|D)(?:x(?:\d+|D))*)"
                   r"(?:_(?P<types>[a-zA-Z0-9]+(?:x[a-zA-Z0-9]+)*))?$")
_CONV_OPS = ("conv", "depthwise_conv", "conv_2d", "convolution")
_MATMUL_OPS = ("matmul", "matmul_transpose_b", "matmul_transpose_a", "matmul_like", "mmt4d",
               "contract")


@functools.lru_cache(maxsize=4096)
def parse_export_name(name: str) -> tuple[str, tuple[int | None, ...], int] | None:
    """(root operation, loop ranges with None for `D`, element bytes) from an IREE
    export name, or None when it does not follow IREE's pattern."""
    match = _NAME.search(name)
    if match is None:
        return None
    dims = tuple(None if d == "D" else int(d) for d in match["dims"].split("x"))
    element = 4
    if match["types"]:
        element = ELEMENT_BYTES.get(match["types"].split("x")[0], 4)
    return match["op"], dims, element


def _complete(dims: tuple[int | None, ...], output_elements: int) -> tuple[int, ...] | None:
    """`dims` with its one `D` (if any) solved so that some leading run of loops has
    `output_elements` elements; None when that is not possible."""
    unknown = [i for i, d in enumerate(dims) if d is None]
    if not unknown:
        return tuple(dims)  # type: ignore[arg-type]
    if len(unknown) > 1 or output_elements <= 0:
        return None
    at = unknown[0]
    for end in range(len(dims), at, -1):
        known = math.prod(d for d in dims[:end] if d is not None)
        if known and output_elements % known == 0:
            filled = list(dims)
            filled[at] = output_elements // known
            return tuple(filled)  # type: ignore[arg-type]
    return None


def _output_loops(dims: tuple[int, ...], elements: list[int]) -> int:
    """How many leading loops are the output's: the longest prefix whose product is the
    element count of the last binding (IREE binds results last), else of any binding
    (0 if none)."""
    for wanted in (elements[-1:], elements):
        for end in range(len(dims), 0, -1):
            if math.prod(dims[:end]) in wanted:
                return end
    return 0


def work_from_name(name: str, binding_lengths: list[int], workgroups: int) -> DispatchWork:
    """The work of a dispatch of export `name` with bindings of `binding_lengths` bytes
    (see the module docstring); `source="workgroups"` when the name does not say."""
    parsed = parse_export_name(name)
    unknown = DispatchWork("unknown", elements=workgroups, source="workgroups")
    if parsed is None:
        return unknown
    op, raw_dims, element = parsed
    elements = [length // element for length in binding_lengths if length] or [0]
    dims = _complete(raw_dims, elements[-1])
    if dims is None or 0 in dims:
        return unknown
    common: dict[str, Any] = {"element_bytes": element, "source": "export-name"}
    bindings = len(binding_lengths)
    if op == "batch_matmul" and len(dims) == 4:
        b, m, n, k = dims
        return DispatchWork("batch_matmul", m=m, n=n, k=k, groups=b, input_words=b * m * k,
                            filter_words=b * k * n, output_words=b * m * n, **common)
    if op in _MATMUL_OPS and len(dims) >= 3:
        return _matmul(op, dims, elements, common)
    exact = _output_loops(dims, elements)
    if op in _CONV_OPS:
        loops = exact if 0 < exact < len(dims) else (3 if len(dims) in (5, 6) else 0)
        if loops:
            return _convolution(dims, loops, exact == loops, elements, bindings, common)
    out = math.prod(dims)
    if op == "reduction":
        loops = exact if 0 < exact < len(dims) else len(dims) - 1  # reductions innermost
        out = math.prod(dims[:loops])
        return DispatchWork("reduction", elements=out, window=math.prod(dims[loops:]),
                            input_words=math.prod(dims), output_words=out, **common)
    return DispatchWork("elementwise", elements=out, window=1,
                        input_words=out * max(1, bindings - 1), output_words=out, **common)


def _matmul(op: str, dims: tuple[int, ...], elements: list[int],
            common: dict[str, Any]) -> DispatchWork:
    """A matmul's work: K its last loop, N the output loop whose product with K is the
    element count of the second binding (the weights) when the bindings are the tensors
    themselves; else M x N x K for `matmul` and, for a `matmul_like` (IREE's
    contraction from a 1x1 convolution), F x pixels x K (NCHW) unless the first two
    loops are equal and the third is not (rows x columns x F: NHWC)."""
    k = dims[-1]
    out = math.prod(dims[:-1])
    if op == "matmul_like":
        nhwc = len(dims) == 4 and dims[0] == dims[1] and dims[1] != dims[2]
        n = dims[-2] if nhwc else dims[0]
    else:
        n = dims[-2]
    if len(elements) > 2 and elements[-1] == out:
        # IREE binds the operands in order: the input, then the weights
        weights = [x for x in dims[:-1] if k * x == elements[1]]
        if weights and n not in weights:
            n = weights[0]
    m = out // n
    return DispatchWork("matmul", m=m, n=n, k=k, input_words=m * k, filter_words=k * n,
                        output_words=m * n, **common)


def _convolution(dims: tuple[int, ...], loops: int, exact: bool, elements: list[int],
                 bindings: int, common: dict[str, Any]) -> DispatchWork:
    """A convolution's (or pooling's) work, its first `loops` loops the output's.

    Its filters F: with bindings that are the tensors themselves, the binding of K x F
    elements for an output loop F; else the loops read as a 2-D convolution's, NCHW
    (F first) when the two loops after the first are equal (the output's height and
    width) and the first is not, NHWC (F last) otherwise. Two reduction loops (no input
    channels among them) is a depthwise convolution (F its channels) when a filter is
    bound (three bindings or more), else a pooling."""
    out = math.prod(dims[:loops])
    k = math.prod(dims[loops:])
    depthwise_like = len(dims) - loops == 2
    if exact:
        others = [e for e in elements if e != out] or [out]
        filters = [e for e in others if e % k == 0 and e // k in dims[:loops]]
        f = filters[0] // k if filters else 0
        input_words = max([e for e in others if not filters or e != filters[0]] or [0])
    else:
        nchw = loops == 3 and dims[1] == dims[2] and dims[0] != dims[1]
        f = dims[0] if nchw else dims[loops - 1]
        if depthwise_like and bindings < 3:
            f = 0
        input_words = out * k if not f else out if depthwise_like else out // f * k
    if not f:
        return DispatchWork("pool", elements=out, window=k, input_words=input_words or out * k,
                            output_words=out, **common)
    if depthwise_like and (not exact or 2 * input_words >= out):
        return DispatchWork("depthwise", m=out // f, n=1, k=k, groups=f,
                            input_words=input_words, filter_words=k * f, output_words=out,
                            **common)
    return DispatchWork("conv", m=out // f, n=f, k=k, input_words=input_words,
                        filter_words=k * f, output_words=out, **common)


def dispatch_work(prepared: Any) -> DispatchWork:
    """The work of a prepared dispatch (`hal.executable.PreparedDispatch`)."""
    state = prepared.state
    lengths = [prepared.binding_lengths[i] for i in range(state.binding_count)]
    return work_from_name(prepared.export.name, lengths, prepared.total)


__all__ = ["ELEMENT_BYTES", "dispatch_work", "parse_export_name", "work_from_name"]
