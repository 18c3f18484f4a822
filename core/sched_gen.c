/* Schedule generators: the order of F, B and W per rank for every kind. The
 * communication is added by one shared pass, core/sched_lower.c. */
#include "core/schedule.h"
#include "core/sched_lower.h"

#include <stdlib.h>
#include <string.h>

/* pp * vp * microbatches past this is a typo; a plan that size would take
 * gigabytes. PP=64 VP=8 M=1024 is 2^19. */
#define MAX_WORK (1 << 22)

mega_sched_kind mega_sched_default_kind(int pp, int vp) {
  if (pp <= 1) return MEGA_SCHED_NO_PIPELINING;
  return vp > 1 ? MEGA_SCHED_INTERLEAVED : MEGA_SCHED_1F1B;
}

mega_status mega_sched_check_params(mega_sched_params *p, mega_err *err) {
  const char *name = mega_sched_kind_name(p->kind);
  if ((unsigned)p->kind >= MEGA_SCHED_KINDS)
    return mega_fail(err, MEGA_ERR_INVALID, "schedule kind %d is not a known kind", (int)p->kind);
  if (p->kind == MEGA_SCHED_CUSTOM)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "a custom schedule is not generated; load its text with mega_sched_parse, "
                     "or pick a generated kind (1f1b, interleaved, zb-h1, ...)");
  if (p->pp < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--pipeline-model-parallel-size must be at least 1, not %d", p->pp);
  if (p->pp > MEGA_SCHED_MAX_PP)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--pipeline-model-parallel-size %d is more than a schedule holds (%d)",
                     p->pp, MEGA_SCHED_MAX_PP);
  if (p->vp > MEGA_SCHED_MAX_VP)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--virtual-pipeline-model-parallel-size %d is more than a schedule holds "
                     "(%d)", p->vp, MEGA_SCHED_MAX_VP);
  if (p->vp < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--virtual-pipeline-model-parallel-size must be at least 1, not %d; leave "
                     "it out for no virtual stages",
                     p->vp);
  if (p->microbatches < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "the number of microbatches must be at least 1, not %d; raise "
                     "--global-batch-size or lower --micro-batch-size",
                     p->microbatches);
  if (p->group_size < 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--microbatch-group-size-per-vp-stage must not be negative (%d); leave it "
                     "out for the default (pp)",
                     p->group_size);
  if ((long long)p->pp * p->vp * p->microbatches > MAX_WORK)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "pp*vp*microbatches = %lld is more than this planner handles (%d); lower "
                     "one of them",
                     (long long)p->pp * p->vp * p->microbatches, MAX_WORK);
  if (p->group_size == 0) p->group_size = p->pp;
  if ((unsigned)p->grad_sync >= MEGA_GRAD_SYNC_KINDS)
    return mega_fail(err, MEGA_ERR_INVALID, "gradient sync placement %d is not a known one",
                     (int)p->grad_sync);
  if (p->kind == MEGA_SCHED_FORWARD_ONLY && p->grad_sync != MEGA_GRAD_SYNC_NONE)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "a forward-only schedule has no gradients to synchronise; plan it without "
                     "gradient sync");

  if (p->kind == MEGA_SCHED_NO_PIPELINING && p->pp != 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "no-pipelining runs the whole model on one stage, but pp=%d; use 1f1b (or "
                     "another pipelined schedule), or set --pipeline-model-parallel-size 1",
                     p->pp);
  if (p->vp > 1 && p->pp == 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--virtual-pipeline-model-parallel-size %d needs "
                     "--pipeline-model-parallel-size > 1; drop the virtual stages or raise pp",
                     p->vp);
  if (p->kind == MEGA_SCHED_INTERLEAVED && p->vp == 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "the interleaved schedule needs --virtual-pipeline-model-parallel-size > 1; "
                     "set it, or use 1f1b");
  if (p->vp > 1 && p->kind != MEGA_SCHED_INTERLEAVED && p->kind != MEGA_SCHED_FORWARD_ONLY)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s has no virtual stages, but vp=%d; use the interleaved schedule, or "
                     "drop --virtual-pipeline-model-parallel-size",
                     name, p->vp);
  if (p->vp > 1) {
    /* Megatron's interleaved schedule (forward-only too) walks microbatches
     * in groups of N per virtual stage, pp <= N <= M. */
    if (p->microbatches < p->pp)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "the interleaved schedule needs at least pp=%d microbatches, but there "
                       "are %d; raise --global-batch-size (or lower --micro-batch-size or pp)",
                       p->pp, p->microbatches);
    if (p->group_size < p->pp || p->group_size > p->microbatches)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "--microbatch-group-size-per-vp-stage %d must be between pp=%d and the "
                       "number of microbatches (%d); set it in that range or leave it out "
                       "(default pp)",
                       p->group_size, p->pp, p->microbatches);
    /* Megatron's second check. Without it the order is not even
     * dependency-free: PP=4 VP=3 M=5 N=4 has a cycle through rank 0's
     * F4.2 and rank 3's B0.1. */
    int last = p->microbatches % p->group_size;
    if (last > 0 && last < p->pp)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "with %d microbatches in groups of %d (--microbatch-group-size-per-vp-stage) "
                       "the last group has %d, fewer than pp=%d, and the interleaved order cannot "
                       "run; make the number of microbatches a multiple of %d or leave a last "
                       "group of at least %d",
                       p->microbatches, p->group_size, last, p->pp, p->group_size, p->pp);
  }
  return MEGA_OK;
}

int mega_sched_num_warmup(const mega_sched_params *p, int rank) {
  int pp = p->pp, vp = p->vp < 1 ? 1 : p->vp;
  int n = p->group_size > 0 ? p->group_size : pp;
  long long total = (long long)p->microbatches * vp, w;
  mega_sched_kind kind = p->kind;
  if (kind == MEGA_SCHED_CUSTOM) kind = mega_sched_default_kind(pp, vp);
  switch (kind) {
  case MEGA_SCHED_FORWARD_ONLY:
  case MEGA_SCHED_GPIPE: w = total; break;
  case MEGA_SCHED_NO_PIPELINING: w = 0; break;
  case MEGA_SCHED_INTERLEAVED: w = (long long)(pp - rank - 1) * 2 + (long long)(vp - 1) * n; break;
  default: w = pp - rank - 1; break;
  }
  if (w < 0) w = 0;
  if (w > total) w = total;
  /* Seed 003: when every microbatch would be warmup, one opens the steady
   * phase instead. */
  if (total > 0 && w == total) w = total - 1;
  return (int)w;
}

void mega_sched_table(int microbatches, int vp, int group_size, int (*out)[2]) {
  int n = group_size >= 1 ? group_size : microbatches, k = 0;
  for (int lo = 0; lo < microbatches; lo += n) {
    /* The last group takes every microbatch left. */
    int hi = lo + n >= microbatches ? microbatches : lo + n;
    for (int c = 0; c < vp; c++)
      for (int mb = lo; mb < hi; mb++) {
        out[k][0] = mb;
        out[k][1] = c;
        k++;
      }
    if (hi == microbatches) break;
  }
}

/* ---- compute order ----------------------------------------------------- */

static mega_status push(mega_schedule *s, int rank, mega_act_kind kind, int mb, int chunk,
                        mega_err *err) {
  mega_action a = {.kind = (uint8_t)kind, .chunk = (uint16_t)chunk, .mb = mb};
  return mega_sched_push(s, rank, a, err);
}

static mega_status order_1f1b(mega_schedule *s, int rank, mega_err *err) {
  int m = s->microbatches, w = s->pp - rank - 1;
  if (w > m) w = m;
  mega_status st = MEGA_OK;
  for (int i = 0; i < w && !st; i++) st = push(s, rank, MEGA_ACT_F, i, 0, err);
  for (int i = 0; i < m - w && !st; i++) {
    st = push(s, rank, MEGA_ACT_F, w + i, 0, err);
    if (!st) st = push(s, rank, MEGA_ACT_B, i, 0, err);
  }
  for (int i = m - w; i < m && !st; i++) st = push(s, rank, MEGA_ACT_B, i, 0, err);
  return st;
}

static mega_status order_interleaved(mega_schedule *s, const mega_sched_params *p, int rank,
                                     const int (*table)[2], bool forward_only, mega_err *err) {
  int total = s->microbatches * s->vp, vp = s->vp;
  mega_status st = MEGA_OK;
  if (forward_only) {
    for (int k = 0; k < total && !st; k++)
      st = push(s, rank, MEGA_ACT_F, table[k][0], table[k][1], err);
    return st;
  }
  int w = mega_sched_num_warmup(p, rank), rem = total - w;
  for (int k = 0; k < w && !st; k++) st = push(s, rank, MEGA_ACT_F, table[k][0], table[k][1], err);
  for (int i = 0; i < rem && !st; i++) {
    int k = w + i;
    st = push(s, rank, MEGA_ACT_F, table[k][0], table[k][1], err);
    if (!st) st = push(s, rank, MEGA_ACT_B, table[i][0], vp - 1 - table[i][1], err);
  }
  for (int k = rem; k < total && !st; k++)
    st = push(s, rank, MEGA_ACT_B, table[k][0], vp - 1 - table[k][1], err);
  return st;
}

/* ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023). The F and B
 * order is 1F1B's; each W is placed by list-scheduling the whole pipeline
 * with T_f = T_b = T_w = 1 and free communication: a rank runs its next F or
 * B as soon as its input is there, and only otherwise (or when another F
 * would hold more than min(pp, M) activations until their W, the paper's
 * bound, see schedule.h) runs its oldest pending W. So W's are delayed
 * through the steady phase as far as the bound allows (rank r by r), and
 * fill the waits of the cooldown. */
static mega_status order_zb_h1(mega_schedule *s, mega_err *err) {
  int pp = s->pp, m = s->microbatches;
  mega_schedule fb; /* 1F1B's F/B order per rank */
  mega_status st = mega_sched_init(&fb, MEGA_SCHED_1F1B, pp, 1, m, pp, err);
  for (int r = 0; r < pp && !st; r++) st = order_1f1b(&fb, r, err);
  int *f_done = NULL, *b_done = NULL, *pos = NULL, *w_next = NULL, *inflight = NULL;
  if (!st) {
    /* Step at which F / B of (rank, mb) finished; INT32_MAX-ish until then. */
    f_done = malloc((size_t)pp * m * sizeof *f_done);
    b_done = malloc((size_t)pp * m * sizeof *b_done);
    pos = calloc((size_t)pp * 3, sizeof *pos);
    if (!f_done || !b_done || !pos)
      st = mega_fail(err, MEGA_ERR_NOMEM, "no memory to plan zb-h1 for pp=%d, M=%d", pp, m);
  }
  if (!st) {
    w_next = pos + pp;       /* next microbatch whose W is due (W's run in B order) */
    inflight = pos + 2 * pp; /* F's whose W has not run */
    for (long long i = 0; i < (long long)pp * m; i++) f_done[i] = b_done[i] = -1;
    int cap = pp < m ? pp : m;
    long long left = 3LL * pp * m;
    /* Every step some rank runs something (the rank holding the oldest
     * unfinished work is never blocked), so this bound is never reached. */
    long long max_steps = 3LL * pp * m + 4LL * pp + 8;
    for (int t = 0; left > 0 && !st; t++) {
      if (t > max_steps) {
        st = mega_fail(err, MEGA_ERR_INTERNAL, "zb-h1 planning did not finish for pp=%d, M=%d",
                       pp, m);
        break;
      }
      for (int r = 0; r < pp && !st; r++) {
        const mega_sched_rank *q = &fb.ranks[r];
        bool ran = false;
        if (pos[r] < q->n) {
          mega_action a = q->acts[pos[r]];
          bool ready;
          if (a.kind == MEGA_ACT_F)
            ready = inflight[r] < cap &&
                    (r == 0 || (f_done[(r - 1) * m + a.mb] >= 0 && f_done[(r - 1) * m + a.mb] < t));
          else
            ready = r == pp - 1 ||
                    (b_done[(r + 1) * m + a.mb] >= 0 && b_done[(r + 1) * m + a.mb] < t);
          if (ready) {
            st = mega_sched_push(s, r, a, err);
            if (a.kind == MEGA_ACT_F) {
              f_done[r * m + a.mb] = t;
              inflight[r]++;
            } else {
              b_done[r * m + a.mb] = t;
            }
            pos[r]++;
            ran = true;
          }
        }
        if (!ran && !st && w_next[r] < m && b_done[r * m + w_next[r]] >= 0 &&
            b_done[r * m + w_next[r]] < t) {
          st = push(s, r, MEGA_ACT_W, w_next[r]++, 0, err);
          inflight[r]--;
          ran = true;
        }
        if (ran) left--;
      }
    }
  }
  free(f_done);
  free(b_done);
  free(pos);
  mega_sched_free(&fb);
  return st;
}

static mega_status compute_order(const mega_sched_params *p, mega_schedule *s, mega_err *err) {
  int m = p->microbatches;
  mega_status st = MEGA_OK;
  switch (p->kind) {
  case MEGA_SCHED_NO_PIPELINING:
    for (int i = 0; i < m && !st; i++) {
      st = push(s, 0, MEGA_ACT_F, i, 0, err);
      if (!st) st = push(s, 0, MEGA_ACT_B, i, 0, err);
    }
    return st;
  case MEGA_SCHED_GPIPE:
    for (int r = 0; r < p->pp && !st; r++) {
      for (int i = 0; i < m && !st; i++) st = push(s, r, MEGA_ACT_F, i, 0, err);
      for (int i = 0; i < m && !st; i++) st = push(s, r, MEGA_ACT_B, i, 0, err);
    }
    return st;
  case MEGA_SCHED_1F1B:
    for (int r = 0; r < p->pp && !st; r++) st = order_1f1b(s, r, err);
    return st;
  case MEGA_SCHED_ZB_H1: return order_zb_h1(s, err);
  case MEGA_SCHED_FORWARD_ONLY:
  case MEGA_SCHED_INTERLEAVED: {
    if (p->vp == 1) { /* forward-only in 1F1B's order */
      for (int r = 0; r < p->pp && !st; r++)
        for (int i = 0; i < m && !st; i++) st = push(s, r, MEGA_ACT_F, i, 0, err);
      return st;
    }
    int (*table)[2] = malloc((size_t)m * p->vp * sizeof *table);
    if (!table) return mega_fail(err, MEGA_ERR_NOMEM, "no memory for the schedule table");
    mega_sched_table(m, p->vp, p->group_size, table);
    for (int r = 0; r < p->pp && !st; r++)
      st = order_interleaved(s, p, r, (const int(*)[2])table,
                             p->kind == MEGA_SCHED_FORWARD_ONLY, err);
    free(table);
    return st;
  }
  default:
    return mega_fail(err, MEGA_ERR_INVALID, "schedule kind %s is not generated",
                     mega_sched_kind_name(p->kind));
  }
}

/* ---- gradient sync (seed 003) ----------------------------------------- */

/* Inserts rank r's GS and GW actions into its lowered list. A GS goes right
 * after a weight-gradient action (before the P2P step that follows it, so
 * no step is split) or at the end; the GWs close the list. */
static mega_status place_grad_sync(mega_schedule *s, int r, mega_grad_sync mode, mega_err *err) {
  mega_sched_rank *q = &s->ranks[r];
  int vp = s->vp, nw = 0;
  mega_act_kind wk = mega_sched_grad_kind(s, r);
  int *last = malloc((size_t)vp * sizeof *last), *at = malloc((size_t)vp * sizeof *at);
  int *order = malloc((size_t)vp * sizeof *order);
  mega_action *old = q->acts;
  int n = q->n;
  if (!last || !at || !order) {
    free(last);
    free(at);
    free(order);
    return mega_fail(err, MEGA_ERR_NOMEM, "no memory to place gradient syncs");
  }
  for (int c = 0; c < vp; c++) last[c] = -1;
  for (int i = 0; i < n; i++)
    if (old[i].kind == wk) last[old[i].chunk] = nw++;
  /* Launch order: by the chunk's last backward. */
  for (int c = 0; c < vp; c++) order[c] = c;
  for (int a = 1; a < vp; a++)
    for (int b = a; b > 0 && last[order[b]] < last[order[b - 1]]; b--) {
      int t = order[b];
      order[b] = order[b - 1];
      order[b - 1] = t;
    }
  for (int c = 0; c < vp; c++) {
    switch (mode) {
    case MEGA_GRAD_SYNC_LAST_BACKWARD: at[c] = last[c]; break;
    case MEGA_GRAD_SYNC_ALIGNED: at[c] = last[c] + r < nw ? last[c] + r : -1; break;
    default: at[c] = -1; break; /* at the end */
    }
  }
  q->acts = NULL;
  q->n = q->cap = 0;
  mega_status st = MEGA_OK;
  int w = 0;
  for (int i = 0; i < n && !st; i++) {
    st = mega_sched_push(s, r, old[i], err);
    if (old[i].kind != wk) continue;
    for (int k = 0; k < vp && !st; k++)
      if (at[order[k]] == w)
        st = push(s, r, MEGA_ACT_GRAD_SYNC, 0, order[k], err);
    w++;
  }
  for (int k = 0; k < vp && !st; k++)
    if (at[order[k]] < 0) st = push(s, r, MEGA_ACT_GRAD_SYNC, 0, order[k], err);
  for (int k = 0; k < vp && !st; k++) st = push(s, r, MEGA_ACT_GRAD_WAIT, 0, order[k], err);
  free(old);
  free(last);
  free(at);
  free(order);
  return st;
}

mega_status mega_sched_generate(const mega_sched_params *params, mega_schedule *out,
                                mega_err *err) {
  memset(out, 0, sizeof *out);
  mega_sched_params p = *params;
  mega_status st = mega_sched_check_params(&p, err);
  if (st) return st;
  mega_schedule compute;
  st = mega_sched_init(&compute, p.kind, p.pp, p.vp, p.microbatches, p.group_size, err);
  if (st) return st;
  st = compute_order(&p, &compute, err);
  if (!st) st = mega_sched_init(out, p.kind, p.pp, p.vp, p.microbatches, p.group_size, err);
  if (!st) st = mega_sched_lower(&compute, out, err);
  mega_sched_free(&compute);
  if (p.grad_sync != MEGA_GRAD_SYNC_NONE)
    for (int r = 0; r < p.pp && !st; r++) st = place_grad_sync(out, r, p.grad_sync, err);
  if (st) mega_sched_free(out);
  return st;
}
