/* Calls about a job that another node coordinates go to that node: every
 * megad answers GetJob, WatchJob and the rest for any job of the cluster. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/services/services.h"

typedef struct fwd {
  mega_rpc_call *call; /* NULL once the client went away */
  mega_rpc_pending *pending;
} fwd;

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
  if (f->call && resp) {
    mega_rpc_call_on_cancel(f->call, NULL, NULL);
    mega_rpc_reply(f->call, resp);
  } else if (!resp) {
    end_call(f, err);
  }
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  free(f);
}

static void item(void *arg, ProtobufCMessage *msg) {
  fwd *f = arg;
  if (f->call && mega_rpc_send(f->call, msg, NULL) != MEGA_OK && f->pending)
    mega_rpc_pending_cancel(f->pending);
  protobuf_c_message_free_unpacked(msg, NULL);
}

static void ended(void *arg, const mega_err *err) {
  fwd *f = arg;
  if (f->call && err->status == MEGA_OK) {
    mega_rpc_call_on_cancel(f->call, NULL, NULL);
    mega_rpc_finish(f->call);
  } else {
    end_call(f, err);
  }
  free(f);
}

bool megad_forward(megad_services *s, mega_rpc_call *call, const char *job_id,
                   const ProtobufCMessage *req) {
  const char *owner = coordinator_of(job_id);
  const mega_job *mj = megad_jobs_mirror_find(s->jobs, job_id);
  if (mj) { /* etcd mode: whoever holds the coordinator key; none: the mirror answers */
    bool held = mj->etcd.fence && !mj->etcd.orphan && mj->coordinator && mj->coordinator[0];
    owner = held ? mj->coordinator : NULL;
  }
  if (!owner || !strcmp(owner, s->b->node_id)) return false;
  megad_node *n = megad_members_find(s->members, owner);
  if (!n) return false;
  if (n->state == MEGA__V1__NODE_STATE__NODE_STATE_DEAD ||
      n->state == MEGA__V1__NODE_STATE__NODE_STATE_LEFT) {
    mega_rpc_fail(call, MEGA_RPC_UNAVAILABLE,
                  "job %s is coordinated by node %s, which is down; ask again when it is back",
                  job_id, owner);
    return true;
  }
  fwd *f = calloc(1, sizeof *f);
  if (!f) {
    mega_rpc_fail(call, MEGA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    return true;
  }
  f->call = call;
  const mega_rpc_method *m = mega_rpc_call_method(call);
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
