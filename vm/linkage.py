"""The typed namespace between a context and one bytecode module's generated code.

A `Context` instantiates a module by filling a `Linkage`: the instance's state, what each
import resolved to, one site per recording block and the print/trace hooks.
`codegen.instantiate` runs the module's generated code with the linkage as its only
input: the code's first lines bind what its functions use into their globals (so a
function reads an import as fast as any global), and `instantiate` fills `functions`.
Neither side names the other's globals; the names the generated code uses (`_imp<k>`,
`_G`, ...) stay inside `codegen`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Linkage"]


@dataclass(slots=True)
class Linkage:
    """One module instance's side of its generated code."""

    rwdata: bytearray
    """The module's global bytes (`global.load.i32`, ...), `global_bytes_capacity` long."""
    global_refs: list[Any]
    """The module's global refs, `global_ref_count` long."""
    rodata: Sequence[Any]
    """The module's rodata segments (`VMBuffer`s), by ordinal."""
    imports: Sequence[Callable[..., Any]]
    """Per import ordinal, what a plain `call` calls: it returns the results (a callee
    that may suspend is wrapped to block until it has them)."""
    yieldable_imports: Sequence[Callable[..., Any]]
    """Per import ordinal, what `call.yieldable` calls: it may return a `native.Suspend`
    or a generator, which the calling function yields to whoever drives it."""
    resolved: Sequence[bool]
    """Per import ordinal, whether it resolved (`import.resolved`); an optional import
    that did not is called as a function that fails."""
    record_sites: Sequence[Callable[[tuple[Any, ...]], Any]]
    """Per recording block of the program (`ModuleProgram.record_blocks`), its site."""
    on_print: Callable[[bytes, tuple[Any, ...]], None]
    on_trace: Callable[[bytes, tuple[Any, ...]], None]
    functions: list[Callable[..., Any]] = field(default_factory=list)
    """Filled by `codegen.instantiate`: the module's internal functions, by ordinal."""
