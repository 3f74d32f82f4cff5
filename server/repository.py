"""The model repository: `DIR/<model>/<version>/model.vmfb`, loaded at start.

A loaded version owns its bytes: its file is read once into private memory (regular
files only), so later writes, truncation or deletion of it change nothing it serves;
`ModelRepository.reload` swaps a version only once its replacement loaded.

    DIR/
      mlp_classifier/
        config.json          optional, defaults for every version
        1/
          model.vmfb
          config.json        optional, overrides for this version

`config.json` keys (all optional):

    function          the export to serve (default: the only public export, else "main")
    device            driver: "task" | "sync" | "emu" (default: the server's --device)
    max_batch_size    > 0: the first dim of every input is a batch dim, at most this
    dynamic_batching  {"max_queue_delay_microseconds": int, "preferred_batch_size": [int]}:
                      batch queued requests into one invocation (needs max_batch_size > 0
                      and a dynamic first dim on every input and output; see batching.py)
    sequence_batching Triton's sequence batcher as JSON: stateful sequences, control
                      inputs, implicit state, cellular batching (see sequences.py)
    instance_group    Triton's [{"count": N, "kind": "KIND_CPU"}]: N instances, each its
                      own module and thread, run N executions at once (default 1: with
                      one execution in flight the next batch takes all that queued)
    max_concurrency   the same count under its older name (give one of the two)
    max_queue         requests waiting beyond that (default 16); more get 429
                      (with dynamic_batching: requests waiting to be batched)
    timeout_s         default deadline of a request in seconds (default: none)
    version_policy    Triton's {"latest": {"num_versions": N}} (default N = 1),
                      {"all": {}} or {"specific": {"versions": [...]}}: the versions
                      served (model-level config.json only; refused in a version's)
    execution         accepted for older configs ("async" | "thread"); every execution
                      runs on an instance thread, never on the event loop
    input_names / output_names   rename the ABI's inputs/outputs (lists, in order)
    parameters        the parameter files of a program compiled with external parameters
                      (`.irpa`, `.safetensors`, `.gguf`), beside `model.vmfb` in the
                      version directory: a file name (the anonymous scope), or
                      {"scope": "file" or ["file", ...]} (files of one scope merge, the
                      first holding a key wins); names may not leave the directory
    description       free text, shown by the config endpoint

What the config endpoint shows beside these (`name`, `version`, `platform`, `backend`,
`peak_invocation_bytes`, `input`, `output`) is taken too, so that a configuration read
from it loads back as it is; `name`, `input` and `output` must be the model's.

Every key, file and version directory name is checked by one declared schema
(`config.py`: bounds, strict types, regular files of bounded size) before anything loads.

Input and output names, datatypes and shapes come from the function's ABI declaration
(`iree.abi.declaration`; names from `iree.abi.name` when the program gave them, else
`input0`, `output0`, ...); a dynamic dim is -1 and a scalar argument is shape [1].
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trio

from .. import load as load_module
from ..errors import Error
from ..hal import drivers
from ..vm.loader import read_checked_module
from .admission import Admission, AdmissionStatistics, Instance
from .batching import BatchingConfig
from .config import (
    CONFIG_KEYS,
    MAX_VERSION_DIGITS,
    ConfigError,
    ModelConfig,
    SequenceConfig,
    display_name,
    is_version_name,
    parse_batching_config,
    parse_model_config,
    parse_sequence_config,
    read_config_file,
)
from .cpus import use_process_cpus
from .instances import InstanceThread
from .memory import DeviceMemory
from .protocol import DATATYPES, InferRequest, ProtocolError, datatype_for_mlir
from .scheduling import Scheduler, Unavailable
from .sequences import SequenceBatcher, StepProgram
from .stats import ModelStatistics

log = logging.getLogger("tinyhal.server")

__all__ = ["CONFIG_KEYS", "NO_VERSIONS", "ModelRepository", "ModelVersion", "RequestGates",
           "TensorSpec", "bundled_models_dir"]

DEFAULT_INSTANCES = 1
# entries (directories and files) of one version directory a poll looks at, at most
_MARKED_ENTRIES = 1024
# why a model directory has nothing to load (a folder being filled, say): shown in the
# index, not a failure of the model's at start-up
NO_VERSIONS = "no version directory with a model.vmfb that its version policy selects"


def bundled_models_dir() -> Path:
    """The sample models shipped inside the package."""
    return Path(__file__).resolve().parent / "models"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as the V2 metadata shows it."""

    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 for a dynamic dim
    scalar: bool = False

    def metadata(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @functools.cached_property
    def _fixed_tail(self) -> tuple[int, ...] | None:
        """The dims after the first when none of them is dynamic (the usual batched
        input), else None."""
        tail = self.shape[1:]
        return None if -1 in tail else tail

    def accepts(self, shape: tuple[int, ...]) -> bool:
        """Whether an array of `shape` fits this spec (-1 matches any size)."""
        want = self.shape
        if len(shape) != len(want):
            return False
        if not want:
            return True
        tail = self._fixed_tail
        if tail is not None:
            return shape[1:] == tail and (want[0] == -1 or want[0] == shape[0])
        return all(w == -1 or w == g for w, g in zip(want, shape))


class RequestGates:
    """A model's signature as a request must fit it, derived once from the final
    signature so that a request is checked by one comparison per input: the datatypes by
    name (one dict comparison), the names of the outputs it may ask for, and for each
    input its rank, the dims its shape must equal (all, or all past a dynamic first one)
    and the rows it may have (max_batch_size). `arguments` says only whether a request
    fits; the model version's full check says what is wrong with one that does not."""

    __slots__ = ("_datatypes", "_outputs", "_inputs")

    def __init__(self, datatypes: dict[str, str], outputs: frozenset[str],
                 inputs: list[tuple[str, int, int, tuple[int, ...], int]]) -> None:
        self._datatypes = datatypes
        self._outputs = outputs
        self._inputs = inputs  # (name, rank, first fixed dim, fixed dims, most rows)

    @classmethod
    def of(cls, inputs: list[TensorSpec], outputs: list[TensorSpec], max_batch_size: int
           ) -> RequestGates | None:
        """The gates of a signature; None when an input is a scalar or has a dynamic dim
        past the first (its requests take the full check)."""
        most_rows = max_batch_size or np.iinfo(np.int64).max
        gates = []
        for spec in inputs:
            shape = spec.shape
            if spec.scalar or not shape or -1 in shape[1:]:
                return None
            start = 1 if shape[0] == -1 else 0
            gates.append((spec.name, len(shape), start, shape[start:], most_rows))
        return cls({s.name: s.datatype for s in inputs}, frozenset(s.name for s in outputs),
                   gates)

    def arguments(self, request: InferRequest) -> list[Any] | None:
        """The request's arguments in signature order when it fits, else None."""
        if request.input_datatypes != self._datatypes:
            return None
        for output in request.outputs or ():
            if output.name not in self._outputs:
                return None
        inputs = request.inputs
        args = []
        for name, rank, start, fixed, rows in self._inputs:
            array = inputs[name]
            shape = array.shape
            if len(shape) != rank or shape[start:] != fixed or shape[0] > rows:
                return None
            args.append(array)
        return args


def _parameter_files(settings: ModelConfig, version_dir: Path) -> dict[str, list[str]] | None:
    """The `parameters` key as {scope: [path, ...]} of files inside `version_dir`."""
    value = settings.parameters
    if value is None:
        return None
    scopes = value if isinstance(value, dict) else {"": value}
    out: dict[str, list[str]] = {}
    root = version_dir.resolve()
    for scope, names in scopes.items():
        names = [names] if isinstance(names, str) else names
        for name in names:
            path = (version_dir / name).resolve()
            if path.parent != root and root not in path.parents:
                raise ConfigError(f"config 'parameters': {name!r} is not inside the version directory")
        out[scope] = [str(version_dir / n) for n in names]
    return out




@dataclass(eq=False)
class ModelVersion:
    """One version of one model: its module, signature and its one scheduler (the
    dynamic batcher, or the sequence batcher for a `sequence_batching` config)."""

    name: str
    version: str
    path: Path
    config: dict
    device_name: str
    settings: ModelConfig = field(default_factory=ModelConfig)  # `config`, validated
    state: str = "LOADING"  # LOADING | READY | UNLOADING | UNAVAILABLE
    reason: str = ""
    module: Any = None
    function: str = ""
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    max_batch_size: int = 0
    timeout_s: float | None = None
    execution: str = "thread"
    scheduler: Scheduler | None = None
    batching: BatchingConfig | None = None
    stats: ModelStatistics = field(default_factory=ModelStatistics)
    load_seconds: float = 0.0
    unloaded: bool = False  # unloaded on request: not counted against server readiness
    memory: DeviceMemory | None = None
    device: Any = None
    peak_invocation_bytes: int | None = None  # most device memory one invocation held
    fingerprint: tuple = ()  # of the files it was loaded from (poll mode reloads on change)
    modules: list[Any] = field(default_factory=list)  # one per instance
    sequence_config: SequenceConfig | None = None
    program_outputs: list[TensorSpec] = field(default_factory=list)  # clients see `outputs`
    _device_lock: threading.Lock | None = None
    # what the scheduler holds each instance's module by (released by an unload)
    _workers: list[Instance] = field(default_factory=list)
    _step_programs: list[StepProgram] = field(default_factory=list)
    _unloaded: trio.Event | None = None  # made by the first `unload`, set when it ended
    # what `prepare` compares requests with, made once the signature is final (None: every
    # request takes the full check)
    request_gates: RequestGates | None = None

    @property
    def ready(self) -> bool:
        return self.state == "READY"

    @property
    def sequences(self) -> SequenceBatcher | None:
        """The scheduler when it is a sequence batcher."""
        scheduler = self.scheduler
        return scheduler if isinstance(scheduler, SequenceBatcher) else None

    @property
    def display_path(self) -> str:
        """The model file relative to the repository (errors never show absolute paths)."""
        return f"{self.name}/{self.version}/{self.path.name}"

    # -- loading ---------------------------------------------------------------------

    def load(self, device: Any, device_lock: threading.Lock,
             token: trio.lowlevel.TrioToken, python_cpu: int | None = None) -> None:
        """Reads the model file once into private memory, loads one module per instance
        onto `device`, derives the signature and starts the instance threads (blocking).
        Nothing reads the file again: later writes, truncation or deletion of it change
        nothing this version runs."""
        start = time.perf_counter()
        settings = self.settings
        self.max_batch_size = settings.max_batch_size
        self.batching = parse_batching_config(settings.dynamic_batching, self.max_batch_size)
        self.sequence_config = parse_sequence_config(
            settings.sequence_batching, self.max_batch_size, self.path.parent)
        instances = _instance_count(settings)
        max_queue = settings.max_queue
        self.timeout_s = settings.timeout_s
        # A device that completes work inline runs each invocation on the calling
        # thread; one at a time.
        self._device_lock = device_lock if device.capabilities.completes_inline else None
        self.device = device
        try:
            data = read_checked_module(self.path)
            self.fingerprint = file_fingerprint(self.path)
            parameters = _parameter_files(settings, self.path.parent)
            modules: list[Any] = []
            try:
                for _ in range(instances):
                    modules.append(load_module(data, device=device, parameters=parameters))
                self._derive_signature(modules[0])
            except BaseException:
                for module in modules:
                    module.close()
                raise
        except Error as exc:
            message = exc.message.replace(str(self.path), "").replace("<bytes>", "")
            raise ConfigError(f"{self.display_path}: {message.lstrip(': ')}") from None
        del data
        self.modules, self.module = modules, modules[0]
        # one instance shares the loop's CPU (cpus.py); several run side by side
        cpu = python_cpu if len(modules) == 1 else None
        workers = [Instance(InstanceThread(f"{self.name}/{self.version}#{i}", token, cpu),
                            functools.partial(self._invoke_blocking, module))
                   for i, module in enumerate(modules)]
        self._workers = workers
        memory = self.memory
        try:
            if self.sequence_config is not None:
                self.scheduler = self._sequence_batcher(workers, max_queue)
            else:
                self.scheduler = Admission(
                    workers, max_queue, self.batching, executed=self.stats.executed,
                    begin=(lambda: memory.begin(self.device_name, device,
                                                self.peak_invocation_bytes))
                    if memory else None,
                    end=self._memory_end if memory else None)
            self._check_described(settings)
        except BaseException:  # the instance threads and modules of a failed load end
            if self.scheduler is not None:
                self.scheduler.stop()
                self.scheduler = None
            else:
                for worker in workers:
                    worker.thread.stop()
            _close_modules(self.modules)
            self.module = None
            raise
        self.request_gates = RequestGates.of(self.inputs, self.outputs, self.max_batch_size)
        self.load_seconds = time.perf_counter() - start
        self.state = "READY"

    def _check_described(self, settings: ModelConfig) -> None:
        """A configuration read from the config endpoint names the model and shows its
        signature (Triton's get config, edit, load with `config`): what it shows must be
        this model's, or the load fails naming the first difference."""
        if settings.name is not None and settings.name != self.name:
            raise ConfigError(f"config 'name' {settings.name!r} is not the model's name "
                              f"{self.name!r}")
        for key, specs in (("input", self.inputs), ("output", self.outputs)):
            described = getattr(settings, key)
            if described is None:
                continue
            actual = [s.metadata() for s in specs]
            shown = [t.model_dump() for t in described]
            if shown != actual:
                raise ConfigError(f"config '{key}' {shown} is not the program's {actual} "
                                  f"(it is derived from the program; leave it out)")

    def _memory_end(self, watch: Any) -> None:
        held = self.memory.end(watch, self.device)
        if held is not None and held > (self.peak_invocation_bytes or 0):
            self.peak_invocation_bytes = held

    def _sequence_batcher(self, workers: list[Instance], max_queue: int) -> SequenceBatcher:
        """Checks the control and state tensors against the program and hides them from
        clients (`inputs`/`outputs` become what a request carries); the scheduler."""
        config = self.sequence_config
        by_name = {s.name: s for s in self.inputs}
        out_by_name = {s.name: s for s in self.outputs}
        hidden_in, hidden_out = set(), set()
        for control in config.controls:
            spec = by_name.get(control.name)
            if spec is None or spec.shape != (-1, 1) or \
                    DATATYPES[spec.datatype] != control.dtype:
                raise ConfigError(f"sequence_batching control input '{control.name}' "
                                  f"must be a program input of shape [-1, 1] and type "
                                  f"{control.dtype.name}")
            hidden_in.add(control.name)
        for state in config.states:
            want = (-1, *state.dims)
            spec, out = by_name.get(state.input_name), out_by_name.get(state.output_name)
            for name, found in ((state.input_name, spec), (state.output_name, out)):
                if found is None or found.shape != want or found.datatype != state.datatype:
                    raise ConfigError(f"sequence_batching state '{name}' must be a program "
                                      f"{'input' if found is spec else 'output'} of shape "
                                      f"{list(want)} and type {state.datatype}")
            hidden_in.add(state.input_name)
            hidden_out.add(state.output_name)
        program_inputs = [s.name for s in self.inputs]
        self.inputs = [s for s in self.inputs if s.name not in hidden_in]
        self.outputs = [s for s in self.outputs if s.name not in hidden_out]
        programs = self._step_programs = [
            StepProgram(module, self.function, self._device_lock) for module in self.modules]
        return SequenceBatcher(
            self.name, config, self.max_batch_size, workers, programs, program_inputs,
            [(s.name, s.datatype) for s in self.program_outputs], max_queue,
            executed=self.stats.executed)

    def _derive_signature(self, module: Any) -> None:
        publics = list(module.functions)
        function = self.settings.function
        if function is None:
            if len(publics) == 1:
                function = publics[0]
            elif "main" in publics:
                function = "main"
            else:
                raise ConfigError(f"the module exports {publics}: name one as 'function' in "
                                  f"config.json")
        if function not in module.functions:
            raise ConfigError(f"config 'function' {function!r} is not an export; exports: "
                              f"{publics}")
        info = module.functions[function]
        self.function = function
        self.inputs = self._specs(info.inputs, self.settings.input_names, "input")
        self.outputs = self._specs(info.outputs, self.settings.output_names, "output")
        self.program_outputs = self.outputs
        if self.max_batch_size:
            for spec in self.inputs:
                if spec.scalar or not spec.shape or spec.shape[0] != -1:
                    raise ConfigError(
                        f"max_batch_size needs a dynamic first dim on every input; "
                        f"'{spec.name}' has shape {list(spec.shape)}")
        if self.batching is not None or self.sequence_config is not None:
            for spec in self.outputs:
                if spec.scalar or not spec.shape or spec.shape[0] != -1:
                    raise ConfigError(
                        f"batching needs a dynamic first dim on every output; "
                        f"'{spec.name}' has shape {list(spec.shape)}")

    def _specs(self, args: Any, names: Any, what: str) -> list[TensorSpec]:
        if names is not None and (not isinstance(names, list) or len(names) != len(args)
                                  or not all(isinstance(n, str) and n for n in names)):
            raise ConfigError(f"config '{what}_names' must list {len(args)} names")
        specs = []
        for i, arg in enumerate(args):
            name = names[i] if names else arg.name
            datatype = datatype_for_mlir(arg.type)
            if arg.kind not in ("tensor", "scalar") or datatype is None:
                raise ConfigError(f"{what} '{arg.name}' of @{self.function} has type "
                                  f"{arg.describe()}, which V2 cannot carry")
            if arg.kind == "scalar":
                specs.append(TensorSpec(name, datatype, (1,), scalar=True))
            else:
                shape = tuple(-1 if d is None else d for d in arg.shape or ())
                specs.append(TensorSpec(name, datatype, shape))
        if len({s.name for s in specs}) != len(specs):
            raise ConfigError(f"{what} names of @{self.function} are not unique")
        return specs

    # -- requests --------------------------------------------------------------------

    def prepare(self, request: InferRequest) -> list[Any]:
        """The invocation's arguments, in order, after checking the request against the
        signature (raises ProtocolError 400 naming what is wrong): at once when it fits
        the gates made at load (`RequestGates`), else by the full check, which names the
        first thing wrong."""
        gates = self.request_gates
        if gates is not None:
            args = gates.arguments(request)
            if args is not None:
                return args
        return self._checked_arguments(request)

    def _checked_arguments(self, request: InferRequest) -> list[Any]:
        """`prepare`'s full check: every rule in turn, the first one broken raised."""
        inputs = request.inputs
        if len(inputs) == len(self.inputs) and all(s.name in inputs for s in self.inputs):
            return self._arguments(request)  # every input, nothing unknown
        expected = {s.name for s in self.inputs}
        unknown = [n for n in request.inputs if n not in expected]
        if unknown:
            raise self._unexpected("input", unknown[0])
        missing = [s.name for s in self.inputs if s.name not in request.inputs]
        if missing:
            raise ProtocolError(400, f"expected {len(self.inputs)} inputs but got "
                                     f"{len(request.inputs)} inputs for model '{self.name}'. "
                                     f"Got input(s) {_names_list(request.inputs)}, but "
                                     f"missing required input(s) {_names_list(missing)}. "
                                     f"Please provide all required input(s).")
        return self._arguments(request)

    def _arguments(self, request: InferRequest) -> list[Any]:
        """`prepare` once the request names exactly the model's inputs: its outputs,
        datatypes and shapes checked, the arguments in order."""
        if request.outputs is not None:
            names = {s.name for s in self.outputs}
            for o in request.outputs:
                if o.name not in names:
                    raise self._unexpected("output", o.name)
        args = []
        for spec in self.inputs:
            array = request.inputs[spec.name]
            self._check_input(spec, request.input_datatypes[spec.name], array.shape)
            args.append(array.reshape(())[()] if spec.scalar else array)
        return args

    def check_input(self, name: str, datatype: str, shape: tuple[int, ...]) -> None:
        """Raises ProtocolError 400 when this version has no input `name` or refuses its
        datatype or shape: a large request's JSON data is checked so before it is
        parsed."""
        for spec in self.inputs:
            if spec.name == name:
                return self._check_input(spec, datatype, shape)
        raise self._unexpected("input", name)

    def _unexpected(self, kind: str, name: str) -> ProtocolError:
        """A request's input or output the model does not have (a state or control
        tensor included: the server fills those): 400 in Triton's words, which its L0
        tests read, and the names the model has."""
        specs = self.inputs if kind == "input" else self.outputs
        return ProtocolError(400, f"unexpected inference {kind} {name!r} for model "
                                  f"'{self.name}'; {kind}s: "
                                  f"{', '.join(s.name for s in specs)}")

    def _check_input(self, spec: TensorSpec, datatype: str, shape: tuple[int, ...]) -> None:
        if datatype != spec.datatype:
            raise ProtocolError(400, f"inference input '{spec.name}' data-type is "
                                     f"'{datatype}', but model '{self.name}' expects "
                                     f"'{spec.datatype}'")
        if spec.scalar:
            if math.prod(shape) != 1 or len(shape) > 1:
                raise ProtocolError(400, f"input '{spec.name}' is a scalar: shape [1] "
                                         f"(or []), not {list(shape)}")
            return
        if not spec.accepts(shape):
            raise ProtocolError(400, f"unexpected shape for input '{spec.name}' for model "
                                     f"'{self.name}'. Expected {_dims(spec.shape)}, got "
                                     f"{_dims(shape)}")
        if self.max_batch_size and shape[0] > self.max_batch_size:
            raise ProtocolError(400, f"inference request batch-size must be <= "
                                     f"{self.max_batch_size} for '{self.name}' (input "
                                     f"'{spec.name}' has {shape[0]} rows, over its "
                                     f"max_batch_size)")

    def infer(self, args: list[Any], deadline: float, label: str,
              parameters: dict | None = None, respond: Any = None
              ) -> Awaitable[tuple[list[tuple[str, str, np.ndarray]], float, float]]:
        """Runs one request's invocation under admission control (batched with others when
        the model has dynamic batching; a step of its sequence, with the request's
        `parameters`, when it has sequence batching): awaitable for (results, seconds
        queued, seconds invoking). `respond` as `Admission.infer`'s. (A plain function
        handing back its scheduler's coroutine: the request's task awaits one frame
        fewer.)"""
        rows = int(args[0].shape[0]) if self.max_batch_size else 1
        return self.scheduler.infer(args, rows, deadline, label, respond, parameters)

    def _invoke_blocking(self, module: Any, args: list[Any]
                         ) -> list[tuple[str, str, np.ndarray]]:
        """Runs the function on one instance's module (on its thread); [(output name,
        datatype, array)]."""
        if self._device_lock is not None:
            with self._device_lock:
                result = module.invoke(self.function, *args)
        else:
            result = module.invoke(self.function, *args)
        values = result if isinstance(result, tuple) else (result,)
        if len(self.program_outputs) == 0:
            values = ()
        out = []
        for spec, value in zip(self.program_outputs, values):
            array = np.asarray(value)
            if spec.scalar:
                array = array.reshape((1,))
            dtype = DATATYPES[spec.datatype]
            if array.dtype != dtype:
                array = array.astype(dtype)
            out.append((spec.name, spec.datatype, array))
        return out

    def stop_admitting(self) -> None:
        """The first half of an unload, which does not wait (call it under the
        repository lock): new requests get 503 at once, and the scheduler answers what
        could never run (`Scheduler.close`)."""
        if self.state == "READY":
            self.state = "UNLOADING"
        if self.scheduler is not None:
            self.scheduler.close()

    async def unload(self) -> None:
        """Stops serving this version (`stop_admitting`), waits until every request
        admitted before finished (detached executions and a sequence model's steps
        included), then ends the instance threads and closes the modules (never under a
        running invocation). Its state becomes UNAVAILABLE, reason "unloaded". A second
        call waits for the first one's end. Never call it under the repository lock."""
        self.stop_admitting()
        if self._unloaded is not None:
            await self._unloaded.wait()
            return
        self._unloaded = trio.Event()
        try:
            scheduler = self.scheduler
            if scheduler is not None:
                await scheduler.wait_idle()
                scheduler.stop()
                self.scheduler = UnloadedScheduler(scheduler.max_concurrency,
                                                   scheduler.max_queue)
            self._release_modules()
            modules, self.modules, self.module = self.modules, [], None
            await trio.to_thread.run_sync(_close_modules, modules)
            self.state, self.reason, self.unloaded = "UNAVAILABLE", "unloaded", True
            log.info("unloaded model %s version %s", self.name, self.version)
        finally:
            self._unloaded.set()

    def _release_modules(self) -> None:
        """Drops what the stopped scheduler holds the modules by, so they are freed when
        they close, on the worker thread (`_close_modules`), whoever still holds the
        scheduler (a stopped scheduler detaches its callbacks: no reference cycle keeps
        it either, `freeze_heap`)."""
        for worker in self._workers:
            worker.invoke = _unloaded_invoke
        for program in self._step_programs:
            program.module = None
        self._workers, self._step_programs = [], []
        self.request_gates = None

    def metadata(self, versions: list[str]) -> dict:
        return {
            "name": self.name,
            "versions": versions,
            "platform": "tinyhal_vmfb",
            "inputs": [s.metadata() for s in self.inputs],
            "outputs": [s.metadata() for s in self.outputs],
        }

    def describe_config(self) -> dict:
        """The serving configuration in Triton's JSON field names. A scheduler the model
        does not use is left out, as Triton leaves out an unset message: tools read its
        presence (perf_analyzer drives any model whose config has `sequence_batching`
        as a stateful one, starting and ending a sequence per request)."""
        scheduler = self.scheduler
        config = {
            "name": self.name,
            "version": self.version,
            "platform": "tinyhal_vmfb",
            "backend": "tinyhal",
            "function": self.function,
            "device": self.device_name,
            "execution": self.execution,
            "instance_group": [{"count": scheduler.max_concurrency if scheduler else 0,
                                "kind": "KIND_CPU"}],
            "max_batch_size": self.max_batch_size,
            "dynamic_batching": self.batching.describe() if self.batching else None,
            "sequence_batching": self.sequence_config.describe() if self.sequence_config
            else None,
            "max_concurrency": scheduler.max_concurrency if scheduler else None,
            "max_queue": scheduler.max_queue if scheduler else None,
            "timeout_s": self.timeout_s,
            "peak_invocation_bytes": self.peak_invocation_bytes,
            "description": self.settings.description,
            "input": [s.metadata() for s in self.inputs],
            "output": [s.metadata() for s in self.outputs],
        }
        for scheduler in ("dynamic_batching", "sequence_batching"):
            if config[scheduler] is None:
                del config[scheduler]
        return config


UNLOADED = "the model version was unloaded"


class UnloadedScheduler:
    """The scheduler of a version that unloaded (`Scheduler`): it admits nothing (a
    request that was checked against the version before it unloaded gets 503) and holds
    nothing."""

    in_flight = 0
    live_sequences = 0

    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue

    async def infer(self, *args: Any, **kwargs: Any) -> Any:
        raise Unavailable(UNLOADED)

    def continues_work(self, parameters: dict) -> bool:
        return False

    def running_invocations(self) -> list:
        return []

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(0, 0, self.max_concurrency, self.max_queue, 0)

    def close(self) -> None:
        pass

    def abandon(self, why: str) -> int:
        return 0

    async def wait_idle(self) -> None:
        pass

    def stop(self) -> None:
        pass


def _close_modules(modules: list[Any]) -> None:
    """Closes `modules` and drops the last references to them here, on a worker thread:
    freeing a module (thousands of objects, its file's bytes) is then this thread's
    time, not the event loop's."""
    while modules:
        modules.pop().close()


def _unloaded_invoke(args: list[Any]) -> Any:
    raise Unavailable(UNLOADED)


def _instance_count(settings: ModelConfig) -> int:
    """Executions a version runs at once: Triton's `instance_group` count (the sum over
    its groups), or `max_concurrency`, its older name here; default 1."""
    if settings.instance_group is not None:
        return sum(group.count for group in settings.instance_group)
    return settings.max_concurrency or DEFAULT_INSTANCES


def _file_mark(path: Path | str) -> tuple | None:
    """What changes when the file at `path` is written, replaced or removed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _is_real_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def version_marks(version_dir: str | Path) -> tuple:
    """What changes when a file of a version directory (its program, config.json,
    parameter archives, initial state files, in subdirectories too) is written, replaced,
    added or removed: Triton's poll reloads a model when any of its files changed. Looks
    at `_MARKED_ENTRIES` entries at most, in name order (a careless tree costs a poll no
    more); symbolic links are followed to the file they name, never into a directory."""
    marks: list = []
    pending = [os.fspath(version_dir)]
    while pending and len(marks) < _MARKED_ENTRIES:
        top = pending.pop()
        marks.append(top)
        try:
            with os.scandir(top) as entries:
                listed = sorted((entry.path, _is_real_dir(entry)) for entry in entries)
        except OSError:
            continue
        for path, is_dir in listed[:_MARKED_ENTRIES - len(marks)]:
            if is_dir:
                pending.append(path)
            else:
                marks.append((path, _file_mark(path)))
    return tuple(marks)


def file_fingerprint(path: Path) -> tuple:
    """What tells a changed version from the one loaded (poll mode): the files of its
    directory (`version_marks`) and the model's config.json above it."""
    return version_marks(path.parent), _file_mark(path.parent.parent / "config.json")


def freeze_heap() -> None:
    """Keeps what is alive now out of the cyclic garbage collector's scans (`gc.freeze`),
    after model versions loaded (only the young generations are collected first): a
    collection of the oldest generation otherwise walks every object of every loaded
    module and paused the event loop for up to 25 ms under load (p99 at 64 connections).
    Frozen objects are never scanned again, so an unloaded version's modules are freed
    by reference counting alone: closing a module breaks its reference cycles
    (`vm.Context.close`), a stopped scheduler detaches its dispatch and client-watch
    callbacks (its own bound methods), and an unload drops what the scheduler held the
    modules by (`ModelVersion._release_modules`). (An unload once thawed and collected
    the whole heap on the loop: 30-50 ms of CPU here, 0.2-2 s of the loop's time on a
    busy machine.)"""
    gc.collect(1)
    gc.freeze()


def _version_key(version: str) -> int:
    return int(version)  # version directories are ASCII digits (others are skipped)


def _reason(exc: BaseException) -> str:
    """What went wrong, on one line: the message of our own errors, the exception's type
    and message for any other."""
    if isinstance(exc, (ConfigError, Error)):
        text = str(exc)  # an Error's with its context and causes
    elif isinstance(exc, OSError):
        text = f"{exc.strerror or type(exc).__name__}"
    else:  # not ours: its message may hold anything, bound it
        text = f"{type(exc).__name__}: {str(exc)[:1000]}"
    return " ".join(text.split())


def version_policy(settings: ModelConfig) -> tuple[str, Any]:
    """The model's `version_policy` as Triton spells it: {"latest": {"num_versions": N}}
    (the default, N = 1), {"all": {}} or {"specific": {"versions": [..]}}."""
    policy = settings.version_policy
    if policy is None:
        return "latest", 1
    if policy.kind == "all":
        return "all", None
    if policy.kind == "specific":
        return "specific", {str(v) for v in policy.specific.versions}
    return "latest", policy.latest.num_versions


def _select_versions(policy: tuple[str, Any], versions: list[str]) -> list[str]:
    kind, value = policy
    ordered = sorted(versions, key=_version_key)
    if kind == "all":
        return ordered
    if kind == "latest":
        return ordered[-value:]
    return [v for v in ordered if v in value]


class ModelRepository:
    """Every model version under a directory, and the devices they run on.

    Only the versions a model's `version_policy` selects are served (Triton's default:
    the latest one). Reloading (`reload`) loads the new versions next to the old ones
    and swaps each only once its replacement loaded: a failed reload keeps the old
    version serving.

    One model never takes the others down: whatever is wrong with a model directory
    (its configuration, its version directories, its files, an exception nobody
    expected) makes that model UNAVAILABLE with the reason, in the index and the log.
    A model is known by its directory's name; a name that is not UTF-8 is shown with
    its stray bytes as `\\xNN` (`config.display_name`).
    """

    def __init__(self, root: Path | str, default_device: str = "task", *,
                 executable_policy: str = "any") -> None:
        self.root = Path(root)
        self.default_device = default_device
        self.executable_policy = executable_policy  # of every device it creates
        self.models: dict[str, dict[str, ModelVersion]] = {}
        # models of the repository with no version to show: name -> why
        self.problems: dict[str, str] = {}
        # of those, the ones without any version when the server started (a failure, as
        # Triton's); one found so by a poll is a directory being filled, not a failure
        self._empty_at_start: set[str] = set()
        self.started = False  # set by the server once its first models loaded
        self.devices: dict[str, Any] = {}
        self.memory = DeviceMemory()
        self.retiring: set[ModelVersion] = set()  # replaced, finishing what they admitted
        self.token: trio.lowlevel.TrioToken | None = None  # set by the server at start
        self.python_cpu: int | None = None  # where single instance threads run (cpus.py)
        self._device_locks: dict[str, threading.Lock] = {}
        self._dirs: dict[str, Path] = {}  # shown name -> model directory
        # (model, version) -> the fingerprint of the files it failed to load from: a
        # poll tries it again only once they changed, as Triton's
        self._failed_files: dict[tuple[str, str], tuple] = {}
        # model -> {version directory: why it was skipped}, as last logged
        self._skipped: dict[str, dict[str, str]] = {}
        self._scan()

    def _scan(self) -> None:
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository {self.root} is not a directory")
        for name in self.model_names():
            versions = self._scan_isolated(name)
            if versions:
                self.models[name] = versions

    def model_names(self) -> list[str]:
        """The model directories of the repository, sorted, by their shown names
        (blocking; OSError when the repository cannot be listed)."""
        found: dict[str, Path] = {}
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.startswith((".", "_")):
                    continue
                try:
                    if not entry.is_dir():
                        continue
                except OSError:
                    continue
                found[display_name(entry.name)] = Path(entry.path)
        self._dirs = found
        for name in list(self.problems):  # a copy: scans on other threads may add to it
            if name not in found:
                self.forget_problem(name)
        for key in list(self._failed_files):
            if key[0] not in found:
                self._failed_files.pop(key, None)
        for name in list(self._skipped):
            if name not in found:
                self._skipped.pop(name, None)
        return sorted(found)

    def _scan_isolated(self, name: str, override: dict | None = None
                       ) -> dict[str, ModelVersion]:
        """`_scan_model` of one model, whose failure of any kind is that model's alone:
        it is recorded in `problems` (and logged once) and no version is returned."""
        try:
            versions = self._scan_model(name, self._dirs[name], override)
        except Exception as exc:  # noqa: BLE001 - one model never takes the server down
            reason = _reason(exc).replace(str(self.root), "")
            if self.problems.get(name) != reason:
                log.error("model %s: %s", name, reason)
            self.problems[name] = reason
            return {}
        if versions:
            self.problems.pop(name, None)
            self._empty_at_start.discard(name)
        else:
            reason = NO_VERSIONS
            if self.problems.get(name) != reason:
                log.warning("model %s: %s; skipped", name, reason)
            self.problems[name] = reason
            if not self.started:
                self._empty_at_start.add(name)
        return versions

    def unavailable_models(self) -> list[str]:
        """The models of the repository that failed with no version to show (a
        configuration or directory that cannot be read, a version policy that selects
        none, no version at all at start): each keeps the server from being ready, as
        Triton's strict readiness, until it loads, unloads or leaves the repository. A
        model whose versions still serve (a poll that could not read it again) is not
        one of them: its versions decide."""
        return sorted(name for name, why in self.problems.items()
                      if (why != NO_VERSIONS or name in self._empty_at_start)
                      and not self.models.get(name))

    def forget_problem(self, name: str) -> None:
        """`name` was unloaded: what failed of it is no longer a model of the server."""
        self.problems.pop(name, None)
        self._empty_at_start.discard(name)

    def _scan_model(self, name: str, model_dir: Path, override: dict | None
                    ) -> dict[str, ModelVersion]:
        """The versions of `model_dir` its version policy selects, not yet loaded.
        `override`: the whole configuration (a repository `load`'s `config`), instead
        of the config.json files."""
        model_config: dict | None
        where = "load parameter 'config'" if override is not None else f"{name}/config.json"
        try:
            model_config = override if override is not None else read_config_file(
                model_dir / "config.json", where)
            policy = version_policy(parse_model_config(model_config, where))
        except ConfigError as exc:  # each version is UNAVAILABLE with it (and logged)
            model_config, policy, model_problem = None, ("latest", 1), str(exc)
        found: dict[str, Path] = {}
        skipped: dict[str, str] = {}  # version directory -> why it was skipped
        for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir()):
            vmfb = version_dir / "model.vmfb"
            if not is_version_name(version_dir.name):
                skipped[version_dir.name] = (
                    f"model {name}: skipping {display_name(version_dir.name)}/: version "
                    f"directories are named by integers of at most {MAX_VERSION_DIGITS} "
                    f"digits")
                continue
            if not os.path.lexists(vmfb):
                found_names = sorted(display_name(p.name) for p in version_dir.iterdir())
                skipped[version_dir.name] = (
                    f"model {name} version {version_dir.name}: no model.vmfb (found: "
                    f"{', '.join(found_names[:20]) or 'nothing'}); skipped")
                continue
            if version_dir.name[0] == "0" and len(version_dir.name) > 1:
                skipped[version_dir.name] = (  # Triton's words
                    f"model {name}: ignore version directory '{version_dir.name}' which "
                    f"contains leading zeros in its directory name")
                continue
            found[version_dir.name] = vmfb
        selected = _select_versions(policy, list(found))
        if policy[0] == "specific":
            for version in sorted(policy[1] - set(found), key=_version_key):
                skipped[f"policy {version}"] = (
                    f"version {version} is specified for model '{name}', but the version "
                    f"directory is not present")
        self._log_skipped(name, skipped)
        if found and not selected:
            raise ConfigError(f"at least one version must be available under the version "
                              f"policy of model '{name}' (it selects none of the versions "
                              f"{', '.join(sorted(found, key=_version_key)[:20])})")
        versions: dict[str, ModelVersion] = {}
        for version in selected:
            mv = ModelVersion(name, version, found[version], {}, self.default_device)
            mv.fingerprint = file_fingerprint(found[version])
            if override is None:
                where = f"{name}/{version}/config.json"
            try:
                if model_config is None:
                    raise ConfigError(model_problem)
                config = dict(model_config)
                if override is None:
                    overrides = read_config_file(found[version].parent / "config.json",
                                                 where)
                    if "version_policy" in overrides:  # it would choose nothing there
                        raise ConfigError(f"{where}: 'version_policy': chooses the "
                                          f"versions of the model, so it belongs in "
                                          f"{name}/config.json")
                    config.update(overrides)
                config.pop("version_policy", None)
                mv.config = config
                mv.settings = parse_model_config(config, where)
                device = mv.settings.device or self.default_device
                mv.device_name = drivers.canonical(device)
            except ConfigError as exc:
                mv.state, mv.reason = "UNAVAILABLE", str(exc)
            versions[version] = mv
        return versions

    def _log_skipped(self, name: str, skipped: dict[str, str]) -> None:
        """Logs each skipped version directory of `name` once per change (a poll meets
        the same ones every few seconds): a reason not logged at the last scan."""
        before = self._skipped.get(name, {})
        for version_dir, why in skipped.items():
            if before.get(version_dir) != why:
                log.warning("%s", why)
        if skipped:
            self._skipped[name] = skipped
        else:
            self._skipped.pop(name, None)

    def signatures(self, names: list[str]) -> dict[str, tuple]:
        """What a poll compares to find the models whose files changed since it last
        looked (blocking): for each model of `names` (as `model_names` just listed
        them), its config.json, its entries, and the files of each version directory
        (`version_marks`). A few stats per model, where reading a model's configuration
        again parses it: an idle poll of 1,000 models took most of a CPU."""
        found = {}
        join = os.path.join
        for name in names:
            model_dir = self._dirs.get(name)
            if model_dir is None:
                continue
            try:
                with os.scandir(model_dir) as entries:
                    listed = sorted((entry.path, _is_dir(entry)) for entry in entries)
            except OSError as exc:
                found[name] = ("unreadable", exc.errno)
                continue
            found[name] = (_file_mark(join(model_dir, "config.json")), *(
                version_marks(path) if is_dir else path for path, is_dir in listed))
        return found

    def scan_model(self, name: str, override: dict | None = None, *,
                   listed: bool = False) -> dict[str, ModelVersion]:
        """`name`'s versions as its directory holds them now (blocking; not loaded);
        `listed`: the repository was just listed (`model_names`), not again.
        ProtocolError 400 naming no path when there is nothing to load."""
        try:
            if not listed:
                self.model_names()
        except OSError as exc:
            raise ProtocolError(400, f"failed to load '{name}': the model repository "
                                     f"cannot be read: {exc.strerror or exc}") from None
        if name not in self._dirs:
            raise ProtocolError(400, f"failed to load '{name}', failed to poll from model "
                                     f"repository: no such model directory in it")
        fresh = self._scan_isolated(name, override)
        if not fresh:
            raise ProtocolError(400, f"failed to load '{name}': {self.problems.get(name)}")
        return fresh

    def index(self, names: list[str]) -> list[dict]:
        """Triton's repository index: every model of the repository (`names`) and every
        model still served: each version with its state (and reason when not READY); a
        model not loaded by name alone; a model that could not be read UNAVAILABLE with
        the reason."""
        entries = []
        for name in sorted(set(names) | set(self.models)):
            versions = self.models.get(name)
            if versions:
                for mv in versions.values():
                    entry = {"name": mv.name, "version": mv.version, "state": mv.state}
                    if mv.reason:
                        entry["reason"] = mv.reason
                    entries.append(entry)
            elif name in self.problems:
                entries.append({"name": name, "state": "UNAVAILABLE",
                                "reason": self.problems[name]})
            else:
                entries.append({"name": name})
        return entries

    async def reload(self, name: str, background: trio.Nursery, *, changed_only: bool = False,
                     override: dict | None = None, listed: bool = False
                     ) -> list[ModelVersion]:
        """Triton's repository `load` of one model: reads its directory again and loads
        every version its policy selects afresh (only those whose files changed, with
        `changed_only`, a poll: a version that failed to load is tried again only once
        its files changed, as Triton's poll), each next to the version it replaces, which
        is swapped out only once the new one loaded and then finishes what it admitted
        in `background`.
        A version that fails to load keeps its predecessor serving. Versions no longer
        selected unload once a selected one serves. `override`: the configuration to
        use instead of the config.json files; `listed`: the repository was just listed.
        Returns the versions that failed."""
        fresh = await trio.to_thread.run_sync(
            functools.partial(self.scan_model, name, override, listed=listed))
        current = self.models.get(name, {})
        to_load = [mv for v, mv in fresh.items()
                   if not (changed_only and (
                       v in current and current[v].ready
                       and current[v].fingerprint == mv.fingerprint
                       or self._failed_files.get((name, v)) == mv.fingerprint))]
        failed = await trio.to_thread.run_sync(self.load_versions, to_load)
        for mv in to_load:
            if mv in failed and override is None:
                self._failed_files[(name, mv.version)] = mv.fingerprint
            else:
                self._failed_files.pop((name, mv.version), None)
        versions = dict(current)
        for mv in to_load:
            old = versions.get(mv.version)
            if mv in failed and old is not None and old.ready:
                continue  # the old one keeps serving
            versions[mv.version] = mv
            if old is not None:
                self._retire(old, background)
        if any(mv.ready for v, mv in versions.items() if v in fresh):
            for v in [v for v in versions if v not in fresh]:
                self._retire(versions.pop(v), background)
        self.models[name] = dict(sorted(versions.items(), key=lambda kv: _version_key(kv[0])))
        return failed

    def stop_admitting(self, name: str) -> list[ModelVersion]:
        """Every version of `name` admits nothing new (`ModelVersion.stop_admitting`; no
        wait); the versions, for `unload_versions`."""
        versions = list(self.models[name].values())
        for mv in versions:
            mv.stop_admitting()
        return versions

    async def unload_versions(self, versions: list[ModelVersion]) -> None:
        """Waits until each of `versions` finished what it admitted and unloaded (outside
        the repository lock: loads and unloads of other models go on meanwhile)."""
        async with trio.open_nursery() as nursery:
            for mv in versions:
                nursery.start_soon(mv.unload)

    async def unload_model(self, name: str) -> None:
        """Every version of `name` stops serving once what it admitted finished."""
        await self.unload_versions(self.stop_admitting(name))

    def retire_model(self, name: str, background: trio.Nursery) -> None:
        """Every version of `name` stops admitting now and unloads in `background`."""
        for mv in self.stop_admitting(name):
            self._retire(mv, background)

    def _retire(self, mv: ModelVersion, background: trio.Nursery) -> None:
        self.retiring.add(mv)

        async def retire() -> None:
            try:
                await mv.unload()
            finally:
                self.retiring.discard(mv)

        background.start_soon(retire)

    def all_versions(self) -> list[ModelVersion]:
        return [mv for versions in self.models.values() for mv in versions.values()]

    def device_lost(self, device: Any, error: Error) -> list[ModelVersion]:
        """A kernel faulted on `device` (or it was lost otherwise): every ready model
        version on it becomes UNAVAILABLE with the reason, and the device is forgotten,
        so loading a model again (`load_model`) starts on a fresh one. Returns the
        versions it took down."""
        lost = [mv for mv in self.all_versions() if mv.device is device and mv.ready]
        for mv in lost:
            mv.state, mv.reason = "UNAVAILABLE", f"device lost: {error.message}"
        for name, known in list(self.devices.items()):
            if known is device:
                del self.devices[name]
        return lost

    def device(self, name: str) -> Any:
        device = self.devices.get(name)
        if device is None:
            from ..hal import create_device

            device = self.devices[name] = create_device(
                name, executable_policy=self.executable_policy)
            self._device_locks[name] = threading.Lock()
        return device

    def load_all(self) -> list[ModelVersion]:
        """Loads every version (blocking); returns those that failed (a poll tries
        them again once their files changed)."""
        failed = self.load_versions(self.all_versions())
        for mv in failed:
            self._failed_files[(mv.name, mv.version)] = mv.fingerprint
        return failed

    def load_versions(self, versions: list[ModelVersion]) -> list[ModelVersion]:
        """Loads `versions` (blocking); returns those that failed. Devices made here size
        their worker pools from this thread's CPUs: it may use all of the process's."""
        use_process_cpus()
        failed = []
        for mv in versions:
            if mv.state == "UNAVAILABLE":
                failed.append(mv)
                log.error("model %s version %s: %s", mv.name, mv.version, mv.reason)
                continue
            log.info("loading model %s version %s", mv.name, mv.version)
            mv.memory = self.memory
            try:
                device = self.device(mv.device_name)
                mv.load(device, self._device_locks[mv.device_name], self.token,
                        self.python_cpu)
            except Exception as exc:  # noqa: BLE001 - one model never takes the server down
                reason = _reason(exc).replace(str(self.root), "")
                mv.state, mv.reason = "UNAVAILABLE", reason
                failed.append(mv)
                log.error("model %s version %s failed to load: %s", mv.name, mv.version,
                          reason)
                continue
            log.info("loaded model %s version %s (@%s, %d inputs, %d outputs) on %s in %.3f s",
                     mv.name, mv.version, mv.function, len(mv.inputs), len(mv.outputs),
                     mv.device_name, mv.load_seconds)
        if versions:  # a poll that found nothing changed loads nothing: no collection
            freeze_heap()
        return failed

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The version (the highest ready one when `version` is None); ProtocolError 404
        if none (naming only what was asked for)."""
        versions = self.models.get(name)
        if versions is None:  # Triton's words (its L0 tests read them); 404 here
            raise ProtocolError(404, f"Request for unknown model: '{name}' is not found")
        if not version:
            if len(versions) == 1:
                for mv in versions.values():
                    return mv
            ready = [mv for mv in versions.values() if mv.ready]
            return (ready or list(versions.values()))[-1]
        mv = versions.get(version)
        if mv is None:
            raise ProtocolError(404, f"Request for unknown model: '{name}' version "
                                     f"{version} is not found")
        return mv

    def close(self) -> None:
        for mv in [*self.all_versions(), *self.retiring]:
            if mv.scheduler is not None:
                mv.scheduler.stop()
            for module in mv.modules:
                try:
                    module.close()
                except Error:
                    pass
            mv.modules, mv.module = [], None
        for device in self.devices.values():
            try:
                device.close()
            except Error:
                pass
        self.devices.clear()


def _names_list(names: Any) -> str:
    """Names as Triton's validation messages list them: ['a','b']."""
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def _dims(shape: Any) -> str:
    """A shape as Triton's messages write it: [-1,16]."""
    return "[" + ",".join(str(d) for d in shape) + "]"
