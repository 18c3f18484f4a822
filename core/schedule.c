/* The schedule IR: building, comparing, naming, and the text form. */
#include "core/schedule.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sizes past these are typos, and would make the per-rank state of the
 * validator and the simulator huge. */

static const char *const kind_names[MEGA_SCHED_KINDS] = {
    [MEGA_SCHED_NO_PIPELINING] = "no-pipelining",
    [MEGA_SCHED_GPIPE] = "gpipe",
    [MEGA_SCHED_1F1B] = "1f1b",
    [MEGA_SCHED_INTERLEAVED] = "interleaved",
    [MEGA_SCHED_ZB_H1] = "zb-h1",
    [MEGA_SCHED_FORWARD_ONLY] = "forward-only",
    [MEGA_SCHED_CUSTOM] = "custom",
};

static const char *const act_names[MEGA_ACT_KINDS] = {
    [MEGA_ACT_F] = "F",       [MEGA_ACT_B] = "B",       [MEGA_ACT_W] = "W",
    [MEGA_ACT_SEND_F] = "SF", [MEGA_ACT_RECV_F] = "RF", [MEGA_ACT_SEND_B] = "SB",
    [MEGA_ACT_RECV_B] = "RB", [MEGA_ACT_GRAD_SYNC] = "GS", [MEGA_ACT_GRAD_WAIT] = "GW",
};

mega_act_kind mega_sched_grad_kind(const mega_schedule *s, int rank) {
  const mega_sched_rank *q = &s->ranks[rank];
  for (int i = 0; i < q->n; i++)
    if (q->acts[i].kind == MEGA_ACT_W) return MEGA_ACT_W;
  return MEGA_ACT_B;
}

const char *mega_sched_kind_name(mega_sched_kind k) {
  if ((unsigned)k >= MEGA_SCHED_KINDS) return "unknown";
  return kind_names[k];
}

const char *mega_act_kind_name(mega_act_kind k) {
  if ((unsigned)k >= MEGA_ACT_KINDS) return "?";
  return act_names[k];
}

mega_status mega_sched_kind_parse(const char *name, mega_sched_kind *out, mega_err *err) {
  /* Megatron's and the papers' spellings are accepted too. */
  static const struct {
    const char *name;
    mega_sched_kind kind;
  } aliases[] = {
      {"interleaved-1f1b", MEGA_SCHED_INTERLEAVED},
      {"zbh1", MEGA_SCHED_ZB_H1},
      {"zb1p", MEGA_SCHED_ZB_H1},
      {"no-pipeline", MEGA_SCHED_NO_PIPELINING},
  };
  if (!name) return mega_fail(err, MEGA_ERR_INVALID, "no schedule kind given");
  for (int k = 0; k < MEGA_SCHED_KINDS; k++)
    if (strcmp(name, kind_names[k]) == 0) {
      *out = (mega_sched_kind)k;
      return MEGA_OK;
    }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(name, aliases[i].name) == 0) {
      *out = aliases[i].kind;
      return MEGA_OK;
    }
  return mega_fail(err, MEGA_ERR_INVALID,
                   "unknown schedule kind '%s'; use one of no-pipelining, gpipe, 1f1b, "
                   "interleaved, zb-h1, forward-only, custom",
                   name);
}

mega_status mega_sched_init(mega_schedule *s, mega_sched_kind kind, int pp, int vp,
                            int microbatches, int group_size, mega_err *err) {
  memset(s, 0, sizeof *s);
  if ((unsigned)kind >= MEGA_SCHED_KINDS)
    return mega_fail(err, MEGA_ERR_INVALID, "schedule kind %d is not a known kind", (int)kind);
  if (pp < 1 || pp > MEGA_SCHED_MAX_PP)
    return mega_fail(err, MEGA_ERR_INVALID, "pp=%d is out of range; it must be 1..%d", pp,
                     MEGA_SCHED_MAX_PP);
  if (vp < 1 || vp > MEGA_SCHED_MAX_VP)
    return mega_fail(err, MEGA_ERR_INVALID, "vp=%d is out of range; it must be 1..%d", vp,
                     MEGA_SCHED_MAX_VP);
  if (microbatches < 1 || (long long)microbatches * vp > MEGA_SCHED_MAX_VIRTUAL_MB)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "microbatches=%d is out of range; it must be at least 1 and "
                     "microbatches*vp at most %d",
                     microbatches, MEGA_SCHED_MAX_VIRTUAL_MB);
  if (group_size < 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "group size %d is negative; use 0 for the default (pp)", group_size);
  s->ranks = calloc((size_t)pp, sizeof *s->ranks);
  if (!s->ranks) return mega_fail(err, MEGA_ERR_NOMEM, "no memory for %d schedule ranks", pp);
  s->kind = kind;
  s->pp = pp;
  s->vp = vp;
  s->microbatches = microbatches;
  s->group_size = group_size ? group_size : pp;
  return MEGA_OK;
}

mega_status mega_sched_push(mega_schedule *s, int rank, mega_action a, mega_err *err) {
  char buf[24];
  if (rank < 0 || rank >= s->pp)
    return mega_fail(err, MEGA_ERR_INVALID, "rank %d is out of range for pp=%d", rank, s->pp);
  if (a.kind >= MEGA_ACT_KINDS)
    return mega_fail(err, MEGA_ERR_INVALID, "rank %d: action kind %d is not known", rank,
                     a.kind);
  if (a.chunk >= s->vp)
    return mega_fail(err, MEGA_ERR_INVALID, "rank %d: %s names chunk %d, but vp=%d", rank,
                     mega_action_format(a, buf), a.chunk, s->vp);
  if (a.mb < 0 || a.mb >= s->microbatches)
    return mega_fail(err, MEGA_ERR_INVALID, "rank %d: %s names microbatch %d, but microbatches=%d",
                     rank, mega_action_format(a, buf), a.mb, s->microbatches);
  mega_sched_rank *r = &s->ranks[rank];
  if (r->n == r->cap) {
    int cap = r->cap ? r->cap * 2 : 64;
    mega_action *acts = realloc(r->acts, (size_t)cap * sizeof *acts);
    if (!acts) return mega_fail(err, MEGA_ERR_NOMEM, "no memory for %d actions on rank %d", cap, rank);
    r->acts = acts;
    r->cap = cap;
  }
  r->acts[r->n++] = a;
  return MEGA_OK;
}

void mega_sched_free(mega_schedule *s) {
  if (!s) return;
  if (s->ranks)
    for (int r = 0; r < s->pp; r++) free(s->ranks[r].acts);
  free(s->ranks);
  memset(s, 0, sizeof *s);
}

bool mega_sched_equal(const mega_schedule *a, const mega_schedule *b) {
  if (a->kind != b->kind || a->pp != b->pp || a->vp != b->vp ||
      a->microbatches != b->microbatches || a->group_size != b->group_size)
    return false;
  for (int r = 0; r < a->pp; r++) {
    const mega_sched_rank *x = &a->ranks[r], *y = &b->ranks[r];
    if (x->n != y->n) return false;
    for (int i = 0; i < x->n; i++)
      if (x->acts[i].kind != y->acts[i].kind || x->acts[i].chunk != y->acts[i].chunk ||
          x->acts[i].mb != y->acts[i].mb)
        return false;
  }
  return true;
}

bool mega_sched_is_first_stage(const mega_schedule *s, int rank, int chunk) {
  (void)s;
  return rank == 0 && chunk == 0;
}

bool mega_sched_is_last_stage(const mega_schedule *s, int rank, int chunk) {
  return rank == s->pp - 1 && chunk == s->vp - 1;
}

void mega_sched_peer(const mega_schedule *s, int rank, mega_action a, int *peer_rank,
                     int *peer_chunk) {
  int pp = s->pp, stage = a.chunk * pp + rank, peer;
  switch (a.kind) {
  case MEGA_ACT_SEND_F:
  case MEGA_ACT_RECV_B: peer = stage + 1; break;
  case MEGA_ACT_RECV_F:
  case MEGA_ACT_SEND_B: peer = stage - 1; break;
  default: peer = -1; break;
  }
  if (peer < 0 || peer >= pp * s->vp) {
    /* Compute actions, and the ends of the model, have no peer. */
    *peer_rank = -1;
    *peer_chunk = -1;
    return;
  }
  *peer_rank = peer % pp;
  *peer_chunk = peer / pp;
}

char *mega_action_format(mega_action a, char *buf) {
  snprintf(buf, 24, "%s%d.%d", mega_act_kind_name((mega_act_kind)a.kind), (int)a.mb,
           (int)a.chunk);
  return buf;
}

/* A growing string; on allocation failure it stays failed and the caller
 * returns NULL. */
typedef struct strbuf {
  char *p;
  size_t n, cap;
  bool failed;
} strbuf;

static void sb_reserve(strbuf *b, size_t more) {
  if (b->failed || b->n + more + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->n + more + 1) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->failed = true;
    return;
  }
  b->p = p;
  b->cap = cap;
}

static void sb_append(strbuf *b, const char *s, size_t len) {
  sb_reserve(b, len);
  if (b->failed) return;
  memcpy(b->p + b->n, s, len);
  b->n += len;
  b->p[b->n] = '\0';
}

static char *sb_finish(strbuf *b) {
  sb_reserve(b, 0);
  if (b->failed) {
    free(b->p);
    return NULL;
  }
  return b->p;
}

static void format_actions(strbuf *b, const mega_sched_rank *r) {
  char tok[24];
  sb_reserve(b, (size_t)r->n * 10);
  for (int i = 0; i < r->n; i++) {
    if (i) sb_append(b, " ", 1);
    mega_action_format(r->acts[i], tok);
    sb_append(b, tok, strlen(tok));
  }
}

char *mega_sched_format_rank(const mega_schedule *s, int rank) {
  strbuf b = {0};
  if (rank >= 0 && rank < s->pp) format_actions(&b, &s->ranks[rank]);
  return sb_finish(&b);
}

char *mega_sched_format(const mega_schedule *s) {
  strbuf b = {0};
  char line[160];
  int n = snprintf(line, sizeof line,
                   "mega-schedule v1 kind=%s pp=%d vp=%d microbatches=%d group=%d\n",
                   mega_sched_kind_name(s->kind), s->pp, s->vp, s->microbatches,
                   s->group_size);
  sb_append(&b, line, (size_t)n);
  for (int r = 0; r < s->pp; r++) {
    n = snprintf(line, sizeof line, "%d:", r);
    sb_append(&b, line, (size_t)n);
    if (s->ranks[r].n) sb_append(&b, " ", 1);
    format_actions(&b, &s->ranks[r]);
    sb_append(&b, "\n", 1);
  }
  return sb_finish(&b);
}

/* ---- parsing ---------------------------------------------------------- */

/* A token is [start, start+len) of the text. */
typedef struct tok {
  const char *p;
  int len;
} tok;

static bool next_tok(const char **cur, const char *end, tok *t) {
  const char *p = *cur;
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
  if (p == end) {
    *cur = p;
    return false;
  }
  t->p = p;
  while (p < end && !(*p == ' ' || *p == '\t' || *p == '\r')) p++;
  t->len = (int)(p - t->p);
  *cur = p;
  return true;
}

/* A non-negative decimal of at most 9 digits filling [p, p+len). */
static bool parse_uint(const char *p, int len, int *out) {
  if (len < 1 || len > 9) return false;
  int v = 0;
  for (int i = 0; i < len; i++) {
    if (!isdigit((unsigned char)p[i])) return false;
    v = v * 10 + (p[i] - '0');
  }
  *out = v;
  return true;
}

static bool parse_action(tok t, mega_action *a) {
  int k = 0;
  while (k < t.len && isupper((unsigned char)t.p[k])) k++;
  int kind = -1;
  for (int i = 0; i < MEGA_ACT_KINDS; i++)
    if ((int)strlen(act_names[i]) == k && strncmp(t.p, act_names[i], (size_t)k) == 0) kind = i;
  if (kind < 0) return false;
  const char *dot = memchr(t.p + k, '.', (size_t)(t.len - k));
  if (!dot) return false;
  int mb, chunk;
  if (!parse_uint(t.p + k, (int)(dot - t.p - k), &mb)) return false;
  if (!parse_uint(dot + 1, (int)(t.p + t.len - dot - 1), &chunk)) return false;
  if (chunk > 65535) return false;
  a->kind = (uint8_t)kind;
  a->mb = mb;
  a->chunk = (uint16_t)chunk;
  return true;
}

static mega_status parse_header(const char *p, const char *end, int line, mega_schedule *out,
                                mega_err *err) {
  tok t;
  const char *cur = p;
  if (!next_tok(&cur, end, &t) || t.len != 13 || strncmp(t.p, "mega-schedule", 13) != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "line %d: missing header; the text must start with "
                     "'mega-schedule v1 kind=... pp=... vp=... microbatches=... group=...'",
                     line);
  if (!next_tok(&cur, end, &t)) t = (tok){"", 0};
  if (t.len != 2 || strncmp(t.p, "v1", 2) != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "line %d: unsupported schedule format version '%.*s'; this build reads v1",
                     line, t.len, t.p);
  static const char *const keys[] = {"kind", "pp", "vp", "microbatches", "group"};
  int vals[5];
  bool seen[5] = {false};
  mega_sched_kind kind = MEGA_SCHED_CUSTOM;
  while (next_tok(&cur, end, &t)) {
    const char *eq = memchr(t.p, '=', (size_t)t.len);
    int key = -1;
    if (eq)
      for (int i = 0; i < 5; i++)
        if ((int)strlen(keys[i]) == eq - t.p && strncmp(t.p, keys[i], (size_t)(eq - t.p)) == 0)
          key = i;
    if (key < 0)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "line %d: bad key=value '%.*s' in the header; the keys are kind, pp, "
                       "vp, microbatches and group",
                       line, t.len, t.p);
    if (seen[key])
      return mega_fail(err, MEGA_ERR_INVALID, "line %d: '%s' is given twice in the header", line,
                       keys[key]);
    seen[key] = true;
    const char *v = eq + 1;
    int vlen = (int)(t.p + t.len - v);
    if (key == 0) {
      char name[48];
      if (vlen <= 0 || vlen >= (int)sizeof name)
        return mega_fail(err, MEGA_ERR_INVALID, "line %d: bad key=value '%.*s' in the header",
                         line, t.len, t.p);
      memcpy(name, v, (size_t)vlen);
      name[vlen] = '\0';
      mega_status st = mega_sched_kind_parse(name, &kind, err);
      if (st) {
        mega_err_prefix(err, "line %d", line);
        return st;
      }
    } else if (!parse_uint(v, vlen, &vals[key])) {
      return mega_fail(err, MEGA_ERR_INVALID,
                       "line %d: bad key=value '%.*s' in the header; %s needs a whole number "
                       "of at most 9 digits", line, t.len, t.p, keys[key]);
    }
  }
  for (int i = 0; i < 5; i++)
    if (!seen[i])
      return mega_fail(err, MEGA_ERR_INVALID, "line %d: the header lacks %s=", line, keys[i]);
  mega_status st = mega_sched_init(out, kind, vals[1], vals[2], vals[3], vals[4], err);
  if (st) mega_err_prefix(err, "line %d", line);
  return st;
}

mega_status mega_sched_parse(const char *text, mega_schedule *out, mega_err *err) {
  memset(out, 0, sizeof *out);
  if (!text) return mega_fail(err, MEGA_ERR_INVALID, "no schedule text given");
  const char *p = text, *text_end = text + strlen(text);
  bool have_header = false;
  bool *seen = NULL;
  int line = 0, header_line = 0;
  mega_status st = MEGA_OK;
  char buf[24];

  while (p < text_end) {
    const char *end = memchr(p, '\n', (size_t)(text_end - p));
    if (!end) end = text_end;
    line++;
    const char *cur = p;
    tok t;
    if (!next_tok(&cur, end, &t) || t.p[0] == '#') {
      p = end + (end < text_end);
      continue;
    }
    if (!have_header) {
      st = parse_header(p, end, line, out, err);
      if (st) goto fail;
      seen = calloc((size_t)out->pp, sizeof *seen);
      if (!seen) {
        st = mega_fail(err, MEGA_ERR_NOMEM, "no memory to parse a schedule");
        goto fail;
      }
      have_header = true;
      header_line = line;
      p = end + (end < text_end);
      continue;
    }
    /* "RANK:" may be followed by the first action without a space. */
    const char *colon = memchr(t.p, ':', (size_t)t.len);
    int rank;
    if (!colon || !parse_uint(t.p, (int)(colon - t.p), &rank)) {
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "line %d: expected 'RANK: actions...', found '%.*s'", line, t.len, t.p);
      goto fail;
    }
    if (rank >= out->pp) {
      st = mega_fail(err, MEGA_ERR_INVALID, "line %d: rank %d is out of range for pp=%d", line,
                     rank, out->pp);
      goto fail;
    }
    if (seen[rank]) {
      st = mega_fail(err, MEGA_ERR_INVALID, "line %d: duplicate line for rank %d", line, rank);
      goto fail;
    }
    seen[rank] = true;
    cur = colon + 1;
    while (next_tok(&cur, end, &t)) {
      mega_action a;
      if (!parse_action(t, &a)) {
        st = mega_fail(err, MEGA_ERR_INVALID,
                       "line %d: unknown action '%.*s'; actions look like F3.0 "
                       "(F, B, W, SF, RF, SB, RB, GS or GW, then microbatch.chunk)",
                       line, t.len > 40 ? 40 : t.len, t.p);
        goto fail;
      }
      if (a.mb >= out->microbatches || a.chunk >= out->vp) {
        st = mega_fail(err, MEGA_ERR_INVALID,
                       "line %d: action '%s' is out of range for microbatches=%d vp=%d", line,
                       mega_action_format(a, buf), out->microbatches, out->vp);
        goto fail;
      }
      st = mega_sched_push(out, rank, a, err);
      if (st) {
        mega_err_prefix(err, "line %d", line);
        goto fail;
      }
    }
    p = end + (end < text_end);
  }
  if (!have_header) {
    st = mega_fail(err, MEGA_ERR_INVALID,
                   "missing header; the text must start with "
                   "'mega-schedule v1 kind=... pp=... vp=... microbatches=... group=...'");
    goto fail;
  }
  for (int r = 0; r < out->pp; r++)
    if (!seen[r]) {
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "missing rank lines: the header (line %d) says pp=%d but there is no line "
                     "for rank %d",
                     header_line, out->pp, r);
      goto fail;
    }
  free(seen);
  return MEGA_OK;
fail:
  free(seen);
  mega_sched_free(out);
  return st;
}
