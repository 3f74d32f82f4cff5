/* Native execution of integer-only VM functions: see scalar.c for the program layout. */
#ifndef TINYHAL_SCALAR_H_
#define TINYHAL_SCALAR_H_

#include <stdint.h>

enum {
  SCALAR_DONE = 0,        /* a return ran; results are written */
  SCALAR_BUDGET = 1,      /* the branch budget ran out; resume at *pc */
  SCALAR_TRAP = 2,        /* an integer division would fault at *pc */
  SCALAR_BAD_OPCODE = 3,  /* the encoder and this file disagree (a bug) */
};

int tinyhal_scalar_run(const int32_t* code, uint32_t* regs, uint32_t* pc, uint64_t budget,
                       int64_t* results);

#endif
