/* megad's base layer: what every other part of the daemon stands on.
 *
 * The loop and the RPC completion queue, logging, the state directory
 * (locked, so exactly one megad owns it) and its per-job directories, and
 * async calls to peers over channels cached by address.
 *
 * The daemon's layers, a folder each, each calling only down (a layer tells
 * the ones above it things through callbacks they registered;
 * tests/layers/layers.txt is the table the default suite checks):
 *
 *   model/     pure: the job and its history, journal records, the key-value
 *              store, placement, recovery planning, step merging
 *   base       this file: loop, log, state dir, peer calls
 *   etcd/      the etcd client (--etcd-endpoints), borrowed above
 *   jobs/      the jobs table, journal (or etcd and the mirror of every
 *              job), watchers, events, traces
 *   members/   nodes, heartbeats or etcd, liveness (node up/lost events)
 *   kvserve/   the rendezvous store and its Peer calls
 *   launch/    this node's workers (spawn, pipes, hang check)
 *   coord/     the jobs this node coordinates (attempts, recovery; with
 *              etcd, takeover and standing down)
 *   services/  Control (forwarding to a job's coordinator), Peer
 *   web/       HTTP: the web view, its streams and login, /metrics
 *   daemon.c   wires them together: start, callbacks, stop
 *
 * Inside a layer its files stack the same way (each layer's *_internal.h
 * draws its own): no two files call each other in a circle.
 *
 * Single-threaded: everything runs on the loop thread. */
#ifndef MEGA_DAEMON_BASE_H
#define MEGA_DAEMON_BASE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "core/status.h"
#include "proto/rpc_bridge.h"
#include "proto/mega_rpc.h"
#include "proto/rpc_client.h"

typedef struct megad_rpc megad_rpc;
typedef struct megad_chan megad_chan;

typedef struct megad_base {
  uv_loop_t *loop;
  mega_rpc_cq *cq;
  char *node_id;
  char *state_dir; /* absolute */
  bool quiet;      /* only warnings on stderr */
  bool stopping;   /* shutdown has begun */
  int lock_fd;     /* flock on STATE/lock while this megad runs */
  const mega_rpc_auth *auth; /* what calls to peers carry (token, TLS); NULL: none */
  megad_rpc *rpcs; /* async calls in flight */
  megad_chan *chans;
  /* The loop's own stalls (stall.c below): the process stopped or starved
   * of CPU, or a call that blocked the loop. */
  struct {
    uv_prepare_t prepare;
    uv_check_t check;
    uv_timer_t tick; /* bounds the poll's wait */
    bool on;
    uint64_t poll_ns, turn_ns; /* uv_hrtime before the poll; at the last check */
    uint64_t poll_max;         /* the longest the poll may wait: till the tick (ms) */
    uint64_t end_ms, ms;       /* the newest stall: its end (loop clock) and length */
    void (*cb)(void *arg, uint64_t ms); /* megad_base_on_stall */
    void *arg;
  } stall;
} megad_base;

/* Creates (if needed) and locks state_dir, and makes the completion queue.
 * A state dir locked by another megad is MEGA_ERR_INVALID naming its pid. */
mega_status megad_base_init(megad_base *b, uv_loop_t *loop, const char *node_id,
                            const char *state_dir, bool quiet, mega_err *err);
/* Frees the channels and releases the lock (the queue is closed by
 * megad_base_close_cq first). */
void megad_base_free(megad_base *b);
/* Shuts the completion queue down; done runs once it has drained. */
void megad_base_close_cq(megad_base *b, void (*done)(void *arg), void *arg);

/* ---- stalls ----
 * A stopped (SIGSTOP) or starved megad hears nothing while it stands still,
 * and on waking its clock says every peer and worker was silent all that
 * time. The base bounds the loop's wait with a tick (250 ms) and measures
 * each turn; a turn late by MEGAD_STALL_MS or more is a stall of this node,
 * and what measures another's silence asks megad_quiet_ms, which does not
 * count it. */
#define MEGAD_STALL_MS 500
/* The longest node name (bytes): it is part of every job id the node makes
 * (128 bytes) and fixed buffers hold it. megad_start refuses longer ones. */
#define MEGAD_NODE_NAME_MAX 63
/* Starts measuring (the handles close with megad_base_free). cb (may be
 * NULL) hears each stall once it is over, with its length: a lower bound,
 * short by at most the tick when the stall began in the loop's wait. */
void megad_base_on_stall(megad_base *b, void (*cb)(void *arg, uint64_t ms), void *arg);
/* How long it has been since since_ms (the loop's clock, uv_now), not
 * counting this node's stalls: 0 for a stall being woken from now. */
uint64_t megad_quiet_ms(const megad_base *b, uint64_t since_ms);
/* The newest stall, if it ended within window_ms or is ending now (the
 * callbacks that run first after it): its length, and in *start_ms when it
 * began (loop clock; may be NULL); 0 if none. */
uint64_t megad_stall_recent(const megad_base *b, uint64_t window_ms, uint64_t *start_ms);

void megad_log(const megad_base *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void megad_warn(const megad_base *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes text to STATE/name whole or not at all: into STATE/name.tmp,
 * fsynced, then renamed. A failure (a full disk) is a warning naming the
 * file, the temp file removed and what stood at the name left as it was;
 * false then. */
bool megad_write_state_file(const megad_base *b, const char *name, const char *text);

/* rm -rf path, without following symlinks; false if something stayed. */
bool megad_rmtree(const char *path);

/* Whether job_id is a name megad could have made ("j-7-node1": letters,
 * digits, '.', '-', '_', at most 128 bytes, not "." or ".."), and so safe
 * as one path component. Ids reach a node in Peer calls, which anyone
 * holding the token can make. */
bool megad_job_id_is_name(const char *job_id);

/* STATE/jobs/<id> (created), or NULL with errno saying why (EINVAL: id is
 * not megad_job_id_is_name's); the caller frees it. */
char *megad_job_dir(const megad_base *b, const char *job_id);

/* An async unary call to the megad at address; cb runs exactly once on the
 * loop. Channels are kept per address. During shutdown pending calls are
 * cancelled (cb then sees MEGA_ERR_CANCELLED). */
mega_status megad_call(megad_base *b, const char *address, const mega_rpc_method *m,
                       const ProtobufCMessage *req, unsigned timeout_ms, mega_rpc_reply_fn cb,
                       void *arg, mega_err *err);
/* The same for a server stream (on_item per message, then on_end once).
 * *handle (may be NULL) cancels it with mega_rpc_pending_cancel. */
mega_status megad_call_stream(megad_base *b, const char *address, const mega_rpc_method *m,
                              const ProtobufCMessage *req, unsigned timeout_ms,
                              mega_rpc_item_fn on_item, mega_rpc_end_fn on_end, void *arg,
                              mega_rpc_pending **handle, mega_err *err);
/* Drops the cached channel of address (the node there changed). */
void megad_forget_channel(megad_base *b, const char *address);
/* Cancels every call in flight; true once none is left. */
void megad_calls_cancel(megad_base *b);
bool megad_calls_idle(const megad_base *b);

#endif
