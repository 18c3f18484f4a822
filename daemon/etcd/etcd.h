/* An etcd v3 client on megad's loop.
 *
 * It speaks etcd's own gRPC API (KV, Lease, Watch) through the gRPC core and
 * the completion-queue bridge megad's peer calls already use
 * (proto/rpc_client.h: mega_rpc_unary_async / mega_rpc_stream_async), with
 * protobuf-c code for the subset of etcd's rpc.proto and kv.proto it needs
 * (proto/etcd.proto: same packages, message names and field numbers, the
 * gogoproto and google.api annotations left out).
 *
 * LeaseKeepAlive and Watch are bidirectional streams in etcd; a client that
 * sends one request and half-closes is a server-streaming call on the wire,
 * which is what mega_rpc_stream_async makes: one keepalive answer per call,
 * and a watch stream that stays open (etcd keeps a watch after the client's
 * half-close).
 *
 * Endpoints: "http://127.0.0.1:2379,127.0.0.1:22379" (scheme optional), or
 * https:// with a CA (opts.cacert): TLS, and with a client certificate
 * (opts.cert, opts.key) mutual TLS, which etcd --client-cert-auth asks for
 * (with etcd's authentication on, the certificate's CN is the user). A user
 * and password instead authenticate through etcd's Auth.Authenticate: the
 * token goes with every call, and a token etcd no longer knows (a member
 * restarted, or a call failed over to a member that never issued it: etcd's
 * simple tokens are each member's own) is refreshed by authenticating
 * again, and the refused call sent once more. One channel per endpoint; calls go to the current
 * endpoint, and a call that fails UNAVAILABLE, DEADLINE_EXCEEDED or with
 * etcd's "no leader" moves the client to the next endpoint and is retried
 * there, each endpoint at most once per call. So losing a member of a
 * 3-member cluster costs one timeout at most.
 *
 * On the loop thread only. Callbacks run on the loop thread, never inside the
 * call that started them. Everything handed to a callback is valid only during
 * it. Ownership: the client owns its channels, calls, session and watches;
 * megad_etcd_free cancels them all: the callbacks of calls in flight run
 * with MEGA_ERR_CANCELLED before free returns (a call, watch or session
 * they start then is refused with MEGA_ERR_CANCELLED); session and watch
 * callbacks do not run again. No callback may free the client. The base's
 * queue may close right after free: what was cancelled ends on it. */
#ifndef MEGA_DAEMON_ETCD_H
#define MEGA_DAEMON_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/base.h"

typedef struct megad_etcd megad_etcd;
typedef struct megad_etcd_watch megad_etcd_watch;

/* Keys. The layers above name every key under "mega/" (MEGAD_ETCD_ROOT);
 * the client keeps them under opts.prefix in etcd instead ("teamA/":
 * mega/j/7/0 is teamA/j/7/0 there) and hands keys back under "mega/", in
 * replies and watch events alike. So clusters that share one etcd under
 * other prefixes never see each other's nodes or jobs, and no layer above
 * knows the prefix. A prefix that begins with this one (mega/ and mega/j/)
 * puts its keys among this cluster's (mega/j/j/7/0): the layers take only
 * keys of their own shape. */
#define MEGAD_ETCD_ROOT "mega/"

typedef struct megad_etcd_opts {
  const char *endpoints;  /* "http://host:port,..." (https:// with cacert) */
  unsigned timeout_ms;    /* each call's deadline; 0: 2000 */
  const char *prefix;     /* where the keys live (ends with '/'); NULL: "mega/" */
  /* PEM contents, not paths (copied): */
  const char *cacert;     /* the CA of etcd's certificates: TLS on every endpoint */
  const char *cert, *key; /* this client's certificate and key (mutual TLS) */
  const char *user, *password; /* etcd's authentication; NULL: none (copied) */
} megad_etcd_opts;

typedef struct megad_etcd_kv {
  const char *key; /* NUL-terminated (our keys are text) */
  const uint8_t *value;
  size_t value_len;
  int64_t create_revision, mod_revision, version, lease;
} megad_etcd_kv;

typedef struct megad_etcd_reply {
  int64_t revision;   /* the store's revision when the call was served */
  bool succeeded;     /* txn: whether the compares held */
  const megad_etcd_kv *kvs; /* get; txn: the first GET op of the branch taken */
  size_t nkvs;
  int64_t lease;      /* lease grant: the new lease id */
  int64_t ttl;        /* lease grant: its TTL in seconds */
} megad_etcd_reply;

/* err->status MEGA_OK and r set; or r NULL and err says why, naming the
 * endpoint ("etcd at 127.0.0.1:2379: ..."). */
typedef void (*megad_etcd_cb)(void *arg, const megad_etcd_reply *r, const mega_err *err);

typedef enum { MEGAD_ETCD_CREATE, MEGAD_ETCD_MOD, MEGAD_ETCD_VERSION, MEGAD_ETCD_VALUE } megad_etcd_target;
typedef enum { MEGAD_ETCD_EQUAL, MEGAD_ETCD_NOT_EQUAL, MEGAD_ETCD_LESS, MEGAD_ETCD_GREATER } megad_etcd_result;

typedef struct megad_etcd_cmp {
  const char *key;
  megad_etcd_target target;
  megad_etcd_result result;   /* EQUAL (0) unless set */
  int64_t number;             /* CREATE / MOD revision, VERSION */
  const void *value;          /* VALUE */
  size_t value_len;
} megad_etcd_cmp;

typedef enum { MEGAD_ETCD_PUT, MEGAD_ETCD_GET, MEGAD_ETCD_DELETE } megad_etcd_opkind;

typedef struct megad_etcd_op {
  megad_etcd_opkind kind;
  const char *key;
  bool prefix;                /* GET / DELETE: every key starting with key */
  const void *value;          /* PUT */
  size_t value_len;
  int64_t lease;              /* PUT: 0 for none */
} megad_etcd_op;

/* Makes the client; with a user, authenticates first (a blocking call: before
 * the loop runs), so a wrong password is an error here. */
mega_status megad_etcd_open(megad_base *b, const megad_etcd_opts *o, megad_etcd **out,
                            mega_err *err);
/* megad_etcd_open with endpoints and timeout_ms alone (plaintext, "mega/"). */
mega_status megad_etcd_new(megad_base *b, const char *endpoints, unsigned timeout_ms,
                           megad_etcd **out, mega_err *err);
void megad_etcd_free(megad_etcd *e);

/* Whether the last call reached a member with a leader (and, while a
 * session runs, whether its keepalives are answered), and if not why
 * ("etcd unreachable at 127.0.0.1:2379,...: connection refused"): megad
 * refuses new jobs with this sentence while it is false. */
bool megad_etcd_ok(const megad_etcd *e, const char **why);

/* Whether a failed call may succeed if made again (etcd unreachable, no
 * leader, a deadline) rather than being refused for what it asked. */
bool megad_etcd_retryable(const mega_err *err);

mega_status megad_etcd_get(megad_etcd *e, const char *key, bool prefix, megad_etcd_cb cb,
                           void *arg, mega_err *err);
mega_status megad_etcd_put(megad_etcd *e, const char *key, const void *value, size_t len,
                           int64_t lease, megad_etcd_cb cb, void *arg, mega_err *err);
mega_status megad_etcd_delete(megad_etcd *e, const char *key, bool prefix, megad_etcd_cb cb,
                              void *arg, mega_err *err);
/* if every cmp holds, then[]; else otherwise[]. */
mega_status megad_etcd_txn(megad_etcd *e, const megad_etcd_cmp *cmp, size_t ncmp,
                           const megad_etcd_op *then, size_t nthen,
                           const megad_etcd_op *otherwise, size_t nelse, megad_etcd_cb cb,
                           void *arg, mega_err *err);

/* Blocking get for start-up, before the loop runs (its own completion queue).
 * *out is the caller's: megad_etcd_reply_free. */
mega_status megad_etcd_get_sync(megad_etcd *e, const char *key, bool prefix,
                                megad_etcd_reply **out, mega_err *err);
void megad_etcd_reply_free(megad_etcd_reply *r);

/* ---- the session: one lease, kept alive ----
 *
 * Grants a lease of ttl_s seconds and keeps it alive (a keepalive every
 * ttl/4 of the TTL etcd granted: 500 ms for 2 s; etcd raises a TTL below its
 * minimum, 2 s with default flags). If no member grants it, it asks again
 * every 500 ms (reachable(false) tells). up runs once the lease exists. lost runs
 * when etcd says the lease is gone (expired or revoked: everything put under
 * it is deleted, and others may have taken what it guarded); the session is
 * then over, and the caller starts a new one. reachable(false) runs when no
 * keepalive has succeeded for ttl (etcd unreachable: the lease may or may not
 * still live; say so, keep going), reachable(true) when one succeeds again. */
typedef struct megad_etcd_session_cbs {
  void (*up)(void *arg, int64_t lease);
  void (*lost)(void *arg, const char *why);
  void (*reachable)(void *arg, bool ok, const char *why);
  void *arg;
} megad_etcd_session_cbs;

mega_status megad_etcd_session_start(megad_etcd *e, unsigned ttl_s,
                                     const megad_etcd_session_cbs *cbs, mega_err *err);
/* Whether the lease was renewed within its TTL, by this process's clock:
 * while true, no other node can have taken what the lease guards (a
 * coordinator acts only then). */
bool megad_etcd_session_fresh(const megad_etcd *e);
/* The live lease; 0 while there is none. */
int64_t megad_etcd_session_lease(const megad_etcd *e);
/* Ends the session and revokes its lease: a blocking call of at most 1 s
 * (best effort, at shutdown: what was under it goes at once instead of after
 * the TTL). No session callback runs after it. */
void megad_etcd_session_end(megad_etcd *e);

/* ---- watches ---- */

typedef enum { MEGAD_ETCD_EV_PUT, MEGAD_ETCD_EV_DELETE } megad_etcd_evtype;

typedef struct megad_etcd_watch_cbs {
  /* One event, in revision order. For DELETE, kv has the key and mod_revision. */
  void (*event)(void *arg, megad_etcd_evtype type, const megad_etcd_kv *kv);
  /* The watch could not resume where it was (its revision was compacted):
   * the caller must get the prefix again and watch from that revision + 1.
   * The watch is over after this; its handle stays valid (and inert) until
   * megad_etcd_watch_cancel or megad_etcd_free. */
  void (*reset)(void *arg, const char *why);
  void *arg;
} megad_etcd_watch_cbs;

/* Watches every key under prefix from revision start_rev (0: from now;
 * named _start because C will not let a function share the type's name). A
 * failed stream (a member lost) is opened again on the next endpoint from the
 * last revision seen + 1, so no event is lost or repeated. */
mega_status megad_etcd_watch_start(megad_etcd *e, const char *prefix, int64_t start_rev,
                                   const megad_etcd_watch_cbs *cbs, megad_etcd_watch **out,
                                   mega_err *err);
/* The same for the keys in [key, end) (both under the root; end NULL: every
 * key starting with key): one watch over several prefixes that sort next to
 * each other, in one revision order, without the keys around them. */
mega_status megad_etcd_watch_range(megad_etcd *e, const char *key, const char *end,
                                   int64_t start_rev, const megad_etcd_watch_cbs *cbs,
                                   megad_etcd_watch **out, mega_err *err);
/* Stops and frees the watch; its callbacks never run again. May be called
 * from its own callbacks. */
void megad_etcd_watch_cancel(megad_etcd_watch *w);

#endif
