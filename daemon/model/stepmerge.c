#include "daemon/model/stepmerge.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/util.h"

typedef struct pending {
  uint64_t iteration;
  uint32_t count;
  Mega__V1__StepReport **reports; /* [world] */
} pending;

struct mega_stepmerge {
  uint32_t world, attempt;
  size_t window;
  pending *p; /* [window] slots; iteration 0 marks a free slot */
  uint64_t *recent; /* ring of the last 2*window iterations merged or dropped */
  size_t recent_next;
  uint64_t dropped;
};

mega_stepmerge *mega_stepmerge_new(uint32_t world, uint32_t attempt, size_t window) {
  if (world == 0) return NULL;
  mega_stepmerge *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->world = world;
  m->attempt = attempt;
  m->window = window ? window : 512;
  m->p = calloc(m->window, sizeof *m->p);
  m->recent = calloc(2 * m->window, sizeof *m->recent);
  if (!m->p || !m->recent) {
    free(m->p);
    free(m->recent);
    free(m);
    return NULL;
  }
  return m;
}

static void clear(pending *p, uint32_t world) {
  if (p->reports)
    for (uint32_t r = 0; r < world; r++)
      if (p->reports[r]) protobuf_c_message_free_unpacked(&p->reports[r]->base, NULL);
  free(p->reports);
  memset(p, 0, sizeof *p);
}

void mega_stepmerge_free(mega_stepmerge *m) {
  if (!m) return;
  for (size_t i = 0; i < m->window; i++) clear(&m->p[i], m->world);
  free(m->p);
  free(m->recent);
  free(m);
}

static void remember(mega_stepmerge *m, uint64_t it) {
  m->recent[m->recent_next] = it;
  m->recent_next = (m->recent_next + 1) % (2 * m->window);
}

static bool seen(const mega_stepmerge *m, uint64_t it) {
  for (size_t i = 0; i < 2 * m->window; i++)
    if (m->recent[i] == it) return true;
  return false;
}

void mega_step_done_free(mega_step_done *d) {
  if (!d) return;
  if (d->step) protobuf_c_message_free_unpacked(&d->step->base, NULL);
  for (uint32_t r = 0; d->reports && r < d->world; r++)
    if (d->reports[r]) protobuf_c_message_free_unpacked(&d->reports[r]->base, NULL);
  free(d->reports);
  free(d);
}

size_t mega_stepmerge_pending(const mega_stepmerge *m) {
  size_t n = 0;
  for (size_t i = 0; i < m->window; i++) n += m->p[i].iteration != 0;
  return n;
}

uint64_t mega_stepmerge_dropped(const mega_stepmerge *m) { return m->dropped; }

/* The slot of iteration it, a free slot for it, or (the window being full)
 * the oldest slot, dropped. NULL when out of memory. */
static pending *slot_for(mega_stepmerge *m, uint64_t it) {
  pending *free_slot = NULL, *oldest = NULL;
  for (size_t i = 0; i < m->window; i++) {
    pending *p = &m->p[i];
    if (p->iteration == it) return p;
    if (!p->iteration) {
      if (!free_slot) free_slot = p;
    } else if (!oldest || p->iteration < oldest->iteration) {
      oldest = p;
    }
  }
  pending *p = free_slot;
  if (!p) {
    p = oldest;
    remember(m, p->iteration);
    clear(p, m->world);
    m->dropped++;
  }
  if (!(p->reports = calloc(m->world, sizeof *p->reports))) return NULL;
  p->iteration = it;
  return p;
}

static Mega__V1__StepMetrics *merge(const mega_stepmerge *m, const pending *p) {
  Mega__V1__StepMetrics s = MEGA__V1__STEP_METRICS__INIT;
  Mega__V1__RankMetrics *rm = calloc(m->world, sizeof *rm);
  Mega__V1__RankMetrics **rp = calloc(m->world, sizeof *rp);
  uint64_t *dp_tokens = calloc(m->world, sizeof *dp_tokens);
  Mega__V1__StepMetrics *out = NULL;
  if (!rm || !rp || !dp_tokens) goto done;
  bool have_loss = false, have_norm = false, have_lr = false;
  s.iteration = p->iteration;
  s.attempt = m->attempt;
  for (uint32_t r = 0; r < m->world; r++) {
    const Mega__V1__StepReport *rep = p->reports[r];
    if (rep && rep->metrics) rm[r] = *rep->metrics;
    else mega__v1__rank_metrics__init(&rm[r]);
    rm[r].base.n_unknown_fields = 0;
    rm[r].base.unknown_fields = NULL;
    rm[r].rank = r;
    rp[r] = &rm[r];
    if (!rep) continue; /* a flushed iteration's missing rank */
    if (!have_lr) {
      s.lr = rep->lr;
      have_lr = true;
    }
    if (rep->has_loss && !have_loss) {
      s.loss = rep->loss;
      have_loss = true;
    }
    if (rep->has_eval_loss && !s.has_eval_loss) {
      s.eval_loss = rep->eval_loss;
      s.has_eval_loss = true;
    }
    if (rep->has_final_eval_loss && !s.has_final_eval_loss) {
      s.final_eval_loss = rep->final_eval_loss;
      s.has_final_eval_loss = true;
    }
    if (rep->has_test_loss && !s.has_test_loss) {
      s.test_loss = rep->test_loss;
      s.has_test_loss = true;
    }
    if (rep->has_grad_norm && !have_norm) {
      s.grad_norm = rep->grad_norm;
      have_norm = true;
    }
    s.skipped |= rep->skipped;
    if (rm[r].step_time_s > s.step_time_s) s.step_time_s = rm[r].step_time_s;
    uint32_t dp = rm[r].dp_rank < m->world ? rm[r].dp_rank : 0;
    if (rep->tokens > dp_tokens[dp]) dp_tokens[dp] = rep->tokens;
  }
  /* --simulate-compute computes no loss: say so rather than report 0 */
  s.no_loss = !have_loss;
  uint64_t tokens = 0;
  for (uint32_t d = 0; d < m->world; d++) tokens += dp_tokens[d];
  s.tokens_per_s = s.step_time_s > 0 ? (double)tokens / s.step_time_s : 0;
  s.ranks = rp;
  s.n_ranks = m->world;
  s.world_size = m->world;
  s.time_unix_ms = megad_unix_ms();
  out = (Mega__V1__StepMetrics *)megad_pb_copy(&s.base);
done:
  free(rm);
  free(rp);
  free(dp_tokens);
  return out;
}

mega_status mega_stepmerge_flush(mega_stepmerge *m, uint64_t upto, mega_step_done **done,
                                 mega_err *err) {
  *done = NULL;
  pending *p = NULL;
  for (size_t i = 0; i < m->window; i++) {
    pending *q = &m->p[i];
    if (q->iteration && q->iteration <= upto && (!p || q->iteration < p->iteration)) p = q;
  }
  if (!p) return MEGA_OK;
  mega_step_done *d = calloc(1, sizeof *d);
  Mega__V1__StepMetrics *s = d ? merge(m, p) : NULL;
  if (!s) {
    free(d);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory merging steps");
  }
  d->step = s;
  d->reports = p->reports;
  d->world = m->world;
  p->reports = NULL;
  remember(m, p->iteration);
  clear(p, m->world);
  *done = d;
  return MEGA_OK;
}

mega_status mega_stepmerge_add(mega_stepmerge *m, uint32_t rank, const Mega__V1__StepReport *r,
                               mega_step_done **done, mega_err *err) {
  *done = NULL;
  if (rank >= m->world)
    return mega_fail(err, MEGA_ERR_INVALID, "a step report from rank %u, but the world is %u",
                     rank, m->world);
  if (r->iteration == 0)
    return mega_fail(err, MEGA_ERR_INVALID, "rank %u reported iteration 0 (iterations count from 1)",
                     rank);
  pending *p = NULL;
  for (size_t i = 0; i < m->window && !p; i++)
    if (m->p[i].iteration == r->iteration) p = &m->p[i];
  if ((p && p->reports[rank]) || (!p && seen(m, r->iteration)))
    return mega_fail(err, MEGA_ERR_INVALID, "rank %u reported iteration %llu twice", rank,
                     (unsigned long long)r->iteration);
  if (!p && !(p = slot_for(m, r->iteration)))
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory merging steps");
  Mega__V1__StepReport *c = (Mega__V1__StepReport *)megad_pb_copy(&r->base);
  if (!c) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory merging steps");
  p->reports[rank] = c;
  if (++p->count < m->world) return MEGA_OK;

  mega_step_done *d = calloc(1, sizeof *d);
  Mega__V1__StepMetrics *s = d ? merge(m, p) : NULL;
  if (!s) {
    free(d);
    p->reports[rank] = NULL;
    p->count--;
    protobuf_c_message_free_unpacked(&c->base, NULL);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory merging steps");
  }
  d->step = s;
  d->reports = p->reports;
  d->world = m->world;
  p->reports = NULL;
  remember(m, p->iteration);
  clear(p, m->world);
  *done = d;
  return MEGA_OK;
}
