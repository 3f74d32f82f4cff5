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
null`), so the function body receives only what it declared. When the function's source
is at hand the checks and its body are compiled into one function (`make_marshaller`),
so an import call costs one Python frame.

A function declared `yieldable` may instead return a `Suspend`: the interpreter hands it
to whoever drives the invocation, which either blocks on it (`Suspend.block()`) or awaits
it on trio (`await Suspend.wait_async()`); both return the function's results.
"""

from __future__ import annotations

import ast
import inspect
import linecache
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import InvalidArgumentError


class Suspend:
    """A yieldable import's request to wait before producing its results."""

    __slots__ = ("_block", "_wait_async")

    def __init__(
        self,
        block: Callable[[], Any],
        wait_async: Callable[[], Awaitable[Any]],
    ) -> None:
        self._block = block
        self._wait_async = wait_async

    def block(self) -> Any:
        """Waits on the calling thread and returns the import's results."""
        return self._block()

    async def wait_async(self) -> Any:
        """Waits without blocking the trio event loop and returns the import's results."""
        return await self._wait_async()


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


def make_marshaller(fn: Callable[..., Any], cconv: str,
                    refs: Sequence[RefType | None]) -> Callable[..., Any]:
    """`fn` behind the checks of its declared ref arguments (an exact type test first,
    `isinstance` for subclasses; a failure raises `ref_type_error`).

    Where `fn`'s source is at hand, the result is one function: the checks followed by
    `fn`'s own body, compiled with `fn`'s globals and the current values of its closure
    (so an import call costs one Python frame, as a C module's shim does); otherwise it
    is a generated function that checks and then calls `fn`.
    """
    arity = _top_level_arity(cconv)
    if len(refs) != arity:
        raise InvalidArgumentError(
            f"declaration of {fn.__name__} lists {len(refs)} arguments, calling "
            f"convention {cconv} has {arity}"
        )
    fused = _fused_marshaller(fn, refs)
    if fused is not None:
        return fused
    names = [f"a{i}" for i in range(arity)]
    namespace: dict[str, Any] = {"_fn": fn}
    lines = [f"def marshal_{fn.__name__}({', '.join(names)}):"]
    lines += _check_lines(names, refs, namespace)
    lines.append(f"    return _fn({', '.join(names)})")
    exec(compile("\n".join(lines), f"<marshal {fn.__name__}>", "exec"), namespace)
    return namespace[f"marshal_{fn.__name__}"]


def _check_lines(names: Sequence[str], refs: Sequence[RefType | None],
                 namespace: dict[str, Any]) -> list[str]:
    """The statements checking each declared ref argument (`names[i]`), with the names
    they use added to `namespace`."""
    namespace["_marshal_error"] = ref_type_error
    namespace["_marshal_isinstance"] = isinstance
    lines = []
    for i, ref in enumerate(refs):
        if ref is None:
            continue
        a = names[i]
        namespace[f"_marshal_T{i}"] = ref.cls
        namespace[f"_marshal_R{i}"] = ref
        test = (f"{a}.__class__ is not _marshal_T{i} and not "
                f"_marshal_isinstance({a}, _marshal_T{i})")
        if ref.nullable:
            test = f"{a} is not None and {test}"
        lines.append(f"    if {test}: raise _marshal_error({a}, _marshal_R{i})")
    return lines


_FUSED_CODE: dict[Any, Any] = {}  # (fn's code, refs) -> the compiled module of the fused def


def _fused_marshaller(fn: Callable[..., Any],
                      refs: Sequence[RefType | None]) -> Callable[..., Any] | None:
    """The checks and `fn`'s body as one function, or None when that cannot be built
    (no source, default or variadic parameters, decorators, a closure cell not yet set)."""
    code = fn.__code__
    if (fn.__defaults__ or fn.__kwdefaults__ or code.co_flags & (inspect.CO_VARARGS
            | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR | inspect.CO_COROUTINE)
            or code.co_kwonlyargcount or code.co_argcount != len(refs)):
        return None
    try:
        closure = {name: cell.cell_contents
                   for name, cell in zip(code.co_freevars, fn.__closure__ or ())}
    except ValueError:  # a closure variable assigned after the function was made
        return None
    key = (code, tuple(refs))
    compiled = _FUSED_CODE.get(key)
    if compiled is None:
        from .translation_cache import native_code

        checked = tuple(None if ref is None else ref.nullable for ref in refs)
        compiled = native_code(fn, checked, lambda: _compile_fused(fn, refs))
        if compiled is None:
            return None
        _FUSED_CODE[key] = compiled
    namespace = dict(fn.__globals__)
    namespace.update(closure)
    for i, ref in enumerate(refs):
        if ref is not None:
            namespace[f"_marshal_T{i}"] = ref.cls
            namespace[f"_marshal_R{i}"] = ref
    namespace["_marshal_error"] = ref_type_error
    namespace["_marshal_isinstance"] = isinstance
    exec(compiled, namespace)
    fused = namespace[code.co_name]
    fused.__qualname__ = fn.__qualname__
    fused.__doc__ = fn.__doc__
    return fused


def _compile_fused(fn: Callable[..., Any], refs: Sequence[RefType | None]) -> Any:
    code = fn.__code__
    func = _function_node(code.co_filename, code.co_firstlineno, code.co_name)
    if func is None:
        return None
    names = [a.arg for a in func.args.args]
    checks = ast.parse("\n".join(line[4:] for line in _check_lines(names, refs, {})))
    for node in ast.walk(checks):
        if hasattr(node, "lineno"):
            node.lineno = node.end_lineno = func.lineno
    fused = ast.FunctionDef(name=func.name, args=func.args, body=checks.body + func.body,
                            decorator_list=[], returns=None, type_comment=None,
                            lineno=func.lineno, col_offset=0, end_lineno=func.end_lineno,
                            end_col_offset=func.end_col_offset)
    try:
        return compile(ast.Module(body=[fused], type_ignores=[]), code.co_filename, "exec")
    except (SyntaxError, ValueError):
        return None


_SOURCE_FUNCTIONS: dict[str, dict[tuple[str, int], ast.FunctionDef]] = {}


def _function_node(filename: str, first_line: int, name: str) -> ast.FunctionDef | None:
    """The definition of function `name` starting at `first_line` (its first decorator
    or its `def`) in `filename`, from one parse of the file."""
    functions = _SOURCE_FUNCTIONS.get(filename)
    if functions is None:
        functions = _SOURCE_FUNCTIONS[filename] = {}
        try:
            tree = ast.parse("".join(linecache.getlines(filename)))
        except (SyntaxError, ValueError):
            return None
        statements = list(tree.body)
        while statements:  # statements only: functions are never inside expressions
            node = statements.pop()
            if type(node) is ast.FunctionDef:
                start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                functions[(node.name, start)] = node
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if type(inner) is list:
                    statements.extend(inner)
    return functions.get((name, first_line))


@dataclass(frozen=True)
class NativeFunction:
    """One function a native module exports."""

    name: str
    cconv: str
    fn: Callable[..., Any]
    yieldable: bool = False


@dataclass
class NativeModule:
    """A module implemented in Python whose functions bytecode modules import."""

    name: str
    version: int = 0
    functions: dict[str, NativeFunction] = field(default_factory=dict)

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
