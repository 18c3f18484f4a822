#include "client/view.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#define MAX_STAGES 512     /* per-stage sums kept on the stack */
#define MAX_STAGE_LINES 16 /* more stages are summed up in one line */
#define PLAIN_STAGES 16    /* stages listed in a plain line */

/* ---- small text helpers ---- */

typedef struct sbuf {
  char *p;
  size_t cap, len;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...) {
  if (b->len >= b->cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  if (n > 0) b->len = b->len + (size_t)n < b->cap ? b->len + (size_t)n : b->cap - 1;
}

/* Writes s as one line of at most width columns: an ANSI escape takes no
 * column, a UTF-8 character takes one. */
static void emit(FILE *f, const char *s, int width, bool color) {
  int cols = 0;
  size_t i = 0;
  bool cut = false;
  while (s[i]) {
    if (s[i] == '\x1b' && s[i + 1] == '[') {
      i += 2;
      while (s[i] && !(s[i] >= 0x40 && s[i] <= 0x7e)) i++;
      if (s[i]) i++;
      continue;
    }
    if (((unsigned char)s[i] & 0xC0) != 0x80) {
      if (cols == width) {
        cut = true;
        break;
      }
      cols++;
    }
    i++;
  }
  fwrite(s, 1, i, f);
  if (cut && color) fputs("\x1b[0m", f);
  fputc('\n', f);
}

/* Visible columns of s (no escapes in s). */
static int cols_of(const char *s) {
  int n = 0;
  for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
  return n;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

#define SGR(o, code) ((o)->color ? "\x1b[" code "m" : "")
#define RESET(o) SGR(o, "0")

const char *view_state_name(Mega__V1__JobState s) {
  switch (s) {
  case MEGA__V1__JOB_STATE__JOB_STATE_PENDING: return "pending";
  case MEGA__V1__JOB_STATE__JOB_STATE_RUNNING: return "running";
  case MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED: return "succeeded";
  case MEGA__V1__JOB_STATE__JOB_STATE_FAILED: return "failed";
  case MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED: return "cancelled";
  case MEGA__V1__JOB_STATE__JOB_STATE_RESTARTING: return "restarting";
  case MEGA__V1__JOB_STATE__JOB_STATE_STOPPED: return "stopped";
  default: return "unknown";
  }
}

static const char *state_color(const view_opts *o, Mega__V1__JobState s) {
  switch (s) {
  case MEGA__V1__JOB_STATE__JOB_STATE_RUNNING: return SGR(o, "1;36");
  case MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED: return SGR(o, "1;32");
  case MEGA__V1__JOB_STATE__JOB_STATE_FAILED:
  case MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED: return SGR(o, "1;31");
  default: return SGR(o, "1;33");
  }
}

const char *view_event_kind_name(Mega__V1__JobEventKind k) {
  switch (k) {
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUBMITTED: return "submitted";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_PLACED: return "placed";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_STARTED: return "started";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_CHECKPOINT: return "checkpoint";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RANK_FAILED: return "rank failed";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_NODE_LOST: return "node lost";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING: return "restarting";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESCALED: return "rescaled";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED: return "succeeded";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_FAILED: return "failed";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_CANCELLED: return "cancelled";
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_INFO: return "info";
  default: return "event";
  }
}

void view_duration(double s, char *buf, size_t n) {
  if (!isfinite(s) || s < 0) s = 0;
  if (s < 0.01)
    snprintf(buf, n, "%.2f ms", s * 1e3);
  else if (s < 1)
    snprintf(buf, n, "%.0f ms", s * 1e3);
  else if (s < 60)
    snprintf(buf, n, "%.2f s", s);
  else if (s < 3600)
    snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
  else
    snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

void view_si(double v, char *buf, size_t n) {
  double a = fabs(v);
  if (!isfinite(v))
    snprintf(buf, n, "-");
  else if (a < 1e3)
    snprintf(buf, n, "%.0f", v);
  else if (a < 1e6)
    snprintf(buf, n, "%.1fk", v / 1e3);
  else if (a < 1e9)
    snprintf(buf, n, "%.2fM", v / 1e6);
  else
    snprintf(buf, n, "%.2fG", v / 1e9);
}

/* ---- the model ---- */

void view_model_from_job(view_model *v, const Mega__V1__Job *job) {
  memset(v, 0, sizeof *v);
  v->job_id = job->id;
  v->name = job->name;
  v->state = job->state;
  v->world = job->world_size;
  v->tp = job->tp;
  v->pp = job->pp;
  v->dp = job->dp;
  v->vp = job->vp;
  v->attempt = job->attempt;
  v->train_iters = job->train_iters;
  v->started_ms = job->started_unix_ms;
  v->ended_ms = job->ended_unix_ms;
}

void view_model_event(view_model *v, const Mega__V1__JobEvent *e) {
  switch (e->kind) {
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_STARTED:
    v->state = MEGA__V1__JOB_STATE__JOB_STATE_RUNNING;
    if (!v->started_ms) v->started_ms = e->time_unix_ms;
    break;
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING:
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESCALED:
    v->state = MEGA__V1__JOB_STATE__JOB_STATE_RESTARTING;
    break;
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED:
    v->state = MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED;
    v->ended_ms = e->time_unix_ms;
    break;
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_FAILED:
    v->state = MEGA__V1__JOB_STATE__JOB_STATE_FAILED;
    v->ended_ms = e->time_unix_ms;
    break;
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_CANCELLED:
    v->state = MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED;
    v->ended_ms = e->time_unix_ms;
    break;
  default: break;
  }
  if (e->attempt > v->attempt) v->attempt = e->attempt;
}

int view_stage_bubbles(const Mega__V1__StepMetrics *m, view_stage *out, int max) {
  return mega_step_stage_bubbles(m, out, max);
}

/* ---- bars ---- */

/* A bar of `cells` columns: segment k fills fracs[k] of it (rounded on the
 * running sum, so the segments add up), the rest is blank. */
static void seg_bar(sbuf *b, int cells, const double *fracs, const char *const *glyphs,
                    const char *const *colors, int nseg, const char *blank, const view_opts *o) {
  double sum = 0;
  int done = 0;
  for (int k = 0; k < nseg; k++) {
    sum += fmax(fracs[k], 0);
    int upto = clampi((int)lround(fmin(sum, 1.0) * cells), done, cells);
    if (upto > done) {
      sb_add(b, "%s", colors[k]);
      for (; done < upto; done++) sb_add(b, "%s", glyphs[k]);
      sb_add(b, "%s", RESET(o));
    }
  }
  for (; done < cells; done++) sb_add(b, "%s", blank);
}

/* Progress, with eighth blocks on a UTF-8 terminal. */
static void progress_bar(sbuf *b, int cells, double p, const view_opts *o) {
  static const char *const eighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  p = fmin(fmax(p, 0), 1);
  double x = p * cells;
  int full = (int)x, part = o->unicode ? (int)((x - full) * 8) : 0;
  sb_add(b, "%s", SGR(o, "32"));
  for (int i = 0; i < full; i++) sb_add(b, "%s", o->unicode ? "█" : "#");
  if (full < cells && part > 0) sb_add(b, "%s", eighths[part]);
  sb_add(b, "%s", RESET(o));
  for (int i = full + (full < cells && part > 0); i < cells; i++)
    sb_add(b, "%s", o->unicode ? " " : ".");
}

/* ---- the live block ---- */

static int render_stages(FILE *f, const view_model *v, const view_opts *o, int width) {
  view_stage st[MAX_STAGES];
  int n = view_stage_bubbles(v->step, st, MAX_STAGES);
  if (n == 0) return 0;
  bool split = false;
  for (int s = 0; s < n; s++) split |= st[s].split;
  const char *gw = o->unicode ? "▓" : "w", *gs = o->unicode ? "█" : "s", *gc = o->unicode ? "▒" : "c";
  const char *gall = o->unicode ? "█" : "#";
  char line[4096];
  sbuf b = {line, sizeof line, 0};
  int lines = 0;
  if (split)
    sb_add(&b, "bubble per stage  %s%s%s warmup  %s%s%s steady  %s%s%s cooldown", SGR(o, "33"), gw,
           RESET(o), SGR(o, "31"), gs, RESET(o), SGR(o, "35"), gc, RESET(o));
  else
    sb_add(&b, "bubble per stage");
  emit(f, line, width, o->color);
  lines++;

  int digits = n > 100 ? 3 : n > 10 ? 2 : 1;
  int fixed = 8 + digits + 1 + 2 + 7; /* "  stage N " "[" "]" " 100.0%" */
  int split_cols = 25;                /* "  w 10.2% s  5.1% c 11.8%" */
  bool show_split = split && width - fixed - split_cols >= 10;
  int cells = clampi(width - fixed - (show_split ? split_cols : 0), 10, 60);
  int shown = n <= MAX_STAGE_LINES ? n : MAX_STAGE_LINES - 1;
  for (int s = 0; s < shown; s++) {
    b.len = 0;
    line[0] = '\0';
    sb_add(&b, "  stage %*d [", digits, s);
    if (!st[s].ranks) {
      sb_add(&b, "%-*s]", cells, cells >= 9 ? "no report" : "");
    } else {
      if (st[s].split) {
        double fr[3] = {st[s].warmup, st[s].steady, st[s].cooldown};
        const char *g[3] = {gw, gs, gc};
        const char *c[3] = {SGR(o, "33"), SGR(o, "31"), SGR(o, "35")};
        seg_bar(&b, cells, fr, g, c, 3, " ", o);
      } else {
        double fr[1] = {st[s].bubble};
        const char *g[1] = {gall};
        const char *c[1] = {SGR(o, "31")};
        seg_bar(&b, cells, fr, g, c, 1, " ", o);
      }
      sb_add(&b, "] %5.1f%%", 100 * st[s].bubble);
      if (show_split && st[s].split)
        sb_add(&b, "  w %4.1f%% s %4.1f%% c %4.1f%%", 100 * st[s].warmup, 100 * st[s].steady,
               100 * st[s].cooldown);
    }
    emit(f, line, width, o->color);
    lines++;
  }
  if (shown < n) {
    double sum = 0, mx = -1;
    int cnt = 0, arg = 0;
    for (int s = shown; s < n; s++) {
      if (!st[s].ranks) continue;
      sum += st[s].bubble;
      cnt++;
      if (st[s].bubble > mx) mx = st[s].bubble, arg = s;
    }
    b.len = 0;
    line[0] = '\0';
    if (cnt)
      sb_add(&b, "  %s %d more stages: mean %.1f%%, max %.1f%% (stage %d)",
             o->unicode ? "…" : "...", n - shown, 100 * sum / cnt, 100 * mx, arg);
    else
      sb_add(&b, "  %s %d more stages without reports", o->unicode ? "…" : "...", n - shown);
    emit(f, line, width, o->color);
    lines++;
  }
  return lines;
}

int view_render(FILE *f, const view_model *v, int64_t now_ms, const view_opts *o) {
  int width = o->width < 40 ? 40 : o->width;
  const char *times = o->unicode ? "×" : "x";
  char line[4096], t[64];
  sbuf b = {line, sizeof line, 0};
  int lines = 0;

  /* job j-3 tiny  running  world 4 = TP 1 × PP 2 × DP 2  2.31 s */
  line[0] = '\0';
  sb_add(&b, "%sjob %s%s", SGR(o, "1"), v->job_id ? v->job_id : "?", RESET(o));
  if (v->name && v->name[0]) sb_add(&b, " %s", v->name);
  sb_add(&b, "  %s%s%s", state_color(o, v->state), view_state_name(v->state), RESET(o));
  if (v->world)
    sb_add(&b, "  world %u = TP %u %s PP %u %s DP %u", v->world, v->tp, times, v->pp, times, v->dp);
  if (v->vp > 1) sb_add(&b, " (VP %u)", v->vp);
  if (v->attempt) sb_add(&b, "  attempt %u", v->attempt);
  if (v->started_ms) {
    int64_t end = v->ended_ms ? v->ended_ms : now_ms;
    view_duration(end > v->started_ms ? (double)(end - v->started_ms) / 1e3 : 0, t, sizeof t);
    sb_add(&b, "  %s%s%s", SGR(o, "2"), t, RESET(o));
  }
  emit(f, line, width, o->color);
  lines++;

  /* iteration 120/1000 [#####.....]  12.0% */
  const Mega__V1__StepMetrics *m = v->step;
  b.len = 0;
  line[0] = '\0';
  char it[48];
  if (m)
    snprintf(it, sizeof it, "%" PRIu64, m->iteration);
  else
    snprintf(it, sizeof it, "-");
  const char *note = !m ? "  waiting for the first step"
                     : m->skipped ? "  (step skipped: non-finite gradients)"
                                  : "";
  if (v->train_iters && m) {
    sb_add(&b, "iteration %s/%" PRIu64 " [", it, v->train_iters);
    int cells = clampi(width - cols_of(line) - 1 - 7 - cols_of(note), 10, 50);
    double p = (double)m->iteration / (double)v->train_iters;
    progress_bar(&b, cells, p, o);
    sb_add(&b, "] %5.1f%%", 100 * fmin(p, 1));
  } else if (v->train_iters) {
    sb_add(&b, "iteration %s/%" PRIu64, it, v->train_iters);
  } else {
    sb_add(&b, "iteration %s", it);
  }
  if (note[0]) sb_add(&b, "%s%s%s", SGR(o, "33"), note, RESET(o));
  emit(f, line, width, o->color);
  lines++;
  if (!m) return lines;

  /* loss 5.4321  grad norm 1.234  lr 1.50e-04  step 212 ms  tokens/s 12.3k */
  b.len = 0;
  line[0] = '\0';
  char st[32], tok[32];
  view_duration(m->step_time_s, st, sizeof st);
  view_si(m->tokens_per_s, tok, sizeof tok);
  if (m->no_loss) sb_add(&b, "loss -");
  else sb_add(&b, "loss %s%.4f%s", SGR(o, "1"), m->loss, RESET(o));
  sb_add(&b, "  grad norm %.4g  lr %.3e  step %s  tokens/s %s", m->grad_norm, m->lr, st, tok);
  if (m->has_eval_loss) sb_add(&b, "  eval loss %.4f", m->eval_loss);
  if (m->has_final_eval_loss) sb_add(&b, "  final eval loss %.4f", m->final_eval_loss);
  if (m->has_test_loss) sb_add(&b, "  test loss %.4f", m->test_loss);
  if (v->tp > 1 && m->n_ranks) { /* TP collectives sit on the critical path */
    double share = 0;
    for (size_t i = 0; i < m->n_ranks; i++)
      if (m->ranks[i]->step_time_s > 0) share += m->ranks[i]->tp_comm_s / m->ranks[i]->step_time_s;
    sb_add(&b, "  TP comm %.1f%%", 100 * share / (double)m->n_ranks);
  }
  emit(f, line, width, o->color);
  lines++;

  return lines + render_stages(f, v, o, width);
}

/* ---- plain lines ---- */

void view_step_line(FILE *f, const Mega__V1__StepMetrics *m, uint64_t train_iters) {
  if (train_iters)
    fprintf(f, "iter %" PRIu64 "/%" PRIu64, m->iteration, train_iters);
  else
    fprintf(f, "iter %" PRIu64, m->iteration);
  if (m->no_loss) fprintf(f, " loss -");
  else fprintf(f, " loss %.4f", m->loss);
  fprintf(f, " grad_norm %.4g lr %.3e step %.4fs tokens/s %.0f", m->grad_norm, m->lr,
          m->step_time_s, m->tokens_per_s);
  if (m->has_eval_loss) fprintf(f, " eval_loss %.4f", m->eval_loss);
  if (m->has_final_eval_loss) fprintf(f, " final_eval_loss %.4f", m->final_eval_loss);
  if (m->has_test_loss) fprintf(f, " test_loss %.4f", m->test_loss);
  view_stage st[MAX_STAGES];
  int n = view_stage_bubbles(m, st, MAX_STAGES);
  if (n) fputs(" bubble", f);
  for (int s = 0; s < n && s < PLAIN_STAGES; s++) {
    if (st[s].ranks)
      fprintf(f, " %.1f%%", 100 * st[s].bubble);
    else
      fputs(" -", f);
  }
  if (n > PLAIN_STAGES) fprintf(f, " (+%d stages)", n - PLAIN_STAGES);
  if (m->skipped) fputs(" skipped", f);
  fputc('\n', f);
}

static const char *event_color(const view_opts *o, Mega__V1__JobEventKind k) {
  switch (k) {
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RANK_FAILED:
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_NODE_LOST:
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_FAILED:
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_CANCELLED: return SGR(o, "31");
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING:
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESCALED: return SGR(o, "33");
  case MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUCCEEDED: return SGR(o, "32");
  default: return SGR(o, "36");
  }
}

const char *view_escape(const char *s, char *buf, size_t n) {
  size_t k = 0;
  if (!n) return buf;
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    char e[8];
    bool c1 = p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f; /* U+0080..U+009F */
    if (c1) snprintf(e, sizeof e, "\\u%04x", p[1]);
    else if (*p == '\n') snprintf(e, sizeof e, "\\n");
    else if (*p == '\t') snprintf(e, sizeof e, "\\t");
    else if (*p == '\r') snprintf(e, sizeof e, "\\r");
    else if (*p < 0x20 || *p == 0x7f) snprintf(e, sizeof e, "\\x%02x", *p);
    else e[0] = (char)*p, e[1] = '\0';
    size_t len = strlen(e);
    if (k + len >= n) break;
    memcpy(buf + k, e, len);
    k += len;
    p += c1;
  }
  buf[k] = '\0';
  return buf;
}

void view_gap_line(FILE *f, const Mega__V1__WatchGap *g, const char *why) {
  fputs("missed", f);
  if (g->missed_steps || !g->missed_events)
    fprintf(f, " %llu step%s (iterations %llu..%llu)", (unsigned long long)g->missed_steps,
            g->missed_steps == 1 ? "" : "s", (unsigned long long)g->first_iteration,
            (unsigned long long)g->last_iteration);
  if (g->missed_events)
    fprintf(f, "%s %llu event%s", g->missed_steps ? " and" : "",
            (unsigned long long)g->missed_events, g->missed_events == 1 ? "" : "s");
  fprintf(f, ": %s\n", why);
}

void view_event_line(FILE *f, const Mega__V1__JobEvent *e, const view_opts *o) {
  char when[16] = "--:--:--";
  if (e->time_unix_ms > 0) {
    time_t secs = (time_t)(e->time_unix_ms / 1000);
    struct tm tm;
    if (localtime_r(&secs, &tm)) strftime(when, sizeof when, "%H:%M:%S", &tm);
  }
  char msg[2048], nid[256];
  fprintf(f, "%s%s%s %s%-11s%s %s", SGR(o, "2"), when, RESET(o), event_color(o, e->kind),
          view_event_kind_name(e->kind), RESET(o), view_escape(e->message, msg, sizeof msg));
  bool node = e->node_id && e->node_id[0];
  view_escape(e->node_id, nid, sizeof nid);
  if (e->has_rank && node)
    fprintf(f, " [rank %u, node %s]", e->rank, nid);
  else if (e->has_rank)
    fprintf(f, " [rank %u]", e->rank);
  else if (node)
    fprintf(f, " [node %s]", nid);
  fputc('\n', f);
}

bool view_seen_step(view_seen *s, uint32_t attempt, uint64_t iteration) {
  int oldest = 0;
  for (int i = 0; i < s->n; i++) {
    if (s->v[i].attempt == attempt) {
      if (iteration <= s->v[i].iteration) return true;
      s->v[i].iteration = iteration;
      return false;
    }
    if (s->v[i].attempt < s->v[oldest].attempt) oldest = i;
  }
  int at = s->n < VIEW_SEEN_ATTEMPTS ? s->n++ : oldest;
  s->v[at].attempt = attempt;
  s->v[at].iteration = iteration;
  return false;
}
