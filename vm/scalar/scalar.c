/* Native execution of integer-only VM functions.
 *
 * The program is the function's bytecode re-laid by `tinyhal.vm.scalar` in 32-bit words:
 * each instruction is its core opcode (IREE's opcode byte), then its fields in layout
 * order, one word per register, two per i64 literal (low word first), branch targets as
 * word indices and branch operand lists as a count and (src, dst) pairs. `return` carries
 * a count and (register, is_i64) pairs. Block markers are dropped.
 *
 * Registers are IREE's: one bank of 32-bit slots in which an i64 fills two adjacent
 * slots, and branch operand lists copy 32-bit slots one after another.
 *
 * The run stops at a `return` (SCALAR_DONE, results written sign-extended), after
 * `budget` taken branches (SCALAR_BUDGET, `*pc` is where to resume, so the caller can
 * handle signals between slices) or before an integer division that would fault
 * (SCALAR_TRAP, `*pc` at that instruction; the caller re-runs the function in the
 * Python interpreter, which raises the VM's error). The encoder validated every
 * register and target, so nothing here is checked twice.
 */
#include <stdint.h>
#include <string.h>

#include "tinyhal_scalar.h"

enum {
  OP_CONST_I32_ZERO = 0x0C, OP_CONST_I32 = 0x0D, OP_CONST_I64_ZERO = 0x0E,
  OP_CONST_I64 = 0x0F, OP_SELECT_I32 = 0x1C, OP_SELECT_I64 = 0x1D, OP_ADD_I32 = 0x22,
  OP_SUB_I32 = 0x23, OP_MUL_I32 = 0x24, OP_DIV_I32_S = 0x25, OP_DIV_I32_U = 0x26,
  OP_REM_I32_S = 0x27, OP_REM_I32_U = 0x28, OP_FMA_I32 = 0x29, OP_ADD_I64 = 0x2A,
  OP_SUB_I64 = 0x2B, OP_MUL_I64 = 0x2C, OP_DIV_I64_S = 0x2D, OP_DIV_I64_U = 0x2E,
  OP_REM_I64_S = 0x2F, OP_REM_I64_U = 0x30, OP_FMA_I64 = 0x31, OP_NOT_I32 = 0x32,
  OP_AND_I32 = 0x33, OP_OR_I32 = 0x34, OP_XOR_I32 = 0x35, OP_NOT_I64 = 0x36,
  OP_AND_I64 = 0x37, OP_OR_I64 = 0x38, OP_XOR_I64 = 0x39, OP_SHL_I32 = 0x3A,
  OP_SHR_I32_S = 0x3B, OP_SHR_I32_U = 0x3C, OP_SHL_I64 = 0x3D, OP_SHR_I64_S = 0x3E,
  OP_SHR_I64_U = 0x3F, OP_TRUNC_I32_I8 = 0x40, OP_TRUNC_I32_I16 = 0x41,
  OP_TRUNC_I64_I32 = 0x42, OP_EXT_I8_I32_S = 0x43, OP_EXT_I8_I32_U = 0x44,
  OP_EXT_I16_I32_S = 0x45, OP_EXT_I16_I32_U = 0x46, OP_EXT_I32_I64_S = 0x47,
  OP_EXT_I32_I64_U = 0x48, OP_CMP_EQ_I32 = 0x49, OP_CMP_NE_I32 = 0x4A,
  OP_CMP_LT_I32_S = 0x4B, OP_CMP_LT_I32_U = 0x4C, OP_CMP_NZ_I32 = 0x4D,
  OP_CMP_EQ_I64 = 0x4E, OP_CMP_NE_I64 = 0x4F, OP_CMP_LT_I64_S = 0x50,
  OP_CMP_LT_I64_U = 0x51, OP_CMP_NZ_I64 = 0x52, OP_BR = 0x56, OP_COND_BR = 0x57,
  OP_RETURN = 0x5A, OP_CTLZ_I32 = 0x75, OP_CTLZ_I64 = 0x76, OP_ABS_I32 = 0x77,
  OP_ABS_I64 = 0x78, OP_MIN_I32_S = 0x7A, OP_MIN_I32_U = 0x7B, OP_MAX_I32_S = 0x7C,
  OP_MAX_I32_U = 0x7D, OP_MIN_I64_S = 0x7E, OP_MIN_I64_U = 0x7F, OP_MAX_I64_S = 0x80,
  OP_MAX_I64_U = 0x81,
};

static inline int64_t get64(const uint32_t* regs, int32_t slot) {
  int64_t v;
  memcpy(&v, regs + slot, 8);
  return v;
}

static inline void set64(uint32_t* regs, int32_t slot, int64_t v) {
  memcpy(regs + slot, &v, 8);
}

static inline uint32_t remap(uint32_t* regs, const int32_t* code, uint32_t at) {
  uint32_t n = (uint32_t)code[at];
  for (uint32_t i = 0; i < n; ++i) regs[code[at + 2 + 2 * i]] = regs[code[at + 1 + 2 * i]];
  return at + 1 + 2 * n;
}

static inline uint32_t clz32(uint32_t v) { return v ? (uint32_t)__builtin_clz(v) : 32; }
static inline uint64_t clz64(uint64_t v) { return v ? (uint64_t)__builtin_clzll(v) : 64; }

/* Operand words of the instruction at pc, and register reads/writes by width. */
#define A (code[pc + 1])
#define B (code[pc + 2])
#define C (code[pc + 3])
#define D (code[pc + 4])
#define S32(r) ((int32_t)regs[r])
#define U32(r) (regs[r])
#define S64(r) get64(regs, r)
#define U64(r) ((uint64_t)get64(regs, r))
#define PUT32(r, v) (regs[r] = (uint32_t)(v))
#define PUT64(r, v) set64(regs, r, (int64_t)(v))
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

int tinyhal_scalar_run(const int32_t* code, uint32_t* regs, uint32_t* pc_io, uint64_t budget,
                       int64_t* results) {
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

      case OP_BR: {
        uint32_t target = (uint32_t)A;
        remap(regs, code, pc + 2);
        pc = target;
        if (--budget == 0) { *pc_io = pc; return SCALAR_BUDGET; }
        break;
      }
      case OP_COND_BR: {
        uint32_t at = pc + 2;
        uint32_t target = (uint32_t)code[at];
        if (!regs[A]) {
          at += 2 + 2 * (uint32_t)code[at + 1];
          target = (uint32_t)code[at];
        }
        remap(regs, code, at + 1);
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
      default:
        *pc_io = pc;
        return SCALAR_BAD_OPCODE;
    }
  }
trap:
  *pc_io = pc;
  return SCALAR_TRAP;
}
