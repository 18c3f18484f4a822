#include "core/layout.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Limits that keep a hostile string from eating the stack or the heap. */
enum { MAX_DEPTH = 64, MAX_LETTERS = 1 << 20, MAX_REPEAT = 1000000 };

/* The expanded string, with each letter's source column for error messages. */
typedef struct expansion {
  char *c;
  int *col;
  size_t n, cap;
} expansion;

typedef struct parser {
  const char *s;
  size_t i;
  expansion x;
  mega_err *err;
} parser;

static bool is_layer(char c) {
  return c == MEGA_LAYER_EMBEDDING || c == MEGA_LAYER_DECODER || c == MEGA_LAYER_MTP ||
         c == MEGA_LAYER_LOSS;
}

static const char *layer_name(char c) {
  switch (c) {
  case MEGA_LAYER_EMBEDDING: return "embedding";
  case MEGA_LAYER_DECODER: return "decoder";
  case MEGA_LAYER_MTP: return "multi-token prediction";
  case MEGA_LAYER_LOSS: return "loss";
  default: return "?";
  }
}

static mega_status reserve(parser *p, size_t extra) {
  if (p->x.n + extra > MAX_LETTERS)
    return mega_fail(p->err, MEGA_ERR_INVALID,
                     "the layout expands to more than %d letters; use a smaller repeat count",
                     MAX_LETTERS);
  if (p->x.n + extra <= p->x.cap) return MEGA_OK;
  size_t cap = p->x.cap ? p->x.cap : 64;
  while (cap < p->x.n + extra) cap *= 2;
  char *c = realloc(p->x.c, cap);
  if (!c) return mega_fail(p->err, MEGA_ERR_NOMEM, "out of memory expanding a layout");
  p->x.c = c;
  int *col = realloc(p->x.col, cap * sizeof *col);
  if (!col) return mega_fail(p->err, MEGA_ERR_NOMEM, "out of memory expanding a layout");
  p->x.col = col;
  p->x.cap = cap;
  return MEGA_OK;
}

static void skip_blank(parser *p) {
  while (p->s[p->i] == ',' || isspace((unsigned char)p->s[p->i])) p->i++;
}

static int col_of(size_t i) { return (int)i + 1; }

/* After an atom that expanded to x[start..n): an optional "*count". */
static mega_status parse_repeat(parser *p, size_t start, bool required, size_t atom_at) {
  skip_blank(p);
  if (p->s[p->i] != '*') {
    if (required)
      return mega_fail(p->err, MEGA_ERR_INVALID,
                       "column %d: '(...)' needs a repeat count after it, as in (tt|)*3",
                       col_of(atom_at));
    return MEGA_OK;
  }
  size_t star = p->i++;
  skip_blank(p);
  if (!isdigit((unsigned char)p->s[p->i]))
    return mega_fail(p->err, MEGA_ERR_INVALID,
                     "column %d: '*' needs a repeat count (a whole number >= 1) after it",
                     col_of(star));
  size_t num_at = p->i;
  long count = 0;
  while (isdigit((unsigned char)p->s[p->i])) {
    count = count * 10 + (p->s[p->i] - '0');
    if (count > MAX_REPEAT)
      return mega_fail(p->err, MEGA_ERR_INVALID, "column %d: repeat count is larger than %d",
                       col_of(num_at), MAX_REPEAT);
    p->i++;
  }
  if (count == 0)
    return mega_fail(p->err, MEGA_ERR_INVALID, "column %d: repeat count must be at least 1 (got 0)",
                     col_of(num_at));
  size_t len = p->x.n - start;
  if (len * (size_t)(count - 1) > MAX_LETTERS) return reserve(p, MAX_LETTERS + 1);
  mega_status st = reserve(p, len * (size_t)(count - 1));
  if (st != MEGA_OK) return st;
  for (long k = 1; k < count; k++) {
    memcpy(p->x.c + p->x.n, p->x.c + start, len);
    memcpy(p->x.col + p->x.n, p->x.col + start, len * sizeof(int));
    p->x.n += len;
  }
  return MEGA_OK;
}

/* seq := ( atom ['*' count] )*, atom := letter | '|' | '(' seq ')' */
static mega_status parse_seq(parser *p, int depth) {
  for (;;) {
    skip_blank(p);
    char c = p->s[p->i];
    if (c == '\0') return MEGA_OK;
    if (c == ')') {
      if (depth > 0) return MEGA_OK;
      return mega_fail(p->err, MEGA_ERR_INVALID, "column %d: ')' has no matching '('",
                       col_of(p->i));
    }
    size_t start = p->x.n, at = p->i;
    mega_status st;
    if (c == '(') {
      if (depth >= MAX_DEPTH)
        return mega_fail(p->err, MEGA_ERR_INVALID,
                         "column %d: parentheses nest deeper than %d levels", col_of(at),
                         MAX_DEPTH);
      p->i++;
      if ((st = parse_seq(p, depth + 1)) != MEGA_OK) return st;
      if (p->s[p->i] != ')')
        return mega_fail(p->err, MEGA_ERR_INVALID, "column %d: '(' is never closed",
                         col_of(at));
      p->i++;
      if (p->x.n == start)
        return mega_fail(p->err, MEGA_ERR_INVALID, "column %d: '()' repeats nothing",
                         col_of(at));
      st = parse_repeat(p, start, true, at);
    } else if (is_layer(c) || c == '|') {
      if ((st = reserve(p, 1)) != MEGA_OK) return st;
      p->x.c[p->x.n] = c;
      p->x.col[p->x.n++] = col_of(at);
      p->i++;
      st = parse_repeat(p, start, false, at);
    } else if (c == '*') {
      return mega_fail(p->err, MEGA_ERR_INVALID, "column %d: '*' has nothing to repeat",
                       col_of(at));
    } else if (isprint((unsigned char)c)) {
      return mega_fail(p->err, MEGA_ERR_INVALID,
                       "column %d: unknown letter '%c'; a layout uses E (embedding), "
                       "t (decoder), m (multi-token prediction), L (loss), '|' between "
                       "stages, and (...)*n or x*n to repeat",
                       col_of(at), c);
    } else {
      return mega_fail(p->err, MEGA_ERR_INVALID,
                       "column %d: unexpected byte 0x%02X; a layout uses E, t, m, L, '|', "
                       "'(', ')', '*', digits and commas",
                       col_of(at), (unsigned char)c);
    }
    if (st != MEGA_OK) return st;
  }
}

/* E only as the first letter of the first stage, L only as the last letter of
 * the last stage, each exactly once. */
static mega_status check_ends(const expansion *x, int nstages, int len, mega_err *err) {
  int seen_e = 0, seen_l = 0;
  for (size_t k = 0; k < x->n; k++) {
    char c = x->c[k];
    if (c != MEGA_LAYER_EMBEDDING && c != MEGA_LAYER_LOSS) continue;
    if ((c == MEGA_LAYER_EMBEDDING ? seen_e++ : seen_l++) > 0)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "column %d: a second '%c' (%s); the layout must have exactly one",
                       x->col[k], c, layer_name(c));
  }
  if (!seen_e)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "column 1: the first stage has no 'E' (embedding); start the layout with E");
  if (!seen_l)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "column %d: the last stage has no 'L' (loss); end the layout with L",
                     len > 0 ? len : 1);
  int stage = 0;
  for (size_t k = 0; k < x->n; k++) {
    char c = x->c[k];
    if (c == '|') {
      stage++;
      continue;
    }
    if (c != MEGA_LAYER_EMBEDDING && c != MEGA_LAYER_LOSS) continue;
    bool is_e = c == MEGA_LAYER_EMBEDDING;
    int want_stage = is_e ? 0 : nstages - 1;
    if (stage != want_stage)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "column %d: '%c' (%s) is in stage %d, but it belongs in the %s stage "
                       "(stage %d) only",
                       x->col[k], c, layer_name(c), stage, is_e ? "first" : "last", want_stage);
    bool at_edge = is_e ? (k == 0) : (k + 1 == x->n);
    if (!at_edge)
      return mega_fail(err, MEGA_ERR_INVALID, "column %d: '%c' (%s) must come %s in its stage",
                       x->col[k], c, layer_name(c), is_e ? "first" : "last");
  }
  return MEGA_OK;
}

/* E, t, m, L as 0..3; -1 for anything else. */
static int kind_index(char c) {
  switch (c) {
  case MEGA_LAYER_EMBEDDING: return 0;
  case MEGA_LAYER_DECODER: return 1;
  case MEGA_LAYER_MTP: return 2;
  case MEGA_LAYER_LOSS: return 3;
  default: return -1;
  }
}

/* Builds out from expanded letters with '|' between stages. */
static mega_status build(const char *letters, size_t n, int pp, mega_layout *out, mega_err *err) {
  int nstages = 1;
  for (size_t k = 0; k < n; k++) nstages += letters[k] == '|';
  if (nstages % pp != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "the layout has %d stages, which is not a multiple of the pipeline size "
                     "PP = %d; give PP × VP stages",
                     nstages, pp);
  mega_layout l = {.pp = pp, .vp = nstages / pp, .nstages = nstages};
  l.stage_start = malloc(sizeof(int) * (size_t)(nstages + 1));
  l.kinds = malloc(n + 1);
  l.before = calloc(4 * ((size_t)nstages + 1), sizeof(int));
  if (!l.stage_start || !l.kinds || !l.before) {
    mega_layout_free(&l);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory building a layout");
  }
  int s = 0, m = 0;
  l.stage_start[0] = 0;
  for (size_t k = 0; k < n; k++) {
    if (letters[k] == '|') l.stage_start[++s] = m;
    else l.kinds[m++] = letters[k];
  }
  l.stage_start[nstages] = m;
  l.kinds[m] = '\0';
  for (int st = 0; st < nstages; st++)
    for (int k = 0; k < 4; k++) {
      int c = 0;
      for (int i = l.stage_start[st]; i < l.stage_start[st + 1]; i++)
        c += kind_index(l.kinds[i]) == k;
      l.before[k * (nstages + 1) + st + 1] = l.before[k * (nstages + 1) + st] + c;
    }
  *out = l;
  return MEGA_OK;
}

mega_status mega_layout_parse(const char *str, int pp, mega_layout *out, mega_err *err) {
  memset(out, 0, sizeof *out);
  if (pp < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "pipeline-parallel size (PP) must be at least 1 (got %d)", pp);
  if (!str) return mega_fail(err, MEGA_ERR_INVALID, "no layout string given");
  parser p = {.s = str, .err = err};
  mega_status st = parse_seq(&p, 0);
  if (st == MEGA_OK) {
    st = build(p.x.c ? p.x.c : "", p.x.n, pp, out, err);
    if (st == MEGA_OK) st = check_ends(&p.x, out->nstages, (int)strlen(str), err);
    if (st != MEGA_OK) mega_layout_free(out);
  }
  free(p.x.c);
  free(p.x.col);
  return st;
}

mega_status mega_layout_uniform(int num_layers, int pp, int vp, int first, int last,
                                mega_layout *out, mega_err *err) {
  memset(out, 0, sizeof *out);
  if (num_layers < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "--num-layers must be at least 1 (got %d)", num_layers);
  if (pp < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "pipeline-parallel size (PP) must be at least 1 (got %d)", pp);
  if (vp < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "virtual pipeline size (VP) must be at least 1 (got %d)", vp);
  if (first < -1 || last < -1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--decoder-%s-pipeline-num-layers must be at least 0 (got %d)",
                     first < -1 ? "first" : "last", first < -1 ? first : last);
  if (pp == 1 && (first >= 0 || last >= 0))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--decoder-%s-pipeline-num-layers needs a pipeline (PP > 1); with PP = 1 "
                     "every layer is on the one stage",
                     first >= 0 ? "first" : "last");
  long long given = (first >= 0 ? first : 0) + (long long)(last >= 0 ? last : 0);
  int others = pp - (first >= 0) - (last >= 0);
  long long rest = num_layers - given;
  if (rest < 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "the first and last pipeline ranks take %lld layers, more than "
                     "--num-layers %d",
                     given, num_layers);
  if (others == 0 && rest != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--num-layers %d minus first %d and last %d leaves %lld layers, but PP = %d "
                     "has no other pipeline rank to hold them",
                     num_layers, first, last, rest, pp);
  if (others > 0 && rest % others != 0) {
    if (first < 0 && last < 0)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "--num-layers %d is not divisible by the pipeline size PP = %d", num_layers,
                       pp);
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--num-layers %d minus the first/last pipeline ranks' %lld leaves %lld "
                     "layers, which are not divisible by the %d other pipeline ranks",
                     num_layers, given, rest, others);
  }
  int per_other = others > 0 ? (int)(rest / others) : 0;
  int *per_rank = malloc(sizeof(int) * (size_t)pp);
  if (!per_rank) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory building a layout");
  for (int r = 0; r < pp; r++) {
    per_rank[r] = per_other;
    if (r == 0 && first >= 0) per_rank[r] = first;
    if (r == pp - 1 && last >= 0) per_rank[r] = last;
  }
  for (int r = 0; r < pp; r++) {
    if (per_rank[r] % vp == 0) continue;
    const char *which = r == 0 && first >= 0       ? "--decoder-first-pipeline-num-layers"
                        : r == pp - 1 && last >= 0 ? "--decoder-last-pipeline-num-layers"
                                                   : NULL;
    mega_status st;
    if (which)
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "%s %d is not divisible by the virtual pipeline size VP = %d", which,
                     per_rank[r], vp);
    else
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "pipeline rank %d's %d layers are not divisible by the virtual pipeline "
                     "size VP = %d (--num-layers %d over PP = %d)",
                     r, per_rank[r], vp, num_layers, pp);
    free(per_rank);
    return st;
  }
  /* Letters in string order: stage s is (s % pp, s / pp). */
  size_t n = (size_t)num_layers + 2 + (size_t)pp * vp;
  char *letters = malloc(n);
  if (!letters) {
    free(per_rank);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory building a layout");
  }
  size_t m = 0;
  for (int s = 0; s < pp * vp; s++) {
    int r = s % pp, v = s / pp;
    if (s) letters[m++] = '|';
    if (r == 0 && v == 0) letters[m++] = MEGA_LAYER_EMBEDDING;
    for (int k = 0; k < per_rank[r] / vp; k++) letters[m++] = MEGA_LAYER_DECODER;
    if (r == pp - 1 && v == vp - 1) letters[m++] = MEGA_LAYER_LOSS;
  }
  free(per_rank);
  mega_status st = build(letters, m, pp, out, err);
  free(letters);
  return st;
}

void mega_layout_free(mega_layout *l) {
  if (!l) return;
  free(l->stage_start);
  free(l->kinds);
  free(l->before);
  memset(l, 0, sizeof *l);
}

static int stage_index(const mega_layout *l, int pp_rank, int vp_stage) {
  if (!l->kinds || pp_rank < 0 || pp_rank >= l->pp || vp_stage < 0 || vp_stage >= l->vp)
    return -1;
  return vp_stage * l->pp + pp_rank;
}

const char *mega_layout_stage(const mega_layout *l, int pp_rank, int vp_stage, int *len) {
  int s = stage_index(l, pp_rank, vp_stage);
  if (s < 0) {
    if (len) *len = 0;
    return NULL;
  }
  if (len) *len = l->stage_start[s + 1] - l->stage_start[s];
  return l->kinds + l->stage_start[s];
}

static int count_range(const mega_layout *l, int from_stage, int to_stage, char kind) {
  int k = kind_index(kind);
  if (k < 0) return 0;
  const int *b = l->before + (size_t)k * ((size_t)l->nstages + 1);
  return b[to_stage] - b[from_stage];
}

int mega_layout_count(const mega_layout *l, int pp_rank, int vp_stage, char kind) {
  int s = stage_index(l, pp_rank, vp_stage);
  return s < 0 ? 0 : count_range(l, s, s + 1, kind);
}

/* Model order is string order, so Megatron's get_layer_offset (all pp ranks
 * of earlier vp stages, then earlier pp ranks of this one) is the count in
 * the stages before this one. */
int mega_layout_offset(const mega_layout *l, int pp_rank, int vp_stage, char kind) {
  int s = stage_index(l, pp_rank, vp_stage);
  return s < 0 ? 0 : count_range(l, 0, s, kind);
}

int mega_layout_ids(const mega_layout *l, int pp_rank, int vp_stage, char kind, int *ids) {
  int off = mega_layout_offset(l, pp_rank, vp_stage, kind);
  int n = mega_layout_count(l, pp_rank, vp_stage, kind);
  for (int k = 0; k < n; k++) ids[k] = off + k;
  return n;
}

int mega_layout_total(const mega_layout *l, char kind) {
  return l->kinds ? count_range(l, 0, l->nstages, kind) : 0;
}

char *mega_layout_format(const mega_layout *l) {
  size_t letters = l->kinds ? strlen(l->kinds) : 0;
  size_t bars = l->nstages > 0 ? (size_t)l->nstages - 1 : 0;
  char *out = malloc(letters + bars + 1);
  if (!out) return NULL;
  size_t m = 0;
  for (int s = 0; s < l->nstages; s++) {
    if (s) out[m++] = '|';
    int len = l->stage_start[s + 1] - l->stage_start[s];
    memcpy(out + m, l->kinds + l->stage_start[s], (size_t)len);
    m += (size_t)len;
  }
  out[m] = '\0';
  return out;
}
