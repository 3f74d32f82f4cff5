/* Native execution of VM functions: see scalar.c for the program layout. */
#ifndef TINYHAL_SCALAR_H_
#define TINYHAL_SCALAR_H_

#include <stdint.h>

enum {
  SCALAR_DONE = 0,        /* a return ran; results are written */
  SCALAR_BUDGET = 1,      /* the branch budget ran out; resume at *pc */
  SCALAR_TRAP = 2,        /* the VM raises an error at *pc (its Python translation says which) */
  SCALAR_BAD_OPCODE = 3,  /* the encoder and this file disagree (a bug) */
};

int tinyhal_scalar_run(const int32_t* code, uint32_t* regs, uint32_t* pc, uint64_t budget,
                       int64_t* results);

/* The C library functions the f32 ops call, the very ones the Python translation binds
 * (by symbol version), set once before any program runs. */
enum {
  MATH_ATAN, MATH_COS, MATH_SIN, MATH_EXP, MATH_EXP2, MATH_EXPM1, MATH_LOG, MATH_LOG10,
  MATH_LOG1P, MATH_LOG2, MATH_SQRT, MATH_TANH, MATH_ERF, MATH_CEIL, MATH_FLOOR, MATH_ROUND,
  MATH_UNARY_COUNT
};
typedef struct tinyhal_scalar_math_t {
  void* unary[MATH_UNARY_COUNT]; /* float (*)(float) */
  void* atan2f;                  /* float (*)(float, float) */
  void* powf;
  void* remainderf;
  void* lroundf;                 /* long (*)(float) */
  void* llroundf;                /* long long (*)(float) */
} tinyhal_scalar_math_t;

void tinyhal_scalar_set_math(const tinyhal_scalar_math_t* math);

/* One VMVX workgroup function run natively as a dispatch function of the executable ABI.
 * The executable hands `&entry->environment` to the HAL as the export's environment, so
 * `tinyhal_vmvx_dispatch` finds its program from the environment it is called with. */
typedef struct tinyhal_vmvx_entry_t {
  uint64_t environment[12];      /* a tinyhal_environment_t (checked in scalar.c) */
  const int32_t* code;
  uint32_t register_count;       /* 32-bit slots */
  uint32_t ref_count;
  uint32_t rodata_count;
  uint8_t* const* rodata_data;   /* read-only segments, `const.ref.rodata` */
  const uint64_t* rodata_lengths;
  uint64_t max_allocation;       /* `buffer.alloc` above this is the VM's error */
  uint64_t budget;               /* taken branches between calls of `on_budget` */
  uint32_t features;             /* 1: IREE's AVX2 f32 mmt4d tiles, 2: its AVX-512 ones */
  int32_t tiles[9];              /* IREE's (M0, K0, N0) for f32, i8 and other matmuls */
  void* on_trap;                 /* tinyhal_dispatch_fn_t: the workgroup run again by the
                                  * Python translation, which raises the VM's error */
  void* on_budget;               /* int (*)(void): non-zero stops the dispatch */
} tinyhal_vmvx_entry_t;

void* tinyhal_vmvx_dispatch_address(void);

#endif
