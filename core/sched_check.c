/* The validator, phase counts and the in-flight memory bound. Everything
 * here is linear in the number of actions. */
#include "core/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_comm(uint8_t k) { return mega_act_is_p2p(k); }

static bool rank_has(const mega_sched_rank *q, mega_act_kind kind) {
  for (int i = 0; i < q->n; i++)
    if (q->acts[i].kind == kind) return true;
  return false;
}

mega_phases mega_sched_phases(const mega_schedule *s, int rank) {
  mega_phases ph = {0, 0, 0};
  if (rank < 0 || rank >= s->pp) return ph;
  const mega_sched_rank *q = &s->ranks[rank];
  int nf = 0, nb = 0, before = -1;
  for (int i = 0; i < q->n; i++) {
    if (q->acts[i].kind == MEGA_ACT_F) nf++;
    if (q->acts[i].kind == MEGA_ACT_B) {
      if (before < 0) before = nf;
      nb++;
    }
  }
  if (nf == 0) return ph;
  if (before < 0) before = nf; /* no backward: every forward comes "before" it */
  ph.warmup = before > 0 ? before - 1 : 0;
  ph.steady = nf - ph.warmup;
  ph.cooldown = nb > ph.steady ? nb - ph.steady : 0;
  return ph;
}

int mega_sched_peak_inflight(const mega_schedule *s, int rank) {
  if (rank < 0 || rank >= s->pp) return 0;
  const mega_sched_rank *q = &s->ranks[rank];
  bool has_b = rank_has(q, MEGA_ACT_B), has_w = rank_has(q, MEGA_ACT_W);
  int cur = 0, peak = 0;
  for (int i = 0; i < q->n; i++) {
    uint8_t k = q->acts[i].kind;
    if (k == MEGA_ACT_F) {
      if (++cur > peak) peak = cur;
      if (!has_b) cur--; /* forward-only: freed when the F ends */
    } else if ((k == MEGA_ACT_B && !has_w) || k == MEGA_ACT_W) {
      cur--;
    }
  }
  return peak;
}

int mega_sched_inflight_bound(const mega_schedule *s, int rank) {
  int m = s->microbatches, total = m * s->vp;
  switch (s->kind) {
  case MEGA_SCHED_1F1B: return s->pp - rank < m ? s->pp - rank : m;
  /* ZB-H1 delays W's until every rank holds as many as 1F1B's first rank
   * (see schedule.h). */
  case MEGA_SCHED_ZB_H1: return s->pp < m ? s->pp : m;
  case MEGA_SCHED_GPIPE: return m;
  case MEGA_SCHED_INTERLEAVED: {
    mega_sched_params p = {s->kind, s->pp, s->vp, m, s->group_size};
    int w = mega_sched_num_warmup(&p, rank) + 1;
    return w < total ? w : total;
  }
  case MEGA_SCHED_NO_PIPELINING:
  case MEGA_SCHED_FORWARD_ONLY: return 1;
  default: return total;
  }
}

/* ---- per-rank checks ---------------------------------------------------- */

enum {
  ST_RF = 1 << 0,
  ST_F = 1 << 1,
  ST_SF = 1 << 2,
  ST_RB = 1 << 3,
  ST_B = 1 << 4,
  ST_SB = 1 << 5,
  ST_W = 1 << 6,
};

#define FAIL_AT(fmt, ...)                                                                     \
  mega_fail(err, MEGA_ERR_INVALID, "rank %d, action %d (%s): " fmt, r, i,                    \
            mega_action_format(a, tok), __VA_ARGS__)

/* GS and GW: none on the rank, or one of each per chunk, GS after the
 * chunk's last weight-gradient action and GW after GS. wg counts each
 * chunk's weight-gradient actions so far. */
static mega_status check_sync(const mega_schedule *s, int r, int i, mega_action a, int *wg,
                              uint8_t *gs, uint8_t *gw, mega_err *err) {
  char tok[24];
  int m = s->microbatches;
  if (a.kind != MEGA_ACT_GRAD_SYNC && a.kind != MEGA_ACT_GRAD_WAIT) return MEGA_OK;
  if (a.mb != 0)
    return FAIL_AT("gradient-sync actions are per chunk and name microbatch 0 (%s0.%d)",
                   mega_act_kind_name((mega_act_kind)a.kind), a.chunk);
  if (a.kind == MEGA_ACT_GRAD_SYNC) {
    if (gs[a.chunk]) return FAIL_AT("chunk %d's gradient reduction is launched twice", a.chunk);
    if (wg[a.chunk] < m)
      return FAIL_AT("launches chunk %d's gradient reduction before its last backward (%d of %d "
                     "done); a GS goes after the chunk's last %s",
                     a.chunk, wg[a.chunk], m,
                     mega_act_kind_name(mega_sched_grad_kind(s, r)));
    gs[a.chunk] = 1;
  } else {
    if (gw[a.chunk]) return FAIL_AT("waits for chunk %d's gradient reduction twice", a.chunk);
    if (!gs[a.chunk])
      return FAIL_AT("waits for chunk %d's gradient reduction before its GS launched it", a.chunk);
    gw[a.chunk] = 1;
  }
  return MEGA_OK;
}

static mega_status check_rank(const mega_schedule *s, int r, uint8_t *state, mega_err *err) {
  const mega_sched_rank *q = &s->ranks[r];
  int m = s->microbatches, vp = s->vp;
  bool fwd_only = s->kind == MEGA_SCHED_FORWARD_ONLY;
  bool has_w = rank_has(q, MEGA_ACT_W);
  bool any_sync = rank_has(q, MEGA_ACT_GRAD_SYNC) || rank_has(q, MEGA_ACT_GRAD_WAIT);
  mega_act_kind wk = has_w ? MEGA_ACT_W : MEGA_ACT_B;
  char tok[24], tok2[24];
  int *wg = calloc((size_t)vp, sizeof *wg);
  uint8_t *gs = calloc((size_t)vp, 1), *gw = calloc((size_t)vp, 1);
  mega_status st = MEGA_OK;
  if (!wg || !gs || !gw) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "no memory to validate rank %d", r);
    goto out;
  }
  memset(state, 0, (size_t)m * vp);
  for (int i = 0; i < q->n && !st; i++) {
    mega_action a0 = q->acts[i];
    if (a0.kind < MEGA_ACT_KINDS && a0.chunk < vp && a0.kind == wk && a0.mb >= 0 && a0.mb < m)
      wg[a0.chunk]++;
    if (a0.kind < MEGA_ACT_KINDS && a0.chunk < vp && !fwd_only)
      st = check_sync(s, r, i, a0, wg, gs, gw, err);
  }
  if (!st && any_sync && !fwd_only)
    for (int c = 0; c < vp && !st; c++)
      if (!gs[c] || !gw[c])
        st = mega_fail(err, MEGA_ERR_INVALID,
                       "rank %d has gradient-sync actions but no %s for chunk %d; a rank has "
                       "one GS and one GW per chunk, or none",
                       r, !gs[c] ? "GS" : "GW", c);
out:
  free(wg);
  free(gs);
  free(gw);
  if (st) return st;
  for (int i = 0; i < q->n; i++) {
    mega_action a = q->acts[i], want = a;
    if (a.kind >= MEGA_ACT_KINDS)
      return mega_fail(err, MEGA_ERR_INVALID, "rank %d, action %d: unknown action kind %d", r, i,
                       a.kind);
    if (a.mb < 0 || a.mb >= m || a.chunk >= vp)
      return FAIL_AT("out of range for microbatches=%d vp=%d", m, vp);
    bool first = mega_sched_is_first_stage(s, r, a.chunk);
    bool last = mega_sched_is_last_stage(s, r, a.chunk);
    uint8_t *seen = &state[a.mb * vp + a.chunk];
    if (fwd_only && a.kind != MEGA_ACT_F && a.kind != MEGA_ACT_SEND_F && a.kind != MEGA_ACT_RECV_F)
      return FAIL_AT("a forward-only schedule has no %s actions",
                     "backward, weight-gradient or gradient-sync");
    switch (a.kind) {
    case MEGA_ACT_RECV_F:
      if (first) return FAIL_AT("%s", "stray receive: the first virtual stage has no previous stage");
      if (*seen & ST_RF) return FAIL_AT("%s", "the input of this forward is received twice");
      if (*seen & ST_F) return FAIL_AT("%s", "stray receive after its forward ran");
      *seen |= ST_RF;
      break;
    case MEGA_ACT_F:
      if (*seen & ST_F) return FAIL_AT("%s", "forwarded twice");
      want.kind = MEGA_ACT_RECV_F;
      if (!first && !(*seen & ST_RF))
        return FAIL_AT("not preceded by %s, the receive of its input", mega_action_format(want, tok2));
      *seen |= ST_F;
      break;
    case MEGA_ACT_SEND_F:
      if (last) return FAIL_AT("%s", "stray send: the last virtual stage has no next stage");
      if (*seen & ST_SF) return FAIL_AT("%s", "sent twice");
      want.kind = MEGA_ACT_F;
      if (!(*seen & ST_F)) return FAIL_AT("sends before %s produced it", mega_action_format(want, tok2));
      *seen |= ST_SF;
      break;
    case MEGA_ACT_RECV_B:
      if (last) return FAIL_AT("%s", "stray receive: the last virtual stage has no next stage");
      if (*seen & ST_RB) return FAIL_AT("%s", "the output gradient is received twice");
      if (*seen & ST_B) return FAIL_AT("%s", "stray receive after its backward ran");
      *seen |= ST_RB;
      break;
    case MEGA_ACT_B:
      if (*seen & ST_B) return FAIL_AT("%s", "backwarded twice");
      want.kind = MEGA_ACT_F;
      if (!(*seen & ST_F)) return FAIL_AT("runs before its forward %s", mega_action_format(want, tok2));
      want.kind = MEGA_ACT_RECV_B;
      if (!last && !(*seen & ST_RB))
        return FAIL_AT("not preceded by %s, the receive of its output gradient",
                       mega_action_format(want, tok2));
      *seen |= ST_B;
      break;
    case MEGA_ACT_SEND_B:
      if (first) return FAIL_AT("%s", "stray send: the first virtual stage has no previous stage");
      if (*seen & ST_SB) return FAIL_AT("%s", "sent twice");
      want.kind = MEGA_ACT_B;
      if (!(*seen & ST_B)) return FAIL_AT("sends before %s produced it", mega_action_format(want, tok2));
      *seen |= ST_SB;
      break;
    case MEGA_ACT_GRAD_SYNC:
    case MEGA_ACT_GRAD_WAIT: break; /* checked by check_sync */
    case MEGA_ACT_W:
      if (*seen & ST_W) return FAIL_AT("%s", "weight gradient computed twice");
      want.kind = MEGA_ACT_B;
      if (!(*seen & ST_B)) return FAIL_AT("runs before its backward %s", mega_action_format(want, tok2));
      *seen |= ST_W;
      break;
    }
  }
  for (int mb = 0; mb < m; mb++)
    for (int c = 0; c < vp; c++) {
      uint8_t seen = state[mb * vp + c];
      mega_action a = {.kind = MEGA_ACT_F, .chunk = (uint16_t)c, .mb = mb};
      bool first = mega_sched_is_first_stage(s, r, c), last = mega_sched_is_last_stage(s, r, c);
      if (!(seen & ST_F))
        return mega_fail(err, MEGA_ERR_INVALID, "rank %d never runs %s", r, mega_action_format(a, tok));
      if (!last && !(seen & ST_SF)) {
        a.kind = MEGA_ACT_SEND_F;
        return mega_fail(err, MEGA_ERR_INVALID, "rank %d never sends its forward output (%s)", r,
                         mega_action_format(a, tok));
      }
      if (fwd_only) continue;
      a.kind = MEGA_ACT_B;
      if (!(seen & ST_B))
        return mega_fail(err, MEGA_ERR_INVALID, "rank %d never runs %s", r, mega_action_format(a, tok));
      if (!first && !(seen & ST_SB)) {
        a.kind = MEGA_ACT_SEND_B;
        return mega_fail(err, MEGA_ERR_INVALID, "rank %d never sends its input gradient (%s)", r,
                         mega_action_format(a, tok));
      }
      a.kind = MEGA_ACT_W;
      if (has_w && !(seen & ST_W))
        return mega_fail(err, MEGA_ERR_INVALID,
                         "rank %d has W actions but not %s; a rank has a W for every B or for none",
                         r, mega_action_format(a, tok));
    }
  return MEGA_OK;
}

/* ---- pairing and deadlock ----------------------------------------------- */

/* A channel is (direction, sender): its receiver is implied. Messages on a
 * channel pair up in FIFO order. */
static int channel_of(const mega_schedule *s, int rank, mega_action a) {
  int pr, pc;
  switch (a.kind) {
  case MEGA_ACT_SEND_F: return rank;
  case MEGA_ACT_SEND_B: return s->pp + rank;
  case MEGA_ACT_RECV_F: mega_sched_peer(s, rank, a, &pr, &pc); return pr;
  case MEGA_ACT_RECV_B: mega_sched_peer(s, rank, a, &pr, &pc); return s->pp + pr;
  default: return -1;
  }
}

typedef struct checker {
  const mega_schedule *s;
  long long *base;    /* [pp+1] global index of each rank's first action */
  long long *partner; /* [total] global index of the matching operation, or -1 */
} checker;

static const char *ordinal_suffix(long long n) {
  if (n % 100 >= 11 && n % 100 <= 13) return "th";
  switch (n % 10) {
  case 1: return "st";
  case 2: return "nd";
  case 3: return "rd";
  default: return "th";
  }
}

static mega_status pair_messages(checker *c, mega_err *err) {
  const mega_schedule *s = c->s;
  int nch = 2 * s->pp;
  long long total = c->base[s->pp];
  /* CSR lists of sends and receives per channel, in program order. */
  long long *cnt = calloc((size_t)nch * 4 + 2, sizeof *cnt);
  long long *ops = malloc((size_t)(total > 0 ? total : 1) * sizeof *ops);
  mega_status st = MEGA_OK;
  char t1[24], t2[24];
  if (!cnt || !ops) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "no memory to pair %lld actions", total);
    goto out;
  }
  long long *nsend = cnt, *nrecv = cnt + nch, *off = cnt + 2 * nch; /* off: [2*nch+1] */
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      mega_action a = s->ranks[r].acts[i];
      int ch = channel_of(s, r, a);
      if (ch < 0) continue;
      if (a.kind == MEGA_ACT_SEND_F || a.kind == MEGA_ACT_SEND_B) nsend[ch]++;
      else nrecv[ch]++;
    }
  /* Sends of channel ch at [off[ch], ...), receives at [off[nch+ch], ...). */
  long long acc = 0;
  for (int i = 0; i < 2 * nch; i++) {
    off[i] = acc;
    acc += cnt[i];
  }
  off[2 * nch] = acc;
  for (int i = 0; i < 2 * nch; i++) cnt[i] = 0; /* reuse as fill cursors */
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      mega_action a = s->ranks[r].acts[i];
      int ch = channel_of(s, r, a);
      if (ch < 0) continue;
      int slot = (a.kind == MEGA_ACT_SEND_F || a.kind == MEGA_ACT_SEND_B) ? ch : nch + ch;
      ops[off[slot] + cnt[slot]++] = c->base[r] + i;
    }
  for (long long g = 0; g < total; g++) c->partner[g] = -1;
  for (int ch = 0; ch < nch; ch++) {
    bool fwd = ch < s->pp;
    int sender = fwd ? ch : ch - s->pp;
    int receiver = fwd ? (sender + 1) % s->pp : (sender + s->pp - 1) % s->pp;
    long long ns = cnt[ch], nr = cnt[nch + ch];
    long long *snd = ops + off[ch], *rcv = ops + off[nch + ch];
    long long k = 0;
    for (; k < ns && k < nr; k++) {
      int rs = sender, rr = receiver;
      int is = (int)(snd[k] - c->base[rs]), ir = (int)(rcv[k] - c->base[rr]);
      mega_action sa = s->ranks[rs].acts[is], ra = s->ranks[rr].acts[ir];
      int peer_rank, peer_chunk;
      mega_sched_peer(s, rs, sa, &peer_rank, &peer_chunk);
      if (sa.mb != ra.mb || peer_chunk != ra.chunk) {
        st = mega_fail(err, MEGA_ERR_INVALID,
                       "rank %d, action %d (%s) pairs with rank %d, action %d (%s): the %lld%s "
                       "%s message from rank %d to rank %d must carry the same microbatch and "
                       "stage at both ends (messages pair in the order they are sent)",
                       rs, is, mega_action_format(sa, t1), rr, ir, mega_action_format(ra, t2),
                       k + 1, ordinal_suffix(k + 1), fwd ? "forward" : "backward", rs, rr);
        goto out;
      }
      c->partner[snd[k]] = rcv[k];
      c->partner[rcv[k]] = snd[k];
    }
    if (ns != nr) {
      bool extra_send = ns > nr;
      int rr = extra_send ? sender : receiver;
      long long g = extra_send ? snd[k] : rcv[k];
      int i = (int)(g - c->base[rr]);
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "rank %d, action %d (%s) has no partner: rank %d sends %lld %s messages to "
                     "rank %d, which receives %lld",
                     rr, i, mega_action_format(s->ranks[rr].acts[i], t1), sender, ns,
                     fwd ? "forward" : "backward", receiver, nr);
      goto out;
    }
  }
out:
  free(cnt);
  free(ops);
  return st;
}

/* NCCL's rendezvous: a P2P step (a maximal run of communication actions)
 * posts all its operations at once and completes when every one is matched
 * by a posted operation of its peer. Compute actions never wait. */
static mega_status find_deadlock(checker *c, mega_err *err) {
  const mega_schedule *s = c->s;
  int pp = s->pp;
  long long total = c->base[pp];
  uint8_t *posted = calloc((size_t)(total > 0 ? total : 1), 1);
  int *pc = calloc((size_t)pp, sizeof *pc), *step_end = calloc((size_t)pp, sizeof *step_end);
  int *pending = calloc((size_t)pp, sizeof *pending), *ready = malloc((size_t)pp * sizeof *ready);
  mega_status st = MEGA_OK;
  if (!posted || !pc || !step_end || !pending || !ready) {
    st = mega_fail(err, MEGA_ERR_NOMEM, "no memory to check %lld actions for deadlock", total);
    goto out;
  }
  int nready = 0;
  for (int r = 0; r < pp; r++) {
    ready[nready++] = r;
    step_end[r] = -1; /* not blocked */
  }
  while (nready) {
    int r = ready[--nready];
    const mega_sched_rank *q = &s->ranks[r];
    if (step_end[r] >= 0) { /* woken: its step is complete */
      pc[r] = step_end[r];
      step_end[r] = -1;
    }
    while (pc[r] < q->n) {
      if (!is_comm(q->acts[pc[r]].kind)) {
        pc[r]++;
        continue;
      }
      int b = pc[r], e = b;
      while (e < q->n && is_comm(q->acts[e].kind)) e++;
      long long gb = c->base[r] + b, ge = c->base[r] + e;
      for (long long g = gb; g < ge; g++) posted[g] = 1;
      int wait = 0;
      for (long long g = gb; g < ge; g++) {
        long long p = c->partner[g];
        if (!posted[p]) {
          wait++;
        } else if (p < gb || p >= ge) {
          /* Its peer is blocked on a step that waited for this op. */
          int pr = 0, lo = 0, hi = pp - 1;
          while (lo <= hi) { /* rank holding global index p */
            int mid = (lo + hi) / 2;
            if (c->base[mid] <= p) {
              pr = mid;
              lo = mid + 1;
            } else {
              hi = mid - 1;
            }
          }
          if (--pending[pr] == 0) ready[nready++] = pr;
        }
      }
      if (wait == 0) {
        pc[r] = e;
        continue;
      }
      pending[r] = wait;
      step_end[r] = e;
      break;
    }
  }
  char msg[MEGA_ERR_MSG_MAX];
  int len = snprintf(msg, sizeof msg, "deadlock:"), stuck = 0;
  for (int r = 0; r < pp; r++) {
    if (pc[r] >= s->ranks[r].n) continue;
    /* The first operation of the step whose peer never posts its match. */
    int i = pc[r];
    while (i < step_end[r] && posted[c->partner[c->base[r] + i]]) i++;
    if (i >= step_end[r]) i = pc[r];
    char tok[24];
    if (len < (int)sizeof msg - 48)
      len += snprintf(msg + len, sizeof msg - (size_t)len, "%s rank %d waits at %s (action %d)",
                      stuck ? "," : "", r, mega_action_format(s->ranks[r].acts[i], tok), i);
    else if (len < (int)sizeof msg - 8)
      len += snprintf(msg + len, sizeof msg - (size_t)len, ", ...");
    stuck++;
  }
  if (stuck) st = mega_fail(err, MEGA_ERR_INVALID, "%s", msg);
out:
  free(posted);
  free(pc);
  free(step_end);
  free(pending);
  free(ready);
  return st;
}

static mega_status check_memory(const mega_schedule *s, int r, mega_err *err) {
  int bound = mega_sched_inflight_bound(s, r);
  if (mega_sched_peak_inflight(s, r) <= bound) return MEGA_OK;
  const mega_sched_rank *q = &s->ranks[r];
  bool has_b = rank_has(q, MEGA_ACT_B), has_w = rank_has(q, MEGA_ACT_W);
  int cur = 0;
  char tok[24];
  for (int i = 0; i < q->n; i++) {
    uint8_t k = q->acts[i].kind;
    if (k == MEGA_ACT_F && ++cur > bound)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "rank %d, action %d (%s): %d activations in flight, more than the bound "
                       "of %d for %s",
                       r, i, mega_action_format(q->acts[i], tok), cur, bound,
                       mega_sched_kind_name(s->kind));
    if ((k == MEGA_ACT_F && !has_b) || (k == MEGA_ACT_B && !has_w) || k == MEGA_ACT_W) cur--;
  }
  return MEGA_OK;
}

mega_status mega_sched_validate(const mega_schedule *s, mega_err *err) {
  if (!s || s->pp < 1 || s->vp < 1 || s->microbatches < 1 || !s->ranks)
    return mega_fail(err, MEGA_ERR_INVALID, "the schedule is empty or not initialised");
  long long per_rank = (long long)s->microbatches * s->vp;
  uint8_t *state = malloc((size_t)per_rank);
  checker c = {s, NULL, NULL};
  mega_status st = MEGA_OK;
  if (!state) return mega_fail(err, MEGA_ERR_NOMEM, "no memory to validate the schedule");
  for (int r = 0; r < s->pp && !st; r++) st = check_rank(s, r, state, err);
  free(state);
  if (st) return st;

  c.base = malloc((size_t)(s->pp + 1) * sizeof *c.base);
  if (!c.base) return mega_fail(err, MEGA_ERR_NOMEM, "no memory to validate the schedule");
  c.base[0] = 0;
  for (int r = 0; r < s->pp; r++) c.base[r + 1] = c.base[r] + s->ranks[r].n;
  c.partner = malloc((size_t)(c.base[s->pp] > 0 ? c.base[s->pp] : 1) * sizeof *c.partner);
  if (!c.partner) st = mega_fail(err, MEGA_ERR_NOMEM, "no memory to validate the schedule");
  if (!st) st = pair_messages(&c, err);
  if (!st) st = find_deadlock(&c, err);
  free(c.base);
  free(c.partner);
  for (int r = 0; r < s->pp && !st; r++) st = check_memory(s, r, err);
  return st;
}
