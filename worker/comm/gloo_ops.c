/* The Gloo communicator as a comm.h implementation (comm_impl.h), and
 * mega_comm_create, which makes one. */
#include "worker/comm/comm_impl.h"
#include "worker/comm/gloo.h"

static void g_destroy(void *c) { gloo_comm_destroy(c); }
static mega_status g_status(void *c, mega_err *err) { return gloo_comm_status(c, err); }
static void g_abort(void *c) { gloo_comm_abort(c); }

static mega_status g_isend(void *c, const void *buf, size_t n, int peer, uint32_t tag,
                           void **req, mega_err *err) {
  return gloo_isend(c, buf, n, peer, tag, (GlooReq **)req, err);
}

static mega_status g_irecv(void *c, void *buf, size_t n, int peer, uint32_t tag, void **req,
                           mega_err *err) {
  return gloo_irecv(c, buf, n, peer, tag, (GlooReq **)req, err);
}

static mega_status g_iall_reduce(void *c, float *buf, size_t count, bool max, int timeout_ms,
                                 void **req, mega_err *err) {
  return gloo_iall_reduce(c, buf, count, max, timeout_ms, (GlooReq **)req, err);
}

static mega_status g_iall_gather(void *c, const void *in, void *out, const size_t *counts,
                                 mega_dtype dt, int timeout_ms, void **req, mega_err *err) {
  return gloo_iall_gather(c, in, out, counts, dt, timeout_ms, (GlooReq **)req, err);
}

static mega_status g_ibroadcast(void *c, void *buf, size_t count, mega_dtype dt, int root,
                                int timeout_ms, void **req, mega_err *err) {
  return gloo_ibroadcast(c, buf, count, dt, root, timeout_ms, (GlooReq **)req, err);
}

static mega_status g_ireduce_scatter(void *c, const float *in, float *out, const size_t *counts,
                                     int timeout_ms, void **req, mega_err *err) {
  return gloo_ireduce_scatter(c, in, out, counts, timeout_ms, (GlooReq **)req, err);
}

static mega_status g_ibarrier(void *c, int timeout_ms, void **req, mega_err *err) {
  return gloo_ibarrier(c, timeout_ms, (GlooReq **)req, err);
}

static mega_status g_wait(void *r, int timeout_ms, mega_err *err) {
  return gloo_req_wait(r, timeout_ms, err);
}

static mega_status g_test(void *r, bool *done, mega_err *err) {
  return gloo_req_test(r, done, err);
}

static void g_free(void *r) { gloo_req_free(r); }

static bool g_times(const void *r, mega_req_times *t) { return gloo_req_times(r, t); }

static const char *g_transport(const void *c) { return gloo_comm_transport(c); }

static const mega_comm_ops gloo_ops = {
    .name = "gloo",
    .destroy = g_destroy,
    .status = g_status,
    .abort = g_abort,
    .isend = g_isend,
    .irecv = g_irecv,
    .iall_reduce = g_iall_reduce,
    .iall_gather = g_iall_gather,
    .ibroadcast = g_ibroadcast,
    .ireduce_scatter = g_ireduce_scatter,
    .ibarrier = g_ibarrier,
    .req_wait = g_wait,
    .req_test = g_test,
    .req_free = g_free,
    .req_times = g_times,
    .transport = g_transport,
};

mega_status mega_comm_create(mega_store *store, const char *group, int rank, int size,
                             const char *hostname, int timeout_ms, mega_comm **out,
                             mega_err *err) {
  if (!out) return mega_fail(err, MEGA_ERR_INVALID, "mega_comm_create: out is NULL");
  *out = NULL;
  GlooComm *g = NULL;
  mega_status st = gloo_comm_create(store, group, rank, size, hostname, timeout_ms, &g, err);
  if (st != MEGA_OK) return st;
  return mega_comm_wrap(&gloo_ops, g, rank, size, out, err);
}
