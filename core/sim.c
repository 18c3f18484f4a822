/* Discrete-event simulation of a schedule. Sends never block and compute
 * never waits, so only receives block; a rank runs until it reaches a receive
 * whose message has not been posted, and is woken when it is. Times follow
 * from the data flow alone, so the order in which ranks are advanced does not
 * change them. Linear in the number of actions. */
#include "core/sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool bad_cost(double v) { return !isfinite(v) || v < 0; }

void mega_sim_free(mega_sim *sim) {
  if (!sim) return;
  if (sim->ranks)
    for (int r = 0; r < sim->pp; r++) {
      free(sim->ranks[r].spans);
      free(sim->ranks[r].reduce);
    }
  free(sim->ranks);
  memset(sim, 0, sizeof *sim);
}

/* Channel of a communication action: (direction, sender); -1 for compute. */
static int channel_of(const mega_schedule *s, int rank, mega_action a) {
  int pr, pc;
  switch (a.kind) {
  case MEGA_ACT_SEND_F: return rank;
  case MEGA_ACT_SEND_B: return s->pp + rank;
  case MEGA_ACT_RECV_F: mega_sched_peer(s, rank, a, &pr, &pc); return pr;
  case MEGA_ACT_RECV_B: mega_sched_peer(s, rank, a, &pr, &pc); return pr < 0 ? -1 : s->pp + pr;
  default: return -1;
  }
}

typedef struct msg {
  double arrival;
  mega_action send; /* as written by the sender */
} msg;

/* One run's state. Per channel: its messages in send order (CSR), how many
 * were posted and taken (a channel has one receiver, so a receiver blocked
 * on it waits for message taken[ch]). Per rank: its next action, its clock,
 * whether it waits on a receive, and its data-parallel communicator. */
typedef struct simulation {
  const mega_schedule *s;
  const mega_cost *cost;
  mega_sim *out;
  int pp, nch, nbk;    /* nch: 2 channels per rank; nbk: buckets per chunk */
  double vp, transfer; /* transfer: a message's time from send to arrival */
  long long *off, *posted, *taken;
  msg *msgs;
  int *pc, *ready, nready; /* ready: a stack of the ranks to advance */
  bool *blocked, *has_w;
  double *clock, *comm_free; /* comm_free: when its communicator is next idle */
  double *reduced; /* [rank][chunk]: when the chunk's last bucket is reduced */
  double *share;   /* [nbk + 1]: the part of a chunk's floats in the buckets before j */
  double **rready; /* [rank][reduction]: when each bucket was ready, parallel to reduce */
  double **rcost;  /* [rank][reduction]: what it costs alone */
  int **rchunk;    /* [rank][reduction]: its chunk */
} simulation;

static mega_status check_input(const mega_schedule *s, const mega_cost *cost, mega_err *err) {
  if (!s || s->pp < 1 || s->vp < 1 || !s->ranks)
    return mega_fail(err, MEGA_ERR_INVALID, "the schedule is empty or not initialised");
  if (bad_cost(cost->grad_sync_lanes) || (cost->grad_sync_lanes > 0 && cost->grad_sync_lanes < 1))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "grad_sync_lanes must be 0 (each rank's own links) or at least 1 (one "
                     "reduction alone runs at full speed), not %g", cost->grad_sync_lanes);
  if (cost->grad_sync_slowdown && cost->grad_sync_lanes > 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "give the reductions' sharing as lanes or as slowdowns, not both");
  if (cost->grad_sync_slowdown && cost->grad_sync_slowdown_n < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "the slowdown table is empty");
  for (int k = 0; cost->grad_sync_slowdown && k < cost->grad_sync_slowdown_n; k++)
    if (!isfinite(cost->grad_sync_slowdown[k]) || cost->grad_sync_slowdown[k] < 1)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "%d reductions at once run %g times slower than one: a slowdown is 1 "
                       "or more", k + 1, cost->grad_sync_slowdown[k]);
  int nbk = cost->grad_buckets > 1 ? cost->grad_buckets : 1;
  if ((long long)s->pp * s->vp * nbk > MEGA_SIM_MAX_REDUCTIONS)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "pp*vp*grad_buckets = %lld bucket reductions is more than the simulator "
                     "handles (%d); give fewer buckets", (long long)s->pp * s->vp * nbk,
                     MEGA_SIM_MAX_REDUCTIONS);
  double total = 0;
  for (int j = 0; cost->grad_bucket_sizes && j < nbk; j++) {
    if (bad_cost(cost->grad_bucket_sizes[j]))
      return mega_fail(err, MEGA_ERR_INVALID,
                       "bucket %d's size must be finite and not negative, not %g", j,
                       cost->grad_bucket_sizes[j]);
    total += cost->grad_bucket_sizes[j];
  }
  if (cost->grad_bucket_sizes && !(total > 0))
    return mega_fail(err, MEGA_ERR_INVALID, "the %d bucket sizes add up to nothing", nbk);
  if (bad_cost(cost->t_f) || bad_cost(cost->t_b) || bad_cost(cost->t_w) ||
      bad_cost(cost->p2p_latency) || bad_cost(cost->p2p_bandwidth) ||
      bad_cost(cost->activation_bytes) || bad_cost(cost->grad_sync) ||
      bad_cost(cost->grad_sync_latency))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "costs must be finite and not negative (t_f=%g t_b=%g t_w=%g latency=%g "
                     "bandwidth=%g bytes=%g grad_sync=%g grad_sync_latency=%g)",
                     cost->t_f, cost->t_b, cost->t_w, cost->p2p_latency, cost->p2p_bandwidth,
                     cost->activation_bytes, cost->grad_sync, cost->grad_sync_latency);
  return MEGA_OK;
}

/* The state's arrays (free_state frees them) and the result's ranks. */
static mega_status alloc_state(simulation *sim, mega_err *err) {
  size_t pp = (size_t)sim->pp, nch = (size_t)sim->nch;
  sim->out->pp = sim->pp;
  sim->out->ranks = calloc(pp, sizeof *sim->out->ranks);
  sim->off = calloc(nch + 1, sizeof *sim->off);
  sim->posted = calloc(nch, sizeof *sim->posted);
  sim->taken = calloc(nch, sizeof *sim->taken);
  sim->pc = calloc(pp, sizeof *sim->pc);
  sim->ready = malloc(pp * sizeof *sim->ready);
  sim->blocked = calloc(pp, sizeof *sim->blocked);
  sim->has_w = calloc(pp, sizeof *sim->has_w);
  sim->clock = calloc(pp, sizeof *sim->clock);
  sim->comm_free = calloc(pp, sizeof *sim->comm_free);
  sim->reduced = calloc(pp * (size_t)sim->s->vp, sizeof *sim->reduced);
  sim->share = calloc((size_t)sim->nbk + 1, sizeof *sim->share);
  sim->rready = calloc(pp, sizeof *sim->rready);
  sim->rcost = calloc(pp, sizeof *sim->rcost);
  sim->rchunk = calloc(pp, sizeof *sim->rchunk);
  if (!sim->out->ranks || !sim->off || !sim->posted || !sim->taken || !sim->pc || !sim->ready ||
      !sim->blocked || !sim->has_w || !sim->clock || !sim->comm_free || !sim->reduced ||
      !sim->share || !sim->rready || !sim->rcost || !sim->rchunk)
    return mega_fail(err, MEGA_ERR_NOMEM, "no memory to simulate pp=%d", sim->pp);
  const double *size = sim->cost->grad_bucket_sizes;
  for (int j = 0; j < sim->nbk; j++) sim->share[j + 1] = sim->share[j] + (size ? size[j] : 1);
  double total = sim->share[sim->nbk];
  for (int j = 1; j <= sim->nbk; j++) sim->share[j] /= total;
  sim->share[sim->nbk] = 1; /* the last bucket is ready when the backward ends */
  return MEGA_OK;
}

static void free_state(simulation *sim) {
  for (int r = 0; r < sim->pp; r++) {
    if (sim->rready) free(sim->rready[r]);
    if (sim->rcost) free(sim->rcost[r]);
    if (sim->rchunk) free(sim->rchunk[r]);
  }
  free(sim->rready);
  free(sim->rcost);
  free(sim->rchunk);
  free(sim->share);
  free(sim->off);
  free(sim->posted);
  free(sim->taken);
  free(sim->pc);
  free(sim->ready);
  free(sim->blocked);
  free(sim->has_w);
  free(sim->clock);
  free(sim->comm_free);
  free(sim->reduced);
  free(sim->msgs);
}

/* Rank r's spans and, when it has GS actions, its reductions. */
static mega_status alloc_rank(simulation *sim, int r, mega_err *err) {
  const mega_sched_rank *q = &sim->s->ranks[r];
  mega_sim_rank *o = &sim->out->ranks[r];
  o->spans = malloc((size_t)(q->n > 0 ? q->n : 1) * sizeof(mega_span));
  if (!o->spans)
    return mega_fail(err, MEGA_ERR_NOMEM, "no memory for rank %d's %d spans", r, q->n);
  int syncs = 0;
  for (int i = 0; i < q->n; i++) syncs += q->acts[i].kind == MEGA_ACT_GRAD_SYNC;
  if (!syncs) return MEGA_OK;
  size_t n = (size_t)syncs * (size_t)sim->nbk;
  o->reduce = malloc(n * sizeof(mega_span));
  sim->rready[r] = malloc(n * sizeof(double));
  sim->rcost[r] = malloc(n * sizeof(double));
  sim->rchunk[r] = malloc(n * sizeof(int));
  if (!o->reduce || !sim->rready[r] || !sim->rcost[r] || !sim->rchunk[r])
    return mega_fail(err, MEGA_ERR_NOMEM, "no memory for rank %d's reductions", r);
  return MEGA_OK;
}

/* Checks rank r's actions, notes whether it has W's and counts its sends
 * into the channels' sizes. */
static mega_status scan_rank(simulation *sim, int r, mega_err *err) {
  const mega_schedule *s = sim->s;
  const mega_sched_rank *q = &s->ranks[r];
  for (int i = 0; i < q->n; i++) {
    mega_action a = q->acts[i];
    if (a.kind >= MEGA_ACT_KINDS || a.chunk >= s->vp) {
      char tok[24];
      return mega_fail(err, MEGA_ERR_INVALID, "rank %d, action %d (%s) is not a valid action", r,
                       i, mega_action_format(a, tok));
    }
    if (a.kind == MEGA_ACT_W) sim->has_w[r] = true;
    if (a.kind == MEGA_ACT_SEND_F || a.kind == MEGA_ACT_SEND_B) {
      int ch = channel_of(s, r, a);
      if (ch >= 0) sim->off[ch + 1]++;
    }
  }
  return MEGA_OK;
}

/* Every rank's arrays and checks, rank by rank, then the message lists. */
static mega_status prepare_ranks(simulation *sim, mega_err *err) {
  for (int r = 0; r < sim->pp; r++) {
    mega_status st = alloc_rank(sim, r, err);
    if (!st) st = scan_rank(sim, r, err);
    if (st) return st;
  }
  long long *off = sim->off;
  for (int ch = 0; ch < sim->nch; ch++) off[ch + 1] += off[ch];
  sim->msgs = malloc((size_t)(off[sim->nch] > 0 ? off[sim->nch] : 1) * sizeof *sim->msgs);
  if (!sim->msgs)
    return mega_fail(err, MEGA_ERR_NOMEM, "no memory for %lld messages", off[sim->nch]);
  return MEGA_OK;
}

/* Bucket j's reduction: its share of the bytes and a collective's latency. */
static double bucket_cost(const simulation *sim, int j) {
  double part = sim->share[j + 1] - sim->share[j];
  return sim->cost->grad_sync / sim->vp * part + sim->cost->grad_sync_latency;
}

/* GS at time t: the chunk's buckets reduce one at a time on the rank's
 * communicator. They are ready during the chunk's last backward when the
 * GS follows it at once (the engine launches each as the layers whose
 * floats it holds finish), else at the GS. */
static void launch_reduction(simulation *sim, int r, int i, double t) {
  const mega_sched_rank *q = &sim->s->ranks[r];
  mega_sim_rank *o = &sim->out->ranks[r];
  mega_action a = q->acts[i];
  mega_act_kind wk = sim->has_w[r] ? MEGA_ACT_W : MEGA_ACT_B;
  bool during = i > 0 && q->acts[i - 1].kind == wk && q->acts[i - 1].chunk == a.chunk;
  mega_span prev = during ? o->spans[i - 1] : (mega_span){t, t};
  double *comm_free = &sim->comm_free[r];
  for (int j = 0; j < sim->nbk; j++) {
    double rdy = prev.start + (prev.end - prev.start) * sim->share[j + 1];
    double start = rdy > *comm_free ? rdy : *comm_free, cost = bucket_cost(sim, j);
    *comm_free = start + cost;
    sim->rready[r][o->nreduce] = rdy;
    sim->rcost[r][o->nreduce] = cost;
    sim->rchunk[r][o->nreduce] = a.chunk;
    o->reduce[o->nreduce++] = (mega_span){start, *comm_free};
  }
  sim->reduced[(size_t)r * sim->s->vp + a.chunk] = *comm_free;
}

/* GW at time t: how long until the chunk's last bucket is reduced. */
static double reduction_wait(const simulation *sim, int r, mega_action a, double t) {
  double d = sim->reduced[(size_t)r * sim->s->vp + a.chunk];
  return d > t ? d - t : 0;
}

/* SF, SB at time t: posts the message, and wakes the receiver if it waits
 * for exactly this one. */
static void post_send(simulation *sim, int r, mega_action a, double t) {
  int ch = channel_of(sim->s, r, a), pp = sim->pp;
  if (ch < 0) return;
  sim->msgs[sim->off[ch] + sim->posted[ch]++] = (msg){t + sim->transfer, a};
  int to = a.kind == MEGA_ACT_SEND_F ? (r + 1) % pp : (r + pp - 1) % pp;
  if (sim->blocked[to] && sim->taken[ch] == sim->posted[ch] - 1) {
    sim->blocked[to] = false;
    sim->ready[sim->nready++] = to;
  }
}

/* RF, RB at time t: takes the channel's next message, which must be the
 * one action i expects, and sets how long it waited; blocks the rank when
 * the message has not been posted. */
static mega_status receive(simulation *sim, int r, int i, double t, double *dur, mega_err *err) {
  mega_action a = sim->s->ranks[r].acts[i];
  int ch = channel_of(sim->s, r, a);
  if (ch < 0) return MEGA_OK; /* nothing to receive at the model's ends */
  if (sim->taken[ch] == sim->posted[ch]) {
    sim->blocked[r] = true;
    return MEGA_OK;
  }
  msg m = sim->msgs[sim->off[ch] + sim->taken[ch]];
  int sender = ch < sim->pp ? ch : ch - sim->pp, pr, pchunk;
  mega_sched_peer(sim->s, sender, m.send, &pr, &pchunk);
  if (m.send.mb != a.mb || pchunk != a.chunk) {
    char t1[24], t2[24];
    return mega_fail(err, MEGA_ERR_INVALID,
                     "rank %d, action %d (%s) would receive the message of %s from rank %d; "
                     "validate the schedule",
                     r, i, mega_action_format(a, t1), mega_action_format(m.send, t2), sender);
  }
  sim->taken[ch]++;
  if (m.arrival > t) *dur = m.arrival - t;
  return MEGA_OK;
}

/* Performs action i of rank r, reached at time t, and sets its duration. */
static mega_status perform(simulation *sim, int r, int i, double t, double *dur, mega_err *err) {
  const mega_cost *c = sim->cost;
  mega_action a = sim->s->ranks[r].acts[i];
  switch (a.kind) {
  case MEGA_ACT_F: *dur = c->t_f / sim->vp; break;
  case MEGA_ACT_B: *dur = (sim->has_w[r] ? c->t_b : c->t_b + c->t_w) / sim->vp; break;
  case MEGA_ACT_W: *dur = c->t_w / sim->vp; break;
  case MEGA_ACT_GRAD_SYNC: launch_reduction(sim, r, i, t); break;
  case MEGA_ACT_GRAD_WAIT: *dur = reduction_wait(sim, r, a, t); break;
  case MEGA_ACT_SEND_F:
  case MEGA_ACT_SEND_B: post_send(sim, r, a, t); break;
  default: return receive(sim, r, i, t, dur, err);
  }
  return MEGA_OK;
}

/* Runs rank r until it finishes or blocks on a receive. */
static mega_status advance_rank(simulation *sim, int r, mega_err *err) {
  const mega_sched_rank *q = &sim->s->ranks[r];
  mega_sim_rank *o = &sim->out->ranks[r];
  sim->blocked[r] = false;
  while (sim->pc[r] < q->n) {
    int i = sim->pc[r];
    mega_action a = q->acts[i];
    double t = sim->clock[r], dur = 0;
    mega_status st = perform(sim, r, i, t, &dur, err);
    if (st) return st;
    if (sim->blocked[r]) break;
    o->spans[i] = (mega_span){t, t + dur};
    if (a.kind <= MEGA_ACT_W) o->busy += dur;
    if (a.kind != MEGA_ACT_GRAD_SYNC && a.kind != MEGA_ACT_GRAD_WAIT) o->work_end = t + dur;
    sim->clock[r] = t + dur;
    sim->pc[r]++;
  }
  return MEGA_OK;
}

/* Advances ready ranks until every rank has finished or waits. */
static mega_status run_ranks(simulation *sim, mega_err *err) {
  for (int r = 0; r < sim->pp; r++) sim->ready[sim->nready++] = r;
  while (sim->nready) {
    mega_status st = advance_rank(sim, sim->ready[--sim->nready], err);
    if (st) return st;
  }
  return MEGA_OK;
}

/* Fails naming the ranks that stopped short of their last action. */
static mega_status check_finished(const simulation *sim, mega_err *err) {
  const mega_schedule *s = sim->s;
  char text[MEGA_ERR_MSG_MAX];
  int len = snprintf(text, sizeof text, "the schedule cannot finish:"), stuck = 0;
  for (int r = 0; r < sim->pp; r++) {
    int pc = sim->pc[r];
    if (pc >= s->ranks[r].n) continue;
    char tok[24];
    if (len < (int)sizeof text - 48)
      len += snprintf(text + len, sizeof text - (size_t)len, "%s rank %d waits at %s (action %d)",
                      stuck ? "," : "", r, mega_action_format(s->ranks[r].acts[pc], tok), pc);
    else if (len < (int)sizeof text - 8)
      len += snprintf(text + len, sizeof text - (size_t)len, ", ...");
    stuck++;
  }
  return stuck ? mega_fail(err, MEGA_ERR_INVALID, "%s", text) : MEGA_OK;
}

static bool has_grad_wait(const mega_schedule *s) {
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->ranks[r].n; i++)
      if (s->ranks[r].acts[i].kind == MEGA_ACT_GRAD_WAIT) return true;
  return false;
}

/* How long each rank's reductions outlast the pipeline, which drained when
 * the last action other than GS and GW ended on any rank. The tied
 * embedding's sum adds nothing: the loss stage's copy joins the first
 * stage's wte bucket before its reduction (worker/engine/grads.h), and the
 * total goes back while the ranks go on. */
static void set_grad_sync_exposed(mega_sim *out, double drained) {
  int pp = out->pp;
  double exposed = 0;
  for (int r = 0; r < pp; r++) {
    mega_sim_rank *o = &out->ranks[r];
    o->grad_sync_exposed = o->end > drained ? o->end - drained : 0;
    exposed += o->grad_sync_exposed;
  }
  out->grad_sync_exposed = exposed / pp;
}

/* ---- shared links (grad_sync_lanes, grad_sync_slowdown) ---- */

/* The speed of each of k reductions at once, as a share of one alone. */
static double shared_rate(const mega_cost *c, int k) {
  if (k <= 1) return 1;
  if (!c->grad_sync_slowdown) return k > c->grad_sync_lanes ? c->grad_sync_lanes / k : 1;
  int n = c->grad_sync_slowdown_n;
  if (k <= n) return 1 / c->grad_sync_slowdown[k - 1];
  return (double)n / c->grad_sync_slowdown[n - 1] / k; /* n's total speed, shared by k */
}

/* Fails unless every rank's GWs close its list (the reductions then change
 * nothing before them). */
static mega_status check_waits_last(const mega_schedule *s, mega_err *err) {
  for (int r = 0; r < s->pp; r++) {
    const mega_sched_rank *q = &s->ranks[r];
    bool waited = false;
    for (int i = 0; i < q->n; i++) {
      if (q->acts[i].kind == MEGA_ACT_GRAD_WAIT) {
        waited = true;
      } else if (waited) {
        char tok[24];
        return mega_fail(err, MEGA_ERR_INVALID,
                         "shared gradient-sync lanes need each rank's GWs at the end of its "
                         "list, and rank %d has %s (action %d) after one; drop the sharing "
                         "or move the GWs",
                         r, mega_action_format(q->acts[i], tok), i);
      }
    }
  }
  return MEGA_OK;
}

/* The reductions again, in time order across ranks: each rank's
 * communicator takes its buckets in launch order once they are ready, and
 * the k running at once each run at shared_rate(k) of full speed. */
static void share_reductions(simulation *sim) {
  int pp = sim->pp;
  int next[pp];    /* the rank's next bucket */
  double left[pp]; /* work left of its running bucket; < 0: none runs */
  for (int r = 0; r < pp; r++) {
    next[r] = 0;
    left[r] = -1;
  }
  double now = 0;
  for (;;) {
    int running = 0;
    double arrival = INFINITY; /* the next bucket to become ready on an idle rank */
    for (int r = 0; r < pp; r++) {
      mega_sim_rank *o = &sim->out->ranks[r];
      if (left[r] < 0 && next[r] < o->nreduce && sim->rready[r][next[r]] <= now) {
        left[r] = sim->rcost[r][next[r]];
        o->reduce[next[r]].start = now;
      }
      if (left[r] >= 0) running++;
      else if (next[r] < o->nreduce && sim->rready[r][next[r]] < arrival)
        arrival = sim->rready[r][next[r]];
    }
    if (!running && arrival == INFINITY) break;
    double rate = shared_rate(sim->cost, running), step = arrival - now;
    for (int r = 0; r < pp; r++)
      if (left[r] >= 0 && left[r] / rate < step) step = left[r] / rate;
    now += step;
    for (int r = 0; r < pp; r++) {
      if (left[r] < 0) continue;
      left[r] -= step * rate;
      if (left[r] > sim->rcost[r][next[r]] * 1e-9) continue;
      mega_sim_rank *o = &sim->out->ranks[r];
      o->reduce[next[r]].end = now;
      double *done = &sim->reduced[(size_t)r * sim->s->vp + sim->rchunk[r][next[r]]];
      if (now > *done) *done = now;
      next[r]++;
      left[r] = -1;
    }
  }
}

/* Each rank's GWs again, from its first, against the shared reductions. */
static void redo_waits(simulation *sim) {
  for (int r = 0; r < sim->pp; r++) {
    const mega_sched_rank *q = &sim->s->ranks[r];
    mega_sim_rank *o = &sim->out->ranks[r];
    int i = 0;
    while (i < q->n && q->acts[i].kind != MEGA_ACT_GRAD_WAIT) i++;
    if (i == q->n) continue;
    double t = o->spans[i].start;
    for (; i < q->n; i++) {
      double d = reduction_wait(sim, r, q->acts[i], t);
      o->spans[i] = (mega_span){t, t + d};
      t += d;
    }
    sim->clock[r] = t;
  }
}

static void set_bubbles(mega_sim *out, const mega_schedule *s) {
  double sum = 0;
  for (int r = 0; r < out->pp; r++) {
    mega_sim_rank *o = &out->ranks[r];
    o->idle = out->makespan - o->busy;
    if (o->idle < 0) o->idle = 0;
    o->bubble_fraction = out->makespan > 0 ? o->idle / out->makespan : 0;
    o->peak_inflight = mega_sched_peak_inflight(s, r);
    sum += o->bubble_fraction;
  }
  out->bubble_fraction = sum / out->pp;
}

/* The result's totals once every rank has finished. */
static void summarize(const simulation *sim) {
  mega_sim *out = sim->out;
  double drained = 0;
  for (int r = 0; r < sim->pp; r++) {
    out->ranks[r].end = sim->clock[r];
    if (sim->clock[r] > out->makespan) out->makespan = sim->clock[r];
    if (out->ranks[r].work_end > drained) drained = out->ranks[r].work_end;
  }
  set_grad_sync_exposed(out, drained);
  set_bubbles(out, sim->s);
}

mega_status mega_sim_run(const mega_schedule *s, const mega_cost *cost, mega_sim *out,
                         mega_err *err) {
  memset(out, 0, sizeof *out);
  mega_status st = check_input(s, cost, err);
  if (st) return st;
  simulation sim = {
      .s = s,
      .cost = cost,
      .out = out,
      .pp = s->pp,
      .nch = 2 * s->pp,
      .nbk = cost->grad_buckets > 1 ? cost->grad_buckets : 1,
      .vp = s->vp,
      .transfer = cost->p2p_latency +
                  (cost->p2p_bandwidth > 0 ? cost->activation_bytes / cost->p2p_bandwidth : 0),
  };
  bool shared = (cost->grad_sync_lanes > 0 || cost->grad_sync_slowdown) && has_grad_wait(s);
  if (shared) st = check_waits_last(s, err);
  if (!st) st = alloc_state(&sim, err);
  if (!st) st = prepare_ranks(&sim, err);
  if (!st) st = run_ranks(&sim, err);
  if (!st) st = check_finished(&sim, err);
  if (!st && shared) {
    memset(sim.reduced, 0, (size_t)sim.pp * (size_t)s->vp * sizeof *sim.reduced);
    share_reductions(&sim);
    redo_waits(&sim);
  }
  if (!st) summarize(&sim);
  free_state(&sim);
  if (st) mega_sim_free(out);
  return st;
}
