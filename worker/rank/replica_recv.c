#include "worker/rank/replica_recv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/frame.h"
#include "proto/mega.pb-c.h"
#include "worker/rank/replica_net.h"

#define PIECE(k) MEGA__V1__REPLICA_PIECE_KIND__REPLICA_PIECE_##k
#define PIECE_FLOATS (1u << 20) /* rank_hold.c sends no bigger piece */

mega_status mega_replica_recv_init(mega_replica_recv *rv, const mega_ckpt_param *params, size_t n,
                                   mega_backend *be, bool host_moments, mega_err *err) {
  *rv = (mega_replica_recv){.params = params, .nparams = n, .be = be,
                            .host_moments = host_moments};
  rv->before = malloc((n + 1) * sizeof *rv->before);
  bool ok = rv->before && (rv->stage = malloc(PIECE_FLOATS * sizeof(float)));
  if (ok) {
    rv->before[0] = 0;
    for (size_t k = 0; k < n; k++)
      rv->before[k + 1] = rv->before[k] + mega_ckpt_param_local(&params[k]);
    size_t words = (size_t)(rv->before[n] / 64 + 1);
    for (int kind = PIECE(PARAM); kind <= PIECE(EXP_AVG_SQ) && ok; kind++)
      ok = (rv->came[kind] = calloc(words, sizeof(uint64_t))) != NULL;
  }
  if (!ok) {
    mega_replica_recv_free(rv);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the replica fetch");
  }
  return MEGA_OK;
}

void mega_replica_recv_free(mega_replica_recv *rv) {
  free(rv->stage);
  free(rv->before);
  for (int k = 0; k < 4; k++) free(rv->came[k]);
  *rv = (mega_replica_recv){0};
}

/* Marks bits [from, from + n) of b; false (and b unchanged) when one was
 * set already. */
static bool mark(uint64_t *b, uint64_t from, uint64_t n) {
  for (int pass = 0; pass < 2; pass++)
    for (uint64_t i = from; i < from + n;) {
      uint64_t w = i / 64, lo = i % 64, take = 64 - lo < from + n - i ? 64 - lo : from + n - i;
      uint64_t m = (take == 64 ? ~(uint64_t)0 : (((uint64_t)1 << take) - 1)) << lo;
      if (pass == 0 && (b[w] & m)) return false;
      if (pass == 1) b[w] |= m;
      i += take;
    }
  return true;
}

/* Receives one piece's floats into its place. */
static mega_status take_piece(mega_replica_recv *rv, int fd, const Mega__V1__ReplicaPiece *p,
                              const char *from, mega_err *err) {
  /* no empty piece (rank_hold.c sends none; a stream of them would never
   * end), and the offset alone first, so that offset + count cannot wrap */
  if (p->kind < PIECE(PARAM) || p->kind > PIECE(EXP_AVG_SQ) || p->tensor >= rv->nparams ||
      p->count < 1 || p->count > PIECE_FLOATS ||
      p->offset > mega_ckpt_param_local(&rv->params[p->tensor]) ||
      p->count > mega_ckpt_param_local(&rv->params[p->tensor]) - p->offset)
    return mega_fail(err, MEGA_ERR_PEER,
                     "the replica at %s sent a piece out of bounds (kind %d, tensor %llu of "
                     "%zu, floats %llu + %llu)",
                     from, (int)p->kind, (unsigned long long)p->tensor, rv->nparams,
                     (unsigned long long)p->offset, (unsigned long long)p->count);
  const mega_ckpt_param *cp = &rv->params[p->tensor];
  float *dst = p->kind == PIECE(PARAM)     ? cp->param
               : p->kind == PIECE(EXP_AVG) ? cp->exp_avg
                                           : cp->exp_avg_sq;
  if (!dst)
    return mega_fail(err, MEGA_ERR_PEER, "the replica at %s sent moments of %s, which has none",
                     from, cp->name);
  if (!mark(rv->came[p->kind], rv->before[p->tensor] + p->offset, p->count))
    return mega_fail(err, MEGA_ERR_PEER,
                     "the replica at %s sent floats %llu..%llu of %s again (a replica sends "
                     "each once)",
                     from, (unsigned long long)p->offset,
                     (unsigned long long)(p->offset + p->count - 1), cp->name);
  dst += p->offset;
  size_t bytes = (size_t)p->count * sizeof(float);
  mega_status st;
  if (p->kind != PIECE(PARAM) && rv->host_moments) {
    st = mega_net_read_all(fd, dst, bytes, "the moments", err);
  } else {
    st = mega_net_read_all(fd, rv->stage, bytes, "the state", err);
    if (st == MEGA_OK)
      st = rv->be->ops->memcpy(rv->be, dst, rv->stage, bytes, MEGA_COPY_H2D, err);
  }
  rv->got[p->kind] += p->count;
  rv->bytes += bytes;
  return st;
}

static mega_status check_header(mega_replica_recv *rv, const mega_replica_want *w,
                                const char *from, const Mega__V1__ReplicaHeader *h,
                                mega_err *err) {
  if (h->error && h->error[0])
    return mega_fail(err, MEGA_ERR_PEER, "the replica at %s refused: %s", from, h->error);
  if (strcmp(h->job_id, w->job_id) || h->attempt != (uint32_t)w->attempt ||
      h->rank != (uint32_t)w->donor_rank || h->iteration != (uint64_t)w->iteration ||
      h->pp != (uint32_t)w->pp || h->tp != (uint32_t)w->tp || h->ntensors != rv->nparams)
    return mega_fail(err, MEGA_ERR_PEER,
                     "the replica at %s is job %s attempt %u rank %u (pp %u, tp %u, iteration "
                     "%llu, %llu tensors), not the one planned: job %s attempt %d rank %d (pp %d, "
                     "tp %d, iteration %lld, %zu tensors)",
                     from, h->job_id, h->attempt, h->rank, h->pp, h->tp,
                     (unsigned long long)h->iteration, (unsigned long long)h->ntensors,
                     w->job_id, w->attempt, w->donor_rank, w->pp, w->tp,
                     (long long)w->iteration, rv->nparams);
  if (rv->have_hdr && (h->optimizer_steps != rv->steps || h->eval_done != rv->eval_done))
    return mega_fail(err, MEGA_ERR_PEER,
                     "the replicas disagree: %lld optimizer steps and %lld evaluation batches "
                     "at %s, %lld and %lld before",
                     (long long)h->optimizer_steps, (long long)h->eval_done, from,
                     (long long)rv->steps, (long long)rv->eval_done);
  rv->have_hdr = true;
  rv->steps = h->optimizer_steps;
  rv->eval_done = h->eval_done;
  return MEGA_OK;
}

mega_status mega_replica_recv_stream(mega_replica_recv *rv, int fd, const mega_replica_want *want,
                                     const char *from, mega_err *err) {
  ProtobufCMessage *m = NULL;
  mega_status st = mega_frame_read(fd, &mega__v1__replica_header__descriptor, 1u << 16, &m, err);
  if (st == MEGA_OK && !m) st = mega_fail(err, MEGA_ERR_PEER, "the replica closed the connection");
  if (st == MEGA_OK) st = check_header(rv, want, from, (Mega__V1__ReplicaHeader *)m, err);
  if (m) protobuf_c_message_free_unpacked(m, NULL);
  while (st == MEGA_OK) {
    m = NULL;
    st = mega_frame_read(fd, &mega__v1__replica_piece__descriptor, 1u << 10, &m, err);
    if (st == MEGA_OK && !m) st = mega_fail(err, MEGA_ERR_PEER, "the replica closed midway");
    if (st != MEGA_OK) break;
    Mega__V1__ReplicaPiece *p = (Mega__V1__ReplicaPiece *)m;
    bool end = p->kind == PIECE(END);
    if (!end) st = take_piece(rv, fd, p, from, err);
    protobuf_c_message_free_unpacked(m, NULL);
    if (end) break;
  }
  return st;
}

mega_status mega_replica_recv_whole(const mega_replica_recv *rv, mega_err *err) {
  uint64_t want = rv->before[rv->nparams];
  const uint64_t *g = rv->got;
  if (g[PIECE(PARAM)] == want && g[PIECE(EXP_AVG)] == want && g[PIECE(EXP_AVG_SQ)] == want)
    return MEGA_OK;
  return mega_fail(err, MEGA_ERR_INTERNAL,
                   "the replicas sent %llu parameters and %llu and %llu moments of %llu: the "
                   "plan does not cover this rank",
                   (unsigned long long)g[PIECE(PARAM)], (unsigned long long)g[PIECE(EXP_AVG)],
                   (unsigned long long)g[PIECE(EXP_AVG_SQ)], (unsigned long long)want);
}
