#include "worker/data/bpe.h"

#include <locale.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

#include <jansson.h>

/* ---- a hash map of byte strings to ints (open addressing) ---- */

typedef struct entry {
  uint8_t *key; /* owned; NULL: empty slot */
  size_t len;
  int32_t val;
} entry;

typedef struct map {
  entry *e;
  size_t cap, n; /* cap a power of two */
} map;

static uint64_t hash(const uint8_t *k, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ k[i]) * 0x100000001B3ull;
  return h;
}

static entry *slot(const map *m, const uint8_t *k, size_t n) {
  size_t i = hash(k, n) & (m->cap - 1);
  while (m->e[i].key && !(m->e[i].len == n && !memcmp(m->e[i].key, k, n))) i = (i + 1) & (m->cap - 1);
  return &m->e[i];
}

static bool map_init(map *m, size_t n) {
  m->cap = 16;
  while (m->cap < 2 * n + 2) m->cap *= 2;
  m->n = 0;
  return (m->e = calloc(m->cap, sizeof *m->e)) != NULL;
}

/* false when out of memory or when the key is there already */
static bool map_put(map *m, const uint8_t *k, size_t n, int32_t val) {
  entry *e = slot(m, k, n);
  if (e->key || !(e->key = malloc(n ? n : 1))) return false;
  memcpy(e->key, k, n);
  e->len = n;
  e->val = val;
  m->n++;
  return true;
}

static int32_t map_get(const map *m, const uint8_t *k, size_t n) {
  entry *e = slot(m, k, n);
  return e->key ? e->val : -1;
}

static void map_free(map *m) {
  for (size_t i = 0; m->e && i < m->cap; i++) free(m->e[i].key);
  free(m->e);
}

/* ---- the tokenizer ---- */

struct mega_bpe {
  map vocab;      /* raw bytes -> id */
  map merges;     /* [len A (2 bytes)] A B -> rank */
  uint8_t **tok;  /* id -> raw bytes */
  size_t *toklen;
  int nids, size; /* decoder table length (max id + 1), vocab.json entries */
  int eod;
  int cp_byte[324]; /* GPT-2's byte-to-unicode, inverted: code point -> byte, -1 */
  locale_t loc;     /* C.UTF-8 for the character classes; 0: ASCII only */
};

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other
 * 68 to U+0100 onward in byte order. */
static void byte_table(mega_bpe *b) {
  for (int c = 0; c < 324; c++) b->cp_byte[c] = -1;
  int next = 256;
  for (int x = 0; x < 256; x++) {
    bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
    b->cp_byte[printable ? x : next++] = x;
  }
}

/* The next code point of s[0..n) and its length; invalid UTF-8 is one byte
 * of code point 0xFFFD. */
static uint32_t utf8(const uint8_t *s, size_t n, size_t *len) {
  uint32_t c = s[0];
  size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (k == 0 || k > n) {
    *len = 1;
    return 0xFFFD;
  }
  c &= k == 1 ? 0x7F : k == 2 ? 0x1F : k == 3 ? 0x0F : 0x07;
  for (size_t i = 1; i < k; i++) {
    if ((s[i] & 0xC0) != 0x80) {
      *len = 1;
      return 0xFFFD;
    }
    c = (c << 6) | (s[i] & 0x3F);
  }
  *len = k;
  return c;
}

/* A token string of vocab.json or merges.txt as the raw bytes it spells. */
static bool unspell(const mega_bpe *b, const char *s, uint8_t *out, size_t *n) {
  size_t len = strlen(s), k = 0;
  for (size_t i = 0; i < len;) {
    size_t l;
    uint32_t c = utf8((const uint8_t *)s + i, len - i, &l);
    if (c >= 324 || b->cp_byte[c] < 0) return false;
    out[k++] = (uint8_t)b->cp_byte[c];
    i += l;
  }
  *n = k;
  return true;
}

static mega_status load_vocab(mega_bpe *b, const char *path, mega_err *err) {
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j || !json_is_object(j)) {
    json_decref(j);
    return mega_fail(err, MEGA_ERR_INVALID, "--vocab-file %s: %s", path,
                     j ? "not a JSON object of token -> id" : je.text);
  }
  /* GPT-2's ids are 0..n-1 for n entries, and the model's vocabulary is n
   * (tools/preprocess picks uint16 by it): an id past it would index past
   * the embedding, and sizing the tables by the largest id would let a
   * tiny file ask for gigabytes. */
  if (json_object_size(j) >= (1u << 30)) {
    json_decref(j);
    return mega_fail(err, MEGA_ERR_INVALID, "--vocab-file %s: too many entries", path);
  }
  b->size = b->nids = (int)json_object_size(j);
  const char *key;
  json_t *v;
  mega_status st = MEGA_OK;
  b->tok = calloc((size_t)b->nids + 1, sizeof *b->tok);
  b->toklen = calloc((size_t)b->nids + 1, sizeof *b->toklen);
  uint8_t *buf = malloc(4096);
  if (!b->tok || !b->toklen || !buf || !map_init(&b->vocab, (size_t)b->size))
    st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory loading %s", path);
  json_object_foreach(j, key, v) {
    if (st != MEGA_OK) break;
    size_t n;
    json_int_t id = json_integer_value(v);
    if (!json_is_integer(v) || id < 0 || id >= b->nids)
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "--vocab-file %s: \"%s\" needs an id from 0 to %d (one per entry)", path,
                     key, b->nids - 1);
    else if (strlen(key) > 4000 || !unspell(b, key, buf, &n))
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "--vocab-file %s: \"%s\" is not a GPT-2 byte-level token", path, key);
    else if (b->tok[id])
      st = mega_fail(err, MEGA_ERR_INVALID, "--vocab-file %s: id %lld appears twice", path,
                     (long long)id);
    else if (!map_put(&b->vocab, buf, n, (int32_t)id) || !(b->tok[id] = malloc(n ? n : 1)))
      st = mega_fail(err, MEGA_ERR_INVALID, "--vocab-file %s: \"%s\" appears twice", path, key);
    else {
      memcpy(b->tok[id], buf, n);
      b->toklen[id] = n;
    }
  }
  if (st == MEGA_OK) b->eod = map_get(&b->vocab, (const uint8_t *)"<|endoftext|>", 13);
  free(buf);
  json_decref(j);
  return st;
}

static mega_status load_merges(mega_bpe *b, const char *path, mega_err *err) {
  FILE *f = fopen(path, "r");
  if (!f) return mega_fail(err, MEGA_ERR_IO, "cannot read --merge-file %s", path);
  size_t lines = 0;
  for (int ch; (ch = getc(f)) != EOF;) lines += ch == '\n';
  rewind(f);
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  int rank = 0, lineno = 0;
  mega_status st = map_init(&b->merges, lines + 1)
                       ? MEGA_OK
                       : mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  uint8_t *key = NULL;
  while (st == MEGA_OK && (got = getline(&line, &cap, f)) >= 0) {
    lineno++;
    while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
    if (got == 0 || (lineno == 1 && !strncmp(line, "#version", 8))) continue;
    char *sp = strchr(line, ' ');
    uint8_t *nk = realloc(key, (size_t)got + 2);
    if (!nk) {
      st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
      break;
    }
    key = nk;
    size_t na, nb;
    if (!sp || strchr(sp + 1, ' ')) {
      st = mega_fail(err, MEGA_ERR_INVALID, "--merge-file %s line %d: expected \"A B\"", path,
                     lineno);
      break;
    }
    *sp = '\0';
    if (!unspell(b, line, key + 2, &na) || !unspell(b, sp + 1, key + 2 + na, &nb) || na > 65535) {
      st = mega_fail(err, MEGA_ERR_INVALID,
                     "--merge-file %s line %d: not GPT-2 byte-level tokens", path, lineno);
      break;
    }
    key[0] = (uint8_t)(na >> 8), key[1] = (uint8_t)na;
    /* a repeated merge keeps its first (lowest) rank */
    if (map_get(&b->merges, key, 2 + na + nb) < 0) map_put(&b->merges, key, 2 + na + nb, rank);
    rank++;
  }
  free(key);
  free(line);
  fclose(f);
  return st;
}

mega_status mega_bpe_load(const char *vocab_file, const char *merge_file, mega_bpe **out,
                          mega_err *err) {
  *out = NULL;
  mega_bpe *b = calloc(1, sizeof *b);
  if (!b) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  byte_table(b);
  b->loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
  mega_status st = load_vocab(b, vocab_file, err);
  if (st == MEGA_OK) st = load_merges(b, merge_file, err);
  if (st != MEGA_OK) {
    mega_bpe_free(b);
    return st;
  }
  *out = b;
  return MEGA_OK;
}

void mega_bpe_free(mega_bpe *b) {
  if (!b) return;
  map_free(&b->vocab);
  map_free(&b->merges);
  for (int i = 0; b->tok && i < b->nids; i++) free(b->tok[i]);
  free(b->tok);
  free(b->toklen);
  if (b->loc) freelocale(b->loc);
  free(b);
}

int mega_bpe_vocab_size(const mega_bpe *b) { return b->size; }
int mega_bpe_eod(const mega_bpe *b) { return b->eod; }

/* ---- pre-tokens ---- */

enum { SPACE, LETTER, NUMBER, OTHER };

static int cls(const mega_bpe *b, uint32_t c) {
  if (c < 0x80) {
    if (c == ' ' || (c >= '\t' && c <= '\r')) return SPACE;
    if ((c | 32) >= 'a' && (c | 32) <= 'z') return LETTER;
    return c >= '0' && c <= '9' ? NUMBER : OTHER;
  }
  if (!b->loc) return OTHER;
  if (iswspace_l((wint_t)c, b->loc)) return SPACE;
  return iswalpha_l((wint_t)c, b->loc) ? LETTER : OTHER;
}

/* The length of the pre-token at s[i] (GPT-2's pattern, alternatives in
 * order). */
static size_t pretoken(const mega_bpe *b, const uint8_t *s, size_t n, size_t i) {
  if (s[i] == '\'' && i + 1 < n) {
    static const char *const tails[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (int k = 0; k < 7; k++) {
      size_t l = strlen(tails[k]);
      if (i + 1 + l <= n && !memcmp(s + i + 1, tails[k], l)) return 1 + l;
    }
  }
  /* an optional space, then letters, numbers or others */
  size_t l, at = i + (s[i] == ' ' && i + 1 < n);
  int c = cls(b, utf8(s + at, n - at, &l));
  if (c != SPACE) {
    size_t j = at;
    while (j < n && cls(b, utf8(s + j, n - j, &l)) == c) j += l;
    return j - i;
  }
  /* \s+(?!\S), else \s+ */
  size_t j = i, last = i;
  while (j < n && cls(b, utf8(s + j, n - j, &l)) == SPACE) last = j, j += l;
  if (j == n || last == i) return j - i;
  return last - i;
}

/* ---- merging ---- */

static int32_t pair_rank(const mega_bpe *b, const uint8_t *a, size_t na, const uint8_t *c,
                         size_t nc, uint8_t *key) {
  key[0] = (uint8_t)(na >> 8), key[1] = (uint8_t)na;
  memcpy(key + 2, a, na);
  memcpy(key + 2 + na, c, nc);
  return map_get(&b->merges, key, 2 + na + nc);
}

mega_status mega_bpe_push(mega_bpe_ids *out, int32_t id, mega_err *err) {
  if (out->n == out->cap) {
    size_t cap = out->cap ? out->cap * 2 : 256;
    int32_t *ids = realloc(out->ids, cap * sizeof *ids);
    if (!ids) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for token ids");
    out->ids = ids, out->cap = cap;
  }
  out->ids[out->n++] = id;
  return MEGA_OK;
}

/* One pre-token w[0..n): symbols are runs [start[k], start[k+1]) of w. */
static mega_status bpe_word(const mega_bpe *b, const uint8_t *w, size_t n, mega_bpe_ids *out,
                            mega_err *err) {
  size_t *start = malloc((n + 1) * sizeof *start);
  uint8_t *key = malloc(n + 2);
  if (!start || !key) {
    free(start);
    free(key);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  size_t m = n;
  for (size_t k = 0; k <= n; k++) start[k] = k;
  while (m > 1) {
    int32_t best = -1;
    size_t at = 0;
    for (size_t k = 0; k + 1 < m; k++) {
      int32_t r = pair_rank(b, w + start[k], start[k + 1] - start[k], w + start[k + 1],
                            start[k + 2] - start[k + 1], key);
      if (r >= 0 && (best < 0 || r < best)) best = r, at = k;
    }
    if (best < 0) break;
    /* merge every occurrence of that pair, left to right */
    const uint8_t *pa = w + start[at], *pb = w + start[at + 1];
    size_t na = start[at + 1] - start[at], nb = start[at + 2] - start[at + 1], k = 0, o = 0;
    while (k < m) {
      bool hit = k + 1 < m && start[k + 1] - start[k] == na && start[k + 2] - start[k + 1] == nb &&
                 !memcmp(w + start[k], pa, na) && !memcmp(w + start[k + 1], pb, nb);
      start[o++] = start[k];
      k += hit ? 2 : 1;
    }
    start[o] = n;
    m = o;
  }
  mega_status st = MEGA_OK;
  for (size_t k = 0; k < m && st == MEGA_OK; k++) {
    int32_t id = map_get(&b->vocab, w + start[k], start[k + 1] - start[k]);
    st = id < 0 ? mega_fail(err, MEGA_ERR_INVALID,
                            "BPE: a merged piece of %zu bytes is not in the vocabulary; the "
                            "vocab and merge files do not belong together",
                            start[k + 1] - start[k])
                : mega_bpe_push(out, id, err);
  }
  free(start);
  free(key);
  return st;
}

mega_status mega_bpe_encode(const mega_bpe *b, const char *text, size_t len, mega_bpe_ids *out,
                            mega_err *err) {
  const uint8_t *s = (const uint8_t *)text;
  for (size_t i = 0; i < len;) {
    size_t l = pretoken(b, s, len, i);
    mega_status st = bpe_word(b, s + i, l, out, err);
    if (st != MEGA_OK) return st;
    i += l;
  }
  return MEGA_OK;
}

mega_status mega_bpe_decode(const mega_bpe *b, const int32_t *ids, size_t n, char **text,
                            size_t *len, mega_err *err) {
  size_t total = 0;
  for (size_t k = 0; k < n; k++) {
    if (ids[k] < 0 || ids[k] >= b->nids || !b->tok[ids[k]])
      return mega_fail(err, MEGA_ERR_INVALID, "token id %d is not in the vocabulary", ids[k]);
    total += b->toklen[ids[k]];
  }
  char *t = malloc(total + 1);
  if (!t) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  size_t o = 0;
  for (size_t k = 0; k < n; k++) {
    memcpy(t + o, b->tok[ids[k]], b->toklen[ids[k]]);
    o += b->toklen[ids[k]];
  }
  t[o] = '\0';
  *text = t;
  *len = o;
  return MEGA_OK;
}
