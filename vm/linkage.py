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
from typing import Any

__all__ = ["Linkage"]


class Linkage:
    """One module instance's side of its generated code. (A plain class with slots: it
    is defined at every start-up, which a dataclass makes slower.)

    - `rwdata`: the module's global bytes (`global.load.i32`, ...), its
      `global_bytes_capacity` long;
    - `global_refs`: the module's global refs, `global_ref_count` long;
    - `rodata`: the module's rodata segments (`VMBuffer`s), by ordinal;
    - `imports`: per import ordinal, what a plain `call` calls: it returns the results
      (a callee that may suspend is wrapped to block until it has them);
    - `yieldable_imports`: per import ordinal, what `call.yieldable` calls: it may
      return a `native.Suspend` or a generator, which the calling function yields to
      whoever drives it;
    - `resolved`: per import ordinal, whether it resolved (`import.resolved`); an
      optional import that did not is called as a function that fails;
    - `record_sites`: per recording block of the program
      (`ModuleProgram.record_blocks`), its site;
    - `on_print`, `on_trace`: the hooks of `vm.print` and `vm.trace`;
    - `trace`: the line printer of a `--trace_execution` translation (`vm.trace.Tracer`),
      else None;
    - `functions`: filled by `codegen.instantiate`, the module's internal functions by
      ordinal.
    """

    __slots__ = ("rwdata", "global_refs", "rodata", "imports", "yieldable_imports",
                 "resolved", "record_sites", "on_print", "on_trace", "trace",
                 "functions")

    def __init__(self, rwdata: bytearray, global_refs: list[Any], rodata: Sequence[Any],
                 imports: Sequence[Callable[..., Any]],
                 yieldable_imports: Sequence[Callable[..., Any]], resolved: Sequence[bool],
                 record_sites: Sequence[Callable[[tuple[Any, ...]], Any]],
                 on_print: Callable[[bytes, tuple[Any, ...]], None],
                 on_trace: Callable[[bytes, tuple[Any, ...]], None]) -> None:
        self.rwdata = rwdata
        self.global_refs = global_refs
        self.rodata = rodata
        self.imports = imports
        self.yieldable_imports = yieldable_imports
        self.resolved = resolved
        self.record_sites = record_sites
        self.on_print = on_print
        self.on_trace = on_trace
        self.trace: Callable[[int, tuple[Any, ...]], None] | None = None
        self.functions: list[Callable[..., Any]] = []
