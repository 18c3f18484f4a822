/* Real megad processes for the integration tests and the benchmark: start
 * one on 127.0.0.1 with a port of its own and a temporary state dir, talk to
 * it through proto/rpc_client, find its workers, stop or kill it.
 *
 * MEGAD and MEGAW (environment) name the programs; the meson test sets them. */
#ifndef MEGA_TESTS_DAEMON_HARNESS_H
#define MEGA_TESTS_DAEMON_HARNESS_H

#include <stdbool.h>
#include <sys/types.h>

#include "proto/mega_rpc.h"
#include "proto/rpc_client.h"

typedef struct hd {
  pid_t pid;
  char name[64]; /* a node name: at most 63 bytes */
  int slots;
  char peers[128];
  char dir[128];  /* state dir (owned by the test: removed by hd_cleanup) */
  char log[160];  /* megad's stderr */
  char addr[64];  /* 127.0.0.1:PORT */
  mega_rpc_channel *ch;
} hd;

/* What the channels hd_start opens from now on carry (the token, TLS);
 * NULL: nothing. a must outlive those daemons. */
void hd_set_auth(const mega_rpc_auth *a);

/* A temporary directory for a test (removed by hd_rmdir). */
void hd_tmpdir(char *buf, size_t len);
void hd_rmdir(const char *dir);

/* Starts `megad serve --listen 127.0.0.1:0 --state-dir DIR --slots SLOTS
 * --node-name NAME [--peers PEERS] [extra...]` and waits for its "listening"
 * line. state_dir NULL: a fresh one. Returns false (with the log on stderr)
 * when it does not come up. */
bool hd_start(hd *d, const char *name, int slots, const char *peers, const char *state_dir,
              const char *const *extra);
/* kill -9 (when it runs), then starts the same megad again on its state dir
 * (name, slots, peers; extra as hd_start's): a restart after a crash. */
bool hd_restart(hd *d, const char *const *extra);
/* SIGTERM and wait (up to 20 s); the exit status, or -1. */
int hd_stop(hd *d);
/* SIGKILL and reap. */
void hd_kill(hd *d);
/* Frees the channel and removes the state dir. */
void hd_cleanup(hd *d);
/* Kills and cleans up every daemon still running (a failed test's teardown;
 * also runs at exit), so no megad outlives its test. */
void hd_cleanup_all(void);
void hd_dump_log(const hd *d);
/* Whether a line of megad's log holds text. */
bool hd_log_has(const hd *d, const char *text);
/* The first line of megad's log (0: its first) that holds text; -1: none.
 * Lines of one megad come in the order it did things. */
int hd_log_line(const hd *d, const char *text);
/* Waits up to ms for text to appear in d's log; on a timeout prints the log. */
bool hd_wait_log(const hd *d, const char *text, int ms);

/* Pids of megad's live child processes (its workers); returns how many. */
int hd_workers(const hd *d, pid_t *pids, int max);
/* Waits up to ms until megad has n workers (or more). */
bool hd_wait_workers(const hd *d, int n, int ms, pid_t *pids);
bool hd_pid_alive(pid_t pid);
/* `megad serve --slots 1 --worker MEGAW ARGS` (args as shell words) run to
 * its exit: its stdout and stderr in out, its exit status back (-1: none;
 * 124: still running after 15 s, and ended). */
int hd_megad_exits(char *out, size_t len, const char *args);

/* The tiny GPT's flags on a data file in dir, with iters and any extra flags
 * (NULL-terminated); writes the argv into spec (which points into static
 * storage of the call: use it before the next call). */
void hd_tiny_spec(Mega__V1__JobSpec *spec, const char *dir, int iters, const char *const *extra);

/* Peer.LaunchRanks of rank 0 of a world of 1 (the tiny GPT's flags plus
 * extra), as a client holding the token could send it, naming d itself as
 * the coordinator, of build version (NULL: d's own; "": none, as a megad
 * older than the field): the status of the call, its message in err. */
mega_status hd_launch_by_hand(hd *d, const char *job_id, const char *version,
                              const char *const *extra, mega_err *err);
/* d's build (megad --version's words after "megad "), as its view of
 * itself says; false (buf "") when it does not answer. */
bool hd_version(hd *d, char *buf, size_t len);

/* Unary calls; resp is the caller's (free_unpacked). */
mega_status hd_submit(hd *d, const Mega__V1__JobSpec *spec, char *job_id, size_t len,
                      mega_err *err);
Mega__V1__Job *hd_get_job(hd *d, const char *job_id, mega_err *err);
/* CancelJob with reason (may be NULL), waiting up to 10 s for the answer. */
mega_status hd_cancel(hd *d, const char *job_id, const char *reason, mega_err *err);
/* The job and its history (GetJob's events: its first and newest); NULL on an error. */
Mega__V1__GetJobResponse *hd_get_job_history(hd *d, const char *job_id, mega_err *err);
/* When (unix ms) the nth event of kind whose message holds text (NULL: any)
 * was made, in job_id's history as d tells it; 0 if none (or no answer). */
int64_t hd_event_ms(hd *d, const char *job_id, Mega__V1__JobEventKind kind, int nth,
                    const char *text);
Mega__V1__ListNodesResponse *hd_list_nodes(hd *d, mega_err *err);
/* Waits up to ms until job_id has a committed checkpoint at or past
 * iteration; returns its iteration (0: none in time). */
uint64_t hd_wait_checkpoint(hd *d, const char *job_id, uint64_t iteration, int ms);
/* Nodes the view shows ALIVE; waits up to ms for want. */
bool hd_wait_alive(hd *d, int want, int ms);
/* Waits up to ms until d's view has node with at least `used` slots in use
 * (what d places jobs by: another node's load reaches it in a heartbeat, or
 * from etcd, a while after that node started ranks). */
bool hd_wait_node_busy(hd *d, const char *node, uint32_t used, int ms);

#define HD_MAX_ITERS 512

/* What a WatchJob stream brought, to its end. */
typedef struct hd_watch {
  int steps, events;
  uint64_t last_iteration;
  double last_loss;
  uint32_t ranks;
  Mega__V1__Job *final; /* the caller's */
  char events_text[8192];
  mega_status end;
  mega_err err;
  /* every iteration's loss as the last attempt that reached it merged it */
  double loss[HD_MAX_ITERS + 1];
  uint32_t attempt[HD_MAX_ITERS + 1], world[HD_MAX_ITERS + 1];
  bool seen[HD_MAX_ITERS + 1];
  int redone; /* iterations merged again by a later attempt */
  int gaps;            /* WatchGap items: megad skipped steps for this watcher */
  uint64_t missed;     /* the steps they counted */
} hd_watch;

/* Called for every item as it comes (before it is counted), so a test can
 * act at a chosen point; may be NULL. */
typedef void (*hd_item_fn)(void *arg, const Mega__V1__WatchJobResponse *item);

/* Watches to the stream's end (timeout_ms for the whole stream). */
void hd_watch_job(hd *d, const char *job_id, bool replay, unsigned timeout_ms, hd_watch *w);
void hd_watch_job_cb(hd *d, const char *job_id, bool replay, unsigned timeout_ms, hd_watch *w,
                     hd_item_fn fn, void *arg);
void hd_watch_free(hd_watch *w);

/* An hd_item_fn that stops victim once a step at or past `at` is merged:
 * sig 0 kills its megad (kill -9, and with it its workers), else sends it
 * sig (SIGTERM: a graceful stop, which the test then waits for). */
typedef struct hd_node_stopper {
  hd *victim;
  uint64_t at;
  int sig;
  bool done;
  int64_t when_ms;
} hd_node_stopper;
void hd_stop_node_at(void *arg, const Mega__V1__WatchJobResponse *item);

/* Waits up to ms until no process of megad megad_pid is left (its workers,
 * orphans included: MEGAD_PID in their environment); false, naming one,
 * after ms. */
bool hd_workers_gone(pid_t megad_pid, int ms);
/* The same for node d's megad; on failure also dumps its log and its
 * ranks' logs. */
bool hd_node_workers_gone(const hd *d, int ms);
/* Whether text holds every string of has and none of lacks (NULL-ended
 * lists; either may be NULL). If not, says which and prints text under
 * what: a test shows a job's events only when it is about to fail. */
bool hd_text_ok(const char *what, const char *text, const char *const *has,
                const char *const *lacks);
#define HD_ALL(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Whether the watch ended with the job SUCCEEDED; if not, says what the
 * watch saw and dumps d's log. */
bool hd_succeeded(const hd *d, const hd_watch *w);

/* Live processes whose command line or environment holds needle (a state
 * dir; "MEGAD_PID=123" finds megad 123's workers, orphans too): what a
 * test checks is left over. Returns how many. */
int hd_procs_matching(const char *needle, pid_t *pids, int max);

double hd_now_s(void);
/* Wall-clock milliseconds since the epoch (events' time_unix_ms). */
int64_t hd_unix_ms(void);

/* harness_check.c (they assert, cmocka): the losses of an uninterrupted
 * run of spec on d, by iteration; and every iteration of got within rtol
 * of ref's (within 1e-6 where a new attempt takes over: lost or wrong
 * state shows there at once), an iteration whose loss died with a node
 * (the event says so) excepted. */
void hd_reference(hd *d, const Mega__V1__JobSpec *spec, hd_watch *ref);
void hd_same_losses(const hd_watch *got, const hd_watch *ref, int iters, double rtol);
/* Waits up to 20 s until d runs n workers (pids filled); if not, dumps d's
 * log and fails the test, naming job_id. */
void hd_ranks_started(const hd *d, const char *job_id, int n, pid_t *pids);
/* Writes text to path (replacing it) and gives it mode; asserts. */
void hd_write_file(const char *path, const char *text, mode_t mode);

/* megactl ARGS (MEGACTL names it; its stderr with its stdout) run to its
 * end: its exit status. out keeps the last len - 1 bytes, and *seen (may be
 * NULL) says whether needle came anywhere in the whole output. */
int hd_megactl_seen(char *out, size_t len, const char *args, const char *needle, bool *seen);
int hd_megactl(char *out, size_t len, const char *args);

/* A free TCP port on 127.0.0.1 (bound, then let go), e.g. for --metrics-listen. */
int hd_free_port(void);
/* GET path from 127.0.0.1:port over HTTP/1.0, with an Authorization header
 * value (NULL: none): the whole answer, headers included (the caller frees). */
char *hd_http_get(int port, const char *path, const char *auth);

#endif
