"""The contract between the bytecode interpreter and modules written in Python.

A `NativeModule` (the `hal` module first of all) exposes functions by their fully
qualified import name (`hal.buffer_view.create`) with IREE's calling-convention string
(`0rIIiiCID_r`). The interpreter marshals arguments by that string:

- `i` -> Python int (the signed 32-bit value), `I` -> Python int (signed 64-bit),
  `f`/`F` -> Python float, `r` -> the referenced object or `None` for a null ref;
- a variadic segment `C...D` -> a `list` of `tuple`s, one tuple per segment entry, with
  the entry's values in order (a one-value entry is still a 1-tuple).

The function returns `None` for `_v`, the bare value for one result and a tuple for
several. Ints returned are wrapped to the declared width by the interpreter.

An export may declare the ref types of its `r` arguments (`refs`, one `RefType` or None
per top-level argument of the convention). The module then wraps the function in a
marshaller generated from that declaration, which rejects a ref of another type, or a
null where none is allowed, with INVALID_ARGUMENT (`expected a hal.buffer ref but got
null`), so the function body receives only what it declared. A module whose functions
check their refs themselves (the `hal` module: its table declares them, its shims test
them in their first lines) exports without `refs`, so an import call is one frame.

A function declared `yieldable` may instead return a `Suspend`: the interpreter hands it
to whoever drives the invocation, which either blocks on it (`Suspend.block()`) or awaits
it on trio (`await Suspend.wait_async()`); both return the function's results.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from ..errors import InvalidArgumentError


class Suspend:
    """A yieldable import's request to wait before producing its results.

    `block()` waits on the calling thread and returns the import's results;
    `await wait_async()` waits without blocking the trio event loop and returns them. Both
    are the callables given, called directly (no frame of the request's own)."""

    __slots__ = ("block", "wait_async")

    def __init__(
        self,
        block: Callable[[], Any],
        wait_async: Callable[[], Awaitable[Any]],
    ) -> None:
        self.block = block
        self.wait_async = wait_async


class RefType(NamedTuple):
    """A declared ref argument: instances of `cls`, called `name` in messages; `nullable`
    says whether a null ref is accepted."""

    cls: type
    name: str
    nullable: bool = False


def ref_type_error(value: Any, ref: RefType) -> InvalidArgumentError:
    """IREE's message for a ref argument that is not what was declared."""
    got = "null" if value is None else type(value).__name__
    either = " or null" if ref.nullable else ""
    return InvalidArgumentError(f"expected a {ref.name} ref{either} but got {got}")


def ref_test(arg: str, cls: str, nullable: bool, subclassed: bool = False) -> str:
    """Python source of the test that `arg` is what a declared ref admits: the exact
    class `cls` first, then a subclass (`isinstance`, found as a builtin; only that when
    the refs are usually `subclassed`, as devices are), and null if `nullable`. No
    Python frame: what generated checks (marshallers, the `hal` module's prologues)
    inline."""
    test = (f"isinstance({arg}, {cls})" if subclassed
            else f"{arg}.__class__ is {cls} or isinstance({arg}, {cls})")
    return f"{arg} is None or {test}" if nullable else test


def _top_level_arity(cconv: str) -> int:
    args = cconv[1:].partition("_")[0]
    count, depth = 0, 0
    for c in args:
        if c == "C":
            depth += 1
            if depth == 1:
                count += 1
        elif c == "D":
            depth -= 1
        elif depth == 0 and c != "v":
            count += 1
    return count


def _function_name(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn.__name__


def make_marshaller(fn: Callable[..., Any], cconv: str,
                    refs: Sequence[RefType | None]) -> Callable[..., Any]:
    """`fn` behind a generated function that checks its declared ref arguments (an
    exact type test first, `isinstance` for subclasses; a failure raises
    `ref_type_error`) and then calls it. Modules whose import calls must cost one frame
    (the `hal` module) check in their functions' first lines instead."""
    fn_name = _function_name(fn)
    arity = _top_level_arity(cconv)
    if len(refs) != arity:
        raise InvalidArgumentError(
            f"declaration of {fn_name} lists {len(refs)} arguments, calling "
            f"convention {cconv} has {arity}"
        )
    names = [f"a{i}" for i in range(arity)]
    namespace: dict[str, Any] = {"_fn": fn, "_marshal_error": ref_type_error}
    lines = [f"def marshal_{fn_name}({', '.join(names)}):"]
    for i, ref in enumerate(refs):
        if ref is None:
            continue
        a = names[i]
        namespace[f"_marshal_T{i}"] = ref.cls
        namespace[f"_marshal_R{i}"] = ref
        lines.append(f"    if not ({ref_test(a, f'_marshal_T{i}', ref.nullable)}): "
                     f"raise _marshal_error({a}, _marshal_R{i})")
    lines.append(f"    return _fn({', '.join(names)})")
    exec(compile("\n".join(lines), f"<marshal {fn_name}>", "exec"), namespace)
    return namespace[f"marshal_{fn_name}"]


class NativeFunction(NamedTuple):
    """One function a native module exports."""

    name: str
    cconv: str
    fn: Callable[..., Any]
    yieldable: bool = False


class NativeModule:
    """A module implemented in Python whose functions bytecode modules import.

    `functions` by full name; `on_close` is called when a context using the module
    closes (the module state's release); `block_recorder` serves a recording block of
    this module's imports as a whole (`vm.record_blocks`): called once per site with the
    imports' names, the block and the bound functions, it returns the site's callable, or
    None to have the imports called one by one. (A plain class: defined at every
    start-up, which a dataclass makes slower.)"""

    def __init__(self, name: str, version: int = 0,
                 functions: dict[str, NativeFunction] | None = None,
                 on_close: Callable[[], None] | None = None,
                 block_recorder: Callable[[list[str], Any, list[Callable[..., Any]]],
                                          Callable[[tuple], Any] | None] | None = None
                 ) -> None:
        self.name = name
        self.version = version
        self.functions: dict[str, NativeFunction] = {} if functions is None else functions
        self.on_close = on_close
        self.block_recorder = block_recorder

    def __repr__(self) -> str:
        return f"NativeModule({self.name!r}, {len(self.functions)} functions)"

    def export(
        self, name: str, cconv: str, *, yieldable: bool = False,
        refs: Sequence[RefType | None] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering `fn` as `<module>.<name>` with calling convention `cconv`;
        with `refs`, behind a marshaller that checks the declared ref arguments."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            full = f"{self.name}.{name}"
            target = fn
            if refs is not None and any(r is not None for r in refs):
                target = make_marshaller(fn, cconv, refs)
            self.functions[full] = NativeFunction(full, cconv, target, yieldable)
            return fn

        return register

    def lookup(self, full_name: str) -> NativeFunction | None:
        return self.functions.get(full_name)
