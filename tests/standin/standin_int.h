/*
 * standin_int.h — what the two halves of the stand-in CUDA driver share:
 * cuda_standin.c (configuration, devices, contexts, memory) and
 * standin_exec.c (streams, events, modules, kernel launches).  See the top
 * of cuda_standin.c for what the stand-in is.
 *
 * Locking: one mutex (standin__lock) guards every table of both files, and
 * one condition (standin__changed) is broadcast whenever something a waiter
 * may wait for happened (a stream went idle, an event completed, a context
 * faulted).  Nothing runs user code or a kernel while holding the lock.
 */
#ifndef STANDIN_INT_H
#define STANDIN_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/kvs_cuda_int.h"

/*
 * Every entry point, declared from the lists kvshare resolves: the C name is
 * the table's field (cuMemAlloc), the exported symbol the name kvshare asks
 * dlsym for (cuMemAlloc_v2).  So a signature or a symbol that drifts from
 * kvs_cuda_int.h fails to compile here, not at run time.
 */
#define STANDIN_PROTO(field, sym, args) CUresult field args __asm__(sym);
KVS_CU_CORE(STANDIN_PROTO)
KVS_CU_VMM(STANDIN_PROTO)
KVS_CU_BATCH(STANDIN_PROTO)
#undef STANDIN_PROTO

/* CUresult values kvs_cuda_int.h does not name (cuda.h's numbers). */
#define CUDA_ERROR_ALREADY_MAPPED 208
#define CUDA_ERROR_NOT_MAPPED 211
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713

/* Failure points of KVS_STANDIN_FAIL, in the order of their names. */
enum standin_fail {
  FAIL_INIT,
  FAIL_VMM,
  FAIL_POSIX_FD,
  FAIL_CREATE,
  FAIL_EXPORT,
  FAIL_IMPORT,
  FAIL_RESERVE,
  FAIL_MAP,
  FAIL_SET_ACCESS,
  FAIL_MODULE,
  FAIL_LAUNCH,
  FAIL_HOSTFUNC,
  FAIL_COPY,
  FAIL_FAULT,
  FAIL_BATCH,
  FAIL__COUNT
};

/* A device's primary context (one per device, never destroyed). */
struct CUctx_st {
  int dev;
  int refs;        /* cuDevicePrimaryCtxRetain calls */
  CUresult sticky; /* CUDA_ERROR_ILLEGAL_ADDRESS once a kernel faulted */
};

extern pthread_mutex_t standin__lock;
extern pthread_cond_t standin__changed;

/*
 * Every entry point but cuGetErrorString starts with this: 0, or
 * CUDA_ERROR_NOT_PERMITTED inside a host function (cuLaunchHostFunc's
 * rule), or CUDA_ERROR_NOT_INITIALIZED before a successful cuInit and in a
 * child forked after it (CUDA cannot be used across fork).
 */
CUresult standin__enter(void);
#define STANDIN_ENTER()                                                      \
  do {                                                                       \
    CUresult enter_r_ = standin__enter();                                    \
    if (enter_r_ != CUDA_SUCCESS)                                            \
      return enter_r_;                                                       \
  } while (0)

/* The calling thread's current context; CUDA_ERROR_INVALID_CONTEXT when it
 * has none. */
CUresult standin__current(struct CUctx_st **ctx);

/* Counts a call of failure point f: 1 when KVS_STANDIN_FAIL says this call
 * fails. */
int standin__fail(enum standin_fail f);
/* KVS_STANDIN_COPY_DELAY_MS: how long each async copy takes. */
extern unsigned standin__copy_delay_ms;
extern int standin__pinned_only; /* KVS_STANDIN_PINNED_ONLY */

/* Set by the stream threads around a host function (see standin__enter). */
extern __thread int standin__in_host_fn;

/*
 * Is [p, p + n) device-accessible memory: cuMemAlloc memory, VMM mappings
 * whose access is set (read-write when `write`), or registered host memory?
 * One allocation must hold it all, except that it may run on through
 * back-to-back mappings of one reservation.  Takes the lock.
 */
int standin__dev_range(const void *p, size_t n, int write);
/* p in device memory proper (cuMemAlloc, a VMM mapping), not pinned host
 * memory: which way a batched copy goes. */
int standin__on_device(const void *p);
/* Is [p, p + n) inside memory registered with cuMemHostRegister? */
int standin__host_registered(const void *p, size_t n);

/* The context lost: prints one line (what went wrong) to stderr and makes
 * every later synchronisation of ctx return CUDA_ERROR_ILLEGAL_ADDRESS. */
void standin__fault(struct CUctx_st *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Waits, lock held, until no stream of ctx has work left: every stream
 * (all = 1, cuCtxSynchronize) or the blocking ones only (all = 0, what an
 * operation on the legacy NULL stream waits for). */
void standin__drain_locked(struct CUctx_st *ctx, int all);

#endif /* STANDIN_INT_H */
