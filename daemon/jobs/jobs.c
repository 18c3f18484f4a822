/* The jobs layer: the table, its journal, events, steps and the end of a
 * job. Watchers are in watch.c. */
#include "daemon/jobs/jobs.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/version.h"
#include "daemon/jobs/jobs_internal.h"
#include "daemon/model/util.h"

/* ---- the journal ---- */

static int replay_one(void *ctx, const uint8_t *rec, size_t len) {
  megad_jobs *js = ctx;
  mega_err e = {0};
  if (mega_jobs_apply(&js->t, rec, len, &e) != MEGA_OK)
    megad_warn(js->b, "journal: skipping a record: %s", e.msg);
  return 0;
}

typedef struct recs {
  void **v;
  size_t *lens;
  size_t n, cap;
  bool ok;
} recs;

/* Adds the record st made into *buf (its status first, then the buffer:
 * never both in one call, whose arguments C evaluates in any order). */
static void recs_add(recs *r, mega_status st, uint8_t *buf, size_t len) {
  if (st != MEGA_OK) {
    r->ok = false;
    return;
  }
  if (r->n == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 64;
    void **v = realloc(r->v, cap * sizeof *v);
    size_t *l = v ? realloc(r->lens, cap * sizeof *l) : NULL;
    if (v) r->v = v;
    if (!v || !l) {
      free(buf);
      r->ok = false;
      return;
    }
    r->lens = l;
    r->cap = cap;
  }
  r->v[r->n] = buf;
  r->lens[r->n++] = len;
}

/* The journal holds every change; once it is mostly history, it is
 * rewritten as one record per job, its events and its last step. replayed:
 * the records the file holds now. Behind (records it could not take), it is
 * rewritten whatever its size; false if that failed (e says why). */
static bool compact(megad_jobs *js, size_t replayed, mega_err *e) {
  recs r = {.ok = true};
  for (size_t i = 0; r.ok && i < js->t.n; i++) {
    mega_job *j = js->t.v[i];
    uint8_t *buf = NULL;
    size_t len = 0;
    mega_status st = mega_jrec_job(j, &buf, &len, NULL);
    recs_add(&r, st, buf, len);
    for (size_t k = 0; r.ok && k < j->hist.nevents; k++) {
      st = mega_jrec_event(j->id, j->hist.events[k], &buf, &len, NULL);
      recs_add(&r, st, buf, len);
    }
    if (r.ok && j->hist.last_step) {
      st = mega_jrec_step(j->id, j->hist.last_step, &buf, &len, NULL);
      recs_add(&r, st, buf, len);
    }
  }
  /* ids of forgotten jobs stay used: one ForgetRecord of the newest keeps
   * the next id where it was */
  unsigned long long top = 0, n;
  for (size_t i = 0; i < js->t.n; i++)
    if (sscanf(js->t.v[i]->id, "j-%llu", &n) == 1 && n > top) top = n;
  if (r.ok && js->t.next_id > top + 1) {
    char id[64];
    snprintf(id, sizeof id, "j-%llu-forgotten", (unsigned long long)js->t.next_id - 1);
    uint8_t *buf = NULL;
    size_t len = 0;
    mega_status st = mega_jrec_forget(id, &buf, &len, NULL);
    recs_add(&r, st, buf, len);
  }
  js->journal_recs = replayed;
  if (r.ok) js->journal_live = r.n;
  bool ok = r.ok || (mega_fail(e, MEGA_ERR_NOMEM, "out of memory rewriting the journal"), false);
  if (r.ok && (js->journal_behind || 2 * r.n + 64 < replayed)) {
    ok = mega_journal_rewrite(js->journal, (const void *const *)r.v, r.lens, r.n, e) == MEGA_OK;
    if (ok && js->journal_behind)
      megad_log(js->b, "journal: rewritten from the jobs in memory (%zu records), with the %zu "
                "changes it could not take before", r.n, js->journal_behind);
    else if (ok)
      megad_log(js->b, "journal: compacted %zu records into %zu", replayed, r.n);
    if (ok) {
      js->journal_recs = r.n;
      js->journal_behind = 0;
    }
  }
  for (size_t i = 0; i < r.n; i++) free(r.v[i]);
  free(r.v);
  free(r.lens);
  return ok;
}

/* Says loudly what replay cut or skipped, and which jobs lost their record
 * with it (their later events name them). */
static void report_damage(megad_jobs *js, const char *path, const mega_journal_report *r) {
  char lost[MEGA_JOBS_ORPHANS * 66 + 64] = "";
  size_t off = 0;
  const mega_jobs *t = &js->t;
  for (size_t i = 0; i < t->norphans && off < sizeof lost; i++)
    off += (size_t)snprintf(lost + off, sizeof lost - off, "%s%s", i ? ", " : "", t->orphans[i]);
  if (t->norphans == MEGA_JOBS_ORPHANS && off < sizeof lost)
    snprintf(lost + off, sizeof lost - off, ", ...");
  if (!r->damaged_regions) {
    megad_warn(js->b, "journal %s: cut a torn last record (%zu bytes; the file as found is kept "
                      "in %s)%s%s%s", path, r->torn_bytes, r->copy,
               t->norphans ? "; records name jobs that have no job record: " : "", lost,
               t->norphans ? " (lost)" : "");
    return;
  }
  megad_warn(js->b, "JOURNAL DAMAGED: %s had %zu damaged region%s (%zu bytes, the first at byte "
                    "%zu)%s; the %zu good records were replayed and the journal rewritten from "
                    "them; the file as found is kept in %s. %s%s%s",
             path, r->damaged_regions, r->damaged_regions == 1 ? "" : "s", r->damaged_bytes,
             r->first_damage, r->torn_bytes ? " and a torn last record" : "", r->records, r->copy,
             t->norphans ? "Jobs lost with it (later records name them): " : "A job whose "
             "records were all in the damage is lost without a trace: compare with that copy",
             lost, t->norphans ? "" : "");
}

mega_status megad_jobs_open(megad_jobs *js, megad_base *b, mega_err *err) {
  memset(js, 0, sizeof *js);
  js->b = b;
  mega_jobs_init(&js->t);
  char *path = NULL;
  if (asprintf(&path, "%s/journal", b->state_dir) < 0)
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  mega_status s = mega_journal_open(path, &js->journal, err);
  mega_journal_report r = {0};
  if (s == MEGA_OK) s = mega_journal_replay(js->journal, replay_one, js, &r, err);
  if (s == MEGA_OK && (r.damaged_regions || r.torn_bytes)) report_damage(js, path, &r);
  free(path);
  if (s != MEGA_OK) return s;
  if (js->t.n)
    megad_log(b, "journal: %zu job%s replayed from %zu records", js->t.n, js->t.n == 1 ? "" : "s",
              r.records);
  if (js->t.unknown_records)
    megad_warn(b, "journal: skipped %zu record%s of a kind this megad (mega %s) does not "
               "know, which another build of megad wrote; the journal keeps them only until "
               "it is next compacted", js->t.unknown_records,
               js->t.unknown_records == 1 ? "" : "s", mega_version());
  mega_err e = {0};
  if (!compact(js, r.records, &e)) megad_warn(b, "journal: %s", e.msg);
  return MEGA_OK;
}

void megad_jobs_tidy(megad_jobs *js) {
  mega_err e = {0};
  /* behind, a failed try is quiet: the first record lost said so */
  if (js->journal && (js->journal_behind || js->journal_recs > 2 * js->journal_live + 64) &&
      !compact(js, js->journal_recs, &e) && !js->journal_behind)
    megad_warn(js->b, "journal: %s", e.msg);
}

void megad_jobs_close(megad_jobs *js) {
  mega_err e = {0};
  if (js->journal && js->journal_behind && !compact(js, js->journal_recs, &e))
    megad_warn(js->b, "journal: %zu changes of jobs never reached it, and a rewrite failed too "
               "(%s): a megad started on this state dir finds the jobs as they were before "
               "them", js->journal_behind, e.msg);
  megad_jobs_etcd_close(js);
  mega_journal_close(js->journal);
  js->journal = NULL;
  mega_jobs_free(&js->t);
}

mega_job *megad_jobs_find(megad_jobs *js, const char *id) {
  return mega_jobs_table_find(&js->t, id);
}

/* At most this many jobs are forgotten in one pass: one journal flush for
 * all of them, and the loop is never held for long. */
#define FORGET_BATCH 4096

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

typedef struct job_list {
  mega_job **v; /* sorted by address once filled */
  size_t n;
} job_list;

static bool not_listed(const mega_job *j, void *arg) {
  const job_list *gone = arg;
  return !bsearch(&j, gone->v, gone->n, sizeof *gone->v, cmp_ptr);
}

size_t megad_jobs_forget(megad_jobs *js, bool (*gone)(const mega_job *j, void *arg), void *arg) {
  recs r = {.ok = true};
  job_list jobs = {calloc(FORGET_BATCH, sizeof(mega_job *)), 0};
  r.ok = jobs.v != NULL;
  for (size_t i = 0; i < js->t.n && jobs.n < FORGET_BATCH && r.ok; i++) {
    mega_job *j = js->t.v[i];
    if (!mega_job_state_final(j->state) || !gone(j, arg)) continue;
    uint8_t *buf = NULL;
    size_t len = 0;
    mega_status st = mega_jrec_forget(j->id, &buf, &len, NULL);
    recs_add(&r, st, buf, len);
    if (r.ok) jobs.v[jobs.n++] = j;
  }
  size_t n = 0;
  mega_err e = {0};
  if (!r.ok) {
    megad_warn(js->b, "out of memory forgetting ended jobs; keeping them for now");
  } else if (r.n && js->journal && mega_journal_append_many(js->journal, (const void *const *)r.v, r.lens, r.n,
                                             &e) != MEGA_OK) {
    megad_warn(js->b, "journal: %s; keeping the ended jobs for now", e.msg);
  } else if (r.n) {
    if (js->journal) js->journal_recs += r.n;
    for (size_t i = 0; i < jobs.n; i++) {
      if (js->etcd) megad_jobs_etcd_forget(js, jobs.v[i]->id);
      char *dir = NULL; /* worker logs and traces go with the job */
      if (asprintf(&dir, "%s/jobs/%s", js->b->state_dir, jobs.v[i]->id) >= 0)
        megad_rmtree(dir);
      free(dir);
    }
    qsort(jobs.v, jobs.n, sizeof *jobs.v, cmp_ptr);
    mega_jobs_filter(&js->t, not_listed, &jobs);
    n = jobs.n;
  }
  for (size_t i = 0; i < r.n; i++) free(r.v[i]);
  free(r.v);
  free(r.lens);
  free(jobs.v);
  return n;
}

/* One record of j: to the journal, or to etcd (claim: j's first, which
 * makes this node its coordinator). buf is taken. A record the journal
 * cannot take is logged here and leaves it behind the table, but for a
 * claim: that refuses the job (megad_jobs_add), so the table has nothing
 * the file lacks and no rewrite is due. */
static mega_status put_rec(megad_jobs *js, const mega_job *j, const char *suffix, uint8_t *buf,
                           size_t len, bool claim, mega_err *err) {
  mega_status s = MEGA_OK;
  if (js->journal) {
    s = mega_journal_append(js->journal, buf, len, err);
    if (s == MEGA_OK) js->journal_recs++;
    else if (claim) megad_warn(js->b, "journal: %s; job %s refused", err->msg, j->id);
    else if (js->journal_behind++) megad_warn(js->b, "journal: %s", err->msg);
    else /* the first since the table was written whole says what follows */
      megad_warn(js->b, "journal: %s; megad goes on with its jobs in memory and rewrites the "
                 "journal from them once it can (free space in %s)", err->msg, js->b->state_dir);
    free(buf);
  } else if (js->etcd) {
    megad_jobs_etcd_put(js, j, suffix, buf, len, claim);
  } else {
    free(buf);
  }
  return s;
}

static mega_status save(megad_jobs *js, const mega_job *j, bool claim, mega_err *err) {
  uint8_t *buf;
  size_t len;
  mega_err e = {0};
  mega_status s = mega_jrec_job(j, &buf, &len, &e);
  if (s != MEGA_OK) megad_warn(js->b, "journal: %s", e.msg);
  else s = put_rec(js, j, "0", buf, len, claim, &e);
  if (s != MEGA_OK && err) *err = e;
  return s;
}

mega_status megad_jobs_save(megad_jobs *js, const mega_job *j, mega_err *err) {
  return save(js, j, false, err);
}

mega_status megad_jobs_add(megad_jobs *js, mega_job *j, mega_err *err) {
  mega_status s;
  if (js->etcd) { /* in the table first: the claim is sent from there */
    uint8_t *buf = NULL;
    size_t len = 0;
    s = mega_jrec_job(j, &buf, &len, err);
    if (s == MEGA_OK && len > MEGAD_ETCD_RECORD_MAX)
      s = mega_fail(err, MEGA_ERR_INVALID,
                    "the job's record is %zu bytes; megad keeps jobs in etcd at most %d bytes "
                    "each (etcd's requests are small): give shorter or fewer flags", len,
                    MEGAD_ETCD_RECORD_MAX);
    if (s == MEGA_OK) s = mega_jobs_add(&js->t, j, err);
    if (s == MEGA_OK) megad_jobs_etcd_put(js, j, "0", buf, len, true);
    else free(buf);
  } else {
    s = save(js, j, true, err);
    if (s == MEGA_OK) s = mega_jobs_add(&js->t, j, err);
  }
  if (s == MEGA_OK) js->stats.submitted++;
  return s;
}

mega_status megad_jobs_adopt(megad_jobs *js, mega_job *j, mega_err *err) {
  mega_status s = mega_jobs_add(&js->t, j, err);
  return s == MEGA_OK ? megad_jobs_save(js, j, err) : s;
}

/* ---- history ---- */

/* To every watcher; one that fell behind is dropped, and the job's history
 * says so. */
static void broadcast(megad_jobs *js, mega_job *j, const Mega__V1__WatchJobResponse *item) {
  megad_watch_drops d;
  megad_watch_broadcast(&js->watchers, j, item, &d);
  size_t shown = d.n < 8 ? d.n : 8;
  for (size_t i = 0; i < shown; i++)
    megad_job_event(js, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO, NULL, -1,
                    "a watcher at %s fell more than %d messages behind and was dropped",
                    d.peers[i], MEGAD_WATCH_QUEUE_MAX);
  if (d.n > shown)
    megad_job_event(js, j, MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO, NULL, -1,
                    "%zu more watchers fell behind and were dropped", d.n - shown);
  if (js->on_item) js->on_item(js->on_item_arg, j, item);
}

void megad_jobs_listen(megad_jobs *js, megad_jobs_item_fn fn, void *arg) {
  js->on_item = fn;
  js->on_item_arg = arg;
}

void megad_job_event(megad_jobs *js, mega_job *j, Mega__V1__JobEventKind kind,
                     const char *node_id, int rank, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.time_unix_ms = megad_unix_ms();
  ev.kind = kind;
  ev.message = msg;
  ev.node_id = (char *)(node_id ? node_id : "");
  ev.has_rank = rank >= 0;
  ev.rank = rank >= 0 ? (uint32_t)rank : 0;
  ev.attempt = j->attempt;
  ev.number = j->hist.events_total + 1;
  if ((unsigned)kind < sizeof js->stats.events / sizeof js->stats.events[0])
    js->stats.events[kind]++;
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
  item.event = &ev;
  mega_err e = {0};
  /* the event this one pushes out of the history goes from etcd too, so a
   * job's keys stay as bounded as its memory (the journal drops it when
   * compacted) */
  const Mega__V1__JobEvent *victim = mega_job_hist_event_victim(&j->hist);
  uint64_t gone = victim ? victim->number : 0;
  if (mega_job_hist_push(&j->hist, &item, &e) != MEGA_OK)
    megad_warn(js->b, "job %s: %s", j->id, e.msg);
  uint8_t *buf;
  size_t len;
  char suffix[32];
  snprintf(suffix, sizeof suffix, "e/%010llu", (unsigned long long)ev.number - 1);
  if ((js->journal || js->etcd) && mega_jrec_event(j->id, &ev, &buf, &len, &e) == MEGA_OK)
    put_rec(js, j, suffix, buf, len, false, &e);
  if (gone && js->etcd) {
    snprintf(suffix, sizeof suffix, "e/%010llu", (unsigned long long)gone - 1);
    megad_jobs_etcd_del(js, j, suffix);
  }
  megad_log(js->b, "job %s: %s", j->id, msg);
  broadcast(js, j, &item);
}

void megad_job_step(megad_jobs *js, mega_job *j, const Mega__V1__StepMetrics *step) {
  if (step->iteration > j->last_iteration) j->last_iteration = step->iteration;
  js->stats.steps++;
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP;
  item.step = (Mega__V1__StepMetrics *)step;
  mega_err e = {0};
  if (mega_job_hist_push(&j->hist, &item, &e) != MEGA_OK)
    megad_warn(js->b, "job %s: %s", j->id, e.msg);
  broadcast(js, j, &item);
}

static Mega__V1__JobEventKind end_kind(mega_job_state s) {
  switch (s) {
  case MEGA_JOB_SUCCEEDED: return MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED;
  case MEGA_JOB_CANCELLED: return MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_CANCELLED;
  case MEGA_JOB_STOPPED: return MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_STOPPED;
  default: return MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_FAILED;
  }
}

void megad_job_finalize(megad_jobs *js, mega_job *j, mega_job_state state, const char *error) {
  mega_err e = {0};
  if (mega_job_transition(j, state, megad_unix_ms(), error, &e) != MEGA_OK) {
    megad_warn(js->b, "%s", e.msg);
    return;
  }
  /* the last step outlives the history's ring in the journal */
  uint8_t *buf;
  size_t len;
  if (j->hist.last_step && mega_jrec_step(j->id, j->hist.last_step, &buf, &len, &e) == MEGA_OK)
    put_rec(js, j, "s", buf, len, false, &e);
  megad_jobs_save(js, j, NULL);
  js->stats.finished[state == MEGA_JOB_SUCCEEDED   ? 0
                     : state == MEGA_JOB_CANCELLED ? 2
                     : state == MEGA_JOB_STOPPED   ? 3
                                                   : 1]++;
  if (state == MEGA_JOB_SUCCEEDED)
    megad_job_event(js, j, end_kind(state), NULL, -1, "succeeded after %llu iteration%s",
                    (unsigned long long)j->last_iteration, j->last_iteration == 1 ? "" : "s");
  else
    megad_job_event(js, j, end_kind(state), NULL, -1, "%s",
                    error ? error : mega_job_state_name(state));
  mega_job_msg m;
  if (mega_job_msg_init(&m, j, NULL) == MEGA_OK) {
    Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
    item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE;
    item.final_state = &m.job;
    mega_job_hist_push(&j->hist, &item, NULL);
    broadcast(js, j, &item);
    mega_job_msg_free(&m);
  }
}
