/* Terminal timeline of a simulated schedule.
 *
 * Three layouts, the first that fits:
 *  1. a grid of one cell per time quantum (the largest step every compute
 *     span starts and ends on), wide enough that each action shows its label
 *     ("F3", or "F3.1" with chunks), wrapped into a few bands when the row is
 *     longer than the terminal;
 *  2. the same grid with narrower cells, labels cut to their letter;
 *  3. time scaled to the terminal width, one letter per column.
 * Letters alternate case with the microbatch (F0 f1 F2) so neighbours stay
 * apart when there is no room for numbers. Idle time is dots. A schedule
 * with gradient sync (GS/GW) gets a second row per rank for its
 * data-parallel communicator ('=' while it reduces buckets), and a GW's
 * wait shows as '~' on the rank's row. */
#include "client/render.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { ST_NONE, ST_F, ST_B, ST_W, ST_IDLE, ST_SYNC };

#define MAX_CELLS 200000 /* beyond this the grid is not worth drawing */
#define MAX_LINES 60     /* bands are wrapped only while they fit in this */

typedef struct canvas {
  int rows, cols;
  char *text;           /* rows*cols */
  unsigned char *style; /* rows*cols, ST_* */
} canvas;

typedef struct layout {
  bool grid;      /* exact cells (1, 2) or scaled columns (3) */
  bool letters;   /* one letter per column, no labels */
  double q;       /* grid: time per cell */
  int w;          /* grid: characters per cell */
  double per_col; /* time per character */
  int cols, bands, band_cols;
} layout;

static bool is_compute(uint8_t k) { return k == MEGA_ACT_F || k == MEGA_ACT_B || k == MEGA_ACT_W; }

static int act_style(uint8_t k) { return k == MEGA_ACT_F ? ST_F : k == MEGA_ACT_B ? ST_B : ST_W; }

static void act_label(const mega_schedule *s, mega_action a, char *buf, size_t n) {
  if (s->vp > 1)
    snprintf(buf, n, "%s%d.%d", mega_act_kind_name(a.kind), (int)a.mb, (int)a.chunk);
  else
    snprintf(buf, n, "%s%d", mega_act_kind_name(a.kind), (int)a.mb);
}

/* A number without trailing zeros: 16, 5.5, 0.333. */
static const char *fmt_num(double v, char *buf, size_t n) {
  if (fabs(v) >= 1e9) {
    snprintf(buf, n, "%.6g", v);
    return buf;
  }
  snprintf(buf, n, "%.3f", v);
  char *dot = strchr(buf, '.');
  if (dot) {
    char *e = buf + strlen(buf) - 1;
    while (e > dot && *e == '0') *e-- = '\0';
    if (e == dot) *e = '\0';
  }
  if (!strcmp(buf, "-0")) strcpy(buf, "0");
  return buf;
}

static bool on_grid(double t, double q) {
  double x = t / q;
  return fabs(x - nearbyint(x)) < 1e-6;
}

/* The largest step on which every compute span starts and ends, or 0. A
 * span too short to tell from the makespan's rounding (T_f = 1e12, T_b = 1)
 * has no whole cell on any grid, which would drop it: the drawing is then
 * scaled, where a sliver of a column is idle by its rule. */
static double find_quantum(const mega_schedule *s, const mega_sim *sim) {
  double dmin = INFINITY, eps = 1e-9 * fmax(1.0, sim->makespan);
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      if (!is_compute(s->ranks[r].acts[i].kind)) continue;
      double d = sim->ranks[r].spans[i].end - sim->ranks[r].spans[i].start;
      if (d > 0 && d <= eps) return 0;
      if (d > eps && d < dmin) dmin = d;
    }
  if (!isfinite(dmin) || !(sim->makespan > 0)) return 0;
  for (int k = 1; k <= 8; k++) {
    double q = dmin / k;
    if (sim->makespan / q > MAX_CELLS) return 0;
    bool ok = on_grid(sim->makespan, q);
    for (int r = 0; ok && r < s->pp; r++)
      for (int i = 0; ok && i < s->ranks[r].n; i++) {
        if (!is_compute(s->ranks[r].acts[i].kind)) continue;
        mega_span sp = sim->ranks[r].spans[i];
        ok = on_grid(sp.start, q) && on_grid(sp.end, q);
      }
    if (ok) return q;
  }
  return 0;
}

/* Characters per cell so that every compute action shows its whole label
 * and a separating space. */
static int label_width(const mega_schedule *s, const mega_sim *sim, double q) {
  int w = 1;
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      mega_action a = s->ranks[r].acts[i];
      if (!is_compute(a.kind)) continue;
      long n = lround((sim->ranks[r].spans[i].end - sim->ranks[r].spans[i].start) / q);
      if (n < 1) continue;
      char lab[32];
      act_label(s, a, lab, sizeof lab);
      long need = ((long)strlen(lab) + 1 + n - 1) / n;
      if (need > w) w = (int)need;
    }
  return w;
}

static layout choose_layout(const mega_schedule *s, const mega_sim *sim, int avail) {
  layout L = {0};
  double q = find_quantum(s, sim);
  if (q > 0) {
    int cells = (int)lround(sim->makespan / q);
    int wlab = label_width(s, sim, q);
    int per_band = avail / wlab;
    int max_bands = MAX_LINES / (s->pp + 2);
    if (max_bands > 4) max_bands = 4;
    if (max_bands < 1) max_bands = 1;
    L.grid = true;
    L.q = q;
    int bands = per_band >= 1 ? (cells + per_band - 1) / per_band : max_bands + 1;
    if (bands <= max_bands) {
      L.w = wlab;
      L.band_cols = (cells + bands - 1) / bands * wlab; /* bands of even length */
    } else if (cells <= avail) {
      L.w = avail / cells < wlab ? avail / cells : wlab;
      L.band_cols = avail;
    } else {
      L.grid = false;
    }
    if (L.grid) {
      L.letters = L.w == 1;
      L.cols = cells * L.w;
      L.per_col = q / L.w;
      L.bands = (L.cols + L.band_cols - 1) / L.band_cols;
      if (L.bands < 1) L.bands = 1;
      return L;
    }
  }
  L.letters = true;
  L.cols = avail;
  L.band_cols = avail;
  L.bands = 1;
  L.per_col = sim->makespan > 0 ? sim->makespan / avail : 1;
  return L;
}

/* Column where time t begins: exact in a grid, the first column whose middle
 * is at or after t when scaled. */
static int col_of(const layout *L, double t) {
  double x = L->grid ? nearbyint(t / L->q) * L->w : ceil(t / L->per_col - 0.5);
  if (x < 0) x = 0;
  if (x > L->cols) x = L->cols;
  return (int)x;
}

static void draw_action(canvas *cv, const layout *L, int r, int c0, int c1, const char *label,
                        mega_action a) {
  char *row = cv->text + (size_t)r * cv->cols;
  unsigned char *st = cv->style + (size_t)r * cv->cols;
  int n = c1 - c0, style = act_style(a.kind);
  char letter = label[0];
  if (a.mb & 1) letter = (char)tolower((unsigned char)letter);
  if (L->letters || n < 2) {
    for (int j = c0; j < c1; j++) row[j] = letter, st[j] = (unsigned char)style;
    return;
  }
  for (int j = c0; j < c1; j++) row[j] = ' ', st[j] = (unsigned char)style;
  st[c1 - 1] = ST_NONE; /* the space that separates it from what follows */
  int len = (int)strlen(label);
  if (len <= n - 1)
    memcpy(row + c0, label, (size_t)len);
  else
    row[c0] = label[0];
}

/* Scaled: a column stands for per_col of time. It shows '.' when the rank
 * was busy less than a quarter of it, else the letter of the kind that
 * filled at least three quarters of the busy time (upper case when busy
 * most of the column, lower case when partly idle), else '+' for a mix,
 * as in 1F1B's steady phase. Sampling one instant per column would alias
 * F B F B into a run of one letter. */
static void paint_scaled(canvas *cv, const layout *L, const mega_schedule *s, const mega_sim *sim,
                         int line, int r, double (*acc)[3]) {
  char *row = cv->text + (size_t)line * cv->cols;
  unsigned char *st = cv->style + (size_t)line * cv->cols;
  memset(acc, 0, sizeof *acc * (size_t)cv->cols);
  for (int i = 0; i < s->ranks[r].n; i++) {
    mega_action a = s->ranks[r].acts[i];
    if (!is_compute(a.kind)) continue;
    mega_span sp = sim->ranks[r].spans[i];
    int k = a.kind == MEGA_ACT_F ? 0 : a.kind == MEGA_ACT_B ? 1 : 2;
    int c0 = (int)floor(sp.start / L->per_col), c1 = (int)floor(sp.end / L->per_col);
    if (c0 < 0) c0 = 0;
    if (c1 >= cv->cols) c1 = cv->cols - 1;
    for (int c = c0; c <= c1; c++) {
      double lo = fmax(sp.start, c * L->per_col), hi = fmin(sp.end, (c + 1) * L->per_col);
      if (hi > lo) acc[c][k] += hi - lo;
    }
  }
  static const char letters[3] = {'F', 'B', 'W'};
  for (int c = 0; c < cv->cols; c++) {
    double busy = acc[c][0] + acc[c][1] + acc[c][2];
    if (busy < 0.25 * L->per_col) continue; /* stays idle */
    int top = 0;
    for (int k = 1; k < 3; k++)
      if (acc[c][k] > acc[c][top]) top = k;
    bool full = busy >= 0.75 * L->per_col;
    if (acc[c][top] >= 0.75 * busy) {
      row[c] = full ? letters[top] : (char)tolower((unsigned char)letters[top]);
      st[c] = (unsigned char)(top == 0 ? ST_F : top == 1 ? ST_B : ST_W);
    } else {
      row[c] = '+';
      st[c] = ST_NONE;
    }
  }
}

static bool has_sync(const mega_schedule *s) {
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->ranks[r].n; i++)
      if (s->ranks[r].acts[i].kind == MEGA_ACT_GRAD_SYNC) return true;
  return false;
}

/* Rows per rank: the rank, and its communicator when there is grad sync. */
static int rows_per_rank(const mega_schedule *s) { return has_sync(s) ? 2 : 1; }

static void paint_span(canvas *cv, const layout *L, int row, double t0, double t1, char ch) {
  int c0 = col_of(L, t0), c1 = col_of(L, t1);
  if (c1 == c0 && t1 > t0 && c0 < cv->cols) c1 = c0 + 1; /* short, but there */
  for (int c = c0; c < c1 && c < cv->cols; c++) {
    cv->text[(size_t)row * cv->cols + c] = ch;
    cv->style[(size_t)row * cv->cols + c] = ST_SYNC;
  }
}

/* GW waits on the rank rows, reductions on the communicator rows. */
static void paint_sync(canvas *cv, const layout *L, const mega_schedule *s, const mega_sim *sim) {
  for (int r = 0; r < s->pp; r++) {
    const mega_sim_rank *mr = &sim->ranks[r];
    for (int i = 0; i < s->ranks[r].n; i++)
      if (s->ranks[r].acts[i].kind == MEGA_ACT_GRAD_WAIT &&
          mr->spans[i].end > mr->spans[i].start)
        paint_span(cv, L, 2 * r, mr->spans[i].start, mr->spans[i].end, '~');
    for (int k = 0; k < mr->nreduce; k++)
      paint_span(cv, L, 2 * r + 1, mr->reduce[k].start, mr->reduce[k].end, '=');
  }
}

static int paint(canvas *cv, const layout *L, const mega_schedule *s, const mega_sim *sim) {
  int per = rows_per_rank(s);
  cv->rows = s->pp * per;
  cv->cols = L->cols;
  size_t cells = (size_t)cv->rows * (size_t)cv->cols;
  cv->text = malloc(cells ? cells : 1);
  cv->style = malloc(cells ? cells : 1);
  if (!cv->text || !cv->style) return -1;
  memset(cv->text, '.', cells);
  memset(cv->style, ST_IDLE, cells);
  if (!L->grid) {
    double(*acc)[3] = malloc(sizeof *acc * (size_t)(cv->cols ? cv->cols : 1));
    if (!acc) return -1;
    for (int r = 0; r < s->pp; r++) paint_scaled(cv, L, s, sim, r * per, r, acc);
    free(acc);
    if (per == 2) paint_sync(cv, L, s, sim);
    return 0;
  }
  for (int r = 0; r < s->pp; r++) {
    char *row = cv->text + (size_t)(r * per) * cv->cols;
    unsigned char *st = cv->style + (size_t)(r * per) * cv->cols;
    for (int i = 0; i < s->ranks[r].n; i++) {
      mega_action a = s->ranks[r].acts[i];
      if (!is_compute(a.kind)) continue;
      mega_span sp = sim->ranks[r].spans[i];
      char lab[32];
      act_label(s, a, lab, sizeof lab);
      int c0 = col_of(L, sp.start), c1 = col_of(L, sp.end);
      if (c1 > c0) draw_action(cv, L, r * per, c0, c1, lab, a);
    }
    /* An idle run ends in a space too, so "... B0" reads like "F0 B0". */
    if (!L->letters)
      for (int c = L->w - 1; c < cv->cols; c += L->w)
        if (row[c] == '.' && (c + 1 == cv->cols || row[c + 1] != '.')) row[c] = ' ', st[c] = ST_NONE;
  }
  if (per == 2) {
    /* the communicator rows start blank */
    for (int r = 0; r < s->pp; r++) {
      memset(cv->text + (size_t)(2 * r + 1) * cv->cols, ' ', (size_t)cv->cols);
      memset(cv->style + (size_t)(2 * r + 1) * cv->cols, ST_NONE, (size_t)cv->cols);
    }
    paint_sync(cv, L, s, sim);
  }
  return 0;
}

/* Time labels for the columns [from, to). */
static void print_axis(FILE *f, const layout *L, double makespan, int from, int to, int label_w) {
  char axis[4096], num[64];
  int width = to - from;
  if (width > (int)sizeof axis - 1) width = (int)sizeof axis - 1;
  memset(axis, ' ', (size_t)width);
  axis[width] = '\0';
  int span = (int)strlen(fmt_num(makespan, num, sizeof num)) + 2;
  double step = 0;
  if (L->grid) {
    static const int nice[] = {1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1000, 2000, 5000, 10000};
    for (size_t k = 0; k < sizeof nice / sizeof nice[0] && !step; k++)
      if (nice[k] * L->w >= span) step = nice[k] * L->q;
    if (!step) step = makespan;
  } else {
    for (double p = 1e-6; !step && p < 1e15; p *= 10)
      for (int k = 0; k < 3 && !step; k++) {
        double t = p * (k == 0 ? 1 : k == 1 ? 2 : 5);
        if (t / L->per_col >= span) step = t;
      }
    if (!step) step = makespan;
  }
  int last_end = -1;
  /* a label every step: at most one per column of the band, so the loop is
   * bounded even where step is no bigger than a column (or not a number) */
  for (long i = 0; i <= (long)to; i++) {
    double t = (double)i * step;
    if (t > makespan * (1 + 1e-9)) break;
    int c = col_of(L, t);
    if (c >= to) break;
    if (c < from) continue;
    fmt_num(t, num, sizeof num);
    int len = (int)strlen(num), at = c - from;
    if (at <= last_end || at + len > width) continue;
    memcpy(axis + at, num, (size_t)len);
    last_end = at + len;
  }
  int e = width;
  while (e > 0 && axis[e - 1] == ' ') e--;
  axis[e] = '\0';
  fprintf(f, "%-*s%s\n", label_w, "time", axis);
}

static const char *style_on(int st) {
  switch (st) {
  case ST_F: return "\033[30;46m";
  case ST_B: return "\033[30;43m";
  case ST_W: return "\033[30;45m";
  case ST_IDLE: return "\033[2m";
  case ST_SYNC: return "\033[30;42m";
  default: return "";
  }
}

static void print_row(FILE *f, const canvas *cv, int r, int from, int to, bool color) {
  const char *row = cv->text + (size_t)r * cv->cols;
  const unsigned char *st = cv->style + (size_t)r * cv->cols;
  int end = to;
  while (end > from && row[end - 1] == ' ' && (!color || st[end - 1] == ST_NONE)) end--;
  int cur = ST_NONE;
  for (int c = from; c < end; c++) {
    if (color && st[c] != cur) {
      fputs("\033[0m", f);
      fputs(style_on(st[c]), f);
      cur = st[c];
    }
    fputc(row[c], f);
  }
  if (color && cur != ST_NONE) fputs("\033[0m", f);
  fputc('\n', f);
}

static void print_stats(FILE *f, const mega_schedule *s, const mega_sim *sim) {
  char busy[64], idle[64], exp[64];
  bool sync = has_sync(s);
  /* with grad sync a narrower in-flight column makes room for the exposed
   * part, within 80 columns */
  int wf = sync ? 9 : 14;
  fprintf(f, "%4s  %6s  %6s  %8s  %*s  %8s  %8s  %7s%s\n", "rank", "warmup", "steady", "cooldown",
          wf, sync ? "in-flight" : "peak in-flight", "busy", "idle", "bubble",
          sync ? "  exposed" : "");
  for (int r = 0; r < s->pp; r++) {
    mega_phases ph = mega_sched_phases(s, r);
    const mega_sim_rank *mr = &sim->ranks[r];
    fprintf(f, "%4d  %6d  %6d  %8d  %*d  %8s  %8s  %6.2f%%", r, ph.warmup, ph.steady,
            ph.cooldown, wf, mr->peak_inflight, fmt_num(mr->busy, busy, sizeof busy),
            fmt_num(mr->idle, idle, sizeof idle), 100.0 * mr->bubble_fraction);
    if (sync) fprintf(f, "  %7s", fmt_num(mr->grad_sync_exposed, exp, sizeof exp));
    fputc('\n', f);
  }
  if (sync)
    fputs("exposed: grad sync outlasting the pipeline's work\n", f);
}

int plan_render_text(FILE *f, const mega_schedule *s, const mega_sim *sim, const mega_cost *cost,
                     int width, bool color) {
  if (width < 40) width = 40;
  char a[64], b[64], c[64], d[64];
  /* a time past a double's range has no columns: say so rather than draw */
  if (!isfinite(sim->makespan) || sim->makespan < 0) {
    fprintf(f, "makespan %g: not a time that can be drawn; give smaller times\n", sim->makespan);
    return 0;
  }
  fprintf(f, "%s schedule, pp=%d vp=%d microbatches=%d", mega_sched_kind_name(s->kind), s->pp,
          s->vp, s->microbatches);
  if (s->kind == MEGA_SCHED_INTERLEAVED) fprintf(f, " group=%d", s->group_size);
  fprintf(f, "\ncost model: T_f=%s T_b=%s T_w=%s p2p latency=%s\n\n", fmt_num(cost->t_f, a, sizeof a),
          fmt_num(cost->t_b, b, sizeof b), fmt_num(cost->t_w, c, sizeof c),
          fmt_num(cost->p2p_latency, d, sizeof d));

  int label_w = (int)strlen("rank ") + snprintf(NULL, 0, "%d", s->pp - 1) + 1;
  if (label_w < 5) label_w = 5;
  layout L = choose_layout(s, sim, width - label_w - 1);
  canvas cv = {0};
  if (paint(&cv, &L, s, sim)) {
    free(cv.text);
    free(cv.style);
    return -1;
  }
  for (int band = 0; band < L.bands; band++) {
    int from = band * L.band_cols, to = from + L.band_cols;
    if (to > L.cols) to = L.cols;
    if (band) fputc('\n', f);
    print_axis(f, &L, sim->makespan, from, to, label_w);
    int per = rows_per_rank(s);
    for (int r = 0; r < s->pp; r++) {
      fprintf(f, "rank %*d ", label_w - 6, r);
      print_row(f, &cv, r * per, from, to, color);
      if (per == 2) {
        fprintf(f, "%*s ", label_w - 1, "dp");
        print_row(f, &cv, r * per + 1, from, to, color);
      }
    }
  }
  free(cv.text);
  free(cv.style);

  fputc('\n', f);
  double unit = L.grid ? L.q : L.per_col;
  if (!L.grid)
    fputs("F B W: a column mostly forward, backward, weight gradient; + a mix of them\n"
          "lower case: partly idle; ", f);
  else if (L.letters)
    fputs("F B W: forward, backward, weight gradient (lower case: odd microbatches)\n", f);
  else
    fprintf(f, "F3 B3 W3: forward, backward, weight gradient of microbatch 3%s\n",
            s->vp > 1 ? " (F3.1: chunk 1)" : "");
  fprintf(f, ".: idle; one %s is %s time unit%s\n", L.grid && !L.letters ? "cell" : "column",
          fmt_num(unit, a, sizeof a), unit == 1 ? "" : "s");
  if (has_sync(s))
    fprintf(f, "dp =: the rank's data-parallel gradient reduction, launched by GS (its\n"
               "buckets during the chunk's last backward when GS follows it); ~: waiting\n"
               "for it (GW); T_grad_sync=%s in %d bucket%s per chunk%s%s%s\n",
            fmt_num(cost->grad_sync, b, sizeof b), cost->grad_buckets > 1 ? cost->grad_buckets : 1,
            cost->grad_buckets > 1 ? "s" : "", cost->grad_sync_lanes > 0 ? ",\n" : "",
            cost->grad_sync_lanes > 0 ? fmt_num(cost->grad_sync_lanes, c, sizeof c) : "",
            cost->grad_sync_lanes > 0 ? " of them at full speed at once across ranks" : "");
  if (has_sync(s) && cost->grad_sync_slowdown) {
    fputs("reductions at once across ranks run slower by", f);
    for (int k = 0; k < cost->grad_sync_slowdown_n && k < 6; k++) /* one line */
      fprintf(f, "%s %d: %sx", k ? "," : "", k + 1,
              fmt_num(cost->grad_sync_slowdown[k], c, sizeof c));
    if (cost->grad_sync_slowdown_n > 6) fputs(", ...", f);
    fputc('\n', f);
  }
  fputc('\n', f);
  print_stats(f, s, sim);
  fprintf(f, "\nmakespan %s, mean bubble %.2f%%", fmt_num(sim->makespan, a, sizeof a),
          100.0 * sim->bubble_fraction);

  if (s->vp > 1) fprintf(f, " (phases count virtual microbatches)");
  fputc('\n', f);
  if (has_sync(s))
    fprintf(f, "mean exposed grad sync %s\n", fmt_num(sim->grad_sync_exposed, c, sizeof c));
  return 0;
}
