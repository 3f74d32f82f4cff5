/* tinyhal_stream.h: the runtime's own C types for running a submission in C (internal;
 * kernels never see these). */
#ifndef TINYHAL_STREAM_H_
#define TINYHAL_STREAM_H_

#include <stdint.h>

#include "tinyhal_executable.h"

enum {
  TINYHAL_OP_DISPATCH = 0,
  TINYHAL_OP_FILL = 1,
  TINYHAL_OP_COPY = 2,
  TINYHAL_OP_BARRIER = 3
};

/* One operation of a stream, claimed `tile` units at a time through `cursor`: a dispatch
 * (fn/environment/state over `length` workgroups), a fill of `length` bytes at `dst` with
 * a 1/2/4-byte pattern, or a copy (memmove) of `length` bytes from `src` to `dst`. */
typedef struct tinyhal_op_t {
  uint32_t kind;
  uint32_t pattern_length;
  uint64_t length;
  uint64_t tile;
  uint64_t cursor;
  void* dst;
  const void* src;
  uint32_t pattern;
  uint32_t local_memory_size;
  tinyhal_dispatch_fn_t fn;
  const tinyhal_environment_t* environment;
  const tinyhal_dispatch_state_t* state;
} tinyhal_op_t;

/* Shared state of one stream run; zero-initialize before the first participant. */
typedef struct tinyhal_stream_t {
  int done;
  int abort;
  int status;
  uint32_t wake;
  uint32_t left;
  uint32_t current_index;
  uint32_t failed_op;
  uint64_t failed_workgroup;
  uint64_t post;
  tinyhal_op_t* current;
  uint32_t sleepers; /* threads in (or entering) a futex wait on `wake` or `left` */
  uint32_t resume;   /* where a paused leader stopped: the next operation to lead */
  int resume_open;   /* ... which is a posted dispatch, still open to helpers */
  int posted;        /* the stream is posted to a helper pool (the pool is its own) */
  int leader_cpu;    /* the leader's CPU at its latest post, which helpers keep off */
  uint64_t* times;   /* NULL, or 2 per operation: when its leader began it and when it
                      * ended (CLOCK_MONOTONIC ns), for a profile; set after binding */
} tinyhal_stream_t;

/* Where one binding of a recorded stream goes: on each execution the 8-byte word at
 * `address` receives the slot's address plus `offset`, and (if `length` is not NULL) the
 * word at `length` receives `size`, or the rest of the slot after `offset` when `size`
 * is TINYHAL_WHOLE_SLOT. Slots index the `slot_addresses`/`slot_lengths` of one execution. */
#define TINYHAL_WHOLE_SLOT UINT64_MAX
typedef struct tinyhal_patch_t {
  uint64_t slot;
  uint64_t offset;
  uint64_t size;
  void* address;
  void* length;
} tinyhal_patch_t;

#endif /* TINYHAL_STREAM_H_ */
