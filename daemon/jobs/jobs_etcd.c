/* The jobs layer in etcd mode: the mirror of every job of the cluster, and
 * the writes of this node's jobs, in order, each guarded by the job's fence
 * (keys in jobs.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/etcd/etcd.h"
#include "daemon/jobs/jobs_internal.h"
#include "daemon/model/util.h"

#define KJ "mega/j/"
#define KC "mega/c/"
#define BATCH 32        /* records of one job in one transaction */
#define RETRY_MS 500
#define WRITEQ_MAX 100000 /* queued records while etcd is away, before the oldest go */

struct megad_jwrite {
  megad_jwrite *next;
  char *job_id;
  char *key; /* NULL: forget the job */
  uint8_t *val; /* NULL: delete key */
  size_t len;
  bool claim;
  int64_t fence; /* the job's fence when queued (0: its claim was pending) */
};

static void jw_free(megad_jwrite *w) {
  free(w->job_id);
  free(w->key);
  free(w->val);
  free(w);
}

/* ---- the write queue ---- */

static void pop(megad_jobs *js, size_t n) {
  while (n-- && js->writeq_head) {
    megad_jwrite *w = js->writeq_head;
    js->writeq_head = w->next;
    if (!js->writeq_head) js->writeq_tail = NULL;
    js->writeq_len--;
    jw_free(w);
  }
}

/* Drops every queued record of a job this node no longer coordinates. */
static void pop_job(megad_jobs *js, const char *id) {
  megad_jwrite **pw = &js->writeq_head, *last = NULL;
  size_t keep = js->writeq_busy ? js->writeq_batch : 0; /* the batch in flight stays */
  while (*pw) {
    megad_jwrite *w = *pw;
    if (keep) {
      keep--;
      last = w;
      pw = &w->next;
    } else if (w->key && !strcmp(w->job_id, id)) {
      *pw = w->next;
      js->writeq_len--;
      jw_free(w);
    } else {
      last = w;
      pw = &w->next;
    }
  }
  js->writeq_tail = last;
}

static void fence_lost(megad_jobs *js, mega_job *j, const char *why) {
  if (j->etcd.fenced) return;
  j->etcd.fenced = true;
  pop_job(js, j->id);
  if (js->cbs.fenced) js->cbs.fenced(js->cbs.arg, j, why);
}

/* ---- the mirror ---- */

/* prefix "<id>/rest" -> id; *rest points after the id's slash ("" if none). */
static bool key_id(const char *key, const char *prefix, char *id, size_t cap, const char **rest) {
  size_t pl = strlen(prefix);
  if (strncmp(key, prefix, pl)) return false;
  const char *p = key + pl, *slash = strchr(p, '/');
  size_t n = slash ? (size_t)(slash - p) : strlen(p);
  if (!n || n >= cap) return false;
  memcpy(id, p, n);
  id[n] = '\0';
  if (rest) *rest = slash ? slash + 1 : "";
  return true;
}

/* Whether key is one of this cluster's job keys: mega/c/<id>, or
 * mega/j/<id>/ and then 0, s or e/<seq>. Another cluster whose prefix is
 * this one's and "c/" or "j/" (--etcd-prefix P/j/) has keys in the same
 * range (mega/j/j/7/0 here is its job 7's record): not ours. */
static bool job_key(const char *key, char *id, size_t cap, bool *coord, const char **rest) {
  if ((*coord = key_id(key, KC, id, cap, rest))) return !strchr(key + strlen(KC), '/');
  if (!key_id(key, KJ, id, cap, rest)) return false;
  const char *r = *rest;
  if (!strcmp(r, "0") || !strcmp(r, "s")) return true;
  if (strncmp(r, "e/", 2) || !r[2]) return false;
  for (r += 2; *r; r++)
    if (*r < '0' || *r > '9') return false;
  return true;
}

static void mirror_record(megad_jobs *js, const megad_etcd_kv *kv) {
  mega_err e = {0};
  if (mega_jobs_apply(&js->mirror, kv->value, kv->value_len, &e) != MEGA_OK)
    megad_warn(js->b, "etcd: skipping %s: %s", kv->key, e.msg);
}

/* m is coordinated by kv's holder (a coordinator key's value). The fence
 * only grows. */
static void set_coordinator(mega_job *m, const megad_etcd_kv *kv) {
  if (kv->create_revision > m->etcd.fence) m->etcd.fence = kv->create_revision;
  m->etcd.orphan = false;
  char *node = strndup((const char *)kv->value, kv->value_len);
  if (node) {
    free(m->coordinator);
    m->coordinator = node;
  }
}

/* The coordinator key of job id was put (kv) or deleted. The fence only
 * grows: a mirror that has seen the new coordinator's claim never again
 * takes an older fence for current. */
static void mirror_coord(megad_jobs *js, const char *id, const megad_etcd_kv *kv, bool del) {
  mega_job *m = mega_jobs_table_find(&js->mirror, id);
  if (m && !del) set_coordinator(m, kv);
  if (!del && js->cbs.coordinator) {
    char *node = strndup((const char *)kv->value, kv->value_len);
    if (node) js->cbs.coordinator(js->cbs.arg, id, node);
    free(node);
  }
  if (!del) return;
  if (m) m->etcd.orphan = true;
  mega_job *own = mega_jobs_table_find(&js->t, id);
  /* the deletion of a key newer than this node's claim ended the claim */
  if (own && own->etcd.fence && kv->mod_revision > own->etcd.fence) {
    fence_lost(js, own, "its coordinator key went with this node's etcd lease");
    return;
  }
  if (!own && m && !mega_job_state_final(m->state) && js->cbs.orphan)
    js->cbs.orphan(js->cbs.arg, id);
}

static void note_rev(megad_jobs *js, int64_t rev) {
  if (rev > js->rev) js->rev = rev;
}

/* One watch on mega/, so a job's record and its coordinator key arrive in
 * revision order (a claim writes the record first). Node keys are members'. */
static void on_key(void *arg, megad_etcd_evtype type, const megad_etcd_kv *kv) {
  megad_jobs *js = arg;
  note_rev(js, kv->mod_revision);
  char id[160];
  const char *rest;
  bool coord;
  if (!job_key(kv->key, id, sizeof id, &coord, &rest)) return;
  if (coord) mirror_coord(js, id, kv, type == MEGAD_ETCD_EV_DELETE);
  else if (type != MEGAD_ETCD_EV_DELETE) mirror_record(js, kv);
  else if (!strcmp(rest, "0")) mega_jobs_forget(&js->mirror, id);
}

/* Every job of the cluster from one read of mega/: records first (their
 * keys sort after the coordinator keys), then who coordinates each; a job
 * without a coordinator key is an orphan. */
static void load(megad_jobs *js, const megad_etcd_reply *r) {
  mega_jobs_free(&js->mirror);
  mega_jobs_init(&js->mirror);
  char id[160];
  const char *rest;
  bool coord;
  for (size_t i = 0; i < r->nkvs; i++)
    if (job_key(r->kvs[i].key, id, sizeof id, &coord, &rest) && !coord)
      mirror_record(js, &r->kvs[i]);
  for (size_t i = 0; i < js->mirror.n; i++) js->mirror.v[i]->etcd.orphan = true;
  for (size_t i = 0; i < r->nkvs; i++) {
    if (!job_key(r->kvs[i].key, id, sizeof id, &coord, &rest) || !coord) continue;
    mega_job *m = mega_jobs_table_find(&js->mirror, id);
    if (m) set_coordinator(m, &r->kvs[i]);
  }
  js->rev = r->revision;
  if (js->mirror.next_id > js->t.next_id) js->t.next_id = js->mirror.next_id;
}

static void reset_one(void *arg, const char *why);

static mega_status watch_all(megad_jobs *js, mega_err *err) {
  megad_etcd_watch_cbs cbs = {.event = on_key, .reset = reset_one, .arg = js};
  /* mega/c/ to the end of mega/j/: one watch (a job's record and its
   * coordinator key in revision order) that leaves out mega/nodes/ and
   * mega/load/, which members reads */
  return megad_etcd_watch_range(js->etcd, KC, "mega/j0", js->rev + 1, &cbs, &js->watch, err);
}

#define RELOAD_RETRY_MS 1000

static void reload(megad_jobs *js);

static void on_reload_retry(uv_timer_t *t) { reload(t->data); }

static void reloaded(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  megad_jobs *js = arg;
  mega_err e = {0};
  if (err->status == MEGA_ERR_CANCELLED) return;
  if (!r) { /* no watch runs now: nothing but this timer would ever read them again */
    if (!js->reload_fails++)
      megad_warn(js->b, "etcd: reading the cluster's jobs again: %s; the mirror stays stale "
                        "until it works (trying every %d ms)", err->msg, RELOAD_RETRY_MS);
    uv_timer_start(&js->reload_retry, on_reload_retry, RELOAD_RETRY_MS, 0);
    return;
  }
  if (js->reload_fails)
    megad_log(js->b, "etcd: read the cluster's jobs again (%u tr%s failed before)",
              js->reload_fails, js->reload_fails == 1 ? "y" : "ies");
  js->reload_fails = 0;
  load(js, r);
  if (watch_all(js, &e) != MEGA_OK) megad_warn(js->b, "etcd: %s", e.msg);
}

static void reload(megad_jobs *js) {
  mega_err e = {0};
  if (megad_etcd_get(js->etcd, "mega/", true, reloaded, js, &e) != MEGA_OK) {
    megad_warn(js->b, "etcd: %s", e.msg);
    uv_timer_start(&js->reload_retry, on_reload_retry, RELOAD_RETRY_MS, 0);
  }
}

/* A watch that cannot resume (its revision was compacted): read it all again. */
static void reset(megad_jobs *js, const char *why) {
  megad_warn(js->b, "etcd: the jobs' watch could not resume (%s); reading every job again", why);
  reload(js);
}

/* The watch could not resume: its handle stays until cancelled (which a
 * watch's own callback may do). */
static void reset_one(void *arg, const char *why) {
  megad_jobs *js = arg;
  if (js->watch) megad_etcd_watch_cancel(js->watch);
  js->watch = NULL;
  reset(js, why);
}

/* ---- writes ---- */

static void pump(megad_jobs *js);

static void on_retry(uv_timer_t *t) {
  megad_jobs *js = t->data;
  pump(js);
}

bool megad_jobs_claim_mine(const megad_jobs *js, const megad_etcd_reply *r, int64_t lease) {
  const char *self = js->b->node_id;
  return r && !r->succeeded && r->nkvs == 1 && lease && r->kvs[0].lease == lease &&
         r->kvs[0].value_len == strlen(self) && !memcmp(r->kvs[0].value, self, strlen(self));
}

static void claimed(megad_jobs *js, mega_job *j, int64_t fence) {
  j->etcd.fence = fence;
  if (js->cbs.claimed) js->cbs.claimed(js->cbs.arg, j);
}

static void written(void *arg, const megad_etcd_reply *r, const mega_err *err) {
  megad_jobs *js = arg;
  js->writeq_busy = false;
  if (err->status == MEGA_ERR_CANCELLED && js->b->stopping) return;
  megad_jwrite *w = js->writeq_head;
  if (!w) return;
  char id[160];
  snprintf(id, sizeof id, "%s", w->job_id);
  bool claim = w->claim, forget = !w->key;
  mega_job *j = mega_jobs_table_find(&js->t, id);
  /* a batch sent under a fence the job no longer has (it was dropped and
   * taken back meanwhile) says nothing about the job now */
  bool current = j && !forget && (claim ? !j->etcd.fence : j->etcd.fence == js->writeq_fence);
  /* a claim whose lease expired meanwhile goes again under the next one */
  bool lease_gone = claim && strstr(err->msg, "lease not found");
  if (!r && !megad_etcd_retryable(err) && !lease_gone) { /* etcd will refuse these again */
    megad_warn(js->b, "etcd refused %zu record%s of job %s: %s", js->writeq_batch,
               js->writeq_batch == 1 ? "" : "s", id, err->msg);
    pop(js, js->writeq_batch);
    if (current && claim) { /* nothing of the job can reach etcd: it cannot run */
      pop_job(js, id); /* and what it writes from now on is dropped (no fence) */
      if (js->cbs.refused) js->cbs.refused(js->cbs.arg, j, err->msg);
    }
    pump(js);
    return;
  }
  if (!r) {
    if (!js->writeq_err[0])
      megad_warn(js->b, "etcd: cannot write job %s: %s; retrying every %d ms", id, err->msg,
                 RETRY_MS);
    snprintf(js->writeq_err, sizeof js->writeq_err, "%s", err->msg);
    uv_timer_start(&js->writeq_retry, on_retry, RETRY_MS, 0);
    return;
  }
  if (js->writeq_err[0]) megad_log(js->b, "etcd: writes go through again");
  js->writeq_err[0] = '\0';
  pop(js, js->writeq_batch);
  if (current && claim && r->succeeded)
    claimed(js, j, r->revision);
  else if (current && claim && megad_jobs_claim_mine(js, r, js->writeq_lease))
    claimed(js, j, r->kvs[0].create_revision);
  else if (current && !r->succeeded)
    fence_lost(js, j, claim ? "another node already holds its coordinator key"
                            : "etcd refused a write: another node coordinates the job now");
  pump(js);
}

static void pump(megad_jobs *js) {
  for (;;) {
    megad_jwrite *w = js->writeq_head;
    if (js->writeq_busy || !w || uv_is_active((uv_handle_t *)&js->writeq_retry)) return;
    mega_job *j = mega_jobs_table_find(&js->t, w->job_id);
    char ckey[192], pre[192];
    snprintf(ckey, sizeof ckey, KC "%s", w->job_id);
    snprintf(pre, sizeof pre, KJ "%s/", w->job_id);
    megad_etcd_op ops[BATCH + 1];
    megad_etcd_cmp cmp = {.key = ckey, .target = MEGAD_ETCD_CREATE};
    size_t nops = 0, ncmp = 1, n = 0;
    int64_t lease = megad_etcd_session_lease(js->etcd);
    if (!w->key) { /* forget: an ended job's keys, whoever wrote them */
      ops[nops++] = (megad_etcd_op){.kind = MEGAD_ETCD_DELETE, .key = pre, .prefix = true};
      ops[nops++] = (megad_etcd_op){.kind = MEGAD_ETCD_DELETE, .key = ckey};
      ncmp = 0;
      n = 1;
    } else if (!j || j->etcd.fenced || (!w->claim && !j->etcd.fence) ||
               (!w->claim && w->fence && w->fence != j->etcd.fence)) {
      pop(js, 1); /* the job went, is another node's now, or was taken back since */
      continue;
    } else if (w->claim && !lease) {
      snprintf(js->writeq_err, sizeof js->writeq_err, "this node holds no etcd lease yet");
      uv_timer_start(&js->writeq_retry, on_retry, RETRY_MS / 5, 0);
      return;
    } else {
      cmp.number = w->claim ? 0 : j->etcd.fence;
      for (megad_jwrite *x = w; x && n < BATCH && x->key && !strcmp(x->job_id, w->job_id) &&
                                (n == 0 || !x->claim);
           x = x->next, n++) {
        size_t k = 0; /* etcd refuses a key twice in one txn: the later record wins */
        while (k < nops && strcmp(ops[k].key, x->key)) k++;
        ops[k] = (megad_etcd_op){.kind = x->val ? MEGAD_ETCD_PUT : MEGAD_ETCD_DELETE,
                                 .key = x->key, .value = x->val, .value_len = x->len};
        if (k == nops) nops++;
      }
      if (w->claim) /* after the record, so the mirrors know the job when they see it */
        ops[nops++] = (megad_etcd_op){.kind = MEGAD_ETCD_PUT, .key = ckey,
                                      .value = js->b->node_id,
                                      .value_len = strlen(js->b->node_id), .lease = lease};
    }
    /* a refused claim reads who holds the key: itself, if a first try went through */
    megad_etcd_op holder = {.kind = MEGAD_ETCD_GET, .key = ckey};
    bool claim = w->key && w->claim;
    mega_err e = {0};
    js->writeq_busy = true;
    js->writeq_batch = n;
    js->writeq_fence = j && w->key ? j->etcd.fence : 0;
    js->writeq_lease = claim ? lease : 0;
    if (megad_etcd_txn(js->etcd, ncmp ? &cmp : NULL, ncmp, ops, nops, claim ? &holder : NULL,
                       claim ? 1 : 0, written, js, &e) == MEGA_OK)
      return;
    js->writeq_busy = false;
    snprintf(js->writeq_err, sizeof js->writeq_err, "%s", e.msg);
    uv_timer_start(&js->writeq_retry, on_retry, RETRY_MS, 0);
    return;
  }
}

static void enqueue(megad_jobs *js, megad_jwrite *w) {
  if (js->writeq_len >= WRITEQ_MAX && js->writeq_head && !js->writeq_busy &&
      !js->writeq_head->claim) {
    megad_warn(js->b, "etcd: %zu records of jobs wait for etcd; dropping the oldest (job %s)",
               js->writeq_len, js->writeq_head->job_id);
    pop(js, 1);
  }
  if (js->writeq_tail) js->writeq_tail->next = w;
  else js->writeq_head = w;
  js->writeq_tail = w;
  js->writeq_len++;
  pump(js);
}

static void queue_key(megad_jobs *js, const mega_job *j, const char *suffix, uint8_t *buf,
                      size_t len, bool claim) {
  megad_jwrite *w = calloc(1, sizeof *w);
  if (w) {
    w->job_id = strdup(j->id);
    w->val = buf;
    w->len = len;
    w->claim = claim;
    w->fence = j->etcd.fence;
    if (asprintf(&w->key, KJ "%s/%s", j->id, suffix) < 0) w->key = NULL;
  } else {
    free(buf);
  }
  if (!w || !w->job_id || !w->key) {
    megad_warn(js->b, "etcd: out of memory queueing a record of job %s", j->id);
    if (w) jw_free(w);
    return;
  }
  enqueue(js, w);
}

void megad_jobs_etcd_put(megad_jobs *js, const mega_job *j, const char *suffix, uint8_t *buf,
                         size_t len, bool claim) {
  if (j->etcd.fenced || !buf) {
    free(buf);
    return;
  }
  queue_key(js, j, suffix, buf, len, claim);
}

void megad_jobs_etcd_del(megad_jobs *js, const mega_job *j, const char *suffix) {
  if (!j->etcd.fenced) queue_key(js, j, suffix, NULL, 0, false);
}

void megad_jobs_etcd_forget(megad_jobs *js, const char *job_id) {
  megad_jwrite *w = calloc(1, sizeof *w);
  if (!w || !(w->job_id = strdup(job_id))) {
    free(w);
    megad_warn(js->b, "etcd: out of memory forgetting job %s", job_id);
    return;
  }
  enqueue(js, w);
}

/* ---- the layer's etcd calls ---- */

mega_status megad_jobs_open_etcd(megad_jobs *js, megad_base *b, megad_etcd *etcd,
                                 mega_err *err) {
  memset(js, 0, sizeof *js);
  js->b = b;
  js->etcd = etcd;
  mega_jobs_init(&js->t);
  mega_jobs_init(&js->mirror);
  uv_timer_init(b->loop, &js->writeq_retry);
  js->writeq_retry.data = js;
  js->writeq_retry_on = true;
  uv_timer_init(b->loop, &js->reload_retry);
  js->reload_retry.data = js;
  char path[4096];
  struct stat st;
  snprintf(path, sizeof path, "%s/journal", b->state_dir);
  if (!stat(path, &st) && st.st_size > 0)
    megad_warn(b, "%s holds jobs of a megad without etcd; in etcd mode they are not resumed (start "
                  "without --etcd-endpoints on this state dir to finish them)", path);
  megad_etcd_reply *r = NULL;
  mega_status s = megad_etcd_get_sync(etcd, "mega/", true, &r, err);
  if (s != MEGA_OK) return s;
  load(js, r);
  megad_etcd_reply_free(r);
  if ((s = watch_all(js, err)) != MEGA_OK) return s;
  if (js->mirror.n)
    megad_log(b, "etcd: %zu job%s of the cluster read (revision %lld)", js->mirror.n,
              js->mirror.n == 1 ? "" : "s", (long long)js->rev);
  return MEGA_OK;
}

void megad_jobs_set_cbs(megad_jobs *js, const megad_jobs_cbs *cbs) { js->cbs = *cbs; }

mega_job *megad_jobs_mirror_find(megad_jobs *js, const char *id) {
  return js->etcd ? mega_jobs_table_find(&js->mirror, id) : NULL;
}

int64_t megad_jobs_coord_rev(megad_jobs *js, const char *job_id) { /* the newest fence seen */
  if (!js->etcd) return 0;
  const mega_job *m = mega_jobs_table_find(&js->mirror, job_id);
  const mega_job *own = mega_jobs_table_find(&js->t, job_id);
  int64_t a = m ? m->etcd.fence : 0, o = own && !own->etcd.fenced ? own->etcd.fence : 0;
  return a > o ? a : o;
}

void megad_jobs_drop(megad_jobs *js, mega_job *j) {
  char why[256];
  snprintf(why, sizeof why, "job %s is coordinated by another node now; watch it again", j->id);
  megad_watch_drop_job(&js->watchers, j, why);
  pop_job(js, j->id);
  mega_job_free(mega_jobs_take(&js->t, j->id));
}

bool megad_jobs_durable(const megad_jobs *js, const char **why) {
  if (!js->etcd || !js->writeq_err[0]) return true;
  if (why) *why = js->writeq_err;
  return false;
}

void megad_jobs_etcd_close(megad_jobs *js) {
  if (!js->etcd) return;
  if (js->watch) megad_etcd_watch_cancel(js->watch);
  js->watch = NULL;
  while (js->writeq_head) pop(js, 1);
  if (js->writeq_retry_on) {
    uv_close((uv_handle_t *)&js->writeq_retry, NULL);
    uv_close((uv_handle_t *)&js->reload_retry, NULL);
  }
  js->writeq_retry_on = false;
  mega_jobs_free(&js->mirror);
}
