/* A communicator that checks where every buffer handed to it lives before
 * passing the call on to the communicator it wraps: a test that builds a
 * rank's device and host communicators on CPU (both Gloo) wraps each in one,
 * so a call site that puts host memory on the device communicator (which on
 * a GPU would be NCCL, reading device memory only) fails at once instead of
 * passing by luck. */
#include <stdio.h>
#include <stdlib.h>

#include "worker/comm/comm_check.h"
#include "worker/comm/comm_impl.h"

typedef struct checked {
  mega_comm *inner;
  mega_comm_mem_check ok;
  void *ctx;
  char what[64];
} checked;

static mega_status need(checked *c, const void *p, size_t bytes, const char *op, mega_err *err) {
  if (bytes == 0 || c->ok(c->ctx, p, bytes)) return MEGA_OK;
  return mega_fail(err, MEGA_ERR_INTERNAL,
                   "the communicator for %s was given %zu bytes at %p (%s) that are not %s",
                   c->what, bytes, p, op, c->what);
}

static size_t esize(mega_dtype dt) { return dt == MEGA_DT_F32 ? sizeof(float) : 1; }

static void c_destroy(void *impl) {
  checked *c = impl;
  mega_comm_destroy(c->inner);
  free(c);
}

static mega_status c_status(void *impl, mega_err *err) {
  return mega_comm_status(((checked *)impl)->inner, err);
}

static void c_abort(void *impl) { mega_comm_abort(((checked *)impl)->inner); }

static mega_status c_isend(void *impl, const void *buf, size_t n, int peer, uint32_t tag,
                           void **req, mega_err *err) {
  checked *c = impl;
  mega_status st = need(c, buf, n, "send", err);
  return st ? st : mega_comm_isend(c->inner, buf, n, peer, tag, (mega_req **)req, err);
}

static mega_status c_irecv(void *impl, void *buf, size_t n, int peer, uint32_t tag, void **req,
                           mega_err *err) {
  checked *c = impl;
  mega_status st = need(c, buf, n, "receive", err);
  return st ? st : mega_comm_irecv(c->inner, buf, n, peer, tag, (mega_req **)req, err);
}

static mega_status c_iall_reduce(void *impl, float *buf, size_t count, bool max, int timeout_ms,
                                 void **req, mega_err *err) {
  checked *c = impl;
  mega_status st = need(c, buf, count * sizeof(float), "all-reduce", err);
  if (st) return st;
  return max ? mega_comm_iall_reduce_max(c->inner, buf, count, timeout_ms, (mega_req **)req, err)
             : mega_comm_iall_reduce(c->inner, buf, count, timeout_ms, (mega_req **)req, err);
}

static mega_status c_iall_gather(void *impl, const void *in, void *out, const size_t *counts,
                                 mega_dtype dt, int timeout_ms, void **req, mega_err *err) {
  checked *c = impl;
  int n = mega_comm_size(c->inner), me = mega_comm_rank(c->inner);
  size_t total = 0;
  for (int i = 0; i < n; i++) total += counts[i];
  mega_status st = need(c, in, counts[me] * esize(dt), "all-gather's input", err);
  if (!st) st = need(c, out, total * esize(dt), "all-gather's output", err);
  return st ? st
            : mega_comm_iall_gather(c->inner, in, out, counts, dt, timeout_ms, (mega_req **)req,
                                    err);
}

static mega_status c_ibroadcast(void *impl, void *buf, size_t count, mega_dtype dt, int root,
                                int timeout_ms, void **req, mega_err *err) {
  checked *c = impl;
  mega_status st = need(c, buf, count * esize(dt), "broadcast", err);
  return st ? st
            : mega_comm_ibroadcast(c->inner, buf, count, dt, root, timeout_ms, (mega_req **)req,
                                   err);
}

static mega_status c_ireduce_scatter(void *impl, const float *in, float *out,
                                     const size_t *counts, int timeout_ms, void **req,
                                     mega_err *err) {
  checked *c = impl;
  int n = mega_comm_size(c->inner), me = mega_comm_rank(c->inner);
  size_t total = 0;
  for (int i = 0; i < n; i++) total += counts[i];
  mega_status st = need(c, in, total * sizeof(float), "reduce-scatter's input", err);
  if (!st) st = need(c, out, counts[me] * sizeof(float), "reduce-scatter's output", err);
  return st ? st
            : mega_comm_ireduce_scatter(c->inner, in, out, counts, timeout_ms, (mega_req **)req,
                                        err);
}

static mega_status c_ibarrier(void *impl, int timeout_ms, void **req, mega_err *err) {
  return mega_comm_ibarrier(((checked *)impl)->inner, timeout_ms, (mega_req **)req, err);
}

static mega_status c_req_wait(void *req, int timeout_ms, mega_err *err) {
  return mega_req_wait(req, timeout_ms, err);
}

static mega_status c_req_test(void *req, bool *done, mega_err *err) {
  return mega_req_test(req, done, err);
}

static void c_req_free(void *req) { mega_req_free(req); }

static const char *c_transport(const void *impl) {
  return mega_comm_transport(((const checked *)impl)->inner);
}

static const mega_comm_ops checked_ops = {
    .name = "checked",
    .destroy = c_destroy,
    .status = c_status,
    .abort = c_abort,
    .isend = c_isend,
    .irecv = c_irecv,
    .iall_reduce = c_iall_reduce,
    .iall_gather = c_iall_gather,
    .ibroadcast = c_ibroadcast,
    .ireduce_scatter = c_ireduce_scatter,
    .ibarrier = c_ibarrier,
    .req_wait = c_req_wait,
    .req_test = c_req_test,
    .req_free = c_req_free,
    .transport = c_transport,
};

mega_status mega_comm_check_wrap(mega_comm *inner, mega_comm_mem_check ok, void *ctx,
                                 const char *what, mega_comm **out, mega_err *err) {
  *out = NULL;
  checked *c = calloc(1, sizeof *c);
  if (!c) {
    mega_comm_destroy(inner);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for a checked communicator");
  }
  *c = (checked){.inner = inner, .ok = ok, .ctx = ctx};
  snprintf(c->what, sizeof c->what, "%s", what);
  return mega_comm_wrap(&checked_ops, c, mega_comm_rank(inner), mega_comm_size(inner), out, err);
}
