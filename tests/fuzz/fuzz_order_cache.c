/* worker/data/gpt_order_cache.c: an order index file found in
 * --data-cache-path. The first byte picks the key (its low two bits: one
 * of order_keys.h) and, with bit 0x80, makes the file's two crc32s good
 * after the fact, as a writer meaning harm would; the rest is the file.
 * The directory is writable, so opening never fails: a file it does not
 * use is rebuilt, and the order is then the built one. A file it reads
 * gives an order of the key's shape that every sample reads whole from
 * (T + 1 tokens inside the documents), with each document as often as the
 * epochs say and the samples shuffled, not repeated; and the writer's own
 * file gives the built order exactly. */
#include <zlib.h>

#include "worker/data/gpt_order.h"
#include "fuzz.h"
#include "order_keys.h"

enum { HEADER = 96, BODY_CRC = 88, HEADER_CRC = 92 }; /* the file header's layout */

static void make_crcs_good(uint8_t *f, size_t n) {
  if (n < HEADER) return;
  uint32_t c = (uint32_t)crc32(0, f + HEADER, (uInt)(n - HEADER));
  memcpy(f + BODY_CRC, &c, 4);
  c = (uint32_t)crc32(0, f, HEADER_CRC);
  memcpy(f + HEADER_CRC, &c, 4);
}

static mega_gpt_order *open_key(const order_key *k, mega_gpt_cache_how *how) {
  mega_gpt_order *o = NULL;
  mega_err err = {0};
  char why[512];
  mega_status st = mega_gpt_order_open(order_cum, k->doc0, k->doc1, k->T, k->samples, k->seed,
                                       fuzz_dir(), &o, how, why, sizeof why, &err);
  if (st != MEGA_OK) fprintf(stderr, "%s\n", err.msg);
  FUZZ_CHECK(st == MEGA_OK && o);
  if (*how == MEGA_GPT_CACHE_REBUILT) FUZZ_CHECK(why[0]);
  return o;
}

static bool same(const mega_gpt_order *a, const mega_gpt_order *b) {
  int64_t n = mega_gpt_order_samples(a);
  if (n != mega_gpt_order_samples(b) || mega_gpt_order_epochs(a) != mega_gpt_order_epochs(b) ||
      mega_gpt_order_separate(a) != mega_gpt_order_separate(b))
    return false;
  for (int64_t i = 0; i < n; i++) {
    int64_t f[4], g[4];
    mega_gpt_order_sample(a, i, &f[0], &f[1], &f[2], &f[3]);
    mega_gpt_order_sample(b, i, &g[0], &g[1], &g[2], &g[3]);
    if (memcmp(f, g, sizeof f)) return false;
    for (int64_t p = f[0]; p <= f[2]; p++)
      if (mega_gpt_order_document(a, p) != mega_gpt_order_document(b, p)) return false;
  }
  return true;
}

/* What a reader may rely on, checked through the public calls only. */
static void check_shape(const mega_gpt_order *o, const mega_gpt_order *built, const order_key *k) {
  int64_t S = mega_gpt_order_samples(o), ndoc = k->doc1 - k->doc0;
  int E = mega_gpt_order_epochs(o);
  FUZZ_CHECK(S == mega_gpt_order_samples(built) && E == mega_gpt_order_epochs(built) &&
             mega_gpt_order_separate(o) == mega_gpt_order_separate(built));
  /* every document as often as the epochs say (kept apart: once in the
   * final epoch's block) */
  int seen[8] = {0}, final[8] = {0};
  for (int64_t p = 0; p < E * ndoc; p++) {
    int64_t d = mega_gpt_order_document(o, p);
    FUZZ_CHECK(d >= k->doc0 && d < k->doc1);
    seen[d]++;
    if (p >= (E - 1) * ndoc) final[d]++;
  }
  for (int64_t d = k->doc0; d < k->doc1; d++)
    FUZZ_CHECK(seen[d] == E && (!mega_gpt_order_separate(o) || final[d] == 1));
  /* each sample T + 1 tokens inside its documents */
  enum { MAX = 64 };
  int64_t span[MAX][4];
  FUZZ_CHECK(S <= MAX);
  for (int64_t i = 0; i < S; i++) {
    int64_t *f = span[i], tokens = 0;
    mega_gpt_order_sample(o, i, &f[0], &f[1], &f[2], &f[3]);
    FUZZ_CHECK(f[0] >= 0 && f[0] <= f[2] && f[2] < E * ndoc);
    for (int64_t p = f[0]; p <= f[2]; p++) {
      int64_t d = mega_gpt_order_document(o, p), len = order_cum[d + 1] - order_cum[d];
      int64_t from = p == f[0] ? f[1] : 0, to = p == f[2] ? f[3] + 1 : len;
      FUZZ_CHECK(from >= 0 && to <= len);
      if (to > from) tokens += to - from;
    }
    FUZZ_CHECK(tokens == k->T + 1);
  }
  /* laid end to end from the first token, each once: the shuffle is a
   * permutation of them */
  bool used[MAX] = {0};
  int64_t at[2] = {0, 0}, laid[MAX];
  for (int64_t n = 0; n < S; n++) {
    int64_t hit = -1;
    for (int64_t i = 0; i < S; i++)
      if (span[i][0] == at[0] && span[i][1] == at[1]) {
        FUZZ_CHECK(hit < 0 && !used[i]);
        hit = i;
      }
    FUZZ_CHECK(hit >= 0);
    used[hit] = true;
    laid[hit] = n;
    at[0] = span[hit][2], at[1] = span[hit][3];
  }
  /* kept apart, the final epoch's samples are shuffled among themselves */
  if (mega_gpt_order_separate(o)) {
    int64_t P = order_cum[k->doc1] - order_cum[k->doc0], S0 = ((E - 1) * P - 1) / k->T;
    for (int64_t i = 0; i < S; i++) FUZZ_CHECK((i < S0) == (laid[i] < S0));
  }
}

static void path_of(const order_key *k, char *path, size_t n) {
  mega_gpt_order_cache_path(order_cum, k->doc0, k->doc1, k->T, k->samples, k->seed, fuzz_dir(), path,
                            n);
}

/* The file mega writes for each key. */
static uint8_t *genuine[4];
static size_t genuine_len[4];

static void once(void) {
  if (genuine[0]) return;
  for (int i = 0; i < 4; i++) {
    fuzz_clean();
    mega_gpt_cache_how how;
    mega_gpt_order_free(open_key(&order_keys[i], &how));
    FUZZ_CHECK(how == MEGA_GPT_CACHE_BUILT);
    char path[512];
    path_of(&order_keys[i], path, sizeof path);
    FILE *f = fopen(path, "rb");
    FUZZ_CHECK(f && fseek(f, 0, SEEK_END) == 0);
    genuine_len[i] = (size_t)ftell(f);
    genuine[i] = malloc(genuine_len[i]);
    rewind(f);
    FUZZ_CHECK(genuine[i] && fread(genuine[i], 1, genuine_len[i], f) == genuine_len[i]);
    fclose(f);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  once();
  int sel = data[0] & 3;
  const order_key *k = &order_keys[sel];
  fuzz_clean();
  char path[512];
  path_of(k, path, sizeof path);
  uint8_t *file = malloc(size);
  FUZZ_CHECK(file);
  memcpy(file, data + 1, size - 1);
  if (data[0] & 0x80) make_crcs_good(file, size - 1);
  const char *slash = strrchr(path, '/');
  fuzz_file(slash + 1, file, size - 1);
  mega_gpt_order *built = NULL;
  mega_err err = {0};
  FUZZ_CHECK(mega_gpt_order_build(order_cum, k->doc0, k->doc1, k->T, k->samples, k->seed, &built,
                                  &err) == MEGA_OK);
  mega_gpt_cache_how how;
  mega_gpt_order *o = open_key(k, &how);
  if (size - 1 == genuine_len[sel] && !memcmp(file, genuine[sel], size - 1))
    FUZZ_CHECK(how == MEGA_GPT_CACHE_READ && same(o, built));
  if (how != MEGA_GPT_CACHE_READ) {
    FUZZ_CHECK(how == MEGA_GPT_CACHE_REBUILT && same(o, built));
    mega_gpt_order_free(o);
    o = open_key(k, &how); /* the file it wrote is read back */
    FUZZ_CHECK(how == MEGA_GPT_CACHE_READ && same(o, built));
  } else {
    check_shape(o, built, k);
  }
  mega_gpt_order_free(o);
  mega_gpt_order_free(built);
  free(file);
  return 0;
}
