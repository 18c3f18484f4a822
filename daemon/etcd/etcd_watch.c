/* Watches: one Watch stream per watch (one create request, half-closed: etcd
 * keeps the watch open after the client's half-close).
 *
 * The watch remembers the revision after the last one it delivered; a stream
 * that ends for any reason (the member died, the connection broke) is opened
 * again on the next endpoint from there, so nothing is lost or repeated:
 * etcd sends the events of one revision together and in order. A compacted
 * revision cannot be resumed: reset tells the caller. The watch asks for
 * etcd's progress notifications (every 10 minutes by default), which move
 * that revision on while nothing under the key changes, so a quiet watch
 * does not fall behind a compaction of the others' history and need a
 * whole read again after a broken stream. */
#include "daemon/etcd/etcd_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One Watch call; outlives its watch if the watch is cancelled first. */
typedef struct wstream {
  megad_etcd_watch *w; /* NULL once the watch is gone */
  size_t ep;
  bool created;
  mega_rpc_pending *p;
} wstream;

struct megad_etcd_watch {
  megad_etcd *e;
  megad_etcd_watch *prev, *next;
  megad_etcd_watch_cbs cbs;
  char *key, *end;
  size_t end_len;
  int64_t next_rev; /* the first revision not yet delivered; 0: from now */
  wstream *s;
  uv_timer_t *retry;
  unsigned fails; /* streams in a row that ended before etcd created them */
  bool over;      /* after reset */
};

static void open_stream(megad_etcd_watch *w);

static void on_retry(uv_timer_t *t) { open_stream(t->data); }

static void stream_drop(megad_etcd_watch *w) {
  if (!w->s) return;
  w->s->w = NULL;
  mega_rpc_pending_cancel(w->s->p);
  w->s = NULL;
}

/* The watch cannot go on: tell the caller once, and keep the handle inert. */
static void watch_reset(megad_etcd_watch *w, const char *why) {
  w->over = true;
  stream_drop(w);
  uv_timer_stop(w->retry);
  if (w->cbs.reset) w->cbs.reset(w->cbs.arg, why);
}

/* Hands the events of one answer to the caller; false if the watch was
 * cancelled or reset meanwhile. */
static bool deliver(megad_etcd_watch *w, wstream *s, const Etcdserverpb__WatchResponse *r) {
  for (size_t i = 0; i < r->n_events; i++) {
    const Mvccpb__Event *ev = r->events[i];
    const Mvccpb__KeyValue *kv = ev->kv;
    if (!kv) continue;
    char key[kv->key.len + ETCD_ROOT_LEN + 1];
    etcd_key_unmap(w->e, kv->key.data, kv->key.len, key);
    megad_etcd_kv k = {.key = key, .value = kv->value.data, .value_len = kv->value.len,
                       .create_revision = kv->create_revision, .mod_revision = kv->mod_revision,
                       .version = kv->version, .lease = kv->lease};
    w->next_rev = kv->mod_revision + 1;
    if (w->cbs.event)
      w->cbs.event(w->cbs.arg,
                   ev->type == MVCCPB__EVENT__EVENT_TYPE__DELETE ? MEGAD_ETCD_EV_DELETE
                                                                 : MEGAD_ETCD_EV_PUT,
                   &k);
    if (s->w != w || w->over) return false;
  }
  return true;
}

static void on_item(void *arg, ProtobufCMessage *msg) {
  wstream *s = arg;
  megad_etcd_watch *w = s->w;
  Etcdserverpb__WatchResponse *r = (Etcdserverpb__WatchResponse *)msg;
  if (!w) {
    protobuf_c_message_free_unpacked(msg, NULL);
    return;
  }
  if (r->created) {
    s->created = true;
    w->fails = 0;
    /* From now: the store's revision when the watch was made is where a
     * resumed stream starts. */
    if (w->next_rev == 0 && r->header) w->next_rev = r->header->revision + 1;
    mega_err ok = {0};
    etcd_note(w->e, &ok);
  }
  if (r->compact_revision > 0 || r->canceled) {
    char why[MEGA_ERR_MSG_MAX];
    if (r->compact_revision > 0)
      snprintf(why, sizeof why,
               "etcd compacted its history up to revision %" PRId64 ", so the watch of %s "
               "cannot resume at %" PRId64,
               r->compact_revision, w->key, w->next_rev);
    else
      snprintf(why, sizeof why, "etcd cancelled the watch of %s: %s", w->key,
               r->cancel_reason && r->cancel_reason[0] ? r->cancel_reason : "no reason given");
    protobuf_c_message_free_unpacked(msg, NULL);
    watch_reset(w, why);
    return;
  }
  /* A progress notification (etcd's own test: no events, not created,
   * cancelled or compacted): every event up to its revision was sent. */
  if (!r->created && r->n_events == 0 && r->header && r->header->revision >= w->next_rev)
    w->next_rev = r->header->revision + 1;
  deliver(w, s, r);
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void on_end(void *arg, const mega_err *err) {
  wstream *s = arg;
  megad_etcd_watch *w = s->w;
  bool created = s->created;
  size_t ep = s->ep;
  free(s);
  if (!w) return;
  w->s = NULL;
  megad_etcd *e = w->e;
  etcd_endpoint_failed(e, ep); /* a watch only ends when something broke */
  if (etcd_err_token(e, err)) etcd_auth_refresh(e, NULL, NULL); /* the retry has it */
  if (!created) {
    w->fails++;
    if (w->fails >= e->nep) etcd_note(e, err);
  }
  /* Straight back if the stream was up (another member takes it); with a
   * growing pause while none accepts it. */
  unsigned delay = created ? 0 : (w->fails < 10 ? 100 * w->fails : 1000);
  if (delay) uv_timer_start(w->retry, on_retry, delay, 0);
  else open_stream(w);
}

static void open_stream(megad_etcd_watch *w) {
  megad_etcd *e = w->e;
  wstream *s = calloc(1, sizeof *s);
  if (!s) {
    uv_timer_start(w->retry, on_retry, 1000, 0);
    return;
  }
  s->w = w;
  s->ep = e->cur;
  Etcdserverpb__WatchCreateRequest c = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
  c.key = (ProtobufCBinaryData){strlen(w->key), (uint8_t *)w->key};
  c.range_end = (ProtobufCBinaryData){w->end_len, (uint8_t *)w->end};
  c.start_revision = w->next_rev;
  c.progress_notify = true;
  Etcdserverpb__WatchRequest r = ETCDSERVERPB__WATCH_REQUEST__INIT;
  r.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
  r.create_request = &c;
  mega_err err = {0};
  if (mega_rpc_stream_async(e->chans[s->ep], e->b->cq, &etcd_watch_watch, &r.base, 0, on_item,
                            on_end, s, &s->p, &err) != MEGA_OK) {
    free(s);
    etcd_endpoint_failed(e, e->cur);
    uv_timer_start(w->retry, on_retry, 500, 0);
    return;
  }
  w->s = s;
}

mega_status megad_etcd_watch_start(megad_etcd *e, const char *prefix, int64_t start_rev,
                                   const megad_etcd_watch_cbs *cbs, megad_etcd_watch **out,
                                   mega_err *err) {
  return megad_etcd_watch_range(e, prefix, NULL, start_rev, cbs, out, err);
}

mega_status megad_etcd_watch_range(megad_etcd *e, const char *key, const char *end,
                                   int64_t start_rev, const megad_etcd_watch_cbs *cbs,
                                   megad_etcd_watch **out, mega_err *err) {
  *out = NULL;
  mega_status closing = etcd_closing(e, "an etcd watch", err);
  if (closing != MEGA_OK) return closing;
  if (!key || !key[0])
    return mega_fail(err, MEGA_ERR_INVALID, "an etcd watch needs a key prefix");
  if (end && strcmp(end, key) <= 0)
    return mega_fail(err, MEGA_ERR_INVALID, "an etcd watch's range [%s, %s) is empty", key, end);
  if (start_rev < 0)
    return mega_fail(err, MEGA_ERR_INVALID, "an etcd watch cannot start at revision %" PRId64,
                     start_rev);
  char mapped[etcd_key_mapped_len(e, key) + 1];
  etcd_key_map(e, key, mapped);
  key = mapped;
  char mapped_end[end ? etcd_key_mapped_len(e, end) + 1 : 1];
  if (end) etcd_key_map(e, end, mapped_end);
  size_t end_cap = (end ? strlen(mapped_end) : strlen(key)) + 1;
  megad_etcd_watch *w = calloc(1, sizeof *w);
  if (!w || !(w->key = strdup(key)) || !(w->end = malloc(end_cap)) ||
      !(w->retry = etcd_timer_new(e, w))) {
    if (w) {
      free(w->key);
      free(w->end);
      free(w);
    }
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  if (end) {
    w->end_len = strlen(mapped_end);
    memcpy(w->end, mapped_end, w->end_len + 1);
  } else {
    etcd_prefix_end(key, w->end, &w->end_len);
  }
  w->e = e;
  w->cbs = *cbs;
  w->next_rev = start_rev;
  w->next = e->watches;
  if (e->watches) e->watches->prev = w;
  e->watches = w;
  open_stream(w);
  *out = w;
  return MEGA_OK;
}

void etcd_watch_free(megad_etcd_watch *w) {
  megad_etcd *e = w->e;
  if (w->prev) w->prev->next = w->next;
  else e->watches = w->next;
  if (w->next) w->next->prev = w->prev;
  stream_drop(w);
  etcd_timer_free(w->retry);
  free(w->key);
  free(w->end);
  free(w);
}

void megad_etcd_watch_cancel(megad_etcd_watch *w) {
  if (w) etcd_watch_free(w);
}
