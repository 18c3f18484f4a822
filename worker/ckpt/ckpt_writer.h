/* One writer's part of a checkpoint that several processes write together.
 *
 * Each pipeline stage has one writer (its dp 0, tp 0 rank: data-parallel
 * replicas hold equal weights); writer 0 also commits. A save has two
 * halves:
 *
 *   mega_ckpt_writer_stage(w, be, &state, &err);  // the tensors to host memory
 *   mega_ckpt_writer_write(w, &res, &err);         // files, gather, commit
 *
 * stage uses the backend, so it runs where the model lives, between steps.
 * write uses only the host copies, files and the writers' communicator, so
 * it may run on another thread (--async-save) while training goes on, as
 * long as nothing else uses that communicator meanwhile (comm.h, Ordering).
 * Each writer's write:
 *
 *  1. all-gathers the writers' shard counts, so shards are numbered across
 *     writers (model-0000k-of-0000n.safetensors, in writer order);
 *  2. writes its shards into the shared SAVE/.tmp.iter_NNNNNNN.aA, fsyncs
 *     them and the directory, takes each file's size and crc32, and calls
 *     on_durable;
 *  3. all-gathers its file list and tensor-to-file maps (or its failure).
 *
 * The committer then writes the indexes, config.json and trainer_state.json,
 * asks await_commit (when set), writes manifest.json last, renames the
 * directory into place, fsyncs SAVE and points latest at it. When a writer
 * failed the committer removes the temp directory and fails naming it; when
 * await_commit refuses, it removes the directory too, and write returns
 * MEGA_OK with committed false (the reason in res.refused). When a gather
 * fails (the writers' communicator aborted: a cancel, a signal, a lost
 * peer), each writer that sees it removes the temp directory and fails.
 *
 * Every writer calls stage and write for the same iterations in the same
 * order: the gathers pair them up.
 *
 * Ownership: the writer borrows params (backend memory) and everything in
 * the config, which must outlive it; it owns its host copies. */
#ifndef MEGA_WORKER_CKPT_WRITER_H
#define MEGA_WORKER_CKPT_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/ckpt/checkpoint.h"
#include "worker/comm/comm.h"

/* How long a writer's gather waits for the slowest writer: writing
 * shards to a slow disk takes long, and writers finish unevenly. */
#define MEGA_CKPT_WRITERS_TIMEOUT_MS (30 * 60 * 1000)

typedef struct mega_ckpt_writer_config {
  const char *save_dir;       /* --save */
  const mega_gpt_config *cfg; /* config.json (the committer writes it) */
  const mega_jobspec *job;    /* may be NULL: recorded in trainer_state.json */
  mega_comm *comm;            /* the writers, rank = writer index; NULL: a lone writer */
  int attempt;                /* the launcher's: in the temp directory's name and the manifest */
  uint64_t max_shard_bytes;   /* 0: MEGA_CKPT_DEFAULT_SHARD_BYTES */
  int timeout_ms;             /* each gather's bound; 0: MEGA_CKPT_WRITERS_TIMEOUT_MS */
  /* Called inside write once this writer's files are durable; may be NULL. */
  void (*on_durable)(void *arg, int64_t iteration, uint64_t bytes);
  /* The committer's go-ahead, asked before the manifest; may be NULL
   * (commit at once). See mega_rank_env.await_commit. */
  mega_status (*await_commit)(void *arg, int64_t iteration, mega_err *err);
  void *arg;
} mega_ckpt_writer_config;

typedef struct mega_ckpt_write_result {
  char path[4096];      /* SAVE/iter_NNNNNNN */
  uint64_t bytes;       /* this writer's files */
  bool committer;       /* this is writer 0 */
  bool committed;       /* committer: in place, and latest names it */
  uint64_t total_bytes; /* committer, when committed: every file of the checkpoint */
  mega_err refused;     /* committer: await_commit's reason when it refused (status set) */
} mega_ckpt_write_result;

typedef struct mega_ckpt_writer mega_ckpt_writer;

/* Allocates the host copies of params (and of their optimizer moments,
 * where exp_avg is set). The config is copied; what it points to is not. */
mega_status mega_ckpt_writer_create(const mega_ckpt_writer_config *cfg,
                                    const mega_ckpt_param *params, size_t n,
                                    mega_ckpt_writer **out, mega_err *err);
void mega_ckpt_writer_destroy(mega_ckpt_writer *w); /* NULL is fine */

/* Copies every tensor to host memory and records state for the next write. */
mega_status mega_ckpt_writer_stage(mega_ckpt_writer *w, mega_backend *be,
                                   const mega_ckpt_state *state, mega_err *err);

/* Writes what the last stage copied (see above). res is filled either way. */
mega_status mega_ckpt_writer_write(mega_ckpt_writer *w, mega_ckpt_write_result *res,
                                   mega_err *err);

#endif
