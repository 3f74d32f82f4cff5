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

#define A (code[pc + 1])
#define B (code[pc + 2])
#define C (code[pc + 3])
#define D (code[pc + 4])
#define S32(r) ((int32_t)regs[r])
#define U32(r) (regs[r])
#define S64(r) get64(regs, r)
#define U64(r) ((uint64_t)get64(regs, r))
#define BIN32(expr) { int32_t a = S32(A), b = S32(B); (void)a; (void)b; \
    regs[C] = (uint32_t)(expr); pc += 4; break; }
#define BIN64(expr) { int64_t a = S64(A), b = S64(B); (void)a; (void)b; \
    set64(regs, C, (int64_t)(expr)); pc += 4; break; }
#define CMP64(expr) { int64_t a = S64(A), b = S64(B); (void)a; (void)b; \
    regs[C] = (expr) ? 1u : 0u; pc += 4; break; }
#define UN32(expr) { int32_t a = S32(A); regs[B] = (uint32_t)(expr); pc += 3; break; }
#define UN64(expr) { int64_t a = S64(A); set64(regs, B, (int64_t)(expr)); pc += 3; break; }

int tinyhal_scalar_run(const int32_t* code, uint32_t* regs, uint32_t* pc_io, uint64_t budget,
                       int64_t* results) {
  uint32_t pc = *pc_io;
  for (;;) {
    switch (code[pc]) {
      case OP_CONST_I32_ZERO: regs[A] = 0; pc += 2; break;
      case OP_CONST_I32: regs[B] = (uint32_t)A; pc += 3; break;
      case OP_CONST_I64_ZERO: set64(regs, A, 0); pc += 2; break;
      case OP_CONST_I64:
        set64(regs, C, (int64_t)(((uint64_t)(uint32_t)B << 32) | (uint32_t)A)); pc += 4; break;
      case OP_SELECT_I32: regs[D] = regs[A] ? regs[B] : regs[C]; pc += 5; break;
      case OP_SELECT_I64: set64(regs, D, regs[A] ? S64(B) : S64(C)); pc += 5; break;

      case OP_ADD_I32: BIN32((uint32_t)a + (uint32_t)b)
      case OP_SUB_I32: BIN32((uint32_t)a - (uint32_t)b)
      case OP_MUL_I32: BIN32((uint32_t)a * (uint32_t)b)
      case OP_DIV_I32_S:
        if (S32(B) == 0 || (S32(B) == -1 && S32(A) == INT32_MIN)) goto trap;
        BIN32(a / b)
      case OP_DIV_I32_U: if (U32(B) == 0) goto trap; BIN32(U32(A) / U32(B))
      case OP_REM_I32_S:
        if (S32(B) == 0 || (S32(B) == -1 && S32(A) == INT32_MIN)) goto trap;
        BIN32(a % b)
      case OP_REM_I32_U: if (U32(B) == 0) goto trap; BIN32(U32(A) % U32(B))
      case OP_FMA_I32:
        regs[D] = U32(A) * U32(B) + U32(C); pc += 5; break;
      case OP_ADD_I64: BIN64((uint64_t)a + (uint64_t)b)
      case OP_SUB_I64: BIN64((uint64_t)a - (uint64_t)b)
      case OP_MUL_I64: BIN64((uint64_t)a * (uint64_t)b)
      case OP_DIV_I64_S:
        if (S64(B) == 0 || (S64(B) == -1 && S64(A) == INT64_MIN)) goto trap;
        BIN64(a / b)
      case OP_DIV_I64_U: if (U64(B) == 0) goto trap; BIN64(U64(A) / U64(B))
      case OP_REM_I64_S:
        if (S64(B) == 0 || (S64(B) == -1 && S64(A) == INT64_MIN)) goto trap;
        BIN64(a % b)
      case OP_REM_I64_U: if (U64(B) == 0) goto trap; BIN64(U64(A) % U64(B))
      case OP_FMA_I64:
        set64(regs, D, (int64_t)(U64(A) * U64(B) + U64(C))); pc += 5; break;
      case OP_NOT_I32: UN32(~a)
      case OP_AND_I32: BIN32(a & b)
      case OP_OR_I32: BIN32(a | b)
      case OP_XOR_I32: BIN32(a ^ b)
      case OP_NOT_I64: UN64(~a)
      case OP_AND_I64: BIN64(a & b)
      case OP_OR_I64: BIN64(a | b)
      case OP_XOR_I64: BIN64(a ^ b)
      case OP_SHL_I32: BIN32((uint32_t)a << (b & 31))
      case OP_SHR_I32_S: BIN32(a >> (b & 31))
      case OP_SHR_I32_U: BIN32((uint32_t)a >> (b & 31))
      /* the i64 shifts take their amount from an i32 register */
      case OP_SHL_I64: set64(regs, C, (int64_t)(U64(A) << (S32(B) & 63))); pc += 4; break;
      case OP_SHR_I64_S: set64(regs, C, S64(A) >> (S32(B) & 63)); pc += 4; break;
      case OP_SHR_I64_U: set64(regs, C, (int64_t)(U64(A) >> (S32(B) & 63))); pc += 4; break;

      case OP_TRUNC_I32_I8: UN32((uint8_t)a)
      case OP_TRUNC_I32_I16: UN32((uint16_t)a)
      case OP_TRUNC_I64_I32: regs[B] = (uint32_t)U64(A); pc += 3; break;
      case OP_EXT_I8_I32_S: UN32((int8_t)a)
      case OP_EXT_I8_I32_U: UN32((uint8_t)a)
      case OP_EXT_I16_I32_S: UN32((int16_t)a)
      case OP_EXT_I16_I32_U: UN32((uint16_t)a)
      case OP_EXT_I32_I64_S: set64(regs, B, (int64_t)S32(A)); pc += 3; break;
      case OP_EXT_I32_I64_U: set64(regs, B, (int64_t)(uint64_t)U32(A)); pc += 3; break;

      case OP_CMP_EQ_I32: BIN32(a == b)
      case OP_CMP_NE_I32: BIN32(a != b)
      case OP_CMP_LT_I32_S: BIN32(a < b)
      case OP_CMP_LT_I32_U: BIN32((uint32_t)a < (uint32_t)b)
      case OP_CMP_NZ_I32: UN32(a != 0)
      case OP_CMP_EQ_I64: CMP64(a == b)
      case OP_CMP_NE_I64: CMP64(a != b)
      case OP_CMP_LT_I64_S: CMP64(a < b)
      case OP_CMP_LT_I64_U: CMP64((uint64_t)a < (uint64_t)b)
      case OP_CMP_NZ_I64: regs[B] = S64(A) != 0; pc += 3; break;

      case OP_CTLZ_I32: UN32(clz32((uint32_t)a))
      case OP_CTLZ_I64: UN64(clz64((uint64_t)a))
      case OP_ABS_I32: UN32(a < 0 ? 0u - (uint32_t)a : (uint32_t)a)
      case OP_ABS_I64: UN64(a < 0 ? 0u - (uint64_t)a : (uint64_t)a)
      case OP_MIN_I32_S: BIN32(b < a ? b : a)
      case OP_MIN_I32_U: BIN32((uint32_t)b < (uint32_t)a ? b : a)
      case OP_MAX_I32_S: BIN32(a < b ? b : a)
      case OP_MAX_I32_U: BIN32((uint32_t)a < (uint32_t)b ? b : a)
      case OP_MIN_I64_S: BIN64(b < a ? b : a)
      case OP_MIN_I64_U: BIN64((uint64_t)b < (uint64_t)a ? b : a)
      case OP_MAX_I64_S: BIN64(a < b ? b : a)
      case OP_MAX_I64_U: BIN64((uint64_t)a < (uint64_t)b ? b : a)

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
