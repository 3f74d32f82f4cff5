"""cffi build of `tinyhal.hal.native._dispatch`: the workgroup loop and library loading.

Run by setuptools at install time (`cffi_modules` in setup.py); `tinyhal.hal.native`
builds the same module into a cache directory when running from an uninstalled tree.
"""

from __future__ import annotations

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_NAME = "tinyhal.hal.native._dispatch"

CDEF = """
typedef int (*tinyhal_import_fn_t)(void* params, void* context, void* reserved);
typedef int (*tinyhal_import_thunk_t)(tinyhal_import_fn_t fn, void* params, void* context,
                                      void* reserved);
typedef struct { uint32_t version; const char* name; uint32_t features; int32_t sanitizer; }
    tinyhal_library_header_t;
typedef struct {
  const uint32_t* constants;
  tinyhal_import_thunk_t import_thunk;
  const tinyhal_import_fn_t* import_funcs;
  const void** import_contexts;
  uint64_t processor_data[8];
} tinyhal_environment_t;
typedef struct {
  uint32_t workgroup_size_x; uint32_t workgroup_size_y; uint16_t workgroup_size_z;
  uint16_t constant_count;
  uint32_t workgroup_count_x; uint32_t workgroup_count_y; uint16_t workgroup_count_z;
  uint8_t max_concurrency; uint8_t binding_count;
  const uint32_t* constants; void* const* binding_ptrs; const size_t* binding_lengths;
} tinyhal_dispatch_state_t;
typedef struct tinyhal_workgroup_state_t tinyhal_workgroup_state_t;
typedef int (*tinyhal_dispatch_fn_t)(const tinyhal_environment_t*,
                                     const tinyhal_dispatch_state_t*,
                                     const tinyhal_workgroup_state_t*);
typedef struct {
  uint64_t flags; uint16_t local_memory_pages; uint8_t constant_count; uint8_t binding_count;
  uint32_t workgroup_size_x; uint32_t workgroup_size_y; uint16_t workgroup_size_z;
  uint16_t parameter_count; ...;
} tinyhal_dispatch_attrs_t;
typedef struct { uint32_t count; const char* const* symbols; } tinyhal_import_table_t;
typedef struct {
  uint32_t count; const tinyhal_dispatch_fn_t* ptrs; const tinyhal_dispatch_attrs_t* attrs;
  const char* const* names; const char* const* tags; ...;
} tinyhal_export_table_t;
typedef struct { uint32_t count; } tinyhal_constant_table_t;
typedef struct {
  const tinyhal_library_header_t* header; tinyhal_import_table_t imports;
  tinyhal_export_table_t exports; tinyhal_constant_table_t constants; ...;
} tinyhal_library_t;

void* tinyhal_library_open(const char* path, char* err, size_t err_size);
const tinyhal_library_t* tinyhal_library_query(void* handle,
    const tinyhal_environment_t* environment, char* err, size_t err_size);
int tinyhal_library_close(void* handle);
int tinyhal_dispatch_workgroups(tinyhal_dispatch_fn_t fn,
    const tinyhal_environment_t* environment, const tinyhal_dispatch_state_t* state,
    uint32_t local_memory_size, uint32_t processor_id, uint64_t* cursor, uint64_t tile,
    uint64_t total, int* abort_flag, uint64_t* failed_index);
tinyhal_import_thunk_t tinyhal_import_thunk(void);
"""


def make_builder(module_name: str = MODULE_NAME) -> FFI:
    builder = FFI()
    builder.cdef(CDEF)
    with open(os.path.join(HERE, "dispatch.c")) as f:
        source = '#include "tinyhal_executable.h"\n' + f.read()
    builder.set_source(
        module_name,
        source,
        include_dirs=[HERE],
        libraries=["dl"],
        extra_compile_args=["-O2", "-std=c11", "-D_GNU_SOURCE"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
