/* Applies a C library math function over a contiguous float array, so that the `vmvx`
 * module's exp and log give exactly the C library's bits (IREE's kernels call expf and
 * logf per element) without a Python call per element. */
#include <math.h>
#include <stddef.h>

void tinyhal_expf_array(const float* in, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = expf(in[i]);
}

void tinyhal_logf_array(const float* in, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = logf(in[i]);
}
