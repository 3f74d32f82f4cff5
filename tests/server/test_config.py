"""The model configuration schema (server/config.py): every number bounded, every file a
regular file of bounded size, nesting bounded, and each refusal one line naming the file,
the key and the reason. In-process and fast: no server is started here."""

from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from tinyhal.server.config import (
    ConfigError,
    ModelConfig,
    display_name,
    is_version_name,
    parse_model_config,
    parse_sequence_config,
    read_config_file,
)

pytestmark = pytest.mark.timeout(60)

HUGE = 10**400

SEQUENCE = {
    "max_sequence_idle_microseconds": 1000,
    "oldest": {"max_candidate_sequences": 4, "max_queue_delay_microseconds": 0,
               "preferred_batch_size": [2]},
    "control_input": [
        {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START",
                                       "int32_false_true": [0, 1]}]},
        {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END",
                                     "fp32_false_true": [0.0, 1.0]}]}],
    "state": [{"input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_FP32",
               "dims": [4], "initial_state": [{"data_type": "TYPE_FP32", "dims": [4],
                                               "zero_data": True}]}],
}

# every numeric field of the schema, as (path into a config, a valid document holding it)
NUMERIC_FIELDS = [
    ("max_batch_size", {}),
    ("max_concurrency", {}),
    ("max_queue", {}),
    ("timeout_s", {}),
    ("instance_group[0].count", {"instance_group": [{"count": 1}]}),
    ("dynamic_batching.max_queue_delay_microseconds",
     {"max_batch_size": 4, "dynamic_batching": {}}),
    ("dynamic_batching.preferred_batch_size[0]",
     {"max_batch_size": 4, "dynamic_batching": {"preferred_batch_size": [2]}}),
    ("version_policy.latest.num_versions", {"version_policy": {"latest": {}}}),
    ("version_policy.specific.versions[0]", {"version_policy": {"specific": {"versions": [1]}}}),
    ("sequence_batching.max_sequence_idle_microseconds", {"sequence_batching": SEQUENCE}),
    ("sequence_batching.oldest.max_candidate_sequences", {"sequence_batching": SEQUENCE}),
    ("sequence_batching.oldest.max_queue_delay_microseconds", {"sequence_batching": SEQUENCE}),
    ("sequence_batching.oldest.preferred_batch_size[0]", {"sequence_batching": SEQUENCE}),
    ("sequence_batching.control_input[0].control[0].int32_false_true[1]",
     {"sequence_batching": SEQUENCE}),
    ("sequence_batching.control_input[1].control[0].fp32_false_true[1]",
     {"sequence_batching": SEQUENCE}),
    ("sequence_batching.state[0].dims[0]", {"sequence_batching": SEQUENCE}),
    ("sequence_batching.state[0].initial_state[0].dims[0]", {"sequence_batching": SEQUENCE}),
    ("sequence_batching.direct.max_queue_delay_microseconds",
     {"sequence_batching": {"direct": {}}}),
    ("sequence_batching.direct.minimum_slot_utilization",
     {"sequence_batching": {"direct": {}}}),
    # shown by the config endpoint, taken back as they are shown
    ("peak_invocation_bytes", {}),
    ("input[0].shape[0]",
     {"input": [{"name": "x", "datatype": "FP32", "shape": [4]}]}),
    ("output[0].shape[0]",
     {"output": [{"name": "y", "datatype": "FP32", "shape": [4]}]}),
]


def _set(doc: dict, path: str, value) -> dict:
    doc = copy.deepcopy(doc)
    keys = []
    for part in path.split("."):
        name, *indexes = part.replace("]", "").split("[")
        keys.append(name)
        keys += [int(i) for i in indexes]
    target = doc
    for key in keys[:-1]:
        target = target[key]
    if isinstance(target, list) and keys[-1] == len(target):
        target.append(value)
    else:
        target[keys[-1]] = value
    return doc


def _numeric_paths(model: type, prefix: str = "") -> set[str]:
    """Every int or float field reachable in the schema (list items as [0])."""
    paths = set()
    for name, field in model.model_fields.items():
        paths |= _annotation_paths(field.annotation, f"{prefix}{name}")
    return paths


def _annotation_paths(annotation, path: str) -> set[str]:
    import typing

    from pydantic import BaseModel

    if annotation in (int, float):
        return {path}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _numeric_paths(annotation, path + ".")
    found = set()
    origin = typing.get_origin(annotation)
    for arg in typing.get_args(annotation):
        found |= _annotation_paths(arg, path + "[0]" if origin is list else path)
    return found


def test_the_list_covers_every_numeric_field_of_the_schema():
    listed = {p.replace("[1]", "[0]") for p, _ in NUMERIC_FIELDS}
    schema = _numeric_paths(ModelConfig)
    assert len(schema) >= 18 and schema <= listed, sorted(schema - listed)


@pytest.mark.parametrize("path, base", NUMERIC_FIELDS, ids=[p for p, _ in NUMERIC_FIELDS])
@pytest.mark.parametrize("value", [HUGE, -HUGE])
def test_huge_integers_in_every_numeric_field_are_one_line_naming_file_and_key(
        tmp_path: Path, path: str, base: dict, value: int):
    config = tmp_path / "m" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(_set(base, path, value)))
    with pytest.raises(ConfigError) as info:
        read_config_file(config, "m/config.json")
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith("m/config.json: ") and f"'{path}'" in message, message
    assert "must be" in message, message


def test_a_valid_document_with_every_field_passes():
    for _, base in NUMERIC_FIELDS:
        parse_model_config(base, "m/config.json")


@pytest.mark.parametrize("text, reason", [
    ("[" * 100_000 + "]" * 100_000, "recursion limit"),
    ('{"description": ' + "[" * 100_000, "recursion limit"),
    ('{"max_queue": 1' + "0" * 5000 + "}", "number out of range"),
    ('{"timeout_s": NaN}', "not valid JSON"),
    ('{"timeout_s": 1e400}', "'timeout_s'"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"max_queue": "8"}', "'max_queue': must be a valid integer"),
    ('{"max_queue": true}', "'max_queue': must be a valid integer"),
    ('{"bogus": 1}', "'bogus': unknown key"),
    ('{"version_policy": {"latest": null}}', "'latest' needs an object"),
    ('{"version_policy": {"all": {}, "latest": {}}}', "give one of"),
    ('{"sequence_batching": {"state": [{"input_name": "a", "output_name": "b", '
     '"data_type": "TYPE_FP32", "dims": [1], "initial_state": [{"dims": 3, '
     '"zero_data": true}]}]}}', "'sequence_batching.state[0].initial_state[0].dims'"),
    ('{"sequence_batching": {"state": [{"input_name": "a", "output_name": "b", '
     '"data_type": "TYPE_FP64", "dims": [4096, 4096]}]}}', "bytes per sequence"),
])
def test_malformed_documents_are_one_line(tmp_path: Path, text: str, reason: str):
    config = tmp_path / "config.json"
    config.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_config_file(config, "m/config.json")
    message = str(info.value)
    assert "\n" not in message and message.startswith("m/config.json: ")
    assert reason in message, message


def test_config_files_are_regular_files_of_bounded_size(tmp_path: Path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_config_file(fifo, "m/config.json")  # at once: a FIFO is never opened to block
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_config_file(zero, "m/config.json")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (2 << 20))
    with pytest.raises(ConfigError, match="larger than"):
        read_config_file(big, "m/config.json")


def _state_doc(data_file: str) -> dict:
    return {"oldest": {}, "state": [{"input_name": "a", "output_name": "b",
                                     "data_type": "TYPE_FP32", "dims": [4],
                                     "initial_state": [{"data_file": data_file}]}]}


def test_initial_state_fifo_and_dev_zero_are_refused_without_blocking(tmp_path: Path):
    folder = tmp_path / "initial_state"
    folder.mkdir()
    os.mkfifo(folder / "fifo")
    (folder / "zero").symlink_to("/dev/zero")
    (folder / "long").write_bytes(b"\0" * 4096)
    (folder / "good").write_bytes(np.arange(4, dtype="<f4").tobytes())
    results: dict[str, str] = {}

    def run() -> None:
        for name in ("fifo", "zero", "long"):
            try:
                parse_sequence_config(_state_doc(name), 4, tmp_path)
                results[name] = "accepted"
            except ConfigError as exc:
                results[name] = str(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "reading a state file blocked"
    assert "not a regular file" in results["fifo"]
    assert "not a regular file" in results["zero"]
    assert "larger than 16 bytes" in results["long"]
    config = parse_sequence_config(_state_doc("good"), 4, tmp_path)
    np.testing.assert_array_equal(config.states[0].initial, [0, 1, 2, 3])


@pytest.mark.parametrize("name, ok", [("1", True), ("0012", True), ("²", False),
                                      ("٣", False), ("1" * 19, False), ("-1", False),
                                      ("1.0", False), ("", False)])
def test_version_names_are_ascii_integers(name: str, ok: bool):
    assert is_version_name(name) is ok


def test_names_that_are_not_utf8_are_shown_escaped():
    name = os.fsdecode(b"caf\xe9")
    shown = display_name(name)
    assert shown == "caf\\xe9"
    shown.encode()  # always encodable
    assert display_name("plain") == "plain"
