/* What a job may touch: the directories its --data-path, --load and --save
 * must resolve into (realpath: symlinks and `..` followed), as megad's
 * --data-root and --save-root give them.
 *
 * --data-path must lie under a data root; --load under a data or a save
 * root (a job resumes from what another job saved); --save under a save
 * root, where the directory may not exist yet: its nearest existing parent
 * is resolved and the rest may not climb out with `..`.
 *
 * --data-cache-path (Megatron's order's index cache, which jobs write) lies
 * under a save root, as --save does.
 *
 * A root, the directories above it and those from it down to a --save,
 * --load or --data-cache-path may not be ones anyone may write (swap a name
 * for a link megad's user then writes or reads through); above a root,
 * sticky world-writable like /tmp is fine. Group write is fine. A root on
 * the way to which a directory belongs to a user other than megad's or root
 * is accepted with a note (shared storage often cannot be chowned).
 *
 * Without roots, a megad that only this machine can reach lets jobs name
 * any path (one-machine use, as before); one that listens on the network
 * refuses every job that names a path. Pure but for realpath and stat. */
#ifndef MEGA_DAEMON_ROOTS_H
#define MEGA_DAEMON_ROOTS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/jobspec.h"
#include "core/status.h"

typedef struct megad_roots {
  char **data, **save; /* realpath'd */
  size_t ndata, nsave;
  bool open;           /* no roots and a local listener: any path */
  char note[640];      /* "" or a warning for megad to log at start */
} megad_roots;

/* Resolves every root (each must be an existing directory that others
 * could not change, as above). local: the daemon listens on loopback or a
 * unix socket only. */
mega_status megad_roots_init(megad_roots *r, const char *const *data, size_t ndata,
                             const char *const *save, size_t nsave, bool local, mega_err *err);
void megad_roots_free(megad_roots *r);

/* MEGA_ERR_INVALID naming the flag and the roots when a path of s lies
 * outside them, or naming the directory when a --save or --load goes
 * through one others could change. */
mega_status megad_roots_check(const megad_roots *r, const mega_jobspec *s, mega_err *err);

/* path as the roots see it (malloc'd): absolute, symlinks and `..`
 * followed; a path that does not exist yet is its nearest existing
 * ancestor resolved plus the rest (which may hold no `..`). NULL with errno
 * when it cannot be resolved (EACCES: a `..` in the rest). Two jobs'
 * --save compare equal this way however each spelled it. */
char *megad_path_resolve(const char *path);

#endif
