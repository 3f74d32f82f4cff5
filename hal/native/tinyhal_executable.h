/* tinyhal_executable.h: the executable-library ABI (version 6) that tinyhal loads.
 *
 * Layout-compatible with IREE's executable libraries, so IREE-compiled executables and
 * kernels written against this header load through the same path. Host apps normally
 * write only dispatch functions and let `tinyhal.hal.build_executable` generate the
 * export table; the full table types are here for those who write it themselves.
 */
#ifndef TINYHAL_EXECUTABLE_H_
#define TINYHAL_EXECUTABLE_H_

#include <stddef.h>
#include <stdint.h>

#define TINYHAL_LIBRARY_VERSION 6u
#define TINYHAL_LOCAL_MEMORY_PAGE_SIZE 4096
#define TINYHAL_MAX_CONSTANTS 64
#define TINYHAL_MAX_BINDINGS 64

typedef struct tinyhal_library_header_t {
  uint32_t version;
  const char* name;
  uint32_t features;
  int32_t sanitizer;
} tinyhal_library_header_t;

typedef int (*tinyhal_import_fn_t)(void* params, void* context, void* reserved);
typedef int (*tinyhal_import_thunk_t)(tinyhal_import_fn_t fn, void* params, void* context,
                                      void* reserved);

typedef struct tinyhal_environment_t {
  const uint32_t* constants;
  tinyhal_import_thunk_t import_thunk;
  const tinyhal_import_fn_t* import_funcs;
  const void** import_contexts;
  uint64_t processor_data[8];
} tinyhal_environment_t;

typedef struct tinyhal_dispatch_state_t {
  uint32_t workgroup_size_x;
  uint32_t workgroup_size_y;
  uint16_t workgroup_size_z;
  uint16_t constant_count;
  uint32_t workgroup_count_x;
  uint32_t workgroup_count_y;
  uint16_t workgroup_count_z;
  uint8_t max_concurrency;
  uint8_t binding_count;
  const uint32_t* constants;
  void* const* binding_ptrs;
  const size_t* binding_lengths;
} tinyhal_dispatch_state_t;

typedef struct tinyhal_workgroup_state_t {
  uint32_t workgroup_id_x;
  uint32_t workgroup_id_y;
  uint16_t workgroup_id_z;
  uint16_t reserved;
  uint32_t processor_id;
  void* local_memory;
  uint32_t local_memory_size;
} tinyhal_workgroup_state_t;

/* A dispatch function: called once per workgroup; non-zero return fails the dispatch. */
typedef int (*tinyhal_dispatch_fn_t)(const tinyhal_environment_t* environment,
                                     const tinyhal_dispatch_state_t* dispatch_state,
                                     const tinyhal_workgroup_state_t* workgroup_state);

typedef struct tinyhal_dispatch_attrs_t {
  uint64_t flags;
  uint16_t local_memory_pages;
  uint8_t constant_count;
  uint8_t binding_count;
  uint32_t workgroup_size_x;
  uint32_t workgroup_size_y;
  uint16_t workgroup_size_z;
  uint16_t parameter_count;
  uint64_t reserved[5];
} tinyhal_dispatch_attrs_t;

typedef struct tinyhal_import_table_t {
  uint32_t count;
  const char* const* symbols;
} tinyhal_import_table_t;

typedef struct tinyhal_export_table_t {
  uint32_t count;
  const tinyhal_dispatch_fn_t* ptrs;
  const tinyhal_dispatch_attrs_t* attrs;
  const void* const* params;
  const void* occupancy;
  const char* const* names;
  const char* const* tags;
  const char* const* parameter_names;
  const void* source_locations;
  const void* stage_locations;
} tinyhal_export_table_t;

typedef struct tinyhal_constant_table_t {
  uint32_t count;
} tinyhal_constant_table_t;

typedef struct tinyhal_source_file_table_t {
  uint32_t count;
  const void* files;
} tinyhal_source_file_table_t;

typedef struct tinyhal_library_t {
  const tinyhal_library_header_t* header;
  tinyhal_import_table_t imports;
  tinyhal_export_table_t exports;
  tinyhal_constant_table_t constants;
  tinyhal_source_file_table_t sources;
} tinyhal_library_t;

#endif /* TINYHAL_EXECUTABLE_H_ */
