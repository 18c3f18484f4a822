/* Checkpoints: a Hugging Face GPT-2 or Llama directory plus the training
 * state.
 *
 *   SAVE/latest_checkpointed_iteration.txt   "100\n": the newest committed one
 *   SAVE/iter_0000100/
 *     config.json                            GPT2LMHeadModel or LlamaForCausalLM config
 *     model.safetensors                      one shard, or, from several
 *     model-00001-of-00003.safetensors ...   writers or past the shard limit,
 *     model.safetensors.index.json           HF's shards (weight_map, total_size)
 *     optimizer.safetensors (or sharded)     NAME.exp_avg, NAME.exp_avg_sq
 *     trainer_state.json                     iteration, consumed samples,
 *                                            optimizer steps, the attempt, the
 *                                            LR schedule, the job's flags
 *     manifest.json                          written last: every other file
 *                                            with its size and crc32, the
 *                                            iteration and the attempt
 *
 * Whole tensors by name: a checkpoint does not depend on the parallel layout
 * that wrote it, and every rank of any other layout loads its own tensors
 * by name. A tied LM head is not written (tie_word_embeddings), as HF
 * does; a loss-only stage loads the embedding (transformer.wte.weight,
 * model.embed_tokens.weight) into its copy. An untied head is lm_head.weight.
 *
 * Writing (worker/ckpt/ckpt_writer.h): one writer per pipeline stage writes its
 * own shards into SAVE/.tmp.iter_0000100.aA (A: the launcher's attempt) and
 * fsyncs them; the committer (writer 0) gathers every writer's file list,
 * writes the indexes, config.json, trainer_state.json and, last,
 * manifest.json, then renames the directory into place (atomically
 * exchanging an older copy of the same iteration), fsyncs SAVE and replaces
 * latest_checkpointed_iteration.txt through a temp file and a rename. A
 * crash leaves at worst a temp directory, which loads ignore and
 * mega_ckpt_clean_temps removes.
 *
 * Completeness: a checkpoint is complete when its manifest.json is there
 * and every file it lists has the listed size and crc32 (zlib's).
 * mega_ckpt_resolve loads only complete checkpoints: when the one latest
 * names is incomplete it falls back to the newest complete one and says so.
 *
 * Sharding follows Hugging Face within a writer (tensors in order, a new
 * shard when the next tensor would pass the limit); shards are numbered
 * across writers in writer order. A checkpoint of one shard is plain
 * model.safetensors with no index.
 *
 * Every failure (missing or truncated file, bad header, missing tensor, wrong
 * shape, config or job mismatch) is a status with a message naming the file
 * and the tensor or field. */
#ifndef MEGA_WORKER_CHECKPOINT_H
#define MEGA_WORKER_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/jobspec.h"
#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/model/gpt.h"
#include "worker/model/safetensors.h"
#include "worker/optim/lr_sched.h"

/* Hugging Face's default max_shard_size, 5 GB. */
#define MEGA_CKPT_DEFAULT_SHARD_BYTES 5000000000ULL
#define MEGA_CKPT_LATEST_FILE "latest_checkpointed_iteration.txt"
#define MEGA_CKPT_MANIFEST_FILE "manifest.json"

/* One tensor of the checkpoint. All buffers are backend memory, borrowed.
 * shape and numel are the whole tensor's, as files hold it. The buffers
 * hold the whole tensor too, unless tp_size > 1: then they hold rank
 * tp_rank's slice (tp says how it is cut; local_numel floats), which loads
 * cut from the whole tensor. Writers always get whole tensors. */
typedef struct mega_ckpt_param {
  const char *name; /* Hugging Face name */
  int ndim;         /* 1 or 2 */
  int64_t shape[2];
  size_t numel;
  float *param;
  float *exp_avg, *exp_avg_sq; /* NULL: no optimizer state for this tensor */
  int tp_size, tp_rank;        /* 0 or 1: whole */
  mega_tp_split tp;
  size_t local_numel;
} mega_ckpt_param;

/* Floats the buffers of p hold. */
static inline size_t mega_ckpt_param_local(const mega_ckpt_param *p) {
  return p->tp_size > 1 ? p->local_numel : p->numel;
}

/* Where training stands. */
typedef struct mega_ckpt_state {
  int64_t iteration;        /* completed iterations */
  int64_t consumed_samples; /* iteration * global batch */
  int64_t optimizer_steps;  /* at most iteration (fewer after --no-load-optim) */
  int attempt;              /* the launcher's attempt that wrote it */
  /* evaluation batches run so far x global batch (Megatron's
   * consumed_valid_samples); -1 on load: the checkpoint predates it */
  int64_t consumed_valid_samples;
  bool has_sched;           /* sched is meaningful (save: record it; load: it was recorded) */
  mega_lr_sched sched;      /* the LR schedule the run used */
} mega_ckpt_state;

typedef struct mega_ckpt_save_opts {
  uint64_t max_shard_bytes; /* 0: MEGA_CKPT_DEFAULT_SHARD_BYTES */
} mega_ckpt_save_opts;

/* SAVE/iter_%07d into buf; false when it does not fit. */
bool mega_ckpt_iter_path(char *buf, size_t cap, const char *dir, int64_t iteration);

/* One process writes every tensor: SAVE/iter_NNNNNNN for state->iteration,
 * committed at once (worker/ckpt/ckpt_writer.h with a single writer). Creates
 * SAVE when missing. job (may be NULL) is recorded in trainer_state.json
 * for the resume check. opts may be NULL. On failure nothing is left. */
mega_status mega_ckpt_save(const char *save_dir, mega_backend *be, const mega_gpt_config *cfg,
                           const mega_jobspec *job, const mega_ckpt_state *state,
                           const mega_ckpt_param *params, size_t n,
                           const mega_ckpt_save_opts *opts, mega_err *err);

/* Removes temp directories and files left in SAVE by interrupted saves.
 * *removed (may be NULL) gets how many. A missing SAVE is fine. Only call it
 * when no rank can be writing into SAVE. */
mega_status mega_ckpt_clean_temps(const char *save_dir, int *removed, mega_err *err);

/* Before training: SAVE created (with its parents) and writable, so a bad
 * --save fails at the start and not at the first save, hours in; then
 * mega_ckpt_clean_temps (the same rule: no rank may be writing into it).
 * A SAVE no directory can be made at (under a file, not permitted, a
 * read-only tree) is MEGA_ERR_INVALID, a bad job; a failing disk MEGA_ERR_IO. */
mega_status mega_ckpt_prepare_save(const char *save_dir, mega_err *err);

/* Checks that the checkpoint directory dir is complete: manifest.json is
 * there, and every file it lists has its size and crc32. iteration >= 0 is
 * also checked against the manifest's. Reads every listed file. MEGA_OK or
 * MEGA_ERR_INVALID with the first problem found (files in name order);
 * MEGA_ERR_UNSUPPORTED for a manifest of a version this build does not
 * read (another build's format), naming the build that wrote it. */
mega_status mega_ckpt_verify(const char *dir, int64_t iteration, mega_err *err);
/* mega_ckpt_verify, with the optimizer's files (optimizer.safetensors, its
 * shards and index) apart: MEGA_OK when every other file is good, and
 * *optim gets the first problem with an optimizer file (status MEGA_OK:
 * none). With weights_only their checksums are not read (their presence
 * and sizes are still checked). */
mega_status mega_ckpt_verify_parts(const char *dir, int64_t iteration, bool weights_only,
                                   mega_err *optim, mega_err *err);

/* Resolves --load DIR to a complete checkpoint directory (malloc'd into
 * *path, the caller frees it):
 *  - DIR's latest_checkpointed_iteration.txt names one: that one when it is
 *    complete, else the newest complete iter_* in DIR; *notice (malloc'd,
 *    may be NULL) then says which was incomplete, why, and what loads
 *    instead. None complete: MEGA_ERR_INVALID saying so. A latest file
 *    whose text names no iteration is passed over the same way; one that
 *    cannot be read is MEGA_ERR_IO, and Megatron's "release" (a checkpoint
 *    mega cannot load) MEGA_ERR_UNSUPPORTED.
 *  - No latest file: DIR itself when it is a checkpoint directory (it must
 *    be complete), else the newest complete iter_* in DIR.
 *  - MEGA_ERR_NOT_FOUND when DIR holds no checkpoint at all or does not
 *    exist (the caller may start fresh, as Megatron does); MEGA_ERR_INVALID
 *    when DIR is a file, or DIR holds iter_* directories of which none is
 *    complete.
 * A checkpoint in a format this build does not read (a newer build's) is
 * never passed over for an older one, whose iterations a save would then
 * write over it: MEGA_ERR_UNSUPPORTED, naming the build that wrote it.
 * Every rank that resolves the same directory reaches the same answer:
 * verification reads every file of a candidate. notice may be NULL. */
mega_status mega_ckpt_resolve(const char *load_dir, char **path, char **notice, mega_err *err);
/* A checkpoint whose optimizer files are missing or bad is incomplete to
 * mega_ckpt_resolve (a resume needs them), and its reason then says that
 * the weights are whole and --no-load-optim loads them.
 * mega_ckpt_resolve_weights is for loads that need only the weights (megaw
 * generate, --no-load-optim, --finetune): it takes such a checkpoint, and
 * *notice then says its optimizer state is unusable; the optimizer files'
 * checksums are not read. Otherwise as mega_ckpt_resolve. */
mega_status mega_ckpt_resolve_weights(const char *load_dir, char **path, char **notice,
                                      mega_err *err);

/* Whether --load DIR holds anything resolve would look at (a latest file,
 * a checkpoint directory, an iter_* directory), without reading it: a
 * cheap guess at whether a load will overwrite the parameters. resolve
 * still decides (it may find nothing complete). */
bool mega_ckpt_present(const char *load_dir);

/* Loads the checkpoint directory `path` into params (and their optimizer
 * state, where exp_avg is not NULL) and fills *state. config.json must
 * match cfg; when job is not NULL, the flags that fix the model and the
 * data order must match the saved job (the LR schedule is the caller's to
 * check, mega_ckpt_check_sched). The manifest is not verified here
 * (mega_ckpt_resolve does). A trainer_state.json of a version this build
 * does not read is MEGA_ERR_UNSUPPORTED, and a saved job with a flag it
 * does not know MEGA_ERR_INVALID, each naming the build that wrote it. On
 * failure the params may be partly overwritten. */
mega_status mega_ckpt_load(const char *path, mega_backend *be, const mega_gpt_config *cfg,
                           const mega_jobspec *job, const mega_ckpt_param *params, size_t n,
                           mega_ckpt_state *state, mega_err *err);

/* dir/config.json (Hugging Face's GPT-2 or Llama config, as mega writes
 * it) as mega's model config, checked (mega_gpt_config_check). A config of
 * another architecture, or of a Llama mega cannot run (RoPE scaling,
 * another activation, biases on only some layers), is MEGA_ERR_INVALID
 * saying why. */
mega_status mega_ckpt_read_config(const char *dir, mega_gpt_config *cfg, mega_err *err);

/* Resuming with a different LR schedule is an error: MEGA_ERR_INVALID
 * naming the first value that differs and the flags that allow it
 * (--override-opt_param-scheduler, --use-checkpoint-opt_param-scheduler).
 * Lengths are named in job's unit: iterations of its global batch, or samples
 * (job NULL: samples). */
mega_status mega_ckpt_check_sched(const char *path, const mega_lr_sched *saved,
                                  const mega_lr_sched *mine, const mega_jobspec *job,
                                  mega_err *err);

/* ---- building blocks (ckpt_shard.c, ckpt_dir.c, ckpt_manifest.c) ---- */

/* One file of a checkpoint, as the manifest lists it. */
typedef struct mega_ckpt_file {
  char name[64]; /* inside the checkpoint directory */
  uint64_t size;
  uint32_t crc32;
} mega_ckpt_file;

/* Size and zlib crc32 of the file at path. */
mega_status mega_ckpt_file_sum(const char *path, uint64_t *size, uint32_t *crc, mega_err *err);

/* Hugging Face's split (huggingface_hub's split_state_dict_into_shards):
 * shard_of[i] gets tensor i's shard, numbered as HF lists them; returns the
 * number of shards (0 when n is 0), -1 when out of memory. */
int mega_ckpt_plan_shards(const mega_st_tensor *t, size_t n, uint64_t max_shard_bytes,
                          int *shard_of);

/* PREFIX.safetensors when total is 1, else PREFIX-%05d-of-%05d (k from 0). */
void mega_ckpt_shard_name(char *buf, size_t cap, const char *prefix, int k, int total);

/* Writes tensors (host data) planned by mega_ckpt_plan_shards into nshards
 * files of dir, numbered first .. first+nshards-1 of total; each is fsynced.
 * files[nshards] gets each file's name, size and crc32; weight_map (a JSON
 * object, may be NULL) gets tensor name -> file name. */
mega_status mega_ckpt_write_part(const char *dir, const char *prefix,
                                 const mega_st_tensor *tensors, size_t n, const int *shard_of,
                                 int nshards, int first, int total, mega_ckpt_file *files,
                                 json_t *weight_map, mega_err *err);

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
