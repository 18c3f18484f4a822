/* Cluster membership, in one of two modes.
 *
 * Peers (no etcd): every node heartbeats every other node it knows every
 * --heartbeat-interval and learns new nodes from the views that come back. A
 * node not heard from for half the --heartbeat-timeout is SUSPECT (no new
 * work is placed there), for the whole timeout DEAD. A new incarnation (a
 * restarted megad) counts as a loss too. A DEAD node is still heartbeated,
 * since a partition heals and a frozen megad wakes, but less and less
 * often: twice the interval after the last, up to MEGAD_MEMBERS_PROBE_MAX_MS.
 * A node that is gone for good stays listed DEAD until an operator forgets
 * it (megad_members_forget).
 *
 * etcd (members_etcd.c): no heartbeats between nodes. Each node holds an etcd
 * session (a lease of 2 s, kept alive) and puts its record, a mega.v1.Node
 * without its load, at mega/nodes/<node id> under that lease, and its load
 * (slots used, job ids) at mega/load/<node id>, again whenever it changes.
 * Every node watches mega/nodes/: a PUT is a node up, a DELETE (the lease
 * expired or was revoked) a node lost. Nobody watches mega/load/: a job's
 * start and end would reach every node; it is read when a load is needed
 * (megad_members_read_loads). A megad that stops
 * puts its record as LEFT, then revokes its lease. If this node's own session
 * is lost (it was cut off, or stopped, for longer than the TTL), others took
 * it for dead: it registers again as a new incarnation and tells the layers
 * above through self_fenced.
 *
 * Members tells the layers above through callbacks they register, never by
 * calling them: node_up when a node joins or is alive again, node_lost when
 * one dies, leaves or restarts.
 *
 * On the loop thread only. Ownership: members owns its nodes; it borrows its
 * base. */
#ifndef MEGA_DAEMON_MEMBERS_H
#define MEGA_DAEMON_MEMBERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/base.h"
#include "daemon/etcd/etcd.h"
#include "proto/mega.pb-c.h"
#include "proto/rpc_server.h"

typedef struct megad_node {
  char *id, *address, *version, *backend;
  char *device_name; /* "2 x NVIDIA H100 80GB HBM3"; empty for cpu */
  Mega__V1__NodeState state;
  uint32_t slots, slots_used;
  uint64_t incarnation;      /* as this node last saw it itself */
  uint64_t address_inc;      /* the incarnation address belongs to (0: unknown) */
  uint64_t seen_ms;          /* uv_now of the last sign of life */
  int64_t last_heartbeat_unix_ms;
  char **job_ids;            /* jobs with ranks there, as it last said */
  size_t njob_ids;
  uint64_t probe_at_ms;      /* DEAD, peers mode: uv_now of its next heartbeat */
  unsigned probe_gap_ms;     /* and the gap before the one after (0: none yet) */
  bool self, hb_inflight;
} megad_node;

/* The longest gap between heartbeats to a DEAD node (peers mode): a
 * partition that heals is seen within it. */
#define MEGAD_MEMBERS_PROBE_MAX_MS 10000u

/* A node forgotten (megad_members_forget): views that still list this
 * incarnation, or an older one, do not bring it back. */
typedef struct megad_forgotten {
  char id[MEGAD_NODE_NAME_MAX + 1];
  uint64_t incarnation;
} megad_forgotten;
#define MEGAD_MEMBERS_FORGOTTEN_MAX 64

typedef struct megad_members_cbs {
  void (*node_up)(void *arg, megad_node *n);
  void (*node_lost)(void *arg, megad_node *n, const char *why);
  /* This node's load for heartbeats and views: slots used, and the ids of
   * jobs with ranks here (borrowed strings, at most max). */
  uint32_t (*self_load)(void *arg, const char **job_ids, size_t max, size_t *n);
  /* etcd mode: this node's session was lost, so the cluster took it for
   * dead and others may hold what it held (a coordinator stands down); it is
   * registered again as a new incarnation. May be NULL. */
  void (*self_fenced)(void *arg, const char *why);
  void *arg;
} megad_members_cbs;

typedef struct megad_members_opts {
  const char *address; /* this node's host:port for peers */
  uint32_t slots;
  const char *backend; /* "cpu" or "cuda" */
  const char *device_name; /* the GPUs behind the slots, or NULL */
  const char *peers;   /* "host:port,..." to join; NULL: none */
  unsigned heartbeat_interval_ms, heartbeat_timeout_ms;
  unsigned etcd_lease_s; /* etcd mode: the lease's TTL (0: 2 s) */
} megad_members_opts;

typedef struct megad_members {
  megad_base *b;
  megad_members_opts o;
  megad_members_cbs cbs;
  uint64_t incarnation;
  megad_node **nodes; /* nodes[0] is this node */
  size_t nnodes;
  uint64_t view_version;
  megad_forgotten forgotten[MEGAD_MEMBERS_FORGOTTEN_MAX]; /* a ring; empty ids unused */
  size_t forgotten_next;
  char **peers; /* --peers, joined until each has answered once */
  bool *peer_joined, *peer_joining, *peer_warned;
  size_t npeers;
  uv_timer_t timer;
  bool timer_on;
  /* etcd mode (members_etcd.c); etcd is borrowed, NULL in peers mode */
  megad_etcd *etcd;
  megad_etcd_watch *etcd_watch;
  char *etcd_key;            /* mega/nodes/<id> */
  char *etcd_sig;            /* the load last put: slots used and job ids */
  char *etcd_load_key;       /* mega/load/<id> */
  uint64_t loads_read_ms;    /* uv_now when the last read that came back was asked; 0: never */
  uint64_t loads_asked_ms;   /* uv_now when the read in flight was asked */
  bool loads_reading;
  struct members_loads_wait *loads_waits; /* called when the read in flight is back */
  size_t nloads_waits;
  uint64_t etcd_taken_ms;    /* when the name was first found taken; 0: not */
  bool etcd_registered, etcd_registering, etcd_putting, etcd_listing, etcd_leaving;
  bool left;            /* megad_members_leave ran */
  unsigned leave_calls; /* Peer Leave calls not answered yet */
  bool etcd_warned;
} megad_members;

/* opts' strings are copied. etcd: membership from etcd (opts->peers must
 * be NULL), or NULL: from peers. */
mega_status megad_members_init(megad_members *m, megad_base *b, const megad_members_opts *o,
                               uint64_t incarnation, megad_etcd *etcd,
                               const megad_members_cbs *cbs, mega_err *err);
/* Starts heartbeats and joins (each interval), or the etcd session, the
 * registration and the watch. */
void megad_members_start(megad_members *m);
/* Best effort at shutdown: Leave to every live peer (once), timer stopped;
 * in etcd mode the record put as LEFT, then the lease revoked. */
void megad_members_leave(megad_members *m);
/* Shutdown's first step: Peer Leave to the nodes ids[0..n) only (the
 * coordinators of jobs with ranks here), in either mode, so that they count
 * this node lost before its ranks' ends reach them. Unknown ids, this node
 * and nodes already down are skipped. */
void megad_members_leave_to(megad_members *m, const char *const *ids, size_t n);
/* Whether a Leave is still on its way: a Peer Leave not answered yet, or
 * (etcd) the LEFT record not put yet. */
bool megad_members_leaving(const megad_members *m);
void megad_members_free(megad_members *m);
/* Join, Heartbeat, Leave and Control.ListNodes. */
void megad_members_register(megad_members *m, mega_rpc_server *srv);

/* The other nodes' loads (slots_used, job_ids), which in etcd mode are not in
 * the watched records: unless the last read was asked for at most max_age_ms
 * ago, reads mega/load/ (one range read; asks made while it is in flight
 * share it), then calls done(arg) (may be NULL); at once when fresh enough,
 * in peers mode (heartbeats carry the loads), or when the read cannot start.
 * A failed read leaves the loads as they were and still calls done. */
typedef void (*megad_members_loads_cb)(void *arg);
void megad_members_read_loads(megad_members *m, unsigned max_age_ms, megad_members_loads_cb done,
                              void *arg);

/* Drops node id from the view, on an operator's word that it is gone for
 * good (megactl nodes forget): it is no longer listed or heartbeated, and
 * views from nodes that still list it, at the incarnation this node knew or
 * inc (whichever is later) or an older one, do not bring it back; a later
 * incarnation (its megad restarted) joins as any node does, and so does any
 * that speaks to this node itself. Refused (INVALID) for this node and for
 * a node that is ALIVE or SUSPECT (it answers: stop its megad first);
 * NOT_FOUND when the view has no such node, unless unknown_ok (then it is
 * only kept from coming back). Other layers keep no megad_node pointer
 * across loop turns, so the node is freed at once. */
mega_status megad_members_forget(megad_members *m, const char *id, uint64_t inc, bool unknown_ok,
                                 mega_err *err);

megad_node *megad_members_find(megad_members *m, const char *id);
megad_node *megad_members_self(megad_members *m);
/* ALIVE: new work may be placed there. */
bool megad_node_usable(const megad_node *n);

#endif
