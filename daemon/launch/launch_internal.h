/* A node's share of a job, shared by the launcher's files, each calling
 * only the ones below it:
 *
 *   launch.c       the worker processes: spawn, pipes, output, exits
 *   hangcheck.c    pings and the hang check (workers making no progress)
 *   relay.c        what passes between the workers and the job's
 *                  coordinator: reports and KV requests
 *   resend.c       the last reports relayed, kept for a new coordinator
 *                  when the job's dies
 *   launch_life.c  frames down the pipe, kill, abort, the launch's end
 *   launch_check.c what a launch must pass before any of its ranks starts
 *
 * Private to the launcher. */
#ifndef MEGA_DAEMON_LAUNCH_INTERNAL_H
#define MEGA_DAEMON_LAUNCH_INTERNAL_H

#include "daemon/launch/launch.h"
#include "proto/frame.h"

#define MEGAD_TAIL_LINES 20
#define LINE_MAX_KEPT 300
#define STEP_WINDOW 16
#define MEGAD_ATTEMPT_DIRS_KEPT 16

typedef struct kvop kvop;

/* The last RESEND_KEEP step reports a launch relayed to a remote
 * coordinator, acknowledged or not (resend.c): a ring, oldest at head. */
typedef struct relay_kept {
  Mega__V1__StepReport **v;
  uint64_t *seq;
  size_t head, n;
  uint64_t next_seq, acked_seq; /* seqs up to acked_seq reached the coordinator */
  uint64_t lost;                /* dropped unacknowledged */
} relay_kept;

typedef struct megad_worker {
  megad_launch *l;
  uint32_t rank, local_rank;
  uv_process_t proc;
  uv_pipe_t pipe, out, err;
  uv_timer_t timer; /* pipe EOF without exit; stderr drain after exit */
  int open;         /* handles not yet closed */
  mega_frame_decoder dec;
  int pid;
  bool spawned, exited, pipe_eof, err_eof, out_eof, reported, closing, broken;
  bool slot_held; /* counted in the launcher's slots_used */
  bool held;      /* it stopped and keeps its state for the next attempt (RankHeld): no slot,
                     no hang check, not killed until the launch is released */
  Mega__V1__RankHeld *held_msg; /* what it holds (owned), for a coordinator that asks later */
  uint32_t slot;  /* which one: its GPU on a node with GPUs */
  int64_t exit_status;
  int term_signal;
  char *error_msg; /* its WorkerError, if it sent one */
  char tail[MEGAD_TAIL_LINES][LINE_MAX_KEPT];
  int tail_n, tail_next;
  char partial[LINE_MAX_KEPT];
  size_t partial_len;
  int log_fd;
  kvop *ops;
  /* the hang check's view (hangcheck.c) */
  char phase[16];         /* "setup", "train", "eval", "checkpoint" */
  uint64_t progress_ms;   /* uv_now of the last progress (a step, a phase) */
  double steps[STEP_WINDOW]; /* recent step times, seconds */
  int nsteps;
  bool hung; /* reported */
} megad_worker;

struct megad_launch {
  megad_launch *next;
  megad_launcher *L;
  Mega__V1__LaunchRanksRequest *req; /* owned copy */
  char *dir;                         /* state_dir/jobs/<id>/<attempt> */
  bool coord_local, coord_gone, aborting;
  bool orphaned; /* its coordinator died and a new one may take the job over */
  bool probe;    /* the next report goes even if empty (relay_probe) */
  uint64_t orphan_until; /* uv_now when its held ranks let go (coordinator lost); 0: never */
  relay_kept kept;
  bool released; /* an abort without hold was sent: held workers go too */
  bool graceful; /* the job has --exit-signal-handler: a shutdown asks it to save and stop */
  megad_worker *w;
  size_t nw, live; /* live: workers with handles still open */
  uv_timer_t kill_timer, retry_timer;
  int timers_open;
  /* reports to a remote coordinator: queued, and the batch in flight */
  Mega__V1__StepReport **steps;
  size_t nsteps;
  Mega__V1__RankEvent **events;
  size_t nevents;
  bool sending;
  int refs; /* async callbacks still to come (reports, KV forwards) */
};

/* A KV request of a worker in progress. */
struct kvop {
  kvop *next;
  megad_worker *w; /* NULL once the worker went away */
  megad_launch *l;
  uint64_t request_id;
  megad_kvwait *wait;
  char *get_key; /* a get that waits: the key to answer with once it exists */
  /* a gather here: its keys (prefixed) and parts, answered once they exist */
  char **keys;
  size_t nkeys;
  uint32_t parts;
  uint32_t *part;
};

/* launch_output.c: n bytes of the worker's stdout or stderr (is_err) go
 * to its rank log; stderr's lines are kept, the last MEGAD_TAIL_LINES.
 * launch_tail_text: those lines joined by newlines (malloc'd; NULL when
 * out of memory). */
void launch_capture(megad_worker *w, const char *buf, size_t n, bool is_err);
char *launch_tail_text(megad_worker *w);

/* launch_life.c: the lower half, which relay.c and hangcheck.c use */
void launch_send_frame(megad_worker *w, const Mega__V1__DaemonFrame *f);
void launch_send_kv_response(megad_worker *w, uint64_t id, bool found, const uint8_t *val,
                             size_t len, const char *error);
/* A gather's answer: the values, in the order asked. */
void launch_send_kv_values(megad_worker *w, uint64_t id, ProtobufCBinaryData *values, size_t n);
void launch_send_abort(megad_worker *w, const char *reason, unsigned grace_ms, bool hold);
void launch_kill_worker(megad_worker *w);
/* Abort frames to l's workers, then SIGKILL after grace_ms. hold: workers
 * with a whole state may keep it (they answer RankHeld) and are not
 * killed; a later abort without hold releases them. Each kind once. */
void launch_abort(megad_launch *l, const char *reason, unsigned grace_ms, bool hold);
/* Whether attempt (or a later one) of job_id was stopped here already. */
bool launch_attempt_ended(const megad_launcher *L, const char *job_id, uint32_t attempt);
/* Drops the reports still queued for the coordinator. */
void launch_free_queue(megad_launch *l);
/* Frees l once nothing refers to it any more (workers closed, callbacks in). */
void launch_maybe_free(megad_launch *l);
/* Removes the directories (ranks' logs) of l's job's attempts here older
 * than the newest MEGAD_ATTEMPT_DIRS_KEPT and with no launch left: a job
 * restarted for weeks (node losses and megad's restarts are not counted
 * against --max-restarts) would otherwise leave one per attempt. */
void launch_prune_attempts(megad_launch *l);

/* launch_check.c: what megad_launch_start checks before it spawns
 * (launch.h's megad_launch_check but the directory); *graceful: the job
 * has --exit-signal-handler; files (may be NULL: not read) as
 * megad_launch_check's. launch_attempt_dir makes the attempt's
 * directory, STATE/jobs/<id>/<attempt> (or finds it there): its path,
 * malloc'd, or NULL with err filled. */
mega_status launch_check(const megad_launcher *L, const Mega__V1__LaunchRanksRequest *req,
                         bool *graceful, megad_launch_files *files, mega_err *err);
char *launch_attempt_dir(const megad_launcher *L, const char *job_id, uint32_t attempt,
                         mega_err *err);

/* relay.c */
/* A worker's step or event, to the coordinator: at once when it is this
 * node, else batched into Peer ReportStep calls (retried until they land,
 * or the coordinator is gone). */
void relay_step(megad_launch *l, const Mega__V1__StepReport *r);
void relay_event(megad_launch *l, megad_worker *w, Mega__V1__RankEvent *ev);
void relay_flush(megad_launch *l);
/* Asks l's coordinator, with a report even if empty, whether it still runs
 * l's attempt (a refusal aborts it, as for any report). */
void relay_probe(megad_launch *l);
/* A worker's KvRequest: served from this node's store when it coordinates
 * the job, else forwarded to the coordinator's Peer Kv*. */
void relay_kv(megad_worker *w, const Mega__V1__KvRequest *req);
/* The worker went away: its KV requests end without an answer. */
void relay_worker_gone(megad_worker *w);

/* resend.c */
/* Keeps a copy of r (relayed to a remote coordinator); its seq. */
uint64_t resend_keep(megad_launch *l, const Mega__V1__StepReport *r);
/* The coordinator acknowledged every report kept up to seq upto. */
void resend_acked(megad_launch *l, uint64_t upto);
/* l's coordinator died: what l kept waits for the job's new coordinator. */
void resend_orphan(megad_launch *l);
/* A step of an orphaned launch, after its coordinator died: kept likewise. */
void resend_orphan_step(megad_launch *l, const Mega__V1__StepReport *r);
void resend_free_kept(megad_launch *l);
/* Every tick: sends waiting steps to a known new coordinator, drops those
 * that waited too long. */
void resend_tick(megad_launcher *L);
void resend_free_all(megad_launcher *L);

/* hangcheck.c */
/* A sign of progress from w: a step report (step_s > 0) or a new phase. */
void hangcheck_progress(megad_worker *w, const char *phase, double step_s);
/* Every tick: pings, and workers that made no progress in time. */
void hangcheck_tick(megad_launcher *L);

#endif
