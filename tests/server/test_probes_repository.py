"""Probes of what a careless operator leaves in a model repository: symlink loops, a
FIFO or a device where a file belongs, a version directory that is a file or a link to
`/` or `..`, and a multi-gigabyte file that is not a module. Each is loaded through the
repository API of one server child (explicit model control) and answered 400 naming the
file and what is wrong, at once and without memory growth; the same repository in poll
mode starts and serves its good model."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from serve_helpers import SAMPLES, ServerProcess

pytestmark = pytest.mark.timeout(180)

_BODY = json.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 16],
                                "data": [0.5] * 16}]}).encode()
_SPARSE_BYTES = 2 << 30  # all holes: nothing on disk


def _version(root: Path, name: str) -> Path:
    version = root / name / "1"
    version.mkdir(parents=True)
    return version


def _module(root: Path, name: str) -> Path:
    version = _version(root, name)
    shutil.copyfile(SAMPLES / "mlp_classifier" / "1" / "model.vmfb", version / "model.vmfb")
    return version


def _build(root: Path) -> None:
    shutil.copytree(SAMPLES / "mlp_classifier", root / "mlp_classifier")
    os.symlink("loop", root / "loop")  # a model directory that is a symlink loop
    (root / "file_model").write_text("x")  # a file where a model directory belongs
    (root / "file_version").mkdir()
    (root / "file_version" / "1").write_text("x")
    (root / "root_version").mkdir()
    os.symlink("/", root / "root_version" / "1")
    os.symlink("..", _module(root, "parent_version").parent / "2")
    os.symlink("model.vmfb", _version(root, "module_loop") / "model.vmfb")
    os.symlink("/dev/zero", _version(root, "module_zero") / "model.vmfb")
    os.mkfifo(_version(root, "module_fifo") / "model.vmfb")
    with open(_version(root, "module_sparse") / "model.vmfb", "wb") as f:
        f.truncate(_SPARSE_BYTES)
    os.symlink("config.json", _module(root, "config_loop").parent / "config.json")
    os.mkfifo(_module(root, "config_fifo").parent / "config.json")
    os.symlink("/dev/zero", _module(root, "config_zero") / "config.json")
    shutil.copytree(_module(root, "removable"), root / "removable" / "2")
    (root / "removable" / "config.json").write_text(json.dumps(
        {"function": "predict", "max_batch_size": 64, "version_policy": {"all": {}}}))


# (model, status of its load, part of the error)
_PROBES = [
    ("loop", 400, "no such model directory"),
    ("file_model", 400, "no such model directory"),
    ("file_version", 400, "no version directory with a model.vmfb"),
    ("root_version", 400, "no version directory with a model.vmfb"),
    ("parent_version", 200, ""),  # version 2 (`..`) holds no model.vmfb: version 1 loads
    ("module_loop", 400, "Too many levels of symbolic links"),
    ("module_zero", 400, "module_zero/1/model.vmfb: module file: not a regular file"),
    ("module_fifo", 400, "module_fifo/1/model.vmfb: module file: not a regular file"),
    ("module_sparse", 400, "module_sparse/1/model.vmfb: not an IREE module"),
    ("config_loop", 400, "config_loop/config.json: Too many levels of symbolic links"),
    ("config_fifo", 400, "config_fifo/config.json: not a regular file"),
    ("config_zero", 400, "config_zero/1/config.json: not a regular file"),
]


@pytest.fixture(scope="module")
def careless_repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    _build(root)
    return root


@pytest.fixture(scope="module")
def explicit_server(careless_repository):
    server = ServerProcess("--model-repository", str(careless_repository),
                           "--model-control-mode", "explicit", "--load-model",
                           "mlp_classifier")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.mark.parametrize("model,status,message", _PROBES, ids=[p[0] for p in _PROBES])
def test_a_careless_repository_entry_is_refused_naming_it(explicit_server, model, status,
                                                          message):
    peak = explicit_server.status_bytes("VmHWM")
    got, _, payload = explicit_server.request("POST", f"/v2/repository/models/{model}/load",
                                              b"", timeout=120)
    assert got == status, payload
    if status != 200:
        assert message in json.loads(payload)["error"], payload
    # nothing was read into memory on its way to the refusal (the sparse file is 2 GiB)
    assert explicit_server.status_bytes("VmHWM") - peak < 64 << 20
    got, _, payload = explicit_server.request("POST", "/v2/models/mlp_classifier/infer",
                                              _BODY)
    assert got == 200, payload


def test_a_large_file_that_is_not_a_module_is_refused_before_it_is_read(explicit_server):
    """It was read whole first: a 3 GiB file of zeros took 37 s and 6.2 GB of memory
    before "malformed module". Its head says it is no module; that is read alone."""
    server = explicit_server
    peak = server.status_bytes("VmHWM")
    for _ in range(3):
        got, _, payload = server.request("POST", "/v2/repository/models/module_sparse/load",
                                         b"", timeout=120)
        assert got == 400 and b"not an IREE module" in payload, payload
    assert server.status_bytes("VmHWM") - peak < 64 << 20
    index = {m["name"]: m for m in json.loads(server.request(
        "POST", "/v2/repository/index", b"")[2])}
    assert index["module_sparse"]["state"] == "UNAVAILABLE"
    assert "not an IREE module" in index["module_sparse"]["reason"]


def test_the_careless_repository_in_poll_mode_serves_its_good_models(careless_repository):
    server = ServerProcess("--model-repository", str(careless_repository),
                           "--model-control-mode", "poll", "--repository-poll-secs", "1",
                           "--no-exit-on-error")
    try:
        server.start()
        server.wait_stderr(r"module_sparse/1/model\.vmfb: not an IREE module")
        for model in ("mlp_classifier", "parent_version"):
            got, _, payload = server.request("POST", f"/v2/models/{model}/infer", _BODY)
            assert got == 200, payload
        assert server.status_bytes("VmHWM") < 1 << 30  # the 2 GiB file was not read
        assert server.request("GET", "/metrics")[0] == 200
        assert server.proc.poll() is None
    finally:
        server.stop()


def test_version_directories_removed_under_a_loaded_model(explicit_server,
                                                          careless_repository):
    """A loaded version runs from memory: removing its directory changes nothing until
    the next load, which drops it; a load once the whole model directory is gone fails
    naming that and keeps what serves (as a failed reload does)."""
    server, root = explicit_server, careless_repository

    def infer(version: str) -> int:
        return server.request("POST", f"/v2/models/removable/versions/{version}/infer",
                              _BODY)[0]

    assert server.request("POST", "/v2/repository/models/removable/load", b"")[0] == 200
    assert infer("1") == infer("2") == 200
    shutil.rmtree(root / "removable" / "2")
    assert infer("2") == 200
    assert server.request("POST", "/v2/repository/models/removable/load", b"")[0] == 200
    assert (infer("1"), infer("2")) == (200, 404)
    shutil.rmtree(root / "removable")
    status, _, payload = server.request("POST", "/v2/repository/models/removable/load", b"")
    assert status == 400 and b"no such model directory" in payload, payload
    assert infer("1") == 200
    assert server.request("POST", "/v2/repository/models/removable/unload", b"")[0] == 200
    assert infer("1") == 503


def test_a_model_directory_swapped_under_a_poll_keeps_the_server_whole(tmp_path):
    """An operator replacing a model's directory (rename away, copy in another model,
    sometimes half-copied first) again and again while clients infer: every answer is
    a 200 or a 4xx/503 naming why (never a 500 or a dropped connection), and once the
    swaps stop the poll serves what the directory holds last."""
    root, spare = tmp_path / "repo", tmp_path / "spare"
    root.mkdir()
    shutil.copytree(SAMPLES / "mlp_classifier", root / "m")
    shutil.copytree(SAMPLES / "mlp_classifier", spare / "mlp")
    shutil.copytree(SAMPLES / "saxpy", spare / "saxpy")
    server = ServerProcess("--model-repository", str(root), "--model-control-mode", "poll",
                           "--repository-poll-secs", "0.1", "--no-exit-on-error")
    stop = threading.Event()
    unexpected: list = []

    def client() -> None:
        while not stop.is_set():
            try:
                status, _, payload = server.request("POST", "/v2/models/m/infer", _BODY)
            except OSError as exc:
                unexpected.append(repr(exc))
                continue
            if status not in (200, 400, 404, 503):
                unexpected.append((status, payload[:200]))

    try:
        server.start()
        clients = [threading.Thread(target=client) for _ in range(2)]
        for c in clients:
            c.start()
        for n in range(150):
            os.rename(root / "m", root / f".old{n}")
            if n % 5 == 0:  # half-copied: a version directory without its model yet
                (root / "m" / "1").mkdir(parents=True)
                shutil.rmtree(root / "m")
            shutil.copytree(spare / ("saxpy" if n % 3 else "mlp"), root / "m")
            shutil.rmtree(root / f".old{n}")
        stop.set()
        for c in clients:
            c.join(timeout=60)
        assert unexpected == [], unexpected[:5]
        # the last copy (n = 149) is saxpy: the poll ends up serving it
        deadline = time.monotonic() + 60
        while True:
            status, _, payload = server.request("GET", "/v2/models/m")
            if status == 200 and json.loads(payload)["inputs"][0]["name"] == "alpha":
                break
            assert time.monotonic() < deadline, payload
            time.sleep(0.1)
        assert server.proc.poll() is None
    finally:
        stop.set()
        server.stop()
