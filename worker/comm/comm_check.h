/* A communicator that checks each buffer's memory before it forwards a call
 * (comm_check.c): how a CPU test proves that a call site which would run on
 * NCCL on a GPU only hands it device memory, and one on the host
 * communicator only host memory. */
#ifndef MEGA_WORKER_COMM_CHECK_H
#define MEGA_WORKER_COMM_CHECK_H

#include "worker/comm/comm.h"

/* Whether [p, p+bytes) is the kind of memory the communicator takes. */
typedef bool (*mega_comm_mem_check)(void *ctx, const void *p, size_t bytes);

/* A communicator over inner (owned: destroyed with it, or at once on
 * failure) whose every operation first checks its buffers with ok(ctx, ...)
 * and fails with MEGA_ERR_INTERNAL, naming what ("device memory"), when one
 * is not. */
mega_status mega_comm_check_wrap(mega_comm *inner, mega_comm_mem_check ok, void *ctx,
                                 const char *what, mega_comm **out, mega_err *err);

#endif
