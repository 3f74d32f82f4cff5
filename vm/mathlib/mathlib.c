/* Applies a C library math function over a contiguous float array, so that the `vmvx`
 * module's exp and log give exactly the C library's bits (IREE's kernels call expf and
 * logf per element) without a Python call per element. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "mmt4d_fma.h"

void tinyhal_expf_array(const float* in, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = expf(in[i]);
}

void tinyhal_logf_array(const float* in, float* out, size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = logf(in[i]);
}

void tinyhal_mmt4d_f32_fma(const float* lhs, int64_t lhs_row_stride, const float* rhs,
                           int64_t rhs_row_stride, float* out, int64_t out_row_stride,
                           int64_t m, int64_t n, int64_t k, int64_t m0, int64_t n0,
                           int64_t k0, int accumulate) {
  tinyhal_mmt4d_f32_fma_tiles(lhs, lhs_row_stride, rhs, rhs_row_stride, out, out_row_stride,
                              m, n, k, m0, n0, k0, accumulate);
}
