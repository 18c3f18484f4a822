/* comm.h's calls, dispatched to the implementation a communicator was made
 * with (comm_impl.h). The blocking collectives are their non-blocking twins
 * and a wait, for every implementation. */
#include <stdlib.h>

#include "worker/comm/comm_impl.h"

struct mega_comm {
  const mega_comm_ops *ops;
  void *impl;
  int rank, size;
};

struct mega_req {
  const mega_comm_ops *ops;
  void *impl;
};

mega_status mega_comm_wrap(const mega_comm_ops *ops, void *impl, int rank, int size,
                           mega_comm **out, mega_err *err) {
  mega_comm *c = malloc(sizeof *c);
  if (!c) {
    ops->destroy(impl);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for a communicator");
  }
  *c = (mega_comm){.ops = ops, .impl = impl, .rank = rank, .size = size};
  *out = c;
  return MEGA_OK;
}

void mega_comm_destroy(mega_comm *comm) {
  if (!comm) return;
  comm->ops->destroy(comm->impl);
  free(comm);
}

const char *mega_comm_transport(const mega_comm *comm) {
  if (!comm) return "";
  return comm->ops->transport ? comm->ops->transport(comm->impl) : comm->ops->name;
}

int mega_comm_rank(const mega_comm *comm) { return comm ? comm->rank : -1; }
int mega_comm_size(const mega_comm *comm) { return comm ? comm->size : 0; }

mega_status mega_comm_status(const mega_comm *comm, mega_err *err) {
  if (!comm) return mega_fail(err, MEGA_ERR_INVALID, "mega_comm_status: comm is NULL");
  return comm->ops->status(comm->impl, err);
}

void mega_comm_abort(mega_comm *comm) {
  if (comm) comm->ops->abort(comm->impl);
}

/* Wraps the implementation's request r (st its posting's result). */
static mega_status wrap_req(const mega_comm *comm, mega_status st, void *r, mega_req **req,
                            mega_err *err) {
  if (st != MEGA_OK) return st;
  mega_req *w = malloc(sizeof *w);
  if (!w) {
    comm->ops->req_free(r); /* cancels it: comm.h's "Buffer lifetime" */
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for a request");
  }
  *w = (mega_req){.ops = comm->ops, .impl = r};
  *req = w;
  return MEGA_OK;
}

#define NEED_COMM(fn)                                                               \
  do {                                                                              \
    if (req) *req = NULL;                                                           \
    if (!comm) return mega_fail(err, MEGA_ERR_INVALID, "%s: comm is NULL", fn);     \
    if (!req) return mega_fail(err, MEGA_ERR_INVALID, "%s: req is NULL", fn);       \
  } while (0)

mega_status mega_comm_isend(mega_comm *comm, const void *buf, size_t nbytes, int peer,
                            uint32_t tag, mega_req **req, mega_err *err) {
  NEED_COMM("mega_comm_isend");
  void *r = NULL;
  mega_status st = comm->ops->isend(comm->impl, buf, nbytes, peer, tag, &r, err);
  return wrap_req(comm, st, r, req, err);
}

mega_status mega_comm_irecv(mega_comm *comm, void *buf, size_t nbytes, int peer, uint32_t tag,
                            mega_req **req, mega_err *err) {
  NEED_COMM("mega_comm_irecv");
  void *r = NULL;
  mega_status st = comm->ops->irecv(comm->impl, buf, nbytes, peer, tag, &r, err);
  return wrap_req(comm, st, r, req, err);
}

mega_status mega_req_wait(mega_req *req, int timeout_ms, mega_err *err) {
  if (!req) return mega_fail(err, MEGA_ERR_INVALID, "mega_req_wait: req is NULL");
  return req->ops->req_wait(req->impl, timeout_ms, err);
}

mega_status mega_req_test(mega_req *req, bool *done, mega_err *err) {
  if (!req || !done)
    return mega_fail(err, MEGA_ERR_INVALID, "mega_req_test: req or done is NULL");
  return req->ops->req_test(req->impl, done, err);
}

void mega_req_free(mega_req *req) {
  if (!req) return;
  req->ops->req_free(req->impl);
  free(req);
}

bool mega_req_get_times(const mega_req *req, mega_req_times *t) {
  *t = (mega_req_times){0};
  if (!req || !req->ops->req_times) return false;
  return req->ops->req_times(req->impl, t);
}

/* A blocking call: its non-blocking twin's result st, then a wait. */
static mega_status blocking(mega_status st, mega_req *r, int timeout_ms, mega_err *err) {
  if (st != MEGA_OK) return st;
  st = mega_req_wait(r, timeout_ms, err);
  mega_req_free(r);
  return st;
}

mega_status mega_comm_iall_reduce(mega_comm *comm, float *buf, size_t count, int timeout_ms,
                                  mega_req **req, mega_err *err) {
  NEED_COMM("mega_comm_iall_reduce");
  void *r = NULL;
  mega_status st = comm->ops->iall_reduce(comm->impl, buf, count, false, timeout_ms, &r, err);
  return wrap_req(comm, st, r, req, err);
}

mega_status mega_comm_all_reduce(mega_comm *comm, float *buf, size_t count, int timeout_ms,
                                 mega_err *err) {
  mega_req *r = NULL;
  mega_status st = mega_comm_iall_reduce(comm, buf, count, timeout_ms, &r, err);
  return blocking(st, r, timeout_ms, err);
}

mega_status mega_comm_iall_reduce_max(mega_comm *comm, float *buf, size_t count,
                                      int timeout_ms, mega_req **req, mega_err *err) {
  NEED_COMM("mega_comm_iall_reduce_max");
  void *r = NULL;
  mega_status st = comm->ops->iall_reduce(comm->impl, buf, count, true, timeout_ms, &r, err);
  return wrap_req(comm, st, r, req, err);
}

mega_status mega_comm_all_reduce_max(mega_comm *comm, float *buf, size_t count, int timeout_ms,
                                     mega_err *err) {
  mega_req *r = NULL;
  mega_status st = mega_comm_iall_reduce_max(comm, buf, count, timeout_ms, &r, err);
  return blocking(st, r, timeout_ms, err);
}

mega_status mega_comm_iall_gather(mega_comm *comm, const void *in, void *out,
                                  const size_t *counts, mega_dtype dt, int timeout_ms,
                                  mega_req **req, mega_err *err) {
  NEED_COMM("mega_comm_iall_gather");
  void *r = NULL;
  mega_status st = comm->ops->iall_gather(comm->impl, in, out, counts, dt, timeout_ms, &r, err);
  return wrap_req(comm, st, r, req, err);
}

mega_status mega_comm_all_gather(mega_comm *comm, const void *in, void *out,
                                 const size_t *counts, mega_dtype dt, int timeout_ms,
                                 mega_err *err) {
  mega_req *r = NULL;
  mega_status st = mega_comm_iall_gather(comm, in, out, counts, dt, timeout_ms, &r, err);
  return blocking(st, r, timeout_ms, err);
}

mega_status mega_comm_ibroadcast(mega_comm *comm, void *buf, size_t count, mega_dtype dt,
                                 int root, int timeout_ms, mega_req **req, mega_err *err) {
  NEED_COMM("mega_comm_ibroadcast");
  void *r = NULL;
  mega_status st = comm->ops->ibroadcast(comm->impl, buf, count, dt, root, timeout_ms, &r, err);
  return wrap_req(comm, st, r, req, err);
}

mega_status mega_comm_broadcast(mega_comm *comm, void *buf, size_t count, mega_dtype dt,
                                int root, int timeout_ms, mega_err *err) {
  mega_req *r = NULL;
  mega_status st = mega_comm_ibroadcast(comm, buf, count, dt, root, timeout_ms, &r, err);
  return blocking(st, r, timeout_ms, err);
}

mega_status mega_comm_ireduce_scatter(mega_comm *comm, const float *in, float *out,
                                      const size_t *counts, int timeout_ms, mega_req **req,
                                      mega_err *err) {
  NEED_COMM("mega_comm_ireduce_scatter");
  void *r = NULL;
  mega_status st = comm->ops->ireduce_scatter(comm->impl, in, out, counts, timeout_ms, &r, err);
  return wrap_req(comm, st, r, req, err);
}

mega_status mega_comm_reduce_scatter(mega_comm *comm, const float *in, float *out,
                                     const size_t *counts, int timeout_ms, mega_err *err) {
  mega_req *r = NULL;
  mega_status st = mega_comm_ireduce_scatter(comm, in, out, counts, timeout_ms, &r, err);
  return blocking(st, r, timeout_ms, err);
}

mega_status mega_comm_ibarrier(mega_comm *comm, int timeout_ms, mega_req **req, mega_err *err) {
  NEED_COMM("mega_comm_ibarrier");
  void *r = NULL;
  mega_status st = comm->ops->ibarrier(comm->impl, timeout_ms, &r, err);
  return wrap_req(comm, st, r, req, err);
}

mega_status mega_comm_barrier(mega_comm *comm, int timeout_ms, mega_err *err) {
  mega_req *r = NULL;
  mega_status st = mega_comm_ibarrier(comm, timeout_ms, &r, err);
  return blocking(st, r, timeout_ms, err);
}
