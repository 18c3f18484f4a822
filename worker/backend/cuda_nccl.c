/* NCCL as a comm.h implementation (comm_impl.h), inside the cuda module.
 *
 * Ordering: every operation first makes its NCCL stream wait for the work
 * already queued on the backend's compute stream (an event), so it reads
 * what the model wrote; a request is an event recorded after the operation,
 * which the engine tests or waits on. Sends, receives and collectives run
 * on three streams: a send and a receive between the same two ranks posted
 * one at a time would otherwise queue behind each other and deadlock.
 * NCCL matches point-to-point operations by their order per peer; the
 * tag is not used (the engine posts them in the same order on both sides,
 * as Megatron's schedules do).
 *
 * Failure: the communicator is created non-blocking, so every wait polls
 * with a bound; a timeout, an asynchronous NCCL error or mega_comm_abort
 * calls ncclCommAbort, which ends every operation in flight, and the
 * communicator is broken from then on (comm.h). Buffers are device memory.
 * Nothing here has run on a GPU yet. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/backend/cuda_internal.h"

enum { SEND_STREAM, RECV_STREAM, COLL_STREAM, NSTREAMS };

typedef struct nccl_comm {
  ncclComm_t comm;
  mega_backend *be; /* told what each operation writes (its bf16 copies) */
  cudaStream_t compute, streams[NSTREAMS];
  cudaEvent_t ready; /* compute's queued work, for each operation */
  int rank, size, timeout_ms;
  float *scratch; /* one float, for barriers */
  pthread_mutex_t mu;
  atomic_bool broken;
  mega_status cause;
  char why[256];
} nccl_comm;

typedef struct nccl_req {
  nccl_comm *c;
  cudaEvent_t done;
  bool finished;
  mega_status st;
  char why[256];
  double posted; /* for the timeout */
} nccl_req;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Breaks the communicator with its first cause and aborts NCCL's work. */
static void break_comm(nccl_comm *c, mega_status st, const char *why) {
  pthread_mutex_lock(&c->mu);
  bool first = !atomic_load(&c->broken);
  if (first) {
    c->cause = st;
    snprintf(c->why, sizeof c->why, "%s", why);
    atomic_store(&c->broken, true);
  }
  pthread_mutex_unlock(&c->mu);
  if (first && c->comm) ncclCommAbort(c->comm);
}

static mega_status report(nccl_comm *c, mega_err *err) {
  if (!atomic_load(&c->broken)) return MEGA_OK;
  pthread_mutex_lock(&c->mu);
  mega_status st = mega_fail(err, c->cause, "%s", c->why);
  pthread_mutex_unlock(&c->mu);
  return st;
}

/* An NCCL call's result: in progress is fine (non-blocking), else a cause. */
static mega_status nccl_ok(nccl_comm *c, ncclResult_t r, const char *what, mega_err *err) {
  if (r == ncclSuccess || r == ncclInProgress) return MEGA_OK;
  char why[256];
  snprintf(why, sizeof why, "NCCL %s (rank %d of %d): %s", what, c->rank, c->size,
           ncclGetErrorString(r));
  break_comm(c, MEGA_ERR_PEER, why);
  return report(c, err);
}

/* Orders stream s after the compute stream's queued work. */
static mega_status order_after_compute(nccl_comm *c, cudaStream_t s, mega_err *err) {
  cudaError_t e = cudaEventRecord(c->ready, c->compute);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s, c->ready, 0);
  if (e == cudaSuccess) return MEGA_OK;
  return mega_fail(err, MEGA_ERR_INTERNAL, "NCCL: ordering after compute: %s",
                   cudaGetErrorString(e));
}

static mega_status finish_post(nccl_comm *c, cudaStream_t s, void **req, mega_err *err) {
  nccl_req *r = calloc(1, sizeof *r);
  if (!r) return mega_fail(err, MEGA_ERR_NOMEM, "NCCL: out of memory for a request");
  r->c = c;
  r->posted = now_ms();
  cudaError_t e = cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(r->done, s);
  if (e != cudaSuccess) {
    free(r);
    return mega_fail(err, MEGA_ERR_INTERNAL, "NCCL: request event: %s", cudaGetErrorString(e));
  }
  *req = r;
  return MEGA_OK;
}

/* ---- requests ---- */

static mega_status req_poll(nccl_req *r, bool *done, mega_err *err) {
  nccl_comm *c = r->c;
  *done = false;
  if (r->finished) {
    *done = true;
    return r->st == MEGA_OK ? MEGA_OK : mega_fail(err, r->st, "%s", r->why);
  }
  mega_status st = report(c, err);
  if (st == MEGA_OK) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(c->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) st = nccl_ok(c, async, "operation", err);
  }
  if (st == MEGA_OK) {
    cudaError_t e = cudaEventQuery(r->done);
    if (e == cudaErrorNotReady) return MEGA_OK;
    if (e != cudaSuccess)
      st = mega_fail(err, MEGA_ERR_INTERNAL, "NCCL: %s", cudaGetErrorString(e));
  }
  r->finished = true;
  r->st = st;
  if (st != MEGA_OK) snprintf(r->why, sizeof r->why, "%.255s", err ? err->msg : "failed");
  *done = true;
  return st;
}

static mega_status n_req_test(void *req, bool *done, mega_err *err) {
  return req_poll(req, done, err);
}

static mega_status n_req_wait(void *req, int timeout_ms, mega_err *err) {
  nccl_req *r = req;
  int limit = timeout_ms > 0 ? timeout_ms : r->c->timeout_ms;
  double start = now_ms();
  for (;;) {
    bool done;
    mega_status st = req_poll(r, &done, err);
    if (done) return st;
    if (now_ms() - start > limit) {
      char why[160];
      snprintf(why, sizeof why, "NCCL operation on rank %d timed out after %d ms", r->c->rank,
               limit);
      break_comm(r->c, MEGA_ERR_TIMEOUT, why);
      return report(r->c, err);
    }
    struct timespec ts = {0, 50000}; /* 50 us */
    nanosleep(&ts, NULL);
  }
}

static void n_req_free(void *req) {
  nccl_req *r = req;
  if (!r) return;
  if (!r->finished) { /* comm.h: freeing an unfinished request cancels it */
    bool done;
    if (req_poll(r, &done, NULL) == MEGA_OK && !done)
      break_comm(r->c, MEGA_ERR_CANCELLED, "a request was freed before it completed");
  }
  cudaEventDestroy(r->done);
  free(r);
}

/* ---- operations ---- */

static ncclDataType_t dtype(mega_dtype dt) { return dt == MEGA_DT_F32 ? ncclFloat32 : ncclUint8; }
static size_t esize(mega_dtype dt) { return dt == MEGA_DT_F32 ? 4 : 1; }

static mega_status n_p2p(nccl_comm *c, bool send, void *buf, size_t n, int peer, void **req,
                         mega_err *err) {
  mega_status st = report(c, err);
  if (st != MEGA_OK) return st;
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return mega_fail(err, MEGA_ERR_INVALID, "NCCL: peer %d of a group of %d (this is rank %d)",
                     peer, c->size, c->rank);
  cudaStream_t s = c->streams[send ? SEND_STREAM : RECV_STREAM];
  if ((st = order_after_compute(c, s, err))) return st;
  if (!send) mega_cuda_backend_wrote(c->be, buf, n);
  ncclResult_t r = send ? ncclSend(buf, n, ncclUint8, peer, c->comm, s)
                        : ncclRecv(buf, n, ncclUint8, peer, c->comm, s);
  if ((st = nccl_ok(c, r, send ? "send" : "receive", err))) return st;
  return finish_post(c, s, req, err);
}

static mega_status n_isend(void *impl, const void *buf, size_t n, int peer, uint32_t tag,
                           void **req, mega_err *err) {
  (void)tag;
  return n_p2p(impl, true, (void *)buf, n, peer, req, err);
}

static mega_status n_irecv(void *impl, void *buf, size_t n, int peer, uint32_t tag, void **req,
                           mega_err *err) {
  (void)tag;
  return n_p2p(impl, false, buf, n, peer, req, err);
}

static mega_status coll_begin(nccl_comm *c, mega_err *err) {
  mega_status st = report(c, err);
  return st != MEGA_OK ? st : order_after_compute(c, c->streams[COLL_STREAM], err);
}

static mega_status coll_end(nccl_comm *c, ncclResult_t r, const char *what, void **req,
                            mega_err *err) {
  mega_status st = nccl_ok(c, r, what, err);
  return st != MEGA_OK ? st : finish_post(c, c->streams[COLL_STREAM], req, err);
}

static mega_status n_iall_reduce(void *impl, float *buf, size_t count, bool max, int timeout_ms,
                                 void **req, mega_err *err) {
  (void)timeout_ms;
  nccl_comm *c = impl;
  mega_status st = coll_begin(c, err);
  if (st) return st;
  mega_cuda_backend_wrote(c->be, buf, count * sizeof(float));
  ncclResult_t r = ncclAllReduce(buf, buf, count, ncclFloat32, max ? ncclMax : ncclSum, c->comm,
                                 c->streams[COLL_STREAM]);
  return coll_end(c, r, "all-reduce", req, err);
}

static bool equal_counts(const size_t *counts, int n) {
  for (int i = 1; i < n; i++)
    if (counts[i] != counts[0]) return false;
  return true;
}

static mega_status n_iall_gather(void *impl, const void *in, void *out, const size_t *counts,
                                 mega_dtype dt, int timeout_ms, void **req, mega_err *err) {
  (void)timeout_ms;
  nccl_comm *c = impl;
  mega_status st = coll_begin(c, err);
  if (st) return st;
  cudaStream_t s = c->streams[COLL_STREAM];
  size_t total = 0;
  for (int k = 0; k < c->size; k++) total += counts[k];
  mega_cuda_backend_wrote(c->be, out, total * esize(dt));
  ncclResult_t r;
  if (equal_counts(counts, c->size)) {
    r = ncclAllGather(in, out, counts[0], dtype(dt), c->comm, s);
  } else { /* all-gather-v: each rank broadcasts its part into place */
    size_t off = 0;
    r = ncclGroupStart();
    for (int k = 0; k < c->size && (r == ncclSuccess || r == ncclInProgress); k++) {
      char *dst = (char *)out + off * esize(dt);
      r = ncclBroadcast(k == c->rank ? in : dst, dst, counts[k], dtype(dt), k, c->comm, s);
      off += counts[k];
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = e;
  }
  return coll_end(c, r, "all-gather", req, err);
}

static mega_status n_ibroadcast(void *impl, void *buf, size_t count, mega_dtype dt, int root,
                                int timeout_ms, void **req, mega_err *err) {
  (void)timeout_ms;
  nccl_comm *c = impl;
  mega_status st = coll_begin(c, err);
  if (st) return st;
  mega_cuda_backend_wrote(c->be, buf, count * esize(dt));
  ncclResult_t r = ncclBroadcast(buf, buf, count, dtype(dt), root, c->comm, c->streams[COLL_STREAM]);
  return coll_end(c, r, "broadcast", req, err);
}

static mega_status n_ireduce_scatter(void *impl, const float *in, float *out,
                                     const size_t *counts, int timeout_ms, void **req,
                                     mega_err *err) {
  (void)timeout_ms;
  nccl_comm *c = impl;
  mega_status st = coll_begin(c, err);
  if (st) return st;
  cudaStream_t s = c->streams[COLL_STREAM];
  mega_cuda_backend_wrote(c->be, out, counts[c->rank] * sizeof(float));
  ncclResult_t r;
  if (equal_counts(counts, c->size)) {
    r = ncclReduceScatter(in, out, counts[0], ncclFloat32, ncclSum, c->comm, s);
  } else { /* reduce-scatter-v: one reduce to each rank's part */
    size_t off = 0;
    r = ncclGroupStart();
    for (int k = 0; k < c->size && (r == ncclSuccess || r == ncclInProgress); k++) {
      r = ncclReduce(in + off, k == c->rank ? out : (float *)in + off, counts[k], ncclFloat32,
                     ncclSum, k, c->comm, s);
      off += counts[k];
    }
    ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = e;
  }
  return coll_end(c, r, "reduce-scatter", req, err);
}

static mega_status n_ibarrier(void *impl, int timeout_ms, void **req, mega_err *err) {
  return n_iall_reduce(impl, ((nccl_comm *)impl)->scratch, 1, false, timeout_ms, req, err);
}

static mega_status n_status(void *impl, mega_err *err) { return report(impl, err); }

static void n_abort(void *impl) {
  nccl_comm *c = impl;
  char why[96];
  snprintf(why, sizeof why, "NCCL group (rank %d) was aborted (mega_comm_abort)", c->rank);
  break_comm(c, MEGA_ERR_CANCELLED, why);
}

static void n_destroy(void *impl) {
  nccl_comm *c = impl;
  if (!c) return;
  if (c->comm) {
    if (atomic_load(&c->broken))
      ; /* already aborted */
    else
      ncclCommDestroy(c->comm);
  }
  for (int i = 0; i < NSTREAMS; i++)
    if (c->streams[i]) cudaStreamDestroy(c->streams[i]);
  if (c->ready) cudaEventDestroy(c->ready);
  if (c->scratch) cudaFree(c->scratch);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static const mega_comm_ops nccl_ops = {
    .name = "nccl",
    .destroy = n_destroy,
    .status = n_status,
    .abort = n_abort,
    .isend = n_isend,
    .irecv = n_irecv,
    .iall_reduce = n_iall_reduce,
    .iall_gather = n_iall_gather,
    .ibroadcast = n_ibroadcast,
    .ireduce_scatter = n_ireduce_scatter,
    .ibarrier = n_ibarrier,
    .req_wait = n_req_wait,
    .req_test = n_req_test,
    .req_free = n_req_free,
};

/* Shares rank 0's unique id through the rendezvous, then joins the group
 * non-blocking, polling its state with the creation's bound. */
static mega_status join(nccl_comm *c, const mega_cuda_rendezvous *rv, const char *group,
                        mega_err *err) {
  ncclUniqueId id;
  mega_status st;
  if (c->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      return mega_fail(err, MEGA_ERR_INTERNAL, "NCCL unique id: %s", ncclGetErrorString(r));
    if ((st = rv->set(rv->ctx, group, "nccl-id", &id, sizeof id, err))) return st;
  } else {
    void *v = NULL;
    size_t len = 0;
    if ((st = rv->get(rv->ctx, group, "nccl-id", &v, &len, c->timeout_ms, err))) return st;
    if (len != sizeof id) {
      free(v);
      return mega_fail(err, MEGA_ERR_INVALID, "NCCL group %s: the unique id has %zu bytes, not %zu",
                       group, len, sizeof id);
    }
    memcpy(&id, v, sizeof id);
    free(v);
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&c->comm, c->size, id, c->rank, &cfg);
  double start = now_ms();
  while (r == ncclInProgress || r == ncclSuccess) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(c->comm, &state);
    if (state == ncclSuccess) return MEGA_OK;
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (now_ms() - start > c->timeout_ms) {
      ncclCommAbort(c->comm);
      c->comm = NULL;
      return mega_fail(err, MEGA_ERR_TIMEOUT, "NCCL group %s: rank %d of %d not joined within %d ms",
                       group, c->rank, c->size, c->timeout_ms);
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  if (c->comm) ncclCommAbort(c->comm);
  c->comm = NULL;
  return mega_fail(err, MEGA_ERR_PEER, "NCCL group %s: rank %d of %d: %s", group, c->rank,
                   c->size, ncclGetErrorString(r));
}

mega_status mega_cuda_nccl_create(const mega_cuda_rendezvous *rv, const char *group, int rank,
                                  int size, mega_backend *be, int timeout_ms,
                                  const mega_comm_ops **ops, void **impl, mega_err *err) {
  *impl = NULL;
  cudaStream_t compute = mega_cuda_backend_stream(be);
  if (!compute)
    return mega_fail(err, MEGA_ERR_INVALID, "NCCL needs the cuda backend (this rank runs %s)",
                     be->ops->name);
  if (size < 1 || rank < 0 || rank >= size || timeout_ms <= 0 || !group || !group[0])
    return mega_fail(err, MEGA_ERR_INVALID, "NCCL group '%s': rank %d of %d, timeout %d ms",
                     group ? group : "", rank, size, timeout_ms);
  nccl_comm *c = calloc(1, sizeof *c);
  if (!c) return mega_fail(err, MEGA_ERR_NOMEM, "NCCL: out of memory");
  pthread_mutex_init(&c->mu, NULL);
  c->compute = compute;
  c->be = be;
  c->rank = rank;
  c->size = size;
  c->timeout_ms = timeout_ms;
  cudaError_t e = cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming);
  for (int i = 0; i < NSTREAMS && e == cudaSuccess; i++)
    e = cudaStreamCreateWithFlags(&c->streams[i], cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc((void **)&c->scratch, sizeof(float));
  mega_status st = e == cudaSuccess ? MEGA_OK
                                    : mega_fail(err, MEGA_ERR_INTERNAL, "NCCL group %s: %s",
                                                group, cudaGetErrorString(e));
  if (st == MEGA_OK) st = join(c, rv, group, err);
  if (st != MEGA_OK) {
    n_destroy(c);
    return st;
  }
  *ops = &nccl_ops;
  *impl = c;
  return MEGA_OK;
}
