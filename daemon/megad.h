/* megad's insides, shared by the daemon's files (not an API for others).
 *
 * One libuv loop runs everything: the gRPC server and async client calls
 * (through proto/rpc_bridge), worker processes and their pipes, timers and
 * signals. So none of this state needs a lock.
 *
 *   daemon.c    life cycle: start, journal replay, shutdown in order
 *   members.c   nodes: Join, Heartbeat, Leave, liveness, ListNodes
 *   coord.c     the coordinator: submit, FIFO scheduling, placement, the
 *               job's ranks across nodes, failures and their cause
 *   launch.c    a node's share of a job: megaw processes, their pipes,
 *               stderr tails, exits, abort then SIGKILL
 *   kvserve.c   the rendezvous store: Peer Kv*, and workers' KvRequests
 *   control.c   the Control service and WatchJob's watchers
 *   peer.c      the Peer service's job calls (LaunchRanks, AbortJob, ReportStep)
 *   jobtrace.c  the Chrome trace of --trace-iteration, and GetTrace
 *   http.c      GET /metrics (Prometheus text)
 *   main.c      `megad serve` and `megad run`
 */
#ifndef MEGA_DAEMON_MEGAD_H
#define MEGA_DAEMON_MEGAD_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "core/status.h"
#include "daemon/job.h"
#include "daemon/journal.h"
#include "daemon/kv.h"
#include "daemon/stepmerge.h"
#include "proto/frame.h"
#include "proto/mega_rpc.h"
#include "proto/rpc_client.h"
#include "proto/rpc_server.h"

#define MEGAD_HEARTBEAT_MS 1000
#define MEGAD_SUSPECT_MS 2500
#define MEGAD_DEAD_MS 5000
#define MEGAD_ABORT_GRACE_MS 2000
#define MEGAD_KV_TIMEOUT_MS 60000
#define MEGAD_TAIL_LINES 20
/* A watcher further behind than this many messages is dropped. Above the
 * history, so a replay alone never drops one. */
#define MEGAD_WATCH_QUEUE_MAX (MEGA_JOB_HISTORY + 1024)

typedef struct megad megad;

typedef struct megad_opts {
  const char *listen;         /* "127.0.0.1:7070", "127.0.0.1:0" or "unix:/path" */
  const char *state_dir;      /* journal, jobs/<id>/ (traces, worker logs) */
  int slots;
  const char *node_name;      /* NULL: the hostname */
  const char *peers;          /* "host:port,host:port"; NULL: none */
  const char *advertise;      /* host peers and workers use; NULL: the listen host */
  const char *worker_path;    /* NULL: megaw next to megad */
  const char *metrics_listen; /* "127.0.0.1:9100"; NULL: no /metrics */
  bool quiet;                 /* megad run: no log lines on stderr but warnings */
} megad_opts;

/* ---- nodes ---- */

typedef struct megad_node {
  char *id, *address, *version, *backend;
  Mega__V1__NodeState state;
  uint32_t slots, slots_used;
  uint64_t incarnation;
  uint64_t seen_ms;          /* uv_now of the last sign of life */
  int64_t last_heartbeat_unix_ms;
  char **job_ids;
  size_t njob_ids;
  mega_rpc_channel *ch;      /* NULL for self, until first used for others */
  bool self, hb_inflight;
} megad_node;

/* ---- a node's share of a job (launch.c) ---- */

typedef struct megad_launch megad_launch;

/* ---- watchers (control.c) ---- */

/* A WatchJob stream, or an in-process watcher (megad run) when call is NULL. */
typedef struct megad_watcher {
  struct megad_watcher *next;
  mega_job *job;
  mega_rpc_call *call;
  void (*local)(void *arg, const Mega__V1__WatchJobResponse *item);
  void *arg;
} megad_watcher;

/* ---- async calls to peers ---- */

typedef struct megad_rpc megad_rpc;

struct megad {
  megad_opts o;
  uv_loop_t *loop;
  mega_rpc_cq *cq;
  mega_rpc_server *srv;
  char *node_id, *address, *worker_host, *worker_path, *state_dir;
  uint64_t incarnation;
  int port;
  mega_journal *journal;
  mega_kv *kv;
  mega_jobs jobs;

  megad_node **nodes; /* nodes[0] is this node */
  size_t nnodes;
  uint64_t view_version;
  char **peers; /* --peers, joined until each has answered once */
  bool *peer_joined, *peer_joining, *peer_warned;
  size_t npeers;

  megad_launch *launches;
  megad_watcher *watchers;
  megad_rpc *rpcs; /* async calls in flight */
  void *http;      /* http.c */

  uv_timer_t tick;     /* heartbeats, liveness, joins, scheduling: every second */
  uv_timer_t watchdog; /* sd_notify WATCHDOG=1 */
  uv_signal_t sigint, sigterm;
  bool watchdog_on;
  bool stopping;
  int stop_signal;
  void (*on_stopped)(void *arg); /* when shutdown has finished */
  void *on_stopped_arg;
};

/* ---- daemon.c ---- */

/* Starts everything on loop: state dir, journal replay, server, peers.
 * Prints nothing; megad->port and ->address tell where it listens. */
mega_status megad_start(megad *d, uv_loop_t *loop, const megad_opts *o, mega_err *err);
/* Stops in order: no new jobs, running jobs' workers aborted and reaped (their
 * jobs fail with reason), Leave sent to peers, the server shut down, calls
 * drained, the queue closed. done runs at the end; keep running the loop. */
void megad_stop(megad *d, const char *reason, void (*done)(void *arg), void *arg);

void megad_log(megad *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void megad_warn(megad *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends a journal record (logging a failure; the daemon goes on). */
mega_status megad_journal_job(megad *d, const mega_job *j, mega_err *err);

/* The directory of a job's files under the state dir (created), or NULL;
 * the caller frees it. */
char *megad_job_dir(megad *d, const char *job_id);

/* An async unary call to a peer; cb runs exactly once on the loop. During
 * shutdown pending calls are cancelled (cb then sees MEGA_ERR_CANCELLED). */
mega_status megad_call(megad *d, megad_node *n, const mega_rpc_method *m,
                       const ProtobufCMessage *req, unsigned timeout_ms, mega_rpc_reply_fn cb,
                       void *arg, mega_err *err);
/* The same to an address that is not (yet) a known node. */
mega_status megad_call_addr(megad *d, const char *address, const mega_rpc_method *m,
                            const ProtobufCMessage *req, unsigned timeout_ms,
                            mega_rpc_reply_fn cb, void *arg, mega_err *err);

/* ---- members.c ---- */

mega_status megad_members_init(megad *d, mega_err *err);
void megad_members_free(megad *d);
megad_node *megad_node_find(megad *d, const char *id);
megad_node *megad_self(megad *d);
/* Joins --peers (retried each tick until they answer), heartbeats, liveness. */
void megad_members_tick(megad *d);
void megad_members_leave(megad *d); /* best effort, at shutdown */
void megad_members_register(megad *d);

/* ---- coord.c ---- */

/* Checks a spec as SubmitJob does, journals the job and queues it. On
 * failure nothing is kept; INVALID errors carry the reason for the user. */
mega_status megad_submit(megad *d, const Mega__V1__JobSpec *spec, mega_job **out, mega_err *err);
/* Starts pending jobs in FIFO order while slots allow. */
void megad_schedule(megad *d);
/* Cancels: a pending job at once; a running one once its workers are gone,
 * then done(arg, job) runs (at once when already final). */
void megad_cancel(megad *d, mega_job *j, const char *reason,
                  void (*done)(void *arg, mega_job *j), void *arg);
/* Forgets a waiting done of megad_cancel (its call went away). */
void megad_cancel_forget(megad *d, mega_job *j, void *arg);
/* A worker event of a job this node coordinates (from a local launch or a
 * remote node's ReportStep). */
void megad_coord_step(megad *d, const char *job_id, uint32_t attempt, const char *node_id,
                      const Mega__V1__StepReport *r);
void megad_coord_event(megad *d, const char *job_id, uint32_t attempt, const char *node_id,
                       const Mega__V1__RankEvent *ev);
/* A node stopped answering (or restarted): fail the jobs with ranks there. */
void megad_coord_node_lost(megad *d, const char *node_id, const char *why);
/* Shutdown: every running job fails with reason and its workers are aborted. */
void megad_coord_stop_all(megad *d, const char *reason);
/* The number of jobs still stopping (waiting for their workers). */
size_t megad_coord_stopping(megad *d);
/* Slots of node taken by running jobs this node coordinates. */
uint32_t megad_coord_slots_on(megad *d, const char *node_id);

/* Events, steps and the final state go to the history, the journal and every
 * watcher. */
void megad_job_event(megad *d, mega_job *j, Mega__V1__JobEventKind kind, const char *node_id,
                     int rank, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* ---- launch.c ---- */

/* Spawns this node's share of a job; pids (the caller's, req->n_ranks) get
 * the workers' pids. RESOURCE-like failures (slots) are MEGA_ERR_UNSUPPORTED. */
mega_status megad_launch_start(megad *d, const Mega__V1__LaunchRanksRequest *req, int32_t *pids,
                               mega_err *err);
/* Sends Abort to the attempt's workers, then SIGKILL after grace_ms. Unknown
 * jobs are ignored. attempt < 0: every attempt. */
void megad_launch_abort(megad *d, const char *job_id, int64_t attempt, const char *reason,
                        unsigned grace_ms);
/* Aborts the launches coordinated by node_id (it died or restarted). */
void megad_launch_abort_coord(megad *d, const char *coord_id, const char *reason);
/* Aborts everything (shutdown); true once no worker is left. */
void megad_launch_abort_all(megad *d, const char *reason);
bool megad_launch_idle(megad *d);
/* Job ids with ranks on this node (the array and strings are borrowed). */
size_t megad_launch_job_ids(megad *d, const char **ids, size_t max);

/* ---- kvserve.c ---- */

typedef struct megad_kvwait megad_kvwait;
/* s: MEGA_OK, MEGA_ERR_TIMEOUT or MEGA_ERR_CANCELLED; msg says which key. */
typedef void (*megad_kvwait_fn)(void *arg, mega_status s, const char *msg);
/* Waits until every key exists in this node's store, or timeout_ms (<= 0:
 * no limit). May call fn before returning (and then returns NULL). */
megad_kvwait *megad_kvwait_start(megad *d, char *const *keys, size_t n, int timeout_ms,
                                 megad_kvwait_fn fn, void *arg);
/* fn is not called after this. */
void megad_kvwait_cancel(megad_kvwait *w);
void megad_kv_register(megad *d);

/* ---- control.c ---- */

void megad_control_register(megad *d);
/* Sends item to every watcher of j; a final_state item ends their streams. */
void megad_watch_broadcast(megad *d, mega_job *j, const Mega__V1__WatchJobResponse *item);
/* An in-process watcher (megad run); replay sends the history first. */
megad_watcher *megad_watch_local(megad *d, mega_job *j, bool replay,
                                 void (*fn)(void *arg, const Mega__V1__WatchJobResponse *item),
                                 void *arg);
void megad_watch_drop_all(megad *d);

/* ---- peer.c ---- */

void megad_peer_register(megad *d);

/* ---- jobtrace.c ---- */

/* Writes the Chrome trace of a merged iteration into the job's directory. */
mega_status megad_trace_write(megad *d, mega_job *j, const mega_step_done *done, char **path,
                              mega_err *err);
void megad_trace_register(megad *d);

/* ---- http.c ---- */

mega_status megad_http_start(megad *d, const char *addr, mega_err *err);
void megad_http_stop(megad *d);

#endif
