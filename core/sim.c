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

mega_status mega_sim_run(const mega_schedule *s, const mega_cost *cost, mega_sim *out,
                         mega_err *err) {
  memset(out, 0, sizeof *out);
  if (!s || s->pp < 1 || s->vp < 1 || !s->ranks)
    return mega_fail(err, MEGA_ERR_INVALID, "the schedule is empty or not initialised");
  if (bad_cost(cost->t_f) || bad_cost(cost->t_b) || bad_cost(cost->t_w) ||
      bad_cost(cost->p2p_latency) || bad_cost(cost->p2p_bandwidth) ||
      bad_cost(cost->activation_bytes) || bad_cost(cost->grad_sync))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "costs must be finite and not negative (t_f=%g t_b=%g t_w=%g latency=%g "
                     "bandwidth=%g bytes=%g)",
                     cost->t_f, cost->t_b, cost->t_w, cost->p2p_latency, cost->p2p_bandwidth,
                     cost->activation_bytes);
  int pp = s->pp, nch = 2 * pp;
  double vp = s->vp;
  double transfer = cost->p2p_latency +
                    (cost->p2p_bandwidth > 0 ? cost->activation_bytes / cost->p2p_bandwidth : 0);

  mega_status st = MEGA_OK;
  out->pp = pp;
  out->ranks = calloc((size_t)pp, sizeof *out->ranks);
  /* Per channel: its messages in send order (CSR), how many were posted and
   * taken, and the receiver blocked on it (a channel has one receiver). */
  long long *off = calloc((size_t)nch + 1, sizeof *off);
  long long *posted = calloc((size_t)nch, sizeof *posted);
  long long *taken = calloc((size_t)nch, sizeof *taken);
  int *pc = calloc((size_t)pp, sizeof *pc), *ready = malloc((size_t)pp * sizeof *ready);
  bool *blocked = calloc((size_t)pp, sizeof *blocked), *has_w = calloc((size_t)pp, sizeof *has_w);
  double *clock = calloc((size_t)pp, sizeof *clock);
  double *comm_free = calloc((size_t)pp, sizeof *comm_free);
  double *done = calloc((size_t)pp * (size_t)s->vp, sizeof *done); /* [rank][chunk] */
  int nbk = cost->grad_buckets > 1 ? cost->grad_buckets : 1;
  msg *msgs = NULL;
  if (!out->ranks || !off || !posted || !taken || !pc || !ready || !blocked || !has_w || !clock ||
      !comm_free || !done) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "no memory to simulate pp=%d", pp);
    goto out;
  }
  for (int r = 0; r < pp; r++) {
    const mega_sched_rank *q = &s->ranks[r];
    out->ranks[r].spans = malloc((size_t)(q->n > 0 ? q->n : 1) * sizeof(mega_span));
    if (!out->ranks[r].spans) {
      st = mega_fail(err, MEGA_ERR_NOMEM, "no memory for rank %d's %d spans", r, q->n);
      goto out;
    }
    int syncs = 0;
    for (int i = 0; i < q->n; i++) syncs += q->acts[i].kind == MEGA_ACT_GRAD_SYNC;
    if (syncs) {
      out->ranks[r].reduce = malloc((size_t)syncs * (size_t)nbk * sizeof(mega_span));
      if (!out->ranks[r].reduce) {
        st = mega_fail(err, MEGA_ERR_NOMEM, "no memory for rank %d's reductions", r);
        goto out;
      }
    }
    for (int i = 0; i < q->n; i++) {
      mega_action a = q->acts[i];
      if (a.kind >= MEGA_ACT_KINDS || a.chunk >= s->vp) {
        char tok[24];
        st = mega_fail(err, MEGA_ERR_INVALID, "rank %d, action %d (%s) is not a valid action", r,
                       i, mega_action_format(a, tok));
        goto out;
      }
      if (a.kind == MEGA_ACT_W) has_w[r] = true;
      if (a.kind == MEGA_ACT_SEND_F || a.kind == MEGA_ACT_SEND_B) {
        int ch = channel_of(s, r, a);
        if (ch >= 0) off[ch + 1]++;
      }
    }
  }
  for (int ch = 0; ch < nch; ch++) off[ch + 1] += off[ch];
  msgs = malloc((size_t)(off[nch] > 0 ? off[nch] : 1) * sizeof *msgs);
  if (!msgs) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "no memory for %lld messages", off[nch]);
    goto out;
  }

  int nready = 0;
  for (int r = 0; r < pp; r++) ready[nready++] = r;
  while (nready && !st) {
    int r = ready[--nready];
    const mega_sched_rank *q = &s->ranks[r];
    mega_sim_rank *o = &out->ranks[r];
    blocked[r] = false;
    while (pc[r] < q->n) {
      int i = pc[r];
      mega_action a = q->acts[i];
      double t = clock[r], dur = 0;
      switch (a.kind) {
      case MEGA_ACT_F: dur = cost->t_f / vp; break;
      case MEGA_ACT_B: dur = (has_w[r] ? cost->t_b : cost->t_b + cost->t_w) / vp; break;
      case MEGA_ACT_W: dur = cost->t_w / vp; break;
      case MEGA_ACT_GRAD_SYNC: {
        /* Buckets are ready during the chunk's last backward when the GS
         * follows it at once, else at the GS. */
        mega_act_kind wk = has_w[r] ? MEGA_ACT_W : MEGA_ACT_B;
        bool during = i > 0 && q->acts[i - 1].kind == wk && q->acts[i - 1].chunk == a.chunk;
        mega_span prev = during ? o->spans[i - 1] : (mega_span){t, t};
        double each = cost->grad_sync / vp / nbk;
        for (int j = 0; j < nbk; j++) {
          double rdy = prev.start + (prev.end - prev.start) * (j + 1) / nbk;
          double start = rdy > comm_free[r] ? rdy : comm_free[r];
          comm_free[r] = start + each;
          o->reduce[o->nreduce++] = (mega_span){start, comm_free[r]};
        }
        done[(size_t)r * s->vp + a.chunk] = comm_free[r];
        break;
      }
      case MEGA_ACT_GRAD_WAIT: {
        double d = done[(size_t)r * s->vp + a.chunk];
        if (d > t) dur = d - t;
        break;
      }
      case MEGA_ACT_SEND_F:
      case MEGA_ACT_SEND_B: {
        int ch = channel_of(s, r, a);
        if (ch >= 0) {
          msgs[off[ch] + posted[ch]++] = (msg){t + transfer, a};
          /* Wake the receiver if it waits for exactly this message. */
          int to = a.kind == MEGA_ACT_SEND_F ? (r + 1) % pp : (r + pp - 1) % pp;
          if (blocked[to] && taken[ch] == posted[ch] - 1) {
            blocked[to] = false;
            ready[nready++] = to;
          }
        }
        break;
      }
      default: { /* receives */
        int ch = channel_of(s, r, a);
        if (ch < 0) break; /* nothing to receive at the model's ends */
        if (taken[ch] == posted[ch]) {
          blocked[r] = true;
          break;
        }
        msg m = msgs[off[ch] + taken[ch]];
        int pr, pchunk;
        mega_sched_peer(s, ch < pp ? ch : ch - pp, m.send, &pr, &pchunk);
        if (m.send.mb != a.mb || pchunk != a.chunk) {
          char t1[24], t2[24];
          st = mega_fail(err, MEGA_ERR_INVALID,
                         "rank %d, action %d (%s) would receive the message of %s from rank %d; "
                         "validate the schedule",
                         r, i, mega_action_format(a, t1), mega_action_format(m.send, t2),
                         ch < pp ? ch : ch - pp);
          break;
        }
        taken[ch]++;
        if (m.arrival > t) dur = m.arrival - t;
        break;
      }
      }
      if (blocked[r] || st) break;
      o->spans[i] = (mega_span){t, t + dur};
      if (a.kind <= MEGA_ACT_W) o->busy += dur;
      if (a.kind != MEGA_ACT_GRAD_SYNC && a.kind != MEGA_ACT_GRAD_WAIT) o->work_end = t + dur;
      clock[r] = t + dur;
      pc[r]++;
    }
  }
  if (st) goto out;

  char text[MEGA_ERR_MSG_MAX];
  int len = snprintf(text, sizeof text, "the schedule cannot finish:"), stuck = 0;
  for (int r = 0; r < pp; r++) {
    if (pc[r] >= s->ranks[r].n) continue;
    char tok[24];
    if (len < (int)sizeof text - 48)
      len += snprintf(text + len, sizeof text - (size_t)len, "%s rank %d waits at %s (action %d)",
                      stuck ? "," : "", r, mega_action_format(s->ranks[r].acts[pc[r]], tok), pc[r]);
    else if (len < (int)sizeof text - 8)
      len += snprintf(text + len, sizeof text - (size_t)len, ", ...");
    stuck++;
  }
  if (stuck) {
    st = mega_fail(err, MEGA_ERR_INVALID, "%s", text);
    goto out;
  }

  double sum = 0, drained = 0, exposed = 0;
  for (int r = 0; r < pp; r++) {
    out->ranks[r].end = clock[r];
    if (clock[r] > out->makespan) out->makespan = clock[r];
    if (out->ranks[r].work_end > drained) drained = out->ranks[r].work_end;
  }
  /* finalize_model_grads: the first and last stage sum the tied
   * embedding's gradient once both have their reductions, so with gradient
   * sync in the schedule each of the two is done when the later one is. */
  bool sync = false;
  for (int r = 0; r < pp && !sync; r++)
    for (int i = 0; i < s->ranks[r].n && !sync; i++)
      sync = s->ranks[r].acts[i].kind == MEGA_ACT_GRAD_WAIT;
  double tied = out->ranks[0].end > out->ranks[pp - 1].end ? out->ranks[0].end
                                                            : out->ranks[pp - 1].end;
  for (int r = 0; r < pp; r++) {
    mega_sim_rank *o = &out->ranks[r];
    double done = sync && pp > 1 && (r == 0 || r == pp - 1) ? tied : o->end;
    o->grad_sync_exposed = done > drained ? done - drained : 0;
    exposed += o->grad_sync_exposed;
  }
  out->grad_sync_exposed = exposed / pp;
  for (int r = 0; r < pp; r++) {
    mega_sim_rank *o = &out->ranks[r];
    o->idle = out->makespan - o->busy;
    if (o->idle < 0) o->idle = 0;
    o->bubble_fraction = out->makespan > 0 ? o->idle / out->makespan : 0;
    o->peak_inflight = mega_sched_peak_inflight(s, r);
    sum += o->bubble_fraction;
  }
  out->bubble_fraction = sum / pp;
out:
  free(off);
  free(posted);
  free(taken);
  free(pc);
  free(ready);
  free(blocked);
  free(has_w);
  free(clock);
  free(comm_free);
  free(done);
  free(msgs);
  if (st) mega_sim_free(out);
  return st;
}
