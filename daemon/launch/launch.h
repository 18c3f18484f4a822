/* The launcher: this node's share of jobs, whoever coordinates them.
 *
 * One megaw per local rank, spawned with a bidirectional pipe on fd 3
 * (frames of proto/frame.h), stdout and stderr captured into the rank's log
 * file, the last stderr lines kept for the error message. megad pings each
 * pipe; a worker that hears nothing for the Assignment's pipe timeout stops
 * on its own (its megad is frozen or gone).
 *
 * What workers say goes to the job's coordinator: through the callbacks the
 * coordinator registered when it is this node, else batched into Peer
 * ReportStep calls. Their KV requests go to this node's store or to the
 * coordinator's.
 *
 * A hang check watches every worker: one that makes no progress within
 * its phase's limit (setup: the rendezvous timeout; training: the job's
 * --step-timeout, or 10 x its median step time with a 2 s floor, and 60 s
 * before its first step, which has no median and may be slow; eval and
 * checkpoints: 10 minutes) is reported as hung; a stopped process (SIGSTOP,
 * state T) is hung after the floor in any phase. A stopped process is the
 * cause and is killed; one merely waiting is reported as the likely echo of
 * a hung peer.
 *
 * On the loop thread only. Ownership: the launcher owns its launches and
 * workers; it borrows base and kvserve. */
#ifndef MEGA_DAEMON_LAUNCH_H
#define MEGA_DAEMON_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/base.h"
#include "daemon/kvserve/kvserve.h"
#include "proto/mega.pb-c.h"

#define MEGAD_ABORT_GRACE_MS 2000
/* An abort with hold waits longer before it kills a rank that has not held
 * yet: on a loaded machine stopping takes a while, and a rank killed then
 * takes a replica with it. Less than the coordinator's wait for exits
 * (MEGAD_ABORT_GRACE_MS + 4000), so the kill is still counted. */
#define MEGAD_HOLD_GRACE_MS 5000
/* How long ranks that hold their state after their coordinator was lost
 * wait for a coordinator (the one that takes the job over, or the same
 * node's megad restarted) before they let go: a restart under systemd takes
 * seconds, and held ranks keep their memory (a GPU's too). */
#define MEGAD_ORPHAN_HOLD_MS 60000 /* the default of --held-state-timeout */

/* Where worker reports go when this node coordinates their job. */
typedef struct megad_launcher_cbs {
  void (*step)(void *arg, const char *job_id, uint32_t attempt, const char *node_id,
               const Mega__V1__StepReport *r);
  void (*event)(void *arg, const char *job_id, uint32_t attempt, const char *node_id,
                const Mega__V1__RankEvent *ev);
  /* Steps of an attempt whose coordinator died, kept here and sent again
   * to the job's new coordinator when that is this node (as a remote one
   * gets them in Peer ReportStep with resent): MEGA_ERR_NOT_FOUND while it
   * has not taken the job over yet, and they are sent again later. */
  mega_status (*resent)(void *arg, const char *job_id, uint32_t attempt, uint32_t world,
                        const char *node_id, Mega__V1__StepReport *const *r, size_t n,
                        mega_err *err);
  /* A launch here is over (its workers gone, its reports delivered), and
   * its job's directory (STATE/jobs/<id>) was touched, so its mtime says
   * when: the jobs this node ran for others keep their logs there, and only
   * the layer above knows which jobs are its own. May be NULL. */
  void (*ended)(void *arg, const char *job_id);
  void *arg;
} megad_launcher_cbs;

typedef struct megad_launcher_opts {
  const char *worker_path; /* megaw */
  const char *worker_host; /* the address workers bind for their peers */
  uint32_t slots;
  unsigned ping_ms;            /* pipe pings; 0: 500 */
  unsigned pipe_timeout_ms;    /* a worker stops after this much silence; 0: 3000 */
  unsigned step_floor_ms;      /* the adaptive step limit's floor; 0: 2000 */
  unsigned rendezvous_timeout_ms; /* what setup may take; 0: 60000 */
  unsigned orphan_hold_ms;     /* held ranks of a lost coordinator; 0: MEGAD_ORPHAN_HOLD_MS */
  bool gpus; /* one GPU per slot: a worker gets its slot's device */
  /* what a job may touch on this node, checked again at each launch: a
   * Peer call needs only the token a client holds too; NULL: unchecked */
  const struct megad_roots *roots;
} megad_launcher_opts;

typedef struct megad_launch megad_launch;
typedef struct megad_orphan megad_orphan;

typedef struct megad_launcher {
  megad_base *b;
  megad_kvserve *kvs;
  megad_launcher_opts o;
  megad_launcher_cbs cbs;
  megad_launch *launches;
  uint32_t slots_used;
  bool *slot_busy; /* [o.slots]: which slot (and GPU) each worker holds */
  uv_timer_t tick; /* pings and the hang check */
  bool tick_on;
  uint64_t last_ping_ms;
  uint64_t steps_relayed; /* workers' step reports passed on (for /metrics) */
  /* The last attempts stopped here, by job: the coordinator's LaunchRanks
   * and its abort are separate calls and may cross, and a launch that comes
   * after its attempt's abort would start ranks nobody waits for. */
  struct megad_launch_ended {
    char job_id[128];
    uint32_t attempt; /* this one and every earlier one are over */
  } ended[32];
  size_t ended_next;
  /* Steps kept for the new coordinator of a job whose coordinator died
   * (resend.c), and where jobs of launches here moved (a takeover may be
   * heard of before the old coordinator's loss). */
  megad_orphan *orphans;
  struct megad_launch_moved {
    char job_id[128], node_id[MEGAD_NODE_NAME_MAX + 1], address[256];
    /* node_id asked for the ranks of this attempt (ListHeld): it runs the
     * job now, even as the node that coordinated the attempt (restarted) */
    bool asked;
    uint32_t attempt;
  } moved[16];
  size_t moved_next;
  uint64_t steps_lost; /* reports dropped before a coordinator acknowledged them */
} megad_launcher;

mega_status megad_launcher_init(megad_launcher *L, megad_base *b, megad_kvserve *kvs,
                                const megad_launcher_opts *o, const megad_launcher_cbs *cbs,
                                mega_err *err);
void megad_launcher_free(megad_launcher *L); /* once idle */

/* Spawns this node's share of a job; pids (the caller's, req->n_ranks) get
 * the workers' pids. Before any rank starts, the node checks what only it
 * can: the data file and the save directory as it sees them
 * (MEGA_ERR_INVALID, naming this node). Slots taken is
 * MEGA_ERR_UNSUPPORTED. */
mega_status megad_launch_start(megad_launcher *L, const Mega__V1__LaunchRanksRequest *req,
                               int32_t *pids, mega_err *err);
/* What the node's files give a job, which every node of an attempt must
 * agree on: --vocab-file's entries (0: the job reads none) and its
 * <|endoftext|> id (-1: none). */
typedef struct megad_launch_files {
  int vocab_entries, eod_id;
} megad_launch_files;

/* What megad_launch_start would refuse, with the same status and words,
 * starting nothing (PrepareLaunch): it makes the attempt's directory, and
 * takes no slot, so a launch may still find its slots taken. It also reads
 * the job's vocabulary file into *files (a file it cannot read, or not
 * GPT-2's vocab.json, is MEGA_ERR_INVALID naming this node). */
mega_status megad_launch_check(megad_launcher *L, const Mega__V1__LaunchRanksRequest *req,
                               megad_launch_files *files, mega_err *err);
/* Sends Abort to the attempt's workers, then SIGKILL after grace_ms.
 * attempt < 0: every attempt. stale: every attempt before `attempt`. */
void megad_launch_abort(megad_launcher *L, const char *job_id, int64_t attempt, bool stale,
                        const char *reason, unsigned grace_ms);
/* Stops the attempt's workers as megad_launch_abort does, except that a
 * worker whose state is whole keeps it and serves it to the next attempt
 * (it answers RankHeld, which goes to the coordinator as a RankEvent); a
 * held worker is not killed, holds no slot and is not hang-checked until
 * an abort of its attempt (megad_launch_abort) releases it. */
void megad_launch_hold(megad_launcher *L, const char *job_id, uint32_t attempt,
                       const char *reason, unsigned grace_ms);
/* This megad stood still (stopped or starved): the attempts launched here
 * may have ended meanwhile, and ranks that stopped or hold may have nothing
 * more to report; each remote coordinator is asked (an empty report), and
 * one that no longer runs the attempt has it stopped as any refusal does. */
void megad_launch_stalled(megad_launcher *L);
/* Aborts the launches coordinated by coord_id (it died or restarted): no
 * rank runs on without its coordinator. hold: ranks with a whole state
 * keep it (as megad_launch_hold) for the node that takes the job over
 * (etcd mode) or the coordinator once it restarts, which asks
 * (megad_launch_held) and releases them, or orphan_hold_ms later. */
void megad_launch_abort_coord(megad_launcher *L, const char *coord_id, const char *reason,
                              bool hold);
/* job_id is coordinated by node_id (at address) now: steps kept for it
 * since its old coordinator died go there at once (etcd mode: a takeover),
 * whatever retry an earlier try (before node_id had adopted the job) left
 * pending. */
void megad_launch_coord_moved(megad_launcher *L, const char *job_id, const char *node_id,
                              const char *address);
/* The job's new coordinator asks about job_id's old attempt (ListHeld),
 * so it has adopted the job: steps kept for it go now, not at a retry. */
void megad_launch_resend_now(megad_launcher *L, const char *job_id);
/* As megad_launch_resend_now, from node_id (at address), which asked about
 * attempt: the steps kept of that attempt go to it even if it is the node
 * that coordinated the attempt (its megad restarted, no takeover), now or
 * once its old incarnation's loss orphans them here. */
void megad_launch_coord_asked(megad_launcher *L, const char *job_id, uint32_t attempt,
                              const char *node_id, const char *address);
/* A shutdown that saves first (megad got SIGTERM): asks the workers of every
 * launch whose job has --exit-signal-handler (of job_id; NULL: of any job)
 * to save a checkpoint at the next iteration boundary and stop (a Stop frame
 * with reason, as a SIGTERM to the worker would). Returns how many launches
 * were asked. */
size_t megad_launch_stop_graceful(megad_launcher *L, const char *job_id, const char *reason);
/* Whether such a launch still has workers running. */
bool megad_launch_graceful_live(const megad_launcher *L);
/* Shutdown: aborts everything. */
void megad_launch_abort_all(megad_launcher *L, const char *reason);
/* Passes the coordinator's go-ahead for a checkpoint to the committing
 * worker; MEGA_ERR_NOT_FOUND when it does not run here (any more). */
mega_status megad_launch_commit(megad_launcher *L, const Mega__V1__CommitCheckpointRequest *req,
                                mega_err *err);
/* The ListHeld answer for job_id's attempt here: the ranks that hold their
 * state, and in stopping those neither held nor exited yet (a released
 * launch holds none). One allocation, freed with free(); the RankHeld
 * messages are the launcher's, valid until the loop turns. NULL when out
 * of memory. */
Mega__V1__ListHeldResponse *megad_launch_held(const megad_launcher *L, const char *job_id,
                                              uint32_t attempt);
bool megad_launch_idle(const megad_launcher *L);
/* Whether a launch of job_id is here (running, holding its ranks' state,
 * or still reporting). */
bool megad_launch_has(const megad_launcher *L, const char *job_id);
/* The node ids of the other nodes that coordinate jobs with workers here
 * (borrowed, at most max, each once); returns how many. */
size_t megad_launch_coordinators(const megad_launcher *L, const char **ids, size_t max);
/* Job ids with ranks here (borrowed, at most max); returns the slots used. */
uint32_t megad_launch_load(const megad_launcher *L, const char **ids, size_t max, size_t *n);

#endif
