/* A job spec as argv words, as JSON and as help text, all from the flag table. */
#include "core/jobspec.h"

#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/jobspec_internal.h"

/* ---- serialization ---- */

static void value_text(const mega_jobspec *s, const flagdef *f, char *buf, size_t n) {
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT: snprintf(buf, n, "%d", *CFIELD(s, f, int)); break;
  case MEGA_JOBFLAG_FLOAT: mega_jf_format_double(*CFIELD(s, f, double), buf, n); break;
  case MEGA_JOBFLAG_ENUM: {
    int v = *CFIELD(s, f, int);
    snprintf(buf, n, "%s", v >= 0 && v < mega_jf_nchoices(f) ? f->info.choices[v] : "?");
    break;
  }
  default: buf[0] = '\0';
  }
}

void mega_jobspec_argv_free(char **argv) {
  if (!argv) return;
  for (char **p = argv; *p; p++) free(*p);
  free(argv);
}

char **mega_jobspec_to_argv(const mega_jobspec *s, int *argc) {
  size_t cap = 2 * (size_t)NFLAGS + 1;
  for (int i = 0; i < NFLAGS; i++)
    if (mega_jf_table[i].info.type == MEGA_JOBFLAG_LIST)
      cap += (size_t)CFIELD(s, &mega_jf_table[i], mega_strlist)->n;
  char **out = calloc(cap, sizeof *out);
  int n = 0;
  if (!out) goto nomem;
  for (int i = 0; i < NFLAGS; i++) {
    const flagdef *f = &mega_jf_table[i];
    if (mega_jf_is_default(s, f)) continue;
    const char *name = f->info.name;
    if (f->info.type == MEGA_JOBFLAG_BOOL) {
      if (!(out[n++] = strdup(name))) goto nomem;
      continue;
    }
    const mega_strlist *l = CFIELD(s, f, mega_strlist);
    if (f->info.type == MEGA_JOBFLAG_LIST && l->n > 1) {
      /* several words never start with -- (mega_jf_set_list refuses them) */
      if (!(out[n++] = strdup(name))) goto nomem;
      for (int k = 0; k < l->n; k++)
        if (!(out[n++] = strdup(l->v[k]))) goto nomem;
      continue;
    }
    if (f->info.type == MEGA_JOBFLAG_STRING || f->info.type == MEGA_JOBFLAG_LIST) {
      const char *v = f->info.type == MEGA_JOBFLAG_LIST ? l->v[0] : *CFIELD(s, f, char *);
      /* a value that looks like a flag travels in the --flag=value form */
      if (v[0] == '-') {
        if (asprintf(&out[n], "%s=%s", name, v) < 0) goto nomem;
        n++;
      } else if (!(out[n++] = strdup(name)) || !(out[n++] = strdup(v))) {
        goto nomem;
      }
      continue;
    }
    char buf[64];
    value_text(s, f, buf, sizeof buf);
    if (!(out[n++] = strdup(name)) || !(out[n++] = strdup(buf))) goto nomem;
  }
  if (argc) *argc = n;
  return out;
nomem:
  mega_jobspec_argv_free(out);
  if (argc) *argc = 0;
  return NULL;
}

static bool is_absent(const mega_jobspec *s, const flagdef *f) {
  if (!mega_jf_is_default(s, f)) return false;
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT:
  case MEGA_JOBFLAG_ENUM: return f->idef == -1 || f->info.required;
  case MEGA_JOBFLAG_FLOAT: return isnan(f->fdef);
  case MEGA_JOBFLAG_STRING:
  case MEGA_JOBFLAG_LIST: return true;
  case MEGA_JOBFLAG_BOOL: return false;
  }
  return false;
}

static json_t *list_json(const mega_strlist *l) {
  json_t *a = json_array();
  for (int k = 0; a && k < l->n; k++)
    if (json_array_append_new(a, json_string(l->v[k])) != 0) {
      json_decref(a);
      return NULL;
    }
  return a;
}

json_t *mega_jobspec_to_json(const mega_jobspec *s) {
  json_t *obj = json_object();
  if (!obj) return NULL;
  for (int i = 0; i < NFLAGS; i++) {
    const flagdef *f = &mega_jf_table[i];
    json_t *v;
    if (is_absent(s, f)) {
      v = json_null();
    } else {
      switch (f->info.type) {
      case MEGA_JOBFLAG_INT: v = json_integer(*CFIELD(s, f, int)); break;
      case MEGA_JOBFLAG_FLOAT: v = json_real(*CFIELD(s, f, double)); break;
      case MEGA_JOBFLAG_STRING: v = json_string(*CFIELD(s, f, char *)); break;
      case MEGA_JOBFLAG_BOOL: v = json_boolean(*CFIELD(s, f, bool)); break;
      case MEGA_JOBFLAG_LIST: v = list_json(CFIELD(s, f, mega_strlist)); break;
      default: {
        char buf[64];
        value_text(s, f, buf, sizeof buf);
        v = json_string(buf);
      }
      }
    }
    if (!v || json_object_set_new(obj, f->info.key, v) != 0) {
      json_decref(obj);
      return NULL;
    }
  }
  return obj;
}

static mega_status from_json_value(mega_jobspec *s, const flagdef *f, json_t *v, mega_err *err) {
  const char *name = f->info.name;
  if (json_is_null(v)) {
    if (f->info.type == MEGA_JOBFLAG_STRING) free(*FIELD(s, f, char *));
    if (f->info.type == MEGA_JOBFLAG_LIST) mega_jf_list_free(FIELD(s, f, mega_strlist));
    mega_jf_set_default(s, f);
    return MEGA_OK;
  }
  switch (f->info.type) {
  case MEGA_JOBFLAG_INT: {
    if (!json_is_integer(v)) break;
    json_int_t x = json_integer_value(v);
    if (x > INT_MAX || x < INT_MIN)
      return mega_fail(err, MEGA_ERR_INVALID, "%s: %lld is out of range (at most %d)", name,
                       (long long)x, INT_MAX);
    return mega_jf_set_int(s, f, (int)x, err);
  }
  case MEGA_JOBFLAG_FLOAT:
    if (!json_is_number(v)) break;
    return mega_jf_set_float(s, f, json_number_value(v), err);
  case MEGA_JOBFLAG_STRING:
    if (!json_is_string(v)) break;
    return mega_jf_set_string(s, f, json_string_value(v), err);
  case MEGA_JOBFLAG_BOOL:
    if (!json_is_boolean(v)) break;
    *FIELD(s, f, bool) = json_is_true(v);
    return MEGA_OK;
  case MEGA_JOBFLAG_ENUM:
    if (!json_is_string(v)) break;
    return mega_jf_set_enum(s, f, json_string_value(v), err);
  case MEGA_JOBFLAG_LIST: {
    /* a string is a one-word list (what a checkpoint of a single
     * --data-path saved before lists existed) */
    if (json_is_string(v)) {
      const char *w = json_string_value(v);
      return mega_jf_set_list(s, f, &w, 1, err);
    }
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (!n || n > INT_MAX) break;
    const char **words = calloc(n, sizeof *words);
    if (!words) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory reading %s", name);
    bool ok = true;
    for (size_t k = 0; k < n && ok; k++) ok = (words[k] = json_string_value(json_array_get(v, k)));
    mega_status st = ok ? mega_jf_set_list(s, f, words, (int)n, err) : MEGA_ERR_INVALID;
    free(words);
    if (ok) return st;
    break;
  }
  }
  static const char *const want[] = {"an integer", "a number", "a string", "true or false",
                                     "a string", "an array of strings"};
  return mega_fail(err, MEGA_ERR_INVALID, "%s (JSON key \"%s\") must be %s", name, f->info.key,
                   want[f->info.type]);
}

mega_status mega_jobspec_from_json(mega_jobspec *s, const json_t *obj, mega_err *err) {
  if (!json_is_object(obj))
    return mega_fail(err, MEGA_ERR_INVALID, "a job spec in JSON must be an object");
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    const flagdef *f = NULL;
    for (int i = 0; i < NFLAGS && !f; i++)
      if (strcmp(mega_jf_table[i].info.key, key) == 0) f = &mega_jf_table[i];
    if (!f) return mega_fail(err, MEGA_ERR_INVALID, "unknown job spec key \"%s\"", key);
    mega_status st = from_json_value(s, f, v, err);
    if (st != MEGA_OK) return st;
  }
  return MEGA_OK;
}

/* Appends to a growing string; false when out of memory. */
static bool append(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return false;
  if (*len + (size_t)n + 1 > *cap) {
    size_t ncap = (*cap ? *cap * 2 : 4096) + (size_t)n;
    char *nb = realloc(*buf, ncap);
    if (!nb) return false;
    *buf = nb;
    *cap = ncap;
  }
  va_start(ap, fmt);
  vsnprintf(*buf + *len, *cap - *len, fmt, ap);
  va_end(ap);
  *len += (size_t)n;
  return true;
}

char *mega_jobspec_help_text(void) {
  int width = 0;
  for (int i = 0; i < NFLAGS; i++) {
    const mega_jobflag *fl = &mega_jf_table[i].info;
    int w = (int)strlen(fl->name) + (fl->metavar ? 1 + (int)strlen(fl->metavar) : 0);
    if (w > width && w <= 40) width = w;
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  bool ok = append(&buf, &len, &cap, "%s", "");
  const char *group = NULL;
  for (int i = 0; i < NFLAGS && ok; i++) {
    const mega_jobflag *fl = &mega_jf_table[i].info;
    if (!group || strcmp(group, fl->group) != 0) {
      group = fl->group;
      ok = append(&buf, &len, &cap, "\n%s flags:\n", group);
    }
    char head[96];
    snprintf(head, sizeof head, "%s%s%s", fl->name, fl->metavar ? " " : "",
             fl->metavar ? fl->metavar : "");
    ok = ok && append(&buf, &len, &cap, "  %-*s  %s", width, head, fl->help);
    if (ok && fl->default_text) ok = append(&buf, &len, &cap, " (default: %s)", fl->default_text);
    ok = ok && append(&buf, &len, &cap, "\n");
  }
  char *compat = ok ? mega_jf_compat_help() : NULL;
  ok = compat && append(&buf, &len, &cap, "%s", compat);
  free(compat);
  if (!ok) {
    free(buf);
    return NULL;
  }
  return buf;
}
