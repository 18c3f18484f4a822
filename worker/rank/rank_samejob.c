/* A hand launch's ranks agree on the job before they build groups.
 *
 * megad gives every rank the same job; ranks started by hand each parse
 * their own command line, and ranks that differ (a layer count, a batch
 * size, the pipeline's size) would join different groups and hang, or
 * exchange buffers of other sizes (Gloo then aborts the process), or train
 * apart without a word. So rank 0 publishes its job, every rank compares
 * it with its own and publishes a verdict, and every rank reads every
 * verdict: a difference stops them all, naming the flag. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/rank/rank_internal.h"

#define SAMEJOB_GROUP "samejob"
#define SAME "same" /* a verdict: no difference */
#define FAILED "failed: " /* a value of a rank that failed before the ranks met */

/* The reason a rank that failed first published, or NULL. */
static const char *failed_reason(const void *v, size_t len) {
  size_t n = strlen(FAILED);
  return len >= n && !memcmp(v, FAILED, n) ? (const char *)v + n : NULL;
}

static mega_status peer_failed(int rank, const void *v, size_t len, mega_err *err) {
  const char *why = failed_reason(v, len);
  int n = (int)(len - (size_t)(why - (const char *)v));
  return mega_fail(err, MEGA_ERR_PEER, "rank %d failed before the ranks met: %.*s", rank,
                   n < 400 ? n : 400, why);
}

/* v as a flag's value reads: reals in their shortest exact form. */
static void value_text(const json_t *v, char *buf, size_t n) {
  if (json_is_real(v)) {
    double x = json_real_value(v);
    for (int prec = 6; prec <= 17; prec++) {
      snprintf(buf, n, "%.*g", prec, x);
      if (strtod(buf, NULL) == x) return;
    }
    return;
  }
  char *t = v ? json_dumps(v, JSON_ENCODE_ANY) : NULL;
  snprintf(buf, n, "%s", t ? t : "null");
  free(t);
}

/* why "" when job matches theirs (rank 0's, as JSON), else what differs. */
static void compare(const mega_jobspec *job, int me, const char *theirs, size_t len, char *why,
                    size_t n) {
  why[0] = '\0';
  json_error_t jerr;
  json_t *other = json_loadb(theirs, len, 0, &jerr), *mine = mega_jobspec_to_json(job);
  if (!other || !mine) {
    snprintf(why, n, "cannot read rank 0's job (%s)", other ? "out of memory" : jerr.text);
  } else {
    for (int i = 0; i < mega_jobspec_flag_count() && !why[0]; i++) {
      const mega_jobflag *f = mega_jobspec_flag(i);
      json_t *a = json_object_get(mine, f->key), *b = json_object_get(other, f->key);
      if (json_equal(a, b) || (json_is_null(a) && !b) || (!a && json_is_null(b))) continue;
      char va[160], vb[160];
      value_text(a, va, sizeof va);
      value_text(b, vb, sizeof vb);
      snprintf(why, n, "%s is %s on rank %d but %s on rank 0", f->name, va, me, vb);
    }
  }
  json_decref(other);
  json_decref(mine);
}

/* A key that cannot be set: as a rule the keys of an earlier launch in
 * the same directory. */
static mega_status reused(const mega_rank *r, mega_err *err) {
  if (r->env.store_dir)
    mega_err_prefix(err, "rank %d cannot publish in --rendezvous-dir %s (each launch needs a "
                    "fresh, empty directory)", r->env.rank, r->env.store_dir);
  return err ? err->status : MEGA_ERR_IO;
}

/* A rank that never came: most often not started, or given another
 * directory. */
static mega_status waited(const mega_rank *r, int rank, mega_err *err) {
  mega_err_prefix(err, "rank %d waited for rank %d in %s (is it started, with the same "
                  "--rendezvous-dir and --world-size?)", r->env.rank, rank,
                  r->env.store_dir ? r->env.store_dir : "the store");
  return err ? err->status : MEGA_ERR_TIMEOUT;
}

mega_status rank_same_job(mega_rank *r, mega_store *store, int timeout_ms, mega_err *err) {
  int world = r->env.world_size, me = r->env.rank;
  mega_status st = MEGA_OK;
  if (me == 0) {
    json_t *j = mega_jobspec_to_json(r->job);
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (!text) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    st = mega_store_set(store, SAMEJOB_GROUP, "job", text, strlen(text), err);
    free(text);
    if (st != MEGA_OK) return reused(r, err);
  }
  char why[400] = "", key[32];
  if (me != 0) {
    void *theirs = NULL;
    size_t len = 0;
    st = mega_store_get(store, SAMEJOB_GROUP, "job", &theirs, &len, timeout_ms, err);
    if (st != MEGA_OK) return waited(r, 0, err);
    if (failed_reason(theirs, len)) {
      st = peer_failed(0, theirs, len, err);
      free(theirs);
      return st;
    }
    compare(r->job, me, theirs, len, why, sizeof why);
    free(theirs);
  }
  snprintf(key, sizeof key, "verdict.%d", me);
  if (!why[0]) snprintf(why, sizeof why, "%s", SAME); /* the store keeps no empty value */
  st = mega_store_set(store, SAMEJOB_GROUP, key, why, strlen(why), err);
  if (st != MEGA_OK) return reused(r, err);
  for (int k = 0; k < world && st == MEGA_OK; k++) {
    void *v = NULL;
    size_t len = 0;
    snprintf(key, sizeof key, "verdict.%d", k);
    st = mega_store_get(store, SAMEJOB_GROUP, key, &v, &len, timeout_ms, err);
    if (st != MEGA_OK) st = waited(r, k, err);
    if (st == MEGA_OK && failed_reason(v, len)) st = peer_failed(k, v, len, err);
    if (st == MEGA_OK && !(len == strlen(SAME) && !memcmp(v, SAME, len)))
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "rank %d was started with another job than rank 0: %.*s; every rank of a "
                     "hand launch needs the same job flags",
                     k, (int)(len < 300 ? len : 300), (const char *)v);
    free(v);
  }
  return st;
}

const char *rank_store_prefix(const mega_rank *r) {
  return r->env.kv_prefix ? r->env.kv_prefix : "mega";
}

void rank_same_job_failed(const mega_rank *r, const char *why) {
  if (r->env.kv || !r->env.store_dir || r->env.world_size < 2) return;
  mega_store *store = NULL;
  mega_err ignored = {0};
  if (mega_store_open_file(r->env.store_dir, rank_store_prefix(r), &store, &ignored)) return;
  char text[MEGA_ERR_MSG_MAX + 16], key[32];
  snprintf(text, sizeof text, "%s%s", FAILED, why && why[0] ? why : "(no reason given)");
  /* a key already set (the ranks met) stays as it is */
  if (r->env.rank == 0) mega_store_set(store, SAMEJOB_GROUP, "job", text, strlen(text), &ignored);
  snprintf(key, sizeof key, "verdict.%d", r->env.rank);
  mega_store_set(store, SAMEJOB_GROUP, key, text, strlen(text), &ignored);
  mega_store_close(store);
}
