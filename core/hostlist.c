#include "core/hostlist.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The names so far. */
typedef struct names {
  char **v;
  size_t n, cap;
} names;

static mega_status push(names *a, const char *s, size_t len, mega_err *err) {
  if (a->n == MEGA_HOSTLIST_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "host list names more than %d hosts",
                     MEGA_HOSTLIST_MAX);
  if (a->n == a->cap) {
    size_t cap = a->cap ? 2 * a->cap : 16;
    char **v = realloc(a->v, cap * sizeof *v);
    if (!v) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
    a->v = v;
    a->cap = cap;
  }
  if (!(a->v[a->n] = strndup(s, len))) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  a->n++;
  return MEGA_OK;
}

/* One part of an entry: literal text, or a bracket's numbers (as text). */
typedef struct part {
  const char *text; /* literal: into the list; NULL for a bracket */
  size_t len;
  names nums;       /* bracket */
} part;

#define MAX_PARTS 16

static bool digits(const char *s, size_t n) {
  if (!n) return false;
  for (size_t i = 0; i < n; i++)
    if (!isdigit((unsigned char)s[i])) return false;
  return true;
}

/* "01-04,07" (len bytes at s) into p->nums. */
static mega_status parse_bracket(const char *s, size_t len, const char *entry, size_t elen,
                                 part *p, mega_err *err) {
  for (const char *q = s, *end = s + len; q <= end;) {
    const char *c = memchr(q, ',', (size_t)(end - q));
    const char *e = c ? c : end;
    const char *dash = memchr(q, '-', (size_t)(e - q));
    size_t lo_len = dash ? (size_t)(dash - q) : (size_t)(e - q);
    size_t hi_len = dash ? (size_t)(e - dash - 1) : 0;
    if (!digits(q, lo_len) || (dash && !digits(dash + 1, hi_len)) || lo_len > 18 || hi_len > 18)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "host list entry '%.*s': '%.*s' is not a number or a range like 01-04",
                       (int)elen, entry, (int)(e - q), q);
    unsigned long long lo = strtoull(q, NULL, 10), hi = dash ? strtoull(dash + 1, NULL, 10) : lo;
    if (hi < lo)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "host list entry '%.*s': the range '%.*s' runs backwards", (int)elen, entry,
                       (int)(e - q), q);
    if (hi - lo >= MEGA_HOSTLIST_MAX)
      return mega_fail(err, MEGA_ERR_INVALID, "host list names more than %d hosts",
                       MEGA_HOSTLIST_MAX);
    for (unsigned long long v = lo; v <= hi; v++) {
      char num[32];
      int w = snprintf(num, sizeof num, "%0*llu", (int)lo_len, v);
      mega_status st = push(&p->nums, num, (size_t)w, err);
      if (st != MEGA_OK) return st;
    }
    if (!c) break;
    q = c + 1;
  }
  return MEGA_OK;
}

static void parts_free(part *parts, size_t n) {
  for (size_t i = 0; i < n; i++) mega_hostlist_free(parts[i].nums.v, parts[i].nums.n);
}

/* Every name of one entry (len bytes at s), in order, onto out. */
static mega_status expand_entry(const char *s, size_t len, names *out, mega_err *err) {
  part parts[MAX_PARTS];
  size_t np = 0;
  mega_status st = MEGA_OK;
  for (size_t i = 0; i < len && st == MEGA_OK;) {
    if (np == MAX_PARTS) {
      st = mega_fail(err, MEGA_ERR_INVALID, "host list entry '%.*s' has too many brackets",
                     (int)len, s);
      break;
    }
    part *p = &parts[np++];
    memset(p, 0, sizeof *p);
    const char *open = memchr(s + i, '[', len - i);
    if (open != s + i) { /* text up to the next bracket */
      size_t n = open ? (size_t)(open - (s + i)) : len - i;
      if (memchr(s + i, ']', n))
        st = mega_fail(err, MEGA_ERR_INVALID, "host list entry '%.*s' closes a bracket it never "
                       "opened", (int)len, s);
      p->text = s + i;
      p->len = n;
      i += n;
      continue;
    }
    const char *close = memchr(open, ']', len - i);
    if (!close) {
      st = mega_fail(err, MEGA_ERR_INVALID, "host list entry '%.*s' leaves a bracket open",
                     (int)len, s);
      break;
    }
    st = parse_bracket(open + 1, (size_t)(close - open - 1), s, len, p, err);
    i = (size_t)(close - s) + 1;
  }
  /* the cartesian product, the last bracket varying fastest */
  size_t idx[MAX_PARTS] = {0};
  char name[1024];
  while (st == MEGA_OK) {
    size_t w = 0;
    for (size_t k = 0; k < np; k++) {
      const char *t = parts[k].text ? parts[k].text : parts[k].nums.v[idx[k]];
      size_t n = parts[k].text ? parts[k].len : strlen(t);
      if (w + n >= sizeof name) {
        st = mega_fail(err, MEGA_ERR_INVALID, "host list entry '%.*s' makes a name longer than "
                       "%zu bytes", (int)len, s, sizeof name - 1);
        break;
      }
      memcpy(name + w, t, n);
      w += n;
    }
    if (st != MEGA_OK || (st = push(out, name, w, err)) != MEGA_OK) break;
    bool done = true; /* an odometer over the brackets */
    for (size_t k = np; k-- > 0;) {
      if (parts[k].text) continue;
      if (++idx[k] < parts[k].nums.n) {
        done = false;
        break;
      }
      idx[k] = 0;
    }
    if (done) break;
  }
  parts_free(parts, np);
  return st;
}

mega_status mega_hostlist_expand(const char *list, char ***out, size_t *n, mega_err *err) {
  *out = NULL;
  *n = 0;
  if (!list) return mega_fail(err, MEGA_ERR_INVALID, "no host list given");
  names a = {0};
  mega_status st = MEGA_OK;
  const char *p = list;
  while (*p && st == MEGA_OK) {
    /* the entry ends at a comma outside brackets */
    const char *e = p;
    int depth = 0;
    while (*e && (depth || *e != ',')) {
      if (*e == '[') depth++;
      else if (*e == ']' && depth) depth--;
      e++;
    }
    size_t len = (size_t)(e - p);
    while (len && isspace((unsigned char)p[len - 1])) len--;
    while (len && isspace((unsigned char)*p)) p++, len--;
    if (len) st = expand_entry(p, len, &a, err);
    p = *e ? e + 1 : e;
  }
  if (st == MEGA_OK && a.n == 0)
    st = mega_fail(err, MEGA_ERR_INVALID, "host list '%s' names no host", list);
  if (st != MEGA_OK) {
    mega_hostlist_free(a.v, a.n);
    return st;
  }
  *out = a.v;
  *n = a.n;
  return MEGA_OK;
}

void mega_hostlist_free(char **names_, size_t n) {
  for (size_t i = 0; i < n; i++) free(names_[i]);
  free(names_);
}
