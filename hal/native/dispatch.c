/* The workgroup loop and library loading: the only C in the runtime itself.
 *
 * Python calls in once per dispatch (or once per worker for a tiled dispatch) and these
 * loops call the kernel once per workgroup, so no Python runs per workgroup and cffi
 * releases the GIL for the whole grid.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define TINYHAL_HAVE_MXCSR 1
#endif

typedef const tinyhal_library_header_t** (*tinyhal_query_fn_t)(
    uint32_t max_version, const tinyhal_environment_t* environment);

static void tinyhal_set_error(char* err, size_t err_size, const char* what, const char* detail) {
  if (err && err_size) snprintf(err, err_size, "%s%s", what, detail ? detail : "");
}

void* tinyhal_library_open(const char* path, char* err, size_t err_size) {
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) tinyhal_set_error(err, err_size, "dlopen failed: ", dlerror());
  return handle;
}

const tinyhal_library_t* tinyhal_library_query(void* handle,
                                               const tinyhal_environment_t* environment,
                                               char* err, size_t err_size) {
  dlerror();
  tinyhal_query_fn_t query =
      (tinyhal_query_fn_t)dlsym(handle, "iree_hal_executable_library_query");
  if (!query) {
    tinyhal_set_error(err, err_size, "no iree_hal_executable_library_query symbol", NULL);
    return NULL;
  }
  const tinyhal_library_header_t** header = query(TINYHAL_LIBRARY_VERSION, environment);
  if (!header || !*header) {
    tinyhal_set_error(err, err_size,
                      "library does not provide executable-library version 6", NULL);
    return NULL;
  }
  return (const tinyhal_library_t*)header;
}

int tinyhal_library_close(void* handle) { return handle ? dlclose(handle) : 0; }

static int tinyhal_run_range(tinyhal_dispatch_fn_t fn, const tinyhal_environment_t* environment,
                             const tinyhal_dispatch_state_t* state,
                             tinyhal_workgroup_state_t* wg, uint64_t begin, uint64_t end,
                             uint64_t* failed_index) {
  const uint64_t cx = state->workgroup_count_x, cy = state->workgroup_count_y;
  const uint64_t plane = cx * cy;
  uint64_t z = begin / plane, rem = begin % plane;
  uint64_t y = rem / cx, x = rem % cx;
  for (uint64_t i = begin; i < end; ++i) {
    wg->workgroup_id_x = (uint32_t)x;
    wg->workgroup_id_y = (uint32_t)y;
    wg->workgroup_id_z = (uint16_t)z;
    int rc = fn(environment, state, wg);
    if (rc != 0) {
      if (failed_index) *failed_index = i;
      return rc;
    }
    if (++x == cx) {
      x = 0;
      if (++y == cy) {
        y = 0;
        ++z;
      }
    }
  }
  return 0;
}

/* Claims tiles of `tile` workgroups from *cursor until the grid of `total` is exhausted or
 * *abort_flag is set; any number of threads may run this concurrently on one dispatch. */
int tinyhal_dispatch_workgroups(tinyhal_dispatch_fn_t fn,
                                const tinyhal_environment_t* environment,
                                const tinyhal_dispatch_state_t* state,
                                uint32_t local_memory_size, uint32_t processor_id,
                                uint64_t* cursor, uint64_t tile, uint64_t total,
                                int* abort_flag, uint64_t* failed_index) {
  tinyhal_workgroup_state_t wg;
  memset(&wg, 0, sizeof(wg));
  wg.processor_id = processor_id;
  void* local_memory = NULL;
  if (local_memory_size) {
    size_t rounded = ((size_t)local_memory_size + 63u) & ~(size_t)63u;
    local_memory = aligned_alloc(64, rounded);
    if (!local_memory) return -12; /* ENOMEM, reported as RESOURCE_EXHAUSTED */
  }
  wg.local_memory = local_memory;
  wg.local_memory_size = local_memory_size;
  if (tile == 0) tile = 1;
#ifdef TINYHAL_HAVE_MXCSR
  unsigned int saved_csr = _mm_getcsr();
  _mm_setcsr(saved_csr | 0x8040u); /* flush-to-zero + denormals-are-zero */
#endif
  int rc = 0;
  for (;;) {
    if (abort_flag && __atomic_load_n(abort_flag, __ATOMIC_RELAXED)) break;
    uint64_t begin = __atomic_fetch_add(cursor, tile, __ATOMIC_RELAXED);
    if (begin >= total) break;
    uint64_t end = begin + tile < total ? begin + tile : total;
    rc = tinyhal_run_range(fn, environment, state, &wg, begin, end, failed_index);
    if (rc != 0) {
      if (abort_flag) __atomic_store_n(abort_flag, 1, __ATOMIC_RELAXED);
      break;
    }
  }
#ifdef TINYHAL_HAVE_MXCSR
  _mm_setcsr(saved_csr);
#endif
  free(local_memory);
  return rc;
}

/* The import thunk IREE's ABI asks the host for: calls an import with its context. */
static int tinyhal_import_thunk_impl(tinyhal_import_fn_t fn, void* params, void* context,
                                     void* reserved) {
  return fn(params, context, reserved);
}

tinyhal_import_thunk_t tinyhal_import_thunk(void) { return tinyhal_import_thunk_impl; }
