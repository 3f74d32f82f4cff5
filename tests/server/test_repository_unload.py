"""An unloaded model version's modules are freed by reference counting: the server never
runs a collection of the whole heap (it holds the interpreter lock for tens of ms, the
event loop's time), so nothing of a module may be left in a reference cycle once it
unloaded.
Checked in a child process (it freezes its heap as the server does), for the bundled
samples: a stateless model on each device kind and a sequence model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from serve_helpers import SAMPLES

pytestmark = pytest.mark.timeout(120)

_CHILD = r"""
import gc, json, math, shutil, sys, tempfile
from pathlib import Path
import numpy as np
import trio
from tinyhal.server.repository import ModelRepository
from tinyhal.server.scheduling import Unavailable

samples, root = Path(sys.argv[1]), Path(tempfile.mkdtemp())
for name in ("mlp_classifier", "saxpy", "gru_step"):
    shutil.copytree(samples / name, root / name)
(root / "saxpy" / "config.json").write_text(json.dumps(
    {**json.loads((root / "saxpy" / "config.json").read_text()), "device": "sync"}))


async def main():
    repository = ModelRepository(root)
    repository.token = trio.lowlevel.current_trio_token()
    failed = await trio.to_thread.run_sync(repository.load_all)
    assert not failed, [mv.reason for mv in failed]
    report = {}
    for name in ("saxpy", "mlp_classifier", "gru_step"):
        version = repository.get(name)
        await repository.unload_model(name)
        try:  # a request checked against the version before it unloaded
            await version.infer([np.zeros((1, 1), np.float32)], math.inf, "late")
            late = "answered"
        except Unavailable as exc:
            late = str(exc)
        del repository.models[name]
        gc.unfreeze()  # what would be left to a collection of everything
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        garbage = list(gc.garbage)
        gc.set_debug(0)
        gc.garbage.clear()
        report[name] = {
            "objects": len(garbage),
            "bytes": sum(sys.getsizeof(o) for o in garbage),
            "vm": sorted({type(o).__qualname__ for o in garbage
                          if type(o).__module__.startswith("tinyhal.vm")}),
            "late": late,
            "device_bytes": sum(o.byte_length for o in garbage
                                if type(o).__qualname__ == "Buffer"
                                and type(o).__module__.startswith("tinyhal.hal")),
        }
        del garbage
        gc.collect()
        gc.freeze()
    await trio.to_thread.run_sync(repository.close)
    print(json.dumps(report))


trio.run(main)
"""


def test_an_unloaded_version_leaves_no_reference_cycle_of_its_module():
    done = subprocess.run([sys.executable, "-c", _CHILD, str(SAMPLES)], capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for name, left in report.items():
        # none of the module's objects (its bytecode, rodata, functions, context)
        assert left["vm"] == [], (name, left)
        # it admits nothing more: 503, not an error of a scheduler that is gone
        assert left["late"] == "the model version was unloaded", (name, left)
        # nor of its version and scheduler: a stopped scheduler detaches its callbacks
        assert left["objects"] == 0 and left["device_bytes"] == 0, (name, left)
