/* The coordinator: the jobs this node owns, from submission to their end.
 *
 * A submitted job is checked, journaled and queued. Jobs waiting (pending,
 * or restarting after a failure) start in submission order when the cluster
 * has the slots: each start is an attempt, placed on usable nodes
 * (daemon/placement), launched on every node of the placement with a
 * rendezvous prefix of its own ("<job>/<attempt>").
 *
 * During an attempt, step reports merge into StepMetrics for the watchers,
 * and checkpoints are decided here: once every rank reported its part of
 * iteration k durable, the committing rank (global rank 0) gets the
 * go-ahead; its "committed" report is journaled and becomes the CHECKPOINT
 * event. At a commit an elastic job re-plans when nodes came back (or
 * megactl rescale asked).
 *
 * The first real failure is the attempt's cause (a peer's echo of it is
 * told apart: see coord_internal.h); then every node aborts its ranks, and
 * once every rank's exit is known daemon/recovery decides: the job ends, or
 * it waits as RESTARTING and starts again as attempt k+1 from its newest
 * committed checkpoint, on as many nodes as its --nnodes range and the
 * cluster allow.
 *
 * On the loop thread only. Ownership: the coordinator's state of a job is
 * the job's coord part (mega_job.coord, daemon/model/job.h), its running
 * attempt (coord.run) the coordinator's to free; it borrows every layer
 * below. */
#ifndef MEGA_DAEMON_COORD_H
#define MEGA_DAEMON_COORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/base.h"
#include "daemon/jobs/jobs.h"
#include "daemon/kvserve/kvserve.h"
#include "daemon/launch/launch.h"
#include "daemon/members/members.h"
#include "daemon/model/recovery.h"
#include "daemon/model/roots.h"

/* A cancel waiting for its job's end (megad_coord_cancel's done). */
typedef struct megad_cancel_wait {
  void (*done)(void *arg, mega_job *j);
  void *arg;
} megad_cancel_wait;

typedef struct megad_coord_opts {
  const char *address;            /* this node's host:port: rendezvous and reports come here */
  unsigned rendezvous_timeout_ms; /* how long a rank waits for the others at rendezvous */
  unsigned heartbeat_ms;          /* members' interval: how soon a quiet node is suspect */
  unsigned heartbeat_timeout_ms;  /* members' timeout: when a quiet node is lost */
  const megad_roots *roots;       /* the paths jobs may name */
  unsigned max_pending;           /* waiting jobs this node may hold (0: no limit) */
  unsigned retain_jobs;           /* ended jobs kept (0: every one) */
  unsigned retain_ms;             /* ended jobs older than this are forgotten (0: never) */
  double node_memory_bytes;       /* what a node holds, for the fit check; 0: this node's RAM */
  bool one_job;                   /* megad run: this megad ends with its job, so no megactl
                                     resume can reach it */
} megad_coord_opts;

typedef struct megad_coord {
  megad_base *b;
  megad_jobs *jobs;
  megad_members *members;
  megad_launcher *L;
  megad_kvserve *kvs;
  megad_coord_opts o;
  uv_timer_t tick; /* retries the placement of waiting jobs */
  uv_timer_t retain_soon; /* retention right after a job ends (before the next request) */
  bool tick_on;
  /* Ranks of ended attempts, per node, that the node's heartbeats may still
   * count as busy: placement discounts them until its next heartbeat. */
  struct megad_released {
    char node_id[MEGAD_NODE_NAME_MAX + 1];
    uint32_t nranks;
    uint64_t at_ms; /* uv_now */
  } released[32];
  /* Nodes that refused a launch (their slots taken by another coordinator's
   * job, stopping, gone): counted full until a view of them newer than the
   * refusal, so the next attempt goes elsewhere (coord_place.c). */
  struct megad_refused {
    char node_id[64];
    uint64_t at_ms; /* uv_now; 0: a free entry */
  } refused[16];
  /* How an attempt's end reaches coord.c, which coord_run.c is below (so
   * it calls up through this pointer; megad_coord_init sets it). Called
   * once, when every rank of the attempt has exited or been counted gone,
   * with the run already detached (j->coord.run is NULL) and freed after
   * the call: it makes the recovery decision, answers the cancels waiting
   * for the end, lets go of a fenced job (j is freed then) and schedules.
   * ask_held: what the attempt's ranks kept is asked of their nodes first
   * (coord_held.c; after a stall their reports no longer came here). */
  void (*attempt_over)(struct megad_coord *c, mega_job *j, mega_end_kind kind,
                       const char *cause, const megad_cancel_wait *cancels, size_t ncancels,
                       bool ask_held);
  /* How the end of a gather of what an attempt's ranks held (coord_held.c,
   * also below coord.c) reaches it: the job may start now, so it schedules
   * (megad_coord_init sets it). */
  void (*held_gathered)(struct megad_coord *c);
  /* The jobs waiting to start, oldest first (coord_queue.c), so scheduling
   * looks at the head of the queue, not at every job ever submitted; and
   * the attempts running, for the slots they take. */
  mega_job *wq_head, *wq_tail;
  size_t nwaiting;
  bool scheduling, reschedule; /* a pass is running; another was asked for meanwhile */
  bool loads_asked; /* etcd mode: a pass waits for a read of the nodes' loads */
  struct coord_run *runs;
  unsigned ticks; /* retention runs every RETAIN_TICKS ticks */
  /* etcd mode (coord_etcd.c): claims of orphaned jobs in flight */
  char claims[8][160];
  char *saving_reason; /* megad_coord_stop_saving's first reason (this megad's SIGTERM) */
  struct coord_late *late; /* steps of attempts over, sent again (coord_late.c) */
} megad_coord;

mega_status megad_coord_init(megad_coord *c, megad_base *b, megad_jobs *jobs,
                             megad_members *members, megad_launcher *L, megad_kvserve *kvs,
                             const megad_coord_opts *o, mega_err *err);
void megad_coord_free(megad_coord *c);

/* After the journal replay: jobs that were running when this megad stopped
 * restart from their newest committed checkpoint (not counted against
 * --max-restarts); starts the scheduling timer. */
void megad_coord_start(megad_coord *c);

/* Checks a spec as SubmitJob does, journals the job and queues it. On
 * failure nothing is kept; INVALID errors carry the reason for the user. */
mega_status megad_coord_submit(megad_coord *c, const Mega__V1__JobSpec *spec, mega_job **out,
                               mega_err *err);
/* Starts waiting jobs in order while slots allow. */
void megad_coord_schedule(megad_coord *c);
/* Cancels: a waiting job at once; a running one once its workers are gone,
 * then done(arg, job) runs (at once when already over). */
void megad_coord_cancel(megad_coord *c, mega_job *j, const char *reason,
                        void (*done)(void *arg, mega_job *j), void *arg);
/* Forgets a waiting done of megad_coord_cancel (its call went away). */
void megad_coord_cancel_forget(megad_coord *c, mega_job *j, void *arg);
/* A launch on this node ended (the launcher's ended callback): retention
 * runs on the next turn, for the directory that job left here. */
void megad_coord_launch_ended(megad_coord *c);
/* megactl resume: a FAILED job restarts from its newest committed
 * checkpoint. MEGA_ERR_INVALID when it is not failed or cannot start. */
mega_status megad_coord_resume(megad_coord *c, mega_job *j, mega_err *err);
/* megactl rescale: re-plan on nnodes at the next checkpoint. */
mega_status megad_coord_rescale(megad_coord *c, mega_job *j, uint32_t nnodes, mega_err *err);

/* Steps of attempt (of world ranks) that node_id kept for a job whose
 * coordinator died, sent again to this node, which took the job over:
 * merged into the history from the ranks that survive, each (attempt,
 * iteration) once. MEGA_ERR_NOT_FOUND: this node does not coordinate the
 * job (yet); MEGA_ERR_INVALID: an attempt the job never had. */
mega_status megad_coord_resent(megad_coord *c, const char *job_id, uint32_t attempt,
                               uint32_t world, const char *node_id,
                               Mega__V1__StepReport *const *r, size_t n, mega_err *err);
/* Whether this node runs attempt `attempt` of job_id now (reports of other
 * attempts are refused, which stops their ranks). */
bool megad_coord_runs(megad_coord *c, const char *job_id, uint32_t attempt);
/* Whether attempt `attempt` of job_id is over but its ranks' state is
 * wanted (this node asks what they hold, or the next attempt may fetch
 * it): their reports are taken and dropped, not refused, since a refusal
 * lets them go. */
bool megad_coord_keeps(megad_coord *c, const char *job_id, uint32_t attempt);
/* Worker reports of a job this node coordinates (from the local launcher or
 * a node's ReportStep). */
void megad_coord_step(megad_coord *c, const char *job_id, uint32_t attempt, const char *node_id,
                      const Mega__V1__StepReport *r);
void megad_coord_event(megad_coord *c, const char *job_id, uint32_t attempt, const char *node_id,
                       const Mega__V1__RankEvent *ev);

/* etcd mode (coord_etcd.c). Another node coordinates j now: this one
 * stops its attempt (its workers) and lets go of it. */
void megad_coord_fenced(megad_coord *c, mega_job *j, const char *why);
/* etcd refused j's first record for good: j fails, on this node only. */
void megad_coord_refused(megad_coord *c, mega_job *j, const char *why);
/* A job lost its coordinator: try to take it over now. */
void megad_coord_orphan(megad_coord *c, const char *job_id);
/* This node's lease is gone: it stands down for every job it coordinates. */
void megad_coord_stand_down(megad_coord *c, const char *why);

/* Membership, as members publishes it. */
void megad_coord_node_lost(megad_coord *c, const megad_node *n, const char *why);
void megad_coord_node_up(megad_coord *c, const megad_node *n);
/* This node's loop stood still for ms (base.h, stalls): an attempt that
 * could not outlive it (its ranks on other nodes, which took this node for
 * lost after the heartbeat timeout; its own workers, which stop after the
 * pipe's silence) ends with that as its cause, not counted as a failure. */
void megad_coord_stalled(megad_coord *c, uint64_t ms);

/* Shutdown: running attempts end and their jobs wait as RESTARTING, so a
 * megad started again on this state dir resumes them. */
void megad_coord_stop_all(megad_coord *c, const char *reason);
/* A shutdown that saves first (megad got SIGTERM): every job this node
 * coordinates that has --exit-signal-handler is asked, on each of its nodes,
 * to save at the next iteration boundary and stop (it then ends STOPPED).
 * Returns how many jobs were asked. */
size_t megad_coord_stop_saving(megad_coord *c, const char *reason);
/* Whether such a job still has an attempt running. */
bool megad_coord_saving(const megad_coord *c);
/* Attempts still ending (waiting for their workers). */
size_t megad_coord_stopping(const megad_coord *c);
/* Slots of node taken by attempts this node coordinates. */
uint32_t megad_coord_slots_on(const megad_coord *c, const char *node_id);
/* A job whose running attempt, coordinated here, has ranks on node (the
 * first found), or NULL. */
const mega_job *megad_coord_job_on(const megad_coord *c, const char *node_id);

#endif
