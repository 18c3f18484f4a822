#include "daemon/model/jobhist.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/model/util.h"

static mega_status oom(mega_err *err) { return mega_fail(err, MEGA_ERR_NOMEM, "out of memory"); }

void mega_job_hist_free(mega_job_hist *h) {
  for (size_t i = 0; i < h->nevents; i++)
    protobuf_c_message_free_unpacked(&h->events[i]->base, NULL);
  free(h->events);
  for (size_t i = 0; i < h->len; i++)
    protobuf_c_message_free_unpacked(&h->ring[(h->head + i) % h->cap]->base, NULL);
  free(h->ring);
  if (h->last_step) protobuf_c_message_free_unpacked(&h->last_step->base, NULL);
  mega_stepring_free(&h->curve);
  memset(h, 0, sizeof *h);
}

/* Whether step a comes after step b: a later attempt, or the same one's later iteration. */
static bool step_after(const Mega__V1__StepMetrics *a, const Mega__V1__StepMetrics *b) {
  return a->attempt > b->attempt || (a->attempt == b->attempt && a->iteration > b->iteration);
}

static bool end_event(Mega__V1__JobEventKind k) {
  return k == MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED ||
         k == MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_FAILED ||
         k == MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_CANCELLED ||
         k == MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_STOPPED;
}

/* Whether a kept item belongs after step s in the job's order: a later
 * step, a later attempt's event, an end (event or final state) of s's
 * attempt or a later one. */
static bool item_after(const Mega__V1__WatchJobResponse *it, const Mega__V1__StepMetrics *s) {
  switch (it->item_case) {
  case MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP: return it->step && step_after(it->step, s);
  case MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT:
    return it->event && (it->event->attempt > s->attempt ||
                         (it->event->attempt == s->attempt && end_event(it->event->kind)));
  case MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE:
    return it->final_state && it->final_state->attempt >= s->attempt;
  default: return false;
  }
}

/* Where item goes among the len kept: the end, except for a step that
 * comes late (sent again after a takeover, coord_late.c), which goes
 * before the items that belong after it. */
static size_t place_of(const mega_job_hist *h, const Mega__V1__WatchJobResponse *item) {
  size_t at = h->len;
  if (item->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP || !item->step) return at;
  while (at > 0 && item_after(mega_job_hist_at(h, at - 1), item->step)) at--;
  return at;
}

static void count_lost(mega_job_hist *h, const Mega__V1__WatchJobResponse *old) {
  if (old->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP || !old->step) {
    h->lost_other++;
    return;
  }
  if (!h->lost_steps++ || old->step->iteration < h->lost_first)
    h->lost_first = old->step->iteration;
  if (h->lost_steps == 1 || old->step->iteration > h->lost_last)
    h->lost_last = old->step->iteration;
}

static bool is_step(const Mega__V1__WatchJobResponse *it) {
  return it->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP && it->step;
}

/* The logical place of the oldest step kept, or len when none is. */
static size_t first_step(const mega_job_hist *h) {
  size_t i = 0;
  while (i < h->len && !is_step(mega_job_hist_at(h, i))) i++;
  return i;
}

/* Frees the item at logical place at (0..len-1): the ones before it move
 * up one, so the ring's head moves on. */
static void ring_remove(mega_job_hist *h, size_t at) {
  protobuf_c_message_free_unpacked(&h->ring[(h->head + at) % h->cap]->base, NULL);
  for (size_t i = at; i > 0; i--)
    h->ring[(h->head + i) % h->cap] = h->ring[(h->head + i - 1) % h->cap];
  h->head = (h->head + 1) % h->cap;
  h->len--;
}

/* Puts c at logical place at (0..len) of the ring, which has room. */
static void ring_insert(mega_job_hist *h, Mega__V1__WatchJobResponse *c, size_t at) {
  for (size_t i = h->len; i > at; i--)
    h->ring[(h->head + i) % h->cap] = h->ring[(h->head + i - 1) % h->cap];
  h->ring[(h->head + at) % h->cap] = c;
  h->len++;
}

/* Lets s's per-rank entries go; world_size keeps their number. */
static void drop_ranks(Mega__V1__StepMetrics *s) {
  if (!s->world_size) s->world_size = (uint32_t)s->n_ranks; /* a record of an older megad */
  for (size_t r = 0; r < s->n_ranks; r++) protobuf_c_message_free_unpacked(&s->ranks[r]->base, NULL);
  free(s->ranks);
  s->ranks = NULL;
  s->n_ranks = 0;
}

/* After a step was put at logical place at: the ranks of the step it
 * pushed past the newest MEGA_JOB_HISTORY_RANKS go, and its own when it
 * came late, older than those (the steps between had theirs let go). */
static void drop_old_ranks(mega_job_hist *h, size_t at) {
  size_t steps = 0;
  for (size_t i = h->len; i-- > 0;) {
    Mega__V1__WatchJobResponse *it = h->ring[(h->head + i) % h->cap];
    if (!is_step(it) || ++steps <= MEGA_JOB_HISTORY_RANKS) continue;
    drop_ranks(it->step);
    if (i <= at) return;
  }
}

/* Keeps e (taken) among GetJob's events: when they are full, the oldest
 * of the newest goes, so the first ones stay. */
static mega_status keep_event(mega_job_hist *h, Mega__V1__JobEvent *e, mega_err *err) {
  if (h->nevents == MEGA_JOB_EVENTS_FIRST + MEGA_JOB_EVENTS_LAST) {
    Mega__V1__JobEvent **mid = h->events + MEGA_JOB_EVENTS_FIRST;
    protobuf_c_message_free_unpacked(&mid[0]->base, NULL);
    memmove(mid, mid + 1, (MEGA_JOB_EVENTS_LAST - 1) * sizeof *mid);
    h->nevents--;
  } else if (h->nevents == h->events_cap) {
    size_t cap = h->events_cap ? 2 * h->events_cap : 16;
    if (cap > MEGA_JOB_EVENTS_FIRST + MEGA_JOB_EVENTS_LAST)
      cap = MEGA_JOB_EVENTS_FIRST + MEGA_JOB_EVENTS_LAST;
    Mega__V1__JobEvent **v = realloc(h->events, cap * sizeof *v);
    if (!v) {
      protobuf_c_message_free_unpacked(&e->base, NULL);
      return oom(err);
    }
    h->events = v;
    h->events_cap = cap;
  }
  h->events[h->nevents++] = e;
  return MEGA_OK;
}

mega_status mega_job_hist_push(mega_job_hist *h, const Mega__V1__WatchJobResponse *item,
                               mega_err *err) {
  bool event = item->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT && item->event;
  if (event && item->event->number && item->event->number <= h->events_total)
    return MEGA_OK; /* had already: delivered twice */
  if (h->len == h->cap && h->cap < MEGA_JOB_HISTORY) {
    size_t cap = h->cap ? 2 * h->cap : 16;
    if (cap > MEGA_JOB_HISTORY) cap = MEGA_JOB_HISTORY;
    Mega__V1__WatchJobResponse **v = malloc(cap * sizeof *v);
    if (!v) return oom(err);
    for (size_t i = 0; i < h->len; i++) v[i] = h->ring[(h->head + i) % h->cap];
    free(h->ring);
    h->ring = v;
    h->head = 0;
    h->cap = cap;
  }
  Mega__V1__WatchJobResponse *c = (void *)megad_pb_copy(&item->base);
  if (!c) return oom(err);
  if (item->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP && item->step) {
    Mega__V1__StepMetrics *s = (void *)megad_pb_copy(&item->step->base);
    if (!s || mega_stepring_push(&h->curve, item->step, NULL) != MEGA_OK) {
      if (s) protobuf_c_message_free_unpacked(&s->base, NULL);
      protobuf_c_message_free_unpacked(&c->base, NULL);
      return oom(err);
    }
    if (h->last_step && step_after(h->last_step, s)) { /* a late one: not the last */
      protobuf_c_message_free_unpacked(&s->base, NULL);
    } else {
      if (h->last_step) protobuf_c_message_free_unpacked(&h->last_step->base, NULL);
      h->last_step = s;
    }
  }
  if (event) {
    /* a jump in the numbers: events this history never had (the ones a
     * compacted journal or etcd's keys let go), which a replay must count
     * as it counts those the ring let go */
    if (item->event->number > h->events_total + 1)
      h->lost_other += item->event->number - h->events_total - 1;
    /* numbered even when out of memory below: the next one's number is new */
    h->events_total = item->event->number ? item->event->number : h->events_total + 1;
    c->event->number = h->events_total;
    Mega__V1__JobEvent *e = (void *)megad_pb_copy(&c->event->base);
    if (!e || keep_event(h, e, err) != MEGA_OK) {
      protobuf_c_message_free_unpacked(&c->base, NULL);
      return e ? MEGA_ERR_NOMEM : oom(err);
    }
  }
  size_t at = place_of(h, item);
  if (h->len == h->cap) { /* full at MEGA_JOB_HISTORY: the oldest step goes */
    /* never an event for a step: a long job's steps would push out its
     * submitted, placed and restarting lines. Only an event goes for an
     * event, and only when nothing but events (and ends) is kept */
    size_t victim = first_step(h);
    bool steps_kept = victim < h->len;
    if (is_step(c) && (!steps_kept || at <= victim)) { /* this step is the oldest */
      count_lost(h, c);
      protobuf_c_message_free_unpacked(&c->base, NULL);
      return MEGA_OK;
    }
    if (!steps_kept) victim = 0; /* an event, and only events kept: the oldest */
    count_lost(h, mega_job_hist_at(h, victim));
    ring_remove(h, victim);
    if (victim < at) at--;
  }
  ring_insert(h, c, at);
  if (is_step(c)) drop_old_ranks(h, at);
  return MEGA_OK;
}

const Mega__V1__JobEvent *mega_job_hist_event_victim(const mega_job_hist *h) {
  return h->nevents == MEGA_JOB_EVENTS_FIRST + MEGA_JOB_EVENTS_LAST
             ? h->events[MEGA_JOB_EVENTS_FIRST]
             : NULL;
}

uint64_t mega_job_hist_events_left_out(const mega_job_hist *h) {
  return h->events_total > h->nevents ? h->events_total - h->nevents : 0;
}

const Mega__V1__WatchJobResponse *mega_job_hist_at(const mega_job_hist *h, size_t i) {
  return i < h->len ? h->ring[(h->head + i) % h->cap] : NULL;
}

size_t mega_job_hist_gap_at(const mega_job_hist *h) {
  if (h->lost_other || !h->lost_steps) return 0;
  size_t i = first_step(h);
  return i < h->len ? i : 0;
}
