#include "daemon/model/kv.h"

#include <stdlib.h>
#include <string.h>

typedef struct waiter waiter;

/* A key: with a value, or only awaited (has_val false, waiters not empty). */
typedef struct entry {
  struct entry *next; /* in its bucket */
  char *key;
  uint32_t hash;
  bool has_val;
  uint8_t *val;
  size_t len;
  waiter *waiters, *wtail; /* waiting for this key, oldest first */
} entry;

struct waiter {
  waiter *next, *prev;   /* every pending wait of the store */
  waiter *enext, *eprev; /* the waits of its entry */
  entry *e;
  mega_kv *kv;
  uint64_t id;
  mega_kv_wait_cb cb;
  void *ctx;
  uv_timer_t timer;
  bool timed;
};

#define MIN_BUCKETS 256u

struct mega_kv {
  uv_loop_t *loop;
  entry **buckets;
  size_t nbuckets; /* a power of two */
  size_t nentries; /* with a value or awaited */
  waiter *waiters;
  size_t size, pending;
  uint64_t next_id;
};

static uint32_t hash_of(const char *key) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 16777619u;
  return h;
}

mega_kv *mega_kv_new(uv_loop_t *loop) {
  mega_kv *kv = calloc(1, sizeof *kv);
  if (kv && !(kv->buckets = calloc(MIN_BUCKETS, sizeof *kv->buckets))) {
    free(kv);
    return NULL;
  }
  if (kv) {
    kv->loop = loop;
    kv->nbuckets = MIN_BUCKETS;
    kv->next_id = 1;
  }
  return kv;
}

static entry *find(const mega_kv *kv, const char *key, uint32_t h) {
  for (entry *e = kv->buckets[h & (kv->nbuckets - 1)]; e; e = e->next)
    if (e->hash == h && !strcmp(e->key, key)) return e;
  return NULL;
}

/* Doubles the table when it holds more entries than buckets; a failed
 * allocation keeps the old one (only slower). */
static void maybe_grow(mega_kv *kv) {
  if (kv->nentries <= kv->nbuckets) return;
  size_t n = kv->nbuckets * 2;
  entry **b = calloc(n, sizeof *b);
  if (!b) return;
  for (size_t i = 0; i < kv->nbuckets; i++)
    for (entry *e = kv->buckets[i], *next; e; e = next) {
      next = e->next;
      e->next = b[e->hash & (n - 1)];
      b[e->hash & (n - 1)] = e;
    }
  free(kv->buckets);
  kv->buckets = b;
  kv->nbuckets = n;
}

static entry *add(mega_kv *kv, const char *key, uint32_t h) {
  entry *e = calloc(1, sizeof *e);
  if (!e || !(e->key = strdup(key))) {
    free(e);
    return NULL;
  }
  e->hash = h;
  entry **b = &kv->buckets[h & (kv->nbuckets - 1)];
  e->next = *b;
  *b = e;
  kv->nentries++;
  maybe_grow(kv);
  return e;
}

static void unlink_entry(mega_kv *kv, entry *e) {
  for (entry **p = &kv->buckets[e->hash & (kv->nbuckets - 1)]; *p; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      break;
    }
  kv->nentries--;
  free(e->key);
  free(e->val);
  free(e);
}

/* An awaited key nobody waits for any more goes. */
static void maybe_drop(mega_kv *kv, entry *e) {
  if (!e->has_val && !e->waiters) unlink_entry(kv, e);
}

static void free_waiter(uv_handle_t *h) { free(h->data); }

/* Unlinks w and answers it; the memory goes once its timer handle is closed. */
static void answer(waiter *w, mega_status s, const uint8_t *val, size_t len) {
  mega_kv *kv = w->kv;
  if (w->prev) w->prev->next = w->next;
  else kv->waiters = w->next;
  if (w->next) w->next->prev = w->prev;
  entry *e = w->e;
  if (e) {
    if (w->eprev) w->eprev->enext = w->enext;
    else e->waiters = w->enext;
    if (w->enext) w->enext->eprev = w->eprev;
    else e->wtail = w->eprev;
    maybe_drop(kv, e);
  }
  kv->pending--;
  w->cb(w->ctx, s, val, len);
  if (w->timed) {
    uv_timer_stop(&w->timer);
    uv_close((uv_handle_t *)&w->timer, free_waiter);
  } else {
    free(w);
  }
}

mega_status mega_kv_set(mega_kv *kv, const char *key, const void *val, size_t len, mega_err *err) {
  uint32_t h = hash_of(key);
  entry *e = find(kv, key, h);
  uint8_t *copy = malloc(len ? len : 1);
  /* Waiter callbacks see a copy, since one may replace or delete the key. */
  uint8_t *snapshot = e && e->waiters ? malloc(len ? len : 1) : NULL;
  if (!copy || (e && e->waiters && !snapshot) || (!e && !(e = add(kv, key, h)))) {
    free(copy);
    free(snapshot);
    return mega_fail(err, MEGA_ERR_NOMEM, "kv: out of memory storing '%s'", key);
  }
  if (len) memcpy(copy, val, len);
  if (!e->has_val) kv->size++;
  free(e->val);
  e->val = copy;
  e->len = len;
  e->has_val = true;
  if (!snapshot) return MEGA_OK;
  if (len) memcpy(snapshot, val, len);
  /* Callbacks may call back into the store (and free e): look the key up
   * again for each waiter. */
  while ((e = find(kv, key, h)) && e->waiters) answer(e->waiters, MEGA_OK, snapshot, len);
  free(snapshot);
  return MEGA_OK;
}

bool mega_kv_get(mega_kv *kv, const char *key, const uint8_t **val, size_t *len) {
  entry *e = find(kv, key, hash_of(key));
  if (!e || !e->has_val) return false;
  *val = e->val;
  *len = e->len;
  return true;
}

mega_status mega_kv_slice(const uint8_t *val, size_t len, uint32_t parts, uint32_t part,
                          const uint8_t **out, size_t *out_len, mega_err *err) {
  if (!parts) {
    *out = val;
    *out_len = len;
    return MEGA_OK;
  }
  if (part >= parts)
    return mega_fail(err, MEGA_ERR_INVALID, "part %u asked of a value in %u parts", part, parts);
  if (len % parts)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "a value of %zu bytes is not %u equal parts (the ranks disagree on the "
                     "group's size?)", len, parts);
  *out_len = len / parts;
  *out = val + (size_t)part * *out_len;
  return MEGA_OK;
}

static void on_timeout(uv_timer_t *t) {
  waiter *w = t->data;
  answer(w, MEGA_ERR_TIMEOUT, NULL, 0);
}

uint64_t mega_kv_wait(mega_kv *kv, const char *key, int timeout_ms, mega_kv_wait_cb cb,
                      void *ctx) {
  uint32_t h = hash_of(key);
  entry *e = find(kv, key, h);
  if (e && e->has_val) {
    cb(ctx, MEGA_OK, e->val, e->len);
    return 0;
  }
  waiter *w = calloc(1, sizeof *w);
  if (!w || (!e && !(e = add(kv, key, h)))) {
    free(w);
    cb(ctx, MEGA_ERR_NOMEM, NULL, 0);
    return 0;
  }
  w->kv = kv;
  w->e = e;
  w->id = kv->next_id++;
  w->cb = cb;
  w->ctx = ctx;
  if (timeout_ms > 0) {
    uv_timer_init(kv->loop, &w->timer);
    w->timer.data = w;
    w->timed = true;
    uv_timer_start(&w->timer, on_timeout, (uint64_t)timeout_ms, 0);
  }
  /* oldest first, as they were answered before; a group's ranks pile up
   * on the key of the last to come, so appending must not walk them */
  w->eprev = e->wtail;
  if (e->wtail) e->wtail->enext = w;
  else e->waiters = w;
  e->wtail = w;
  w->next = kv->waiters;
  if (w->next) w->next->prev = w;
  kv->waiters = w;
  kv->pending++;
  return w->id;
}

/* Cancels are rare (a caller gave up, a job ended): a walk of the pending
 * waits is enough. */
void mega_kv_cancel(mega_kv *kv, uint64_t id) {
  for (waiter *w = kv->waiters; w; w = w->next)
    if (w->id == id) {
      answer(w, MEGA_ERR_CANCELLED, NULL, 0);
      return;
    }
}

void mega_kv_delete_prefix(mega_kv *kv, const char *prefix) {
  size_t n = strlen(prefix);
  /* The waits to cancel, by id: their callbacks may add, answer or cancel
   * others meanwhile. */
  size_t nids = 0;
  uint64_t *ids = kv->pending ? malloc(kv->pending * sizeof *ids) : NULL;
  for (waiter *w = kv->waiters; w && ids; w = w->next)
    if (!strncmp(w->e->key, prefix, n)) ids[nids++] = w->id;
  for (size_t b = 0; b < kv->nbuckets; b++)
    for (entry **p = &kv->buckets[b]; *p;) {
      entry *e = *p;
      if (strncmp(e->key, prefix, n) || !e->has_val) {
        p = &e->next;
        continue;
      }
      free(e->val);
      e->val = NULL;
      e->has_val = false;
      kv->size--;
      if (e->waiters) { /* a set is answering them: they are cancelled below */
        p = &e->next;
        continue;
      }
      *p = e->next;
      kv->nentries--;
      free(e->key);
      free(e);
    }
  for (size_t i = 0; i < nids; i++) mega_kv_cancel(kv, ids[i]);
  if (!ids && kv->pending) /* out of memory for the list: the slow way */
    for (waiter *w = kv->waiters; w;) {
      if (strncmp(w->e->key, prefix, n)) {
        w = w->next;
        continue;
      }
      answer(w, MEGA_ERR_CANCELLED, NULL, 0);
      w = kv->waiters;
    }
  free(ids);
}

size_t mega_kv_size(const mega_kv *kv) { return kv->size; }
size_t mega_kv_pending(const mega_kv *kv) { return kv->pending; }

void mega_kv_free(mega_kv *kv) {
  if (!kv) return;
  while (kv->waiters) answer(kv->waiters, MEGA_ERR_CANCELLED, NULL, 0);
  for (size_t b = 0; b < kv->nbuckets; b++)
    for (entry *e = kv->buckets[b], *next; e; e = next) {
      next = e->next;
      free(e->key);
      free(e->val);
      free(e);
    }
  free(kv->buckets);
  free(kv);
}
