"""Host-written kernels: C dispatch functions built with cffi into executable libraries.

`build_executable` takes C source written against `tinyhal_executable.h` (dispatch
functions with the ABI's signature), generates the library's export table and query
function, compiles it with cffi, and returns the library bytes, ready for
`Device.load_executable`. Builds are cached by the hash of their inputs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError
from .native import INCLUDE_DIR


@dataclass(frozen=True)
class KernelExport:
    """One exported dispatch function and the attributes the loader reports for it."""

    name: str
    workgroup_size: tuple[int, int, int] = (1, 1, 1)
    constant_count: int = 0
    binding_count: int = 0
    local_memory_pages: int = 0


def _export(e: str | KernelExport) -> KernelExport:
    return KernelExport(e) if isinstance(e, str) else e


def _table_source(library_name: str, exports: list[KernelExport]) -> str:
    names = ", ".join(f'"{e.name}"' for e in exports)
    ptrs = ", ".join(f"(tinyhal_dispatch_fn_t){e.name}" for e in exports)
    attrs = ", ".join(
        "{.flags = 0, .local_memory_pages = %d, .constant_count = %d, .binding_count = %d, "
        ".workgroup_size_x = %d, .workgroup_size_y = %d, .workgroup_size_z = %d}"
        % (e.local_memory_pages, e.constant_count, e.binding_count, *e.workgroup_size)
        for e in exports
    )
    return f"""
static const char* const tinyhal_export_names_[] = {{{names}}};
static const tinyhal_dispatch_fn_t tinyhal_export_ptrs_[] = {{{ptrs}}};
static const tinyhal_dispatch_attrs_t tinyhal_export_attrs_[] = {{{attrs}}};
static const tinyhal_library_header_t tinyhal_header_ = {{
    TINYHAL_LIBRARY_VERSION, "{library_name}", 0, 0}};
static const tinyhal_library_t tinyhal_library_ = {{
    &tinyhal_header_, {{0, NULL}},
    {{{len(exports)}, tinyhal_export_ptrs_, tinyhal_export_attrs_, NULL, NULL,
      tinyhal_export_names_, NULL, NULL, NULL, NULL}},
    {{0}}, {{0, NULL}}}};
__attribute__((visibility("default")))
const tinyhal_library_header_t** iree_hal_executable_library_query(
    uint32_t max_version, const tinyhal_environment_t* environment) {{
  (void)environment;
  return max_version == TINYHAL_LIBRARY_VERSION
             ? (const tinyhal_library_header_t**)&tinyhal_library_ : NULL;
}}
"""


def build_executable(c_source: str, exports: Sequence[str | KernelExport],
                     name: str = "host_kernels", extra_compile_args: Sequence[str] = (),
                     cache_dir: str | None = None) -> bytes:
    """Compiles `c_source` into an executable library and returns its bytes.

    `exports` names the dispatch functions in ordinal order (a `KernelExport` also sets
    workgroup size, constant and binding counts and local memory pages).
    """
    from cffi import FFI

    export_list = [_export(e) for e in exports]
    if not export_list:
        raise InvalidArgumentError("build_executable needs at least one export")
    for e in export_list:
        if not e.name.isidentifier():
            raise InvalidArgumentError(f"export name {e.name!r} is not a C identifier")
    if not name.isidentifier():
        raise InvalidArgumentError(f"library name {name!r} is not a C identifier")
    source = '#include "tinyhal_executable.h"\n' + c_source + _table_source(name, export_list)
    args = ["-O2", "-fvisibility=hidden", *extra_compile_args]
    key = hashlib.sha256("\0".join([source, *args]).encode()).hexdigest()[:20]
    root = cache_dir or os.environ.get("TINYHAL_BUILD_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "tinyhal", "kernels")
    os.makedirs(root, exist_ok=True)
    out = os.path.join(root, f"{name}_{key}.so")
    if not os.path.exists(out):
        ffi = FFI()
        ffi.cdef("")
        ffi.set_source(f"_{name}_{key}", source, include_dirs=[INCLUDE_DIR],
                       extra_compile_args=args)
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            try:
                built = ffi.compile(tmpdir=tmp)
            except Exception as exc:
                raise InvalidArgumentError(f"kernel source failed to compile: {exc}") from exc
            os.replace(built, out)
    with open(out, "rb") as f:
        return f.read()
