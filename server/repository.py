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
                      served (model-level config.json only)
    execution         accepted for older configs ("async" | "thread"); every execution
                      runs on an instance thread, never on the event loop
    input_names / output_names   rename the ABI's inputs/outputs (lists, in order)
    parameters        the parameter files of a program compiled with external parameters
                      (`.irpa`, `.safetensors`, `.gguf`), beside `model.vmfb` in the
                      version directory: a file name (the anonymous scope), or
                      {"scope": "file" or ["file", ...]} (files of one scope merge, the
                      first holding a key wins); names may not leave the directory
    description       free text, shown by the config endpoint

Input and output names, datatypes and shapes come from the function's ABI declaration
(`iree.abi.declaration`; names from `iree.abi.name` when the program gave them, else
`input0`, `output0`, ...); a dynamic dim is -1 and a scalar argument is shape [1].
"""

from __future__ import annotations

import functools
import gc
import json
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
from ..vm.loader import read_module_file
from .admission import Admission, Instance
from .batching import BatchingConfig, parse_batching_config
from .cpus import use_process_cpus
from .instances import InstanceThread
from .memory import DeviceMemory
from .protocol import DATATYPES, InferRequest, ProtocolError, datatype_for_mlir
from .sequences import (
    SequenceBatcher,
    SequenceConfig,
    StepProgram,
    parse_sequence_config,
)
from .stats import ModelStatistics

log = logging.getLogger("tinyhal.server")

__all__ = ["ModelRepository", "ModelVersion", "TensorSpec", "bundled_models_dir"]

CONFIG_KEYS = {
    "function", "device", "max_batch_size", "max_concurrency", "max_queue", "timeout_s",
    "execution", "input_names", "output_names", "description", "dynamic_batching",
    "parameters", "instance_group", "version_policy", "sequence_batching",
}
DEFAULT_INSTANCES = 1
DEFAULT_MAX_QUEUE = 16
MAX_CONFIG_BYTES = 1 << 20


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


class ConfigError(Exception):
    pass


def _read_config(path: Path) -> dict:
    if not os.path.lexists(path):
        return {}
    try:
        config = json.loads(bytes(read_module_file(path, limit=MAX_CONFIG_BYTES)))
    except Error as exc:
        raise ConfigError(f"{path.parent.name}/{path.name}: "
                          f"{exc.message.split(': ', 1)[-1]}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path.parent.name}/{path.name}: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path.parent.name}/{path.name} must hold a JSON object")
    unknown = set(config) - CONFIG_KEYS
    if unknown:
        raise ConfigError(f"{path.parent.name}/{path.name}: unknown keys {sorted(unknown)}; "
                          f"known: {sorted(CONFIG_KEYS)}")
    return config


def _parameter_files(config: dict, version_dir: Path) -> dict[str, list[str]] | None:
    """The `parameters` key as {scope: [path, ...]} of files inside `version_dir`."""
    value = config.get("parameters")
    if value is None:
        return None
    scopes = value if isinstance(value, dict) else {"": value}
    out: dict[str, list[str]] = {}
    root = version_dir.resolve()
    for scope, names in scopes.items():
        names = [names] if isinstance(names, str) else names
        if not isinstance(scope, str) or not isinstance(names, list) or not all(
                isinstance(n, str) and n for n in names):
            raise ConfigError("config 'parameters' must be a file name or "
                              "{scope: file name or [file names]}")
        for name in names:
            path = (version_dir / name).resolve()
            if path.parent != root and root not in path.parents:
                raise ConfigError(f"config 'parameters': {name!r} is not inside the version directory")
        out[scope] = [str(version_dir / n) for n in names]
    return out


def _positive_int(config: dict, key: str, default: int, minimum: int = 1) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"config '{key}' must be an integer >= {minimum}, not {value!r}")
    return value


@dataclass(eq=False)
class ModelVersion:
    """One version of one model: its module, signature and admission control."""

    name: str
    version: str
    path: Path
    config: dict
    device_name: str
    state: str = "LOADING"  # LOADING | READY | UNLOADING | UNAVAILABLE
    reason: str = ""
    module: Any = None
    function: str = ""
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    max_batch_size: int = 0
    timeout_s: float | None = None
    execution: str = "thread"
    admission: Admission | None = None
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
    sequences: SequenceBatcher | None = None
    program_outputs: list[TensorSpec] = field(default_factory=list)  # clients see `outputs`
    _device_lock: threading.Lock | None = None

    @property
    def ready(self) -> bool:
        return self.state == "READY"

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
        config = self.config
        self.max_batch_size = _positive_int(config, "max_batch_size", 0, minimum=0)
        try:
            self.batching = parse_batching_config(config.get("dynamic_batching"),
                                                  self.max_batch_size)
            self.sequence_config = parse_sequence_config(
                config.get("sequence_batching"), self.max_batch_size, self.path.parent)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.batching is not None and self.sequence_config is not None:
            raise ConfigError("config takes one of 'dynamic_batching' and "
                              "'sequence_batching'")
        instances = _instance_count(config)
        max_queue = _positive_int(config, "max_queue", DEFAULT_MAX_QUEUE, minimum=0)
        timeout = config.get("timeout_s")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                timeout, (int, float)) or timeout <= 0):
            raise ConfigError(f"config 'timeout_s' must be a positive number, not {timeout!r}")
        self.timeout_s = timeout
        execution = config.get("execution", "thread")
        if execution not in ("async", "thread"):
            raise ConfigError(f"config 'execution' must be 'async' or 'thread', not "
                              f"{execution!r}")
        # A sync device runs each invocation inline on the calling thread; one at a time.
        self._device_lock = device_lock if self.device_name == "sync" else None
        self.device = device
        try:
            data = read_module_file(self.path)
            self.fingerprint = file_fingerprint(self.path)
            parameters = _parameter_files(config, self.path.parent)
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
        memory = self.memory
        self.admission = Admission(
            workers, max_queue, self.batching, executed=self.stats.executed,
            begin=(lambda: memory.begin(self.device_name, device, self.peak_invocation_bytes))
            if memory else None,
            end=self._memory_end if memory else None)
        if self.sequence_config is not None:
            self._start_sequences(workers, max_queue)
        self.load_seconds = time.perf_counter() - start
        self.state = "READY"

    def _memory_end(self, watch: Any) -> None:
        held = self.memory.end(watch, self.device)
        if held is not None and held > (self.peak_invocation_bytes or 0):
            self.peak_invocation_bytes = held

    def _start_sequences(self, workers: list[Instance], max_queue: int) -> None:
        """Checks the control and state tensors against the program and hides them from
        clients: `inputs`/`outputs` become what a request carries."""
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
        programs = [StepProgram(module, self.function, self._device_lock)
                    for module in self.modules]
        self.sequences = SequenceBatcher(
            self.name, config, self.max_batch_size, workers, programs, program_inputs,
            [(s.name, s.datatype) for s in self.program_outputs], max_queue,
            executed=self.stats.executed)

    def _derive_signature(self, module: Any) -> None:
        publics = list(module.functions)
        function = self.config.get("function")
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
        self.inputs = self._specs(info.inputs, self.config.get("input_names"), "input")
        self.outputs = self._specs(info.outputs, self.config.get("output_names"), "output")
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
        signature (raises ProtocolError 400 naming what is wrong)."""
        inputs = request.inputs
        if len(inputs) == len(self.inputs) and all(s.name in inputs for s in self.inputs):
            return self._arguments(request)  # every input, nothing unknown
        expected = {s.name for s in self.inputs}
        unknown = [n for n in request.inputs if n not in expected]
        if unknown:
            raise ProtocolError(400, f"unknown input {unknown[0]!r} for model '{self.name}'; "
                                     f"inputs: {', '.join(s.name for s in self.inputs)}")
        missing = [s.name for s in self.inputs if s.name not in request.inputs]
        if missing:
            raise ProtocolError(400, f"missing input{'s' if len(missing) > 1 else ''} "
                                     f"{', '.join(repr(m) for m in missing)} for model "
                                     f"'{self.name}'")
        return self._arguments(request)

    def _arguments(self, request: InferRequest) -> list[Any]:
        """`prepare` once the request names exactly the model's inputs: its outputs,
        datatypes and shapes checked, the arguments in order."""
        if request.outputs is not None:
            names = {s.name for s in self.outputs}
            for o in request.outputs:
                if o.name not in names:
                    raise ProtocolError(400, f"unknown output {o.name!r} for model "
                                             f"'{self.name}'; outputs: "
                                             f"{', '.join(s.name for s in self.outputs)}")
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
        raise ProtocolError(400, f"unknown input {name!r} for model '{self.name}'; "
                                 f"inputs: {', '.join(s.name for s in self.inputs)}")

    def _check_input(self, spec: TensorSpec, datatype: str, shape: tuple[int, ...]) -> None:
        if datatype != spec.datatype:
            raise ProtocolError(400, f"input '{spec.name}' has datatype {datatype} but "
                                     f"model '{self.name}' expects {spec.datatype}")
        if spec.scalar:
            if math.prod(shape) != 1 or len(shape) > 1:
                raise ProtocolError(400, f"input '{spec.name}' is a scalar: shape [1] "
                                         f"(or []), not {list(shape)}")
            return
        if not spec.accepts(shape):
            raise ProtocolError(400, f"input '{spec.name}' has shape {list(shape)} "
                                     f"but model '{self.name}' expects "
                                     f"{list(spec.shape)}")
        if self.max_batch_size and shape[0] > self.max_batch_size:
            raise ProtocolError(400, f"input '{spec.name}' has batch size "
                                     f"{shape[0]}, over max_batch_size "
                                     f"{self.max_batch_size} of model '{self.name}'")

    def infer(self, args: list[Any], deadline: float, label: str,
              parameters: dict | None = None, respond: Any = None
              ) -> Awaitable[tuple[list[tuple[str, str, np.ndarray]], float, float]]:
        """Runs one request's invocation under admission control (batched with others when
        the model has dynamic batching; a step of its sequence, with the request's
        `parameters`, when it has sequence batching): awaitable for (results, seconds
        queued, seconds invoking). `respond` as `Admission.infer`'s. (A plain function
        handing back its scheduler's coroutine: the request's task awaits one frame
        fewer.)"""
        if self.sequences is not None:
            return self.sequences.infer(args, parameters or {}, deadline, label, respond)
        rows = int(args[0].shape[0]) if self.max_batch_size else 1
        return self.admission.infer(args, rows, deadline, label, respond)

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

    async def unload(self) -> None:
        """Stops serving this version: new requests get 503 at once, every request
        admitted before finishes, then the instance threads end and the modules close
        (never under a running invocation). Its state becomes UNAVAILABLE, reason
        "unloaded"."""
        if self.state == "READY":
            self.state = "UNLOADING"
        if self.sequences is not None:
            self.sequences.close()
            await self.sequences.wait_idle()
        admission = self.admission
        if admission is not None:
            admission.close()
            await admission.wait_idle()
            admission.stop()
        modules, self.modules, self.module = self.modules, [], None
        for module in modules:
            await trio.to_thread.run_sync(module.close)
        self.state, self.reason, self.unloaded = "UNAVAILABLE", "unloaded", True
        log.info("unloaded model %s version %s", self.name, self.version)

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
        admission = self.admission
        config = {
            "name": self.name,
            "version": self.version,
            "platform": "tinyhal_vmfb",
            "backend": "tinyhal",
            "function": self.function,
            "device": self.device_name,
            "execution": self.execution,
            "instance_group": [{"count": admission.max_concurrency if admission else 0,
                                "kind": "KIND_CPU"}],
            "max_batch_size": self.max_batch_size,
            "dynamic_batching": self.batching.describe() if self.batching else None,
            "sequence_batching": self.sequence_config.describe() if self.sequence_config
            else None,
            "max_concurrency": admission.max_concurrency if admission else None,
            "max_queue": admission.max_queue if admission else None,
            "timeout_s": self.timeout_s,
            "peak_invocation_bytes": self.peak_invocation_bytes,
            "description": self.config.get("description", ""),
            "input": [s.metadata() for s in self.inputs],
            "output": [s.metadata() for s in self.outputs],
        }
        for scheduler in ("dynamic_batching", "sequence_batching"):
            if config[scheduler] is None:
                del config[scheduler]
        return config


def _instance_count(config: dict) -> int:
    """Executions a version runs at once: Triton's `instance_group` count (the sum over
    its groups), or `max_concurrency`, its older name here; default 1."""
    groups = config.get("instance_group")
    if groups is None:
        return _positive_int(config, "max_concurrency", DEFAULT_INSTANCES)
    if not isinstance(groups, list) or not groups or not all(
            isinstance(g, dict) and set(g) <= {"count", "kind"} for g in groups):
        raise ConfigError(f"config 'instance_group' must list objects with 'count' "
                          f"(and 'kind'), not {groups!r}")
    total = 0
    for group in groups:
        count = group.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"config 'instance_group' count must be an integer >= 1, "
                              f"not {count!r}")
        if group.get("kind", "KIND_CPU") not in ("KIND_CPU", "KIND_AUTO"):
            raise ConfigError(f"config 'instance_group' kind {group['kind']!r}: only "
                              f"KIND_CPU (or KIND_AUTO) runs here")
        total += count
    if "max_concurrency" in config and config["max_concurrency"] != total:
        raise ConfigError(f"config gives 'instance_group' ({total} instances) and "
                          f"'max_concurrency' {config['max_concurrency']!r}, the same "
                          f"setting: keep one")
    return total


def file_fingerprint(path: Path) -> tuple:
    """What tells a changed version from the one loaded (poll mode): its model file and
    the config files beside it and above it."""
    marks = []
    for file in (path, path.parent / "config.json", path.parent.parent / "config.json"):
        try:
            st = os.stat(file)
        except OSError:
            marks.append(None)
            continue
        marks.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(marks)


def freeze_heap() -> None:
    """Keeps what is alive now out of the cyclic garbage collector's scans (`gc.freeze`):
    a full collection otherwise walks every object of every loaded module and paused the
    event loop for up to 25 ms under load (p99 at 64 connections). Called whenever model
    versions loaded or unloaded; it first thaws and collects, so the cycles of a version
    that left are still freed."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _version_key(version: str) -> int:
    return int(version)  # version directories are all digits (others are skipped)


def version_policy(config: dict) -> tuple[str, Any]:
    """The model's `version_policy` as Triton spells it: {"latest": {"num_versions": N}}
    (the default, N = 1), {"all": {}} or {"specific": {"versions": [..]}}."""
    policy = config.get("version_policy", {"latest": {"num_versions": 1}})
    if not isinstance(policy, dict) or len(policy) != 1:
        raise ConfigError(f"config 'version_policy' must be one of {{\"latest\": "
                          f"{{\"num_versions\": N}}}}, {{\"all\": {{}}}}, {{\"specific\": "
                          f"{{\"versions\": [..]}}}}, not {policy!r}")
    (kind, value), = policy.items()
    if kind == "all" and value in ({}, None):
        return "all", None
    if kind == "latest" and isinstance(value, dict) and set(value) <= {"num_versions"}:
        n = value.get("num_versions", 1)
        if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
            return "latest", n
    if kind == "specific" and isinstance(value, dict) and set(value) == {"versions"}:
        versions = value["versions"]
        if isinstance(versions, list) and versions and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in versions):
            return "specific", {str(v) for v in versions}
    raise ConfigError(f"config 'version_policy' {policy!r} is not a valid policy "
                      f"(latest with num_versions >= 1, all, or specific with versions)")


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
    """

    def __init__(self, root: Path | str, default_device: str = "task", *,
                 executable_policy: str = "any") -> None:
        self.root = Path(root)
        self.default_device = default_device
        self.executable_policy = executable_policy  # of every device it creates
        self.models: dict[str, dict[str, ModelVersion]] = {}
        self.devices: dict[str, Any] = {}
        self.memory = DeviceMemory()
        self.retiring: set[ModelVersion] = set()  # replaced, finishing what they admitted
        self.token: trio.lowlevel.TrioToken | None = None  # set by the server at start
        self.python_cpu: int | None = None  # where single instance threads run (cpus.py)
        self._device_locks: dict[str, threading.Lock] = {}
        self._scan()

    def _scan(self) -> None:
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository {self.root} is not a directory")
        for name in self.model_names():
            versions = self._scan_model(self.root / name)
            if versions:
                self.models[name] = versions

    def model_names(self) -> list[str]:
        """The model directories of the repository, sorted."""
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and not p.name.startswith((".", "_")))

    def _scan_model(self, model_dir: Path) -> dict[str, ModelVersion]:
        """The versions of `model_dir` its version policy selects, not yet loaded."""
        try:
            model_config = _read_config(model_dir / "config.json")
            policy = version_policy(model_config)
        except ConfigError as exc:
            log.error("model %s: %s", model_dir.name, exc)
            model_config, policy = None, ("latest", 1)
        found: dict[str, Path] = {}
        for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir()):
            vmfb = version_dir / "model.vmfb"
            if not version_dir.name.isdigit():
                log.warning("model %s: skipping %s/: version directories are named by "
                            "integers", model_dir.name, version_dir.name)
                continue
            if not os.path.lexists(vmfb):
                found_names = sorted(p.name for p in version_dir.iterdir())
                log.warning("model %s version %s: no model.vmfb (found: %s); skipped",
                            model_dir.name, version_dir.name,
                            ", ".join(found_names) or "nothing")
                continue
            found[version_dir.name] = vmfb
        versions: dict[str, ModelVersion] = {}
        for version in _select_versions(policy, list(found)):
            mv = ModelVersion(model_dir.name, version, found[version], {},
                              self.default_device)
            try:
                if model_config is None:
                    raise ConfigError(f"{model_dir.name}/config.json is not valid")
                config = dict(model_config)
                config.update(_read_config(found[version].parent / "config.json"))
                config.pop("version_policy", None)
                mv.config = config
                device = config.get("device", self.default_device)
                if not isinstance(device, str):
                    raise ConfigError(f"config 'device' must be a driver name, not "
                                      f"{device!r}")
                mv.device_name = {"local-task": "task", "local-sync": "sync",
                                  "local-emu": "emu"}.get(device, device)
            except ConfigError as exc:
                mv.state, mv.reason = "UNAVAILABLE", str(exc)
            versions[version] = mv
        if not versions:
            log.warning("model %s: no version directory with a model.vmfb (that its "
                        "version policy selects); skipped", model_dir.name)
        return versions

    def scan_model(self, name: str) -> dict[str, ModelVersion]:
        """`name`'s versions as its directory holds them now (blocking; not loaded).
        ProtocolError 400 naming no path when there is nothing to load."""
        model_dir = self.root / name
        if not name or name.startswith((".", "_")) or "/" in name or "\\" in name or \
                not model_dir.is_dir():
            raise ProtocolError(400, f"failed to load '{name}': no such model directory "
                                     f"in the model repository")
        try:
            fresh = self._scan_model(model_dir)
        except OSError as exc:
            raise ProtocolError(400, f"failed to load '{name}': "
                                     f"{exc.strerror or type(exc).__name__}") from None
        if not fresh:
            raise ProtocolError(400, f"failed to load '{name}': no version directory with "
                                     f"a model.vmfb")
        return fresh

    async def reload(self, name: str, background: trio.Nursery, *, changed_only: bool = False
                     ) -> list[ModelVersion]:
        """Triton's repository `load` of one model: reads its directory again and loads
        every version its policy selects afresh (only those whose files changed, with
        `changed_only`), each next to the version it replaces, which is swapped out only
        once the new one loaded and then finishes what it admitted in `background`.
        A version that fails to load keeps its predecessor serving. Versions no longer
        selected unload once a selected one serves. Returns the versions that failed."""
        fresh = await trio.to_thread.run_sync(self.scan_model, name)
        current = self.models.get(name, {})
        to_load = [mv for v, mv in fresh.items()
                   if not (changed_only and v in current and current[v].ready
                           and current[v].fingerprint == file_fingerprint(mv.path))]
        failed = await trio.to_thread.run_sync(self.load_versions, to_load)
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

    async def unload_model(self, name: str) -> None:
        """Every version of `name` stops serving once what it admitted finished."""
        async with trio.open_nursery() as nursery:
            for mv in self.models[name].values():
                nursery.start_soon(mv.unload)
        freeze_heap()

    def _retire(self, mv: ModelVersion, background: trio.Nursery) -> None:
        self.retiring.add(mv)

        async def retire() -> None:
            try:
                await mv.unload()
            finally:
                self.retiring.discard(mv)
                freeze_heap()

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
        """Loads every version (blocking); returns those that failed."""
        return self.load_versions(self.all_versions())

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
            except (ConfigError, Error, OSError, ValueError) as exc:
                reason = str(exc).replace(str(self.root), "")
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
        if versions is None:
            raise ProtocolError(404, f"unknown model '{name}'")
        if not version:
            if len(versions) == 1:
                for mv in versions.values():
                    return mv
            ready = [mv for mv in versions.values() if mv.ready]
            return (ready or list(versions.values()))[-1]
        mv = versions.get(version)
        if mv is None:
            raise ProtocolError(404, f"unknown version '{version}' of model '{name}'")
        return mv

    def close(self) -> None:
        for mv in [*self.all_versions(), *self.retiring]:
            if mv.admission is not None:
                mv.admission.stop()
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
