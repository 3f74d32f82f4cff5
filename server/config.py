"""The model repository's configuration as one declared schema: every `config.json`,
every version directory name, every `initial_state` file and every `config` given to a
repository `load` goes through this module, and nothing else reads them.

The schema is written with pydantic v2 (`ModelConfig` and the models under it): a
declared, well-kept validator with a JSON parser of its own (`pydantic_core.from_json`,
jiter), so each bound is a line of the declaration rather than a hand-written check,
and the parser itself cannot be driven into recursion or unbounded numbers:

- files: regular files only (a FIFO, a device or a link to one is refused at once,
  without blocking), their size checked before a byte is read (`MAX_CONFIG_BYTES`;
  a state file must hold exactly the state's bytes);
- JSON: nesting is bounded by the parser (200 levels; the schema itself is 6 deep),
  integers beyond 4,300 digits, NaN and Infinity are refused as invalid JSON;
- every number has a range (`le=`, `ge=`), every string and list a length, every
  float is finite; unknown keys are refused; types are strict (no "8" for 8, no true
  for 1);
- the whole as well as each field: instances (summed over `instance_group`), a sequence
  model's slots and its state rows on the device, and program inputs named once by
  `control_input` and `state` (`ModelConfig._one_scheduler`,
  `SequenceBatching._distinct_names`).

A refusal is a `ConfigError` (a `ValueError`) on one line naming the file, the key and
the reason, e.g. `m/config.json: 'sequence_batching.oldest.max_queue_delay_microseconds':
must be <= 3600000000 (an integer of 401 digits)`.

Version directories are named by decimal integers (ASCII digits, at most 18 of them:
`²` or `٣` are not versions); the repository ignores those with leading zeros, as
Triton does.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pydantic_core
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from ..errors import Error
from ..vm.loader import read_module_file
from .batching import BatchingConfig
from .protocol import DATATYPES

__all__ = [
    "CONFIG_KEYS", "ConfigError", "ControlInput", "ModelConfig", "SequenceConfig", "StateSpec",
    "MAX_VERSION_DIGITS", "display_name", "is_version_name", "parse_batching_config",
    "parse_json_config",
    "parse_model_config", "parse_sequence_config", "read_config_file", "DEFAULT_IDLE_US",
    "MAX_CONFIG_BYTES",
]

MAX_CONFIG_BYTES = 1 << 20
MAX_BATCH = 1 << 16  # rows of one execution
MAX_INSTANCES = 256
MAX_QUEUE = 1 << 20
MAX_MICROSECONDS = 3_600_000_000  # an hour: delays and idle times
MAX_TIMEOUT_S = 86_400.0
MAX_NAMES = 4096  # inputs, outputs, states, parameter files
MAX_DIMS = 8
MAX_DIM = 1 << 24
MAX_STATE_ROW_BYTES = 64 << 20  # one sequence's state of one kind
# every state row a sequence model keeps on its device at once (its slots, or a batch's
# rows when those are more), over all its states: allocated when the model loads
MAX_STATE_BYTES = 1 << 30
MAX_VERSION_DIGITS = 18  # versions fit an int64, as Triton's

CONTROL_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END",
                 "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_CORRID")
DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds
_FALSE_TRUE = {"int32_false_true": np.int32, "fp32_false_true": np.float32,
               "bool_false_true": np.bool_}
_VERSION = re.compile(r"[0-9]{1,%d}" % MAX_VERSION_DIGITS)


class ConfigError(ValueError):
    """A configuration the schema refuses: one line naming the file, key and reason."""


# -- the schema --------------------------------------------------------------------------

Name = Annotated[StrictStr, Field(min_length=1, max_length=256)]
FileName = Annotated[StrictStr, Field(min_length=1, max_length=255,
                                      pattern=r"^[^/\\\x00]+$")]
Micros = Annotated[StrictInt, Field(ge=0, le=MAX_MICROSECONDS)]
BatchSize = Annotated[StrictInt, Field(ge=1, le=MAX_BATCH)]
Dim = Annotated[StrictInt, Field(ge=1, le=MAX_DIM)]
TritonType = Literal[tuple(f"TYPE_{name}" for name in DATATYPES)]  # type: ignore[valid-type]
Int32 = Annotated[StrictInt, Field(ge=-(1 << 31), le=(1 << 31) - 1)]
Fp32 = Annotated[float, Field(ge=-3.4e38, le=3.4e38)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False,
                              strict=True, hide_input_in_errors=True)


class DynamicBatching(_Schema):
    max_queue_delay_microseconds: Micros = 0
    preferred_batch_size: list[BatchSize] = Field(default_factory=list, max_length=64)


class InstanceGroup(_Schema):
    """Triton's `instance_group`: `count` instances on the model's device. `name` is
    taken as Triton's config shows it (a label); KIND_MODEL, which leaves placement to
    the model, is the model's `device` as KIND_CPU and KIND_AUTO are."""

    name: Annotated[StrictStr, Field(max_length=256)] = ""
    count: Annotated[StrictInt, Field(ge=1, le=MAX_INSTANCES)] = 1
    kind: Literal["KIND_CPU", "KIND_AUTO", "KIND_MODEL"] = "KIND_CPU"


class _LatestVersions(_Schema):
    num_versions: Annotated[StrictInt, Field(ge=1, le=1 << 20)] = 1


class _AllVersions(_Schema):
    pass


class _SpecificVersions(_Schema):
    versions: list[Annotated[StrictInt, Field(ge=0, le=10**MAX_VERSION_DIGITS - 1)]] = \
        Field(min_length=1, max_length=MAX_NAMES)


class VersionPolicy(_Schema):
    """Triton's `version_policy`: exactly one of its three kinds."""

    latest: _LatestVersions | None = None
    all: _AllVersions | None = None
    specific: _SpecificVersions | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> VersionPolicy:
        if len(self.model_fields_set) != 1:
            raise ValueError("give one of 'latest', 'all' and 'specific'")
        if self.kind != "all" and getattr(self, self.kind) is None:
            raise ValueError(f"'{self.kind}' needs an object")
        return self

    @property
    def kind(self) -> str:
        """"latest", "all" or "specific" ("all" may be given as null)."""
        return next(iter(self.model_fields_set))


class Control(_Schema):
    kind: Literal[CONTROL_KINDS]  # type: ignore[valid-type]
    data_type: Literal["TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32"] | None = None
    int32_false_true: Annotated[list[Int32], Field(min_length=2, max_length=2)] | None = None
    fp32_false_true: Annotated[list[Fp32], Field(min_length=2, max_length=2)] | None = None
    bool_false_true: Annotated[list[StrictBool], Field(min_length=2, max_length=2)] | None \
        = None

    @model_validator(mode="after")
    def _values(self) -> Control:
        given = [k for k in _FALSE_TRUE if getattr(self, k) is not None]
        if self.kind == "CONTROL_SEQUENCE_CORRID":
            if self.data_type is None:
                raise ValueError("a CORRID control needs 'data_type' (an integer type)")
        elif len(given) != 1:
            raise ValueError(f"needs one of {list(_FALSE_TRUE)}")
        return self


class ControlInputConfig(_Schema):
    name: Name
    control: list[Control] = Field(min_length=1, max_length=1)


class InitialState(_Schema):
    name: Annotated[StrictStr, Field(max_length=256)] = ""
    data_type: TritonType | None = None
    dims: list[Dim] | None = Field(None, max_length=MAX_DIMS)
    zero_data: StrictBool | None = None
    data_file: FileName | None = None

    @model_validator(mode="after")
    def _one_source(self) -> InitialState:
        if (self.zero_data is None) == (self.data_file is None):
            raise ValueError("needs one of 'zero_data' and 'data_file'")
        return self


class StateConfig(_Schema):
    input_name: Name
    output_name: Name
    data_type: TritonType
    dims: list[Dim] = Field(min_length=0, max_length=MAX_DIMS)
    initial_state: list[InitialState] = Field(default_factory=list, max_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> StateConfig:
        for init in self.initial_state:
            if init.data_type is not None and init.data_type != self.data_type:
                raise ValueError("initial_state data_type differs from the state's")
            if init.dims is not None and init.dims != self.dims:
                raise ValueError(f"initial_state dims {init.dims} differ from the state's "
                                 f"{self.dims}")
        if self.row_bytes > MAX_STATE_ROW_BYTES:
            raise ValueError(f"a state of {self.row_bytes} bytes per sequence is over "
                             f"{MAX_STATE_ROW_BYTES}")
        return self

    @property
    def row_bytes(self) -> int:
        """One sequence's bytes of this state."""
        return DATATYPES[self.data_type[5:]].itemsize * math.prod(self.dims)


class Oldest(_Schema):
    max_candidate_sequences: BatchSize | None = None
    max_queue_delay_microseconds: Micros = 0
    preferred_batch_size: list[BatchSize] = Field(default_factory=list, max_length=64)


class Direct(_Schema):
    max_queue_delay_microseconds: Micros = 0
    minimum_slot_utilization: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0


class SequenceBatching(_Schema):
    # 0 is Triton's unset (proto3): its default, DEFAULT_IDLE_US
    max_sequence_idle_microseconds: Micros = DEFAULT_IDLE_US
    direct: Direct | None = None
    oldest: Oldest | None = None
    control_input: list[ControlInputConfig] = Field(default_factory=list, max_length=8)
    state: list[StateConfig] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _one_strategy(self) -> SequenceBatching:
        if self.direct is not None and self.oldest is not None:
            raise ValueError("takes one of 'direct' and 'oldest'")
        return self

    @model_validator(mode="after")
    def _distinct_names(self) -> SequenceBatching:
        """Each program input the server fills is filled one way: a name given twice
        (two states, two controls, a control and a state) left one of them unfilled."""
        inputs = [c.name for c in self.control_input] + [s.input_name for s in self.state]
        for kind, names in (("input", inputs), ("output", [s.output_name for s in
                                                             self.state])):
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    raise ValueError(f"the program {kind} '{name}' is named twice by "
                                     f"'control_input' and 'state'")
                seen.add(name)
        return self


# a file of the version directory, maybe in a folder of it (`_parameter_files` checks that
# it does not leave the directory)
ParameterFile = Annotated[StrictStr, Field(min_length=1, max_length=1024,
                                           pattern=r"^[^\x00]+$")]
ParameterFiles = Annotated[list[ParameterFile], Field(min_length=1, max_length=MAX_NAMES)]


class TensorShown(_Schema):
    """An input or output as the config endpoint shows it."""

    name: Name
    datatype: Literal[tuple(DATATYPES)]  # type: ignore[valid-type]
    shape: list[Annotated[StrictInt, Field(ge=-1, le=1 << 62)]] = Field(max_length=64)


class ModelConfig(_Schema):
    """A model's `config.json` (model level and version level alike; see
    repository.py for what each key means).

    It also takes what the config endpoint shows beside the settings, so that a
    configuration read from it loads as it is (Triton's get config, edit, load with
    `config`): `name` (the model's), `version` (the directory's: not a setting),
    `platform`, `backend`, `peak_invocation_bytes` (measured: not a setting), `input`
    and `output` (derived from the program: checked against it at load)."""

    name: Name | None = None
    version: Annotated[StrictStr, Field(pattern=r"^[0-9]{1,%d}$" % MAX_VERSION_DIGITS)] \
        | None = None
    platform: Literal["tinyhal_vmfb"] | None = None
    backend: Literal["tinyhal"] | None = None
    peak_invocation_bytes: Annotated[StrictInt, Field(ge=0, le=1 << 62)] | None = None
    input: list[TensorShown] | None = Field(None, max_length=MAX_NAMES)
    output: list[TensorShown] | None = Field(None, max_length=MAX_NAMES)

    function: Name | None = None
    device: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None
    max_batch_size: Annotated[StrictInt, Field(ge=0, le=MAX_BATCH)] = 0
    max_concurrency: Annotated[StrictInt, Field(ge=1, le=MAX_INSTANCES)] | None = None
    max_queue: Annotated[StrictInt, Field(ge=0, le=MAX_QUEUE)] = 16
    timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)] | None = None
    execution: Literal["async", "thread"] = "thread"
    input_names: list[Name] | None = Field(None, max_length=MAX_NAMES)
    output_names: list[Name] | None = Field(None, max_length=MAX_NAMES)
    description: Annotated[StrictStr, Field(max_length=1 << 16)] = ""
    dynamic_batching: DynamicBatching | None = None
    parameters: ParameterFile | dict[Annotated[StrictStr, Field(max_length=256)],
                                     ParameterFile | ParameterFiles] | None = None
    instance_group: list[InstanceGroup] | None = Field(None, min_length=1, max_length=64)
    version_policy: VersionPolicy | None = None
    sequence_batching: SequenceBatching | None = None

    @model_validator(mode="after")
    def _one_scheduler(self) -> ModelConfig:
        if self.dynamic_batching is not None and self.sequence_batching is not None:
            raise ValueError("takes one of 'dynamic_batching' and 'sequence_batching'")
        instances = self.max_concurrency or 1
        if self.instance_group is not None:
            instances = sum(g.count for g in self.instance_group)
            if instances > MAX_INSTANCES:  # each is a module and a thread of its own
                raise ValueError(f"'instance_group' counts add up to {instances} "
                                 f"instances; at most {MAX_INSTANCES}")
            if self.max_concurrency is not None and self.max_concurrency != instances:
                raise ValueError("'instance_group' and 'max_concurrency' are the same "
                                 "setting: keep one")
        sequences = self.sequence_batching
        if sequences is not None:
            slots = self.max_batch_size * instances if sequences.oldest is None else \
                sequences.oldest.max_candidate_sequences or self.max_batch_size
            if slots > MAX_BATCH:  # each slot is kept, free or held, from the load on
                raise ValueError(f"'sequence_batching.direct' holds max_batch_size x "
                                 f"instances = {slots} sequence slots; at most {MAX_BATCH}")
        if sequences is not None and sequences.state:
            rows = max(slots, self.max_batch_size)
            held = rows * sum(s.row_bytes for s in sequences.state)
            if held > MAX_STATE_BYTES:
                raise ValueError(f"'sequence_batching.state' holds {rows} rows of "
                                 f"{held // rows} bytes ({held} bytes) on the device; at "
                                 f"most {MAX_STATE_BYTES}")
        return self


CONFIG_KEYS = frozenset(ModelConfig.model_fields)  # the keys a config.json may hold


# -- reading -----------------------------------------------------------------------------


def display_name(name: str) -> str:
    """A directory name as text that can always be shown and encoded: bytes that are not
    UTF-8 (kept by Python as lone surrogates) become `\\xNN`."""
    try:
        name.encode()
        return name
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")


def is_version_name(name: str) -> bool:
    """Whether a directory name is a version: ASCII decimal digits, at most 18."""
    return _VERSION.fullmatch(name) is not None


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "tuple", "none"})

_ONE_FILE = "the program is always <version>/model.vmfb"
_NO_PRIORITIES = "requests are not prioritised: one queue per version, bounded by 'max_queue'"
# Triton's configuration keys this server does not take, by their path (list indices
# left out), and why: a Triton configuration carried over is refused naming the reason,
# not an "unknown key"
TRITON_NOT_OFFERED = {
    "model_warmup": "no warm-up requests: a version serves once its program loaded",
    "optimization": "Triton's optimization settings are for its GPU and accelerator "
                    "backends",
    "response_cache": "no response cache: every request runs",
    "model_transaction_policy": "no decoupled models: one answer per request",
    "ensemble_scheduling": "no ensembles",
    "default_model_filename": _ONE_FILE,
    "cc_model_filenames": _ONE_FILE,
    "metric_tags": "metrics are labelled by model and version",
    "model_repository_agents": "no repository agents",
    "model_operations": "no operation settings",
    "model_metrics": "no custom metrics",
    "runtime": "the runtime is tinyhal's",
    "batch_input": "no batch inputs: a request's inputs are the program's",
    "batch_output": "no batch outputs: a request's outputs are the program's",
    "dynamic_batching.priority_levels": _NO_PRIORITIES,
    "dynamic_batching.default_priority_level": _NO_PRIORITIES,
    "dynamic_batching.priority_queue_policy": _NO_PRIORITIES,
    "dynamic_batching.default_queue_policy": "the queue is bounded by 'max_queue' and "
                                             "requests by 'timeout_s'",
    "dynamic_batching.preserve_ordering": "each request is answered when its execution "
                                          "ends",
    "instance_group.gpus": "this server has no GPUs",
    "instance_group.secondary_devices": "this server has no GPUs",
    "instance_group.rate_limiter": "no rate limiter: an instance runs one execution at a "
                                   "time",
    "instance_group.host_policy": "no host policies",
    "instance_group.profile": "no TensorRT profiles",
    "instance_group.passive": "every instance serves",
    "sequence_batching.iterative_sequence": "no iterative sequences",
    "sequence_batching.generative_sequence": "no generative sequences",
    "sequence_batching.oldest.preserve_ordering": "a sequence's steps always run in order",
    **{f"{key}.{field}": "Triton's form of a tensor; here inputs and outputs are the "
                         "program's, shown as {name, datatype, shape} by the config "
                         "endpoint (leave them out)"
       for key in ("input", "output")
       for field in ("data_type", "dims", "format", "reshape", "optional",
                     "is_shape_tensor", "allow_ragged_batch", "label_filename")},
}
# values of a key Triton takes that this server does not, and why
_VALUES_NOT_OFFERED = {
    ("instance_group.kind", "KIND_GPU"): "this server has no GPUs",
    ("sequence_batching.control_input.control.data_type", "TYPE_STRING"):
        "a compiled program takes no string tensors (a model without a CORRID control "
        "takes string sequence ids)",
}


def _is_type_tag(part: object) -> bool:
    """Whether a part of a pydantic error location names a member of a union (a type,
    e.g. `constrained-str` or `list[...]`) rather than a key."""
    return isinstance(part, str) and ("[" in part or "-" in part or part in _TYPE_TAGS)


def _key_path(error: dict) -> str:
    """The keys of a pydantic error's location, without list indices and union tags."""
    return ".".join(p for p in error["loc"] if isinstance(p, str) and not _is_type_tag(p))


def _error_line(where: str, error: dict) -> str:
    loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in error["loc"]
                   if not _is_type_tag(p))
    loc = loc.replace(".[", "[")
    kind = error["type"]
    message = error["msg"]
    path = _key_path(error)
    if kind == "extra_forbidden":
        why = TRITON_NOT_OFFERED.get(path)
        message = f"a Triton setting not offered here: {why}" if why else "unknown key"
    elif path.startswith("parameters.") and isinstance(error.get("input"), dict) \
            and "string_value" in error["input"]:
        message = ("a Triton backend parameter ({'string_value': ...}) is not taken: "
                   "'parameters' names the program's parameter files (a file, or a list "
                   "of files per scope)")
    elif kind == "literal_error" and (path, error.get("input")) in _VALUES_NOT_OFFERED:
        message = (f"{error['input']} is not offered here: "
                   f"{_VALUES_NOT_OFFERED[path, error['input']]}; "
                   f"{message.replace('Input should be', 'must be')}")
    elif kind in ("less_than_equal", "greater_than_equal", "greater_than", "less_than"):
        bound = next(iter(error.get("ctx", {}).values()), "")
        sign = {"less_than_equal": "<=", "greater_than_equal": ">=", "greater_than": ">",
                "less_than": "<"}[kind]
        value = error.get("input")
        size = (f" (an integer of {len(str(abs(value)))} digits)"
                if type(value) is int and abs(value) > 10**18 else "")
        message = f"must be {sign} {bound}{size}"
    elif message.startswith("Value error, "):
        message = message[len("Value error, "):]
    message = message.replace("Input should be", "must be")
    text = f"{where}: '{loc}': {message}" if loc else f"{where}: {message}"
    return " ".join(text.split())


def _validate(schema: type[BaseModel], doc: Any, where: str, key: str = "") -> Any:
    """`doc` as `schema`; ConfigError naming `where`, the key (under `key`) and the
    reason."""
    if isinstance(doc, schema):
        return doc
    try:
        return schema.model_validate(doc)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # pydantic tries each member of a union: the deepest error says most, and of
        # those a Triton key this server does not take (its reason) says more
        first = max(errors, key=lambda e: (len(e["loc"]),
                                           _key_path(e) in TRITON_NOT_OFFERED))
        if key:
            first = {**first, "loc": (key, *first["loc"])}
        raise ConfigError(_error_line(where, first)) from None


def parse_json_config(text: bytes | str, where: str) -> dict:
    """The JSON object of one configuration, parsed without recursion or unbounded numbers
    (ConfigError naming `where` otherwise). Nothing is validated here beyond JSON."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: {len(text)} bytes, over the limit of {MAX_CONFIG_BYTES}")
    # a byte order mark, as editors on Windows write it: RFC 8259 lets a parser ignore it
    text = text.removeprefix(b"\xef\xbb\xbf" if isinstance(text, bytes) else "\ufeff")
    try:
        doc = pydantic_core.from_json(text, allow_inf_nan=False)
    except ValueError as exc:
        raise ConfigError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: must hold a JSON object")
    return doc


def read_config_file(path: Path, where: str) -> dict:
    """The raw object of `config.json` at `path` ({} when there is none), validated as a
    `ModelConfig` (so a bad file is refused at once, naming `where`)."""
    if not os.path.lexists(path):
        return {}
    try:
        data = bytes(read_module_file(path, limit=MAX_CONFIG_BYTES))
    except Error as exc:
        raise ConfigError(f"{where}: {_file_problem(exc, MAX_CONFIG_BYTES)}") from None
    doc = parse_json_config(data, where)
    _validate(ModelConfig, doc, where)
    return doc


def _file_problem(exc: Error, limit: int) -> str:
    message = exc.message
    if "over the limit" in message:
        return f"larger than {limit} bytes"
    return message.rsplit(": ", 1)[-1].replace("module file", "file")


def parse_model_config(doc: dict, where: str) -> ModelConfig:
    """`doc` (model-level config.json with the version's keys over it) as a ModelConfig;
    ConfigError on one line naming `where`, the key and the reason."""
    return _validate(ModelConfig, doc, where)


# -- what the schedulers take ------------------------------------------------------------


@dataclass(frozen=True)
class ControlInput:
    """A program input the server fills: `kind` (CONTROL_SEQUENCE_*), its false and true
    values (START, END, READY) or its datatype (CORRID)."""

    name: str
    kind: str
    dtype: np.dtype
    false_true: tuple[Any, Any] = (0, 1)


@dataclass(frozen=True)
class StateSpec:
    """One implicit state: the program input and output that carry it, and its start value
    (shape `dims`, without the batch dim)."""

    input_name: str
    output_name: str
    datatype: str  # V2 name, e.g. FP32
    dims: tuple[int, ...]
    initial: np.ndarray
    data_file: str | None = None  # where `initial` came from (None: zeros)

    @property
    def row_bytes(self) -> int:
        return self.initial.nbytes


@dataclass(frozen=True)
class SequenceConfig:
    max_sequence_idle_us: int
    strategy: str  # "oldest" | "direct"
    max_candidate_sequences: int
    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...]
    controls: tuple[ControlInput, ...]
    states: tuple[StateSpec, ...]
    # `direct`: the share of an instance's slots with a step ready at which a batch
    # runs without waiting out the queue delay (0: at once, as Triton's)
    minimum_slot_utilization: float = 0.0

    def describe(self) -> dict:
        strategy: dict[str, Any] = {"max_queue_delay_microseconds": self.max_queue_delay_us}
        if self.strategy == "oldest":
            strategy["max_candidate_sequences"] = self.max_candidate_sequences
            strategy["preferred_batch_size"] = list(self.preferred_batch_sizes)
        else:
            strategy["minimum_slot_utilization"] = self.minimum_slot_utilization
        return {
            "max_sequence_idle_microseconds": self.max_sequence_idle_us,
            self.strategy: strategy,
            "control_input": [{"name": c.name, "control": [_describe_control(c)]}
                              for c in self.controls],
            "state": [{"input_name": s.input_name, "output_name": s.output_name,
                       "data_type": "TYPE_" + s.datatype, "dims": list(s.dims),
                       "initial_state": [{"data_file": s.data_file} if s.data_file else
                                         {"zero_data": True}]}
                      for s in self.states],
        }


def _describe_control(control: ControlInput) -> dict:
    """A control as config.json gives it (what `parse_sequence_config` reads back)."""
    if control.kind == "CONTROL_SEQUENCE_CORRID":
        name = next(n for n, d in DATATYPES.items() if d == control.dtype)
        return {"kind": control.kind, "data_type": "TYPE_" + name}
    key = next(k for k, t in _FALSE_TRUE.items() if np.dtype(t) == control.dtype)
    return {"kind": control.kind, key: [v.item() if hasattr(v, "item") else v
                                        for v in control.false_true]}


def parse_batching_config(value: Any, max_batch_size: int) -> BatchingConfig | None:
    """`dynamic_batching` of a model config (None when absent); ConfigError naming the
    problem."""
    if value is None:
        return None
    doc = _validate(DynamicBatching, value, "config", "dynamic_batching")
    if max_batch_size <= 0:
        raise ConfigError("config 'dynamic_batching' needs 'max_batch_size' > 0")
    for size in doc.preferred_batch_size:
        if size > max_batch_size:
            raise ConfigError(f"config 'dynamic_batching.preferred_batch_size' {size} is "
                              f"over max_batch_size {max_batch_size}")
    return BatchingConfig(max_batch_size, doc.max_queue_delay_microseconds,
                          tuple(doc.preferred_batch_size))


def parse_sequence_config(value: Any, max_batch_size: int, version_dir: Path
                          ) -> SequenceConfig | None:
    """`sequence_batching` of a model config (None when absent), with each state's start
    value read from its `initial_state` file; ConfigError naming the field and the bound."""
    if value is None:
        return None
    doc = _validate(SequenceBatching, value, "config", "sequence_batching")
    if max_batch_size <= 0:
        raise ConfigError("config 'sequence_batching' needs 'max_batch_size' > 0 (the batch "
                          "dim indexes sequences)")
    strategy = "oldest" if doc.oldest is not None else "direct"
    body = doc.oldest if doc.oldest is not None else doc.direct or Direct()
    preferred = tuple(sorted(getattr(body, "preferred_batch_size", ())))
    for size in preferred:
        if size > max_batch_size:
            raise ConfigError(f"config 'sequence_batching.{strategy}.preferred_batch_size' "
                              f"{size} is over max_batch_size {max_batch_size}")
    candidates = getattr(body, "max_candidate_sequences", None) or max_batch_size
    controls = []
    for item in doc.control_input:
        ctl = item.control[0]
        if ctl.kind == "CONTROL_SEQUENCE_CORRID":
            controls.append(ControlInput(item.name, ctl.kind, DATATYPES[ctl.data_type[5:]]))
            continue
        key = next(k for k in _FALSE_TRUE if getattr(ctl, k) is not None)
        controls.append(ControlInput(item.name, ctl.kind, np.dtype(_FALSE_TRUE[key]),
                                     tuple(getattr(ctl, key))))
    states = []
    for i, item in enumerate(doc.state):
        datatype = item.data_type[5:]
        dims = tuple(item.dims)
        initial = np.zeros(dims, DATATYPES[datatype])
        data_file = None
        for init in item.initial_state:
            if init.data_file is not None:
                data_file = init.data_file
                initial = _initial_from_file(
                    init.data_file, version_dir, initial,
                    f"sequence_batching.state[{i}].initial_state[0].data_file")
        initial.setflags(write=False)
        states.append(StateSpec(item.input_name, item.output_name, datatype, dims, initial,
                                data_file))
    return SequenceConfig(doc.max_sequence_idle_microseconds or DEFAULT_IDLE_US, strategy,
                          candidates,
                          body.max_queue_delay_microseconds, preferred, tuple(controls),
                          tuple(states), getattr(body, "minimum_slot_utilization", 0.0))


def _initial_from_file(name: str, version_dir: Path, like: np.ndarray, what: str
                       ) -> np.ndarray:
    """Triton's `data_file`: the raw little-endian values of the state, in
    `<version>/initial_state/<name>`: a regular file of exactly the state's bytes (a FIFO
    or a device is refused without blocking, a larger file before it is read)."""
    if name.startswith("."):
        raise ConfigError(f"config '{what}' must be a file name, not {name!r}")
    path = version_dir / "initial_state" / name
    try:
        data = read_module_file(path, limit=like.nbytes)
    except Error as exc:
        raise ConfigError(f"config '{what}': cannot read initial_state/{name}: "
                          f"{_file_problem(exc, like.nbytes)}") from None
    if len(data) != like.nbytes:
        raise ConfigError(f"config '{what}': initial_state/{name} holds {len(data)} bytes, "
                          f"the state takes {like.nbytes}")
    return np.frombuffer(data, like.dtype.newbyteorder("<")).astype(like.dtype) \
        .reshape(like.shape)
