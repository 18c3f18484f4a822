/* Shared by the checkpoint files of worker/ckpt/ (and the fuzz tests);
 * not a public interface. Each part names the file that defines it. */
#ifndef MEGA_WORKER_CKPT_INTERNAL_H
#define MEGA_WORKER_CKPT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "core/status.h"
#include "worker/ckpt/checkpoint.h"

#define MEGA_CKPT_STATE_FILE "trainer_state.json"
#define MEGA_CKPT_STATE_FORMAT "mega-checkpoint"
#define MEGA_CKPT_STATE_VERSION 2 /* 2: attempt, lr_schedule, manifest.json */
/* Both JSON files of mega's own also say which build wrote them
 * ("mega_version", core/version.h; absent from builds before it), so a
 * refusal of one this build cannot read names that build. */
#define MEGA_CKPT_VERSION_KEY "mega_version"
#define MEGA_CKPT_CONFIG_FILE "config.json"
#define MEGA_CKPT_TEMP_PREFIX ".tmp."

/* ckpt_dir.c: creates save_dir and the temp directory the writers of one
 * save share, SAVE/.tmp.iter_NNNNNNN.aA (A: the attempt); its path goes to
 * tmp. A directory already there is used as it is, unless fresh (a single
 * writer), which empties it first. */
mega_status mega_ckpt_begin(const char *save_dir, int64_t iteration, int attempt, bool fresh,
                            char *tmp, size_t cap, mega_err *err);
/* fsyncs tmp (its files are already durable), renames it to iter_NNNNNNN,
 * fsyncs save_dir, then points the latest file at it. */
mega_status mega_ckpt_commit(const char *save_dir, const char *tmp, int64_t iteration,
                             mega_err *err);
/* Removes tmp after a failed save. */
void mega_ckpt_abort(const char *tmp);

/* Writes j (its reference is taken, even on failure) to dir/name and
 * fsyncs it; out (may be NULL) gets its name, size and crc32. */
mega_status mega_ckpt_write_json(json_t *j, const char *dir, const char *name, size_t flags,
                                 mega_ckpt_file *out, mega_err *err);

/* ckpt_config.c: config.json for cfg (GPT2LMHeadModel's or
 * LlamaForCausalLM's), with the job's tokenizer's bos_token_id and
 * eos_token_id (mega_jobspec_special_ids; null where it has none) when job
 * is not NULL; NULL when out of memory. */
json_t *mega_ckpt_config_json(const mega_gpt_config *cfg, const mega_jobspec *job);
/* The json_dumps flags config.json is written with: indented, each real
 * read back exactly. One precision serves the whole file: 9 significant
 * digits (what every save used to write), more where a real in j needs
 * them (at most 17). Every real then prints as its shortest form (1e-6,
 * not 9.9999999999999995e-7) unless some other one needs 16 or 17 digits,
 * and even then reads back the same. */
size_t mega_ckpt_config_flags(const json_t *j);
/* The checkpoint directory's config.json against the job's model: the same
 * architecture and every size that shapes a tensor, else MEGA_ERR_INVALID
 * naming the field and the flag. */
mega_status mega_ckpt_check_config(const char *dir, const mega_gpt_config *cfg, mega_err *err);

/* ckpt_json.c: trainer_state.json's object; NULL when out of memory. */
json_t *mega_ckpt_state_json(const mega_ckpt_state *s, const mega_jobspec *job,
                             bool has_optimizer_state);

/* ckpt_manifest.c: writes dir/manifest.json, fsynced: iteration, attempt
 * and the files. */
mega_status mega_ckpt_write_manifest(const char *dir, int64_t iteration, int attempt,
                                     const mega_ckpt_file *files, size_t n, mega_err *err);

/* ckpt_manifest.c: "mega VERSION" for the build that wrote j (its
 * MEGA_CKPT_VERSION_KEY), or words for one that did not say, into buf. */
const char *mega_ckpt_written_by(const json_t *j, char *buf, size_t len);

/* ckpt_plain.c: checkpoint files opened without following a link on the
 * way (core/nofollow.h). A link, or a file that is not a plain one, is
 * MEGA_ERR_INVALID naming it (its content is never read); another failure
 * of doing (a verb: "read") is code. */
struct stat;
mega_status mega_ckpt_refuse(mega_err *err, mega_status code, const char *doing,
                             const char *path, int e, const char *link);
/* path, a plain file, open for reading into *fd. */
mega_status mega_ckpt_open_plain(const char *path, int *fd, mega_err *err);
/* path's JSON into *out (NULL and jerr when it does not parse): MEGA_OK
 * once the file opened. */
mega_status mega_ckpt_load_json(const char *path, json_t **out, json_error_t *jerr,
                                mega_err *err);
/* lstat through a walk that follows no link: a link on the way is ELOOP,
 * the last name's own link S_ISLNK. */
int mega_ckpt_lstat(const char *path, struct stat *st);

#endif
