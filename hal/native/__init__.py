"""The compiled C helper (`_dispatch`): loaded from the install, or built on first use.

An installed tinyhal carries `_dispatch` built by setuptools. Running from a source tree
that was never built, the same cffi module is compiled once into a per-user cache keyed by
the hash of its sources, so the runtime works the same either way (`load_compiled`, which
the VM's own C module uses too).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Sequence
from types import ModuleType


def load_compiled(import_name: str, here: str, builder: ModuleType,
                  sources: Sequence[str]) -> ModuleType:
    """The installed cffi module `import_name`, or else the same module built once from
    `builder.make_builder` into the per-user cache, keyed by the hash of `sources` (file
    names in `here`)."""
    try:
        return importlib.import_module(import_name)
    except ImportError:
        pass
    digest = hashlib.sha256()
    for name in sources:
        with open(os.path.join(here, name), "rb") as f:
            digest.update(f.read())
    tag = digest.hexdigest()[:16]
    root = os.environ.get("TINYHAL_BUILD_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "tinyhal", "native"
    )
    out_dir = os.path.join(root, f"{tag}-py{sys.version_info[0]}{sys.version_info[1]}")
    os.makedirs(out_dir, exist_ok=True)
    module_name = f"_tinyhal{import_name.rsplit('.', 1)[-1]}_{tag}"
    found = [f for f in os.listdir(out_dir) if f.startswith(module_name) and f.endswith(".so")]
    if not found:
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            path = builder.make_builder(module_name).compile(tmpdir=tmp)
            final = os.path.join(out_dir, os.path.basename(path))
            os.replace(path, final)
            found = [os.path.basename(final)]
    spec = importlib.util.spec_from_file_location(module_name, os.path.join(out_dir, found[0]))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load() -> ModuleType:
    from . import build

    return load_compiled(build.MODULE_NAME, os.path.dirname(os.path.abspath(__file__)), build,
                         ("build.py", "dispatch.c", *build.HEADERS))


_module = _load()
ffi = _module.ffi
lib = _module.lib
INCLUDE_DIR = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(INCLUDE_DIR, "tinyhal_executable.h")

__all__ = ["ffi", "lib", "INCLUDE_DIR", "HEADER", "load_compiled"]
