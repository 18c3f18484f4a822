#include "daemon/model/roots.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dirperm.h"

static void free_list(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

void megad_roots_free(megad_roots *r) {
  free_list(r->data, r->ndata);
  free_list(r->save, r->nsave);
  memset(r, 0, sizeof *r);
}

static mega_status resolve_all(const char *flag, const char *const *in, size_t n, char ***out,
                               mega_err *err) {
  *out = calloc(n ? n : 1, sizeof **out);
  if (!*out) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    struct stat st;
    char *real = realpath(in[i], NULL);
    if (!real || stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
      int e = real ? ENOTDIR : errno;
      free(real);
      return mega_fail(err, MEGA_ERR_INVALID, "%s %s: %s (give an existing directory)", flag,
                       in[i], strerror(e));
    }
    (*out)[i] = real;
  }
  return MEGA_OK;
}

/* ---- who else could change the directories a job's paths go through ----
 *
 * megad's workers make and write checkpoints as megad's user. Whoever may
 * make or swap names in a directory on the way to a --save or --load could,
 * between the check and the worker's mkdir or open, put a link there and
 * have megad's user write or read through it. Refused: a directory anyone
 * may write. Above a root a sticky one (like /tmp) is fine, as others may
 * not move what they do not own out of it; a root and what lies under it may
 * not be sticky world-writable either, since anyone could make a --save
 * still to be made first. A directory's group is trusted (team directories
 * are group-writable), and so is its owner: a root owned by another user is
 * only a warning at start, since shared storage often cannot be handed to
 * megad's user (NFS with root_squash shows root's own directories as
 * nobody's). */

/* Why others could change dir's names (in buf), or NULL. */
static const char *others_change(const struct stat *st, bool above_root, bool owners, char *buf,
                                 size_t cap) {
  unsigned mode = (unsigned)(st->st_mode & 07777);
  if (owners && st->st_uid != geteuid() && st->st_uid != 0) {
    snprintf(buf, cap, "belongs to uid %u, not to megad's uid %u or root", (unsigned)st->st_uid,
             (unsigned)geteuid());
    return buf;
  }
  const char *why = mega_dir_others_write(mode);
  if (!why || (above_root && (mode & S_ISVTX))) return NULL;
  snprintf(buf, cap, "is a shared directory (mode %04o: %s)", mode, why);
  return buf;
}

/* Every directory that makes up path (absolute, resolved), "/" first, up to
 * the first that does not exist yet; those shorter than root_len are above
 * the root. On the first one others could change (owners: or that another
 * user owns): the failing directory in *bad (malloc'd) and why in why. */
static bool chain_safe(const char *path, size_t root_len, bool owners, char **bad, char *why,
                       size_t cap) {
  size_t len = strlen(path);
  char *dir = malloc(len + 2);
  if (!dir) {
    snprintf(why, cap, "out of memory");
    *bad = NULL;
    return false;
  }
  for (size_t end = 0; end <= len; end++) {
    if (end > 0 && end < len && path[end] != '/') continue;
    size_t n = end ? end : 1; /* "/" first */
    memcpy(dir, path, n);
    dir[n] = '\0';
    struct stat st;
    if (lstat(dir, &st) != 0) break; /* still to be made (a --save) */
    bool above = n < root_len;
    const char *w = S_ISLNK(st.st_mode) ? "is a link (it was swapped since it was resolved)"
                    : S_ISDIR(st.st_mode) ? others_change(&st, above, owners, why, cap)
                                          : NULL;
    if (w) {
      if (w != why) snprintf(why, cap, "%s", w);
      *bad = dir;
      return false;
    }
  }
  free(dir);
  return true;
}

static const char *chain_fix(const char *why) {
  return strstr(why, "belongs to")
             ? "chown it to megad's user or root (its group may still write it)"
             : "chmod o-w it (its group may still write it)";
}

/* Each root at start: megad refuses one others may write, and notes (in
 * note, the first only) one that another user owns. */
static mega_status guard_roots(const char *flag, const char *const *in, char *const *real,
                               size_t n, char *note, size_t note_cap, mega_err *err) {
  for (size_t i = 0; i < n; i++) {
    char why[160], *bad = NULL;
    if (chain_safe(real[i], strlen(real[i]), false, &bad, why, sizeof why)) {
      if (!note[0] && !chain_safe(real[i], strlen(real[i]), true, &bad, why, sizeof why))
        snprintf(note, note_cap,
                 "%s %s: %s %s, so that user could swap what jobs read and write there for "
                 "links that megad's user follows; %s if megad should not trust them",
                 flag, in[i], bad ? bad : "", why, chain_fix(why));
      free(bad);
      continue;
    }
    mega_status s = mega_fail(
        err, MEGA_ERR_INVALID,
        "%s %s: %s %s, so another user could swap what jobs read and write there for links "
        "that megad's user follows; %s, or give a root in a directory of megad's own",
        flag, in[i], bad ? bad : "", why, chain_fix(why));
    free(bad);
    return s;
  }
  return MEGA_OK;
}

mega_status megad_roots_init(megad_roots *r, const char *const *data, size_t ndata,
                             const char *const *save, size_t nsave, bool local, mega_err *err) {
  memset(r, 0, sizeof *r);
  mega_status s = resolve_all("--data-root", data, ndata, &r->data, err);
  r->ndata = ndata;
  if (s == MEGA_OK) s = resolve_all("--save-root", save, nsave, &r->save, err);
  r->nsave = nsave;
  if (s == MEGA_OK)
    s = guard_roots("--data-root", data, r->data, ndata, r->note, sizeof r->note, err);
  if (s == MEGA_OK)
    s = guard_roots("--save-root", save, r->save, nsave, r->note, sizeof r->note, err);
  if (s != MEGA_OK) {
    megad_roots_free(r);
    return s;
  }
  r->open = local && !ndata && !nsave;
  return MEGA_OK;
}

static bool under(const char *path, const char *root) {
  size_t n = strlen(root);
  if (n == 1 && root[0] == '/') return true;
  return !strncmp(path, root, n) && (path[n] == '\0' || path[n] == '/');
}

/* path resolved; for a save dir that may not exist yet, its nearest existing
 * parent resolved plus the rest, which may hold no `..` (it does not exist,
 * so it holds no symlink). NULL and errno when it cannot be resolved
 * (EACCES: a `..` in the rest). */
static char *resolve(const char *path, bool may_not_exist) {
  char *real = realpath(path, NULL);
  if (real || !may_not_exist || errno != ENOENT) return real;
  char cwd[PATH_MAX], *abs = NULL;
  if (path[0] == '/') abs = strdup(path);
  else if (getcwd(cwd, sizeof cwd) && asprintf(&abs, "%s/%s", cwd, path) < 0) abs = NULL;
  if (!abs) return NULL;
  size_t cut = strlen(abs);
  for (;;) {
    while (cut > 0 && abs[cut - 1] == '/') cut--;
    char *slash = memrchr(abs, '/', cut);
    if (!slash) {
      free(abs);
      errno = ENOENT;
      return NULL;
    }
    cut = (size_t)(slash - abs);
    abs[cut] = '\0';
    real = realpath(cut ? abs : "/", NULL);
    abs[cut] = '/';
    if (real) break;
    if (errno != ENOENT) {
      free(abs);
      return NULL;
    }
  }
  const char *rest = abs + cut;
  for (const char *p = rest; *p;) {
    while (*p == '/') p++;
    size_t k = strcspn(p, "/");
    if (k == 2 && p[0] == '.' && p[1] == '.') {
      free(real);
      free(abs);
      errno = EACCES;
      return NULL;
    }
    p += k;
  }
  char *out = NULL;
  if (asprintf(&out, "%s%s", strcmp(real, "/") ? real : "", rest) < 0) out = NULL;
  free(real);
  free(abs);
  return out;
}

/* The part still to be made may be spelled "a//b/./c/": one spelling. */
static void tidy(char *p) {
  char *w = p;
  for (const char *r = p; *r;) {
    while (*r == '/') r++;
    size_t k = strcspn(r, "/");
    if (k == 0) break;
    if (!(k == 1 && r[0] == '.')) {
      *w++ = '/';
      memmove(w, r, k);
      w += k;
    }
    r += k;
  }
  if (w == p) *w++ = '/';
  *w = '\0';
}

char *megad_path_resolve(const char *path) {
  char *real = resolve(path, true);
  if (real) tidy(real);
  return real;
}

static void list_roots(char *buf, size_t len, char *const *a, size_t na, char *const *b,
                       size_t nb) {
  size_t off = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < na + nb && off < len; i++)
    off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", i < na ? a[i] : b[i - na]);
}

/* A checkpoint directory (guarded): none of the directories it goes
 * through, root to itself, may be one others could change. */
static mega_status check_one(const char *flag, const char *path, bool may_not_exist, bool guarded,
                             char *const *a, size_t na, char *const *b, size_t nb,
                             const char *root_flags, mega_err *err) {
  char roots[384];
  list_roots(roots, sizeof roots, a, na, b, nb);
  if (!na && !nb)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "invalid job: %s %s: this megad has no %s configured, so jobs may not name "
                     "that path (start megad with %s DIR)",
                     flag, path, root_flags, root_flags);
  char *real = resolve(path, may_not_exist);
  if (!real)
    return mega_fail(err, MEGA_ERR_INVALID, "invalid job: %s %s: %s", flag, path,
                     errno == EACCES ? "`..` in a directory still to be made" : strerror(errno));
  const char *root = NULL;
  for (size_t i = 0; i < na + nb && !root; i++)
    if (under(real, i < na ? a[i] : b[i - na])) root = i < na ? a[i] : b[i - na];
  mega_status s = MEGA_OK;
  char why[160], *bad = NULL;
  if (!root)
    s = mega_fail(err, MEGA_ERR_INVALID,
                  "invalid job: %s %s resolves to %s, outside this megad's %s (%s)", flag, path,
                  real, root_flags, roots);
  else if (guarded && !chain_safe(real, strlen(root), false, &bad, why, sizeof why))
    s = mega_fail(err, MEGA_ERR_INVALID,
                  "invalid job: %s %s: %s %s, so another user could swap it, or what the job "
                  "writes there, for a link that megad's user follows; %s, or give a path in "
                  "directories of megad's own",
                  flag, path, bad ? bad : "", why, chain_fix(why));
  free(bad);
  free(real);
  return s;
}

mega_status megad_roots_check(const megad_roots *r, const mega_jobspec *s, mega_err *err) {
  if (r->open) return MEGA_OK;
  mega_status st = MEGA_OK;
  const char *p, *flag;
  for (int k = 0; st == MEGA_OK && (p = mega_jobspec_data_file(s, k, &flag)); k++) {
    /* a prefix is its two files; they may be links to elsewhere */
    static const char *const exts[] = {".idx", ".bin"};
    char file[4096];
    snprintf(file, sizeof file, "%s.idx", p);
    bool prefix = access(file, F_OK) == 0;
    for (int e = 0; e < (prefix ? 2 : 1) && st == MEGA_OK; e++) {
      snprintf(file, sizeof file, "%s%s", p, prefix ? exts[e] : "");
      st = check_one(flag, file, false, false, r->data, r->ndata, NULL, 0, "--data-root", err);
    }
  }
  if (st == MEGA_OK && s->load)
    st = check_one("--load", s->load, false, true, r->data, r->ndata, r->save, r->nsave,
                   "--data-root or --save-root", err);
  if (st == MEGA_OK && s->save)
    st = check_one("--save", s->save, true, true, r->save, r->nsave, NULL, 0, "--save-root", err);
  /* the order's index cache is written: a save root's, as --save is */
  if (st == MEGA_OK && s->data_cache_path)
    st = check_one("--data-cache-path", s->data_cache_path, true, true, r->save, r->nsave, NULL,
                   0, "--save-root", err);
  return st;
}
