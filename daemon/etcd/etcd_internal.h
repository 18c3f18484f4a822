/* Inside the etcd client, files stacked, each calling only those below it:
 *
 *   etcd.c           the client's state, open and free, the layers' calls
 *   etcd_session.c   the session's lease and keepalives; and
 *   etcd_watch.c     watches
 *   etcd_call.c      unary calls that fail over between endpoints; keys,
 *                    timers and the closing check the files above share
 *   etcd_auth.c      the endpoints' channels, TLS, authentication
 *   etcd_endpoints.c which endpoint calls go to, and megad_etcd_ok's note
 *
 * Not for the rest of megad (etcd.h is the contract). */
#ifndef MEGA_DAEMON_ETCD_INTERNAL_H
#define MEGA_DAEMON_ETCD_INTERNAL_H

#include "daemon/etcd/etcd.h"
#include "proto/etcd_rpc.h"
#include "proto/rpc_client.h"

typedef struct etcd_call etcd_call;
typedef struct etcd_session etcd_session;

typedef struct etcd_auth_wait etcd_auth_wait;

struct megad_etcd {
  megad_base *b;
  char **eps;             /* "127.0.0.1:2379" */
  mega_rpc_channel **chans; /* TLS as opts say; with a user, each call carries the token */
  size_t nep, cur;        /* calls go to eps[cur] */
  char *eps_text;         /* "127.0.0.1:2379,127.0.0.1:22379", for messages */
  unsigned timeout_ms;
  bool ok;
  bool closing;           /* megad_etcd_free began: nothing new starts (etcd_closing) */
  char why[MEGA_ERR_MSG_MAX + 600]; /* "etcd unreachable at EPS: " + an error */
  etcd_call *calls;       /* unary calls in flight */
  etcd_session *session;
  megad_etcd_watch *watches;
  /* keys (etcd.h): MEGAD_ETCD_ROOT in the layers' keys is prefix in etcd's */
  char *prefix;
  size_t prefix_len;
  /* TLS and authentication (etcd_auth.c) */
  mega_rpc_auth tls;      /* tls_ca, tls_cert, tls_key: owned copies; token unused */
  char *user, *password;  /* NULL: no authentication */
  char *token;            /* the last token etcd gave; NULL before */
  bool authing;           /* an Authenticate in flight: */
  void *auth_inflight;    /* etcd_auth.c's record of it */
  uint64_t authed_ms;     /* when the token came */
  etcd_auth_wait *auth_waits; /* calls to send again once it has */
};

#define ETCD_ROOT_LEN (sizeof MEGAD_ETCD_ROOT - 1)

/* A layer's key under etcd's prefix: its length, and the key itself into
 * out (etcd_key_mapped_len + 1 bytes). Keys outside the root are kept. */
size_t etcd_key_mapped_len(const megad_etcd *e, const char *key);
void etcd_key_map(const megad_etcd *e, const char *key, char *out);
/* Back: etcd's key (len bytes) under the root, NUL-terminated, into out
 * (len + ETCD_ROOT_LEN + 1 bytes); its length. */
size_t etcd_key_unmap(const megad_etcd *e, const uint8_t *key, size_t len, char *out);

/* etcd_endpoints.c */
/* Whether err is one another member may not have: unreachable, timed out,
 * no leader (etcd answers UNAVAILABLE for that). */
bool etcd_err_failover(const mega_err *err);
/* Moves the client off endpoint ep (if it is still the current one). */
void etcd_endpoint_failed(megad_etcd *e, size_t ep);
/* Records the outcome of an exchange with etcd for megad_etcd_ok. */
void etcd_note(megad_etcd *e, const mega_err *err);

/* etcd_auth.c */
/* (Re)makes every endpoint's channel: TLS as configured, hasleader, and
 * the token when there is one. Calls in flight keep their old channel. */
mega_status etcd_channels_build(megad_etcd *e, mega_err *err);
/* Authenticates with the user and password, blocking (at open). */
mega_status etcd_auth_sync(megad_etcd *e, mega_err *err);
/* Whether err is etcd refusing this client's token (it must authenticate
 * again); false without a user. */
bool etcd_err_token(const megad_etcd *e, const mega_err *err);
/* Authenticates again (once at a time), then calls fn with how that went;
 * fn may be NULL (a watch or keepalive that will try again on its own). */
void etcd_auth_refresh(megad_etcd *e, void (*fn)(void *arg, const mega_err *err), void *arg);
/* Says in err what a refusal means for this client: authentication on and
 * no user given, or a user without the rights on the prefix. */
void etcd_explain(const megad_etcd *e, mega_err *err);
void etcd_auth_free(megad_etcd *e); /* the waiters' fn run with MEGA_ERR_CANCELLED */

/* etcd_call.c */
/* MEGA_OK, or MEGA_ERR_CANCELLED once megad_etcd_free began: the callbacks
 * it runs (cancelled calls' done) may not start what, which would outlive
 * the client. */
mega_status etcd_closing(const megad_etcd *e, const char *what, mega_err *err);

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
