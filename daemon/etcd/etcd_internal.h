/* Inside the etcd client, files stacked: etcd.c over etcd_session.c and
 * etcd_watch.c over etcd_call.c (the client's state, its endpoints, and
 * unary calls that fail over between endpoints).
 * Not for the rest of megad (etcd.h is the contract). */
#ifndef MEGA_DAEMON_ETCD_INTERNAL_H
#define MEGA_DAEMON_ETCD_INTERNAL_H

#include "daemon/etcd/etcd.h"
#include "proto/etcd_rpc.h"
#include "proto/rpc_client.h"

typedef struct etcd_call etcd_call;
typedef struct etcd_session etcd_session;

struct megad_etcd {
  megad_base *b;
  char **eps;             /* "127.0.0.1:2379" */
  mega_rpc_channel **chans;
  size_t nep, cur;        /* calls go to eps[cur] */
  char *eps_text;         /* "127.0.0.1:2379,127.0.0.1:22379", for messages */
  unsigned timeout_ms;
  bool ok;
  char why[MEGA_ERR_MSG_MAX + 600]; /* "etcd unreachable at EPS: " + an error */
  etcd_call *calls;       /* unary calls in flight */
  etcd_session *session;
  megad_etcd_watch *watches;
};

/* A unary call's raw answer: resp is the callee's (NULL on failure). */
typedef void (*etcd_done_fn)(void *arg, ProtobufCMessage *resp, const mega_err *err);

/* Starts m on the current endpoint; a failure that means "this member is
 * gone or has no leader" retries on the next endpoint, each endpoint once.
 * done runs once, from the loop (or from megad_etcd_free with
 * MEGA_ERR_CANCELLED). On a non-OK return nothing was started. */
mega_status etcd_call_start(megad_etcd *e, const mega_rpc_method *m, const ProtobufCMessage *req,
                            unsigned timeout_ms, etcd_done_fn done, void *arg, etcd_call **out,
                            mega_err *err);
/* Drops a call in flight without calling its done. */
void etcd_call_drop(etcd_call *c);
/* Every call in flight ends: its done runs with MEGA_ERR_CANCELLED. */
void etcd_calls_cancel_all(megad_etcd *e);

/* Whether err is one another member may not have: unreachable, timed out,
 * no leader (etcd answers UNAVAILABLE for that). */
bool etcd_err_failover(const mega_err *err);
/* Moves the client off endpoint ep (if it is still the current one). */
void etcd_endpoint_failed(megad_etcd *e, size_t ep);
/* Records the outcome of an exchange with etcd for megad_etcd_ok. */
void etcd_note(megad_etcd *e, const mega_err *err);

/* key's prefix range end: key with its last byte plus one ("mega/" ->
 * "mega0"); *len 1 and "\0" (every key from key on) when there is none. */
void etcd_prefix_end(const char *key, char *out, size_t *len);

/* A timer on the loop the client can drop at any time (the handle is freed
 * when libuv is done with it). */
uv_timer_t *etcd_timer_new(megad_etcd *e, void *data);
void etcd_timer_free(uv_timer_t *t);

uint64_t etcd_now_ms(const megad_etcd *e);

/* Whether the session's keepalives are answered (and if not, why). */
bool etcd_session_reachable(const etcd_session *s, const char **why);

/* The session and the watches, freed by megad_etcd_free (no callbacks). */
void etcd_session_free(etcd_session *s);
void etcd_watch_free(megad_etcd_watch *w);

#endif
