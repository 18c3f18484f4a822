#include "daemon/model/roots.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

mega_status megad_roots_init(megad_roots *r, const char *const *data, size_t ndata,
                             const char *const *save, size_t nsave, bool local, mega_err *err) {
  memset(r, 0, sizeof *r);
  mega_status s = resolve_all("--data-root", data, ndata, &r->data, err);
  r->ndata = ndata;
  if (s == MEGA_OK) s = resolve_all("--save-root", save, nsave, &r->save, err);
  r->nsave = nsave;
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

static mega_status check_one(const char *flag, const char *path, bool may_not_exist,
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
  bool ok = false;
  for (size_t i = 0; i < na + nb && !ok; i++) ok = under(real, i < na ? a[i] : b[i - na]);
  mega_status s = MEGA_OK;
  if (!ok)
    s = mega_fail(err, MEGA_ERR_INVALID,
                  "invalid job: %s %s resolves to %s, outside this megad's %s (%s)", flag, path,
                  real, root_flags, roots);
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
      st = check_one(flag, file, false, r->data, r->ndata, NULL, 0, "--data-root", err);
    }
  }
  if (st == MEGA_OK && s->load)
    st = check_one("--load", s->load, false, r->data, r->ndata, r->save, r->nsave,
                   "--data-root or --save-root", err);
  if (st == MEGA_OK && s->save)
    st = check_one("--save", s->save, true, r->save, r->nsave, NULL, 0, "--save-root", err);
  return st;
}
