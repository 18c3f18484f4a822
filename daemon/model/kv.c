#include "daemon/model/kv.h"

#include <stdlib.h>
#include <string.h>

typedef struct entry {
  struct entry *next;
  char *key;
  uint8_t *val;
  size_t len;
} entry;

typedef struct waiter {
  struct waiter *next;
  mega_kv *kv;
  uint64_t id;
  char *key;
  mega_kv_wait_cb cb;
  void *ctx;
  uv_timer_t timer;
  bool timed;
} waiter;

#define NBUCKETS 256

struct mega_kv {
  uv_loop_t *loop;
  entry *buckets[NBUCKETS];
  waiter *waiters;
  size_t size, pending;
  uint64_t next_id;
};

static unsigned bucket_of(const char *key) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 16777619u;
  return h % NBUCKETS;
}

mega_kv *mega_kv_new(uv_loop_t *loop) {
  mega_kv *kv = calloc(1, sizeof *kv);
  if (kv) {
    kv->loop = loop;
    kv->next_id = 1;
  }
  return kv;
}

static void free_waiter(uv_handle_t *h) {
  waiter *w = h->data;
  free(w->key);
  free(w);
}

/* Unlinks w and answers it; the memory goes once its timer handle is closed. */
static void answer(waiter *w, mega_status s, const uint8_t *val, size_t len) {
  mega_kv *kv = w->kv;
  for (waiter **p = &kv->waiters; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  kv->pending--;
  w->cb(w->ctx, s, val, len);
  if (w->timed) {
    uv_timer_stop(&w->timer);
    uv_close((uv_handle_t *)&w->timer, free_waiter);
  } else {
    free(w->key);
    free(w);
  }
}

/* Answers every waiter that matches; callbacks may call back into the store,
 * so matches are taken out one at a time from a fresh scan. */
static void answer_matching(mega_kv *kv, const char *key, size_t keylen, bool prefix,
                            mega_status s, const uint8_t *val, size_t len) {
  for (;;) {
    waiter *w = kv->waiters;
    while (w && (prefix ? strncmp(w->key, key, keylen) : strcmp(w->key, key))) w = w->next;
    if (!w) return;
    answer(w, s, val, len);
  }
}

mega_status mega_kv_set(mega_kv *kv, const char *key, const void *val, size_t len, mega_err *err) {
  unsigned b = bucket_of(key);
  entry *e = kv->buckets[b];
  while (e && strcmp(e->key, key)) e = e->next;
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return mega_fail(err, MEGA_ERR_NOMEM, "kv: out of memory storing '%s'", key);
  if (len) memcpy(copy, val, len);
  if (!e) {
    e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(key))) {
      free(e);
      free(copy);
      return mega_fail(err, MEGA_ERR_NOMEM, "kv: out of memory storing '%s'", key);
    }
    e->next = kv->buckets[b];
    kv->buckets[b] = e;
    kv->size++;
  }
  free(e->val);
  e->val = copy;
  e->len = len;
  /* Waiter callbacks see a copy, since one may replace or delete the key. */
  uint8_t *snapshot = malloc(len ? len : 1);
  if (!snapshot) return mega_fail(err, MEGA_ERR_NOMEM, "kv: out of memory storing '%s'", key);
  if (len) memcpy(snapshot, val, len);
  answer_matching(kv, key, 0, false, MEGA_OK, snapshot, len);
  free(snapshot);
  return MEGA_OK;
}

bool mega_kv_get(mega_kv *kv, const char *key, const uint8_t **val, size_t *len) {
  for (entry *e = kv->buckets[bucket_of(key)]; e; e = e->next)
    if (!strcmp(e->key, key)) {
      *val = e->val;
      *len = e->len;
      return true;
    }
  return false;
}

static void on_timeout(uv_timer_t *t) {
  waiter *w = t->data;
  answer(w, MEGA_ERR_TIMEOUT, NULL, 0);
}

uint64_t mega_kv_wait(mega_kv *kv, const char *key, int timeout_ms, mega_kv_wait_cb cb,
                      void *ctx) {
  const uint8_t *val;
  size_t len;
  if (mega_kv_get(kv, key, &val, &len)) {
    cb(ctx, MEGA_OK, val, len);
    return 0;
  }
  waiter *w = calloc(1, sizeof *w);
  if (!w || !(w->key = strdup(key))) {
    free(w);
    cb(ctx, MEGA_ERR_NOMEM, NULL, 0);
    return 0;
  }
  w->kv = kv;
  w->id = kv->next_id++;
  w->cb = cb;
  w->ctx = ctx;
  if (timeout_ms > 0) {
    uv_timer_init(kv->loop, &w->timer);
    w->timer.data = w;
    w->timed = true;
    uv_timer_start(&w->timer, on_timeout, (uint64_t)timeout_ms, 0);
  }
  w->next = kv->waiters;
  kv->waiters = w;
  kv->pending++;
  return w->id;
}

void mega_kv_cancel(mega_kv *kv, uint64_t id) {
  for (waiter *w = kv->waiters; w; w = w->next)
    if (w->id == id) {
      answer(w, MEGA_ERR_CANCELLED, NULL, 0);
      return;
    }
}

void mega_kv_delete_prefix(mega_kv *kv, const char *prefix) {
  size_t n = strlen(prefix);
  for (int b = 0; b < NBUCKETS; b++) {
    entry **p = &kv->buckets[b];
    while (*p) {
      entry *e = *p;
      if (!strncmp(e->key, prefix, n)) {
        *p = e->next;
        free(e->key);
        free(e->val);
        free(e);
        kv->size--;
      } else {
        p = &e->next;
      }
    }
  }
  answer_matching(kv, prefix, n, true, MEGA_ERR_CANCELLED, NULL, 0);
}

size_t mega_kv_size(const mega_kv *kv) { return kv->size; }
size_t mega_kv_pending(const mega_kv *kv) { return kv->pending; }

void mega_kv_free(mega_kv *kv) {
  if (!kv) return;
  while (kv->waiters) answer(kv->waiters, MEGA_ERR_CANCELLED, NULL, 0);
  for (int b = 0; b < NBUCKETS; b++)
    for (entry *e = kv->buckets[b], *next; e; e = next) {
      next = e->next;
      free(e->key);
      free(e->val);
      free(e);
    }
  free(kv);
}
