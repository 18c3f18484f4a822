#include "client/tables.h"

#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "client/view.h"

#define CELL 160

/* Two passes over the rows: widths, then the text; cells are formatted on
 * demand, so nothing is allocated. */
typedef void (*cell_fn)(const void *row, int col, int64_t now_ms, const void *ctx, char *buf);

static void put_cell(FILE *f, const char *s, int width, bool last) {
  if (last)
    fprintf(f, "%s\n", s);
  else
    fprintf(f, "%-*s  ", width, s);
}

static void print_table(FILE *f, const char *const *heads, int ncols, const void *const *rows,
                        size_t n, cell_fn cell, int64_t now_ms, const void *ctx) {
  int w[16] = {0};
  char buf[CELL];
  for (int c = 0; c < ncols; c++) w[c] = (int)strlen(heads[c]);
  char esc[CELL];
  for (size_t r = 0; r < n; r++)
    for (int c = 0; c < ncols; c++) {
      cell(rows[r], c, now_ms, ctx, buf);
      int len = (int)strlen(view_escape(buf, esc, sizeof esc));
      if (len > w[c]) w[c] = len;
    }
  for (int c = 0; c < ncols; c++) put_cell(f, heads[c], w[c], c + 1 == ncols);
  for (size_t r = 0; r < n; r++)
    for (int c = 0; c < ncols; c++) {
      cell(rows[r], c, now_ms, ctx, buf);
      put_cell(f, view_escape(buf, esc, sizeof esc), w[c], c + 1 == ncols);
    }
}

void tables_age(int64_t then_ms, int64_t now_ms, char *buf, size_t n) {
  if (then_ms <= 0) {
    snprintf(buf, n, "-");
    return;
  }
  int64_t s = now_ms > then_ms ? (now_ms - then_ms) / 1000 : 0;
  if (s < 120)
    snprintf(buf, n, "%" PRId64 "s", s);
  else if (s < 2 * 3600)
    snprintf(buf, n, "%" PRId64 "m", s / 60);
  else if (s < 2 * 86400)
    snprintf(buf, n, "%" PRId64 "h", s / 3600);
  else
    snprintf(buf, n, "%" PRId64 "d", s / 86400);
}

void tables_ranks(const uint32_t *ranks, size_t n, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < n && len < cap;) {
    size_t j = i;
    while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
    int k = j > i ? snprintf(buf + len, cap - len, "%s%u-%u", i ? "," : "", ranks[i], ranks[j])
                  : snprintf(buf + len, cap - len, "%s%u", i ? "," : "", ranks[i]);
    if (k < 0) break;
    len += (size_t)k;
    i = j + 1;
  }
}

/* Escaped text from megad (view_escape), in one of a few rotating buffers
 * so a printf may hold several. */
static const char *E(const char *s) {
  static char bufs[4][2048];
  static int k;
  k = (k + 1) % 4;
  return view_escape(s, bufs[k], sizeof bufs[k]);
}

/* ---- jobs ---- */

static void job_cell(const void *row, int col, int64_t now_ms, const void *ctx, char *buf) {
  (void)ctx;
  const Mega__V1__Job *j = row;
  switch (col) {
  case 0: snprintf(buf, CELL, "%s", j->id); break;
  case 1: snprintf(buf, CELL, "%s", j->name && j->name[0] ? j->name : "-"); break;
  case 2: /* a copy: its coordinator did not answer the node that listed it */
    snprintf(buf, CELL, "%s%s", view_state_name(j->state),
             j->coordinator_unreachable_unix_ms ? "?" : "");
    break;
  case 3:
    if (j->world_size)
      snprintf(buf, CELL, "%u", j->world_size);
    else
      snprintf(buf, CELL, "-");
    break;
  case 4:
    if (j->world_size)
      snprintf(buf, CELL, "%u/%u/%u", j->tp, j->pp, j->dp);
    else
      snprintf(buf, CELL, "-");
    break;
  case 5: snprintf(buf, CELL, "%" PRIu64 "/%" PRIu64, j->last_iteration, j->train_iters); break;
  default: tables_age(j->created_unix_ms, now_ms, buf, CELL); break;
  }
}

void tables_jobs(FILE *f, Mega__V1__Job *const *jobs, size_t n, int64_t now_ms) {
  if (n == 0) {
    fprintf(f, "no jobs\n");
    return;
  }
  static const char *const heads[] = {"ID", "NAME", "STATE", "WORLD", "TP/PP/DP", "ITER", "AGE"};
  print_table(f, heads, 7, (const void *const *)jobs, n, job_cell, now_ms, NULL);
  for (size_t i = 0; i < n; i++)
    if (jobs[i]->coordinator_unreachable_unix_ms) {
      fprintf(f, "?: the job's coordinator does not answer; its state is node %s's copy, from "
                 "etcd\n", jobs[i]->answered_by && jobs[i]->answered_by[0]
                              ? E(jobs[i]->answered_by) : "?");
      break;
    }
}

static void when(FILE *f, const char *key, int64_t ms, int64_t now_ms) {
  if (ms <= 0) return;
  time_t secs = (time_t)(ms / 1000);
  struct tm tm;
  char t[32] = "?", age[32];
  if (localtime_r(&secs, &tm)) strftime(t, sizeof t, "%Y-%m-%d %H:%M:%S", &tm);
  tables_age(ms, now_ms, age, sizeof age);
  fprintf(f, "%-12s %s (%s ago)\n", key, t, age);
}


void tables_job_detail(FILE *f, const Mega__V1__Job *j, int64_t now_ms) {
  fprintf(f, "%-12s %s\n", "job", E(j->id));
  if (j->name && j->name[0]) fprintf(f, "%-12s %s\n", "name", E(j->name));
  fprintf(f, "%-12s %s\n", "state", view_state_name(j->state));
  if (j->error && j->error[0]) fprintf(f, "%-12s %s\n", "error", E(j->error));
  if (j->world_size) {
    fprintf(f, "%-12s %u = TP %u x PP %u x DP %u", "world", j->world_size, j->tp, j->pp, j->dp);
    if (j->vp > 1) fprintf(f, ", VP %u", j->vp);
    fputc('\n', f);
  }
  fprintf(f, "%-12s %" PRIu64 "/%" PRIu64 " iterations\n", "progress", j->last_iteration,
          j->train_iters);
  if (j->attempt) fprintf(f, "%-12s %u\n", "attempt", j->attempt);
  const Mega__V1__JobSpec *sp = j->spec;
  if (j->restarts || (sp && sp->max_restarts))
    fprintf(f, "%-12s %u of %u (rank failures; lost nodes do not count)\n", "restarts",
            j->restarts, sp ? sp->max_restarts : 0);
  if (j->checkpoint_iteration)
    fprintf(f, "%-12s iteration %" PRIu64 " in %s\n", "checkpoint", j->checkpoint_iteration,
            j->checkpoint_path && j->checkpoint_path[0] ? E(j->checkpoint_path) : "?");
  when(f, "created", j->created_unix_ms, now_ms);
  when(f, "started", j->started_unix_ms, now_ms);
  when(f, "ended", j->ended_unix_ms, now_ms);
  if (j->started_unix_ms > 0) {
    char d[32];
    int64_t end = j->ended_unix_ms > 0 ? j->ended_unix_ms : now_ms;
    view_duration(end > j->started_unix_ms ? (double)(end - j->started_unix_ms) / 1e3 : 0, d,
                  sizeof d);
    fprintf(f, "%-12s %s\n", "runtime", d);
  }
  if (j->coordinator_node_id && j->coordinator_node_id[0]) {
    fprintf(f, "%-12s %s", "coordinator", E(j->coordinator_node_id));
    if (j->coordinator_unreachable_unix_ms) {
      char age[32];
      tables_age(j->coordinator_unreachable_unix_ms, now_ms, age, sizeof age);
      fprintf(f, " (unreachable for %s: this is node %s's copy of the job, from etcd)", age,
              j->answered_by && j->answered_by[0] ? E(j->answered_by) : "?");
    }
    fputc('\n', f);
  }
  for (size_t i = 0; i < j->n_placement; i++) {
    char r[256];
    const Mega__V1__NodeRanks *p = j->placement[i];
    tables_ranks(p->ranks, p->n_ranks, r, sizeof r);
    fprintf(f, "%-12s %s: rank%s %s\n", i ? "" : "placement", E(p->node_id), p->n_ranks == 1 ? "" : "s",
            r);
  }
  const Mega__V1__JobSpec *s = j->spec;
  if (s) {
    uint32_t lo = s->nnodes_min ? s->nnodes_min : 1, hi = s->nnodes_max ? s->nnodes_max : lo;
    if (hi > lo)
      fprintf(f, "%-12s %u to %u", "nodes", lo, hi);
    else
      fprintf(f, "%-12s %u", "nodes", lo);
    if (s->nproc_per_node)
      fprintf(f, ", %u rank%s each\n", s->nproc_per_node, s->nproc_per_node == 1 ? "" : "s");
    else
      fprintf(f, ", every slot\n");
    fprintf(f, "%-12s", "args");
    for (size_t i = 0; i < s->n_args; i++) fprintf(f, " %s", E(s->args[i]));
    fputc('\n', f);
  }
}

/* ---- nodes ---- */

static const char *node_state(Mega__V1__NodeState s) {
  switch (s) {
  case MEGA__V1__NODE_STATE__NODE_STATE_ALIVE: return "alive";
  case MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT: return "suspect";
  case MEGA__V1__NODE_STATE__NODE_STATE_DEAD: return "dead";
  case MEGA__V1__NODE_STATE__NODE_STATE_LEFT: return "left";
  default: return "unknown";
  }
}

static bool node_up(const Mega__V1__Node *nd) {
  return nd->state == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE ||
         nd->state == MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT;
}

static const char *version_of(const Mega__V1__Node *nd) {
  return nd->version && nd->version[0] ? nd->version : "-";
}

static void node_cell(const void *row, int col, int64_t now_ms, const void *ctx, char *buf) {
  const Mega__V1__Node *nd = row;
  const char *self = ctx;
  switch (col) {
  case 0:
    snprintf(buf, CELL, "%s%s", self && !strcmp(self, nd->id) ? "*" : "", nd->id);
    break;
  case 1: snprintf(buf, CELL, "%s", nd->address); break;
  case 2: snprintf(buf, CELL, "%s", node_state(nd->state)); break;
  case 3: snprintf(buf, CELL, "%s", nd->backend && nd->backend[0] ? nd->backend : "-"); break;
  case 4: snprintf(buf, CELL, "%u/%u", nd->slots_used, nd->slots); break;
  case 5: snprintf(buf, CELL, "%s", nd->device_name && nd->device_name[0] ? nd->device_name : "-"); break;
  case 6: tables_age(nd->last_heartbeat_unix_ms, now_ms, buf, CELL); break;
  case 7: snprintf(buf, CELL, "%s", version_of(nd)); break;
  default: {
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < nd->n_job_ids && len < CELL; i++) {
      int k = snprintf(buf + len, CELL - len, "%s%s", i ? "," : "", nd->job_ids[i]);
      if (k < 0) break;
      len += (size_t)k;
    }
    if (!nd->n_job_ids) snprintf(buf, CELL, "-");
  }
  }
}

void tables_nodes(FILE *f, Mega__V1__Node *const *nodes, size_t n, const char *self_id,
                  int64_t now_ms) {
  if (n == 0) {
    fprintf(f, "no nodes\n");
    return;
  }
  static const char *const heads[] = {"ID",     "ADDRESS",   "STATE",   "BACKEND", "SLOTS",
                                      "DEVICE", "HEARTBEAT", "VERSION", "JOBS"};
  print_table(f, heads, 9, (const void *const *)nodes, n, node_cell, now_ms, self_id);
  /* a rolling upgrade half done: say what it means for jobs */
  size_t builds = 0;
  for (size_t i = 0; i < n; i++) {
    if (!node_up(nodes[i])) continue;
    bool seen = false;
    for (size_t k = 0; k < i && !seen; k++)
      seen = node_up(nodes[k]) && !strcmp(version_of(nodes[k]), version_of(nodes[i]));
    builds += !seen;
  }
  if (builds > 1)
    fprintf(f, "%zu builds of mega run here: a job's ranks run one build, on nodes of its "
               "coordinator's (README \"Upgrading\")\n", builds);
}

void tables_other_build(const char *server, const char *own, char *buf, size_t n) {
  buf[0] = '\0';
  if (!server || !strcmp(server, own)) return;
  snprintf(buf, n,
           " (megad is mega %s, and this megactl mega %s: a flag one build takes and the "
           "other does not is refused; use the megactl of megad's build, or upgrade megad)",
           server[0] ? server : "of a build that does not name its version", own);
}
