/* The tied embedding's exchange between the ends of the pipeline
 * (grads.h, "The tied embedding"): Megatron's _allreduce_embedding_grads
 * moved off the embedding stage's critical path. The loss stage's copy is
 * complete first (its head's gradient is its backward's first step), so it
 * is sent unreduced to the embedding stage, which adds it into its own wte
 * gradient before that bucket's data-parallel reduction: the reduction
 * then yields the total, and the total (this rank's shard of it under the
 * distributed optimizer) goes back while the embedding stage goes on.
 *
 * Order on the embedding group, per iteration: the embedding stage posts
 * its receive of the copy at the start, sends the total after its wte
 * bucket's wait; the loss stage sends the copy when its copy's bucket
 * launches and posts its receive of the total at that bucket's wait. P2P does not queue behind
 * anything, each direction has its own tag and at most one message in
 * flight, and both are waited before the next iteration's start, so no
 * rank ever waits on a peer that waits on it. */
#include <time.h>

#include "worker/engine/grads_internal.h"

enum { TAG_COPY = 1, TAG_TOTAL = 2 }; /* loss stage -> embedding stage, and back */

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Where the tied tensor sits: the whole tensor, and the part of it this
 * rank owns after the reduction (its shard of the bucket, which holds wte
 * alone under the distributed optimizer and is laid out alike on both
 * stages, or the whole). false: this rank has no tied embedding. */
static bool find_tied(mega_grads *g, tied_xchg *t) {
  for (int v = 0; v < g->vp; v++) {
    chunk *c = &g->chunks[v];
    int np;
    const mega_param_info *p = mega_gpt_params(c->stage, &np);
    for (int i = 0; i < np; i++) {
      if (!p[i].tied_embedding) continue;
      const mega_grads_bucket *k = &g->buckets[c->bucket_of[i]];
      t->role = p[i].tied_copy ? TIED_COPY : TIED_FIRST;
      t->bucket = c->bucket_of[i];
      t->grad = c->grads + p[i].offset;
      t->numel = p[i].numel;
      t->region = g->o.distributed ? c->grads + k->offset + k->shard_offset : t->grad;
      t->nregion = g->o.distributed ? k->shard_numel : t->numel;
      return true;
    }
  }
  return false;
}

mega_status mega_grads_set_tied_comm(mega_grads *g, mega_comm *embd, mega_err *err) {
  tied_xchg *t = &g->tied;
  if (t->comm || !embd || mega_comm_size(embd) != 2) return MEGA_OK;
  if (!find_tied(g, t)) return MEGA_OK;
  if (t->role == TIED_COPY && !g->buckets[t->bucket].tied_copy)
    return mega_fail(err, MEGA_ERR_INTERNAL,
                     "the loss stage's copy of the embedding shares a gradient bucket; it "
                     "must be alone to be sent instead of reduced (grads.c layout_chunk)");
  if (t->role == TIED_FIRST) {
    mega_status st = g->be->ops->alloc(g->be, t->numel * sizeof(float), (void **)&t->in, err);
    if (st != MEGA_OK) {
      mega_err_prefix(err, "the loss stage's embedding gradient (%zu floats)", t->numel);
      return st;
    }
  }
  t->comm = embd;
  t->peer = 1 - mega_comm_rank(embd);
  return MEGA_OK;
}

mega_status mega_grads__tied_start(mega_grads *g, mega_err *err) {
  tied_xchg *t = &g->tied;
  t->timing = (mega_grads_timing){0};
  t->returned = false;
  if (!t->comm) return MEGA_OK;
  if (t->send || t->recv)
    return mega_fail(err, MEGA_ERR_INTERNAL,
                     "the tied embedding's exchange is still in flight at the start of an "
                     "iteration (mega_grads_wait_tied was not called)");
  if (t->role != TIED_FIRST) return MEGA_OK;
  t->timing = (mega_grads_timing){.launched = wall_s(), .cpu_s = -1, .runq_s = -1};
  mega_status st = mega_comm_irecv(t->comm, t->in, t->numel * sizeof(float), t->peer, TAG_COPY,
                                   &t->recv, err);
  if (st != MEGA_OK)
    mega_err_prefix(err, "posting the receive of the loss stage's embedding gradient");
  return st;
}

/* The loss stage: its copy goes out unreduced. */
static mega_status send_copy(tied_xchg *t, mega_err *err) {
  double now = wall_s();
  t->timing = (mega_grads_timing){.launched = now, .started = now, .cpu_s = -1, .runq_s = -1};
  mega_status st = mega_comm_isend(t->comm, t->grad, t->numel * sizeof(float), t->peer,
                                   TAG_COPY, &t->send, err);
  if (st != MEGA_OK) mega_err_prefix(err, "sending the embedding's gradient to the first stage");
  return st;
}

/* The embedding stage: the loss stage's copy added in before the bucket's
 * reduction, so that reduction sums both stages' copies over DP. */
static mega_status add_copy(mega_grads *g, tied_xchg *t, mega_err *err) {
  double t0 = wall_s();
  mega_status st = mega_req_wait(t->recv, 0, err);
  mega_req_free(t->recv);
  t->recv = NULL;
  if (st != MEGA_OK) {
    mega_err_prefix(err, "receiving the loss stage's embedding gradient");
    return st;
  }
  t->timing.started = t0;
  t->timing.done = t->timing.waited = wall_s();
  /* backend memory: on the device under cuda */
  g->be->ops->residual_forward(g->be, t->grad, t->grad, t->in, t->numel);
  return MEGA_OK;
}

mega_status mega_grads__tied_launch(mega_grads *g, int b, bool *sent, mega_err *err) {
  tied_xchg *t = &g->tied;
  *sent = false;
  if (!t->comm || b != t->bucket) return MEGA_OK;
  if (t->role == TIED_COPY) {
    *sent = true;
    return send_copy(t, err);
  }
  return add_copy(g, t, err);
}

/* The embedding stage sends the total back; the loss stage posts its
 * receive into the part it owns, once its copy's send is done: the total
 * overwrites what the send reads (the embedding stage posted its receive
 * at the start, so that send does not wait on its progress). */
mega_status mega_grads__tied_reduced(mega_grads *g, int b, mega_err *err) {
  tied_xchg *t = &g->tied;
  if (!t->comm || b != t->bucket || t->returned) return MEGA_OK;
  if (t->role == TIED_COPY && !t->send) return MEGA_OK; /* not launched */
  t->returned = true;
  mega_status st;
  if (t->role == TIED_FIRST) {
    st = mega_comm_isend(t->comm, t->region, t->nregion * sizeof(float), t->peer, TAG_TOTAL,
                         &t->send, err);
  } else {
    st = mega_req_wait(t->send, 0, err);
    mega_req_free(t->send);
    t->send = NULL;
    if (st == MEGA_OK)
      st = mega_comm_irecv(t->comm, t->region, t->nregion * sizeof(float), t->peer, TAG_TOTAL,
                           &t->recv, err);
  }
  if (st != MEGA_OK) mega_err_prefix(err, "exchanging the tied embedding's gradient");
  return st;
}

/* One request of the exchange, waited and released. */
static mega_status finish(mega_req **req, mega_err *err) {
  if (!*req) return MEGA_OK;
  mega_status st = mega_req_wait(*req, 0, err);
  mega_req_free(*req);
  *req = NULL;
  return st;
}

mega_status mega_grads_wait_tied(mega_grads *g, mega_err *err) {
  tied_xchg *t = &g->tied;
  if (!t->comm) return MEGA_OK;
  mega_status st = t->role == TIED_COPY ? mega_grads__tied_reduced(g, t->bucket, err) : MEGA_OK;
  if (st != MEGA_OK) return st;
  mega_err e2 = {0};
  st = finish(&t->recv, err);
  mega_status s2 = finish(&t->send, &e2);
  if (st == MEGA_OK && s2 != MEGA_OK) {
    st = s2;
    if (err) *err = e2;
  }
  if (t->role == TIED_COPY && t->timing.launched > 0)
    t->timing.done = t->timing.waited = wall_s();
  if (st != MEGA_OK)
    mega_err_prefix(err, "exchanging the tied embedding's gradient with the other stage");
  return st;
}

const mega_grads_timing *mega_grads_tied_timing(const mega_grads *g, size_t *floats) {
  *floats = g->tied.numel;
  return &g->tied.timing;
}

void mega_grads__tied_quiesce(mega_grads *g) {
  finish(&g->tied.recv, NULL);
  finish(&g->tied.send, NULL);
}

void mega_grads__tied_free(mega_grads *g) {
  mega_req_free(g->tied.recv);
  mega_req_free(g->tied.send);
  if (g->tied.in) g->be->ops->free(g->be, g->tied.in);
  g->tied = (tied_xchg){0};
}
