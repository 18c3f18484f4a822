/* Checkpoints: a Hugging Face GPT-2 directory plus the training state.
 *
 *   SAVE/latest_checkpointed_iteration.txt   "100\n": the newest complete one
 *   SAVE/iter_0000100/
 *     config.json                            GPT2LMHeadModel config
 *     model.safetensors                      one shard, or when larger than
 *     model-00001-of-00003.safetensors ...   the shard limit, HF's sharding
 *     model.safetensors.index.json           (weight_map, metadata.total_size)
 *     optimizer.safetensors (or sharded)     NAME.exp_avg, NAME.exp_avg_sq
 *     trainer_state.json                     iteration, consumed samples,
 *                                            optimizer steps, the job's flags
 *
 * Sharding follows Hugging Face: tensors in order, a new shard when the next
 * tensor would pass the limit; a single shard is plain model.safetensors.
 * The tied LM head is not written (tie_word_embeddings), as HF does.
 *
 * Atomicity: a save writes into SAVE/.tmp.iter_0000100.XXXXXX, fsyncs every
 * file and the directory, renames it into place (atomically exchanging an
 * older copy of the same iteration), fsyncs SAVE, then replaces
 * latest_checkpointed_iteration.txt through a temp file and rename. A crash
 * leaves at worst a temp directory, which loads ignore and
 * mega_ckpt_clean_temps removes.
 *
 * The API works on a list of tensors (mega_ckpt_param) so that a pipeline
 * rank saves and loads only its stage's tensors; a load ignores tensors it
 * was not asked for. A loss-only stage leaves its tied copy of wte out of
 * what it saves (the embedding stage writes transformer.wte.weight once) and
 * loads that name into its copy. Several ranks saving into one iteration
 * directory will need one committer; today one process writes it whole. Every failure (missing or truncated file, bad header,
 * missing tensor, wrong shape, config or job mismatch) is a status with a
 * message naming the file and the tensor or field. */
#ifndef MEGA_WORKER_CHECKPOINT_H
#define MEGA_WORKER_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/jobspec.h"
#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/model/gpt.h"
#include "worker/model/safetensors.h"

/* Hugging Face's default max_shard_size, 5 GB. */
#define MEGA_CKPT_DEFAULT_SHARD_BYTES 5000000000ULL
#define MEGA_CKPT_LATEST_FILE "latest_checkpointed_iteration.txt"

/* One tensor of the checkpoint. All buffers are backend memory, borrowed. */
typedef struct mega_ckpt_param {
  const char *name; /* Hugging Face name */
  int ndim;         /* 1 or 2 */
  int64_t shape[2];
  size_t numel;
  float *param;
  float *exp_avg, *exp_avg_sq; /* NULL: no optimizer state for this tensor */
} mega_ckpt_param;

/* Where training stands. */
typedef struct mega_ckpt_state {
  int64_t iteration;        /* completed iterations */
  int64_t consumed_samples; /* iteration * global batch */
  int64_t optimizer_steps;
} mega_ckpt_state;

typedef struct mega_ckpt_save_opts {
  uint64_t max_shard_bytes; /* 0: MEGA_CKPT_DEFAULT_SHARD_BYTES */
} mega_ckpt_save_opts;

/* SAVE/iter_%07d into buf; false when it does not fit. */
bool mega_ckpt_iter_path(char *buf, size_t cap, const char *dir, int64_t iteration);

/* Writes SAVE/iter_NNNNNNN for state->iteration atomically, then points
 * latest_checkpointed_iteration.txt at it. Creates SAVE when missing. job
 * (may be NULL) is recorded in trainer_state.json for the resume check.
 * opts may be NULL. */
mega_status mega_ckpt_save(const char *save_dir, mega_backend *be, const mega_gpt_config *cfg,
                           const mega_jobspec *job, const mega_ckpt_state *state,
                           const mega_ckpt_param *params, size_t n,
                           const mega_ckpt_save_opts *opts, mega_err *err);

/* Removes temp directories and files left in SAVE by interrupted saves.
 * *removed (may be NULL) gets how many. A missing SAVE is fine. */
mega_status mega_ckpt_clean_temps(const char *save_dir, int *removed, mega_err *err);

/* Resolves --load DIR to a checkpoint directory (malloc'd into *path, the
 * caller frees it): DIR's latest_checkpointed_iteration.txt, or DIR itself
 * when it is a checkpoint directory. MEGA_ERR_NOT_FOUND when DIR holds no
 * checkpoint at all (the caller may start fresh, as Megatron does);
 * MEGA_ERR_INVALID when the latest file is bad or names a missing one. */
mega_status mega_ckpt_resolve(const char *load_dir, char **path, mega_err *err);

/* Loads the checkpoint directory `path` into params (and their optimizer
 * state, where exp_avg is not NULL) and fills *state. config.json must
 * match cfg; when job is not NULL, the flags that fix the model, the data
 * order and the LR schedule must match the saved job. On failure the
 * params may be partly overwritten. */
mega_status mega_ckpt_load(const char *path, mega_backend *be, const mega_gpt_config *cfg,
                           const mega_jobspec *job, const mega_ckpt_param *params, size_t n,
                           mega_ckpt_state *state, mega_err *err);

/* ---- building blocks (ckpt_shard.c, ckpt_dir.c) ---- */

/* Writes tensors (host data) into dir as PREFIX.safetensors, or, past
 * max_shard_bytes, PREFIX-0000k-of-0000n.safetensors plus
 * PREFIX.safetensors.index.json. *nshards (may be NULL) gets the count. */
mega_status mega_ckpt_write_shards(const char *dir, const char *prefix,
                                   const mega_st_tensor *tensors, size_t n,
                                   uint64_t max_shard_bytes, int *nshards, mega_err *err);

/* An opened shard set: every file checked against the index (each listed
 * tensor in the file the weight_map names, total_size equal to the bytes
 * found). */
typedef struct mega_ckpt_shards {
  mega_st_file **files;
  size_t nfiles;
} mega_ckpt_shards;

mega_status mega_ckpt_open_shards(const char *dir, const char *prefix, mega_ckpt_shards *out,
                                  mega_err *err);
void mega_ckpt_close_shards(mega_ckpt_shards *s);
/* The file holding tensor name, NULL when none does. */
const mega_st_file *mega_ckpt_shards_find(const mega_ckpt_shards *s, const char *name);

/* fsyncs path (a file or a directory). */
mega_status mega_ckpt_fsync_path(const char *path, mega_err *err);

#endif
