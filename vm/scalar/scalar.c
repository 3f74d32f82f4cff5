/* Native execution of VM functions: integer loops, and VMVX workgroup functions.
 *
 * The program is the function's bytecode re-laid by `tinyhal.vm.scalar` in 32-bit words:
 * each instruction is its opcode (IREE's opcode byte; 0x100 + the byte for the f32
 * extension set, as `OP_*` generated from `vm/isa.py` by build.py), then its fields in
 * layout order: one word per register (a 32-bit slot, or a ref register's index), one
 * per i32/f32 literal and two per i64 literal (low word first), branch targets as word
 * indices, branch operand lists as a count and (kind, src, dst) triples (kind 0: a 32-bit
 * slot; 1: a ref; 2: a ref moved out of `src`), register lists as a count and registers,
 * rodata ordinals as they are and the type of `list.get.ref` as 1 when a buffer matches
 * it. `return` carries a count and (register, is_i64) pairs; `call` (of a `vmvx`
 * operation only) its kernel number, a count and (kind, register) pairs (kind 0: an i32,
 * 1: an i64, 2: a ref), then its results' count and pairs alike. Block markers are dropped; a last word FELL_OFF_END stands after
 * the function's end, where a run that falls off it stops.
 *
 * Registers are IREE's: one bank of 32-bit slots in which an i64 fills two adjacent
 * slots and an f32 one (its bits), and branch operand lists copy 32-bit slots one after
 * another. Ref registers hold a handle: 0 is null, else an index into the run's table of
 * buffer spans (`heap_t`), which also names the one list a VMVX function sees, its
 * bindings.
 *
 * The run stops at a `return` (SCALAR_DONE, results written sign-extended), after
 * `budget` taken branches (SCALAR_BUDGET, `*pc` is where to resume, so the caller can
 * handle signals between slices) or before an operation the VM fails (SCALAR_TRAP, `*pc`
 * at that instruction: a faulting integer division, a null or mistyped ref, an access
 * out of a buffer's bounds or a store into a read-only one, an allocation over the
 * limit); the caller runs the Python translation, which raises the VM's own error. The
 * encoder validated every register, ordinal and target, so nothing here is checked twice.
 *
 * f32 arithmetic is the host's binary32 arithmetic, never contracted (build.py forbids
 * it), with x86's NaN rule for commutative ops made explicit as the Python translation
 * does (the first NaN operand, quieted); the C library functions are the ones the
 * Python translation binds (`tinyhal_scalar_set_math`).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mmt4d_fma.h"
#include "tinyhal_executable.h"
#include "tinyhal_scalar.h"

_Static_assert(sizeof(tinyhal_environment_t) ==
                   sizeof(((tinyhal_vmvx_entry_t*)0)->environment),
               "tinyhal_vmvx_entry_t.environment must hold a tinyhal_environment_t");

/* One buffer a ref register may name; the bindings list is a span with `is_list` set. */
typedef struct span_t {
  uint8_t* data;
  uint64_t length;
  uint32_t writable;
  uint32_t is_list;
} span_t;

/* The spans of one run: fixed ones first, then the run's own allocations (from
 * `owned_first` on), freed when the run ends. */
typedef struct heap_t {
  span_t* spans;
  uint32_t count;
  uint32_t capacity;
  uint32_t owned_first;
  uint32_t list_first;  /* the bindings list's elements: spans [list_first, + list_count) */
  uint32_t list_count;
  int spans_allocated;
  uint64_t max_allocation;
  uint32_t features;    /* which fused f32 mmt4d tiles IREE has on this host (see mmt4d) */
  const int32_t* tiles; /* IREE's matmul tiles on this host (see query_tile_sizes) */
} heap_t;

typedef float (*unary_fn)(float);
typedef float (*binary_fn)(float, float);
static tinyhal_scalar_math_t math_fns;

void tinyhal_scalar_set_math(const tinyhal_scalar_math_t* math) { math_fns = *math; }

static inline int64_t get64(const uint32_t* regs, int32_t slot) {
  int64_t v;
  memcpy(&v, regs + slot, 8);
  return v;
}

static inline void set64(uint32_t* regs, int32_t slot, int64_t v) {
  memcpy(regs + slot, &v, 8);
}

static inline float getf(const uint32_t* regs, int32_t slot) {
  float v;
  memcpy(&v, regs + slot, 4);
  return v;
}

static inline void setf(uint32_t* regs, int32_t slot, float v) { memcpy(regs + slot, &v, 4); }

/* x86's NaN for a commutative op: the first NaN operand, quieted, else the result. */
static inline float nan_first(float a, float b, float r) {
  if (a != a) return a + 0.0f;
  if (b != b) return b + 0.0f;
  return r;
}

static inline float unary(int which, float x) { return ((unary_fn)math_fns.unary[which])(x); }

static inline uint32_t remap(uint32_t* regs, int32_t* refs, const int32_t* code, uint32_t at) {
  uint32_t n = (uint32_t)code[at++];
  for (uint32_t i = 0; i < n; ++i, at += 3) {
    int32_t kind = code[at], src = code[at + 1], dst = code[at + 2];
    if (kind == 0) {
      regs[dst] = regs[src];
    } else {
      refs[dst] = refs[src];
      if (kind == 2 && src != dst) refs[src] = 0;
    }
  }
  return at;
}

static inline uint32_t clz32(uint32_t v) { return v ? (uint32_t)__builtin_clz(v) : 32; }
static inline uint64_t clz64(uint64_t v) { return v ? (uint64_t)__builtin_clzll(v) : 64; }

/* The span a ref register names for an access of `count` elements of 2**shift bytes from
 * element `index`, or NULL where the VM fails it (null, the list, out of bounds, or a
 * store into a read-only buffer). */
static inline span_t* reach(heap_t* heap, int32_t handle, int64_t index, uint64_t count,
                            int shift, int store) {
  if (handle <= 0) return NULL;
  span_t* span = &heap->spans[handle];
  if (span->is_list || (store && !span->writable) || index < 0) return NULL;
  uint64_t elements = span->length >> shift;
  if ((uint64_t)index > elements || count > elements - (uint64_t)index) return NULL;
  return span;
}

static int32_t allocate(heap_t* heap, int64_t length) {
  if (length < 0 || (uint64_t)length > heap->max_allocation) return -1;
  if (heap->count == heap->capacity) {
    uint32_t capacity = heap->capacity * 2;
    span_t* grown = malloc(sizeof(span_t) * capacity);
    if (!grown) return -1;
    memcpy(grown, heap->spans, sizeof(span_t) * heap->count);
    if (heap->spans_allocated) free(heap->spans);
    heap->spans = grown;
    heap->spans_allocated = 1;
    heap->capacity = capacity;
  }
  uint8_t* data = calloc(length ? (size_t)length : 1, 1);
  if (!data) return -1;
  span_t* span = &heap->spans[heap->count];
  span->data = data;
  span->length = (uint64_t)length;
  span->writable = 1;
  span->is_list = 0;
  return (int32_t)heap->count++;
}

static void release(heap_t* heap) {
  for (uint32_t i = heap->owned_first; i < heap->count; ++i) free(heap->spans[i].data);
  heap->count = heap->owned_first;
  if (heap->spans_allocated) free(heap->spans);
  heap->spans_allocated = 0;
}

/* -- the `vmvx` module's operations, for workgroup functions that call them ----------
 *
 * Each accepts and refuses exactly what `tinyhal.vm.vmvx` (the Python path) accepts and
 * refuses; a refusal traps, and the Python run reports the error. Results are computed
 * into a temporary first and then stored, as the Python path's numpy assignments do, so
 * overlapping operands give the same bits. Kernel numbers are `scalar.KERNELS`'s; each
 * reads its arguments at the positions the `vmvx` module's calling convention puts them. */

enum {
  K_ADD_F32, K_SUB_F32, K_MUL_F32, K_DIV_F32, K_ADD_I32, K_SUB_I32, K_MUL_I32, K_AND_I32,
  K_OR_I32, K_XOR_I32, K_SHL_I32, K_SHRU_I32, K_SHRS_I32, K_DIVS_I32, K_DIVU_I32,
  K_ABS_F32, K_NEG_F32, K_CEIL_F32, K_FLOOR_F32, K_EXP_F32, K_LOG_F32, K_RSQRT_F32,
  K_CTLZ_I32, K_COPY_X8, K_COPY_X16, K_COPY_X32, K_COPY_X64, K_FILL_X32, K_MMT4D, K_PACK,
  K_UNPACK, K_QUERY_TILE_SIZES
};

enum { MAX_KERNEL_ARGUMENTS = 20, FELL_OFF_END = 0xFF }; /* no opcode has this word */

static uint8_t empty_view[8];

/* As the Python path's `_view`: element (0, 0) of the (size0, size1) view of the buffer
 * `handle` names, strides in elements of 2**shift bytes, or NULL where it fails. */
static uint8_t* view2d(heap_t* heap, int64_t handle, int64_t offset, int64_t stride0,
                       int64_t stride1, int64_t size0, int64_t size1, int shift,
                       int writable) {
  const int64_t limit = (int64_t)1 << 32;
  if (handle <= 0 || (uint64_t)handle >= heap->count || heap->spans[handle].is_list)
    return NULL;
  span_t* span = &heap->spans[handle];
  if (offset < 0 || stride0 < 0 || stride1 < 0 || size0 < 0 || size1 < 0) return NULL;
  if (size0 >= limit || size1 >= limit || stride0 >= limit - 1 || stride1 >= limit - 1)
    return NULL;
  if (writable && !span->writable) return NULL;
  if (size0 == 0 || size1 == 0) return empty_view;
  unsigned __int128 end = ((unsigned __int128)(uint64_t)offset + (uint64_t)(size0 - 1) *
                           (uint64_t)stride0 + (uint64_t)(size1 - 1) * (uint64_t)stride1 + 1)
                          << shift;
  if (end > span->length) return NULL;
  if (writable && ((unsigned __int128)(uint64_t)size0 * (uint64_t)size1 << shift) >
                      span->length)
    return NULL;
  return span->data + ((uint64_t)offset << shift);
}

/* As `_tiled`: `rows` rows of `row_stride` elements, each a contiguous block of
 * d1 x d2 x d3 elements; *inner receives the block's element count. */
static uint8_t* tiled(heap_t* heap, int64_t handle, int64_t offset, int64_t row_stride,
                      int64_t rows, int64_t d1, int64_t d2, int64_t d3, int shift,
                      int writable, int64_t* inner) {
  if (d1 < 0 || d2 < 0 || d3 < 0) return NULL;
  unsigned __int128 product = (unsigned __int128)(uint64_t)d1 * (uint64_t)d2;
  if (product >> 64) return NULL;
  product *= (uint64_t)d3;
  if (product >= ((unsigned __int128)1 << 32)) return NULL;
  *inner = (int64_t)product;
  return view2d(heap, handle, offset, row_stride, 1, rows, *inner, shift, writable);
}

static inline uint32_t get_u32(const uint8_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline float get_f32(const uint8_t* p) { float v; memcpy(&v, p, 4); return v; }

/* add/sub/.../divu.2d: (lhs, offset, stride0, stride1) x 3, size0, size1. */
static int binary2d(heap_t* heap, int kernel, const int64_t* v) {
  int64_t n0 = v[12], n1 = v[13];
  uint8_t* lhs = view2d(heap, v[0], v[1], v[2], v[3], n0, n1, 2, 0);
  uint8_t* rhs = view2d(heap, v[4], v[5], v[6], v[7], n0, n1, 2, 0);
  uint8_t* out = view2d(heap, v[8], v[9], v[10], v[11], n0, n1, 2, 1);
  if (!lhs || !rhs || !out) return 1;
  if (n0 == 0 || n1 == 0) return 0;
  uint32_t* temp = malloc(sizeof(uint32_t) * (size_t)(n0 * n1));
  if (!temp) return 1;
  for (int64_t i = 0; i < n0; ++i) {
    for (int64_t j = 0; j < n1; ++j) {
      const uint8_t* pa = lhs + ((uint64_t)(i * v[2] + j * v[3]) << 2);
      const uint8_t* pb = rhs + ((uint64_t)(i * v[6] + j * v[7]) << 2);
      uint32_t a = get_u32(pa), b = get_u32(pb), r;
      float fa = get_f32(pa), fb = get_f32(pb), fr;
      switch (kernel) {
        case K_ADD_F32: fr = fa + fb; if (fr != fr) fr = nan_first(fa, fb, fr); memcpy(&r, &fr, 4); break;
        case K_SUB_F32: fr = fa - fb; memcpy(&r, &fr, 4); break;
        case K_MUL_F32: fr = fa * fb; if (fr != fr) fr = nan_first(fa, fb, fr); memcpy(&r, &fr, 4); break;
        case K_DIV_F32: fr = fa / fb; memcpy(&r, &fr, 4); break;
        case K_ADD_I32: r = a + b; break;
        case K_SUB_I32: r = a - b; break;
        case K_MUL_I32: r = a * b; break;
        case K_AND_I32: r = a & b; break;
        case K_OR_I32: r = a | b; break;
        case K_XOR_I32: r = a ^ b; break;
        case K_SHL_I32: r = a << (b & 31); break;
        case K_SHRU_I32: r = a >> (b & 31); break;
        case K_SHRS_I32: r = (uint32_t)((int32_t)a >> (b & 31)); break;
        case K_DIVS_I32:
          if (b == 0 || ((int32_t)b == -1 && (int32_t)a == INT32_MIN)) { free(temp); return 1; }
          r = (uint32_t)((int32_t)a / (int32_t)b);
          break;
        default: /* K_DIVU_I32 */
          if (b == 0) { free(temp); return 1; }
          r = a / b;
          break;
      }
      temp[i * n1 + j] = r;
    }
  }
  for (int64_t i = 0; i < n0; ++i)
    for (int64_t j = 0; j < n1; ++j)
      memcpy(out + ((uint64_t)(i * v[10] + j * v[11]) << 2), &temp[i * n1 + j], 4);
  free(temp);
  return 0;
}

/* abs/.../ctlz.2d and copy.2d.x*: (in, offset, stride0, stride1), (out, ...), size0, size1. */
static int unary2d(heap_t* heap, int kernel, const int64_t* v) {
  int shift = kernel == K_COPY_X8 ? 0 : kernel == K_COPY_X16 ? 1 : kernel == K_COPY_X64 ? 3 : 2;
  int64_t n0 = v[8], n1 = v[9];
  uint8_t* in = view2d(heap, v[0], v[1], v[2], v[3], n0, n1, shift, 0);
  uint8_t* out = view2d(heap, v[4], v[5], v[6], v[7], n0, n1, shift, 1);
  if (!in || !out) return 1;
  if (n0 == 0 || n1 == 0) return 0;
  size_t size = (size_t)1 << shift;
  uint8_t* temp = malloc(size * (size_t)(n0 * n1));
  if (!temp) return 1;
  for (int64_t i = 0; i < n0; ++i) {
    for (int64_t j = 0; j < n1; ++j) {
      const uint8_t* p = in + ((uint64_t)(i * v[2] + j * v[3]) << shift);
      uint8_t* t = temp + size * (size_t)(i * n1 + j);
      uint32_t bits = 0;
      float x = 0.0f;
      if (shift == 2) { memcpy(&bits, p, 4); memcpy(&x, p, 4); }
      switch (kernel) {
        case K_ABS_F32: bits &= 0x7FFFFFFFu; break;
        case K_NEG_F32: bits ^= 0x80000000u; break;
        case K_CEIL_F32: x = unary(MATH_CEIL, x); memcpy(&bits, &x, 4); break;
        case K_FLOOR_F32: x = unary(MATH_FLOOR, x); memcpy(&bits, &x, 4); break;
        case K_EXP_F32: x = unary(MATH_EXP, x); memcpy(&bits, &x, 4); break;
        case K_LOG_F32: x = unary(MATH_LOG, x); memcpy(&bits, &x, 4); break;
        case K_RSQRT_F32: x = 1.0f / unary(MATH_SQRT, x); memcpy(&bits, &x, 4); break;
        case K_CTLZ_I32: bits = clz32(bits); break;
        default: break; /* copies */
      }
      if (shift == 2) memcpy(t, &bits, 4); else memcpy(t, p, size);
    }
  }
  for (int64_t i = 0; i < n0; ++i)
    for (int64_t j = 0; j < n1; ++j)
      memcpy(out + ((uint64_t)(i * v[6] + j * v[7]) << shift), temp + size * (size_t)(i * n1 + j), size);
  free(temp);
  return 0;
}

/* fill.2d.x32: value, (out, offset, row stride), size0, size1. */
static int fill2d(heap_t* heap, const int64_t* v) {
  uint8_t* out = view2d(heap, v[1], v[2], v[3], 1, v[4], v[5], 2, 1);
  if (!out) return 1;
  uint32_t value = (uint32_t)v[0];
  for (int64_t i = 0; i < v[4]; ++i)
    for (int64_t j = 0; j < v[5]; ++j) memcpy(out + ((uint64_t)(i * v[3] + j) << 2), &value, 4);
  return 0;
}

/* Whether IREE's x86-64 microkernels have an f32 tile function (fused) for the tile. */
static int fused_tile(uint32_t features, int64_t m0, int64_t n0, int64_t k0) {
  int small = m0 == 1 || m0 == 2 || m0 == 4 || m0 == 8;
  if (k0 != 1) return 0;
  return ((features & 2) && n0 == 16 && (small || m0 == 16)) ||
         ((features & 1) && n0 == 8 && small);
}

/* mmt4d: (lhs, offset, row stride) x 3, m, n, k, m0, n0, k0, flags. */
static int mmt4d(heap_t* heap, uint32_t features, const int64_t* v) {
  int64_t m = v[9], n = v[10], k = v[11];
  int64_t m0 = (int32_t)v[12], n0 = (int32_t)v[13], k0 = (int32_t)v[14];
  uint32_t flags = (uint32_t)v[15], type = flags & 0xFF;
  int accumulate = (flags & 0x100) != 0;
  if ((type != 1 && type != 2) || m0 < 0 || n0 < 0 || k0 < 0) return 1;
  int in_shift = type == 1 ? 2 : 0;
  int64_t lhs_inner, rhs_inner, out_inner;
  uint8_t* lhs = tiled(heap, v[0], v[1], v[2], m, k, m0, k0, in_shift, 0, &lhs_inner);
  uint8_t* rhs = tiled(heap, v[3], v[4], v[5], n, k, n0, k0, in_shift, 0, &rhs_inner);
  uint8_t* out = tiled(heap, v[6], v[7], v[8], m, n, m0, n0, 2, 1, &out_inner);
  if (!lhs || !rhs || !out) return 1;
  if (type == 1 && fused_tile(features, m0, n0, k0)) {
    if (m > 0 && n > 0)
      tinyhal_mmt4d_f32_fma_tiles((const float*)lhs, v[2], (const float*)rhs, v[5],
                                  (float*)out, v[8], m, n, k, m0, n0, k0, accumulate);
    return 0;
  }
  if (m == 0 || out_inner == 0) return 0;
  size_t count = (size_t)(m * out_inner);
  uint32_t* temp = malloc(sizeof(uint32_t) * count);
  if (!temp) return 1;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t r = 0; r < m0; ++r) {
        for (int64_t c = 0; c < n0; ++c) {
          size_t at = (size_t)(i * out_inner + (j * m0 + r) * n0 + c);
          const uint8_t* o = out + ((uint64_t)(i * v[8] + (j * m0 + r) * n0 + c) << 2);
          if (type == 1) {
            float acc = accumulate ? get_f32(o) : 0.0f;
            for (int64_t kk = 0; kk < k; ++kk) {
              const float* a = (const float*)lhs + i * v[2] + kk * m0 * k0 + r * k0;
              const float* b = (const float*)rhs + j * v[5] + kk * n0 * k0 + c * k0;
              for (int64_t kk0 = 0; kk0 < k0; ++kk0) {
                float p = a[kk0] * b[kk0];
                acc = acc + p;
              }
            }
            memcpy(&temp[at], &acc, 4);
          } else {
            uint32_t acc = accumulate ? get_u32(o) : 0;
            for (int64_t kk = 0; kk < k; ++kk) {
              const int8_t* a = (const int8_t*)lhs + i * v[2] + kk * m0 * k0 + r * k0;
              const int8_t* b = (const int8_t*)rhs + j * v[5] + kk * n0 * k0 + c * k0;
              for (int64_t kk0 = 0; kk0 < k0; ++kk0)
                acc += (uint32_t)((int32_t)a[kk0] * (int32_t)b[kk0]);
            }
            temp[at] = acc;
          }
        }
      }
    }
  }
  for (int64_t i = 0; i < m; ++i)
    memcpy(out + ((uint64_t)(i * v[8]) << 2), temp + i * out_inner, (size_t)out_inner * 4);
  free(temp);
  return 0;
}

enum { TRANSPOSE_INNER = 0x100, TRANSPOSE_OUTER = 0x200 };

static int64_t smallest(int64_t a, int64_t b, int64_t c, int64_t d) {
  int64_t m = a < b ? a : b;
  m = m < c ? m : c;
  return m < d ? m : d;
}

static int element_shift(uint32_t type, int pack) {
  if (type == 1 || type == 3) return 2;
  if (type == 2 && pack) return 0;
  return -1;
}

/* pack: (in, offset, stride0, stride1), (out, offset, stride0, stride1), in size0/1,
 * out size0..3, padding value, flags. */
static int pack(heap_t* heap, const int64_t* v) {
  uint32_t flags = (uint32_t)v[15];
  int shift = element_shift(flags & 0xFF, 1);
  if (shift < 0) return 1;
  int64_t in0 = v[8], in1 = v[9], o0 = v[10], o1 = v[11], o2 = v[12], o3 = v[13];
  if (smallest(o0, o1, o2, o3) == 0) return 0;
  int64_t inner;
  uint8_t* src = view2d(heap, v[0], v[1], v[2], v[3], in0, in1, shift, 0);
  uint8_t* out = src ? tiled(heap, v[4], v[5], v[6], o0, o1, o2, o3, shift, 1, &inner) : NULL;
  if (!out) return 1;
  int outer_t = (flags & TRANSPOSE_OUTER) != 0, inner_t = (flags & TRANSPOSE_INNER) != 0;
  int64_t outer0 = outer_t ? o1 : o0, outer1 = outer_t ? o0 : o1;
  int64_t tile0 = inner_t ? o3 : o2, tile1 = inner_t ? o2 : o3;
  if ((unsigned __int128)(uint64_t)outer0 * (uint64_t)tile0 < (uint64_t)in0 ||
      (unsigned __int128)(uint64_t)outer1 * (uint64_t)tile1 < (uint64_t)in1)
    return 1;
  size_t size = (size_t)1 << shift, count = (size_t)(o0 * inner);
  uint8_t* temp = malloc(size * count);
  if (!temp) return 1;
  uint32_t padding = (uint32_t)v[14];
  for (int64_t i = 0; i < o0; ++i)
    for (int64_t j = 0; j < o1; ++j)
      for (int64_t p = 0; p < o2; ++p)
        for (int64_t q = 0; q < o3; ++q) {
          int64_t row = (outer_t ? j : i) * tile0 + (inner_t ? q : p);
          int64_t col = (outer_t ? i : j) * tile1 + (inner_t ? p : q);
          uint8_t* t = temp + size * (size_t)(i * inner + (j * o2 + p) * o3 + q);
          if (row < in0 && col < in1)
            memcpy(t, src + ((uint64_t)(row * v[2] + col * v[3]) << shift), size);
          else
            memcpy(t, &padding, size); /* little-endian: the low bytes */
        }
  for (int64_t i = 0; i < o0; ++i)
    memcpy(out + ((uint64_t)(i * v[6]) << shift), temp + size * (size_t)(i * inner),
           size * (size_t)inner);
  free(temp);
  return 0;
}

/* unpack: (in, offset, stride0, stride1), (out, offset, stride0, stride1), in size0..3,
 * out size0/1, flags. */
static int unpack(heap_t* heap, const int64_t* v) {
  uint32_t flags = (uint32_t)v[14];
  int shift = element_shift(flags & 0xFF, 0);
  if (shift < 0) return 1;
  int64_t i0 = v[8], i1 = v[9], i2 = v[10], i3 = v[11], n0 = v[12], n1 = v[13];
  uint8_t* out = view2d(heap, v[4], v[5], v[6], v[7], n0, n1, shift, 1);
  if (!out) return 1;
  if (smallest(i0, i1, i2, i3) == 0) return 0;
  int64_t inner;
  uint8_t* src = tiled(heap, v[0], v[1], v[2], i0, i1, i2, i3, shift, 0, &inner);
  if (!src) return 1;
  int outer_t = (flags & TRANSPOSE_OUTER) != 0, inner_t = (flags & TRANSPOSE_INNER) != 0;
  int64_t tile0 = inner_t ? i3 : i2, tile1 = inner_t ? i2 : i3;
  int64_t outer0 = outer_t ? i1 : i0, outer1 = outer_t ? i0 : i1;
  if ((unsigned __int128)(uint64_t)outer0 * (uint64_t)tile0 < (uint64_t)n0 ||
      (unsigned __int128)(uint64_t)outer1 * (uint64_t)tile1 < (uint64_t)n1)
    return 1;
  if (n0 == 0 || n1 == 0) return 0;
  size_t size = (size_t)1 << shift;
  uint8_t* temp = malloc(size * (size_t)(n0 * n1));
  if (!temp) return 1;
  for (int64_t r = 0; r < n0; ++r)
    for (int64_t c = 0; c < n1; ++c) {
      int64_t a = r / tile0, b = c / tile1, p = r % tile0, q = c % tile1;
      int64_t s0 = outer_t ? b : a, s1 = outer_t ? a : b;
      int64_t s2 = inner_t ? q : p, s3 = inner_t ? p : q;
      memcpy(temp + size * (size_t)(r * n1 + c),
             src + ((uint64_t)(s0 * v[2] + (s1 * i2 + s2) * i3 + s3) << shift), size);
    }
  for (int64_t r = 0; r < n0; ++r)
    for (int64_t c = 0; c < n1; ++c)
      memcpy(out + ((uint64_t)(r * v[6] + c * v[7]) << shift), temp + size * (size_t)(r * n1 + c), size);
  free(temp);
  return 0;
}

/* One call of a `vmvx` operation: non-zero where the VM fails it. */
/* query_tile_sizes.2d: size0, size1, flags -> the operand's two tile sizes, as IREE's
 * microkernels answer on this host (`tiles`: M0, K0, N0 for f32, for i8, and else). */
static int query_tile_sizes(const int32_t* tiles, const int64_t* v, int64_t* out) {
  uint32_t flags = (uint32_t)v[2], role = flags & 0xFF, operation = flags & 0xFF00;
  static const int roles[4][2] = {{0, 0}, {0, 1}, {2, 1}, {0, 2}}; /* lhs, rhs, result */
  if (role < 1 || role > 3 || !operation) return 1;
  const int32_t* tile = tiles + (operation == 0x100 ? 0 : operation == 0x200 ? 3 : 6);
  out[0] = tile[roles[role][0]];
  out[1] = tile[roles[role][1]];
  return 0;
}

/* One call of a `vmvx` operation: non-zero where the VM fails it. */
static int call_kernel(heap_t* heap, int kernel, const int64_t* v, int64_t* out) {
  if (kernel <= K_DIVU_I32) return binary2d(heap, kernel, v);
  if (kernel <= K_COPY_X64) return unary2d(heap, kernel, v);
  if (kernel == K_FILL_X32) return fill2d(heap, v);
  if (kernel == K_MMT4D) return mmt4d(heap, heap->features, v);
  if (kernel == K_PACK) return pack(heap, v);
  if (kernel == K_UNPACK) return unpack(heap, v);
  return query_tile_sizes(heap->tiles, v, out);
}

/* `call` at `pc` (a `vmvx` operation): its kernel, a count and (kind, register) pairs of
 * arguments, then of results. The word after it, or 0 where the VM fails the call. Kept
 * out of line, so the interpreter's loop stays small. */
__attribute__((noinline)) static uint32_t call(heap_t* heap, uint32_t* regs, int32_t* refs,
                                               const int32_t* code, uint32_t pc) {
  uint32_t n = (uint32_t)code[pc + 2], at = pc + 3;
  int64_t values[MAX_KERNEL_ARGUMENTS] = {0}, out[2] = {0, 0};
  for (uint32_t i = 0; i < n; ++i, at += 2) {
    int32_t kind = code[at], reg = code[at + 1];
    values[i] = kind == 0 ? (int64_t)(int32_t)regs[reg]
                : kind == 1 ? get64(regs, reg) : (int64_t)refs[reg];
  }
  if (call_kernel(heap, code[pc + 1], values, out)) return 0;
  uint32_t r = (uint32_t)code[at++];
  for (uint32_t i = 0; i < r; ++i, at += 2) {
    if (code[at] == 1) set64(regs, code[at + 1], out[i]);
    else regs[code[at + 1]] = (uint32_t)out[i];
  }
  return at;
}

/* Operand words of the instruction at pc, and register reads/writes by width. */
#define A (code[pc + 1])
#define B (code[pc + 2])
#define C (code[pc + 3])
#define D (code[pc + 4])
#define E (code[pc + 5])
#define S32(r) ((int32_t)regs[r])
#define U32(r) (regs[r])
#define S64(r) get64(regs, r)
#define U64(r) ((uint64_t)get64(regs, r))
#define F32(r) getf(regs, r)
#define PUT32(r, v) (regs[r] = (uint32_t)(v))
#define PUT64(r, v) set64(regs, r, (int64_t)(v))
#define PUTF(r, v) setf(regs, r, (v))
#define NEXT(words) pc += words; break
#define SIGNED_FAULT(W) (S##W(B) == 0 || (S##W(B) == -1 && S##W(A) == INT##W##_MIN))

/* The integer ops IREE has at both widths; shift amounts are i32 registers at both and
 * compares write an i32. Unsigned arithmetic wraps as the VM does. */
#define INT_CASES(W)                                                                      \
  case OP_CONST_I##W##_ZERO: PUT##W(A, 0); NEXT(2);                                        \
  case OP_SELECT_I##W: PUT##W(D, regs[A] ? U##W(B) : U##W(C)); NEXT(5);                    \
  case OP_ADD_I##W: PUT##W(C, U##W(A) + U##W(B)); NEXT(4);                                 \
  case OP_SUB_I##W: PUT##W(C, U##W(A) - U##W(B)); NEXT(4);                                 \
  case OP_MUL_I##W: PUT##W(C, U##W(A) * U##W(B)); NEXT(4);                                 \
  case OP_DIV_I##W##_S: if (SIGNED_FAULT(W)) goto trap; PUT##W(C, S##W(A) / S##W(B)); NEXT(4); \
  case OP_DIV_I##W##_U: if (U##W(B) == 0) goto trap; PUT##W(C, U##W(A) / U##W(B)); NEXT(4); \
  case OP_REM_I##W##_S: if (SIGNED_FAULT(W)) goto trap; PUT##W(C, S##W(A) % S##W(B)); NEXT(4); \
  case OP_REM_I##W##_U: if (U##W(B) == 0) goto trap; PUT##W(C, U##W(A) % U##W(B)); NEXT(4); \
  case OP_FMA_I##W: PUT##W(D, U##W(A) * U##W(B) + U##W(C)); NEXT(5);                      \
  case OP_NOT_I##W: PUT##W(B, ~U##W(A)); NEXT(3);                                          \
  case OP_AND_I##W: PUT##W(C, U##W(A) & U##W(B)); NEXT(4);                                 \
  case OP_OR_I##W: PUT##W(C, U##W(A) | U##W(B)); NEXT(4);                                  \
  case OP_XOR_I##W: PUT##W(C, U##W(A) ^ U##W(B)); NEXT(4);                                 \
  case OP_SHL_I##W: PUT##W(C, U##W(A) << (S32(B) & (W - 1))); NEXT(4);                     \
  case OP_SHR_I##W##_S: PUT##W(C, S##W(A) >> (S32(B) & (W - 1))); NEXT(4);                 \
  case OP_SHR_I##W##_U: PUT##W(C, U##W(A) >> (S32(B) & (W - 1))); NEXT(4);                 \
  case OP_CMP_EQ_I##W: PUT32(C, U##W(A) == U##W(B)); NEXT(4);                              \
  case OP_CMP_NE_I##W: PUT32(C, U##W(A) != U##W(B)); NEXT(4);                              \
  case OP_CMP_LT_I##W##_S: PUT32(C, S##W(A) < S##W(B)); NEXT(4);                           \
  case OP_CMP_LT_I##W##_U: PUT32(C, U##W(A) < U##W(B)); NEXT(4);                           \
  case OP_CMP_NZ_I##W: PUT32(B, U##W(A) != 0); NEXT(3);                                    \
  case OP_CTLZ_I##W: PUT##W(B, clz##W(U##W(A))); NEXT(3);                                  \
  case OP_ABS_I##W: PUT##W(B, S##W(A) < 0 ? 0 - U##W(A) : U##W(A)); NEXT(3);               \
  case OP_MIN_I##W##_S: PUT##W(C, S##W(B) < S##W(A) ? S##W(B) : S##W(A)); NEXT(4);         \
  case OP_MIN_I##W##_U: PUT##W(C, U##W(B) < U##W(A) ? U##W(B) : U##W(A)); NEXT(4);         \
  case OP_MAX_I##W##_S: PUT##W(C, S##W(A) < S##W(B) ? S##W(B) : S##W(A)); NEXT(4);         \
  case OP_MAX_I##W##_U: PUT##W(C, U##W(A) < U##W(B) ? U##W(B) : U##W(A)); NEXT(4);

/* buffer.load.*: (ref, i64 element index) -> register; `T` is the element type in memory. */
#define LOAD_CASE(OP, T, SHIFT, PUT)                                                      \
  case OP: {                                                                              \
    span_t* span = reach(heap, refs[A], S64(B), 1, SHIFT, 0);                             \
    if (!span) goto trap;                                                                 \
    T v;                                                                                  \
    memcpy(&v, span->data + ((uint64_t)S64(B) << SHIFT), sizeof v);                       \
    PUT(C, v);                                                                            \
    NEXT(4);                                                                              \
  }

/* buffer.store.*: (ref, i64 element index, register). */
#define STORE_CASE(OP, T, SHIFT, GET)                                                     \
  case OP: {                                                                              \
    span_t* span = reach(heap, refs[A], S64(B), 1, SHIFT, 1);                             \
    if (!span) goto trap;                                                                 \
    T v = (T)GET(C);                                                                      \
    memcpy(span->data + ((uint64_t)S64(B) << SHIFT), &v, sizeof v);                       \
    NEXT(4);                                                                              \
  }

/* buffer.fill.*: (ref, i64 element index, i64 count, register). */
#define FILL_CASE(OP, T, SHIFT, GET)                                                      \
  case OP: {                                                                              \
    int64_t count = S64(C);                                                               \
    span_t* span = count < 0 ? NULL : reach(heap, refs[A], S64(B), (uint64_t)count, SHIFT, 1); \
    if (!span) goto trap;                                                                 \
    T v = (T)GET(D);                                                                      \
    uint8_t* at = span->data + ((uint64_t)S64(B) << SHIFT);                               \
    for (int64_t i = 0; i < count; ++i) memcpy(at + ((uint64_t)i << SHIFT), &v, sizeof v); \
    NEXT(5);                                                                              \
  }

#define F32_BINARY(OP, EXPR) case OP: { float a = F32(A), b = F32(B); PUTF(C, EXPR); NEXT(4); }
#define F32_COMMUTATIVE(OP, EXPR)                                                         \
  case OP: { float a = F32(A), b = F32(B), r = EXPR; PUTF(C, r != r ? nan_first(a, b, r) : r); NEXT(4); }
#define F32_COMPARE(OP, EXPR) case OP: { float a = F32(A), b = F32(B); PUT32(C, (EXPR) ? 1 : 0); NEXT(4); }
#define F32_MATH(OP, WHICH) case OP: PUTF(B, unary(WHICH, F32(A))); NEXT(3);

static int interpret(const int32_t* code, uint32_t* regs, int32_t* refs, heap_t* heap,
                     uint32_t* pc_io, uint64_t budget, int64_t* results) {
  uint32_t pc = *pc_io;
  for (;;) {
    switch (code[pc]) {
      INT_CASES(32)
      INT_CASES(64)
      case OP_CONST_I32: PUT32(B, A); NEXT(3);
      case OP_CONST_I64: PUT64(C, ((uint64_t)(uint32_t)B << 32) | (uint32_t)A); NEXT(4);
      case OP_TRUNC_I32_I8: PUT32(B, (uint8_t)U32(A)); NEXT(3);
      case OP_TRUNC_I32_I16: PUT32(B, (uint16_t)U32(A)); NEXT(3);
      case OP_TRUNC_I64_I32: PUT32(B, U64(A)); NEXT(3);
      case OP_EXT_I8_I32_S: PUT32(B, (int8_t)U32(A)); NEXT(3);
      case OP_EXT_I8_I32_U: PUT32(B, (uint8_t)U32(A)); NEXT(3);
      case OP_EXT_I16_I32_S: PUT32(B, (int16_t)U32(A)); NEXT(3);
      case OP_EXT_I16_I32_U: PUT32(B, (uint16_t)U32(A)); NEXT(3);
      case OP_EXT_I32_I64_S: PUT64(B, S32(A)); NEXT(3);
      case OP_EXT_I32_I64_U: PUT64(B, U32(A)); NEXT(3);

      /* f32: the bits live in one 32-bit slot. */
      case OP_CONST_F32_ZERO: PUT32(A, 0); NEXT(2);
      case OP_CONST_F32: PUT32(B, A); NEXT(3);
      case OP_SELECT_F32: PUT32(D, regs[A] ? U32(B) : U32(C)); NEXT(5);
      case OP_BITCAST_I32_F32: case OP_BITCAST_F32_I32: PUT32(B, U32(A)); NEXT(3);
      F32_COMMUTATIVE(OP_ADD_F32, a + b)
      F32_COMMUTATIVE(OP_MUL_F32, a * b)
      F32_BINARY(OP_SUB_F32, a - b)
      F32_BINARY(OP_DIV_F32, a / b)
      F32_BINARY(OP_REM_F32, ((binary_fn)math_fns.remainderf)(a, b))
      F32_BINARY(OP_ATAN2_F32, ((binary_fn)math_fns.atan2f)(a, b))
      F32_BINARY(OP_POW_F32, ((binary_fn)math_fns.powf)(a, b))
      F32_BINARY(OP_MIN_F32, b < a ? b : a)
      F32_BINARY(OP_MAX_F32, a < b ? b : a)
      case OP_FMA_F32: { /* a multiply and an add, each rounded, as IREE's VM computes it */
        float a = F32(A), b = F32(B), c = F32(C);
        float p = a * b;
        if (p != p) p = nan_first(a, b, p);
        float r = p + c;
        PUTF(D, r != r ? nan_first(p, c, r) : r);
        NEXT(5);
      }
      case OP_ABS_F32: PUT32(B, U32(A) & 0x7FFFFFFFu); NEXT(3);
      case OP_NEG_F32: PUT32(B, U32(A) ^ 0x80000000u); NEXT(3);
      case OP_RSQRT_F32: PUTF(B, 1.0f / unary(MATH_SQRT, F32(A))); NEXT(3);
      F32_MATH(OP_ATAN_F32, MATH_ATAN)
      F32_MATH(OP_COS_F32, MATH_COS)
      F32_MATH(OP_SIN_F32, MATH_SIN)
      F32_MATH(OP_EXP_F32, MATH_EXP)
      F32_MATH(OP_EXP2_F32, MATH_EXP2)
      F32_MATH(OP_EXPM1_F32, MATH_EXPM1)
      F32_MATH(OP_LOG_F32, MATH_LOG)
      F32_MATH(OP_LOG10_F32, MATH_LOG10)
      F32_MATH(OP_LOG1P_F32, MATH_LOG1P)
      F32_MATH(OP_LOG2_F32, MATH_LOG2)
      F32_MATH(OP_SQRT_F32, MATH_SQRT)
      F32_MATH(OP_TANH_F32, MATH_TANH)
      F32_MATH(OP_ERF_F32, MATH_ERF)
      F32_MATH(OP_CEIL_F32, MATH_CEIL)
      F32_MATH(OP_FLOOR_F32, MATH_FLOOR)
      F32_MATH(OP_ROUND_F32, MATH_ROUND)
      case OP_CAST_SI32_F32: PUTF(B, (float)S32(A)); NEXT(3);
      case OP_CAST_UI32_F32: PUTF(B, (float)U32(A)); NEXT(3);
      case OP_CAST_F32_SI32: PUT32(B, ((long (*)(float))math_fns.lroundf)(F32(A))); NEXT(3);
      case OP_CAST_F32_UI32: PUT32(B, ((long long (*)(float))math_fns.llroundf)(F32(A))); NEXT(3);
      F32_COMPARE(OP_CMP_EQ_F32_O, a == b)
      F32_COMPARE(OP_CMP_EQ_F32_U, !(a < b || a > b))
      F32_COMPARE(OP_CMP_NE_F32_O, a != b)
      F32_COMPARE(OP_CMP_NE_F32_U, a != b)
      F32_COMPARE(OP_CMP_LT_F32_O, a < b)
      F32_COMPARE(OP_CMP_LT_F32_U, !(a >= b))
      F32_COMPARE(OP_CMP_LTE_F32_O, a <= b)
      F32_COMPARE(OP_CMP_LTE_F32_U, !(a > b))
      case OP_CMP_NAN_F32: { float a = F32(A); PUT32(B, a != a); NEXT(3); }

      /* Buffers and refs (VMVX workgroup functions only). */
      LOAD_CASE(OP_BUFFER_LOAD_I8_U, uint8_t, 0, PUT32)
      LOAD_CASE(OP_BUFFER_LOAD_I8_S, int8_t, 0, PUT32)
      LOAD_CASE(OP_BUFFER_LOAD_I16_U, uint16_t, 1, PUT32)
      LOAD_CASE(OP_BUFFER_LOAD_I16_S, int16_t, 1, PUT32)
      LOAD_CASE(OP_BUFFER_LOAD_I32, uint32_t, 2, PUT32)
      LOAD_CASE(OP_BUFFER_LOAD_F32, uint32_t, 2, PUT32)
      LOAD_CASE(OP_BUFFER_LOAD_I64, int64_t, 3, PUT64)
      STORE_CASE(OP_BUFFER_STORE_I8, uint8_t, 0, U32)
      STORE_CASE(OP_BUFFER_STORE_I16, uint16_t, 1, U32)
      STORE_CASE(OP_BUFFER_STORE_I32, uint32_t, 2, U32)
      STORE_CASE(OP_BUFFER_STORE_F32, uint32_t, 2, U32)
      STORE_CASE(OP_BUFFER_STORE_I64, uint64_t, 3, U64)
      FILL_CASE(OP_BUFFER_FILL_I8, uint8_t, 0, U32)
      FILL_CASE(OP_BUFFER_FILL_I16, uint16_t, 1, U32)
      FILL_CASE(OP_BUFFER_FILL_I32, uint32_t, 2, U32)
      FILL_CASE(OP_BUFFER_FILL_F32, uint32_t, 2, U32)
      FILL_CASE(OP_BUFFER_FILL_I64, uint64_t, 3, U64)
      case OP_BUFFER_LENGTH: {
        span_t* span = reach(heap, refs[A], 0, 0, 0, 0);
        if (!span) goto trap;
        PUT64(B, span->length);
        NEXT(3);
      }
      case OP_BUFFER_COPY: { /* (src, src byte offset, dst, dst byte offset, length) */
        int64_t length = S64(E);
        span_t* src = length < 0 ? NULL : reach(heap, refs[A], S64(B), (uint64_t)length, 0, 0);
        span_t* dst = src ? reach(heap, refs[C], S64(D), (uint64_t)length, 0, 1) : NULL;
        if (!dst) goto trap;
        memmove(dst->data + S64(D), src->data + S64(B), (size_t)length);
        NEXT(6);
      }
      case OP_BUFFER_ALLOC: {
        int32_t handle = allocate(heap, S64(A));
        if (handle < 0) goto trap;
        refs[C] = handle;
        NEXT(4);
      }
      case OP_CONST_REF_ZERO: refs[A] = 0; NEXT(2);
      case OP_CONST_REF_RODATA: refs[B] = (int32_t)(4 + A); NEXT(3);
      case OP_CMP_NZ_REF: PUT32(B, refs[A] != 0); NEXT(3);
      case OP_LIST_GET_REF: { /* (list, i32 index, buffer matches the type, result) */
        int32_t handle = refs[A];
        if (handle <= 0 || !heap->spans[handle].is_list || U32(B) >= heap->list_count)
          goto trap;
        refs[D] = C ? (int32_t)(heap->list_first + U32(B)) : 0;
        NEXT(5);
      }
      case OP_CALL: {
        uint32_t next = call(heap, regs, refs, code, pc);
        if (!next) goto trap;
        pc = next;
        break;
      }
      case OP_DISCARD_REFS: {
        uint32_t n = (uint32_t)A;
        for (uint32_t i = 0; i < n; ++i) refs[code[pc + 2 + i]] = 0;
        NEXT(2 + n);
      }

      case OP_BR: {
        uint32_t target = (uint32_t)A;
        remap(regs, refs, code, pc + 2);
        pc = target;
        if (--budget == 0) { *pc_io = pc; return SCALAR_BUDGET; }
        break;
      }
      case OP_COND_BR: {
        uint32_t at = pc + 2;
        uint32_t target = (uint32_t)code[at];
        if (!regs[A]) {
          at += 2 + 3 * (uint32_t)code[at + 1];
          target = (uint32_t)code[at];
        }
        remap(regs, refs, code, at + 1);
        pc = target;
        if (--budget == 0) { *pc_io = pc; return SCALAR_BUDGET; }
        break;
      }
      case OP_RETURN: {
        uint32_t n = (uint32_t)A;
        for (uint32_t i = 0; i < n; ++i) {
          int32_t slot = code[pc + 2 + 2 * i];
          results[i] = code[pc + 3 + 2 * i] ? S64(slot) : (int64_t)S32(slot);
        }
        *pc_io = pc;
        return SCALAR_DONE;
      }
      case FELL_OFF_END: goto trap; /* the Python translation raises the VM's error */
      default:
        *pc_io = pc;
        return SCALAR_BAD_OPCODE;
    }
  }
trap:
  *pc_io = pc;
  return SCALAR_TRAP;
}

int tinyhal_scalar_run(const int32_t* code, uint32_t* regs, uint32_t* pc_io, uint64_t budget,
                       int64_t* results) {
  return interpret(code, regs, NULL, NULL, pc_io, budget, results);
}

enum { STACK_SLOTS = 512, STACK_REFS = 128, STACK_SPANS = 128, STATUS_INTERNAL = 13 };

/* A dispatch function of the executable ABI: one workgroup of the VMVX export whose entry
 * holds `environment`, called as IREE's VMVX loader calls it (local memory, constants
 * and the bindings list, then the workgroup id, size and count). */
static int vmvx_dispatch(const tinyhal_environment_t* environment,
                         const tinyhal_dispatch_state_t* state,
                         const tinyhal_workgroup_state_t* workgroup) {
  const tinyhal_vmvx_entry_t* entry = (const tinyhal_vmvx_entry_t*)(const void*)environment;
  uint32_t stack_regs[STACK_SLOTS];
  int32_t stack_refs[STACK_REFS];
  span_t stack_spans[STACK_SPANS];
  uint32_t fixed = 4 + entry->rodata_count + state->binding_count;
  uint32_t* regs = entry->register_count <= STACK_SLOTS
                       ? stack_regs : malloc(sizeof(uint32_t) * entry->register_count);
  int32_t* refs = entry->ref_count <= STACK_REFS
                      ? stack_refs : malloc(sizeof(int32_t) * entry->ref_count);
  heap_t heap = {stack_spans, fixed, STACK_SPANS, fixed, 4 + entry->rodata_count,
                 state->binding_count, 0, entry->max_allocation, entry->features,
                 entry->tiles};
  if (fixed + 1 > STACK_SPANS) {
    heap.capacity = 2 * fixed;
    heap.spans = malloc(sizeof(span_t) * heap.capacity);
    heap.spans_allocated = 1;
  }
  int status = STATUS_INTERNAL;
  if (!regs || !refs || !heap.spans) goto done;
  memset(regs, 0, sizeof(uint32_t) * entry->register_count);
  memset(refs, 0, sizeof(int32_t) * entry->ref_count);
  span_t* spans = heap.spans;
  memset(spans, 0, sizeof(span_t) * 4);
  if (workgroup->local_memory_size) {
    spans[1].data = workgroup->local_memory;
    spans[1].length = workgroup->local_memory_size;
    spans[1].writable = 1;
  }
  if (state->constant_count) {
    spans[2].data = (uint8_t*)state->constants;
    spans[2].length = 4 * (uint64_t)state->constant_count;
  }
  spans[3].is_list = 1;
  for (uint32_t i = 0; i < entry->rodata_count; ++i) {
    span_t* span = &spans[4 + i];
    span->data = entry->rodata_data[i];
    span->length = entry->rodata_lengths[i];
    span->writable = 0;
    span->is_list = 0;
  }
  for (uint32_t i = 0; i < state->binding_count; ++i) {
    span_t* span = &spans[heap.list_first + i];
    span->data = state->binding_ptrs[i];
    span->length = state->binding_lengths[i];
    span->writable = 1;
    span->is_list = 0;
  }
  refs[0] = 1;
  refs[1] = 2;
  refs[2] = 3;
  regs[0] = workgroup->workgroup_id_x;
  regs[1] = workgroup->workgroup_id_y;
  regs[2] = workgroup->workgroup_id_z;
  regs[3] = state->workgroup_size_x;
  regs[4] = state->workgroup_size_y;
  regs[5] = state->workgroup_size_z;
  regs[6] = state->workgroup_count_x;
  regs[7] = state->workgroup_count_y;
  regs[8] = state->workgroup_count_z;
  uint32_t pc = 0;
  int64_t no_results = 0;
  int run;
  while ((run = interpret(entry->code, regs, refs, &heap, &pc, entry->budget, &no_results)) ==
         SCALAR_BUDGET) {
    if (((int (*)(void))entry->on_budget)()) break;
  }
  release(&heap);
  if (run == SCALAR_DONE) {
    status = 0;
  } else if (run == SCALAR_TRAP) {
    status = ((tinyhal_dispatch_fn_t)entry->on_trap)(environment, state, workgroup);
  }
done:
  if (heap.spans_allocated) free(heap.spans);
  if (regs != stack_regs) free(regs);
  if (refs != stack_refs) free(refs);
  return status;
}

void* tinyhal_vmvx_dispatch_address(void) { return (void*)vmvx_dispatch; }
