"""The model repository: `DIR/<model>/<version>/model.vmfb`, loaded at start.

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
    max_concurrency   invocations running at once for this version (default 4)
    max_queue         requests waiting beyond that (default 16); more get 429
                      (with dynamic_batching: requests waiting to be batched)
    timeout_s         default deadline of a request in seconds (default: none)
    execution         "async" (Module.invoke_async on the event loop; default for task
                      and emu) or "thread" (Module.invoke in a worker thread; default for
                      sync, whose device runs everything inline on the calling thread)
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

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trio

from .. import load as load_module
from ..errors import Error
from .admission import Admission
from .batching import BatchingConfig, DynamicBatcher, parse_batching_config
from .memory import DeviceMemory
from .protocol import DATATYPES, InferRequest, ProtocolError, datatype_for_mlir
from .stats import ModelStatistics

log = logging.getLogger("tinyhal.server")

__all__ = ["ModelRepository", "ModelVersion", "TensorSpec", "bundled_models_dir"]

CONFIG_KEYS = {
    "function", "device", "max_batch_size", "max_concurrency", "max_queue", "timeout_s",
    "execution", "input_names", "output_names", "description", "dynamic_batching",
    "parameters",
}
DEFAULT_MAX_CONCURRENCY = 4
DEFAULT_MAX_QUEUE = 16


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


class ConfigError(Exception):
    pass


def _read_config(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
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
                raise ConfigError(f"config 'parameters': {name!r} is not inside {version_dir}")
        out[scope] = [str(version_dir / n) for n in names]
    return out


def _positive_int(config: dict, key: str, default: int, minimum: int = 1) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"config '{key}' must be an integer >= {minimum}, not {value!r}")
    return value


@dataclass
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
    execution: str = "async"
    admission: Admission | None = None
    batching: BatchingConfig | None = None
    batcher: DynamicBatcher | None = None
    stats: ModelStatistics = field(default_factory=ModelStatistics)
    load_seconds: float = 0.0
    unloaded: bool = False  # unloaded on request: not counted against server readiness
    memory: DeviceMemory | None = None
    device: Any = None
    peak_invocation_bytes: int | None = None  # most device memory one invocation held
    _thread_lock: threading.Lock | None = None

    @property
    def ready(self) -> bool:
        return self.state == "READY"

    # -- loading ---------------------------------------------------------------------

    def load(self, device: Any, device_lock: threading.Lock) -> None:
        """Loads the module onto `device` and derives the signature (blocking)."""
        start = time.perf_counter()
        config = self.config
        self.max_batch_size = _positive_int(config, "max_batch_size", 0, minimum=0)
        try:
            self.batching = parse_batching_config(config.get("dynamic_batching"),
                                                  self.max_batch_size)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        max_concurrency = _positive_int(config, "max_concurrency", DEFAULT_MAX_CONCURRENCY)
        max_queue = _positive_int(config, "max_queue", DEFAULT_MAX_QUEUE, minimum=0)
        timeout = config.get("timeout_s")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                timeout, (int, float)) or timeout <= 0):
            raise ConfigError(f"config 'timeout_s' must be a positive number, not {timeout!r}")
        self.timeout_s = timeout
        execution = config.get("execution", "thread" if self.device_name == "sync" else "async")
        if execution not in ("async", "thread"):
            raise ConfigError(f"config 'execution' must be 'async' or 'thread', not "
                              f"{execution!r}")
        self.execution = execution
        # A sync device runs each invocation inline on the calling thread; one at a time.
        self._thread_lock = device_lock if execution == "thread" else None

        self.device = device
        module = load_module(str(self.path), device=device,
                             parameters=_parameter_files(config, self.path.parent))
        try:
            self._derive_signature(module)
        except BaseException:
            module.close()
            raise
        self.module = module
        self.admission = Admission(max_concurrency, max_queue)
        if self.batching is not None:
            self.batcher = DynamicBatcher(self.batching, self.admission, self.invoke,
                                          self.stats.executed)
        self.load_seconds = time.perf_counter() - start
        self.state = "READY"

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
        if self.max_batch_size:
            for spec in self.inputs:
                if spec.scalar or not spec.shape or spec.shape[0] != -1:
                    raise ConfigError(
                        f"max_batch_size needs a dynamic first dim on every input; "
                        f"'{spec.name}' has shape {list(spec.shape)}")
        if self.batching is not None:
            for spec in self.outputs:
                if spec.scalar or not spec.shape or spec.shape[0] != -1:
                    raise ConfigError(
                        f"dynamic_batching needs a dynamic first dim on every output; "
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
            datatype = request.input_datatypes[spec.name]
            if datatype != spec.datatype:
                raise ProtocolError(400, f"input '{spec.name}' has datatype {datatype} but "
                                         f"model '{self.name}' expects {spec.datatype}")
            if spec.scalar:
                if array.size != 1 or array.ndim > 1:
                    raise ProtocolError(400, f"input '{spec.name}' is a scalar: shape [1] "
                                             f"(or []), not {list(array.shape)}")
                args.append(array.reshape(())[()])
                continue
            if len(array.shape) != len(spec.shape) or any(
                want != -1 and want != got for want, got in zip(spec.shape, array.shape)
            ):
                raise ProtocolError(400, f"input '{spec.name}' has shape {list(array.shape)} "
                                         f"but model '{self.name}' expects "
                                         f"{list(spec.shape)}")
            if self.max_batch_size and array.shape[0] > self.max_batch_size:
                raise ProtocolError(400, f"input '{spec.name}' has batch size "
                                         f"{array.shape[0]}, over max_batch_size "
                                         f"{self.max_batch_size} of model '{self.name}'")
            args.append(array)
        return args

    async def infer(self, args: list[Any], deadline: float, background: Any, label: str
                    ) -> tuple[list[tuple[str, str, np.ndarray]], float, float]:
        """Runs one request's invocation under admission control (batched with others when
        the model has dynamic batching): (results, seconds queued, seconds invoking)."""
        if self.batcher is not None:
            return await self.batcher.infer(args, deadline, background, label)
        times = [0.0, 0.0]
        rows = int(args[0].shape[0]) if self.max_batch_size else 1

        def started(queued: float) -> None:
            times[0] = queued

        async def call() -> Any:
            t0 = trio.current_time()
            out = await self.invoke(args)
            times[1] = trio.current_time() - t0
            self.stats.executed(1, rows, times[1])
            return out

        results = await self.admission.run(call, deadline, background, started, label)
        return results, times[0], times[1]

    async def invoke(self, args: list[Any]) -> list[tuple[str, str, np.ndarray]]:
        """Runs the function; [(output name, datatype, array)]."""
        watch = self.memory.begin(self.device_name, self.device) if self.memory else None
        try:
            if self.execution == "async":
                result = await self.module.invoke_async(self.function, *args)
            else:
                result = await trio.to_thread.run_sync(self._invoke_blocking, args)
        finally:
            if watch is not None:
                held = self.memory.end(watch, self.device)
                if held is not None and held > (self.peak_invocation_bytes or 0):
                    self.peak_invocation_bytes = held
        values = result if isinstance(result, tuple) else (result,)
        if len(self.outputs) == 0:
            values = ()
        out = []
        for spec, value in zip(self.outputs, values):
            array = np.asarray(value)
            if spec.scalar:
                array = array.reshape((1,))
            dtype = DATATYPES[spec.datatype]
            if array.dtype != dtype:
                array = array.astype(dtype)
            out.append((spec.name, spec.datatype, array))
        return out

    async def unload(self) -> None:
        """Stops serving this version: new requests get 503 at once, requests already
        admitted or queued finish, then the module closes (never under a running
        invocation). Its state becomes UNAVAILABLE, reason "unloaded"."""
        if self.state == "READY":
            self.state = "UNLOADING"
        admission = self.admission
        while admission is not None and (admission.running or admission.queued or (
                self.batcher is not None and self.batcher.queued)):
            await admission.wait_idle()
            await trio.sleep(0.005)
        module, self.module = self.module, None
        if module is not None:
            await trio.to_thread.run_sync(module.close)
        self.state, self.reason, self.unloaded = "UNAVAILABLE", "unloaded", True
        log.info("unloaded model %s version %s", self.name, self.version)

    def _invoke_blocking(self, args: list[Any]) -> Any:
        with self._thread_lock:
            return self.module.invoke(self.function, *args)

    def metadata(self, versions: list[str]) -> dict:
        return {
            "name": self.name,
            "versions": versions,
            "platform": "tinyhal_vmfb",
            "inputs": [s.metadata() for s in self.inputs],
            "outputs": [s.metadata() for s in self.outputs],
        }

    def describe_config(self) -> dict:
        admission = self.admission
        return {
            "name": self.name,
            "version": self.version,
            "platform": "tinyhal_vmfb",
            "backend": "tinyhal",
            "function": self.function,
            "device": self.device_name,
            "execution": self.execution,
            "max_batch_size": self.max_batch_size,
            "dynamic_batching": self.batching.describe() if self.batching else None,
            "max_concurrency": admission.max_concurrency if admission else None,
            "max_queue": admission.max_queue if admission else None,
            "timeout_s": self.timeout_s,
            "peak_invocation_bytes": self.peak_invocation_bytes,
            "description": self.config.get("description", ""),
            "input": [s.metadata() for s in self.inputs],
            "output": [s.metadata() for s in self.outputs],
        }


def _version_key(version: str) -> int:
    return int(version)  # version directories are all digits (others are skipped)


class ModelRepository:
    """Every model version under a directory, and the devices they run on."""

    def __init__(self, root: Path | str, default_device: str = "task") -> None:
        self.root = Path(root)
        self.default_device = default_device
        self.models: dict[str, dict[str, ModelVersion]] = {}
        self.devices: dict[str, Any] = {}
        self.memory = DeviceMemory()
        self._device_locks: dict[str, threading.Lock] = {}
        self._scan()

    def _scan(self) -> None:
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository {self.root} is not a directory")
        for model_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if model_dir.name.startswith((".", "_")):
                continue
            versions = self._scan_model(model_dir)
            if versions:
                self.models[model_dir.name] = versions

    def _scan_model(self, model_dir: Path) -> dict[str, ModelVersion]:
        versions: dict[str, ModelVersion] = {}
        for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir()):
            vmfb = version_dir / "model.vmfb"
            if not version_dir.name.isdigit():
                log.warning("model %s: skipping %s/: version directories are named by "
                            "integers", model_dir.name, version_dir.name)
                continue
            if not vmfb.exists():
                found = sorted(p.name for p in version_dir.iterdir())
                log.warning("model %s version %s: no model.vmfb in %s (found: %s); "
                            "skipped", model_dir.name, version_dir.name, version_dir,
                            ", ".join(found) or "nothing")
                continue
            mv = ModelVersion(model_dir.name, version_dir.name, vmfb, {}, self.default_device)
            try:
                config = _read_config(model_dir / "config.json")
                config.update(_read_config(version_dir / "config.json"))
                mv.config = config
                device = config.get("device", self.default_device)
                if not isinstance(device, str):
                    raise ConfigError(f"config 'device' must be a driver name, not "
                                      f"{device!r}")
                mv.device_name = {"local-task": "task", "local-sync": "sync",
                                  "local-emu": "emu"}.get(device, device)
            except ConfigError as exc:
                mv.state, mv.reason = "UNAVAILABLE", str(exc)
            versions[version_dir.name] = mv
        if not versions:
            log.warning("model %s: no version directory with a model.vmfb under %s; "
                        "skipped", model_dir.name, model_dir)
        return dict(sorted(versions.items(), key=lambda kv: _version_key(kv[0])))

    def rescan_model(self, name: str) -> tuple[list[ModelVersion], list[ModelVersion]]:
        """Reads `name`'s directory again for the model-repository extension's `load`:
        versions loaded stay as they are; new, failed and unloaded ones are made afresh
        (to be loaded); versions whose directory is gone are returned to be unloaded.
        Returns (to load, to unload). ProtocolError 400 when there is nothing to load."""
        model_dir = self.root / name
        if not name or name.startswith((".", "_")) or "/" in name or not model_dir.is_dir():
            raise ProtocolError(400, f"failed to load '{name}': no directory {name}/ in the "
                                     f"model repository")
        try:
            fresh = self._scan_model(model_dir)
        except OSError as exc:
            raise ProtocolError(400, f"failed to load '{name}': {exc}") from None
        if not fresh:
            raise ProtocolError(400, f"failed to load '{name}': no version directory with "
                                     f"a model.vmfb")
        current = self.models.get(name, {})
        merged = {v: (current[v] if v in current and current[v].ready else mv)
                  for v, mv in fresh.items()}
        removed = [mv for v, mv in current.items() if v not in fresh]
        self.models[name] = {**{v: mv for v, mv in current.items() if v not in fresh},
                             **merged}
        self.models[name] = dict(sorted(self.models[name].items(),
                                        key=lambda kv: _version_key(kv[0])))
        return [mv for mv in merged.values() if not mv.ready], removed

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

            device = self.devices[name] = create_device(name)
            self._device_locks[name] = threading.Lock()
        return device

    def load_all(self) -> list[ModelVersion]:
        """Loads every version (blocking); returns those that failed."""
        return self.load_versions(self.all_versions())

    def load_versions(self, versions: list[ModelVersion]) -> list[ModelVersion]:
        """Loads `versions` (blocking); returns those that failed."""
        failed = []
        for mv in versions:
            if mv.state == "UNAVAILABLE":
                failed.append(mv)
                log.error("model %s version %s: %s", mv.name, mv.version, mv.reason)
                continue
            log.info("loading model %s version %s from %s", mv.name, mv.version, mv.path)
            mv.memory = self.memory
            try:
                device = self.device(mv.device_name)
                mv.load(device, self._device_locks[mv.device_name])
            except (ConfigError, Error, OSError, ValueError) as exc:
                mv.state, mv.reason = "UNAVAILABLE", str(exc)
                failed.append(mv)
                log.error("model %s version %s failed to load: %s", mv.name, mv.version, exc)
                continue
            log.info("loaded model %s version %s (@%s, %d inputs, %d outputs) on %s in %.3f s",
                     mv.name, mv.version, mv.function, len(mv.inputs), len(mv.outputs),
                     mv.device_name, mv.load_seconds)
        return failed

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The version (the highest when `version` is None); ProtocolError 404 if none."""
        versions = self.models.get(name)
        if versions is None:
            raise ProtocolError(404, f"unknown model '{name}'; models: "
                                     f"{', '.join(self.models) or '(none)'}")
        if version is None or version == "":
            ready = [mv for mv in versions.values() if mv.ready]
            return (ready or list(versions.values()))[-1]
        mv = versions.get(version)
        if mv is None:
            raise ProtocolError(404, f"unknown version '{version}' of model '{name}'; "
                                     f"versions: {', '.join(versions)}")
        return mv

    def forget(self, mv: ModelVersion) -> None:
        """Drops an unloaded version whose directory is gone from the repository."""
        versions = self.models.get(mv.name, {})
        if versions.get(mv.version) is mv:
            del versions[mv.version]
        if not versions:
            self.models.pop(mv.name, None)

    def close(self) -> None:
        for mv in self.all_versions():
            if mv.module is not None:
                try:
                    mv.module.close()
                except Error:
                    pass
                mv.module = None
        for device in self.devices.values():
            try:
                device.close()
            except Error:
                pass
        self.devices.clear()
