#include "worker/engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/engine/engine_mem.h"
#include "worker/engine/sim_compute.h"

enum { PH_WARMUP, PH_STEADY, PH_COOLDOWN };

/* What one (microbatch, chunk) holds during an iteration. */
typedef struct slot {
  mega_gpt_acts *acts;
  int T;
  mega_ebuf in, out, dout, din;
  mega_p2p_msg rf, sf, rb, sb;
} slot;

struct mega_engine {
  mega_engine_config cfg;
  int vp, nacts, num_micro, B;
  const mega_action *acts;
  uint8_t *phase;  /* per action */
  bool *sync_in;   /* per action: the chunk's last backward, its GS right after it */
  bool has_w;      /* the rank's schedule splits backward into B and W */
  slot *slots;     /* [num_micro * vp] */
  mega_emem mem;
  mega_p2p_msg **step, **pending; /* a P2P step's messages; sends still in flight */
  int npending;
  int32_t *tokens, *targets;      /* host, B*T */
  /* per iteration */
  mega_engine_result *res;
  bool zero_left; /* the gradients are not all zero yet (mega_grads_zero) */
  bool zeroed;    /* they were zeroed once (--simulate-compute zeroes no more) */
  int inflight;
  mega_rank_span *spans;
  size_t cap, *nspans;
  double t0_wall;
};

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool is_comm(uint8_t k) { return mega_act_is_p2p(k); }
static bool is_sync(uint8_t k) { return k == MEGA_ACT_GRAD_SYNC || k == MEGA_ACT_GRAD_WAIT; }

/* Sequence parallelism splits a stage's activations over the TP ranks. */
static int split_of(const mega_engine *e) {
  return e->cfg.stream_split > 1 ? e->cfg.stream_split : 1;
}

/* Floats of one activation (or its gradient) on this rank: [B*T/split, hidden]. */
static size_t act_floats(const mega_engine *e, int T) {
  return (size_t)e->B * (size_t)T * (size_t)e->cfg.hidden / (size_t)split_of(e);
}

static slot *slot_of(mega_engine *e, int mb, int chunk) { return &e->slots[mb * e->vp + chunk]; }

static bool first_stage(const mega_engine *e, int chunk) {
  return mega_sched_is_first_stage(e->cfg.sched, e->cfg.pp_rank, chunk);
}

static bool last_stage(const mega_engine *e, int chunk) {
  return mega_sched_is_last_stage(e->cfg.sched, e->cfg.pp_rank, chunk);
}

/* Phases as Megatron counts them: the first `warmup` forwards, the last
 * `cooldown` backwards; everything between is steady. A communication
 * action belongs to the compute action it serves next. */
static mega_status build_phases(mega_engine *e, mega_err *err) {
  e->phase = malloc((size_t)e->nacts + 1);
  if (!e->phase) return mega_fail(err, MEGA_ERR_NOMEM, "engine: out of memory");
  mega_phases ph = mega_sched_phases(e->cfg.sched, e->cfg.pp_rank);
  int total_b = 0, nf = 0, nb = 0;
  for (int i = 0; i < e->nacts; i++) total_b += e->acts[i].kind == MEGA_ACT_B;
  uint8_t last = PH_WARMUP;
  for (int i = 0; i < e->nacts; i++) {
    uint8_t k = e->acts[i].kind;
    if (k == MEGA_ACT_F) last = nf++ < ph.warmup ? PH_WARMUP : PH_STEADY;
    if (k == MEGA_ACT_B) last = nb++ >= total_b - ph.cooldown ? PH_COOLDOWN : PH_STEADY;
    e->phase[i] = last;
  }
  uint8_t next = PH_COOLDOWN;
  for (int i = e->nacts - 1; i >= 0; i--) {
    if (is_comm(e->acts[i].kind))
      e->phase[i] = next;
    else
      next = e->phase[i];
  }
  return MEGA_OK;
}

mega_status mega_engine_alloc_recv(void *arg, mega_p2p_msg *m, size_t floats, mega_err *err) {
  mega_engine *e = arg;
  slot *s = slot_of(e, m->mb, m->chunk);
  mega_ebuf *b = m->kind == MEGA_ACT_RECV_F ? &s->in : &s->dout;
  mega_status st = mega_emem_get(&e->mem, b, floats, err);
  if (st == MEGA_OK) m->buf = b->p;
  return st;
}

mega_status mega_engine_create(const mega_engine_config *cfg, mega_engine **out, mega_err *err) {
  mega_engine *e = calloc(1, sizeof *e);
  if (!e) return mega_fail(err, MEGA_ERR_NOMEM, "engine: out of memory");
  e->cfg = *cfg;
  const mega_schedule *s = cfg->sched;
  e->vp = s->vp;
  e->num_micro = s->microbatches;
  e->B = cfg->plan->micro_batch;
  e->acts = s->ranks[cfg->pp_rank].acts;
  e->nacts = s->ranks[cfg->pp_rank].n;
  for (int i = 0; i < e->nacts; i++) e->has_w |= e->acts[i].kind == MEGA_ACT_W;
  mega_emem_init(&e->mem, cfg->be);
  size_t nslots = (size_t)e->num_micro * (size_t)e->vp, bt = (size_t)e->B * cfg->seq_len;
  e->slots = calloc(nslots, sizeof *e->slots);
  e->step = calloc((size_t)e->nacts + 1, sizeof *e->step);
  e->pending = calloc((size_t)e->nacts + 1, sizeof *e->pending);
  e->tokens = malloc(bt * sizeof *e->tokens);
  e->targets = malloc(bt * sizeof *e->targets);
  mega_status st = MEGA_OK;
  if (!e->slots || !e->step || !e->pending || !e->tokens || !e->targets)
    st = mega_fail(err, MEGA_ERR_NOMEM, "engine: out of memory for %zu microbatch slots", nslots);
  if (st == MEGA_OK) st = build_phases(e, err);
  if (st == MEGA_OK && !(e->sync_in = calloc((size_t)e->nacts + 1, sizeof *e->sync_in)))
    st = mega_fail(err, MEGA_ERR_NOMEM, "engine: out of memory");
  if (st == MEGA_OK) {
    uint8_t wk = e->has_w ? MEGA_ACT_W : MEGA_ACT_B;
    for (int i = 0; i + 1 < e->nacts; i++)
      e->sync_in[i] = e->acts[i].kind == wk && e->acts[i + 1].kind == MEGA_ACT_GRAD_SYNC &&
                      e->acts[i + 1].chunk == e->acts[i].chunk;
  }
  if (st == MEGA_OK && !cfg->grads && !cfg->forward_only)
    for (int i = 0; i < e->nacts; i++)
      if (is_sync(e->acts[i].kind))
        st = mega_fail(err, MEGA_ERR_INTERNAL, "engine: a schedule with GS/GW needs gradients");
  if (st != MEGA_OK) {
    mega_engine_destroy(e);
    return st;
  }
  *out = e;
  return MEGA_OK;
}

static void release_slot(mega_engine *e, slot *s) {
  mega_emem_put_acts(&e->mem, s->acts);
  s->acts = NULL;
  mega_emem_put(&e->mem, &s->in);
  mega_emem_put(&e->mem, &s->out);
  mega_emem_put(&e->mem, &s->dout);
  mega_emem_put(&e->mem, &s->din);
  mega_p2p_release(&s->rf);
  mega_p2p_release(&s->sf);
  mega_p2p_release(&s->rb);
  mega_p2p_release(&s->sb);
}

void mega_engine_destroy(mega_engine *e) {
  if (!e) return;
  if (e->slots)
    for (int i = 0; i < e->num_micro * e->vp; i++) release_slot(e, &e->slots[i]);
  mega_emem_free(&e->mem);
  free(e->slots);
  free(e->step);
  free(e->pending);
  free(e->tokens);
  free(e->targets);
  free(e->phase);
  free(e->sync_in);
  free(e);
}

int mega_engine_seq_len(const mega_engine *e, int64_t iteration, int micro) {
  if (!e->cfg.variable_seq) return e->cfg.seq_len;
  int first = mega_batch_first_sample(e->cfg.plan, e->cfg.dp_rank, micro);
  return mega_data_variable_seq_len(e->cfg.seq_len, e->cfg.plan, iteration, first);
}

/* ---- measurement ---- */

static void add_span(mega_engine *e, const char *name, const char *cat, double t0, double t1) {
  if (!e->spans || *e->nspans >= e->cap || t1 <= t0) return;
  mega_rank_span *sp = &e->spans[(*e->nspans)++];
  snprintf(sp->name, sizeof sp->name, "%s", name);
  sp->cat = cat;
  sp->start_us = (t0 - e->t0_wall) * 1e6;
  sp->dur_us = (t1 - t0) * 1e6;
}

static void add_bubble(mega_engine *e, uint8_t phase, double s) {
  e->res->bubble_s += s;
  if (phase == PH_WARMUP) e->res->bubble_warmup_s += s;
  else if (phase == PH_STEADY) e->res->bubble_steady_s += s;
  else e->res->bubble_cooldown_s += s;
}

static void track_peak(mega_engine *e) {
  size_t live = e->mem.live_bytes; /* and each chunk's recomputation scratch, once */
  for (int v = 0; v < e->vp && !e->cfg.simulate; v++)
    live += mega_gpt_scratch_bytes(e->cfg.chunks[v]);
  if (live > e->res->peak_bytes) e->res->peak_bytes = live;
  if (e->inflight > e->res->peak_inflight) e->res->peak_inflight = e->inflight;
}

/* ---- P2P ---- */

static bool is_send(uint8_t k) { return k == MEGA_ACT_SEND_F || k == MEGA_ACT_SEND_B; }

/* A completed send no longer needs its buffer: an input gradient is never
 * needed again, and an output only by its backward (unless deallocated). */
static void send_done(mega_engine *e, mega_p2p_msg *m) {
  slot *s = slot_of(e, m->mb, m->chunk);
  if (m->kind == MEGA_ACT_SEND_B) mega_emem_put(&e->mem, &s->din);
  if (m->kind == MEGA_ACT_SEND_F && (e->cfg.deallocate_outputs || e->cfg.forward_only))
    mega_emem_put(&e->mem, &s->out);
  mega_p2p_release(m);
}

static void account_wait(mega_engine *e, const mega_p2p_msg *m, uint8_t phase, double t0,
                         const mega_p2p_wait *w) {
  add_bubble(e, phase, w->bubble_s);
  e->res->p2p_wait_s += w->transfer_s;
  char name[24];
  mega_action_format((mega_action){.kind = m->kind, .mb = m->mb, .chunk = (uint16_t)m->chunk},
                     name);
  add_span(e, name, "bubble", t0, t0 + w->bubble_s);
  add_span(e, name, "p2p", t0 + w->bubble_s, t0 + w->bubble_s + w->transfer_s);
}

/* The gradients are zeroed in the rank's idle time (grads.h): slices of
 * 256 KiB (tens of microseconds of memset, so a message that arrives
 * meanwhile waits little) while a receive has not arrived; whatever is
 * left before the first backward (zero_rest). */
#define ZERO_SLICE ((size_t)1 << 16)

static void zero_done(mega_engine *e, double t0) {
  double t1 = wall_s();
  if (!e->zero_left) e->zeroed = true;
  e->res->compute_s += t1 - t0;
  add_span(e, "zero-grads", "compute", t0, t1);
}

static mega_status zero_while_waiting(mega_engine *e, mega_p2p_msg *m, mega_err *err) {
  if (!e->zero_left || is_send(m->kind)) return MEGA_OK;
  double t0 = wall_s();
  bool arrived = false;
  mega_status st = MEGA_OK;
  while (e->zero_left && !arrived && st == MEGA_OK) {
    e->zero_left = !mega_grads_zero(e->cfg.grads, ZERO_SLICE);
    st = mega_p2p_test(e->cfg.p2p, m, &arrived, err);
  }
  zero_done(e, t0);
  return st;
}

static void zero_rest(mega_engine *e) {
  if (!e->zero_left) return;
  double t0 = wall_s();
  mega_grads_zero(e->cfg.grads, SIZE_MAX);
  e->zero_left = false;
  zero_done(e, t0);
}

static mega_status wait_msg(mega_engine *e, mega_p2p_msg *m, uint8_t phase, mega_err *err) {
  if (m->done) return MEGA_OK;
  mega_status st = zero_while_waiting(e, m, err);
  if (st != MEGA_OK || m->done) return st;
  double t0 = wall_s();
  mega_p2p_wait w;
  st = mega_p2p_wait_shape(e->cfg.p2p, m, &w, err);
  if (st != MEGA_OK) return st;
  account_wait(e, m, phase, t0, &w);
  t0 = wall_s();
  st = mega_p2p_wait_msg(e->cfg.p2p, m, &w, err);
  if (st != MEGA_OK) return st;
  account_wait(e, m, phase, t0, &w);
  if (is_send(m->kind)) send_done(e, m);
  return MEGA_OK;
}

/* Frees the buffers of sends that finished in the background. */
static mega_status reap_sends(mega_engine *e, mega_err *err) {
  int keep = 0;
  for (int i = 0; i < e->npending; i++) {
    mega_p2p_msg *m = e->pending[i];
    bool done = m->done;
    if (!done) {
      mega_status st = mega_p2p_test(e->cfg.p2p, m, &done, err);
      if (st != MEGA_OK) return st;
      if (done) send_done(e, m);
    }
    if (!done) e->pending[keep++] = m;
  }
  e->npending = keep;
  return MEGA_OK;
}

/* Sets up the transfer behind a communication action. */
static mega_status prepare_msg(mega_engine *e, const mega_action *a, int64_t it,
                               mega_p2p_msg **out, mega_err *err) {
  slot *s = slot_of(e, a->mb, a->chunk);
  mega_p2p_msg *m;
  mega_ebuf *buf;
  switch (a->kind) {
  case MEGA_ACT_SEND_F: m = &s->sf; buf = &s->out; break;
  case MEGA_ACT_RECV_F: m = &s->rf; buf = &s->in; break;
  case MEGA_ACT_SEND_B: m = &s->sb; buf = &s->din; break;
  default: m = &s->rb; buf = &s->dout; break;
  }
  *m = (mega_p2p_msg){.kind = a->kind, .mb = a->mb, .chunk = a->chunk, .B = e->B,
                      .T = s->T ? s->T : mega_engine_seq_len(e, it, a->mb),
                      .C = e->cfg.hidden / split_of(e)};
  if (is_send(a->kind)) {
    if (!buf->p)
      return mega_fail(err, MEGA_ERR_INTERNAL, "engine: %s before its data was computed",
                       mega_act_kind_name(a->kind));
  } else if (!e->cfg.variable_seq) {
    mega_status st = mega_emem_get(&e->mem, buf, (size_t)m->B * m->T * m->C, err);
    if (st != MEGA_OK) return st;
  }
  m->buf = buf->p;
  *out = m;
  return MEGA_OK;
}

static bool already_posted(mega_engine *e, const mega_action *a) {
  slot *s = slot_of(e, a->mb, a->chunk);
  return (a->kind == MEGA_ACT_RECV_F && s->rf.posted) || (a->kind == MEGA_ACT_RECV_B && s->rb.posted);
}

/* --overlap-p2p-comm: posts the receives of the next P2P step now, so their
 * data can arrive while this rank computes. Posting a receive never blocks,
 * so it cannot deadlock the schedule. */
static mega_status prefetch(mega_engine *e, int from, int64_t it, mega_err *err) {
  int k = from;
  while (k < e->nacts && !is_comm(e->acts[k].kind)) k++;
  if (k >= e->nacts) return MEGA_OK;
  if (e->phase[k] != PH_STEADY && !e->cfg.overlap_warmup_flush) return MEGA_OK;
  int n = 0;
  for (; k < e->nacts && is_comm(e->acts[k].kind); k++) {
    const mega_action *a = &e->acts[k];
    if (is_send(a->kind) || already_posted(e, a)) continue;
    mega_status st = prepare_msg(e, a, it, &e->step[n++], err);
    if (st != MEGA_OK) return st;
  }
  mega_status st = n ? mega_p2p_post(e->cfg.p2p, e->step, n, err) : MEGA_OK;
  if (st == MEGA_OK && n) track_peak(e);
  return st;
}

/* --deallocate-pipeline-outputs without overlap waits for a step's sends,
 * as Megatron's send_forward returns before deallocate_output_tensor: each
 * output is freed as soon as it is sent, whatever the timing, so the
 * memory it saves is the same on every run. In 1F1B the wait costs
 * nothing (the peer posts its receive in the step that answers this one). */
static bool sync_sends(const mega_engine *e) {
  return e->cfg.deallocate_outputs && !e->cfg.overlap_p2p;
}

/* One P2P step: the run of communication actions at [i, *end). */
static mega_status run_step(mega_engine *e, int i, int64_t it, int *end, mega_err *err) {
  int n = 0, j = i;
  for (; j < e->nacts && is_comm(e->acts[j].kind); j++) {
    if (already_posted(e, &e->acts[j])) continue; /* prefetched */
    mega_status st = prepare_msg(e, &e->acts[j], it, &e->step[n++], err);
    if (st != MEGA_OK) return st;
  }
  *end = j;
  mega_status st = mega_p2p_post(e->cfg.p2p, e->step, n, err);
  if (st != MEGA_OK) return st;
  track_peak(e);
  /* Shapes first: every receive of the step posts its data before this rank
   * blocks on any transfer (a no-op without variable lengths). */
  if (!e->cfg.overlap_p2p)
    for (int k = 0; k < n; k++) {
      mega_p2p_msg *m = e->step[k];
      double t0 = wall_s();
      mega_p2p_wait w;
      st = mega_p2p_wait_shape(e->cfg.p2p, m, &w, err);
      if (st != MEGA_OK) return st;
      account_wait(e, m, e->phase[i], t0, &w);
    }
  /* Sends never hold up compute (but see sync_sends): they complete once
   * their receiver has posted, and are reaped (their buffers freed) as they
   * do, as core/sim models them. Receives are waited here, or with
   * --overlap-p2p-comm only by the compute action that needs them. */
  for (int k = 0; k < n; k++) {
    mega_p2p_msg *m = e->step[k];
    if (is_send(m->kind) && !sync_sends(e)) {
      e->pending[e->npending++] = m;
    } else if (!e->cfg.overlap_p2p || is_send(m->kind)) {
      st = wait_msg(e, m, e->phase[i], err);
      if (st != MEGA_OK) return st;
    }
  }
  st = reap_sends(e, err);
  if (st != MEGA_OK || !e->cfg.overlap_p2p) return st;
  return prefetch(e, j, it, err);
}

/* ---- compute ---- */

static mega_status load_batch(mega_engine *e, int64_t it, int mb, int T, mega_err *err) {
  mega_status st =
      e->cfg.test_data ? mega_data_test_microbatch(e->cfg.data, e->cfg.plan, it, e->cfg.dp_rank,
                                                   mb, e->tokens, e->targets, err)
      : e->cfg.eval_data
          ? mega_data_eval_microbatch(e->cfg.data, e->cfg.plan, it, e->cfg.dp_rank, mb, e->tokens,
                                      e->targets, err)
          : mega_data_microbatch(e->cfg.data, e->cfg.plan, it, e->cfg.dp_rank, mb, e->tokens,
                                 e->targets, err);
  if (st != MEGA_OK || T == e->cfg.seq_len) return st;
  /* A shorter microbatch keeps the head of each window. */
  for (int b = 1; b < e->B; b++) {
    memmove(e->tokens + (size_t)b * T, e->tokens + (size_t)b * e->cfg.seq_len, T * sizeof(int32_t));
    memmove(e->targets + (size_t)b * T, e->targets + (size_t)b * e->cfg.seq_len,
            T * sizeof(int32_t));
  }
  return MEGA_OK;
}

static mega_status do_forward(mega_engine *e, const mega_action *a, int64_t it, float scale,
                              uint8_t ph, mega_err *err) {
  slot *s = slot_of(e, a->mb, a->chunk);
  bool first = first_stage(e, a->chunk), last = last_stage(e, a->chunk);
  mega_status st;
  if (!first) {
    if (!s->rf.posted) return mega_fail(err, MEGA_ERR_INTERNAL, "engine: F%d.%d before its receive", a->mb, a->chunk);
    st = wait_msg(e, &s->rf, ph, err);
    if (st != MEGA_OK) return st;
    s->T = s->rf.T;
    mega_p2p_release(&s->rf);
  } else {
    s->T = mega_engine_seq_len(e, it, a->mb);
  }
  size_t n = act_floats(e, s->T);
  if (!last) {
    st = mega_emem_get(&e->mem, &s->out, n, err);
    if (st != MEGA_OK) return st;
  }
  mega_gpt_stage *stage = e->cfg.chunks[a->chunk];
  if (!e->cfg.simulate) {
    st = mega_emem_get_acts(&e->mem, stage, a->chunk, e->B, s->T, &s->acts, err);
    if (st != MEGA_OK) return st;
  }
  e->inflight++;
  track_peak(e);
  double t0 = wall_s();
  if (e->cfg.simulate) {
    mega_sim_forward(e->cfg.chunks[a->chunk], e->cfg.grads, a->chunk,
                     e->cfg.sim_f_ms / e->vp);
  } else {
    if (first || last) {
      st = load_batch(e, it, a->mb, s->T, err);
      if (st != MEGA_OK) return st;
    }
    double loss = 0;
    /* the loss stage's classifier writes dlogits at once (fused); 0: eval */
    if (last) mega_gpt_acts_set_loss_scale(s->acts, scale);
    /* hidden dropout's mask follows the samples' place in the training
     * order (model/gpt.h); evaluation runs without */
    bool train = !e->cfg.forward_only && !e->cfg.eval_data;
    mega_gpt_acts_set_samples(s->acts, train ? mega_batch_plan_start(e->cfg.plan, it) +
                                                   mega_batch_first_sample(e->cfg.plan,
                                                                           e->cfg.dp_rank, a->mb)
                                             : -1);
    st = mega_gpt_forward(stage, s->acts, first ? e->tokens : NULL, first ? NULL : s->in.p,
                          last ? e->targets : NULL, last ? NULL : s->out.p,
                          last ? &loss : NULL, err);
    if (st != MEGA_OK) return st;
    e->res->loss_sum += loss;
  }
  double t1 = wall_s();
  if (last) e->res->tokens += (uint64_t)e->B * (uint64_t)s->T;
  e->res->compute_s += t1 - t0;
  char name[24];
  add_span(e, mega_action_format(*a, name), "compute", t0, t1);
  mega_emem_put(&e->mem, &s->in); /* forward copied what it needs */
  if (e->cfg.forward_only) {
    mega_emem_put_acts(&e->mem, s->acts);
    s->acts = NULL;
    e->inflight--;
  }
  return MEGA_OK;
}

static void free_activations(mega_engine *e, slot *s) {
  mega_emem_put_acts(&e->mem, s->acts);
  s->acts = NULL;
  mega_emem_put(&e->mem, &s->out); /* kept for the backward unless deallocated */
  e->inflight--;
}

static mega_status do_weight(mega_engine *e, const mega_action *a, bool sync, mega_err *err) {
  slot *s = slot_of(e, a->mb, a->chunk);
  double t0 = wall_s();
  if (sync) mega_grads_enable(e->cfg.grads, a->chunk, true);
  if (e->cfg.simulate) {
    mega_sim_backward(e->cfg.chunks[a->chunk], e->cfg.grads, a->chunk, e->cfg.sim_w_ms / e->vp,
                      true);
  } else {
    mega_status st = mega_gpt_backward_weight(e->cfg.chunks[a->chunk], s->acts, err);
    if (st != MEGA_OK) return st;
  }
  if (sync) mega_grads_enable(e->cfg.grads, a->chunk, false);
  double t1 = wall_s();
  e->res->compute_s += t1 - t0;
  char name[24];
  add_span(e, mega_action_format(*a, name), "compute", t0, t1);
  free_activations(e, s);
  return MEGA_OK;
}

static mega_status do_backward(mega_engine *e, const mega_action *a, float loss_scale,
                               uint8_t ph, bool sync, mega_err *err) {
  slot *s = slot_of(e, a->mb, a->chunk);
  bool first = first_stage(e, a->chunk), last = last_stage(e, a->chunk);
  mega_status st;
  if (!last) {
    if (!s->rb.posted) return mega_fail(err, MEGA_ERR_INTERNAL, "engine: B%d.%d before its receive", a->mb, a->chunk);
    st = wait_msg(e, &s->rb, ph, err);
    if (st != MEGA_OK) return st;
    mega_p2p_release(&s->rb);
  }
  if (!first) {
    st = mega_emem_get(&e->mem, &s->din, act_floats(e, s->T), err);
    if (st != MEGA_OK) return st;
    track_peak(e);
  }
  double t0 = wall_s();
  if (sync) mega_grads_enable(e->cfg.grads, a->chunk, true);
  if (e->cfg.simulate) {
    mega_sim_backward(e->cfg.chunks[a->chunk], e->cfg.grads, a->chunk,
                      (e->cfg.sim_b_ms + (e->has_w ? 0 : e->cfg.sim_w_ms)) / e->vp, !e->has_w);
  } else if (e->has_w) {
    st = mega_gpt_backward_input(e->cfg.chunks[a->chunk], s->acts, last ? NULL : s->dout.p,
                                 loss_scale, first ? NULL : s->din.p, err);
    if (st != MEGA_OK) return st;
  } else {
    /* layer by layer, so each layer's gradients are ready as it ends */
    st = mega_gpt_backward(e->cfg.chunks[a->chunk], s->acts, last ? NULL : s->dout.p, loss_scale,
                           first ? NULL : s->din.p, err);
    if (st != MEGA_OK) return st;
  }
  if (sync) mega_grads_enable(e->cfg.grads, a->chunk, false);
  double t1 = wall_s();
  e->res->compute_s += t1 - t0;
  char name[24];
  add_span(e, mega_action_format(*a, name), "compute", t0, t1);
  mega_emem_put(&e->mem, &s->dout);
  if (!e->has_w) free_activations(e, s);
  return MEGA_OK;
}

uint64_t mega_engine_iteration_tokens(const mega_engine *e, int64_t it) {
  const mega_batch_plan *p = e->cfg.plan;
  uint64_t tokens = 0;
  for (int d = 0; d < p->dp_size; d++)
    for (int m = 0; m < p->num_micro; m++) {
      int first = mega_batch_first_sample(p, d, m);
      int T = e->cfg.variable_seq ? mega_data_variable_seq_len(e->cfg.seq_len, p, it, first)
                                  : e->cfg.seq_len;
      tokens += (uint64_t)p->micro_batch * (uint64_t)T;
    }
  return tokens;
}

/* d(total loss)/d(token loss): the iteration's loss is the mean over every
 * target token of every replica. */
static float loss_scale_of(const mega_engine *e, int64_t it) {
  double factor = e->cfg.grads ? mega_grads_loss_scale_factor(e->cfg.grads) : 1.0;
  return (float)(factor / (double)mega_engine_iteration_tokens(e, it));
}

/* GS launches the chunk's remaining buckets; GW waits for all of them. */
static mega_status do_sync(mega_engine *e, const mega_action *a, mega_err *err) {
  if (a->kind == MEGA_ACT_GRAD_SYNC) return mega_grads_launch(e->cfg.grads, a->chunk, err);
  double t0 = wall_s();
  mega_status st = mega_grads_wait(e->cfg.grads, a->chunk, err);
  double t1 = wall_s();
  e->res->grad_wait_s += t1 - t0;
  char name[24];
  add_span(e, mega_action_format(*a, name), "grad_sync", t0, t1);
  return st;
}

mega_status mega_engine_run(mega_engine *e, int64_t it, mega_engine_result *res,
                            mega_rank_span *spans, size_t cap, size_t *nspans, double t0_wall,
                            mega_err *err) {
  *res = (mega_engine_result){0};
  e->res = res;
  e->spans = spans;
  e->cap = cap;
  e->nspans = nspans;
  e->t0_wall = t0_wall;
  e->inflight = 0;
  e->npending = 0;
  e->zero_left = e->cfg.grads && !e->cfg.forward_only;
  /* A simulated backward writes no gradient: once zeroed they stay zero, and
   * zeroing again is compute on the cores, which --simulate-compute leaves out. */
  if (e->zero_left && e->cfg.simulate && e->zeroed) {
    mega_grads_still_zero(e->cfg.grads);
    e->zero_left = false;
  }
  /* Variable-length receives land in this engine's slots (a rank may hold
   * a training and an evaluation engine over one P2P). */
  if (e->cfg.p2p) mega_p2p_set_alloc(e->cfg.p2p, mega_engine_alloc_recv, e);
  for (int i = 0; i < e->num_micro * e->vp; i++) { /* empty unless the last one failed */
    release_slot(e, &e->slots[i]);
    e->slots[i] = (slot){0};
  }
  float scale = e->cfg.forward_only ? 0.0f : loss_scale_of(e, it);
  double t0 = mono_s();
  res->work_end_wall = wall_s();
  mega_status st = MEGA_OK;
  for (int i = 0; i < e->nacts && st == MEGA_OK;) {
    const mega_action *a = &e->acts[i];
    if (is_comm(a->kind)) {
      int at = i;
      st = run_step(e, i, it, &i, err);
      res->work_end_wall = wall_s();
      if (st != MEGA_OK) {
        char name[24];
        mega_err_prefix(err, "iteration %lld, P2P step at %s", (long long)it + 1,
                        mega_action_format(e->acts[at], name));
      }
      continue;
    }
    if (a->kind != MEGA_ACT_F) zero_rest(e); /* B, W, GS or GW: the gradients */
    if (a->kind == MEGA_ACT_F) st = do_forward(e, a, it, scale, e->phase[i], err);
    else if (a->kind == MEGA_ACT_B) st = do_backward(e, a, scale, e->phase[i], e->sync_in[i], err);
    else if (a->kind == MEGA_ACT_W) st = do_weight(e, a, e->sync_in[i], err);
    else st = do_sync(e, a, err);
    if (!is_sync(a->kind)) res->work_end_wall = wall_s();
    if (st == MEGA_OK && e->npending) st = reap_sends(e, err);
    if (st != MEGA_OK) {
      char name[24];
      mega_err_prefix(err, "iteration %lld, %s", (long long)it + 1, mega_action_format(*a, name));
    }
    i++;
  }
  for (int k = 0; k < e->npending && st == MEGA_OK; k++)
    st = wait_msg(e, e->pending[k], PH_COOLDOWN, err);
  if (e->npending) res->work_end_wall = wall_s();
  e->npending = 0;
  res->schedule_s = mono_s() - t0;
  e->res = NULL;
  return st;
}
