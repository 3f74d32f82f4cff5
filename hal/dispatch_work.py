"""What each dispatch computes, read from what the compiler leaves in the program.

IREE 3.13's llvm-cpu libraries carry, per export, its name, workgroup size, binding
and constant counts and a source location (file and line); with the pinned compiler
no embedded source or shapes (`--iree-hal-executable-debug-level=3` is meant to embed
the executable's MLIR but the pass that captures it does not run in 3.13). Two things
are read:

- the compiler's own MLIR of the dispatch (`source_work`, source `compiler`): built
  with `--iree-hal-dump-executable-configurations-to=DIR`, each export's location
  names its line in the configured executable dumped in DIR, whose function holds the
  root `linalg` op with its operand types;
- else the export name (`work_from_name`, source `export-name`), built from the
  dispatch's root operation and its loop ranges:
  `<function>_dispatch_<n>_<op>_<d0>x<d1>x..._<types>`, for example
  `main_dispatch_3_matmul_24x512x128_f32` (M x N x K), `..._batch_matmul_4x24x24x64_f32`
  (B x M x N x K), `..._conv_112x112x64x7x7x3_f32` (the output's loops, then the
  reduction's: output rows, columns, channels, filter rows, columns, input channels;
  the unit batch dropped; NCHW puts the channels first), `..._reduction_24x768_f32`,
  `..._elementwise_1024_f32`; a size known only at run time is written `D`.

`work_from_name` reads the name, together with what the dispatch binds (each binding's
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
import itertools
import math
import os
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


# -- from the compiler's own record of the executable's source -------------------------

_TENSOR = re.compile(r"tensor<((?:[0-9?]+x)*)([a-zA-Z][a-zA-Z0-9]*)>")
_MAP = re.compile(r"affine_map<\(([^)]*)\)\s*->\s*\(([^)]*)\)>")
_MAP_ALIAS = re.compile(r"^(#[\w$.-]+)\s*=\s*(affine_map<.*>)\s*$", re.M)
_LINALG = re.compile(r"=\s*linalg\.([a-z_0-9]+)\b(.*)$")


def _tensor(text: str) -> tuple[tuple[int, ...], int] | None:
    """(shape, element bytes) of an MLIR tensor type; None when a size is dynamic."""
    match = _TENSOR.search(text)
    if match is None or "?" in match[1]:
        return None
    shape = tuple(int(d) for d in match[1].split("x") if d)
    return shape, ELEMENT_BYTES.get(match[2], 4)


def _operand_types(op_text: str) -> tuple[list[str], list[str]] | None:
    """The tensor types after `ins(... :` and `outs(... :` of a linalg op's text."""
    found = []
    for keyword in ("ins(", "outs("):
        at = op_text.find(keyword)
        if at < 0:
            return None
        depth, end = 0, at + len(keyword) - 1
        for end in range(at + len(keyword) - 1, len(op_text)):
            depth += {"(": 1, ")": -1}.get(op_text[end], 0)
            if depth == 0:
                break
        inner = op_text[at + len(keyword):end]
        found.append(_TENSOR.findall(inner.split(":", 1)[1]) if ":" in inner else [])
    ins, outs = ([f"tensor<{dims}{kind}>" for dims, kind in group] for group in found)
    return ins, outs


def _generic_work(op_text: str, aliases: dict[str, str]) -> DispatchWork | None:
    """The work of a `linalg.generic`: its loops sized from the operands its indexing
    maps read them from, reductions from `iterator_types`. Two inputs read over both
    reduction and output loops make a contraction in the GEMM view: loops of the first
    only are M, of the second (the weights) only N, of both the groups (a depthwise
    convolution's channels, a batch), the reductions K; a first input indexed by sums of
    loops (a sliding window) makes it a convolution. One such input is a reduction (a
    pooling when windowed; a pooling's window operand or a bias does not count), no
    reduction element-wise work."""
    op_text = re.sub(r"#[\w$.-]+", lambda m: aliases.get(m[0], m[0]), op_text)
    maps = _MAP.findall(op_text)
    iterators = re.search(r"iterator_types\s*=\s*\[([^\]]*)\]", op_text)
    types = _operand_types(op_text)
    if not maps or iterators is None or types is None:
        return None
    ins, outs = types
    if len(maps) != len(ins) + len(outs) or len(outs) != 1:
        return None
    kinds = [k.strip().strip('"') for k in iterators[1].split(",")]
    loops = [d.strip() for d in maps[0][0].split(",")]
    if len(kinds) != len(loops):
        return None
    shapes = []
    for text in ins + outs:
        parsed = _tensor(text)
        if parsed is None:
            return None
        shapes.append(parsed)
    sizes: dict[str, int] = {}
    used: list[set[str]] = []
    windowed: list[bool] = []
    for (_dims, results), (shape, _bytes) in zip(maps, shapes):
        exprs = [e.strip() for e in results.split(",") if e.strip()]
        if len(exprs) != len(shape):
            return None
        used.append({d for d in loops if re.search(rf"\b{d}\b", results)})
        windowed.append(any(not re.fullmatch(r"d\d+", e) for e in exprs))
        for expr, size in zip(exprs, shape):
            if re.fullmatch(r"d\d+", expr):
                sizes.setdefault(expr, size)
    if any(d not in sizes for d in loops):
        return None
    reductions = [d for d, kind in zip(loops, kinds) if kind == "reduction"]
    out_shape, element = shapes[-1]
    out = math.prod(out_shape)
    common: dict[str, Any] = {"element_bytes": element, "source": "compiler"}
    inputs = [math.prod(shape) for shape, _ in shapes[:-1]]
    if not reductions:
        return DispatchWork("elementwise", elements=out, window=1,
                            input_words=sum(inputs) or out, output_words=out, **common)
    k = math.prod(sizes[d] for d in reductions)
    reduced = set(reductions)
    # operands a reduction runs over, beside output loops (a pooling window or a bias
    # added after the reduction is neither)
    operands = [i for i in range(len(ins)) if used[i] & reduced and used[i] - reduced]
    if len(operands) < 2:
        first = operands[0] if operands else next(
            (i for i in range(len(ins)) if used[i] & reduced), 0)
        kind = "pool" if windowed[first] else "reduction"
        return DispatchWork(kind, elements=out, window=k, input_words=inputs[first],
                            output_words=out, **common)
    x, w = operands[:2]
    parallel = [d for d in loops if d not in reduced]
    both = [d for d in parallel if d in used[x] and d in used[w]]
    n_dims = [d for d in parallel if d in used[w] and d not in used[x]]
    m_dims = [d for d in parallel if d not in both and d not in n_dims]
    groups = math.prod(sizes[d] for d in both)
    m = math.prod(sizes[d] for d in m_dims)
    n = math.prod(sizes[d] for d in n_dims)
    if groups > 1 and n == 1:
        kind = "depthwise"
    elif groups > 1:
        kind = "batch_matmul"
    else:
        kind = "conv" if windowed[x] else "matmul"
    return DispatchWork(kind, m=m, n=n, k=k, groups=groups, input_words=inputs[x],
                        filter_words=inputs[w], output_words=out, **common)


def _named_work(op: str, op_text: str) -> DispatchWork | None:
    """The work of the named linalg ops that stay named in a configured dispatch:
    matmuls (plain, transposed, batched) and poolings."""
    types = _operand_types(op_text)
    if types is None or len(types[1]) != 1 or len(types[0]) != 2:
        return None
    parsed = [_tensor(t) for t in types[0] + types[1]]
    if any(p is None for p in parsed):
        return None
    (a, _), (b, _), (o, element) = parsed  # type: ignore[misc]
    common: dict[str, Any] = {"element_bytes": element, "source": "compiler"}
    words = {"input_words": math.prod(a), "filter_words": math.prod(b),
             "output_words": math.prod(o)}
    if op.startswith("pooling_"):
        out = math.prod(o)
        return DispatchWork("pool", elements=out, window=math.prod(b), input_words=math.prod(a),
                            output_words=out, **common)
    if op in ("matmul", "matmul_transpose_b", "matmul_transpose_a") and len(a) == len(b) == 2:
        m, n = o
        k = a[0] if op == "matmul_transpose_a" else a[1]
        return DispatchWork("matmul", m=m, n=n, k=k, **words, **common)
    if op in ("batch_matmul", "batch_matmul_transpose_b") and len(o) == 3:
        g, m, n = o
        return DispatchWork("batch_matmul", m=m, n=n, k=a[2], groups=g, **words, **common)
    return None


_ROOT_RANK = {"matmul": 0, "batch_matmul": 0, "conv": 0, "depthwise": 0, "pool": 1,
              "reduction": 2, "elementwise": 3}


@functools.lru_cache(maxsize=1024)
def work_from_source(path: str, export: str, mtime_ns: int = 0) -> DispatchWork | None:
    """The work of export `export` read from the MLIR the compiler wrote for it: the
    file its source location names (`Executable` exports' `source_location`), when
    that file holds the export's function, as an executable IREE dumped does
    (`--iree-hal-dump-executable-configurations-to=DIR` or `-files-to=DIR`, with which
    the compiler points each export's location there). The root operation is the
    function's contraction (matmul or convolution), else its pooling, reduction or
    element-wise op. None when the file is not there, does not hold the function, or
    its root has sizes known only at run time (the export name is read then).
    `mtime_ns` keys the cache to the file's version."""
    del mtime_ns
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    start = text.find(f"func.func @{export}(")
    if start < 0:
        return None
    end = text.find("func.func @", start + 1)
    body = text[start:end if end > 0 else len(text)]
    aliases = dict(_MAP_ALIAS.findall(text))
    best: DispatchWork | None = None
    for line in body.splitlines():
        match = _LINALG.search(line)
        if match is None or match[1] in ("fill", "yield", "index"):
            continue
        op, rest = match[1], match[2]
        work = _generic_work(rest, aliases) if op == "generic" else _named_work(op, rest)
        if work is not None and (best is None or _ROOT_RANK[work.kind] < _ROOT_RANK[best.kind]):
            best = work
    return best


# a dumped executable is small (no weights); a user's model source may be gigabytes
_MAX_DUMP_BYTES = 8 << 20


def source_work(location: tuple[str, int] | None, export: str) -> DispatchWork | None:
    """`work_from_source` for an export's source location, relative paths taken from
    the working directory (where the compiler ran, when it was given a relative one).
    Only a dumped executable is read: a file of at most 8 MiB whose located line
    declares the export (without a dump the location names the user's own source)."""
    if location is None or not location[0].endswith(".mlir"):
        return None
    path, line = location
    try:
        stat = os.stat(path)
    except OSError:
        return None
    if stat.st_size > _MAX_DUMP_BYTES or not _declares_export(path, line, export,
                                                              stat.st_mtime_ns):
        return None
    return work_from_source(path, export, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1024)
def _declares_export(path: str, line: int, export: str, mtime_ns: int) -> bool:
    """Whether line `line` of `path` is the `hal.executable.export` of `export`."""
    del mtime_ns
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = next(itertools.islice(f, max(0, line - 1), None), "")
    except OSError:
        return False
    return "hal.executable.export" in text and f"@{export} " in text


def dispatch_work(prepared: Any) -> DispatchWork:
    """The work of a prepared dispatch (`hal.executable.PreparedDispatch`): from the
    compiler's record of its source when the executable points at one
    (`source_work`), else from its export name and bindings (`work_from_name`)."""
    export = prepared.export
    work = source_work(getattr(export, "source_location", None), export.name)
    if work is not None:
        return work
    state = prepared.state
    lengths = [prepared.binding_lengths[i] for i in range(state.binding_count)]
    return work_from_name(export.name, lengths, prepared.total)


__all__ = ["ELEMENT_BYTES", "dispatch_work", "parse_export_name", "source_work",
           "work_from_name", "work_from_source"]
