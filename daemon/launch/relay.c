/* What a node relays between its workers and a job's coordinator: step
 * reports and worker events (batched into Peer ReportStep when the
 * coordinator is another node), and the workers' KV requests. */
#include <stdlib.h>
#include <string.h>

#include "daemon/launch/launch_internal.h"
#include "daemon/model/util.h"

/* ---- reports to the coordinator ---- */

static bool queue_push(void ***v, size_t *n, void *item) {
  void **nv = realloc(*v, (*n + 1) * sizeof *nv);
  if (!nv) return false;
  nv[(*n)++] = item;
  *v = nv;
  return true;
}

void relay_step(megad_launch *l, const Mega__V1__StepReport *r) {
  megad_launcher *L = l->L;
  L->steps_relayed++;
  if (l->coord_local) {
    if (L->cbs.step) L->cbs.step(L->cbs.arg, l->req->job_id, l->req->attempt, L->b->node_id, r);
    return;
  }
  if (l->coord_gone) { /* a last step as its ranks stop: for the next coordinator */
    if (l->orphaned) resend_orphan_step(l, r);
    return;
  }
  resend_keep(l, r);
  ProtobufCMessage *c = megad_pb_copy(&r->base);
  if (c && !queue_push((void ***)&l->steps, &l->nsteps, c)) protobuf_c_message_free_unpacked(c, NULL);
  relay_flush(l);
}

void relay_event(megad_launch *l, megad_worker *w, Mega__V1__RankEvent *ev) {
  megad_launcher *L = l->L;
  ev->rank = w->rank;
  ev->time_unix_ms = megad_unix_ms();
  if (l->coord_local) {
    if (L->cbs.event) L->cbs.event(L->cbs.arg, l->req->job_id, l->req->attempt, L->b->node_id, ev);
    return;
  }
  if (l->coord_gone) return;
  ProtobufCMessage *c = megad_pb_copy(&ev->base);
  if (c && !queue_push((void ***)&l->events, &l->nevents, c))
    protobuf_c_message_free_unpacked(c, NULL);
  relay_flush(l);
}

typedef struct report_ctx {
  megad_launch *l;
  Mega__V1__StepReport **steps;
  size_t nsteps;
  Mega__V1__RankEvent **events;
  size_t nevents;
  uint64_t upto; /* the last kept seq in the batch (resend.c) */
} report_ctx;

static void free_batch(report_ctx *c) {
  for (size_t i = 0; i < c->nsteps; i++) protobuf_c_message_free_unpacked(&c->steps[i]->base, NULL);
  for (size_t i = 0; i < c->nevents; i++)
    protobuf_c_message_free_unpacked(&c->events[i]->base, NULL);
  free(c->steps);
  free(c->events);
  free(c);
}

/* Puts an unsent batch back in front of what queued meanwhile. */
static void requeue(megad_launch *l, report_ctx *c) {
  void **s = realloc(c->steps, (c->nsteps + l->nsteps) * sizeof *s + 1);
  void **e = s ? realloc(c->events, (c->nevents + l->nevents) * sizeof *e + 1) : NULL;
  if (!s || !e) {
    if (s) c->steps = (Mega__V1__StepReport **)s;
    free_batch(c);
    return;
  }
  if (l->nsteps) memcpy(s + c->nsteps, l->steps, l->nsteps * sizeof *s); /* may be NULL */
  if (l->nevents) memcpy(e + c->nevents, l->events, l->nevents * sizeof *e);
  free(l->steps);
  free(l->events);
  l->steps = (Mega__V1__StepReport **)s;
  l->nsteps += c->nsteps;
  l->events = (Mega__V1__RankEvent **)e;
  l->nevents += c->nevents;
  free(c);
}

static void on_retry(uv_timer_t *t) { relay_flush(t->data); }

static void reported(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  report_ctx *c = arg;
  megad_launch *l = c->l;
  megad_launcher *L = l->L;
  l->sending = false;
  l->refs--;
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  if (err->status == MEGA_OK || l->coord_gone || L->b->stopping) {
    if (err->status == MEGA_OK) resend_acked(l, c->upto);
    free_batch(c);
  } else if (err->status == MEGA_ERR_NOT_FOUND || err->status == MEGA_ERR_INVALID) {
    /* the coordinator does not run this attempt (it is over, or the
     * coordinator restarted): a stale attempt does no harm */
    free_batch(c);
    megad_warn(L->b, "job %s attempt %u: the coordinator refused our report: %s",
               l->req->job_id, l->req->attempt, err->msg);
    megad_launch_abort(L, l->req->job_id, l->req->attempt, false,
                       "the coordinator no longer runs this attempt", MEGAD_ABORT_GRACE_MS);
    l->coord_gone = true;
  } else {
    requeue(l, c);
    uv_timer_start(&l->retry_timer, on_retry, 500, 0);
    launch_maybe_free(l);
    return;
  }
  relay_flush(l);
  launch_maybe_free(l);
}

void relay_flush(megad_launch *l) {
  megad_launcher *L = l->L;
  if (l->coord_gone) launch_free_queue(l); /* nobody to tell */
  if (l->sending || (!l->nsteps && !l->nevents && !l->probe)) return;
  l->probe = false;
  report_ctx *c = calloc(1, sizeof *c);
  if (!c) return;
  c->l = l;
  c->upto = l->kept.next_seq; /* reports are kept and queued in the same order */
  c->steps = l->steps;
  c->nsteps = l->nsteps;
  c->events = l->events;
  c->nevents = l->nevents;
  l->steps = NULL;
  l->events = NULL;
  l->nsteps = l->nevents = 0;
  Mega__V1__ReportStepRequest req = MEGA__V1__REPORT_STEP_REQUEST__INIT;
  req.job_id = l->req->job_id;
  req.attempt = l->req->attempt;
  req.node_id = L->b->node_id;
  req.steps = c->steps;
  req.n_steps = c->nsteps;
  req.events = c->events;
  req.n_events = c->nevents;
  mega_err e = {0};
  if (megad_call(L->b, l->req->coordinator_address, &mega_peer_report_step, &req.base, 5000,
                 reported, c, &e) != MEGA_OK) {
    requeue(l, c);
    uv_timer_start(&l->retry_timer, on_retry, 500, 0);
    return;
  }
  l->sending = true;
  l->refs++;
}

void relay_probe(megad_launch *l) {
  if (l->coord_local || l->coord_gone || l->released) return;
  l->probe = true; /* an empty report: refused, it stops the attempt here */
  relay_flush(l);
}

/* ---- KV requests of workers ---- */

static void kvop_unlink(kvop *op) {
  if (!op->w) return;
  for (kvop **p = &op->w->ops; *p; p = &(*p)->next)
    if (*p == op) {
      *p = op->next;
      break;
    }
  op->w = NULL;
}

static void kvop_free(kvop *op) {
  free(op->get_key);
  megad_kv_gather_keys_free(op->keys, op->nkeys);
  free(op->part);
  free(op);
}

static void kvop_end(kvop *op) {
  megad_launch *l = op->l;
  kvop_unlink(op);
  kvop_free(op);
  l->refs--;
  launch_maybe_free(l);
}

static kvop *kvop_new(megad_worker *w, uint64_t id) {
  kvop *op = calloc(1, sizeof *op);
  if (!op) return NULL;
  op->w = w;
  op->l = w->l;
  op->request_id = id;
  op->next = w->ops;
  w->ops = op;
  w->l->refs++;
  return op;
}

/* A gather served here, its keys all there: the values (or why not). */
static void local_gather_answer(kvop *op) {
  ProtobufCBinaryData *v = calloc(op->nkeys ? op->nkeys : 1, sizeof *v);
  mega_err e = {0};
  if (!v)
    launch_send_kv_response(op->w, op->request_id, false, NULL, 0, "megad is out of memory");
  else if (megad_kv_gather_values(op->l->L->kvs, op->keys, op->nkeys, op->parts, op->part, v,
                                  &e) != MEGA_OK)
    launch_send_kv_response(op->w, op->request_id, false, NULL, 0, e.msg);
  else
    launch_send_kv_values(op->w, op->request_id, v, op->nkeys);
  free(v);
}

static void local_wait_done(void *arg, mega_status s, const char *msg) {
  kvop *op = arg;
  op->wait = NULL;
  if (op->keys && s == MEGA_OK) {
    if (op->w) local_gather_answer(op);
    kvop_end(op);
    return;
  }
  const uint8_t *v = NULL;
  size_t len = 0;
  bool found = s == MEGA_OK && op->get_key && mega_kv_get(op->l->L->kvs->kv, op->get_key, &v, &len);
  if (op->w)
    launch_send_kv_response(op->w, op->request_id, found, v, len, s == MEGA_OK ? NULL : msg);
  kvop_end(op);
}

/* A wait here for keys (a get's one key when get_key), answered by
 * local_wait_done. */
static void local_wait(megad_worker *w, uint64_t id, char *const *keys, size_t n,
                       uint32_t timeout_ms, const char *get_key) {
  megad_launcher *L = w->l->L;
  kvop *op = kvop_new(w, id);
  if (!op || (get_key && !(op->get_key = strdup(get_key)))) {
    if (op) kvop_end(op);
    launch_send_kv_response(w, id, false, NULL, 0, "megad is out of memory");
    return;
  }
  int t = timeout_ms ? (int)timeout_ms : (int)L->o.rendezvous_timeout_ms;
  megad_kvwait *kw = megad_kvwait_start(L->kvs, keys, n, t, local_wait_done, op);
  if (kw) op->wait = kw; /* else answered already, op is gone */
}

/* A gather here: its values once its keys exist. */
static void local_gather(megad_worker *w, uint64_t id, const Mega__V1__KvGatherRequest *g) {
  megad_launcher *L = w->l->L;
  mega_err e = {0};
  if (megad_kv_gather_check(g, &e) != MEGA_OK || megad_kv_gather_set(L->kvs, g, &e) != MEGA_OK) {
    launch_send_kv_response(w, id, false, NULL, 0, e.msg);
    return;
  }
  kvop *op = kvop_new(w, id);
  if (op) {
    op->nkeys = g->n_keys;
    op->parts = g->parts;
    op->keys = megad_kv_gather_keys(g);
    op->part = g->n_part ? malloc(g->n_part * sizeof *op->part) : NULL;
    if (op->part) memcpy(op->part, g->part, g->n_part * sizeof *op->part);
  }
  if (!op || !op->keys || (g->n_part && !op->part)) {
    if (op) kvop_end(op);
    launch_send_kv_response(w, id, false, NULL, 0, "megad is out of memory");
    return;
  }
  int t = g->timeout_ms ? (int)g->timeout_ms : (int)L->o.rendezvous_timeout_ms;
  megad_kvwait *kw = megad_kvwait_start(L->kvs, op->keys, op->nkeys, t, local_wait_done, op);
  if (kw) op->wait = kw; /* else answered already, op is gone */
}

static void forwarded(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  kvop *op = arg;
  if (op->w) {
    if (err->status != MEGA_OK) {
      launch_send_kv_response(op->w, op->request_id, false, NULL, 0, err->msg);
    } else if (resp->descriptor == &mega__v1__kv_get_response__descriptor) {
      Mega__V1__KvGetResponse *g = (void *)resp;
      launch_send_kv_response(op->w, op->request_id, g->found, g->value.data, g->value.len, NULL);
    } else if (resp->descriptor == &mega__v1__kv_gather_response__descriptor) {
      Mega__V1__KvGatherResponse *g = (void *)resp;
      launch_send_kv_values(op->w, op->request_id, g->values, g->n_values);
    } else {
      launch_send_kv_response(op->w, op->request_id, false, NULL, 0, NULL);
    }
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  kvop_end(op);
}

/* A request of a group that lives on this node (here) is served from this
 * node's store as the coordinator's own ranks' are; the launch's end clears
 * the attempt's keys. */
void relay_kv(megad_worker *w, const Mega__V1__KvRequest *req) {
  megad_launch *l = w->l;
  megad_launcher *L = l->L;
  mega_kv *kv = L->kvs->kv;
  uint64_t id = req->request_id;
  if (l->coord_local || req->here) {
    mega_err e = {0};
    switch (req->op_case) {
    case MEGA__V1__KV_REQUEST__OP_SET:
      if (mega_kv_set(kv, req->set->key, req->set->value.data, req->set->value.len, &e) != MEGA_OK)
        launch_send_kv_response(w, id, false, NULL, 0, e.msg);
      else
        launch_send_kv_response(w, id, false, NULL, 0, NULL);
      return;
    case MEGA__V1__KV_REQUEST__OP_GET: {
      const uint8_t *v = NULL;
      size_t len = 0;
      bool found = mega_kv_get(kv, req->get->key, &v, &len);
      if (!found && req->get->wait_ms)
        local_wait(w, id, &req->get->key, 1, req->get->wait_ms, req->get->key);
      else
        launch_send_kv_response(w, id, found, v, len, NULL);
      return;
    }
    case MEGA__V1__KV_REQUEST__OP_WAIT:
      local_wait(w, id, req->wait->keys, req->wait->n_keys, req->wait->timeout_ms, NULL);
      return;
    case MEGA__V1__KV_REQUEST__OP_GATHER:
      local_gather(w, id, req->gather);
      return;
    default:
      launch_send_kv_response(w, id, false, NULL, 0, "an empty key-value request");
      return;
    }
  }
  /* Forward to the coordinator's Peer Kv*. */
  kvop *op = kvop_new(w, id);
  if (!op) {
    launch_send_kv_response(w, id, false, NULL, 0, "megad is out of memory");
    return;
  }
  const mega_rpc_method *m;
  const ProtobufCMessage *fwd;
  unsigned timeout = 10000;
  switch (req->op_case) {
  case MEGA__V1__KV_REQUEST__OP_SET: m = &mega_peer_kv_set; fwd = &req->set->base; break;
  case MEGA__V1__KV_REQUEST__OP_GET:
    m = &mega_peer_kv_get;
    fwd = &req->get->base;
    if (req->get->wait_ms) timeout = req->get->wait_ms + 5000;
    break;
  case MEGA__V1__KV_REQUEST__OP_WAIT:
    m = &mega_peer_kv_wait;
    fwd = &req->wait->base;
    timeout = (req->wait->timeout_ms ? req->wait->timeout_ms : L->o.rendezvous_timeout_ms) + 5000;
    break;
  case MEGA__V1__KV_REQUEST__OP_GATHER:
    m = &mega_peer_kv_gather;
    fwd = &req->gather->base;
    timeout =
        (req->gather->timeout_ms ? req->gather->timeout_ms : L->o.rendezvous_timeout_ms) + 5000;
    break;
  default:
    launch_send_kv_response(w, id, false, NULL, 0, "an empty key-value request");
    kvop_end(op);
    return;
  }
  mega_err e = {0};
  if (megad_call(L->b, l->req->coordinator_address, m, fwd, timeout, forwarded, op, &e) != MEGA_OK) {
    launch_send_kv_response(w, id, false, NULL, 0, e.msg);
    kvop_end(op);
  }
}


void relay_worker_gone(megad_worker *w) {
  for (kvop *op = w->ops, *next; op; op = next) {
    next = op->next;
    megad_kvwait *kw = op->wait;
    op->wait = NULL;
    kvop_unlink(op);
    if (kw) {
      megad_kvwait_cancel(kw); /* its callback will not come: end the op here */
      op->l->refs--;
      kvop_free(op);
    }
  }
}
