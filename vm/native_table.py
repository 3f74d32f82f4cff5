"""Native modules declared as a table plus an explicit state, as IREE declares its
modules (`exports.inl`: one row per export, and a per-context state struct).

Each row (`Export`) names the export, its IREE calling convention, the ref type of each
top-level argument (a type name, `?` suffixed when null is allowed, None for a
non-ref; the whole tuple None for an export that declares none, such as one that is
UNIMPLEMENTED), its function, which takes the module's state first, and whether it may
yield (return a `Suspend`). `build_module` binds every function to one state with
`functools.partial`, which adds no Python frame, and registers it on a `NativeModule`.

Declared refs are checked in one of two ways, chosen per module: behind the marshaller
that `tinyhal.vm.native` generates from the declaration (the default), or by the
functions themselves in their first lines (`shims_check_refs=True`, the `hal` module,
whose import calls must cost exactly one frame). Those first lines are not written by
hand: `with_prologues` generates them from the rows once, when the module is imported,
each function compiled again from its own source with the prologue in front of its body
(on the line the `def` left free, so every body line keeps its number in tracebacks).

A row may also declare what its import does to a recording (`Traits`): which argument
is the command buffer it records into or submits, which are buffers and byte lengths.
The translator reads these (`traits_of`, by the import's full name, filled by
`declare_traits` when a module's table is defined) to find runs of record operations
(`vm.record_blocks`), so it names no import of any module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, NamedTuple

from .native import NativeModule, RefType, ref_test, ref_type_error

__all__ = ["ALLOCA", "BEGIN", "DEALLOCA", "FINISH", "INDEPENDENT", "JOIN_FENCES", "NEW_FENCE",
           "PURE", "RECORD", "SUBMIT", "Export", "Traits",
           "build_module", "declare_traits", "ref_check_failed", "traits_of",
           "with_prologues"]

# What an import does to a recording (`Traits.role`):
BEGIN = "begin"  # returns a new command buffer to record into
RECORD = "record"  # records into argument `target`; changes nothing else, captures no host memory
FINISH = "finish"  # records nothing more into argument `target` (finalizes it)
SUBMIT = "submit"  # submits argument `target` (a queue execute)
PURE = "pure"  # takes no command buffer and has no effect: its result depends only on its
# arguments (a call site may keep its last result)
INDEPENDENT = "independent"  # takes no command buffer and records nothing: it may run
# between a recording and its submit (a new fence, a join)

# What a queue operation of a recurrent step is (`Traits.step`: `vm.record_blocks`'s
# step runs): a new pending fence, a join of fences, a transient alloca, its dealloca.
NEW_FENCE = "new_fence"
JOIN_FENCES = "join_fences"
ALLOCA = "alloca"
DEALLOCA = "dealloca"


class Traits(NamedTuple):
    """What an import does to a recording (the role constants above); `target` is the
    argument position of the command buffer, `buffers` and `lengths` the positions of
    buffer operands and of byte lengths that may be WHOLE_BUFFER, each as (argument
    position, position inside a variadic segment's entry or None)."""

    role: str
    target: int = -1
    buffers: tuple[tuple[int, int | None], ...] = ()
    lengths: tuple[tuple[int, int | None], ...] = ()
    step: str = ""  # NEW_FENCE, JOIN_FENCES, ALLOCA, DEALLOCA or nothing
    wait: int = -1  # the argument position of a queue operation's wait fence
    signal: int = -1  # and of its signal fence


class Export(NamedTuple):
    """One export of a native module (see the module docstring)."""

    name: str
    cconv: str
    refs: tuple[str | None, ...] | None
    fn: Callable[..., Any]
    yields: bool = False
    traits: Traits | None = None


_TRAITS: dict[str, Traits] = {}


def declare_traits(module_name: str, exports: Iterable[Export]) -> None:
    """Makes the traits the rows of `module_name`'s table declare known to the
    translator (`traits_of`); called once when the table is defined."""
    for export in exports:
        if export.traits is not None:
            _TRAITS[f"{module_name}.{export.name}"] = export.traits


def traits_of(full_name: str) -> Traits | None:
    """What the import `full_name` (`module.function`) declares it does to a recording;
    None when it declares nothing (the translator then treats it as any call)."""
    return _TRAITS.get(full_name)


def _ref_type(declared: str, ref_types: Mapping[str, type]) -> RefType:
    name = declared.rstrip("?")
    return RefType(ref_types[name], name, declared.endswith("?"))


def build_module(name: str, version: int, exports: Iterable[Export], state: Any,
                 ref_types: Mapping[str, type] | None = None, *,
                 shims_check_refs: bool = False) -> NativeModule:
    """A `NativeModule` serving `exports` over `state` (kept as `module.state`).

    `ref_types` maps each ref type name the rows use to its Python class; it is needed
    only when the marshaller checks the refs, that is unless `shims_check_refs`."""
    module = NativeModule(name, version)
    for export in exports:
        refs = None
        if export.refs is not None and not shims_check_refs:
            refs = tuple(None if r is None else _ref_type(r, ref_types or {})
                         for r in export.refs)
        module.export(export.name, export.cconv, yieldable=export.yields,
                      refs=refs)(functools.partial(export.fn, state))
    module.state = state  # type: ignore[attr-defined]
    return module


def ref_check_failed(values: tuple[Any, ...], refs: tuple[RefType, ...]) -> Any:
    """Raises the error for the first of `values` that is not what its declared ref
    admits (what a generated prologue calls when its inline tests fail)."""
    for value, ref in zip(values, refs):
        if not (isinstance(value, ref.cls) or (value is None and ref.nullable)):
            raise ref_type_error(value, ref)
    raise AssertionError("a prologue's tests failed but every ref is admitted")


def with_prologues(exports: Iterable[Export], namespace: dict[str, Any], filename: str,
                   ref_types: Mapping[str, type], rules: Mapping[str, str] | None = None,
                   subclassed: Collection[str] = ()) -> tuple[Export, ...]:
    """`exports` with each function that has a prologue replaced by itself compiled again
    with the prologue first: a test per ref its row declares (`ref_test`: no Python
    frame unless it fails; `subclassed` names the ref types whose values are usually
    of a subclass, tested by `isinstance` alone), then each of `rules` (a name -> its value's source, for
    instance a queue chosen from an affinity) that the function takes as a keyword-only
    parameter, which the prologue assigns (callers never pass it). Generated once, in `namespace` (the functions'
    module's globals, where they are redefined), from `filename`, their source: each
    function must be at the top level with a blank line before its `def`, which moves up
    one line to leave the prologue the line before the body."""
    rules = rules or {}
    with open(filename, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    out = ["\n"] * len(lines)
    names: dict[type, str] = {}
    for name, value in list(namespace.items()):
        if isinstance(value, type):
            names.setdefault(value, name)
    declared: dict[str, RefType] = {}
    namespace["declared_refs"] = declared
    namespace["ref_check_failed"] = ref_check_failed
    changed = set()
    for export in exports:
        fn = export.fn
        code = fn.__code__
        params = code.co_varnames[1:code.co_argcount]  # after the module state
        tests, checked, refs = [], [], []
        for param, ref in zip(params, export.refs or ()):
            if ref is None:
                continue
            type_name, nullable = ref.rstrip("?"), ref.endswith("?")
            cls = ref_types[type_name]
            declared[ref] = RefType(cls, type_name, nullable)
            tests.append(f"({ref_test(param, names[cls], nullable, type_name in subclassed)})")
            checked.append(param)
            refs.append(f"declared_refs[{ref!r}]")
        failed = (f"ref_check_failed(({', '.join(checked)},), ({', '.join(refs)},))"
                  if tests else "")
        keyword_only = code.co_varnames[code.co_argcount:
                                        code.co_argcount + code.co_kwonlyargcount]
        assigned = [(local, source) for local, source in rules.items() if local in keyword_only]
        # one line: a rule's value if the tests pass, else the failure (a simple
        # statement, so further rules can follow it), or without a rule one `if`
        statements = []
        if assigned:
            local, source = assigned[0]
            statements.append(f"{local} = ({source}) if {' and '.join(tests)} else {failed}"
                              if tests else f"{local} = {source}")
            statements += [f"{local} = {source}" for local, source in assigned[1:]]
        elif tests:
            statements.append(f"if not ({' and '.join(tests)}): {failed}")
        if not statements:
            continue
        first = code.co_firstlineno - 1
        body = min(line for _start, _end, line in code.co_lines()
                   if line is not None and line - 1 > first) - 1
        end = body + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t"):
            end += 1
        while not lines[end - 1].strip():  # the blank lines after it are the next one's
            end -= 1
        if first == 0 or lines[first - 1].strip():
            raise ValueError(f"{fn.__name__} needs a blank line before its def")
        indent = lines[body][: len(lines[body]) - len(lines[body].lstrip())]
        out[first - 1 : body - 1] = lines[first:body]
        out[body - 1] = indent + "; ".join(statements) + "\n"
        out[body:end] = lines[body:end]
        changed.add(fn.__name__)
    exec(compile("".join(out), filename, "exec"), namespace)  # noqa: S102 - this module's source
    return tuple(Export(e.name, e.cconv, e.refs, namespace[e.fn.__name__], e.yields, e.traits)
                 if e.fn.__name__ in changed else e for e in exports)
