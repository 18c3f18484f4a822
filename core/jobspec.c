/* Job specs: their life cycle, the typed setters that enforce a flag's
 * bounds, and parsing Megatron's command line, all by the flag table
 * (jobspec_flags.c). */
#include "core/jobspec.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/jobspec_internal.h"
#include "core/utf8.h"

/* ---- the flag table (jobspec_flags.c) ---- */


int mega_jobspec_flag_count(void) { return NFLAGS; }

const mega_jobflag *mega_jobspec_flag(int i) {
  return i >= 0 && i < NFLAGS ? &mega_jf_table[i].info : NULL;
}

static const flagdef *find_n(const char *name, size_t n) {
  for (int i = 0; i < NFLAGS; i++)
    if (strlen(mega_jf_table[i].info.name) == n && memcmp(mega_jf_table[i].info.name, name, n) == 0)
      return &mega_jf_table[i];
  return NULL;
}

const mega_jobflag *mega_jobspec_flag_find(const char *name) {
  const flagdef *f = name ? find_n(name, strlen(name)) : NULL;
  return f ? &f->info : NULL;
}

int mega_jobspec_path_fields(mega_jobspec *s, char **out[], int cap) {
  int n = 0;
  for (int i = 0; i < NFLAGS; i++) {
    const flagdef *f = &mega_jf_table[i];
    if (f->info.type != MEGA_JOBFLAG_STRING || !f->info.metavar ||
        (strcmp(f->info.metavar, "FILE") && strcmp(f->info.metavar, "DIR")))
      continue;
    if (n < cap) out[n] = FIELD(s, f, char *);
    n++;
  }
  return n;
}

int mega_jf_nchoices(const flagdef *f) {
  int n = 0;
  while (f->info.choices[n]) n++;
  return n;
}

/* ---- life cycle ---- */

void mega_jf_set_default(mega_jobspec *s, const flagdef *f) {
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT:
  case MEGA_JOBFLAG_ENUM: *FIELD(s, f, int) = (int)f->idef; break;
  case MEGA_JOBFLAG_FLOAT: *FIELD(s, f, double) = f->fdef; break;
  case MEGA_JOBFLAG_STRING: *FIELD(s, f, char *) = NULL; break;
  case MEGA_JOBFLAG_BOOL: *FIELD(s, f, bool) = f->idef != 0; break;
  case MEGA_JOBFLAG_LIST: *FIELD(s, f, mega_strlist) = (mega_strlist){0}; break;
  }
}

void mega_jf_list_free(mega_strlist *l) {
  for (int k = 0; k < l->n; k++) free(l->v[k]);
  free(l->v);
  *l = (mega_strlist){0};
}

/* The flag's owned memory, released; the field is then undefined until
 * mega_jf_set_default. */
static void release(mega_jobspec *s, const flagdef *f) {
  if (f->info.type == MEGA_JOBFLAG_STRING) free(*FIELD(s, f, char *));
  if (f->info.type == MEGA_JOBFLAG_LIST) mega_jf_list_free(FIELD(s, f, mega_strlist));
}

void mega_jobspec_defaults(mega_jobspec *s) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < NFLAGS; i++) mega_jf_set_default(s, &mega_jf_table[i]);
}

void mega_jobspec_free(mega_jobspec *s) {
  if (!s) return;
  for (int i = 0; i < NFLAGS; i++) release(s, &mega_jf_table[i]);
  mega_jobspec_defaults(s);
}

static bool owns_memory(const flagdef *f) {
  return f->info.type == MEGA_JOBFLAG_STRING || f->info.type == MEGA_JOBFLAG_LIST;
}

mega_status mega_jobspec_copy(mega_jobspec *dst, const mega_jobspec *src, mega_err *err) {
  *dst = *src;
  for (int i = 0; i < NFLAGS; i++)
    if (owns_memory(&mega_jf_table[i])) mega_jf_set_default(dst, &mega_jf_table[i]);
  for (int i = 0; i < NFLAGS; i++) {
    const flagdef *f = &mega_jf_table[i];
    mega_status st = MEGA_OK;
    if (f->info.type == MEGA_JOBFLAG_STRING) {
      const char *v = *CFIELD(src, f, char *);
      if (v && !(*FIELD(dst, f, char *) = strdup(v))) st = MEGA_ERR_NOMEM;
    } else if (f->info.type == MEGA_JOBFLAG_LIST) {
      const mega_strlist *l = CFIELD(src, f, mega_strlist);
      if (l->n) st = mega_jf_set_list(dst, f, (const char *const *)l->v, l->n, NULL);
    }
    if (st != MEGA_OK) {
      mega_jobspec_free(dst);
      return mega_fail(err, MEGA_ERR_NOMEM, "out of memory copying a job spec");
    }
  }
  return MEGA_OK;
}

static bool same_value(const mega_jobspec *a, const mega_jobspec *b, const flagdef *f) {
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT:
  case MEGA_JOBFLAG_ENUM: return *CFIELD(a, f, int) == *CFIELD(b, f, int);
  case MEGA_JOBFLAG_BOOL: return *CFIELD(a, f, bool) == *CFIELD(b, f, bool);
  case MEGA_JOBFLAG_FLOAT: {
    double x = *CFIELD(a, f, double), y = *CFIELD(b, f, double);
    return x == y || (isnan(x) && isnan(y));
  }
  case MEGA_JOBFLAG_STRING: {
    const char *x = *CFIELD(a, f, char *), *y = *CFIELD(b, f, char *);
    return x == y || (x && y && strcmp(x, y) == 0);
  }
  case MEGA_JOBFLAG_LIST: {
    const mega_strlist *x = CFIELD(a, f, mega_strlist), *y = CFIELD(b, f, mega_strlist);
    if (x->n != y->n) return false;
    for (int k = 0; k < x->n; k++)
      if (strcmp(x->v[k], y->v[k])) return false;
    return true;
  }
  }
  return false;
}

bool mega_jobspec_equal(const mega_jobspec *a, const mega_jobspec *b) {
  for (int i = 0; i < NFLAGS; i++)
    if (!same_value(a, b, &mega_jf_table[i])) return false;
  return true;
}

bool mega_jf_is_default(const mega_jobspec *s, const flagdef *f) {
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT:
  case MEGA_JOBFLAG_ENUM: return *CFIELD(s, f, int) == f->idef;
  case MEGA_JOBFLAG_BOOL: return *CFIELD(s, f, bool) == (f->idef != 0);
  case MEGA_JOBFLAG_FLOAT: {
    double x = *CFIELD(s, f, double);
    return x == f->fdef || (isnan(x) && isnan(f->fdef));
  }
  case MEGA_JOBFLAG_STRING: return *CFIELD(s, f, char *) == NULL;
  case MEGA_JOBFLAG_LIST: return CFIELD(s, f, mega_strlist)->n == 0;
  }
  return true;
}

/* ---- typed setters: the one place a flag's bounds are enforced ---- */

/* The shortest text that reads back as exactly v. */
void mega_jf_format_double(double v, char *buf, size_t n) {
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, v);
    if (strtod(buf, NULL) == v) return;
  }
}


mega_status mega_jf_check_bounds(const flagdef *f, double v, const char *lead, mega_err *err) {
  const mega_jobflag *in = &f->info;
  char got[64];
  if (in->type == MEGA_JOBFLAG_INT) snprintf(got, sizeof got, "%.0f", v);
  else mega_jf_format_double(v, got, sizeof got);
  if (in->type == MEGA_JOBFLAG_FLOAT && !isfinite(v))
    return mega_fail(err, MEGA_ERR_INVALID, "%s%s must be a finite number (got %s)", lead,
                     in->name, got);
  if (!isnan(in->min) && (in->min_exclusive ? !(v > in->min) : !(v >= in->min)))
    return mega_fail(err, MEGA_ERR_INVALID, "%s%s must be %s %g (got %s)", lead, in->name,
                     in->min_exclusive ? "greater than" : "at least", in->min, got);
  if (!isnan(in->max) && (in->max_exclusive ? !(v < in->max) : !(v <= in->max)))
    return mega_fail(err, MEGA_ERR_INVALID, "%s%s must be %s %g (got %s)", lead, in->name,
                     in->max_exclusive ? "less than" : "at most", in->max, got);
  return MEGA_OK;
}

mega_status mega_jf_set_string(mega_jobspec *s, const flagdef *f, const char *v, mega_err *err) {
  if (!*v) return mega_fail(err, MEGA_ERR_INVALID, "%s: the value is empty", f->info.name);
  /* specs travel as JSON (trainer_state.json, megactl --json), which holds
   * only UTF-8 text */
  if (!mega_utf8_valid(v))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s: the value is not valid UTF-8 text; give a UTF-8 name (for a file, "
                     "rename it or link it under a UTF-8 name)", f->info.name);
  char *copy = strdup(v);
  if (!copy) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory storing %s", f->info.name);
  free(*FIELD(s, f, char *));
  *FIELD(s, f, char *) = copy;
  return MEGA_OK;
}

mega_status mega_jf_set_list(mega_jobspec *s, const flagdef *f, const char *const *words, int n,
                             mega_err *err) {
  const char *name = f->info.name;
  if (n < 1) return mega_fail(err, MEGA_ERR_INVALID, "%s needs at least one value", name);
  for (int k = 0; k < n; k++) {
    if (!*words[k] && n == 1)
      return mega_fail(err, MEGA_ERR_INVALID, "%s: the value is empty", name);
    if (!*words[k]) return mega_fail(err, MEGA_ERR_INVALID, "%s: value %d is empty", name, k + 1);
    if (!mega_utf8_valid(words[k])) /* as for a string flag: specs travel as JSON */
      return mega_fail(err, MEGA_ERR_INVALID,
                       "%s: the value is not valid UTF-8 text; give a UTF-8 name (for a file, "
                       "rename it or link it under a UTF-8 name)", name);
    /* argv could not carry it back: it would read as the next flag */
    if (n > 1 && !strncmp(words[k], "--", 2))
      return mega_fail(err, MEGA_ERR_INVALID,
                       "%s: value '%s' starts with --; write a path like that as ./%s", name,
                       words[k], words[k]);
  }
  mega_strlist l = {.n = n, .v = calloc((size_t)n, sizeof(char *))};
  for (int k = 0; l.v && k < n; k++)
    if (!(l.v[k] = strdup(words[k]))) {
      mega_jf_list_free(&l);
      break;
    }
  if (!l.v) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory storing %s", name);
  mega_jf_list_free(FIELD(s, f, mega_strlist));
  *FIELD(s, f, mega_strlist) = l;
  return MEGA_OK;
}

mega_status mega_jf_set_enum(mega_jobspec *s, const flagdef *f, const char *v, mega_err *err) {
  for (int k = 0; f->info.choices[k]; k++)
    if (strcmp(v, f->info.choices[k]) == 0) {
      *FIELD(s, f, int) = k;
      return MEGA_OK;
    }
  char list[256] = "";
  for (int k = 0; f->info.choices[k]; k++) {
    if (k) strncat(list, ", ", sizeof list - strlen(list) - 1);
    strncat(list, f->info.choices[k], sizeof list - strlen(list) - 1);
  }
  const char *hint = mega_jf_compat_enum_hint(f->info.name);
  return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not one of %s%s%s", f->info.name, v, list,
                   hint ? ": " : "", hint ? hint : "");
}

static mega_status parse_int_text(const flagdef *f, const char *v, int *out, mega_err *err) {
  const char *name = f->info.name;
  if (!*v || isspace((unsigned char)*v))
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a whole number", name, v);
  errno = 0;
  char *end;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a whole number", name, v);
  if (errno == ERANGE || x > INT_MAX || x < INT_MIN)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is out of range (at most %d)", name, v,
                     INT_MAX);
  *out = (int)x;
  return MEGA_OK;
}

mega_status mega_jf_parse_float_text(const char *name, const char *v, double *out, mega_err *err) {
  if (!*v || isspace((unsigned char)*v))
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a number", name, v);
  errno = 0;
  char *end;
  double x = strtod(v, &end);
  if (end == v || *end)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a number", name, v);
  if (errno == ERANGE)
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is too %s to represent", name, v,
                     fabs(x) > 1 ? "large" : "small");
  if (!isfinite(x))
    return mega_fail(err, MEGA_ERR_INVALID, "%s: '%s' is not a finite number", name, v);
  *out = x;
  return MEGA_OK;
}

mega_status mega_jf_set_int(mega_jobspec *s, const flagdef *f, int v, mega_err *err) {
  mega_status st = mega_jf_check_bounds(f, v, "", err);
  if (st == MEGA_OK) *FIELD(s, f, int) = v;
  return st;
}

mega_status mega_jf_set_float(mega_jobspec *s, const flagdef *f, double v, mega_err *err) {
  mega_status st = mega_jf_check_bounds(f, v, "", err);
  if (st == MEGA_OK) *FIELD(s, f, double) = v;
  return st;
}

static mega_status set_text(mega_jobspec *s, const flagdef *f, const char *v, mega_err *err) {
  mega_status st;
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT: {
    int x = 0;
    if ((st = parse_int_text(f, v, &x, err)) != MEGA_OK) return st;
    return mega_jf_set_int(s, f, x, err);
  }
  case MEGA_JOBFLAG_FLOAT: {
    double x = 0;
    if ((st = mega_jf_parse_float_text(f->info.name, v, &x, err)) != MEGA_OK) return st;
    return mega_jf_set_float(s, f, x, err);
  }
  case MEGA_JOBFLAG_STRING: return mega_jf_set_string(s, f, v, err);
  case MEGA_JOBFLAG_ENUM: return mega_jf_set_enum(s, f, v, err);
  case MEGA_JOBFLAG_LIST: return mega_jf_set_list(s, f, &v, 1, err);
  case MEGA_JOBFLAG_BOOL: break;
  }
  return mega_fail(err, MEGA_ERR_INTERNAL, "%s takes no value", f->info.name);
}

/* ---- parsing ---- */

static int edit_distance(const char *a, const char *b) {
  size_t n = strlen(b);
  if (strlen(a) > 64 || n > 64) return 99;
  int row[65];
  for (size_t j = 0; j <= n; j++) row[j] = (int)j;
  for (size_t i = 1; a[i - 1]; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= n; j++) {
      int up = row[j];
      int sub = diag + (a[i - 1] != b[j - 1]);
      int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
      row[j] = sub < best ? sub : best;
      diag = up;
    }
  }
  return row[n];
}

/* The words of a flag name: "--pipeline-parallel-size" -> pipeline, parallel, size. */
static int split_words(const char *name, char words[][32], int max) {
  int n = 0;
  for (const char *p = name; *p && n < max;) {
    while (*p == '-' || *p == '_') p++;
    size_t len = strcspn(p, "-_");
    if (!len) break;
    snprintf(words[n++], 32, "%.*s", (int)(len < 31 ? len : 31), p);
    p += len;
  }
  return n;
}

/* How many words candidate has beyond the given ones, when every given word
 * is one of candidate's (a typo of one character allowed), in order; -1
 * otherwise. "--pipeline-parallel-size" is "--pipeline-model-parallel-size"
 * less one word. */
static int extra_words(const char *given, const char *candidate) {
  char g[12][32], c[12][32];
  int ng = split_words(given, g, 12), nc = split_words(candidate, c, 12), j = 0;
  if (ng < 2) return -1;
  for (int k = 0; k < ng; k++) {
    while (j < nc && strcmp(g[k], c[j]) && (strlen(g[k]) < 4 || edit_distance(g[k], c[j]) > 1))
      j++;
    if (j == nc) return -1;
    j++;
  }
  return nc - ng;
}

/* The job flag (or known Megatron flag) nearest to name: a small edit
 * distance first, else the one holding name's words with the fewest more. */
static const char *nearest_flag(const char *name) {
  const char *best = NULL;
  int best_d = 3, nc = mega_jf_compat_count();
  for (int i = 0; i < NFLAGS + nc; i++) {
    const char *cand = i < NFLAGS ? mega_jf_table[i].info.name : mega_jf_compat_name(i - NFLAGS);
    if (!cand) continue;
    int d = edit_distance(name, cand);
    if (d < best_d) best_d = d, best = cand;
  }
  if (best) return best;
  int best_x = 3;
  for (int i = 0; i < NFLAGS; i++) {
    int x = extra_words(name, mega_jf_table[i].info.name);
    if (x >= 0 && x < best_x) best_x = x, best = mega_jf_table[i].info.name;
  }
  return best;
}

static mega_status unknown_flag(const char *arg, size_t n, mega_err *err) {
  char name[80];
  snprintf(name, sizeof name, "%.*s", (int)(n < 79 ? n : 79), arg);
  const char *best = nearest_flag(name);
  if (best)
    return mega_fail(err, MEGA_ERR_NOT_FOUND, "unknown flag '%s'; did you mean %s?", name, best);
  return mega_fail(err, MEGA_ERR_NOT_FOUND, "unknown flag '%s'", name);
}

mega_status mega_jobspec_parse_flag(mega_jobspec *s, int argc, char *const *argv, int *i,
                                    mega_err *err) {
  if (*i < 0 || *i >= argc || !argv[*i])
    return mega_fail(err, MEGA_ERR_INVALID, "no argument at position %d", *i);
  const char *arg = argv[*i];
  if (strncmp(arg, "--", 2) != 0)
    return mega_fail(err, MEGA_ERR_NOT_FOUND,
                     "unexpected argument '%s' (job flags start with --)", arg);
  const char *eq = strchr(arg, '=');
  size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
  const flagdef *f = find_n(arg, n);
  bool off = false; /* a store_false alias */
  const char *alias = f ? NULL : mega_jf_compat_alias(arg, n, &off);
  if (alias) f = find_n(alias, strlen(alias));
  if (!f) {
    mega_status st = mega_jf_compat_parse(argc, argv, i, n, err);
    return st == MEGA_ERR_NOT_FOUND ? unknown_flag(arg, n, err) : st;
  }
  if (f->info.type == MEGA_JOBFLAG_BOOL) {
    if (eq)
      return mega_fail(err, MEGA_ERR_INVALID, "%s takes no value (got '%s')", f->info.name, arg);
    *FIELD(s, f, bool) = !off;
    *i += 1;
    return MEGA_OK;
  }
  const char *v = eq ? eq + 1 : *i + 1 < argc ? argv[*i + 1] : NULL;
  if (!eq && (!v || strncmp(v, "--", 2) == 0))
    return mega_fail(err, MEGA_ERR_INVALID, "%s needs a value (%s %s)", f->info.name,
                     f->info.name, f->info.metavar);
  if (f->info.type == MEGA_JOBFLAG_LIST && !eq) {
    /* every word up to the next flag */
    int nwords = 1;
    while (*i + 1 + nwords < argc && argv[*i + 1 + nwords] &&
           strncmp(argv[*i + 1 + nwords], "--", 2) != 0)
      nwords++;
    mega_status st = mega_jf_set_list(s, f, (const char *const *)&argv[*i + 1], nwords, err);
    if (st == MEGA_OK) *i += 1 + nwords;
    return st;
  }
  mega_status st = set_text(s, f, v, err);
  if (st == MEGA_OK) *i += eq ? 1 : 2;
  return st;
}

mega_status mega_jobspec_parse(mega_jobspec *s, int argc, char *const *argv, mega_err *err) {
  for (int i = 0; i < argc;) {
    mega_status st = mega_jobspec_parse_flag(s, argc, argv, &i, err);
    if (st == MEGA_ERR_NOT_FOUND) {
      if (err) err->status = MEGA_ERR_INVALID;
      return MEGA_ERR_INVALID;
    }
    if (st != MEGA_OK) return st;
  }
  return MEGA_OK;
}
