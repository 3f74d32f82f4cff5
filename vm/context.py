"""Contexts: module instantiation, import resolution and invocation.

A `Context` holds one instance (globals, rodata refs, resolved imports) of each bytecode
module given to it, next to the native modules those import from. It links each instance
to its generated code through a `Linkage` (`vm/linkage.py`). Every call runs by one
protocol (`vm/invocation.py`: begin, resume after each wait, end), driven two ways:

- `invoke(name, args)` on the calling thread: a `Suspend` from a yieldable import is
  waited on with `Suspend.block()`;
- `await invoke_async(name, args)` on trio: a `Suspend` is awaited with
  `Suspend.wait_async()`, so many invocations interleave on one event loop;
- `begin(name, args)` hands the caller the `Invocation` itself, to drive by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import IO, Any

from ..errors import (
    Error,
    FailedPreconditionError,
    IncompatibleError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from . import codegen, ops, record_blocks
from .cconv import CConv, parse_cconv
from .invocation import Invocation, call_blocking, run_async, run_blocking
from .linkage import Linkage
from .loader import BytecodeModule
from .native import NativeFunction, NativeModule


class VMFunction:
    """A function resolved in a context: `context.lookup_function("mod.fn")`."""

    __slots__ = ("instance", "name", "ordinal", "callable", "cconv", "is_generator",
                 "reflection", "result_count", "refs_only")

    def __init__(self, instance, name, ordinal, fn, cconv, is_generator, reflection):
        self.instance = instance
        self.name = name
        self.ordinal = ordinal
        self.callable = fn
        self.cconv: CConv = cconv
        self.is_generator = is_generator
        self.reflection = reflection
        self.result_count = len(cconv.results)
        # Every argument a ref: `marshal_arguments` would only check the count.
        self.refs_only = all(t == "r" for t in cconv.args)

    def trap(self, exc: Exception) -> Error:
        """`exc`, raised while this function ran as an entry point, as a VM error naming
        the VM stack (what `Invocation` raises in its place)."""
        return self.instance.context._trap(exc, self)

    def __repr__(self) -> str:
        return f"VMFunction({self.instance.module.name}.{self.name}, {self.cconv.text})"


class ModuleInstance:
    """State of one bytecode module in one context."""

    def __init__(self, context: Context, module: BytecodeModule, linkage: Linkage,
                 program: Any) -> None:
        self.context = context
        self.module = module
        self.program = program  # the module's translation this instance runs
        self.linkage = linkage
        self.global_refs = linkage.global_refs

    def function(self, name: str) -> VMFunction | None:
        export = self.module.exports.get(name)
        if export is None:
            return None
        ordinal = export.internal_ordinal
        return VMFunction(self, name, ordinal, self.linkage.functions[ordinal], export.cconv,
                          ordinal in self.program.generator_ordinals, export.reflection)


def _blocking(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adapts a callee that may suspend to a plain call that blocks until its results."""

    def call(*args: Any) -> Any:
        return call_blocking(fn, args)

    return call


class Context:
    """A set of modules linked together: `Context([hal_module, load_module(vmfb)])`.

    Bytecode modules are instantiated in order; imports resolve by fully qualified name
    against the other modules (native or bytecode). Each bytecode module's `__init`
    export runs once, at construction unless `defer_init=True` (then call
    `initialize()` or `await initialize_async()`).
    """

    def __init__(
        self,
        modules: Iterable[BytecodeModule | NativeModule],
        *,
        defer_init: bool = False,
        on_print=None,
        on_trace=None,
        trace_execution: IO[str] | None = None,
    ) -> None:
        self.modules: list = list(modules)
        self.trace_execution = trace_execution
        self.on_print = on_print
        self.on_trace = on_trace
        self.instances: list[ModuleInstance] = []
        self._by_name: dict[str, Any] = {}
        self._programs: dict[str, ModuleInstance] = {}
        self._initialized = False
        self._init_error: Error | None = None
        self._init_running: Any = None  # a trio.Event while initialize_async runs
        for m in self.modules:
            if not isinstance(m, (BytecodeModule, NativeModule)):
                raise InvalidArgumentError(f"not a module: {type(m).__name__}")
            if m.name in self._by_name:
                raise InvalidArgumentError(f"duplicate module name {m.name!r} in context")
        for m in self.modules:
            if isinstance(m, BytecodeModule):
                inst = self._instantiate(m)
                self._by_name[m.name] = inst
            else:
                self._by_name[m.name] = m
        if not defer_init:
            self.initialize()

    # -- instantiation
    def _check_dependencies(self, module: BytecodeModule, available: dict) -> None:
        for dep in module.dependencies:
            target = available.get(dep.name)
            if target is None:
                if dep.optional:
                    continue
                raise NotFoundError(
                    f"module {module.name!r} depends on module {dep.name!r} "
                    f"(version >= {dep.minimum_version}), which is not in the context"
                )
            version = target.version if not isinstance(target, ModuleInstance) \
                else target.module.version
            if version < dep.minimum_version:
                raise IncompatibleError(
                    f"module {module.name!r} requires {dep.name!r} version >= "
                    f"{dep.minimum_version}, context has version {version}"
                )

    def _resolve_import(self, module: BytecodeModule, imp, available: dict):
        mod_name, _, fn_name = imp.full_name.partition(".")
        target = available.get(mod_name)
        if isinstance(target, NativeModule):
            nf: NativeFunction | None = target.lookup(imp.full_name)
            if nf is None:
                return None
            if imp.signature.calling_convention and nf.cconv:
                theirs = parse_cconv(nf.cconv, imp.full_name)
                if (theirs.args, theirs.results) != (imp.cconv.args, imp.cconv.results):
                    raise IncompatibleError(
                        f"import {imp.full_name} of module {module.name!r} expects calling "
                        f"convention {imp.cconv.text}, native module provides {nf.cconv}"
                    )
            fn = nf.fn
            return (_blocking(fn) if nf.yieldable else fn), fn
        if isinstance(target, ModuleInstance):
            vf = target.function(fn_name)
            if vf is None:
                return None
            if (vf.cconv.args, vf.cconv.results) != (imp.cconv.args, imp.cconv.results):
                raise IncompatibleError(
                    f"import {imp.full_name} expects calling convention {imp.cconv.text}, "
                    f"module {mod_name!r} exports {vf.cconv.text}"
                )
            fn = vf.callable
            return (_blocking(fn) if vf.is_generator else fn), fn
        return None

    def _instantiate(self, module: BytecodeModule) -> ModuleInstance:
        available = dict(self._by_name)
        self._check_dependencies(module, available)
        imports: list[Callable[..., Any]] = []
        yieldable_imports: list[Callable[..., Any]] = []
        resolved: list[bool] = []
        for imp in module.imports:
            found = self._resolve_import(module, imp, available)
            resolved.append(found is not None)
            if found is None:
                if not imp.optional:
                    raise NotFoundError(
                        f"module {module.name!r} imports {imp.full_name} "
                        f"({imp.cconv.text}), which no module in the context provides"
                    )
                missing = ops.null_import(imp.full_name, imp.ordinal)
                found = (missing, missing)
            imports.append(found[0])
            yieldable_imports.append(found[1])
        sites = []
        program = module.program
        if self.trace_execution is not None:
            from . import trace

            program = trace.traced_program(module)
        for block in program.record_blocks:
            ordinals = record_blocks.imports_of(block)
            functions = [imports[k] for k in ordinals]
            recorder = None
            # the module serving the block's first import, if it serves them all
            serving = available.get(module.imports[ordinals[0]].full_name.partition(".")[0])
            if isinstance(serving, NativeModule) and serving.block_recorder is not None and all(
                    serving.functions.get(module.imports[k].full_name) is not None
                    and serving.functions[module.imports[k].full_name].fn is fn
                    for k, fn in zip(ordinals, functions)):
                recorder = serving.block_recorder(
                    [module.imports[k].full_name for k in ordinals], block, functions)
            sites.append(recorder or record_blocks.replay(block, functions))
        linkage = Linkage(bytearray(module.global_bytes_capacity),
                          [None] * module.global_ref_count, module.rodata, imports,
                          yieldable_imports, resolved, sites, self._print_hook,
                          self._trace_hook)
        if self.trace_execution is not None:
            linkage.trace = trace.Tracer(module, program.trace_sites, linkage,
                                         self.trace_execution)
        codegen.instantiate(program, linkage)
        inst = ModuleInstance(self, module, linkage, program)
        self.instances.append(inst)
        self._programs[program.filename] = inst
        return inst

    def _print_hook(self, name: bytes, values: tuple) -> None:
        if self.on_print is not None:
            self.on_print(name.decode("utf-8", "replace"), values)

    def _trace_hook(self, name: bytes, values: tuple) -> None:
        if self.on_trace is not None:
            self.on_trace(name.decode("utf-8", "replace"), values)

    def _init_functions(self) -> list[VMFunction]:
        out = []
        for inst in self.instances:
            f = inst.function("__init")
            if f is not None:
                out.append(f)
        return out

    def initialize(self) -> None:
        """Runs every module's `__init` (once) on this thread."""
        if self._initialized:
            return
        self._check_initialized()
        self._initialized = True
        try:
            for f in self._init_functions():
                run_blocking(self.begin(f))
        except BaseException as exc:
            self._init_failed(exc)
            raise

    async def initialize_async(self) -> None:
        """Runs every module's `__init` (once) on the trio event loop.

        Initialization is never abandoned half way: a cancel that arrives while it runs
        takes effect once it is done (the module globals it sets are what every later
        call relies on)."""
        import trio

        if self._initialized:
            return
        self._check_initialized()
        running = self._init_running
        if running is not None:  # another task is initializing: its globals are not set yet
            await running.wait()
            self._check_initialized()
            return
        self._init_running = running = trio.Event()
        try:
            with trio.CancelScope(shield=True):
                for f in self._init_functions():
                    await run_async(self.begin(f))
            self._initialized = True
        except BaseException as exc:
            self._init_failed(exc)
            raise
        finally:
            self._init_running = None
            running.set()
        await trio.lowlevel.checkpoint_if_cancelled()

    def _init_failed(self, exc: BaseException) -> None:
        self._initialized = False  # so every later call reaches `_check_initialized`
        self._init_error = FailedPreconditionError(
            f"module initialization failed ({type(exc).__name__}: {exc}); the context "
            f"cannot be used")

    def _check_initialized(self) -> None:
        if self._init_error is not None:
            raise self._init_error

    # -- lookup
    def lookup_function(self, name: str) -> VMFunction:
        """Finds an export by `module.function` or, searching the last module first, by
        bare name. Module names hold no dot; export names may (`m.i16i16.i32`)."""
        mod_name, dot, fn_name = name.partition(".")
        if dot:
            inst = self._by_name.get(mod_name)
            if isinstance(inst, ModuleInstance):
                f = inst.function(fn_name)
                if f is not None:
                    return f
        for inst in reversed(self.instances):
            f = inst.function(name)
            if f is not None:
                return f
        raise NotFoundError(f"function {name!r} not found in context")

    # -- invocation
    def begin(self, function: str | VMFunction, args: list | tuple = ()) -> Invocation:
        """Begins a call of an export (`vm/invocation.py`): the `Invocation` runs up to its
        first wait or its end; drive it with `resume` and take `end()`'s value, or hand
        it to `run_blocking` / `run_async`. The context must be initialized; what the
        function raises comes out as a VM error naming the VM stack."""
        f = function if isinstance(function, VMFunction) else self.lookup_function(function)
        pyargs = args if f.refs_only and len(args) == len(f.cconv.args) else \
            marshal_arguments(f, args)
        return Invocation(f.callable, pyargs, f.trap)

    def invoke(self, function: str | VMFunction, args: list | tuple = ()) -> list:
        """Calls an export synchronously and returns its results as a list."""
        f = function if isinstance(function, VMFunction) else self.lookup_function(function)
        if not self._initialized:
            self.initialize()
        # `begin`, without its frame: this is the path of every blocking call
        pyargs = args if f.refs_only and len(args) == len(f.cconv.args) else \
            marshal_arguments(f, args)
        result = call_blocking(f.callable, pyargs, f.trap)
        n = f.result_count
        return [] if n == 0 else [result] if n == 1 else list(result)

    async def invoke_async(self, function: str | VMFunction, args: list | tuple = ()) -> list:
        """Calls an export on trio; yieldable imports suspend only this invocation.

        A cancelled scope raises `trio.Cancelled` here, before anything runs; a cancel
        that lands at a later suspension abandons the invocation (see `tinyhal.vm.api`,
        "Cancellation").
        """
        import trio

        await trio.lowlevel.checkpoint_if_cancelled()
        f = function if isinstance(function, VMFunction) else self.lookup_function(function)
        if not self._initialized:
            await self.initialize_async()
        result = await run_async(self.begin(f, args))
        n = f.result_count
        return [] if n == 0 else [result] if n == 1 else list(result)

    # -- traps
    def _trap(self, exc: BaseException, entry: VMFunction) -> Error:
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            inst = self._programs.get(code.co_filename)
            if inst is not None:
                line_pcs = inst.program.line_pcs
                lineno = tb.tb_lineno
                if 0 < lineno < len(line_pcs) and line_pcs[lineno] is not None:
                    ordinal, pc = line_pcs[lineno]
                    fn = inst.module.functions[ordinal]
                    loc = inst.module.source_location(fn, pc)
                    frames.append(f"{inst.module.name}.{fn.name}+{pc:08X}"
                                  + (f" {loc}" if loc else ""))
            tb = tb.tb_next
        if isinstance(exc, Error):
            if getattr(exc, "vm_stack", None) is not None:
                return exc  # already annotated by a nested context
            err = exc
        elif isinstance(exc, RecursionError):
            err = ResourceExhaustedError("VM stack overflow (call depth exceeds the limit)")
        elif isinstance(exc, MemoryError):
            err = ResourceExhaustedError("out of memory")
        else:
            err = InternalError(f"{type(exc).__name__}: {exc}")
            err.__cause__ = exc
        where = frames[-1] if frames else f"{entry.instance.module.name}.{entry.name}"
        if frames:
            err.message = f"{err.message}; at {where}"
            if len(frames) > 1:
                err.message += " (called from " + " <- ".join(reversed(frames[:-1])) + ")"
        else:
            err.message = f"{err.message}; in {where}"
        err.args = (err.message,)
        err.vm_stack = frames
        err.with_traceback(None)
        return err

    def close(self) -> None:
        """Runs `__deinit` exports (if any) and drops module state."""
        for inst in reversed(self.instances):
            f = inst.function("__deinit")
            if f is not None:
                run_blocking(self.begin(f))
            inst.global_refs[:] = [None] * len(inst.global_refs)
        for m in self.modules:
            if isinstance(m, NativeModule) and m.on_close is not None:
                m.on_close()
        self._release()

    def _release(self) -> None:
        """Breaks the reference cycles of the closed instances (a generated function and
        the namespace holding it; an instance and its context), so the memory they hold
        returns by reference counting, without a full collection of the cyclic garbage
        collector: one holds the interpreter lock for tens of ms in a large process,
        which a serving process cannot pause for."""
        for inst in self.instances:
            linkage = inst.linkage
            for function in linkage.functions:
                namespace = getattr(getattr(function, "__wrapped__", function), "__globals__",
                                    None)
                if namespace is not None and namespace.get("_L") is linkage:
                    namespace.clear()
            linkage.functions.clear()
            inst.context = inst.linkage = None
        self.instances.clear()
        self._by_name.clear()
        self._programs.clear()



_I32_RANGE = (-(1 << 31), (1 << 32))
_I64_RANGE = (-(1 << 63), (1 << 64))


def marshal_arguments(f: VMFunction, args) -> list:
    types = f.cconv.args
    if len(args) != len(types):
        raise InvalidArgumentError(
            f"{f.instance.module.name}.{f.name} takes {len(types)} arguments "
            f"({f.cconv.text}), {len(args)} given"
        )
    out = []
    for i, (t, v) in enumerate(zip(types, args)):
        try:
            if t == "i":
                v = int(v)
                if not _I32_RANGE[0] <= v < _I32_RANGE[1]:
                    raise InvalidArgumentError(f"argument {i} ({v}) does not fit in i32")
                out.append(ops.wrap32(v))
            elif t == "I":
                v = int(v)
                if not _I64_RANGE[0] <= v < _I64_RANGE[1]:
                    raise InvalidArgumentError(f"argument {i} ({v}) does not fit in i64")
                out.append(ops.wrap64(v))
            elif t == "f":
                out.append(v if isinstance(v, ops.F32Bits) else ops.round_f32(float(v)))
            elif t == "F":
                out.append(float(v))
            else:
                out.append(v)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgumentError(
                f"argument {i} of {f.name} must be convertible to {t}: {exc}"
            ) from None
    return out
