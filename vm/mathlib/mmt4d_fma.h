/* f32 mmt4d as IREE's x86-64 tile functions compute it: per (k, k0) in order, one fused
 * multiply-add into each accumulator (fmaf rounds once, as the FMA instruction does).
 * Rows are `*_row_stride` floats apart; tiles are contiguous within a row. Shared by
 * the `vmvx` module's Python path (mathlib.c) and the C interpreter (vm/scalar). */
#ifndef TINYHAL_MMT4D_FMA_H_
#define TINYHAL_MMT4D_FMA_H_

#include <math.h>
#include <stdint.h>

static inline void tinyhal_mmt4d_f32_fma_tiles(
    const float* lhs, int64_t lhs_row_stride, const float* rhs, int64_t rhs_row_stride,
    float* out, int64_t out_row_stride, int64_t m, int64_t n, int64_t k, int64_t m0,
    int64_t n0, int64_t k0, int accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float* acc = out + i * out_row_stride + j * m0 * n0;
      if (!accumulate) {
        for (int64_t t = 0; t < m0 * n0; ++t) acc[t] = 0.0f;
      }
      for (int64_t kk = 0; kk < k; ++kk) {
        const float* a = lhs + i * lhs_row_stride + kk * m0 * k0;
        const float* b = rhs + j * rhs_row_stride + kk * n0 * k0;
        for (int64_t kk0 = 0; kk0 < k0; ++kk0) {
          for (int64_t r = 0; r < m0; ++r) {
            for (int64_t c = 0; c < n0; ++c) {
              acc[r * n0 + c] = fmaf(a[r * k0 + kk0], b[c * k0 + kk0], acc[r * n0 + c]);
            }
          }
        }
      }
    }
  }
}

#endif
