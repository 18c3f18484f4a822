/* worker/data/bpe: GPT-2's vocab.json and merges.txt as megaw generate and
 * tools/preprocess read them, and the text they encode. The input is a
 * mode byte, two 2-byte little-endian lengths V and M, V bytes of
 * vocab.json, M bytes of merges.txt, then the text.
 *
 * Mode odd: the vocabulary is the input's. Mode even: it is built here
 * from the merges, GPT-2's way: every byte's token, then each merge's
 * result, so encoding cannot meet a piece it lacks.
 *
 * What loads must encode the text into ids of its vocabulary that decode
 * to exactly the text, or (only when the vocabulary is the input's) refuse
 * it saying why. A refused file says why and hands back nothing. */
#include <jansson.h>

#include "core/utf8.h"
#include "worker/data/bpe.h"
#include "fuzz.h"

/* GPT-2's bytes_to_unicode, written out: the UTF-8 of byte x's token. */
static void spell(int x, char out[3]) {
  static int cp[256];
  if (!cp['!']) {
    int next = 256;
    for (int b = 0; b < 256; b++) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      cp[b] = printable ? b : next++;
    }
  }
  int c = cp[x];
  if (c < 0x80) {
    out[0] = (char)c, out[1] = '\0';
  } else {
    out[0] = (char)(0xC0 | c >> 6), out[1] = (char)(0x80 | (c & 0x3F)), out[2] = '\0';
  }
}

/* vocab.json of the 256 byte tokens, <|endoftext|> and each merge line's
 * "A B" as AB. *complete: every line the reader may take as a merge has
 * its result in it (one that is not valid UTF-8 cannot be a JSON key). */
static json_t *built_vocab(const uint8_t *m, size_t n, bool *complete) {
  json_t *v = json_object();
  int id = 0;
  for (int x = 0; x < 256; x++) {
    char s[3];
    spell(x, s);
    json_object_set_new(v, s, json_integer(id++));
  }
  json_object_set_new(v, "<|endoftext|>", json_integer(id++));
  *complete = true;
  for (size_t i = 0; i < n;) {
    const uint8_t *nl = memchr(m + i, '\n', n - i);
    size_t len = nl ? (size_t)(nl - (m + i)) : n - i;
    char *line = fuzz_str(m + i, len); /* as the reader sees it: to a NUL */
    i += len + 1;
    size_t l = strlen(line);
    while (l && line[l - 1] == '\r') line[--l] = '\0';
    char *sp = strchr(line, ' ');
    if (sp && !strchr(sp + 1, ' ')) {
      memmove(sp, sp + 1, strlen(sp)); /* "A B" -> "AB" */
      if (!mega_utf8_valid(line)) *complete = false;
      else if (!json_object_get(v, line)) json_object_set_new(v, line, json_integer(id++));
    }
    free(line);
  }
  return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 5) return 0;
  bool own = data[0] & 1;
  size_t nv = (size_t)data[1] | (size_t)data[2] << 8, nm = (size_t)data[3] | (size_t)data[4] << 8;
  data += 5, size -= 5;
  if (nv > size) nv = size;
  if (nm > size - nv) nm = size - nv;
  const uint8_t *merges = data + nv, *text = data + nv + nm;
  size_t ntext = size - nv - nm;

  bool complete = false;
  const char *vocab_path;
  if (own) {
    vocab_path = fuzz_file("vocab.json", data, nv);
  } else {
    json_t *v = built_vocab(merges, nm, &complete);
    char *s = json_dumps(v, JSON_COMPACT);
    FUZZ_CHECK(s);
    vocab_path = fuzz_file("vocab.json", (const uint8_t *)s, strlen(s));
    free(s);
    json_decref(v);
  }
  char vpath[512];
  snprintf(vpath, sizeof vpath, "%s", vocab_path);
  const char *merge_path = fuzz_file("merges.txt", merges, nm);

  mega_bpe *b = NULL;
  mega_err err = {0};
  if (mega_bpe_load(vpath, merge_path, &b, &err) != MEGA_OK) {
    FUZZ_CHECK(err.msg[0] && !b);
    return 0;
  }
  int size_v = mega_bpe_vocab_size(b), eod = mega_bpe_eod(b);
  FUZZ_CHECK(size_v >= 0 && eod >= -1 && eod < size_v);
  if (!own) FUZZ_CHECK(eod == 256);
  if (eod >= 0) {
    char *t = NULL;
    size_t len = 0;
    FUZZ_CHECK(mega_bpe_decode(b, &eod, 1, &t, &len, &err) == MEGA_OK);
    FUZZ_CHECK(len == 13 && !memcmp(t, "<|endoftext|>", 13));
    free(t);
  }

  mega_bpe_ids ids = {0};
  if (mega_bpe_encode(b, (const char *)text, ntext, &ids, &err) != MEGA_OK) {
    FUZZ_CHECK(!complete && err.msg[0]);
  } else {
    for (size_t k = 0; k < ids.n; k++) FUZZ_CHECK(ids.ids[k] >= 0 && ids.ids[k] < size_v);
    FUZZ_CHECK(ids.n <= ntext); /* every id spells at least one byte */
    char *t = NULL;
    size_t len = 0;
    FUZZ_CHECK(mega_bpe_decode(b, ids.ids, ids.n, &t, &len, &err) == MEGA_OK);
    FUZZ_CHECK(len == ntext && !memcmp(t, text, ntext) && t[len] == '\0');
    free(t);
  }
  free(ids.ids);
  mega_bpe_free(b);
  return 0;
}
