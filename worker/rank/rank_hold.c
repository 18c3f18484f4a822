/* Recovery from replicas, the held side (rank.h): what a stopped rank
 * still holds, and the server that hands it to the next attempt's ranks.
 * rank_fetch.c is the other end; proto/mega.proto's ReplicaRequest the
 * protocol. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/secret.h"
#include "proto/frame.h"
#include "proto/mega.pb-c.h"
#include "worker/rank/rank_internal.h"
#include "worker/rank/replica_net.h"

#define PIECE(k) MEGA__V1__REPLICA_PIECE_KIND__REPLICA_PIECE_##k
#define PIECE_FLOATS (1u << 20) /* a piece's most floats: the staging buffer */
#define FETCH_IO_MS 30000       /* a fetching rank that stops this long is dropped */

mega_status mega_rank_hold(mega_rank *r, mega_rank_held *out, mega_err *err) {
  memset(out, 0, sizeof *out);
  /* a rank stopped in its setup holds nothing of the run: it may still be
   * fetching its state from replicas (its buffers then hold no weights at
   * all) or loading a checkpoint */
  if (!r->ready || !r->optim || !r->chunks.grads)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "rank %d stopped before its setup finished (it did not have its state yet)",
                     r->env.rank);
  if (r->simulate)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "rank %d simulates compute (--simulate-compute): it has no state to hand on",
                     r->env.rank);
  mega_rank_abort(r, "holding its state for the next attempt");
  mega_grads_quiesce(r->chunks.grads); /* the tied embedding's exchange too */
  if (r->stepping && !r->stepped)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "rank %d stopped inside the optimizer step of iteration %lld",
                     r->env.rank, (long long)r->iteration + 1);
  bool dist = r->job->use_distributed_optimizer;
  *out = (mega_rank_held){.iteration = r->iteration + (r->stepped ? 1 : 0), .pp = r->me.pp,
                          .tp = r->me.tp, .dp = r->me.dp, .dp_size = r->topo.dp};
  if (!dist) {
    /* without a distributed optimizer the step is local: done or not begun */
    out->all_params = out->full_moments = true;
  } else {
    /* after this rank's step, only its own shard and its copy are new;
     * before it, every parameter is whole unless a gather broke */
    out->all_params = !r->stepped && mega_grads_params_whole(r->chunks.grads);
    out->shards[out->nshards++] = r->me.dp;
    int c = mega_grads_copy_shard(r->chunks.grads);
    if (c >= 0) out->shards[out->nshards++] = c;
  }
  size_t floats = 0;
  for (size_t k = 0; k < r->chunks.nparams; k++)
    floats += mega_ckpt_param_local(&r->chunks.ckpt[k]);
  out->bytes = (uint64_t)floats * sizeof(float) +
               mega_optim_state_bytes(r->optim) + (r->copy ? mega_optim_state_bytes(r->copy) : 0);
  return MEGA_OK;
}

/* ---- the server ---- */

struct mega_replica_server {
  mega_rank *r;
  mega_rank_held held;
  char *job_id;
  int attempt;
  int lfd;
  char addr[300];
  uint8_t token[16];
  float *stage; /* PIECE_FLOATS, host */
  uint64_t served;
};

mega_status mega_replica_serve_open(mega_rank *r, const mega_rank_held *held, const char *host,
                                    const char *job_id, int attempt, mega_replica_server **out,
                                    mega_err *err) {
  *out = NULL;
  mega_replica_server *s = calloc(1, sizeof *s);
  if (!s || !(s->stage = malloc(PIECE_FLOATS * sizeof(float))) ||
      !(s->job_id = strdup(job_id ? job_id : ""))) {
    if (s) free(s->stage);
    free(s);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the replica server");
  }
  s->r = r;
  s->held = *held;
  s->attempt = attempt;
  mega_status st = mega_net_token(s->token, err);
  if (st == MEGA_OK) st = mega_net_listen(host, &s->lfd, s->addr, sizeof s->addr, err);
  if (st != MEGA_OK) {
    s->lfd = -1;
    mega_replica_server_close(s);
    return st;
  }
  *out = s;
  return MEGA_OK;
}

const char *mega_replica_server_address(const mega_replica_server *s) { return s->addr; }

const uint8_t *mega_replica_server_token(const mega_replica_server *s, size_t *len) {
  *len = sizeof s->token;
  return s->token;
}

uint64_t mega_replica_served_bytes(const mega_replica_server *s) { return s->served; }

void mega_replica_server_close(mega_replica_server *s) {
  if (!s) return;
  if (s->lfd >= 0) close(s->lfd);
  free(s->stage);
  free(s->job_id);
  free(s);
}

/* Sends n floats of backend memory (or host memory) as pieces of kind at
 * (tensor, offset), staged through host memory PIECE_FLOATS at a time. */
static mega_status send_floats(mega_replica_server *s, int fd, Mega__V1__ReplicaPieceKind kind,
                               size_t tensor, size_t offset, const float *src, size_t n,
                               mega_err *err) {
  mega_backend *be = s->r->be;
  for (size_t done = 0; done < n;) {
    size_t k = n - done < PIECE_FLOATS ? n - done : PIECE_FLOATS;
    mega_status st = be->ops->memcpy(be, s->stage, src + done, k * sizeof(float), MEGA_COPY_D2H,
                                     err);
    Mega__V1__ReplicaPiece p = MEGA__V1__REPLICA_PIECE__INIT;
    p.kind = kind;
    p.tensor = tensor;
    p.offset = offset + done;
    p.count = k;
    if (st == MEGA_OK) st = mega_frame_write(fd, &p.base, 0, err);
    if (st == MEGA_OK) st = mega_net_write_all(fd, s->stage, k * sizeof(float), "a piece", err);
    if (st != MEGA_OK) return st;
    s->served += k * sizeof(float);
    done += k;
  }
  return MEGA_OK;
}

static bool holds_shard(const mega_rank_held *h, uint32_t shard) {
  for (int i = 0; i < h->nshards; i++)
    if ((uint32_t)h->shards[i] == shard) return true;
  return false;
}

/* Why req may not have the state (NULL: it may). */
static const char *refusal(const mega_replica_server *s, const Mega__V1__ReplicaRequest *req,
                           char *buf, size_t len) {
  const mega_rank_held *h = &s->held;
  if (!mega_secret_equal(req->token.data, req->token.len, s->token, sizeof s->token))
    return "the token does not match (only the attempt the coordinator planned may fetch)";
  if (strcmp(req->job_id, s->job_id) || req->attempt <= (uint32_t)s->attempt) {
    snprintf(buf, len, "this rank holds job %s attempt %d, not for job %s attempt %u", s->job_id,
             s->attempt, req->job_id, req->attempt);
    return buf;
  }
  if (req->iteration != (uint64_t)h->iteration) {
    snprintf(buf, len, "this rank holds iteration %lld, not %llu", (long long)h->iteration,
             (unsigned long long)req->iteration);
    return buf;
  }
  if (req->params && !h->all_params) return "this rank does not hold every parameter whole";
  if (req->full_moments && !h->full_moments) return "this rank holds only shards of the moments";
  for (size_t i = 0; i < req->n_shards; i++)
    if (!holds_shard(h, req->shards[i])) {
      snprintf(buf, len, "this rank does not hold shard %u", req->shards[i]);
      return buf;
    }
  return NULL;
}

/* The pieces of shard d held by optimizer o over ranges pieces (own or
 * copy); with params, the parameters of those pieces too. */
static mega_status send_shard(mega_replica_server *s, int fd, mega_optim *o,
                              const mega_optim_range *ranges, const mega_grads_piece *pc,
                              size_t n, bool params, mega_err *err) {
  mega_status st = MEGA_OK;
  for (size_t i = 0; i < n && st == MEGA_OK; i++) {
    size_t cnt = ranges[i].numel;
    st = send_floats(s, fd, PIECE(EXP_AVG), pc[i].param, pc[i].elem,
                     mega_optim_exp_avg(o, i), cnt, err);
    if (st == MEGA_OK)
      st = send_floats(s, fd, PIECE(EXP_AVG_SQ), pc[i].param, pc[i].elem,
                       mega_optim_exp_avg_sq(o, i), cnt, err);
    if (st == MEGA_OK && params)
      st = send_floats(s, fd, PIECE(PARAM), pc[i].param, pc[i].elem, ranges[i].params,
                       cnt, err);
  }
  return st;
}

static mega_status send_state(mega_replica_server *s, int fd, const Mega__V1__ReplicaRequest *q,
                              mega_err *err) {
  mega_rank *r = s->r;
  mega_chunks *c = &r->chunks;
  mega_status st = MEGA_OK;
  for (size_t k = 0; k < c->nparams && st == MEGA_OK && (q->params || q->full_moments); k++) {
    const mega_ckpt_param *p = &c->ckpt[k];
    size_t n = mega_ckpt_param_local(p);
    if (q->params) st = send_floats(s, fd, PIECE(PARAM), k, 0, p->param, n, err);
    if (st == MEGA_OK && q->full_moments)
      st = send_floats(s, fd, PIECE(EXP_AVG), k, 0, p->exp_avg, n, err);
    if (st == MEGA_OK && q->full_moments)
      st = send_floats(s, fd, PIECE(EXP_AVG_SQ), k, 0, p->exp_avg_sq, n, err);
  }
  for (size_t i = 0; i < q->n_shards && st == MEGA_OK; i++) {
    size_t n;
    const mega_optim_range *ranges;
    const mega_grads_piece *pc;
    mega_optim *o;
    if ((int)q->shards[i] == r->me.dp) {
      ranges = mega_grads_ranges(c->grads, &n);
      pc = mega_grads_pieces(c->grads, &n);
      o = r->optim;
    } else {
      ranges = mega_grads_copy_ranges(c->grads, &n);
      pc = mega_grads_copy_pieces(c->grads, &n);
      o = r->copy;
    }
    st = send_shard(s, fd, o, ranges, pc, n, q->shard_params, err);
  }
  Mega__V1__ReplicaPiece end = MEGA__V1__REPLICA_PIECE__INIT;
  end.kind = PIECE(END);
  if (st == MEGA_OK) st = mega_frame_write(fd, &end.base, 0, err);
  return st;
}

/* One fetch on connection fd. */
static mega_status serve_one(mega_replica_server *s, int fd, mega_err *err) {
  ProtobufCMessage *m = NULL;
  mega_status st = mega_frame_read(fd, &mega__v1__replica_request__descriptor, 1u << 16, &m, err);
  if (st != MEGA_OK) return st;
  if (!m) return mega_fail(err, MEGA_ERR_PEER, "the fetching rank closed the connection");
  Mega__V1__ReplicaRequest *q = (Mega__V1__ReplicaRequest *)m;
  mega_rank *r = s->r;
  char why[300];
  Mega__V1__ReplicaHeader h = MEGA__V1__REPLICA_HEADER__INIT;
  const char *no = refusal(s, q, why, sizeof why);
  h.error = (char *)(no ? no : "");
  h.job_id = s->job_id;
  h.attempt = (uint32_t)s->attempt;
  h.rank = (uint32_t)r->env.rank;
  h.iteration = (uint64_t)s->held.iteration;
  h.pp = (uint32_t)r->me.pp;
  h.tp = (uint32_t)r->me.tp;
  h.optimizer_steps = mega_optim_steps(r->optim);
  h.eval_done = r->eval_done;
  h.ntensors = r->chunks.nparams;
  st = mega_frame_write(fd, &h.base, 0, err);
  if (st == MEGA_OK && no)
    st = mega_fail(err, MEGA_ERR_INVALID, "refused rank %u: %s", q->rank, no);
  if (st == MEGA_OK) st = send_state(s, fd, q, err);
  if (st != MEGA_OK) mega_err_prefix(err, "a fetch by rank %u of attempt %u", q->rank, q->attempt);
  protobuf_c_message_free_unpacked(m, NULL);
  return st;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

mega_status mega_replica_serve(mega_replica_server *s, bool (*stop)(void *arg), void *arg,
                               int max_ms, mega_err *err) {
  int64_t until = mono_ms() + max_ms;
  while (!stop || !stop(arg)) {
    if (mono_ms() >= until)
      return mega_fail(err, MEGA_ERR_TIMEOUT, "no word for the held state in %.0f s",
                       max_ms / 1000.0);
    int fd;
    mega_status st = mega_net_accept(s->lfd, 100, FETCH_IO_MS, &fd, err);
    if (st != MEGA_OK) return st;
    if (fd < 0) continue;
    mega_err e = {0};
    if (serve_one(s, fd, &e) != MEGA_OK)
      fprintf(stderr, "megaw: rank %d: %s\n", s->r->env.rank, e.msg);
    close(fd);
  }
  return MEGA_OK;
}
