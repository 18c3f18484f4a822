/* The worker's end of its pipe to megad (fd 3, frames of proto/frame.h).
 *
 * megad writes an Assignment first; the worker answers with a Hello, then
 * StepReports, Progress, CheckpointDones, a WorkerError when it fails, and
 * KvRequests for its rendezvous store. megad answers KvRequests with
 * KvResponses, pings, passes the coordinator's checkpoint go-aheads, and may
 * send an Abort at any time. EOF means megad died; silence longer than the
 * Assignment's pipe_timeout_ms means it is frozen or gone: the link ends as
 * it does for an Abort, so the rank stops on its own.
 *
 *   mega_link *l;
 *   mega_link_open(3, &l, &err);                 // blocks for the Assignment
 *   const Mega__V1__Assignment *a = mega_link_assignment(l);
 *   mega_link_start(l, on_abort, arg, &err);     // the reader thread
 *   env.kv = &mega_link_kv_ops; env.kv_ctx = l;  // the rank's Gloo stores
 *   mega_link_send_hello(l, "cpu", &err);
 *   ... mega_link_send_step(l, &metrics, &err) from on_step ...
 *   mega_link_close(l);
 *
 * Threads. Sends and KV calls may come from any thread (writes hold a
 * mutex; each KV call waits for its own answer, matched by request id). The
 * abort callback runs on the reader thread, once: for the first Abort frame,
 * at EOF/a broken pipe ("megad closed the worker pipe"), or after the pipe's
 * silence; it must not call back into the link's close.
 *
 * Ownership: the link owns its fd from open on and the Assignment it read;
 * mega_link_assignment's pointer is valid until mega_link_close. */
#ifndef MEGA_WORKER_LINK_H
#define MEGA_WORKER_LINK_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "proto/mega.pb-c.h"
#include "worker/comm/comm.h"
#include "worker/rank/rank.h"

typedef struct mega_link mega_link;

/* reason is a sentence, valid during the call only. */
typedef void (*mega_link_abort_fn)(void *arg, const char *reason);

/* Takes fd and reads the first frame, which must be an Assignment (blocking,
 * up to timeout_ms; 0: 30000). On failure the fd is closed. Also ignores
 * SIGPIPE, so a dead daemon is an error on write, not a signal. */
mega_status mega_link_open(int fd, int timeout_ms, mega_link **out, mega_err *err);

const Mega__V1__Assignment *mega_link_assignment(const mega_link *l);

/* A Stop frame (megad asks a rank with --exit-signal-handler to save and
 * stop, as a SIGTERM would) calls stop_fn on the reader thread with the
 * reason and mega_link_start's arg, each time one comes. Before start. */
void mega_link_on_stop(mega_link *l, mega_link_abort_fn stop_fn);

/* Starts the reader thread. abort_fn may be NULL (then Abort only fails the
 * KV calls in flight). */
mega_status mega_link_start(mega_link *l, mega_link_abort_fn abort_fn, void *arg, mega_err *err);

/* The rendezvous store over KvRequest frames; ctx is the mega_link.
 * get and wait honour their timeout_ms (<= 0: the Assignment's
 * kv_timeout_ms, else 60 s); set waits for megad's acknowledgement. A key
 * that does not appear in time is MEGA_ERR_TIMEOUT; a daemon that cannot
 * serve the request (the coordinator unreachable, the pipe closed) is
 * MEGA_ERR_PEER with its reason. */
extern const mega_kv_ops mega_link_kv_ops;

mega_status mega_link_send_hello(mega_link *l, const char *device, mega_err *err);
/* m's spans (if any) go along, for the trace of --trace-iteration. */
mega_status mega_link_send_step(mega_link *l, const mega_rank_metrics *m, mega_err *err);
mega_status mega_link_send_checkpoint(mega_link *l, const mega_rank_ckpt_report *r,
                                      mega_err *err);
/* retryable: likely the echo of another rank's failure; fatal: the job
 * itself is bad (a restart would fail the same way). */
mega_status mega_link_send_error(mega_link *l, const char *message, bool retryable, bool fatal,
                                 mega_err *err);
mega_status mega_link_send_progress(mega_link *l, const char *phase, int64_t iteration,
                                    mega_err *err);
/* The rank stopped early as asked, after iteration (mega_rank_stopped). */
mega_status mega_link_send_stopped(mega_link *l, int64_t iteration, const char *reason,
                                   bool asked, mega_err *err);
/* A line for the job's history (an event on the coordinator). With a
 * fell_back_path, --load passed over an incomplete newer checkpoint and
 * loaded iteration fell_back_to's from there instead. */
mega_status mega_link_send_note(mega_link *l, const char *message, int64_t fell_back_to,
                                const char *fell_back_path, mega_err *err);
/* Waits up to timeout_ms (<= 0: the rendezvous timeout) for the
 * coordinator's answer about committing iteration's checkpoint: MEGA_OK for
 * the go-ahead, MEGA_ERR_UNSUPPORTED (err says why) when it refused (it
 * cannot act now: the checkpoint stays uncommitted), MEGA_ERR_TIMEOUT when
 * no answer came, MEGA_ERR_CANCELLED when the link ended. Any thread. */
mega_status mega_link_await_commit(mega_link *l, int64_t iteration, int timeout_ms,
                                   mega_err *err);

/* Recovery from replicas (rank.h). Whether the Abort that ended the link
 * asked the rank to hold its state rather than exit; whether the link has
 * since been released (an Abort without hold, EOF, a broken pipe, or the
 * pipe's silence): then a held rank exits. Any thread. */
bool mega_link_hold_asked(mega_link *l);
bool mega_link_released(mega_link *l);
/* The rank holds h, served at address with token. */
mega_status mega_link_send_held(mega_link *l, const mega_rank_held *h, const char *address,
                                const uint8_t *token, size_t token_len, mega_err *err);
/* The rank took the state of iteration from replicas. */
mega_status mega_link_send_recovered(mega_link *l, int64_t iteration, uint64_t bytes,
                                     double seconds, mega_err *err);

/* Stops the reader, fails KV calls still waiting, closes the fd and frees
 * the link. NULL is fine. */
void mega_link_close(mega_link *l);

#endif
