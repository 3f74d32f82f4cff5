"""cffi build of `tinyhal.hal.native._dispatch`: the workgroup loop and library loading.

Run by setuptools at install time (`cffi_modules` in setup.py); `tinyhal.hal.native`
builds the same module into a cache directory when running from an uninstalled tree.
"""

from __future__ import annotations

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_NAME = "tinyhal.hal.native._dispatch"

HEADERS = ("tinyhal_executable.h", "tinyhal_stream.h")
SOURCES = ("build.py", "dispatch.c", *HEADERS)  # what the build-on-first-use cache is keyed by


def _header_declarations() -> str:
    """The headers' type declarations, minus preprocessor lines, for `cdef`."""
    lines = []
    for name in HEADERS:
        with open(os.path.join(HERE, name)) as f:
            lines.extend(line for line in f if not line.lstrip().startswith("#"))
    return "".join(lines)


CDEF = _header_declarations() + """
void* tinyhal_library_open(const char* path, char* err, size_t err_size);
const tinyhal_library_t* tinyhal_library_query(void* handle,
    const tinyhal_environment_t* environment, char* err, size_t err_size);
int tinyhal_library_close(void* handle);
int tinyhal_dispatch_workgroups(tinyhal_dispatch_fn_t fn,
    const tinyhal_environment_t* environment, const tinyhal_dispatch_state_t* state,
    uint32_t local_memory_size, uint32_t processor_id, uint64_t* cursor, uint64_t tile,
    uint64_t total, int* abort_flag, uint64_t* failed_index);
tinyhal_import_thunk_t tinyhal_import_thunk(void);
void tinyhal_cpu_data(uint64_t* out, uint32_t count);
int tinyhal_install_fault_handler(void);
void tinyhal_last_fault_info(uint64_t* out);
const tinyhal_library_header_t** tinyhal_library_query_contained(void* query,
    uint32_t max_version, const tinyhal_environment_t* environment, int* fault_signal);
typedef struct tinyhal_pool_t tinyhal_pool_t;
tinyhal_pool_t* tinyhal_pool_create(uint32_t helper_count, uint64_t idle_spin_ns, int steer,
    uint32_t* started);
void tinyhal_pool_stop(tinyhal_pool_t* pool);
void tinyhal_pool_free(tinyhal_pool_t* pool);
int tinyhal_run_stream(tinyhal_pool_t* pool, tinyhal_op_t* ops, uint32_t count,
    tinyhal_stream_t* stream, uint32_t local_memory_size, uint64_t budget_ns, int* paused);
void tinyhal_stream_bind(tinyhal_op_t* ops, uint32_t count, tinyhal_stream_t* stream,
    const tinyhal_patch_t* patches, uint32_t patch_count, const uint64_t* slot_addresses,
    const uint64_t* slot_lengths, uint32_t participants, uint32_t tiles_per_participant);
int tinyhal_bind_and_run(tinyhal_pool_t* pool, tinyhal_op_t* ops, uint32_t count,
    tinyhal_stream_t* stream, const tinyhal_patch_t* patches, uint32_t patch_count,
    const uint64_t* slot_addresses, const uint64_t* slot_lengths, uint32_t participants,
    uint32_t tiles_per_participant, uint32_t local_memory_size, uint64_t* times,
    uint64_t budget_ns, int* paused);
"""


def make_builder(module_name: str = MODULE_NAME) -> FFI:
    builder = FFI()
    builder.cdef(CDEF)
    with open(os.path.join(HERE, "dispatch.c")) as f:
        source = '#include "tinyhal_stream.h"\n' + f.read()
    builder.set_source(
        module_name,
        source,
        include_dirs=[HERE],
        libraries=["dl", "pthread"],
        extra_compile_args=["-O2", "-std=c11", "-D_GNU_SOURCE"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
