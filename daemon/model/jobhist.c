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

mega_status mega_job_hist_push(mega_job_hist *h, const Mega__V1__WatchJobResponse *item,
                               mega_err *err) {
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
    if (h->last_step) protobuf_c_message_free_unpacked(&h->last_step->base, NULL);
    h->last_step = s;
  }
  if (item->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT && item->event) {
    if (h->nevents == h->events_cap) {
      size_t cap = h->events_cap ? 2 * h->events_cap : 16;
      Mega__V1__JobEvent **v = realloc(h->events, cap * sizeof *v);
      if (!v) {
        protobuf_c_message_free_unpacked(&c->base, NULL);
        return oom(err);
      }
      h->events = v;
      h->events_cap = cap;
    }
    Mega__V1__JobEvent *e = (void *)megad_pb_copy(&item->event->base);
    if (!e) {
      protobuf_c_message_free_unpacked(&c->base, NULL);
      return oom(err);
    }
    h->events[h->nevents++] = e;
  }
  if (h->len == h->cap) { /* full at MEGA_JOB_HISTORY: the oldest goes */
    const Mega__V1__WatchJobResponse *old = h->ring[h->head];
    if (old->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP && old->step) {
      if (!h->lost_steps++) h->lost_first = old->step->iteration;
      h->lost_last = old->step->iteration;
    }
    protobuf_c_message_free_unpacked(&h->ring[h->head]->base, NULL);
    h->ring[h->head] = c;
    h->head = (h->head + 1) % h->cap;
  } else {
    h->ring[(h->head + h->len++) % h->cap] = c;
  }
  return MEGA_OK;
}

const Mega__V1__WatchJobResponse *mega_job_hist_at(const mega_job_hist *h, size_t i) {
  return i < h->len ? h->ring[(h->head + i) % h->cap] : NULL;
}
