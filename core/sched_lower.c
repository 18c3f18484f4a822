/* The one lowering pass: communication around a compute-only schedule.
 *
 * Megatron's pairing: the send of what a compute action produced goes right
 * after it, and the receive a compute action needs right before it, so one
 * action's sends and the next one's receive form a single P2P step
 * (send_forward_recv_backward and friends). 1F1B, GPipe and ZB-H1 keep
 * exactly that.
 *
 * Under NCCL's rendezvous a step completes only when all its operations are
 * matched, and with Megatron's interleaved order "right before" is sometimes
 * too late: PP=2 VP=2 M=4 deadlocks (rank 0 waits at SB0.1 for rank 1's
 * RB0.0, which comes after rank 1's SB1.1, which waits for rank 0's RB1.1).
 * Megatron avoids that by posting the receives of the next iteration in the
 * current batched call. We move receives up only where needed: run the
 * rendezvous of the current placement; at a standstill, take the stuck rank
 * whose step ends first on a unit-time plan of the compute order (every F,
 * B and W one unit). That rank waits at a send (a waiting receive would
 * point to a rank further behind), and its receiver cannot pass its own
 * step, so the receive moves into that step: this adds no wait, and never
 * puts a receive earlier than the plan needs it. A standstill with nothing
 * to move means the compute order itself cannot run. */
#include "core/sched_lower.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct lowering {
  const mega_schedule *s;
  int pp, stages; /* stages: microbatches * vp, the index space per rank */
  int **f_pos, **b_pos; /* [rank][mb*vp+chunk] position of F / B, or -1 */
  int **rgap;           /* [rank][j] step holding compute j's receive, or -1 */
  int **start;          /* [rank][j] compute j's start on the unit-time plan */
  int *cur, *pending;   /* [rank] step it stands at; its ops not yet matched */
} lowering;

/* (q, qi): the compute action whose output compute i of rank r consumes;
 * false when it needs no message. */
static bool producer(const lowering *L, int r, int i, int *q, int *qi) {
  mega_action a = L->s->ranks[r].acts[i];
  int pr, pc;
  mega_action probe = a;
  if (a.kind == MEGA_ACT_F) {
    if (mega_sched_is_first_stage(L->s, r, a.chunk)) return false;
    probe.kind = MEGA_ACT_RECV_F;
    mega_sched_peer(L->s, r, probe, &pr, &pc);
    *q = pr;
    *qi = L->f_pos[pr][a.mb * L->s->vp + pc];
    return true;
  }
  if (a.kind == MEGA_ACT_B) {
    if (mega_sched_is_last_stage(L->s, r, a.chunk)) return false;
    probe.kind = MEGA_ACT_RECV_B;
    mega_sched_peer(L->s, r, probe, &pr, &pc);
    *q = pr;
    *qi = L->b_pos[pr][a.mb * L->s->vp + pc];
    return true;
  }
  return false;
}

/* The send after compute i of rank q goes to (p, j): the compute that
 * consumes it. False when compute i sends nothing. */
static bool consumer(const lowering *L, int q, int i, int *p, int *pj) {
  mega_action a = L->s->ranks[q].acts[i], probe = a;
  int pc;
  if (a.kind == MEGA_ACT_F && !mega_sched_is_last_stage(L->s, q, a.chunk)) {
    probe.kind = MEGA_ACT_SEND_F;
    mega_sched_peer(L->s, q, probe, p, &pc);
    *pj = L->f_pos[*p][a.mb * L->s->vp + pc];
    return *pj >= 0;
  }
  if (a.kind == MEGA_ACT_B && !mega_sched_is_first_stage(L->s, q, a.chunk)) {
    probe.kind = MEGA_ACT_SEND_B;
    mega_sched_peer(L->s, q, probe, p, &pc);
    *pj = L->b_pos[*p][a.mb * L->s->vp + pc];
    return *pj >= 0;
  }
  return false;
}

/* The plan: a unit-time timeline of the compute order (every F, B and W one
 * unit, data dependencies only), event driven: a rank runs until an input's
 * producer has not run yet, and is woken when it has. */
static mega_status timeline(lowering *L, mega_err *err) {
  const mega_schedule *s = L->s;
  int pp = L->pp;
  int *pc = calloc((size_t)pp, sizeof *pc), *ready = malloc((size_t)pp * sizeof *ready);
  int *clock = calloc((size_t)pp, sizeof *clock);
  bool *blocked = calloc((size_t)pp, sizeof *blocked);
  mega_status st = MEGA_OK;
  if (!pc || !ready || !clock || !blocked) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "no memory to lower the schedule");
    goto out;
  }
  int nready = 0;
  for (int r = 0; r < pp; r++) ready[nready++] = r;
  while (nready) {
    int r = ready[--nready];
    blocked[r] = false;
    const mega_sched_rank *q = &s->ranks[r];
    while (pc[r] < q->n) {
      int i = pc[r], src, si, t = clock[r];
      if (producer(L, r, i, &src, &si)) {
        if (si < 0) {
          st = mega_fail(err, MEGA_ERR_INTERNAL,
                         "rank %d, action %d consumes an output no rank produces", r, i);
          goto out;
        }
        if (si >= pc[src]) {
          blocked[r] = true;
          break;
        }
        if (L->start[src][si] + 1 > t) t = L->start[src][si] + 1;
      }
      L->start[r][i] = t;
      clock[r] = t + 1;
      pc[r]++;
      /* Wake the neighbours that may wait for this output. */
      for (int d = -1; d <= 1; d += 2) {
        int n = ((r + d) % pp + pp) % pp;
        if (blocked[n]) {
          blocked[n] = false;
          ready[nready++] = n;
        }
      }
    }
  }
  for (int r = 0; r < pp && !st; r++)
    if (pc[r] < s->ranks[r].n)
      st = mega_fail(err, MEGA_ERR_INTERNAL,
                     "the compute order cannot run: rank %d is stuck at action %d", r, pc[r]);
out:
  free(pc);
  free(ready);
  free(clock);
  free(blocked);
  return st;
}

/* Rank r's step g (0..n) sits before compute g and holds the send of
 * compute g-1 and the receives placed there. A rank "is at" cur[r]; every
 * op of the steps up to cur[r] is posted. */
static bool recv_posted(const lowering *L, int p, int j) { return L->cur[p] >= L->rgap[p][j]; }
static bool send_posted(const lowering *L, int q, int i) { return L->cur[q] >= i + 1; }

/* Rank r arrives at step g: count the ops whose partner is not posted yet,
 * and release the partners that waited for these. */
static void arrive(lowering *L, int r, int g, int *ready, int *nready) {
  L->cur[r] = g;
  int wait = 0, p, j, q, i;
  if (g > 0 && consumer(L, r, g - 1, &p, &j)) {
    if (!recv_posted(L, p, j)) wait++;
    else if (!(p == r && L->rgap[p][j] == g) && --L->pending[p] == 0) ready[(*nready)++] = p;
  }
  if (g < L->s->ranks[r].n && L->rgap[r][g] == g && producer(L, r, g, &q, &i)) {
    if (!send_posted(L, q, i)) wait++;
    else if (!(q == r && i + 1 == g) && --L->pending[q] == 0) ready[(*nready)++] = q;
  }
  L->pending[r] = wait;
  if (wait == 0) ready[(*nready)++] = r;
}

/* Runs the rendezvous of the current placement to its end, moving receives
 * up at each standstill (see the top of this file). */
static mega_status place_receives(lowering *L, mega_err *err) {
  const mega_schedule *s = L->s;
  int pp = L->pp, nready = 0;
  int *ready = malloc((size_t)pp * 2 * sizeof *ready);
  if (!ready) return mega_fail(err, MEGA_ERR_NOMEM, "no memory to lower the schedule");
  for (int r = 0; r < pp; r++) arrive(L, r, 0, ready, &nready);
  for (;;) {
    while (nready) {
      int r = ready[--nready];
      /* Step cur[r] is complete: run its compute, arrive at the next. */
      if (L->cur[r] >= s->ranks[r].n) {
        L->cur[r] = s->ranks[r].n + 1; /* done */
        continue;
      }
      arrive(L, r, L->cur[r] + 1, ready, &nready);
    }
    /* A standstill. The stuck rank whose step ends first on the plan waits
     * at a send (a receive there would wait for a rank further behind);
     * its receiver stands at or past the step the plan would put the
     * receive in, so moving it there never moves it earlier than the plan
     * needs. The second pass, any stuck send, is only a safety net. */
    int moved = 0, stuck = -1, first_end = INT_MAX;
    for (int q = 0; q < pp; q++) {
      int g = L->cur[q];
      if (g > s->ranks[q].n) continue;
      int end = g < s->ranks[q].n ? L->start[q][g] : INT_MAX;
      if (stuck < 0 || end < first_end) first_end = end;
      stuck = q;
    }
    for (int pass = 0; pass < 2 && stuck >= 0 && !moved; pass++)
      for (int q = 0; q < pp; q++) {
        int g = L->cur[q], p, j;
        if (g > s->ranks[q].n) continue;
        int end = g < s->ranks[q].n ? L->start[q][g] : INT_MAX;
        if (pass == 0 && end != first_end) continue;
        if (g > 0 && consumer(L, q, g - 1, &p, &j) && !recv_posted(L, p, j)) {
          L->rgap[p][j] = L->cur[p];
          moved++;
          if (--L->pending[q] == 0) ready[nready++] = q;
        }
      }
    if (stuck < 0) break;
    if (!moved) {
      free(ready);
      return mega_fail(err, MEGA_ERR_INTERNAL,
                       "the compute order cannot run: rank %d is stuck before action %d", stuck,
                       L->cur[stuck]);
    }
  }
  free(ready);
  return MEGA_OK;
}

static mega_action with_kind(mega_action a, mega_act_kind k) {
  a.kind = (uint8_t)k;
  return a;
}

static mega_status emit_rank(lowering *L, int r, mega_schedule *out, mega_err *err) {
  const mega_schedule *s = L->s;
  const mega_sched_rank *q = &s->ranks[r];
  int n = q->n;
  /* Bucket the receives by step, each bucket in consumer order (which is
   * the send order of each channel). */
  int *count = calloc((size_t)n + 2, sizeof *count);
  int *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
  mega_sched_rank *o = &out->ranks[r];
  o->acts = malloc((size_t)(n * 3 > 0 ? n * 3 : 1) * sizeof *o->acts);
  if (!count || !order || !o->acts) {
    free(count);
    free(order);
    return mega_fail(err, MEGA_ERR_NOMEM, "no memory for rank %d's actions", r);
  }
  o->cap = n * 3 > 0 ? n * 3 : 1;
  for (int j = 0; j < n; j++)
    if (L->rgap[r][j] >= 0) count[L->rgap[r][j] + 1]++;
  for (int g = 0; g <= n; g++) count[g + 1] += count[g];
  for (int j = 0; j < n; j++)
    if (L->rgap[r][j] >= 0) order[count[L->rgap[r][j]]++] = j; /* count[g]: end of bucket g */
  int next = 0;
  for (int g = 0; g <= n; g++) {
    if (g > 0) {
      mega_action a = q->acts[g - 1];
      if (a.kind == MEGA_ACT_F && !mega_sched_is_last_stage(s, r, a.chunk))
        o->acts[o->n++] = with_kind(a, MEGA_ACT_SEND_F);
      else if (a.kind == MEGA_ACT_B && !mega_sched_is_first_stage(s, r, a.chunk))
        o->acts[o->n++] = with_kind(a, MEGA_ACT_SEND_B);
    }
    for (; next < count[g]; next++) {
      mega_action a = q->acts[order[next]];
      o->acts[o->n++] = with_kind(a, a.kind == MEGA_ACT_F ? MEGA_ACT_RECV_F : MEGA_ACT_RECV_B);
    }
    if (g < n) o->acts[o->n++] = q->acts[g];
  }
  free(count);
  free(order);
  return MEGA_OK;
}

mega_status mega_sched_lower(const mega_schedule *in, mega_schedule *out, mega_err *err) {
  lowering L = {.s = in, .pp = in->pp, .stages = in->microbatches * in->vp};
  int pp = in->pp;
  mega_status st = MEGA_OK;
  L.f_pos = calloc((size_t)pp, sizeof *L.f_pos);
  L.b_pos = calloc((size_t)pp, sizeof *L.b_pos);
  L.rgap = calloc((size_t)pp, sizeof *L.rgap);
  L.start = calloc((size_t)pp, sizeof *L.start);
  L.cur = calloc((size_t)pp, sizeof *L.cur);
  L.pending = calloc((size_t)pp, sizeof *L.pending);
  if (!L.f_pos || !L.b_pos || !L.rgap || !L.start || !L.cur || !L.pending) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "no memory to lower the schedule");
    goto out;
  }
  for (int r = 0; r < pp; r++) {
    int n = in->ranks[r].n > 0 ? in->ranks[r].n : 1;
    L.f_pos[r] = malloc((size_t)L.stages * sizeof **L.f_pos);
    L.b_pos[r] = malloc((size_t)L.stages * sizeof **L.b_pos);
    L.rgap[r] = malloc((size_t)n * sizeof **L.rgap);
    L.start[r] = malloc((size_t)n * sizeof **L.start);
    if (!L.f_pos[r] || !L.b_pos[r] || !L.rgap[r] || !L.start[r]) {
      st = mega_fail(err, MEGA_ERR_NOMEM, "no memory to lower the schedule");
      goto out;
    }
    memset(L.f_pos[r], 0xff, (size_t)L.stages * sizeof **L.f_pos); /* -1 */
    memset(L.b_pos[r], 0xff, (size_t)L.stages * sizeof **L.b_pos);
    for (int i = 0; i < in->ranks[r].n; i++) {
      mega_action a = in->ranks[r].acts[i];
      if (a.kind == MEGA_ACT_F) L.f_pos[r][a.mb * in->vp + a.chunk] = i;
      if (a.kind == MEGA_ACT_B) L.b_pos[r][a.mb * in->vp + a.chunk] = i;
    }
  }
  /* Megatron's place first: each receive right before its consumer. */
  for (int r = 0; r < pp; r++)
    for (int j = 0; j < in->ranks[r].n; j++) {
      int q, i;
      L.rgap[r][j] = producer(&L, r, j, &q, &i) && i >= 0 ? j : -1;
    }
  st = timeline(&L, err);
  if (!st) st = place_receives(&L, err);
  for (int r = 0; r < pp && !st; r++) st = emit_rank(&L, r, out, err);
out:
  for (int r = 0; r < pp; r++) {
    if (L.f_pos) free(L.f_pos[r]);
    if (L.b_pos) free(L.b_pos[r]);
    if (L.rgap) free(L.rgap[r]);
    if (L.start) free(L.start[r]);
  }
  free(L.f_pos);
  free(L.b_pos);
  free(L.rgap);
  free(L.start);
  free(L.cur);
  free(L.pending);
  return st;
}
