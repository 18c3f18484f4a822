/* Retention: the ended jobs this node coordinates past --retain-jobs or
 * --retain-age are forgotten (journaled, their directories removed), the
 * directories of jobs other nodes coordinated that ran ranks here go by the
 * same limits, and the journal is compacted once it is mostly history. */
#include "daemon/coord/coord_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct retain_ctx {
  /* the count: ended jobs that ended before threshold_ms, and ties_left of
   * those that ended at it (the longest ended go first) */
  bool by_count;
  int64_t threshold_ms;
  size_t ties_left;
  int64_t cutoff_ms; /* ended before this: too old */
} retain_ctx;

/* Called for ended jobs only, in submission order. */
static bool too_many_or_old(const mega_job *j, void *arg) {
  retain_ctx *r = arg;
  bool surplus = false;
  if (r->by_count && j->ended_ms < r->threshold_ms) {
    surplus = true;
  } else if (r->by_count && j->ended_ms == r->threshold_ms && r->ties_left) {
    r->ties_left--;
    surplus = true;
  }
  return surplus || (r->cutoff_ms && j->ended_ms > 0 && j->ended_ms < r->cutoff_ms);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Keeps the retain_jobs ended most recently: finds the end time below
 * which (and how many at which) the rest go. */
static bool count_threshold(megad_coord *c, size_t ended, retain_ctx *r) {
  size_t drop = ended - c->o.retain_jobs;
  int64_t *t = malloc(ended * sizeof *t);
  if (!t) return false;
  size_t n = 0;
  for (size_t i = 0; i < c->jobs->t.n; i++)
    if (mega_job_state_final(c->jobs->t.v[i]->state)) t[n++] = c->jobs->t.v[i]->ended_ms;
  qsort(t, n, sizeof *t, cmp_i64);
  r->by_count = true;
  r->threshold_ms = t[drop - 1];
  size_t below = 0;
  while (below < n && t[below] < r->threshold_ms) below++;
  r->ties_left = drop - below;
  free(t);
  return true;
}

static void forget_ended(megad_coord *c, int64_t now_ms) {
  size_t ended = 0;
  for (size_t i = 0; i < c->jobs->t.n; i++) ended += mega_job_state_final(c->jobs->t.v[i]->state);
  retain_ctx r = {.cutoff_ms = c->o.retain_ms ? now_ms - (int64_t)c->o.retain_ms : 0};
  if (c->o.retain_jobs && ended > c->o.retain_jobs && !count_threshold(c, ended, &r))
    return; /* out of memory: the next pass */
  if (!r.by_count && !r.cutoff_ms) return;
  size_t n = megad_jobs_forget(c->jobs, too_many_or_old, &r);
  if (n)
    megad_log(c->b, "forgot %zu ended job%s (--retain-jobs %u, --retain-age %u s)", n,
              n == 1 ? "" : "s", c->o.retain_jobs, c->o.retain_ms / 1000);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

typedef struct other_dir {
  char *name;
  int64_t mtime_ms;
} other_dir;

static int newest_first(const void *a, const void *b) {
  int64_t x = ((const other_dir *)a)->mtime_ms, y = ((const other_dir *)b)->mtime_ms;
  return (x < y) - (x > y);
}

/* The directories of jobs this node ran ranks of but does not hold in its
 * table (another node coordinates them, or did and forgot them): nobody
 * else removes them, so the same limits apply, by when their last launch
 * here ended (the directory's mtime). O(dirs log dirs). */
static void forget_others_dirs(megad_coord *c, int64_t now_ms) {
  char *path = NULL;
  if (asprintf(&path, "%s/jobs", c->b->state_dir) < 0) return;
  DIR *d = opendir(path);
  const char **ids = d ? malloc((c->jobs->t.n ? c->jobs->t.n : 1) * sizeof *ids) : NULL;
  other_dir *v = NULL;
  size_t n = 0, cap = 0, gone = 0;
  for (size_t i = 0; ids && i < c->jobs->t.n; i++) ids[i] = c->jobs->t.v[i]->id;
  if (ids) qsort(ids, c->jobs->t.n, sizeof *ids, cmp_str);
  for (struct dirent *e; ids && (e = readdir(d));) {
    const char *name = e->d_name;
    struct stat st;
    if (name[0] == '.' || bsearch(&name, ids, c->jobs->t.n, sizeof *ids, cmp_str) ||
        megad_launch_has(c->L, name) || fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) ||
        !S_ISDIR(st.st_mode))
      continue;
    if (n == cap) {
      other_dir *w = realloc(v, (cap = cap ? 2 * cap : 64) * sizeof *v);
      if (!w) break;
      v = w;
    }
    if (!(v[n].name = strdup(name))) break;
    v[n++].mtime_ms = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
  }
  if (n) qsort(v, n, sizeof *v, newest_first); /* v may be NULL */
  int64_t cutoff = c->o.retain_ms ? now_ms - (int64_t)c->o.retain_ms : INT64_MIN;
  for (size_t i = 0; i < n; i++) {
    if ((c->o.retain_jobs && i >= c->o.retain_jobs) || v[i].mtime_ms < cutoff) {
      char *dir = NULL;
      if (asprintf(&dir, "%s/%s", path, v[i].name) >= 0 && megad_rmtree(dir)) gone++;
      free(dir);
    }
    free(v[i].name);
  }
  if (gone)
    megad_log(c->b, "removed the directories of %zu job%s other nodes coordinate "
                    "(--retain-jobs %u, --retain-age %u s)",
              gone, gone == 1 ? "" : "s", c->o.retain_jobs, c->o.retain_ms / 1000);
  free(v);
  free(ids);
  if (d) closedir(d);
  free(path);
}

void coord_retain(megad_coord *c, int64_t now_ms) {
  forget_ended(c, now_ms);
  forget_others_dirs(c, now_ms);
  /* the journal of a megad that runs for weeks: as bounded as the table */
  megad_jobs_tidy(c->jobs);
}
