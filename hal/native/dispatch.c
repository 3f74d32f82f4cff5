/* The workgroup loop and library loading: the only C in the runtime itself.
 *
 * Python calls in once per dispatch (or once per worker for a tiled dispatch) and these
 * loops call the kernel once per workgroup, so no Python runs per workgroup and cffi
 * releases the GIL for the whole grid.
 */
#include <alloca.h>
#include <dlfcn.h>
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
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

/* Kernel fault containment.
 *
 * A kernel that faults (a corrupted executable, a host C kernel with a bad pointer) must
 * not take the host process with it. While a thread runs workgroups it publishes a jump
 * target; the handler for synchronous fault signals jumps back to it and the dispatch
 * fails with status TINYHAL_FAULT_STATUS - signal. Faults anywhere else go to whatever
 * handler was installed before ours (or the default action), so hosts keep their own
 * crash handling. Memory the kernel wrote before it faulted is not restored: Python
 * treats a fault as losing the device.
 */
#define TINYHAL_FAULT_STATUS (-1000)

typedef struct tinyhal_trap_t {
  sigjmp_buf jump;
  volatile int signal;
} tinyhal_trap_t;

static __thread tinyhal_trap_t* tinyhal_active_trap;

/* Stack left unused between the runtime's frame and a kernel's: a corrupted kernel that
 * stores past its own frame (a flipped displacement bit) hits this padding rather than
 * the runtime's saved registers or the interpreter's frames. */
#define TINYHAL_STACK_PAD (16 * 1024)
#define TINYHAL_PAD_STACK()                                  \
  do {                                                       \
    volatile char* tinyhal_pad = alloca(TINYHAL_STACK_PAD);  \
    tinyhal_pad[0] = 0;                                      \
  } while (0)
static const int tinyhal_fault_signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP};
#define TINYHAL_FAULT_SIGNAL_COUNT (sizeof(tinyhal_fault_signals) / sizeof(int))
static struct sigaction tinyhal_previous_actions[TINYHAL_FAULT_SIGNAL_COUNT];
static uint64_t tinyhal_last_fault[3]; /* signal, program counter, faulting address */

static void tinyhal_fault_handler(int sig, siginfo_t* info, void* context) {
  tinyhal_trap_t* trap = tinyhal_active_trap;
  if (trap) {
    tinyhal_active_trap = NULL;
    uint64_t pc = 0;
#if defined(__x86_64__)
    pc = (uint64_t)((ucontext_t*)context)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    pc = (uint64_t)((ucontext_t*)context)->uc_mcontext.pc;
#endif
    tinyhal_last_fault[0] = (uint64_t)sig;
    tinyhal_last_fault[1] = pc;
    tinyhal_last_fault[2] = (uint64_t)(uintptr_t)info->si_addr;
    trap->signal = sig;
    siglongjmp(trap->jump, 1);
  }
  for (size_t i = 0; i < TINYHAL_FAULT_SIGNAL_COUNT; ++i) {
    if (tinyhal_fault_signals[i] != sig) continue;
    struct sigaction* previous = &tinyhal_previous_actions[i];
    if (previous->sa_flags & SA_SIGINFO) {
      previous->sa_sigaction(sig, info, context);
    } else if (previous->sa_handler != SIG_DFL && previous->sa_handler != SIG_IGN) {
      previous->sa_handler(sig);
    } else {
      /* Default action: restore it and re-deliver once this handler returns. */
      sigaction(sig, previous, NULL);
      raise(sig);
    }
    return;
  }
}

/* The signal stays blocked after a jump out of its handler (sigsetjmp saved no mask). */
static void tinyhal_unblock(int sig) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/* A kernel that corrupts its stack pointer or overflows the stack can only be caught on
 * an alternate signal stack: each thread that runs kernels gets one (unless it has one
 * already), freed when the thread exits. */
#define TINYHAL_SIGNAL_STACK_SIZE (64 * 1024)
static pthread_key_t tinyhal_signal_stack_key;
static pthread_once_t tinyhal_signal_stack_once = PTHREAD_ONCE_INIT;
static __thread int tinyhal_signal_stack_checked;

static void tinyhal_signal_stack_free(void* memory) {
  stack_t off;
  memset(&off, 0, sizeof(off));
  off.ss_flags = SS_DISABLE;
  sigaltstack(&off, NULL);
  free(memory);
}

static void tinyhal_signal_stack_key_create(void) {
  pthread_key_create(&tinyhal_signal_stack_key, tinyhal_signal_stack_free);
}

static void tinyhal_ensure_signal_stack(void) {
  if (tinyhal_signal_stack_checked) return;
  tinyhal_signal_stack_checked = 1;
  stack_t current;
  if (sigaltstack(NULL, &current) != 0 || !(current.ss_flags & SS_DISABLE)) return;
  pthread_once(&tinyhal_signal_stack_once, tinyhal_signal_stack_key_create);
  stack_t stack;
  memset(&stack, 0, sizeof(stack));
  stack.ss_sp = malloc(TINYHAL_SIGNAL_STACK_SIZE);
  if (!stack.ss_sp) return;
  stack.ss_size = TINYHAL_SIGNAL_STACK_SIZE;
  if (sigaltstack(&stack, NULL) != 0 ||
      pthread_setspecific(tinyhal_signal_stack_key, stack.ss_sp) != 0) {
    tinyhal_signal_stack_free(stack.ss_sp);
  }
}

/* Installs the fault handler once per process; returns 0 or errno. */
int tinyhal_install_fault_handler(void) {
  static int installed = 0;
  if (__atomic_exchange_n(&installed, 1, __ATOMIC_ACQ_REL)) return 0;
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = tinyhal_fault_handler;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < TINYHAL_FAULT_SIGNAL_COUNT; ++i) {
    if (sigaction(tinyhal_fault_signals[i], &action, &tinyhal_previous_actions[i]) != 0) {
      return errno;
    }
  }
  return 0;
}

/* Calls a library's query function under the fault trap: a corrupt library must not
 * kill the process while it is loaded either. Returns the header; *fault_signal is the
 * signal if the query faulted (and NULL is returned), else 0. */
const tinyhal_library_header_t** tinyhal_library_query_contained(
    void* query, uint32_t max_version, const tinyhal_environment_t* environment,
    int* fault_signal) {
  tinyhal_trap_t trap;
  *fault_signal = 0;
  tinyhal_ensure_signal_stack();
  if (sigsetjmp(trap.jump, 0)) {
    tinyhal_unblock(trap.signal);
    *fault_signal = trap.signal;
    return NULL;
  }
  TINYHAL_PAD_STACK();
  tinyhal_active_trap = &trap;
  const tinyhal_library_header_t** header =
      ((tinyhal_query_fn_t)query)(max_version, environment);
  tinyhal_active_trap = NULL;
  return header;
}

/* The last contained fault: signal, program counter and faulting address. */
void tinyhal_last_fault_info(uint64_t* out) { memcpy(out, tinyhal_last_fault, sizeof(tinyhal_last_fault)); }

static int tinyhal_run_range(tinyhal_dispatch_fn_t fn, const tinyhal_environment_t* environment,
                             const tinyhal_dispatch_state_t* state,
                             tinyhal_workgroup_state_t* wg, uint64_t begin, uint64_t end,
                             uint64_t* failed_index) {
  const uint64_t cx = state->workgroup_count_x, cy = state->workgroup_count_y;
  const uint64_t plane = cx * cy;
  uint64_t z = begin / plane, rem = begin % plane;
  uint64_t y = rem / cx, x = rem % cx;
  volatile uint64_t current = begin;
  tinyhal_trap_t trap;
  tinyhal_ensure_signal_stack();
  if (sigsetjmp(trap.jump, 0)) {
    tinyhal_unblock(trap.signal);
    if (failed_index) *failed_index = current;
    return TINYHAL_FAULT_STATUS - trap.signal;
  }
  TINYHAL_PAD_STACK();
  tinyhal_active_trap = &trap;
  for (uint64_t i = begin; i < end; ++i) {
    current = i;
    wg->workgroup_id_x = (uint32_t)x;
    wg->workgroup_id_y = (uint32_t)y;
    wg->workgroup_id_z = (uint16_t)z;
    int rc = fn(environment, state, wg);
    if (rc != 0) {
      tinyhal_active_trap = NULL;
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
  tinyhal_active_trap = NULL;
  return 0;
}

/* What a thread sets up to run workgroups: its workgroup state, its local memory, and
 * flush-to-zero / denormals-are-zero for the duration (as IREE does around dispatches). */
typedef struct tinyhal_participant_t {
  tinyhal_workgroup_state_t wg;
  unsigned int saved_csr;
} tinyhal_participant_t;

/* Returns 0, or -12 (reported as RESOURCE_EXHAUSTED) when local memory is unavailable. */
static int tinyhal_participant_enter(tinyhal_participant_t* p, uint32_t processor_id,
                                     uint32_t local_memory_size) {
  memset(p, 0, sizeof(*p));
  p->wg.processor_id = processor_id;
  if (local_memory_size) {
    size_t rounded = ((size_t)local_memory_size + 63u) & ~(size_t)63u;
    p->wg.local_memory = aligned_alloc(64, rounded);
    if (!p->wg.local_memory) return -12;
    p->wg.local_memory_size = local_memory_size;
  }
#ifdef TINYHAL_HAVE_MXCSR
  p->saved_csr = _mm_getcsr();
  _mm_setcsr(p->saved_csr | 0x8040u);
#endif
  return 0;
}

static void tinyhal_participant_leave(tinyhal_participant_t* p) {
#ifdef TINYHAL_HAVE_MXCSR
  _mm_setcsr(p->saved_csr);
#endif
  free(p->wg.local_memory);
}

/* Claims tiles of `tile` workgroups from *cursor until the grid of `total` is exhausted or
 * *abort_flag is set; any number of threads may run this concurrently on one dispatch. */
int tinyhal_dispatch_workgroups(tinyhal_dispatch_fn_t fn,
                                const tinyhal_environment_t* environment,
                                const tinyhal_dispatch_state_t* state,
                                uint32_t local_memory_size, uint32_t processor_id,
                                uint64_t* cursor, uint64_t tile, uint64_t total,
                                int* abort_flag, uint64_t* failed_index) {
  tinyhal_participant_t participant;
  if (tinyhal_participant_enter(&participant, processor_id, local_memory_size) != 0) {
    return -12;
  }
  if (tile == 0) tile = 1;
  int rc = 0;
  for (;;) {
    if (abort_flag && __atomic_load_n(abort_flag, __ATOMIC_RELAXED)) break;
    uint64_t begin = __atomic_fetch_add(cursor, tile, __ATOMIC_RELAXED);
    if (begin >= total) break;
    uint64_t end = begin + tile < total ? begin + tile : total;
    rc = tinyhal_run_range(fn, environment, state, &participant.wg, begin, end, failed_index);
    if (rc != 0) {
      if (abort_flag) __atomic_store_n(abort_flag, 1, __ATOMIC_RELAXED);
      break;
    }
  }
  tinyhal_participant_leave(&participant);
  return rc;
}

/* The import thunk IREE's ABI asks the host for: calls an import with its context. */
static int tinyhal_import_thunk_impl(tinyhal_import_fn_t fn, void* params, void* context,
                                     void* reserved) {
  return fn(params, context, reserved);
}

tinyhal_import_thunk_t tinyhal_import_thunk(void) { return tinyhal_import_thunk_impl; }

#if defined(__x86_64__)
#include <cpuid.h>

static void tinyhal_cpuid(unsigned leaf, unsigned subleaf, unsigned max_basic, unsigned max_ext,
                          unsigned regs[4]) {
  regs[0] = regs[1] = regs[2] = regs[3] = 0;
  unsigned bound = (leaf & 0x80000000u) ? max_ext : max_basic;
  if (leaf <= bound) __cpuid_count(leaf, subleaf, regs[0], regs[1], regs[2], regs[3]);
}

#define TINYHAL_BIT(reg, bit, out_bit) ((uint64_t)(((reg) >> (bit)) & 1u) << (out_bit))

/* Word 0 of the processor data IREE's runtime hands executables on x86-64: the feature
   bits of IREE's cpu_feature_bits table, each taken from its CPUID leaf, and the AVX and
   AVX-512 families only when CPUID leaf 0xD reports their register state. */
static uint64_t tinyhal_cpu_word0(void) {
  unsigned r[4], l1[4], l70[4], l71[4], ld[4], le1[4];
  __cpuid(0, r[0], r[1], r[2], r[3]);
  unsigned max_basic = r[0];
  __cpuid(0x80000000u, r[0], r[1], r[2], r[3]);
  unsigned max_ext = r[0];
  tinyhal_cpuid(1, 0, max_basic, max_ext, l1);
  tinyhal_cpuid(7, 0, max_basic, max_ext, l70);
  tinyhal_cpuid(7, 1, max_basic, max_ext, l71);
  tinyhal_cpuid(0xD, 0, max_basic, max_ext, ld);
  tinyhal_cpuid(0x80000001u, 0, max_basic, max_ext, le1);
  uint64_t w = TINYHAL_BIT(l1[2], 0, 0) | TINYHAL_BIT(l1[2], 9, 1) | TINYHAL_BIT(l1[2], 19, 2) |
               TINYHAL_BIT(l1[2], 20, 3) | TINYHAL_BIT(le1[2], 6, 4);
  if ((ld[0] & 0x7u) == 0x7u) {
    w |= TINYHAL_BIT(l1[2], 28, 10) | TINYHAL_BIT(l1[2], 12, 11) | TINYHAL_BIT(le1[2], 16, 12) |
         TINYHAL_BIT(le1[2], 11, 13) | TINYHAL_BIT(l1[2], 29, 14) | TINYHAL_BIT(l70[1], 5, 15);
  }
  if ((ld[0] & 0xE7u) == 0xE7u) {
    w |= TINYHAL_BIT(l70[1], 16, 20) | TINYHAL_BIT(l70[1], 28, 21) | TINYHAL_BIT(l70[1], 31, 22) |
         TINYHAL_BIT(l70[1], 17, 23) | TINYHAL_BIT(l70[1], 30, 24) | TINYHAL_BIT(l70[1], 21, 25) |
         TINYHAL_BIT(l70[2], 1, 26) | TINYHAL_BIT(l70[2], 14, 27) | TINYHAL_BIT(l70[2], 11, 28) |
         TINYHAL_BIT(l70[2], 6, 29) | TINYHAL_BIT(l70[2], 12, 30) | TINYHAL_BIT(l71[0], 5, 31) |
         TINYHAL_BIT(l70[3], 23, 32);
  }
  if ((ld[0] & 0x60000u) == 0x60000u) {
    w |= TINYHAL_BIT(l70[3], 24, 50) | TINYHAL_BIT(l70[3], 25, 51) | TINYHAL_BIT(l70[3], 22, 52);
  }
  return w;
}
#endif

void tinyhal_cpu_data(uint64_t* out, uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) out[i] = 0;
#if defined(__x86_64__)
  if (count > 0) out[0] = tinyhal_cpu_word0();
#endif
}

/* ---- Streams: a whole submission's operations run in C ---------------------------------
 *
 * One leader walks the operation list in order; at each operation of more than one tile
 * (a dispatch's workgroups, a large fill's or copy's bytes) it posts the operation and
 * claims tiles, and any number of helpers may join a posted operation to claim tiles
 * too. Before moving past an operation the leader waits for the helpers still inside it, so
 * every operation completes before the next starts (commands already arrive in order and
 * a barrier needs nothing more). Helpers are never waited for unless they joined, so a
 * helper that starts late (or never) cannot stall the stream.
 *
 * `post` packs (generation << 32 | active helpers): a helper joins only the generation it
 * saw, so it can never join a dispatch the leader has already left.
 */

static long tinyhal_futex(uint32_t* word, int op, uint32_t value) {
  return syscall(SYS_futex, word, op, value, NULL, NULL, 0);
}

static inline void tinyhal_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

#define TINYHAL_STREAM_SPIN_NS 200000 /* between the dispatches of one stream */
/* Fills and copies are shared in tiles of this many bytes (a multiple of every pattern
 * length), as IREE's task executor tiles them. */
#define TINYHAL_TRANSFER_TILE ((uint64_t)64 * 1024)

static void tinyhal_fill(uint8_t* dst, uint64_t length, uint32_t pattern, uint32_t n) {
  if (n == 1) {
    memset(dst, (int)(pattern & 0xFF), length);
  } else if (n == 2) {
    uint16_t p = (uint16_t)pattern;
    for (uint64_t i = 0; i + 2 <= length; i += 2) memcpy(dst + i, &p, 2);
  } else {
    for (uint64_t i = 0; i + 4 <= length; i += 4) memcpy(dst + i, &pattern, 4);
  }
}

static uint64_t tinyhal_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Runs units [begin, end) of an operation: workgroups of a dispatch (returns its status),
 * or bytes of a fill or copy (tiles start at multiples of TINYHAL_TRANSFER_TILE, so of
 * every pattern length). */
static int tinyhal_op_run(tinyhal_op_t* op, tinyhal_workgroup_state_t* wg, uint64_t begin,
                          uint64_t end, uint64_t* failed) {
  switch (op->kind) {
    case TINYHAL_OP_DISPATCH:
      return tinyhal_run_range(op->fn, op->environment, op->state, wg, begin, end, failed);
    case TINYHAL_OP_FILL:
      tinyhal_fill((uint8_t*)op->dst + begin, end - begin, op->pattern, op->pattern_length);
      return 0;
    case TINYHAL_OP_COPY:
      memmove((uint8_t*)op->dst + begin, (const uint8_t*)op->src + begin, end - begin);
      return 0;
    default:
      return 0;
  }
}

/* Claims tiles of an operation until none are left, the stream aborts, or (with a nonzero
 * `deadline_ns`) the clock passes it after a tile: then returns TINYHAL_PAUSED with tiles
 * left, else 0 (the clock is read only between tiles, so an operation of one tile costs
 * no clock read here: its leader read it before the operation). */
#define TINYHAL_PAUSED 1
static int tinyhal_stream_claim(tinyhal_stream_t* stream, tinyhal_op_t* op, uint32_t op_index,
                                tinyhal_workgroup_state_t* wg, uint64_t deadline_ns) {
  uint64_t failed = 0;
  int rc = 0;
  for (int ran = 0;; ran = 1) {
    if (__atomic_load_n(&stream->abort, __ATOMIC_RELAXED)) break;
    if (ran && deadline_ns && __atomic_load_n(&op->cursor, __ATOMIC_RELAXED) < op->length &&
        tinyhal_now_ns() >= deadline_ns) {
      return TINYHAL_PAUSED;
    }
    uint64_t begin = __atomic_fetch_add(&op->cursor, op->tile, __ATOMIC_RELAXED);
    if (begin >= op->length) break;
    uint64_t end = begin + op->tile < op->length ? begin + op->tile : op->length;
    rc = tinyhal_op_run(op, wg, begin, end, &failed);
    if (rc != 0) {
      int expected = 0;
      if (__atomic_compare_exchange_n(&stream->status, &expected, rc, 0, __ATOMIC_ACQ_REL,
                                      __ATOMIC_RELAXED)) {
        stream->failed_op = op_index;
        stream->failed_workgroup = failed;
      }
      __atomic_store_n(&stream->abort, 1, __ATOMIC_RELEASE);
      break;
    }
  }
  return 0; /* a failure is in `stream->status` */
}

/* Sleeping and waking on a shared word. A thread about to sleep counts itself in
 * `*sleepers` first, and a bump makes the wake system call only when someone may sleep:
 * with sequentially consistent order on both sides, either the bumper sees the sleeper or
 * the sleeper sees the new value (and the kernel rechecks it again). A stream run by one
 * participant (the sync driver) so never enters the kernel.
 *
 * Before sleeping a waiter stays awake for up to `spin_ns`, which bridges the short gaps
 * between the dispatches of one stream: briefly with `pause`, then yielding the CPU on
 * each check, so that on a loaded machine a waiter never holds back the very thread it
 * waits for (or anyone else's) when they share a core. */
#define TINYHAL_PAUSE_SPINS 64 /* ~2 us of `pause` before yielding */

static void tinyhal_wait_word(uint32_t* sleepers, uint32_t* word, uint32_t seen,
                              uint64_t spin_ns) {
  if (spin_ns) {
    for (int i = 0; i < TINYHAL_PAUSE_SPINS; ++i) {
      if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen) return;
      tinyhal_pause();
    }
    uint64_t deadline = tinyhal_now_ns() + spin_ns;
    do {
      if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen) return;
      sched_yield();
    } while (tinyhal_now_ns() < deadline);
  }
  while (__atomic_load_n(word, __ATOMIC_ACQUIRE) == seen) {
    __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(word, __ATOMIC_SEQ_CST) == seen) {
      tinyhal_futex(word, FUTEX_WAIT_PRIVATE, seen);
    }
    __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
  }
}

static void tinyhal_bump_word(uint32_t* sleepers, uint32_t* word) {
  __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST)) {
    tinyhal_futex(word, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF);
  }
}

/* Closes the posted dispatch to new joiners, then waits for the helpers inside it. */
static void tinyhal_stream_close(tinyhal_stream_t* stream) {
  uint64_t state = __atomic_load_n(&stream->post, __ATOMIC_ACQUIRE);
  while (!__atomic_compare_exchange_n(&stream->post, &state,
                                      (((state >> 32) + 1) << 32) | (state & 0xFFFFFFFFu), 0,
                                      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
  for (;;) {
    uint32_t seen = __atomic_load_n(&stream->left, __ATOMIC_ACQUIRE);
    if ((__atomic_load_n(&stream->post, __ATOMIC_ACQUIRE) & 0xFFFFFFFFu) == 0) break;
    tinyhal_wait_word(&stream->sleepers, &stream->left, seen, TINYHAL_STREAM_SPIN_NS);
  }
}

typedef struct tinyhal_pool_t tinyhal_pool_t;
static int tinyhal_stream_post(tinyhal_pool_t* pool, tinyhal_stream_t* stream,
                               uint32_t local_memory_size);

/* Whether a stream about to start has an operation of several tiles: then it is posted
 * to the helpers at once, so that waking them overlaps the leader's first operations;
 * a stream of one-tile operations never wakes a helper. */
static int tinyhal_stream_shares(const tinyhal_op_t* ops, uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) {
    if (ops[i].tile < ops[i].length) return 1;
  }
  return 0;
}

/* Leader: runs the operations in order from `stream->resume`, sharing operations of
 * several tiles with `pool`'s helpers (may be NULL; a stream not posted yet, one that
 * paused before it reached such an operation, is posted then). Returns 0 once the stream
 * is done (its status says how), or TINYHAL_PAUSED when `deadline_ns` (nonzero) passed
 * first: `resume`/`resume_open` then say where the next leader goes on, and a dispatch in
 * progress stays open to its helpers meanwhile. */
static int tinyhal_stream_lead(tinyhal_pool_t* pool, uint32_t local_memory_size,
                               tinyhal_op_t* ops, uint32_t count, tinyhal_stream_t* stream,
                               tinyhal_workgroup_state_t* wg, uint64_t deadline_ns) {
  uint32_t i = stream->resume;
  int open = stream->resume_open;
  stream->resume_open = 0;
  for (; i < count; ++i) {
    tinyhal_op_t* op = &ops[i];
    int shared = open; /* a paused operation, still posted to its helpers */
    open = 0;
    if (!shared) {
      if (__atomic_load_n(&stream->abort, __ATOMIC_RELAXED)) break;
      if (deadline_ns && tinyhal_now_ns() >= deadline_ns) {
        stream->resume = i;
        return TINYHAL_PAUSED;
      }
      if (op->kind == TINYHAL_OP_BARRIER) continue; /* operations already run in order */
      if (stream->times) stream->times[2 * i] = tinyhal_now_ns();
    }
    if (op->local_memory_size > wg->local_memory_size) {
      __atomic_store_n(&stream->status, -12, __ATOMIC_RELEASE); /* RESOURCE_EXHAUSTED */
      __atomic_store_n(&stream->abort, 1, __ATOMIC_RELEASE);
      if (shared) tinyhal_stream_close(stream);
      continue;
    }
    if (!shared) {
      if (op->tile >= op->length || !pool ||
          !(stream->posted || tinyhal_stream_post(pool, stream, local_memory_size))) {
        /* One tile (nothing to share, so no helper is disturbed for it), or no helpers
         * to share with. */
        if (tinyhal_stream_claim(stream, op, i, wg, deadline_ns) == TINYHAL_PAUSED) {
          stream->resume = i;
          return TINYHAL_PAUSED;
        }
        if (stream->times) stream->times[2 * i + 1] = tinyhal_now_ns();
        continue;
      }
      __atomic_store_n(&stream->leader_cpu, sched_getcpu(), __ATOMIC_RELAXED);
      /* Post: helpers see the op, then the new generation. */
      __atomic_store_n(&stream->current, op, __ATOMIC_RELEASE);
      __atomic_store_n(&stream->current_index, i, __ATOMIC_RELEASE);
      uint64_t post = __atomic_load_n(&stream->post, __ATOMIC_ACQUIRE);
      uint64_t posted = ((post >> 32) + 1) << 32;
      while (!__atomic_compare_exchange_n(&stream->post, &post, posted | (post & 0xFFFFFFFFu),
                                          0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        posted = ((post >> 32) + 1) << 32;
      }
      tinyhal_bump_word(&stream->sleepers, &stream->wake);
    }
    if (tinyhal_stream_claim(stream, op, i, wg, deadline_ns) == TINYHAL_PAUSED) {
      stream->resume = i;
      stream->resume_open = 1;
      return TINYHAL_PAUSED;
    }
    tinyhal_stream_close(stream);
    if (stream->times) stream->times[2 * i + 1] = tinyhal_now_ns();
  }
  stream->resume = count;
  __atomic_store_n(&stream->done, 1, __ATOMIC_RELEASE);
  tinyhal_bump_word(&stream->sleepers, &stream->wake);
  return 0;
}

typedef struct tinyhal_helper_t tinyhal_helper_t;
static void tinyhal_helper_steer(tinyhal_helper_t* self, int leader_cpu);

/* Helper: joins posted dispatches until the stream is done. */
static void tinyhal_stream_help(tinyhal_stream_t* stream, tinyhal_workgroup_state_t* wg,
                                tinyhal_helper_t* self) {
  uint64_t last_generation = 0;
  for (;;) {
    uint32_t seen = __atomic_load_n(&stream->wake, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&stream->done, __ATOMIC_ACQUIRE)) return;
    uint64_t post = __atomic_load_n(&stream->post, __ATOMIC_ACQUIRE);
    uint64_t generation = post >> 32;
    /* Odd generations are open dispatches; join each one at most once. */
    if ((generation & 1u) && generation != last_generation) {
      if (__atomic_compare_exchange_n(&stream->post, &post, post + 1, 0, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE)) {
        last_generation = generation;
        tinyhal_helper_steer(self, __atomic_load_n(&stream->leader_cpu, __ATOMIC_RELAXED));
        tinyhal_op_t* op = __atomic_load_n(&stream->current, __ATOMIC_ACQUIRE);
        uint32_t index = __atomic_load_n(&stream->current_index, __ATOMIC_ACQUIRE);
        if (op->local_memory_size <= wg->local_memory_size) {
          tinyhal_stream_claim(stream, op, index, wg, 0);
        }
        __atomic_sub_fetch(&stream->post, 1, __ATOMIC_ACQ_REL);
        tinyhal_bump_word(&stream->sleepers, &stream->left);
      }
      continue;
    }
    tinyhal_wait_word(&stream->sleepers, &stream->wake, seen, TINYHAL_STREAM_SPIN_NS);
  }
}

/* Whether a copy's source and target bytes overlap (then it runs as one memmove). */
static int tinyhal_ranges_overlap(const tinyhal_op_t* op) {
  uintptr_t dst = (uintptr_t)op->dst, src = (uintptr_t)op->src;
  return dst < src + op->length && src < dst + op->length;
}

/* Readies a recorded stream for one execution: writes each binding's address and length
 * where its patch points, rewinds every operation's cursor, sizes tiles for
 * `participants` (fills and copies in TINYHAL_TRANSFER_TILE bytes when there are
 * several, a copy whose ranges overlap whole), and clears the shared run state. */
void tinyhal_stream_bind(tinyhal_op_t* ops, uint32_t count, tinyhal_stream_t* stream,
                         const tinyhal_patch_t* patches, uint32_t patch_count,
                         const uint64_t* slot_addresses, const uint64_t* slot_lengths,
                         uint32_t participants, uint32_t tiles_per_participant) {
  for (uint32_t i = 0; i < patch_count; ++i) {
    const tinyhal_patch_t* p = &patches[i];
    uint64_t address = slot_addresses[p->slot] + p->offset;
    memcpy(p->address, &address, sizeof(address));
    if (p->length) {
      uint64_t size = p->size == TINYHAL_WHOLE_SLOT ? slot_lengths[p->slot] - p->offset : p->size;
      memcpy(p->length, &size, sizeof(size));
    }
  }
  uint64_t share = (uint64_t)(participants ? participants : 1) * tiles_per_participant;
  for (uint32_t i = 0; i < count; ++i) {
    tinyhal_op_t* op = &ops[i];
    op->cursor = 0;
    uint64_t tile = op->length;
    if (op->kind == TINYHAL_OP_DISPATCH) {
      tile = share ? op->length / share : op->length;
    } else if (participants > 1 &&
               (op->kind == TINYHAL_OP_FILL ||
                (op->kind == TINYHAL_OP_COPY && !tinyhal_ranges_overlap(op)))) {
      tile = TINYHAL_TRANSFER_TILE;
    }
    op->tile = tile ? tile : 1;
  }
  memset(stream, 0, sizeof(*stream));
}

/* ---- Stream helpers: native threads that join a stream its leader runs -----------------
 *
 * A pool of plain C threads that never touch Python (so never the GIL). The thread that
 * readies a submission leads its stream: when the stream has an operation of several
 * tiles it posts the stream to the pool at its start (so a stream of one-tile operations
 * never wakes a helper), and the helpers wake, attach, claim tiles of its dispatches like
 * any helper, and detach when it is done. The leader returns only once every helper that attached has detached, so the
 * stream's memory may be reused as soon as it returns. One stream is posted at a time; a
 * second leader meanwhile runs its stream alone (the helpers are busy anyway).
 *
 * A helper that attached checks that the stream is still posted before touching it, with
 * sequentially consistent order against the leader's unposting, so a leader that sees no
 * attached helper after unposting is never joined late.
 *
 * An idle helper stays awake for `idle_spin_ns` after each stream before it sleeps, so
 * the streams of back-to-back invocations can find it awake.
 */

struct tinyhal_helper_t {
  tinyhal_pool_t* pool;
  uint32_t processor_id;
  int avoided_cpu; /* the leader's CPU its affinity leaves out, or -1 */
  pthread_t thread;
  int started;
};

struct tinyhal_pool_t {
  uint32_t wake;     /* bumped for every post and for stop; idle helpers wait on it */
  uint32_t left;     /* bumped when a helper detaches; a finishing leader waits on it */
  uint32_t sleepers; /* threads in (or entering) a futex wait on `wake` or `left` */
  uint32_t attached; /* helpers inside the posted stream */
  int stop;
  int busy;          /* a leader owns the pool (posts, runs, waits for detaching) */
  uint32_t local_memory_size; /* of the posted stream */
  int steer;          /* keep helpers off the leader's CPU */
  cpu_set_t allowed;  /* the CPUs the process may use, at creation */
  uint64_t idle_spin_ns;
  tinyhal_stream_t* job; /* the posted stream, or NULL */
  pid_t owner;        /* the process whose threads the helpers are (not a fork child) */
  uint32_t helper_count;
  tinyhal_helper_t helpers[];
};

/* Keeps the calling helper off `leader_cpu`: woken there it would only take turns with the
 * leader. A system call only when the leader's CPU changed; needs another allowed CPU. */
static void tinyhal_helper_steer(tinyhal_helper_t* self, int leader_cpu) {
  tinyhal_pool_t* pool = self->pool;
  if (!pool->steer || leader_cpu < 0 || leader_cpu == self->avoided_cpu) return;
  self->avoided_cpu = leader_cpu;
  if (leader_cpu >= CPU_SETSIZE || !CPU_ISSET(leader_cpu, &pool->allowed) ||
      CPU_COUNT(&pool->allowed) < 2) {
    return;
  }
  cpu_set_t others = pool->allowed;
  CPU_CLR(leader_cpu, &others);
  (void)sched_setaffinity(0, sizeof(others), &others);
}

static void* tinyhal_helper_main(void* arg) {
  tinyhal_helper_t* self = (tinyhal_helper_t*)arg;
  tinyhal_pool_t* pool = self->pool;
#ifdef TINYHAL_HAVE_MXCSR
  _mm_setcsr(_mm_getcsr() | 0x8040u); /* this thread only ever runs kernels */
#endif
  tinyhal_workgroup_state_t wg;
  memset(&wg, 0, sizeof(wg));
  wg.processor_id = self->processor_id;
  uint32_t joined = 0;
  int has_joined = 0;
  for (;;) {
    uint32_t seen = __atomic_load_n(&pool->wake, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool->stop, __ATOMIC_ACQUIRE)) break;
    tinyhal_stream_t* job = __atomic_load_n(&pool->job, __ATOMIC_SEQ_CST);
    if (job && !(has_joined && joined == seen)) {
      __atomic_add_fetch(&pool->attached, 1, __ATOMIC_SEQ_CST);
      /* Still posted after attaching: the leader now waits for this helper to detach. */
      if (__atomic_load_n(&pool->job, __ATOMIC_SEQ_CST) == job) {
        uint32_t need = __atomic_load_n(&pool->local_memory_size, __ATOMIC_ACQUIRE);
        if (need > wg.local_memory_size) {
          size_t rounded = ((size_t)need + 63u) & ~(size_t)63u;
          void* grown = aligned_alloc(64, rounded);
          if (grown) { /* else dispatches needing it are left to the leader */
            free(wg.local_memory);
            wg.local_memory = grown;
            wg.local_memory_size = need;
          }
        }
        tinyhal_helper_steer(self, __atomic_load_n(&job->leader_cpu, __ATOMIC_RELAXED));
        tinyhal_stream_help(job, &wg, self);
        joined = seen;
        has_joined = 1;
      }
      __atomic_sub_fetch(&pool->attached, 1, __ATOMIC_SEQ_CST);
      tinyhal_bump_word(&pool->sleepers, &pool->left);
      continue;
    }
    tinyhal_wait_word(&pool->sleepers, &pool->wake, seen,
                      __atomic_load_n(&pool->idle_spin_ns, __ATOMIC_RELAXED));
  }
  free(wg.local_memory);
  return NULL;
}

/* Starts `helper_count` helpers with processor ids 1..helper_count (the leader is 0).
 * With `steer`, a helper keeps off the CPU its stream's leader last posted from (by its
 * affinity, changed only when the leader's CPU changes). Returns NULL when not even the pool's
 * memory is available; fewer helpers start if the system refuses threads (`*started`
 * says how many). */
tinyhal_pool_t* tinyhal_pool_create(uint32_t helper_count, uint64_t idle_spin_ns, int steer,
                                    uint32_t* started) {
  tinyhal_pool_t* pool =
      (tinyhal_pool_t*)calloc(1, sizeof(tinyhal_pool_t) + helper_count * sizeof(tinyhal_helper_t));
  if (started) *started = 0;
  if (!pool) return NULL;
  pool->idle_spin_ns = idle_spin_ns;
  pool->owner = getpid();
  pool->steer = steer && sched_getaffinity(0, sizeof(pool->allowed), &pool->allowed) == 0;
  for (uint32_t i = 0; i < helper_count; ++i) {
    tinyhal_helper_t* h = &pool->helpers[pool->helper_count];
    h->pool = pool;
    h->processor_id = i + 1;
    h->avoided_cpu = -1;
    if (pthread_create(&h->thread, NULL, tinyhal_helper_main, h) != 0) break;
    h->started = 1;
    ++pool->helper_count;
  }
  if (started) *started = pool->helper_count;
  return pool;
}

/* Stops and joins the helpers (a stream still running finishes with its leader alone).
 * Idempotent; the memory stays until `tinyhal_pool_free`. */
void tinyhal_pool_stop(tinyhal_pool_t* pool) {
  if (!pool || pool->owner != getpid()) return; /* a fork child has no helper threads */
  __atomic_store_n(&pool->stop, 1, __ATOMIC_SEQ_CST);
  tinyhal_bump_word(&pool->sleepers, &pool->wake);
  for (uint32_t i = 0; i < pool->helper_count; ++i) {
    tinyhal_helper_t* h = &pool->helpers[i];
    if (h->started) {
      pthread_join(h->thread, NULL);
      h->started = 0;
    }
  }
}

void tinyhal_pool_free(tinyhal_pool_t* pool) {
  tinyhal_pool_stop(pool);
  free(pool);
}

/* Posts `stream` to the pool's helpers, if no other stream has it and it still runs;
 * returns whether it did (the stream then owns the pool until its leader ends it). */
static int tinyhal_stream_post(tinyhal_pool_t* pool, tinyhal_stream_t* stream,
                               uint32_t local_memory_size) {
  if (__atomic_load_n(&pool->stop, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&pool->busy, __ATOMIC_RELAXED)) {
    return 0;
  }
  /* A fork child has the pool's memory but none of its threads. */
  if (pool->owner != getpid()) return 0;
  int expected = 0;
  if (!__atomic_compare_exchange_n(&pool->busy, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_RELAXED)) {
    return 0;
  }
  __atomic_store_n(&pool->local_memory_size, local_memory_size, __ATOMIC_RELAXED);
  __atomic_store_n(&stream->leader_cpu, sched_getcpu(), __ATOMIC_RELAXED);
  __atomic_store_n(&pool->job, stream, __ATOMIC_SEQ_CST);
  tinyhal_bump_word(&pool->sleepers, &pool->wake);
  stream->posted = 1;
  return 1;
}

/* Leads a bound stream (processor id 0) with the pool's helpers joining its dispatches;
 * `pool` may be NULL (the stream runs alone). Returns 0 or the first failing status once
 * the stream is done. With a nonzero `budget_ns` it may instead stop when that much time
 * has passed with work left, setting `*paused`: the stream keeps the pool (its helpers go
 * on with the dispatch in progress), and another call, on any thread, leads it on. A
 * paused stream must be led to the end; setting `abort` first makes that quick. */
int tinyhal_run_stream(tinyhal_pool_t* pool, tinyhal_op_t* ops, uint32_t count,
                       tinyhal_stream_t* stream, uint32_t local_memory_size, uint64_t budget_ns,
                       int* paused) {
  tinyhal_participant_t participant;
  /* Without local memory the dispatches that need it fail with -12 (leader's check). */
  (void)tinyhal_participant_enter(&participant, 0, local_memory_size);
  uint64_t deadline_ns = budget_ns ? tinyhal_now_ns() + budget_ns : 0;
  tinyhal_pool_t* sharing = pool && pool->helper_count ? pool : NULL;
  if (sharing && !stream->posted && stream->resume == 0 &&
      tinyhal_stream_shares(ops, count)) {
    (void)tinyhal_stream_post(sharing, stream, local_memory_size);
  }
  int stopped = tinyhal_stream_lead(sharing, local_memory_size, ops, count, stream,
                                    &participant.wg, deadline_ns);
  if (paused) *paused = stopped == TINYHAL_PAUSED;
  if (!stopped && stream->posted) {
    __atomic_store_n(&pool->job, NULL, __ATOMIC_SEQ_CST);
    for (;;) {
      uint32_t seen = __atomic_load_n(&pool->left, __ATOMIC_SEQ_CST);
      if (__atomic_load_n(&pool->attached, __ATOMIC_SEQ_CST) == 0) break;
      tinyhal_wait_word(&pool->sleepers, &pool->left, seen, TINYHAL_STREAM_SPIN_NS);
    }
    stream->posted = 0;
    __atomic_store_n(&pool->busy, 0, __ATOMIC_RELEASE);
  }
  tinyhal_participant_leave(&participant);
  return stopped ? 0 : __atomic_load_n(&stream->status, __ATOMIC_ACQUIRE);
}

/* `tinyhal_stream_bind` for `participants`, then `tinyhal_run_stream` led by this thread
 * (`pool` NULL: alone), in one call: a ready submission's whole path in C with one GIL
 * release. `times` (may be NULL) receives each operation's start and end, as
 * `stream->times`; `budget_ns` and `*paused` are `tinyhal_run_stream`'s. */
int tinyhal_bind_and_run(tinyhal_pool_t* pool, tinyhal_op_t* ops, uint32_t count,
                         tinyhal_stream_t* stream, const tinyhal_patch_t* patches,
                         uint32_t patch_count, const uint64_t* slot_addresses,
                         const uint64_t* slot_lengths, uint32_t participants,
                         uint32_t tiles_per_participant, uint32_t local_memory_size,
                         uint64_t* times, uint64_t budget_ns, int* paused) {
  tinyhal_stream_bind(ops, count, stream, patches, patch_count, slot_addresses, slot_lengths,
                      participants, tiles_per_participant);
  stream->times = times;
  return tinyhal_run_stream(pool, ops, count, stream, local_memory_size, budget_ns, paused);
}
