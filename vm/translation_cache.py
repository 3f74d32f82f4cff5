"""A per-user cache of the VM's translations, as Python caches bytecode in `__pycache__`.

One translation dominates start-up and is the same from one process to the next: a
module's bytecode functions translated into Python (`codegen.generate_module`), most of
`tinyhal.load`'s time on a real model. (The `hal` module's shims are plain functions
that Python's own bytecode cache keeps; making a `hal` module compiles nothing.)

A module's translation depends only on its FlatBuffer (functions, signatures, imports,
constants; never on the weights and executables stored after it) and on the translator
itself, so it is kept on disk under a key made of:

- the BLAKE2b hash of the module's FlatBuffer,
- tinyhal's version and the translator's source files (`vm/*.py`, `vm/scalar/`: name,
  size and modification time, as Python checks them for bytecode), so a changed
  translator never reads an old entry, also between releases,
- the Python implementation and version (code objects are stored with `marshal`),
- whether integer loops run natively (`TINYHAL_VM_NATIVE_LOOPS`).

Location: `$TINYHAL_VM_CACHE` if set, else `$XDG_CACHE_HOME/tinyhal/vm`, else
`~/.cache/tinyhal/vm`. `TINYHAL_VM_CACHE=off` (or `0`) turns the cache off. Entries are
written to a temporary file and renamed into place, so processes loading the same module
at the same time each see either no entry or a whole one; an entry that cannot be read is
translated again and replaced. Nothing is ever evicted: an entry is a few hundred KiB at
most, and the directory can be deleted at any time. Entries are unpickled, so the cache
directory must be as private as the user's `__pycache__` directories (it is created 0700).
"""

from __future__ import annotations

import linecache
import marshal
import os
import pickle
import sys
import threading
from _blake2 import blake2b  # not hashlib: that loads OpenSSL (3.5 MiB) at start-up
from collections.abc import Callable
from types import CodeType
from typing import Any

from .. import __version__
from . import scalar

__all__ = ["cache_directory", "translate"]

_FORMAT = 1
_translator_digest: list[str] = []
_loads = [0]


def cache_directory() -> str | None:
    """Where translations are kept, or None when the cache is off."""
    setting = os.environ.get("TINYHAL_VM_CACHE")
    if setting is not None:
        if setting.strip().lower() in ("", "0", "off", "false", "no"):
            return None
        return os.path.expanduser(setting)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tinyhal", "vm")


def _translator() -> str:
    """The identity of the translator's sources, once per process: each file's name, size
    and modification time (what Python checks before it reuses bytecode), so a changed
    source tree never reads entries of another, without reading the sources each start."""
    if not _translator_digest:
        digest = blake2b(digest_size=16)
        here = os.path.dirname(os.path.abspath(__file__))
        for folder in (here, os.path.join(here, "scalar")):
            with os.scandir(folder) as entries:
                for entry in sorted(entries, key=lambda e: e.name):
                    if entry.name.endswith((".py", ".c", ".h")):
                        info = entry.stat()
                        digest.update(f"{entry.name}|{info.st_size}|{info.st_mtime_ns}|"
                                      .encode())
        _translator_digest.append(digest.hexdigest())
    return _translator_digest[0]


def _key(flatbuffer: memoryview) -> str:
    digest = blake2b(digest_size=20)
    digest.update(flatbuffer)
    tag = (f"{_FORMAT}|{__version__}|{_translator()}|{sys.implementation.cache_tag}|"
           f"{sys.hexversion}|{marshal.version}|{int(scalar.enabled())}")
    digest.update(tag.encode())
    return digest.hexdigest()


def _renamed(code: CodeType, filename: str) -> CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, CodeType) else c
                   for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _adopt(program: Any, module_name: str) -> Any:
    """A program read from the cache, given a file name of its own in this process (the
    context maps tracebacks back to VM functions by it) and registered with linecache."""
    _loads[0] += 1
    filename = f"<tinyhal-vm:{module_name}#cached{_loads[0]}>"
    source = program.source
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return program.replaced(code=_renamed(program.code, filename), filename=filename)


def _read(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - missing, torn or foreign: a miss, rewritten later
        return None


def _write(path: str, entry: Any) -> None:
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(temporary, "wb") as f:
            pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temporary, path)
    except (OSError, pickle.PicklingError, ValueError, TypeError):
        # a read-only or full disk leaves the cache as it was; the load itself goes on
        try:
            os.unlink(temporary)
        except OSError:
            pass


def translate(module: Any, flatbuffer: memoryview, generate: Callable[[Any], Any]) -> Any:
    """`generate(module)` (a `codegen.ModuleProgram`), read from the cache when this module
    (by the hash of its FlatBuffer) was translated before by the same tinyhal and Python."""
    folder = cache_directory()
    if folder is None:
        return generate(module)
    path = os.path.join(folder, _key(flatbuffer) + ".pickle")
    entry = _read(path)
    if entry is not None:
        try:
            return _adopt(entry.replaced(code=marshal.loads(entry.code)), module.name)
        except Exception:  # noqa: BLE001 - an entry of another layout: translate again
            pass
    program = generate(module)
    _write(path, program.replaced(code=marshal.dumps(program.code)))
    return program

