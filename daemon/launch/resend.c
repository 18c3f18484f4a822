/* Step reports kept for a job's next coordinator. A coordinator that dies
 * takes with it the steps it had not merged yet, and those queued here for
 * it never arrive; in etcd mode another node takes the job over, but it
 * knows only what etcd holds. So a launch keeps the last RESEND_KEEP
 * reports it relayed, acknowledged or not, and when its coordinator is
 * lost they wait (an orphan) until the job's new coordinator is known, who
 * gets them again (Peer ReportStep with resent) and merges what it lacks. */
#include <stdlib.h>
#include <string.h>

#include "daemon/launch/launch_internal.h"
#include "daemon/model/util.h"

#define RESEND_KEEP 256      /* per launch: a few hundred of its ranks' steps */
#define RESEND_WAIT_MS 60000 /* for a new coordinator, then they are dropped */
#define RESEND_RETRY_MS 250  /* a new coordinator that has not adopted the job yet */

struct megad_orphan {
  megad_orphan *next;
  megad_launcher *L; /* NULL: the launcher went while a send was out */
  char *job_id, *old_coord;
  uint32_t attempt, world;
  Mega__V1__StepReport **v;
  size_t n, cap;
  uint64_t expire_ms, next_ms; /* uv_now */
  bool sending;
  bool again; /* asked to go now while a try was out: no retry wait after it */
};

/* ---- what a launch keeps ---- */

static void warn_lost(megad_launch *l) {
  uint64_t n = l->kept.lost;
  if (n & (n - 1)) return; /* the 1st, 2nd, 4th, ... */
  megad_warn(l->L->b,
             "job %s attempt %u: %llu step report%s dropped before the coordinator at %s "
             "acknowledged %s (it is slow or unreachable; the last %d are kept for a new "
             "coordinator): the job's history will miss %s",
             l->req->job_id, l->req->attempt, (unsigned long long)n, n == 1 ? "" : "s",
             l->req->coordinator_address, n == 1 ? "it" : "them", RESEND_KEEP,
             n == 1 ? "that step" : "those steps");
}

uint64_t resend_keep(megad_launch *l, const Mega__V1__StepReport *r) {
  relay_kept *k = &l->kept;
  if (!k->v) {
    k->v = calloc(RESEND_KEEP, sizeof *k->v);
    k->seq = calloc(RESEND_KEEP, sizeof *k->seq);
    if (!k->v || !k->seq) {
      free(k->v);
      free(k->seq);
      k->v = NULL;
      k->seq = NULL;
      return ++k->next_seq;
    }
  }
  Mega__V1__StepReport *c = (Mega__V1__StepReport *)megad_pb_copy(&r->base);
  uint64_t seq = ++k->next_seq;
  if (!c) return seq;
  if (k->n == RESEND_KEEP) { /* the oldest goes */
    if (k->seq[k->head] > k->acked_seq) {
      k->lost++;
      l->L->steps_lost++;
      warn_lost(l);
    }
    protobuf_c_message_free_unpacked(&k->v[k->head]->base, NULL);
    k->head = (k->head + 1) % RESEND_KEEP;
    k->n--;
  }
  size_t at = (k->head + k->n++) % RESEND_KEEP;
  k->v[at] = c;
  k->seq[at] = seq;
  return seq;
}

void resend_acked(megad_launch *l, uint64_t upto) {
  if (upto > l->kept.acked_seq) l->kept.acked_seq = upto;
}

void resend_free_kept(megad_launch *l) {
  relay_kept *k = &l->kept;
  for (size_t i = 0; i < k->n; i++)
    protobuf_c_message_free_unpacked(&k->v[(k->head + i) % RESEND_KEEP]->base, NULL);
  free(k->v);
  free(k->seq);
  memset(k, 0, sizeof *k);
}

/* ---- orphans: kept steps waiting for a new coordinator ---- */

static void orphan_free(megad_orphan *o) {
  for (size_t i = 0; i < o->n; i++) protobuf_c_message_free_unpacked(&o->v[i]->base, NULL);
  free(o->v);
  free(o->job_id);
  free(o->old_coord);
  free(o);
}

static void orphan_unlink(megad_orphan *o) {
  for (megad_orphan **p = &o->L->orphans; *p; p = &(*p)->next)
    if (*p == o) {
      *p = o->next;
      return;
    }
}

/* l's orphan not being sent (steps join it), or a new one; NULL: no memory. */
static megad_orphan *orphan_of(megad_launch *l) {
  megad_launcher *L = l->L;
  for (megad_orphan *o = L->orphans; o; o = o->next)
    if (!o->sending && o->attempt == l->req->attempt && !strcmp(o->job_id, l->req->job_id) &&
        !strcmp(o->old_coord, l->req->coordinator_node_id))
      return o;
  megad_orphan *o = calloc(1, sizeof *o);
  if (!o || !(o->job_id = megad_strdup(l->req->job_id)) ||
      !(o->old_coord = megad_strdup(l->req->coordinator_node_id))) {
    if (o) free(o->job_id);
    free(o);
    return NULL;
  }
  o->L = L;
  o->attempt = l->req->attempt;
  o->world = l->req->world_size;
  o->expire_ms = uv_now(L->b->loop) + RESEND_WAIT_MS;
  o->next = L->orphans;
  L->orphans = o;
  return o;
}

/* Takes r (owned) into o; false: no memory (r is freed). */
static bool orphan_take(megad_orphan *o, Mega__V1__StepReport *r) {
  if (o->n == o->cap) {
    size_t cap = o->cap ? 2 * o->cap : 64;
    Mega__V1__StepReport **v = realloc(o->v, cap * sizeof *v);
    if (!v) {
      protobuf_c_message_free_unpacked(&r->base, NULL);
      return false;
    }
    o->v = v;
    o->cap = cap;
  }
  o->v[o->n++] = r;
  return true;
}

void resend_orphan(megad_launch *l) {
  relay_kept *k = &l->kept;
  l->orphaned = true;
  if (!k->n) return;
  megad_orphan *o = orphan_of(l);
  for (size_t i = 0; i < k->n; i++) {
    Mega__V1__StepReport *r = k->v[(k->head + i) % RESEND_KEEP];
    if (!o || !orphan_take(o, r)) protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  k->n = 0;
  k->head = 0;
}

void resend_orphan_step(megad_launch *l, const Mega__V1__StepReport *r) {
  megad_orphan *o = orphan_of(l);
  Mega__V1__StepReport *c = o ? (Mega__V1__StepReport *)megad_pb_copy(&r->base) : NULL;
  if (c) orphan_take(o, c);
}

/* ---- sending them to the new coordinator ---- */

static const struct megad_launch_moved *moved_of(const megad_launcher *L, const char *job_id) {
  for (size_t i = 0; i < sizeof L->moved / sizeof L->moved[0]; i++)
    if (L->moved[i].job_id[0] && !strcmp(L->moved[i].job_id, job_id)) return &L->moved[i];
  return NULL;
}

/* The answer for o: done, not yet (retry), or never. */
static void orphan_answer(megad_orphan *o, const char *to, const mega_err *err) {
  megad_launcher *L = o->L;
  o->sending = false;
  if (err->status == MEGA_OK) {
    megad_log(L->b, "job %s attempt %u: sent %zu kept step report%s to its new coordinator %s",
              o->job_id, o->attempt, o->n, o->n == 1 ? "" : "s", to);
  } else if (err->status != MEGA_ERR_INVALID && err->status != MEGA_ERR_CANCELLED &&
             !L->b->stopping) {
    o->next_ms = o->again ? 0 : uv_now(L->b->loop) + RESEND_RETRY_MS; /* until it expires */
    o->again = false;
    return;
  } else {
    megad_warn(L->b, "job %s attempt %u: its new coordinator %s refused %zu kept step "
               "report%s: %s", o->job_id, o->attempt, to, o->n, o->n == 1 ? "" : "s", err->msg);
  }
  orphan_unlink(o);
  orphan_free(o);
}

typedef struct send_ctx {
  megad_orphan *o;
  char to[64];
} send_ctx;

static void sent(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  send_ctx *x = arg;
  megad_orphan *o = x->o;
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  megad_launcher *L = o->L;
  bool again = o->again;
  if (!L) orphan_free(o); /* the launcher is gone */
  else orphan_answer(o, x->to, err);
  if (L && again) resend_tick(L); /* here, not inside resend_tick's own loop */
  free(x);
}

static void orphan_send(megad_orphan *o, const struct megad_launch_moved *m) {
  megad_launcher *L = o->L;
  mega_err e = {0};
  o->sending = true;
  if (!strcmp(m->node_id, L->b->node_id)) { /* this node took the job over */
    if (!L->cbs.resent) mega_fail(&e, MEGA_ERR_INVALID, "node %s runs no coordinator", m->node_id);
    else L->cbs.resent(L->cbs.arg, o->job_id, o->attempt, o->world, L->b->node_id, o->v, o->n, &e);
    orphan_answer(o, m->node_id, &e);
    return;
  }
  send_ctx *x = calloc(1, sizeof *x);
  if (!x) {
    o->sending = false;
    return;
  }
  x->o = o;
  snprintf(x->to, sizeof x->to, "%s", m->node_id);
  Mega__V1__ReportStepRequest req = MEGA__V1__REPORT_STEP_REQUEST__INIT;
  req.job_id = o->job_id;
  req.attempt = o->attempt;
  req.node_id = L->b->node_id;
  req.steps = o->v;
  req.n_steps = o->n;
  req.resent = true;
  req.world_size = o->world;
  if (megad_call(L->b, m->address, &mega_peer_report_step, &req.base, 5000, sent, x, &e) !=
      MEGA_OK) {
    free(x);
    o->sending = false;
    o->next_ms = uv_now(L->b->loop) + RESEND_RETRY_MS;
  }
}

void resend_tick(megad_launcher *L) {
  uint64_t now = uv_now(L->b->loop);
  for (megad_orphan *o = L->orphans, *next; o; o = next) {
    next = o->next;
    if (o->sending || now < o->next_ms) continue;
    const struct megad_launch_moved *m = moved_of(L, o->job_id);
    if (m && (strcmp(m->node_id, o->old_coord) || (m->asked && m->attempt == o->attempt))) {
      orphan_send(o, m); /* may free o */
    } else if (now >= o->expire_ms) {
      megad_warn(L->b, "job %s attempt %u: no new coordinator took the job over within %d s; "
                 "dropping %zu kept step report%s (the job's history misses them)", o->job_id,
                 o->attempt, RESEND_WAIT_MS / 1000, o->n, o->n == 1 ? "" : "s");
      orphan_unlink(o);
      orphan_free(o);
    }
  }
}

/* Where job_id's coordinator is now, for jobs with ranks here or steps
 * kept for them (NULL: neither, or no room). */
static struct megad_launch_moved *record_moved(megad_launcher *L, const char *job_id,
                                               const char *node_id, const char *address) {
  bool ours = false;
  for (megad_launch *l = L->launches; l && !ours; l = l->next)
    ours = !strcmp(l->req->job_id, job_id);
  for (megad_orphan *o = L->orphans; o && !ours; o = o->next) ours = !strcmp(o->job_id, job_id);
  if (!ours || strlen(job_id) >= sizeof L->moved[0].job_id) return NULL;
  struct megad_launch_moved *m = (struct megad_launch_moved *)moved_of(L, job_id);
  if (!m) {
    m = &L->moved[L->moved_next];
    L->moved_next = (L->moved_next + 1) % (sizeof L->moved / sizeof L->moved[0]);
    memset(m, 0, sizeof *m);
  }
  if (strcmp(m->node_id, node_id)) m->asked = false; /* another node's ask */
  snprintf(m->job_id, sizeof m->job_id, "%s", job_id);
  snprintf(m->node_id, sizeof m->node_id, "%s", node_id);
  snprintf(m->address, sizeof m->address, "%s", address);
  return m;
}

void megad_launch_coord_moved(megad_launcher *L, const char *job_id, const char *node_id,
                              const char *address) {
  if (record_moved(L, job_id, node_id, address)) megad_launch_resend_now(L, job_id);
}

void megad_launch_coord_asked(megad_launcher *L, const char *job_id, uint32_t attempt,
                              const char *node_id, const char *address) {
  struct megad_launch_moved *m = record_moved(L, job_id, node_id, address);
  if (m) {
    m->asked = true;
    m->attempt = attempt;
  }
  megad_launch_resend_now(L, job_id);
}

/* A try that came before the new coordinator adopted the job (its claim
 * reaches this node from etcd first; on the node that took the job over,
 * before the claim's answer) was refused and waits RESEND_RETRY_MS: by
 * then the new attempt may have merged steps, or ended, so that live
 * watchers never saw these. */
void megad_launch_resend_now(megad_launcher *L, const char *job_id) {
  for (megad_orphan *o = L->orphans; o; o = o->next) {
    if (strcmp(o->job_id, job_id)) continue;
    if (o->sending) o->again = true;
    else o->next_ms = 0;
  }
  resend_tick(L);
}

void resend_free_all(megad_launcher *L) {
  for (megad_orphan *o = L->orphans, *next; o; o = next) {
    next = o->next;
    if (o->sending) o->L = NULL; /* its answer frees it */
    else orphan_free(o);
  }
  L->orphans = NULL;
}
