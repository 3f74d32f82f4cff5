"""The compiled C helpers: loaded from the install, or built on first use.

`_dispatch` (cffi: the workgroup loop, library loading, the native stream) and `_core` (a
CPython extension: the ready path of semaphores, fences and the transient ring; see
`core.c`). An installed tinyhal carries both, built by setuptools. Running from a source
tree that was never built, the same modules are compiled once into a per-user cache keyed
by the hash of their sources, so the runtime works the same either way (`load_compiled`,
which the VM's own C modules use too).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from types import ModuleType


def load_compiled(import_name: str, builder_name: str) -> ModuleType:
    """The installed compiled module `import_name`, or else the same module built once into
    the per-user cache by the builder in module `builder_name` (its
    `make_builder(name).compile(tmpdir=...)`, as cffi's builders answer it, keyed by the
    hash of its `SOURCES`).

    The builder module parses the C declarations (pycparser) as it is imported, tens of
    milliseconds, so it is imported only when the compiled module is missing: an
    installed tinyhal loads its extensions without building an FFI at all."""
    try:
        module = importlib.import_module(import_name)
    except ImportError:
        pass
    else:
        _warn_if_stale(module, builder_name)
        return module
    import hashlib
    import tempfile

    builder = importlib.import_module(builder_name)
    here = os.path.dirname(os.path.abspath(builder.__file__))
    digest = hashlib.sha256()
    for name in builder.SOURCES:
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


def _warn_if_stale(module: ModuleType, builder_name: str) -> None:
    """Warns when a compiled module built in place (an editable install) is older than
    the C sources or builder beside it: edited sources run only once rebuilt, and a stale
    module otherwise fails far from the cause (a changed C signature, a missing type).
    A second's slack, so files a wheel extracts together never count."""
    path = getattr(module, "__file__", None)
    if not path:
        return
    folder = os.path.dirname(path)
    builder_file = builder_name.rsplit(".", 1)[-1] + ".py"
    try:
        built = os.stat(path).st_mtime
        newer = [entry.name for entry in os.scandir(folder)
                 if (entry.name.endswith((".c", ".h")) or entry.name == builder_file)
                 and entry.stat().st_mtime > built + 1.0]
    except OSError:
        return
    if newer:
        warnings.warn(f"{module.__name__} is older than {', '.join(sorted(newer))}: "
                      "rebuild it (pip install -e .) to run the edited sources",
                      RuntimeWarning, stacklevel=3)


_module = load_compiled(__name__ + "._dispatch", __name__ + ".build")
ffi = _module.ffi
lib = _module.lib
core = load_compiled(__name__ + "._core", __name__ + ".core_build")
INCLUDE_DIR = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(INCLUDE_DIR, "tinyhal_executable.h")

__all__ = ["ffi", "lib", "core", "INCLUDE_DIR", "HEADER", "load_compiled"]
