/* The web view's live updates (see websse.h). */
#include "daemon/web/websse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/web/webjson.h"

/* ---- what a stream sends (pure) ---- */

/* One event: its data is compact JSON, which holds no newline. Takes doc;
 * false when out of memory. */
static bool event(FILE *f, const char *name, const char *id, json_t *doc) {
  char *s = doc ? json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(7)) : NULL;
  json_decref(doc);
  if (!s) return false;
  fprintf(f, "event: %s\n%s%s%sdata: %s\n\n", name, id ? "id: " : "", id ? id : "", id ? "\n" : "",
          s);
  free(s);
  return true;
}

char *megad_sse_compose(const mega_job *j, megad_sse_cursor *c, uint64_t now_ms, bool ping,
                        size_t *len) {
  *len = 0;
  if (c->ended) return NULL;
  char *p = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&p, &n);
  if (!f) return NULL;
  bool ok = true;
  if (!c->started) fputs("retry: 3000\n\n", f);
  if (!j) {
    ok = event(f, "end", NULL, json_pack("{ss}", "state", "forgotten"));
    c->ended = true;
  } else {
    /* a cursor of another curve (megad restarted, or the job's record was
     * made anew, while the reader was away or even while it listened):
     * the whole curve again, with "reset", which replaces the reader's */
    bool reset = !mega_stepring_knows(&j->hist.curve, c->seq);
    if (j->hist.curve.seq > c->seq || !c->started || reset) {
      /* the first batch is the whole kept curve; later ones are bounded */
      json_t *st = megad_webjson_steps(j, c->seq, c->started && !reset ? MEGAD_SSE_BATCH_MAX
                                                                        : SIZE_MAX);
      if (reset) c->seq = 0;
      json_int_t skipped = json_integer_value(json_object_get(st, "skipped"));
      if (skipped > 0) {
        json_t *first = json_array_get(json_object_get(st, "points"), 0);
        json_int_t to = json_integer_value(json_object_get(first, "seq")) - 1;
        ok &= event(f, "skipped", NULL,
                    json_pack("{sIsIsIss}", "missed", skipped, "from_seq",
                              (json_int_t)c->seq + 1, "to_seq", to, "why",
                              "this stream fell behind; only the newest points follow (the "
                              "older ones are in steps?since=)"));
      }
      char id[24];
      snprintf(id, sizeof id, "%llu", (unsigned long long)j->hist.curve.seq);
      ok &= event(f, "steps", id, st);
      c->seq = j->hist.curve.seq;
    }
    uint64_t v = megad_webjson_job_version(j);
    if (v != c->job_version && (!c->job_version || now_ms - c->job_sent_ms >= MEGAD_SSE_JOB_MS)) {
      ok &= event(f, "job", NULL, megad_webjson_job(j));
      c->job_version = v;
      c->job_sent_ms = now_ms;
    }
    if (mega_job_state_final(j->state) && c->job_version == v) {
      ok &= event(f, "end", NULL, json_pack("{ss}", "state", mega_job_state_name(j->state)));
      c->ended = true;
    }
  }
  c->started = true;
  if (!ftell(f) && ping) fputs(": ping\n\n", f);
  if (fclose(f) || !ok || !n) {
    free(p);
    return NULL;
  }
  *len = n;
  return p;
}

/* ---- the streams ---- */

typedef struct sse_stream {
  struct sse_stream *next, **prev;
  megad_sse *x;
  char *job_id;
  char peer[64]; /* the client's address: its streams are counted */
  megad_sse_cursor c;
  megad_http_stream *hs; /* known from its first pull */
  bool parked;           /* its last pull found nothing */
  bool news, ping;       /* to look at when it next pulls */
  char *buf;             /* the bytes being sent, from off */
  size_t len, off;
  uint64_t sent_ms;      /* when it last got bytes */
} sse_stream;

struct megad_sse {
  uv_loop_t *loop;
  const mega_jobs *t;
  sse_stream *head;
  size_t n;
  uv_timer_t coalesce, ping;
  int open_handles;
};

static void wake_news(uv_timer_t *t);

static bool job_due(const sse_stream *s, const mega_job *j) {
  return j && megad_webjson_job_version(j) != s->c.job_version;
}

static long pull(void *arg, megad_http_stream *hs, char *buf, size_t max) {
  sse_stream *s = arg;
  megad_sse *x = s->x;
  s->hs = hs;
  s->parked = false;
  if (s->off == s->len) {
    free(s->buf);
    s->buf = NULL;
    s->len = s->off = 0;
    if (s->c.ended) return -1;
    const mega_job *j = mega_jobs_table_find(x->t, s->job_id);
    uint64_t now = uv_now(x->loop);
    s->buf = megad_sse_compose(j, &s->c, now, s->ping, &s->len);
    s->ping = false;
    /* a job document held back by the once-a-second rule is news still */
    s->news = job_due(s, j);
    if (s->news && !uv_is_active((uv_handle_t *)&x->coalesce))
      uv_timer_start(&x->coalesce, wake_news, MEGAD_SSE_COALESCE_MS, 0);
    if (!s->buf) {
      s->parked = true;
      return 0;
    }
    s->sent_ms = now;
  }
  size_t n = s->len - s->off < max ? s->len - s->off : max;
  memcpy(buf, s->buf + s->off, n);
  s->off += n;
  return (long)n;
}

static void closed(void *arg) {
  sse_stream *s = arg;
  megad_sse *x = s->x;
  *s->prev = s->next;
  if (s->next) s->next->prev = s->prev;
  if (--x->n == 0) uv_timer_stop(&x->ping);
  free(s->buf);
  free(s->job_id);
  free(s);
}

static void wake_news(uv_timer_t *t) {
  megad_sse *x = t->data;
  for (sse_stream *s = x->head; s; s = s->next)
    if (s->news && s->parked) megad_http_stream_wake(s->hs);
}

static void wake_idle(uv_timer_t *t) {
  megad_sse *x = t->data;
  uint64_t now = uv_now(x->loop);
  for (sse_stream *s = x->head; s; s = s->next)
    if (s->parked && now - s->sent_ms >= MEGAD_SSE_PING_MS - 100) {
      s->ping = true;
      megad_http_stream_wake(s->hs);
    }
}

megad_sse *megad_sse_new(uv_loop_t *loop, const mega_jobs *t) {
  megad_sse *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->loop = loop;
  x->t = t;
  uv_timer_init(loop, &x->coalesce);
  uv_timer_init(loop, &x->ping);
  x->coalesce.data = x->ping.data = x;
  x->open_handles = 2;
  return x;
}

static void handle_closed(uv_handle_t *h) {
  megad_sse *x = h->data;
  if (--x->open_handles == 0) free(x);
}

void megad_sse_free(megad_sse *x) {
  if (!x) return;
  uv_close((uv_handle_t *)&x->coalesce, handle_closed);
  uv_close((uv_handle_t *)&x->ping, handle_closed);
}

void megad_sse_open(megad_sse *x, const mega_job *j, uint64_t since, const char *peer,
                    megad_web_resp *out) {
  char msg[256];
  int n = 0, mine = 0;
  for (sse_stream *s = x->head; s; s = s->next) mine += !strcmp(s->peer, peer);
  if (x->n >= MEGAD_SSE_STREAMS_MAX)
    n = snprintf(msg, sizeof msg,
                 "megad serves at most %d live streams at once; poll "
                 "/api/jobs/%.64s/steps?since=N instead\n",
                 MEGAD_SSE_STREAMS_MAX, j->id);
  else if (mine >= MEGAD_SSE_STREAMS_PER_ADDR)
    n = snprintf(msg, sizeof msg,
                 "megad serves at most %d live streams to one address (%.64s); poll "
                 "/api/jobs/%.64s/steps?since=N instead\n",
                 MEGAD_SSE_STREAMS_PER_ADDR, peer, j->id);
  sse_stream *s = n ? NULL : calloc(1, sizeof *s);
  if (s && !(s->job_id = strdup(j->id))) {
    free(s);
    s = NULL;
  }
  if (!s) {
    if (!n) n = snprintf(msg, sizeof msg, "out of memory\n");
    out->status = 503;
    out->type = "text/plain; charset=utf-8";
    out->body = strdup(msg);
    out->len = out->body ? (size_t)n : 0;
    return;
  }
  s->x = x;
  snprintf(s->peer, sizeof s->peer, "%s", peer);
  s->c.seq = since;
  s->sent_ms = uv_now(x->loop);
  s->next = x->head;
  if (s->next) s->next->prev = &s->next;
  s->prev = &x->head;
  x->head = s;
  if (x->n++ == 0) uv_timer_start(&x->ping, wake_idle, MEGAD_SSE_PING_MS, MEGAD_SSE_PING_MS);
  out->status = 200;
  out->type = "text/event-stream; charset=utf-8";
  out->stream = (megad_http_source){.pull = pull, .closed = closed, .arg = s};
}

void megad_sse_notify(megad_sse *x, const mega_job *j) {
  bool any = false;
  for (sse_stream *s = x->head; s; s = s->next)
    if (!strcmp(s->job_id, j->id)) any = s->news = true;
  if (any && !uv_is_active((uv_handle_t *)&x->coalesce))
    uv_timer_start(&x->coalesce, wake_news, MEGAD_SSE_COALESCE_MS, 0);
}

size_t megad_sse_streams(const megad_sse *x) { return x ? x->n : 0; }
