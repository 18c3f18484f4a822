/* What an implementation of comm.h provides: a table of operations on its
 * own communicator and request objects (impl), which comm.c wraps in
 * mega_comm and mega_req and dispatches to. Gloo fills one (gloo_ops.c) for
 * cpu ranks; NCCL fills another inside the cuda module for cuda ranks. Every
 * contract of comm.h (ordering, matching, timeouts, failures, abort from
 * any thread) is the implementation's to keep; the blocking calls are the
 * non-blocking ones followed by a wait, here, for every implementation. */
#ifndef MEGA_WORKER_COMM_IMPL_H
#define MEGA_WORKER_COMM_IMPL_H

#include "worker/comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mega_comm_ops {
  const char *name; /* "gloo", "nccl" */
  void (*destroy)(void *impl);
  mega_status (*status)(void *impl, mega_err *err);
  void (*abort)(void *impl);
  mega_status (*isend)(void *impl, const void *buf, size_t nbytes, int peer, uint32_t tag,
                       void **req, mega_err *err);
  mega_status (*irecv)(void *impl, void *buf, size_t nbytes, int peer, uint32_t tag,
                       void **req, mega_err *err);
  /* max: the element-wise maximum instead of the sum */
  mega_status (*iall_reduce)(void *impl, float *buf, size_t count, bool max, int timeout_ms,
                             void **req, mega_err *err);
  mega_status (*iall_gather)(void *impl, const void *in, void *out, const size_t *counts,
                             mega_dtype dt, int timeout_ms, void **req, mega_err *err);
  mega_status (*ibroadcast)(void *impl, void *buf, size_t count, mega_dtype dt, int root,
                            int timeout_ms, void **req, mega_err *err);
  mega_status (*ireduce_scatter)(void *impl, const float *in, float *out, const size_t *counts,
                                 int timeout_ms, void **req, mega_err *err);
  mega_status (*ibarrier)(void *impl, int timeout_ms, void **req, mega_err *err);
  mega_status (*req_wait)(void *req, int timeout_ms, mega_err *err);
  mega_status (*req_test)(void *req, bool *done, mega_err *err);
  void (*req_free)(void *req);
  /* Optional (NULL: times unknown): comm.h's mega_req_get_times. */
  bool (*req_times)(const void *req, mega_req_times *t);
  /* Optional (NULL: the name): comm.h's mega_comm_transport. */
  const char *(*transport)(const void *impl);
} mega_comm_ops;

/* A communicator over impl (owned: destroyed with it). On failure impl is
 * destroyed too. */
mega_status mega_comm_wrap(const mega_comm_ops *ops, void *impl, int rank, int size,
                           mega_comm **out, mega_err *err);

#ifdef __cplusplus
}
#endif

#endif
