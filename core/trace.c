/* Chrome trace writer: Trace Event Format JSON through jansson.
 *
 * Layout of a simulated schedule, per rank track: compute actions as
 * "compute" spans; every stretch of [0, makespan] without compute as a
 * "bubble" span, so the bubble spans of a track add up to the simulator's
 * idle time; and each receive that waited as a "p2p" span nested inside the
 * bubble it falls in (it tells why the rank was idle). Nested spans on one
 * track must be properly contained, so a bubble is written before its
 * receive waits and the waits are clamped to it. */
#include "core/trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define TRACE_PID 1

struct mega_trace {
  json_t *doc;    /* {"traceEvents": [...], "displayTimeUnit": "ms"} */
  json_t *events; /* borrowed from doc */
};

mega_trace *mega_trace_new(const char *process_name) {
  mega_trace *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->doc = json_object();
  t->events = json_array();
  if (!t->doc || !t->events || json_object_set(t->doc, "traceEvents", t->events) ||
      json_object_set_new(t->doc, "displayTimeUnit", json_string("ms"))) {
    json_decref(t->events);
    json_decref(t->doc);
    free(t);
    return NULL;
  }
  json_decref(t->events); /* doc holds it now */
  json_t *args = json_object();
  json_object_set_new(args, "name", json_string(process_name ? process_name : "mega"));
  json_t *ev = json_object();
  json_object_set_new(ev, "name", json_string("process_name"));
  json_object_set_new(ev, "ph", json_string("M"));
  json_object_set_new(ev, "pid", json_integer(TRACE_PID));
  json_object_set_new(ev, "tid", json_integer(0));
  json_object_set_new(ev, "args", args);
  json_array_append_new(t->events, ev);
  return t;
}

void mega_trace_free(mega_trace *t) {
  if (!t) return;
  json_decref(t->doc);
  free(t);
}

static void add_meta(mega_trace *t, int tid, const char *what, const char *key, json_t *value) {
  json_t *ev = json_object(), *args = json_object();
  json_object_set_new(args, key, value);
  json_object_set_new(ev, "name", json_string(what));
  json_object_set_new(ev, "ph", json_string("M"));
  json_object_set_new(ev, "pid", json_integer(TRACE_PID));
  json_object_set_new(ev, "tid", json_integer(tid));
  json_object_set_new(ev, "args", args);
  json_array_append_new(t->events, ev);
}

bool mega_trace_cat_is_comm(const char *cat) {
  return cat && (!strcmp(cat, "reduce") || !strcmp(cat, "reduce_queue"));
}

void mega_trace_track(mega_trace *t, int tid, const char *name) {
  if (!t) return;
  add_meta(t, tid, "thread_name", "name", json_string(name ? name : ""));
  /* Perfetto orders tracks by this rather than by first appearance. */
  add_meta(t, tid, "thread_sort_index", "sort_index", json_integer(tid));
}

/* Takes ownership of args (may be NULL). */
static void add_span(mega_trace *t, int tid, const char *name, const char *cat, double start_us,
                     double dur_us, json_t *args) {
  json_t *ev = json_object();
  json_object_set_new(ev, "name", json_string(name ? name : ""));
  json_object_set_new(ev, "cat", json_string(cat ? cat : ""));
  json_object_set_new(ev, "ph", json_string("X"));
  json_object_set_new(ev, "ts", json_real(start_us));
  json_object_set_new(ev, "dur", json_real(dur_us > 0 ? dur_us : 0));
  json_object_set_new(ev, "pid", json_integer(TRACE_PID));
  json_object_set_new(ev, "tid", json_integer(tid));
  if (args) json_object_set_new(ev, "args", args);
  json_array_append_new(t->events, ev);
}

void mega_trace_span(mega_trace *t, int tid, const char *name, const char *cat, double start_us,
                     double dur_us) {
  if (t) add_span(t, tid, name, cat, start_us, dur_us, NULL);
}

static bool is_compute(uint8_t kind) {
  return kind == MEGA_ACT_F || kind == MEGA_ACT_B || kind == MEGA_ACT_W;
}

static bool is_recv(uint8_t kind) {
  return kind == MEGA_ACT_RECV_F || kind == MEGA_ACT_RECV_B;
}

/* Writes the bubble [from, to] and the receive waits (action indices
 * waits[0..n)) that fall in it. */
static void flush_gap(mega_trace *t, const mega_schedule *s, const mega_sim_rank *sr, int rank,
                      double from, double to, double eps, const int *waits, int n, double unit) {
  if (to - from > eps) {
    json_t *args = json_object();
    json_object_set_new(args, "idle", json_real(to - from));
    add_span(t, rank, "bubble", "bubble", from * unit, (to - from) * unit, args);
  }
  for (int k = 0; k < n; k++) {
    mega_action a = s->ranks[rank].acts[waits[k]];
    double st = fmax(sr->spans[waits[k]].start, from);
    double en = fmin(sr->spans[waits[k]].end, to);
    if (en - st <= eps) continue;
    int peer = -1, peer_chunk = -1;
    mega_sched_peer(s, rank, a, &peer, &peer_chunk);
    char name[32];
    mega_action_format(a, name);
    json_t *args = json_object();
    json_object_set_new(args, "microbatch", json_integer(a.mb));
    json_object_set_new(args, "chunk", json_integer(a.chunk));
    json_object_set_new(args, "from_rank", json_integer(peer));
    json_object_set_new(args, "waited", json_real(en - st));
    add_span(t, rank, name, "p2p", st * unit, (en - st) * unit, args);
  }
}

void mega_trace_add_sim(mega_trace *t, const mega_schedule *s, const mega_sim *sim,
                        double time_unit_us) {
  if (!t || !s || !sim || !sim->ranks) return;
  double eps = 1e-9 * fmax(1.0, sim->makespan);
  int pp = s->pp < sim->pp ? s->pp : sim->pp;
  for (int r = 0; r < pp; r++) {
    char track[32];
    snprintf(track, sizeof track, "rank %d", r);
    mega_trace_track(t, r, track);
    const mega_sched_rank *sr = &s->ranks[r];
    const mega_sim_rank *mr = &sim->ranks[r];
    int *waits = malloc(sizeof *waits * (size_t)(sr->n > 0 ? sr->n : 1));
    if (!waits) return;
    int nwaits = 0;
    double cursor = 0; /* end of the last compute span */
    for (int i = 0; i < sr->n; i++) {
      mega_action a = sr->acts[i];
      mega_span sp = mr->spans[i];
      if (is_recv(a.kind)) {
        if (sp.end - sp.start > eps) waits[nwaits++] = i;
        continue;
      }
      if (!is_compute(a.kind)) continue;
      flush_gap(t, s, mr, r, cursor, sp.start, eps, waits, nwaits, time_unit_us);
      nwaits = 0;
      char name[32];
      mega_action_format(a, name);
      json_t *args = json_object();
      json_object_set_new(args, "microbatch", json_integer(a.mb));
      json_object_set_new(args, "chunk", json_integer(a.chunk));
      json_object_set_new(args, "stage", json_integer((json_int_t)a.chunk * s->pp + r));
      add_span(t, r, name, "compute", sp.start * time_unit_us, (sp.end - sp.start) * time_unit_us,
               args);
      if (sp.end > cursor) cursor = sp.end;
    }
    flush_gap(t, s, mr, r, cursor, sim->makespan, eps, waits, nwaits, time_unit_us);
    free(waits);
  }
  /* Each rank's data-parallel communicator: its bucket reductions. */
  for (int r = 0; r < pp; r++) {
    const mega_sim_rank *mr = &sim->ranks[r];
    if (!mr->nreduce) continue;
    char track[48];
    snprintf(track, sizeof track, "rank %d grad sync", r);
    mega_trace_track(t, pp + r, track);
    for (int k = 0; k < mr->nreduce; k++) {
      json_t *args = json_object();
      json_object_set_new(args, "bucket", json_integer(k));
      add_span(t, pp + r, "reduce", "grad_sync", mr->reduce[k].start * time_unit_us,
               (mr->reduce[k].end - mr->reduce[k].start) * time_unit_us, args);
    }
  }
}

char *mega_trace_dump(const mega_trace *t) {
  if (!t) return NULL;
  /* 12 significant digits: sub-microsecond steps stay exact for traces of
   * days, and 0.1 does not print as 0.10000000000000001. */
  return json_dumps(t->doc, JSON_COMPACT | JSON_REAL_PRECISION(12));
}
