/* Calls about a job that another node coordinates go to that node: every
 * megad answers GetJob, WatchJob and the rest for any job of the cluster. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/util.h"
#include "daemon/services/services.h"

typedef struct fwd {
  megad_services *s;
  mega_rpc_call *call; /* NULL once the client went away */
  mega_rpc_pending *pending;
  megad_forward_fallback fallback;
  bool got_item; /* a stream relayed something */
  char job_id[128], owner[MEGAD_NODE_NAME_MAX + 1], address[256];
} fwd;

/* ---- coordinators that did not answer ---- */

enum { NUNREACHABLE = sizeof ((megad_services *)0)->unreachable /
                      sizeof ((megad_services *)0)->unreachable[0] };

int64_t megad_unreachable_since(const megad_services *s, const char *node) {
  for (size_t i = 0; node && i < NUNREACHABLE; i++)
    if (!strcmp(s->unreachable[i].node, node)) return s->unreachable[i].since_ms;
  return 0;
}

static void note_reach(megad_services *s, const char *node, bool reached) {
  size_t slot = NUNREACHABLE, oldest = 0;
  for (size_t i = 0; i < NUNREACHABLE; i++) {
    if (!strcmp(s->unreachable[i].node, node)) slot = i;
    if (s->unreachable[i].since_ms < s->unreachable[oldest].since_ms) oldest = i;
  }
  if (reached) {
    if (slot < NUNREACHABLE) memset(&s->unreachable[slot], 0, sizeof s->unreachable[slot]);
    return;
  }
  if (slot < NUNREACHABLE) return; /* since the first failure */
  snprintf(s->unreachable[oldest].node, sizeof s->unreachable[oldest].node, "%s", node);
  s->unreachable[oldest].since_ms = megad_unix_ms();
}

/* The forward's own call failed to get an answer (as opposed to the
 * coordinator answering with an error). */
static bool no_answer(const mega_err *err) {
  return err->status == MEGA_ERR_IO || err->status == MEGA_ERR_TIMEOUT ||
         (err->status == MEGA_ERR_CANCELLED && !strstr(err->msg, "client went away"));
}

/* The coordinator could not be reached: this node's copy answers, or the
 * call fails ABORTED, naming both nodes (the inner "cannot reach megad at
 * ADDR" would read as the client's own server being down). */
static void unreachable(fwd *f, const mega_err *err) {
  megad_services *s = f->s;
  note_reach(s, f->owner, false);
  if (!f->call) return;
  mega_rpc_call_on_cancel(f->call, NULL, NULL);
  int64_t since = megad_unreachable_since(s, f->owner);
  if (f->fallback && f->fallback(s, f->call, f->job_id, since)) return;
  const char *why = err->msg;
  const char *at = strstr(why, " at ");
  if (!strncmp(why, "cannot reach ", 13) && at && (at = strstr(at, ": "))) why = at + 2;
  mega_rpc_fail(f->call, MEGA_RPC_ABORTED,
                "node %s cannot reach node %s, the coordinator of job %s, at %s (%s); %s",
                s->b->node_id, f->owner, f->job_id, f->address, why,
                s->jobs->etcd ? "a surviving node takes a job over within seconds when its "
                                "coordinator is gone, so ask again"
                              : "ask again when it is back");
}

/* "j-12-n3" is coordinated by n3. */
static const char *coordinator_of(const char *id) {
  if (!id || strncmp(id, "j-", 2)) return NULL;
  const char *p = id + 2;
  if (!isdigit((unsigned char)*p)) return NULL;
  while (isdigit((unsigned char)*p)) p++;
  return *p == '-' && p[1] ? p + 1 : NULL;
}

static void client_gone(mega_rpc_call *call, void *arg) {
  fwd *f = arg;
  f->call = NULL;
  if (f->pending) mega_rpc_pending_cancel(f->pending);
  mega_rpc_fail(call, MEGA_RPC_CANCELLED, "the client went away");
}

static void end_call(fwd *f, const mega_err *err) {
  if (!f->call) return;
  mega_rpc_call_on_cancel(f->call, NULL, NULL);
  mega_rpc_fail_err(f->call, err);
}

static void replied(void *arg, ProtobufCMessage *resp, const mega_err *err) {
  fwd *f = arg;
  if (resp) note_reach(f->s, f->owner, true);
  if (f->call && resp) {
    mega_rpc_call_on_cancel(f->call, NULL, NULL);
    mega_rpc_reply(f->call, resp);
  } else if (!resp && no_answer(err)) {
    unreachable(f, err);
  } else if (!resp) {
    end_call(f, err);
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(f);
}

static void item(void *arg, ProtobufCMessage *msg) {
  fwd *f = arg;
  if (!f->got_item) note_reach(f->s, f->owner, true);
  f->got_item = true;
  if (f->call && mega_rpc_send(f->call, msg, NULL) != MEGA_OK && f->pending)
    mega_rpc_pending_cancel(f->pending);
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void ended(void *arg, const mega_err *err) {
  fwd *f = arg;
  if (f->call && err->status == MEGA_OK) {
    mega_rpc_call_on_cancel(f->call, NULL, NULL);
    mega_rpc_finish(f->call);
  } else if (no_answer(err)) {
    f->fallback = NULL; /* a stream is not answered from a copy: the client asks again */
    unreachable(f, err);
  } else {
    end_call(f, err);
  }
  free(f);
}

bool megad_forward(megad_services *s, mega_rpc_call *call, const char *job_id,
                   const ProtobufCMessage *req, megad_forward_fallback fallback) {
  const char *owner = coordinator_of(job_id);
  const mega_job *mj = megad_jobs_mirror_find(s->jobs, job_id);
  if (mj) { /* etcd mode: whoever holds the coordinator key; none: the mirror answers */
    bool held = mj->etcd.fence && !mj->etcd.orphan && mj->coordinator && mj->coordinator[0];
    owner = held ? mj->coordinator : NULL;
  }
  if (!owner || !strcmp(owner, s->b->node_id)) return false;
  megad_node *n = megad_members_find(s->members, owner);
  if (!n) return false;
  fwd *f = calloc(1, sizeof *f);
  if (!f) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return true;
  }
  *f = (fwd){.s = s, .call = call, .fallback = fallback};
  snprintf(f->job_id, sizeof f->job_id, "%s", job_id);
  snprintf(f->owner, sizeof f->owner, "%s", owner);
  snprintf(f->address, sizeof f->address, "%s", n->address ? n->address : "?");
  const mega_rpc_method *m = mega_rpc_call_method(call);
  if (n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
      n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT) {
    mega_err down = {0};
    mega_fail(&down, MEGA_ERR_IO, "it is %s",
              n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ? "down" : "gone (it left)");
    if (m->kind == MEGA_RPC_SERVER_STREAM) f->fallback = NULL;
    unreachable(f, &down);
    free(f);
    return true;
  }
  mega_err e = {0};
  mega_status st;
  if (m->kind == MEGA_RPC_SERVER_STREAM) {
    st = megad_call_stream(s->b, n->address, m, req, 0, item, ended, f, &f->pending, &e);
  } else {
    int64_t left = mega_rpc_call_remaining_ms(call);
    st = megad_call(s->b, n->address, m, req, left > 0 ? (unsigned)left : 30000, replied, f, &e);
  }
  if (st != MEGA_OK) {
    free(f);
    mega_rpc_fail_err(call, &e);
    return true;
  }
  mega_rpc_call_on_cancel(call, client_gone, f);
  return true;
}
