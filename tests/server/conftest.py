"""Fixtures for the tinyhal-serve tests (helpers live in serve_helpers.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from serve_helpers import SAMPLES, SPIN_MLIR, ServerProcess, dtypes_mlir, write_model

from support.iree_tools import HOST_FLAGS, compile_mlir


@pytest.fixture(scope="session")
def spin_vmfb() -> Path:
    return compile_mlir(SPIN_MLIR, HOST_FLAGS)


@pytest.fixture(scope="session")
def dtypes_vmfb() -> Path:
    # iree-compile demotes f64 to f32 by default (the ABI would then say f32)
    return compile_mlir(dtypes_mlir(), [*HOST_FLAGS, "--iree-input-demote-f64-to-f32=false"])


@pytest.fixture(scope="session")
def repository(tmp_path_factory, spin_vmfb, dtypes_vmfb) -> Path:
    """The bundled samples plus test models (spin: 1 slot, 1 queued; dtypes)."""
    root = tmp_path_factory.mktemp("repo")
    for sample in ("mlp_classifier", "saxpy"):
        shutil.copytree(SAMPLES / sample, root / sample)
    write_model(root, "spin", spin_vmfb, {"max_concurrency": 1, "max_queue": 1})
    write_model(root, "dtypes", dtypes_vmfb)
    return root


@pytest.fixture
def start_server():
    """start_server(*args, ready=True, env=None) -> a running ServerProcess, stopped
    afterwards."""
    started: list[ServerProcess] = []

    def start(*args: str, ready: bool = True, env: dict | None = None) -> ServerProcess:
        server = ServerProcess(*args, env=env)
        started.append(server)
        return server.start(ready=ready)

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def server(repository):
    """One server over the test repository, shared by a module's tests."""
    proc = ServerProcess("--model-repository", str(repository), "--max-request-bytes",
                         str(1 << 20))
    try:
        yield proc.start()
    finally:
        proc.stop()


@pytest.fixture
def client(server):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(server.url, concurrency=8, network_timeout=60.0)
    try:
        yield c
    finally:
        c.close()
