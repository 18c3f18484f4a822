/* Shared between checkpoint.c and ckpt_dir.c; not a public interface. */
#ifndef MEGA_WORKER_CKPT_INTERNAL_H
#define MEGA_WORKER_CKPT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define MEGA_CKPT_STATE_FILE "trainer_state.json"
#define MEGA_CKPT_CONFIG_FILE "config.json"

/* Creates save_dir and a fresh temp directory in it; its path goes to tmp. */
mega_status mega_ckpt_begin(const char *save_dir, int64_t iteration, char *tmp, size_t cap,
                            mega_err *err);
/* fsyncs tmp's files and tmp, renames it to iter_NNNNNNN, fsyncs save_dir,
 * then points the latest file at it. */
mega_status mega_ckpt_commit(const char *save_dir, const char *tmp, int64_t iteration,
                             mega_err *err);
/* Removes tmp after a failed save. */
void mega_ckpt_abort(const char *tmp);

#endif
