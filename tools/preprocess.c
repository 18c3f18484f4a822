/* preprocess: text to Megatron's indexed dataset, as Megatron's
 * tools/preprocess_data.py writes it for GPT.
 *
 *   preprocess --input FILE --output-prefix P --tokenizer-type GPT2BPETokenizer
 *              --vocab-file vocab.json --merge-file merges.txt
 *              [--json-keys text] [--append-eod]
 *
 * FILE is JSON lines (one document per line, its text under --json-keys,
 * "text" by default) when its first non-empty line is a JSON object, else
 * plain text whose documents are separated by blank lines. Each document is
 * one sequence of GPT-2 BPE ids (worker/data/bpe.h), followed by <|endoftext|>
 * with --append-eod; a document with no text is a document of no sequence
 * and no <|endoftext|>, as Megatron writes it. Writes P_KEY_document.bin and .idx (Megatron's names;
 * KEY is "text" for plain text), uint16 below 65,500 ids, else int32 (as
 * Megatron picks), and prints the prefix to train with. A run that fails
 * writes nothing under P (and leaves a dataset that was there as it was). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "worker/data/bpe.h"
#include "worker/data/indexed.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: preprocess --input FILE --output-prefix P --tokenizer-type GPT2BPETokenizer\n"
          "                  --vocab-file vocab.json --merge-file merges.txt\n"
          "                  [--json-keys KEY] [--append-eod]\n\n"
          "Tokenizes FILE (JSON lines with the text under KEY, default \"text\"; or plain\n"
          "text, documents separated by blank lines) into Megatron's indexed dataset\n"
          "P_KEY_document.bin/.idx, one sequence per document; --append-eod ends each with\n"
          "<|endoftext|>. Train on it with --data-path P_KEY_document --tokenizer-type\n"
          "NullTokenizer --vocab-size N, N the vocabulary size minus one.\n");
}

typedef struct job {
  mega_bpe *bpe;
  mega_indexed_writer *w;
  bool eod;
  mega_bpe_ids ids;
  long docs, tokens;
} job;

static int fail(const mega_err *err) {
  fprintf(stderr, "preprocess: %s\n", err->msg);
  return 1;
}

static mega_status add_doc(job *j, const char *text, size_t len, mega_err *err) {
  j->ids.n = 0;
  mega_status st = mega_bpe_encode(j->bpe, text, len, &j->ids, err);
  /* as Megatron's preprocess_data.py: no <|endoftext|> after no text */
  if (st == MEGA_OK && j->eod && j->ids.n) st = mega_bpe_push(&j->ids, mega_bpe_eod(j->bpe), err);
  if (st == MEGA_OK) st = mega_indexed_writer_add(j->w, j->ids.ids, j->ids.n, err);
  j->docs++;
  j->tokens += (long)j->ids.n;
  return st;
}

static bool is_json_object_line(const char *line) {
  json_error_t je;
  json_t *v = json_loads(line, JSON_DECODE_ANY, &je);
  bool obj = json_is_object(v);
  json_decref(v);
  return obj;
}

/* Line lineno's JSON v has no string under key: what it has instead. */
static mega_status no_text(json_t *v, json_t *t, const char *key, long lineno, mega_err *err) {
  static const char *const kinds[] = {"an object", "an array", "a string", "a number",
                                      "a number", "true", "false", "null"};
  if (t)
    return mega_fail(err, MEGA_ERR_INVALID, "line %ld: \"%s\" is %s, not a string of text",
                     lineno, key, kinds[json_typeof(t)]);
  if (!json_is_object(v))
    return mega_fail(err, MEGA_ERR_INVALID, "line %ld: %s, not a JSON object with the text "
                     "under \"%s\"", lineno, kinds[json_typeof(v)], key);
  char keys[256] = "";
  size_t n = 0;
  const char *k;
  json_t *unused;
  json_object_foreach(v, k, unused) {
    if (n < sizeof keys)
      n += (size_t)snprintf(keys + n, sizeof keys - n, "%s\"%s\"", n ? ", " : "", k);
  }
  (void)unused;
  return mega_fail(err, MEGA_ERR_INVALID, "line %ld: no \"%s\" key (it has %s); name the "
                   "text's key with --json-keys", lineno, key, n ? keys : "none");
}

/* The input's lines, read once: the first that is not blank is read ahead
 * to tell JSON lines from text and then given again, since a pipe (--input
 * <(zcat ...), /dev/stdin) cannot be rewound. A byte order mark before
 * the first line is dropped. */
typedef struct reader {
  FILE *in;
  char *line;
  size_t cap;
  ssize_t got;  /* the line's length, or -1 */
  bool again;   /* give the line read ahead once more */
  long lineno;
} reader;

static ssize_t next_line(reader *r) {
  if (r->again) {
    r->again = false;
    return r->got;
  }
  r->got = getline(&r->line, &r->cap, r->in);
  if (r->got >= 0 && r->lineno++ == 0 && r->got >= 3 && !memcmp(r->line, "\xEF\xBB\xBF", 3)) {
    /* a UTF-8 byte order mark (Windows editors write one) is no text, and
     * would make a first JSON line read as plain text */
    memmove(r->line, r->line + 3, (size_t)r->got - 2);
    r->got -= 3;
  }
  return r->got;
}

static mega_status run(job *j, reader *rd, const char *key, bool jsonl, mega_err *err) {
  char *doc = NULL;
  size_t dlen = 0, dcap = 0;
  ssize_t got;
  mega_status st = MEGA_OK;
  while (st == MEGA_OK && (got = next_line(rd)) >= 0) {
    const char *line = rd->line;
    long lineno = rd->lineno;
    if (jsonl) {
      if (strspn(line, " \t\r\n") == (size_t)got) continue;
      json_error_t je;
      json_t *v = json_loads(line, 0, &je);
      json_t *t = json_object_get(v, key);
      if (!v)
        st = mega_fail(err, MEGA_ERR_INVALID, "line %ld: %s", lineno, je.text);
      else if (!json_is_string(t))
        st = no_text(v, t, key, lineno, err);
      else
        st = add_doc(j, json_string_value(t), json_string_length(t), err);
      json_decref(v);
      continue;
    }
    bool blank = strspn(line, " \t\r\n") == (size_t)got;
    if (blank) {
      if (dlen) st = add_doc(j, doc, dlen, err);
      dlen = 0;
      continue;
    }
    if (dlen + (size_t)got + 1 > dcap) {
      char *d = realloc(doc, dcap = 2 * (dlen + (size_t)got + 1));
      if (!d) {
        st = mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
        break;
      }
      doc = d;
    }
    memcpy(doc + dlen, line, (size_t)got);
    dlen += (size_t)got;
  }
  /* getline's -1 is also a read error (a directory reads as EISDIR): not the end */
  if (st == MEGA_OK && ferror(rd->in))
    st = rd->lineno ? mega_fail(err, MEGA_ERR_IO, "cannot read past line %ld: %s", rd->lineno,
                                strerror(errno))
                : mega_fail(err, MEGA_ERR_IO, "cannot read it: %s; give a text or JSON lines "
                            "file", strerror(errno));
  if (st == MEGA_OK && dlen) st = add_doc(j, doc, dlen, err);
  free(doc);
  return st;
}

int main(int argc, char **argv) {
  const char *input = NULL, *out = NULL, *tok = NULL, *vocab = NULL, *merges = NULL,
             *key = "text";
  bool eod = false;
  for (int i = 1; i < argc; i++) {
    const char **dst = NULL;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--append-eod")) {
      eod = true;
      continue;
    } else if (!strcmp(argv[i], "--input")) dst = &input;
    else if (!strcmp(argv[i], "--output-prefix")) dst = &out;
    else if (!strcmp(argv[i], "--tokenizer-type")) dst = &tok;
    else if (!strcmp(argv[i], "--vocab-file")) dst = &vocab;
    else if (!strcmp(argv[i], "--merge-file")) dst = &merges;
    else if (!strcmp(argv[i], "--json-keys")) dst = &key;
    if (!dst || i + 1 >= argc) {
      fprintf(stderr, "preprocess: %s '%s' (see preprocess --help)\n",
              dst ? "missing value for" : "unknown flag", argv[i]);
      return 2;
    }
    *dst = argv[++i];
  }
  if (!input || !out || !vocab || !merges || !tok || strcmp(tok, "GPT2BPETokenizer")) {
    fprintf(stderr, "preprocess: needs --input, --output-prefix, --tokenizer-type "
                    "GPT2BPETokenizer (the one built), --vocab-file and --merge-file "
                    "(see preprocess --help)\n");
    return 2;
  }
  mega_err err = {0};
  job j = {.eod = eod};
  if (mega_bpe_load(vocab, merges, &j.bpe, &err) != MEGA_OK) return fail(&err);
  if (eod && mega_bpe_eod(j.bpe) < 0) {
    fprintf(stderr, "preprocess: --append-eod: %s has no <|endoftext|>\n", vocab);
    mega_bpe_free(j.bpe);
    return 2;
  }
  FILE *in = fopen(input, "r");
  if (!in) {
    fprintf(stderr, "preprocess: cannot read --input %s: %s\n", input, strerror(errno));
    mega_bpe_free(j.bpe);
    return 1;
  }
  /* JSON lines when the first non-empty line is an object */
  reader rd = {.in = in};
  bool jsonl = false;
  while (next_line(&rd) >= 0)
    if (strspn(rd.line, " \t\r\n") != (size_t)rd.got) {
      jsonl = is_json_object_line(rd.line);
      rd.again = true;
      break;
    }
  char prefix[4096];
  snprintf(prefix, sizeof prefix, "%s_%s_document", out, key);
  int dtype = mega_bpe_vocab_size(j.bpe) < 65500 ? 8 : 4; /* uint16, else int32 */
  mega_status st = mega_indexed_writer_open(prefix, dtype, &j.w, &err);
  if (st == MEGA_OK) st = run(&j, &rd, key, jsonl, &err);
  /* a failed run leaves no dataset of the documents before the fault */
  if (st != MEGA_OK) mega_indexed_writer_abort(j.w);
  else if (j.w) st = mega_indexed_writer_close(j.w, &err);
  fclose(in);
  free(rd.line);
  free(j.ids.ids);
  int vocab_size = mega_bpe_vocab_size(j.bpe);
  mega_bpe_free(j.bpe);
  if (st != MEGA_OK) {
    fprintf(stderr, "preprocess: %s: %s\n", input, err.msg);
    return 1;
  }
  printf("preprocess: %ld documents, %ld tokens (%s) in %s.bin/.idx; train with --data-path "
         "%s --tokenizer-type NullTokenizer --vocab-size %d\n",
         j.docs, j.tokens, dtype == 8 ? "uint16" : "int32", prefix, prefix, vocab_size - 1);
  return 0;
}
