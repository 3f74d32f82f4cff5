/* The workgroup loop and library loading: the only C in the runtime itself.
 *
 * Python calls in once per dispatch (or once per worker for a tiled dispatch) and these
 * loops call the kernel once per workgroup, so no Python runs per workgroup and cffi
 * releases the GIL for the whole grid.
 */
#include <dlfcn.h>
#include <alloca.h>
#include <errno.h>
#include <pthread.h>
#include <linux/futex.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
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

/* ---- Streams: a whole submission's operations run in C ---------------------------------
 *
 * One leader walks the operation list in order; at each dispatch it posts the dispatch
 * and claims tiles, and any number of helpers may join a posted dispatch to claim tiles
 * too. Before moving past a dispatch the leader waits for the helpers still inside it, so
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

#define TINYHAL_SPIN_ITERATIONS 4000 /* ~20-40 us: bridges the gap between dispatches */

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

static int tinyhal_stream_dispatch(tinyhal_stream_t* stream, tinyhal_op_t* op, uint32_t op_index,
                                   tinyhal_workgroup_state_t* wg) {
  uint64_t failed = 0;
  int rc = 0;
  for (;;) {
    if (__atomic_load_n(&stream->abort, __ATOMIC_RELAXED)) break;
    uint64_t begin = __atomic_fetch_add(&op->cursor, op->tile, __ATOMIC_RELAXED);
    if (begin >= op->length) break;
    uint64_t end = begin + op->tile < op->length ? begin + op->tile : op->length;
    rc = tinyhal_run_range(op->fn, op->environment, op->state, wg, begin, end, &failed);
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
  return rc;
}

/* Sleeping and waking on a stream word. A thread about to sleep counts itself in
 * `stream->sleepers` first, and a bump makes the wake system call only when someone may
 * sleep: with sequentially consistent order on both sides, either the bumper sees the
 * sleeper or the sleeper sees the new value (and the kernel rechecks it again). A stream
 * run by one participant (the sync driver) so never enters the kernel. */
static void tinyhal_wait_word(tinyhal_stream_t* stream, uint32_t* word, uint32_t seen) {
  for (int i = 0; i < TINYHAL_SPIN_ITERATIONS; ++i) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen) return;
    tinyhal_pause();
  }
  while (__atomic_load_n(word, __ATOMIC_ACQUIRE) == seen) {
    __atomic_add_fetch(&stream->sleepers, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(word, __ATOMIC_SEQ_CST) == seen) {
      tinyhal_futex(word, FUTEX_WAIT_PRIVATE, seen);
    }
    __atomic_sub_fetch(&stream->sleepers, 1, __ATOMIC_SEQ_CST);
  }
}

static void tinyhal_bump_word(tinyhal_stream_t* stream, uint32_t* word) {
  __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&stream->sleepers, __ATOMIC_SEQ_CST)) {
    tinyhal_futex(word, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF);
  }
}

/* Leader: runs every operation in order. Returns 0 or the first failing status. */
static int tinyhal_stream_lead(tinyhal_op_t* ops, uint32_t count, tinyhal_stream_t* stream,
                               tinyhal_workgroup_state_t* wg) {
  for (uint32_t i = 0; i < count && !__atomic_load_n(&stream->abort, __ATOMIC_RELAXED); ++i) {
    tinyhal_op_t* op = &ops[i];
    switch (op->kind) {
      case TINYHAL_OP_DISPATCH: {
        if (op->local_memory_size > wg->local_memory_size) {
          __atomic_store_n(&stream->status, -12, __ATOMIC_RELEASE);
          __atomic_store_n(&stream->abort, 1, __ATOMIC_RELEASE);
          break;
        }
        /* Post: helpers see the op, then the new generation. */
        __atomic_store_n(&stream->current, op, __ATOMIC_RELEASE);
        __atomic_store_n(&stream->current_index, i, __ATOMIC_RELEASE);
        uint64_t post = __atomic_load_n(&stream->post, __ATOMIC_ACQUIRE);
        uint64_t posted = ((post >> 32) + 1) << 32;
        while (!__atomic_compare_exchange_n(&stream->post, &post, posted | (post & 0xFFFFFFFFu),
                                            0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
          posted = ((post >> 32) + 1) << 32;
        }
        tinyhal_bump_word(stream, &stream->wake);
        tinyhal_stream_dispatch(stream, op, i, wg);
        /* Leave: close the generation to new joiners, then wait for joined helpers. */
        uint64_t state = __atomic_load_n(&stream->post, __ATOMIC_ACQUIRE);
        while (!__atomic_compare_exchange_n(&stream->post, &state,
                                            (((state >> 32) + 1) << 32) | (state & 0xFFFFFFFFu),
                                            0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
        for (;;) {
          uint32_t seen = __atomic_load_n(&stream->left, __ATOMIC_ACQUIRE);
          if ((__atomic_load_n(&stream->post, __ATOMIC_ACQUIRE) & 0xFFFFFFFFu) == 0) break;
          tinyhal_wait_word(stream, &stream->left, seen);
        }
        break;
      }
      case TINYHAL_OP_FILL:
        tinyhal_fill((uint8_t*)op->dst, op->length, op->pattern, op->pattern_length);
        break;
      case TINYHAL_OP_COPY:
        memmove(op->dst, op->src, op->length);
        break;
      default:
        break;
    }
  }
  __atomic_store_n(&stream->done, 1, __ATOMIC_RELEASE);
  tinyhal_bump_word(stream, &stream->wake);
  return __atomic_load_n(&stream->status, __ATOMIC_ACQUIRE);
}

/* Helper: joins posted dispatches until the stream is done. */
static void tinyhal_stream_help(tinyhal_stream_t* stream, tinyhal_workgroup_state_t* wg) {
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
        tinyhal_op_t* op = __atomic_load_n(&stream->current, __ATOMIC_ACQUIRE);
        uint32_t index = __atomic_load_n(&stream->current_index, __ATOMIC_ACQUIRE);
        if (op->local_memory_size <= wg->local_memory_size) {
          tinyhal_stream_dispatch(stream, op, index, wg);
        }
        __atomic_sub_fetch(&stream->post, 1, __ATOMIC_ACQ_REL);
        tinyhal_bump_word(stream, &stream->left);
      }
      continue;
    }
    tinyhal_wait_word(stream, &stream->wake, seen);
  }
}

int tinyhal_run_stream(tinyhal_op_t* ops, uint32_t count, tinyhal_stream_t* stream,
                       uint32_t processor_id, uint32_t local_memory_size) {
  tinyhal_participant_t participant;
  /* Without local memory the dispatches that need it fail with -12 (leader's check). */
  (void)tinyhal_participant_enter(&participant, processor_id, local_memory_size);
  int rc = 0;
  int expected = 0;
  if (__atomic_compare_exchange_n(&stream->leader, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_RELAXED)) {
    rc = tinyhal_stream_lead(ops, count, stream, &participant.wg);
  } else {
    tinyhal_stream_help(stream, &participant.wg);
  }
  tinyhal_participant_leave(&participant);
  return rc;
}

/* Readies a recorded stream for one execution: writes each binding's address and length
 * where its patch points, rewinds every operation's cursor, sizes dispatch tiles for
 * `participants`, and clears the shared run state. */
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
    ops[i].cursor = 0;
    if (ops[i].kind == TINYHAL_OP_DISPATCH) {
      uint64_t tile = share ? ops[i].length / share : ops[i].length;
      ops[i].tile = tile ? tile : 1;
    }
  }
  memset(stream, 0, sizeof(*stream));
}
