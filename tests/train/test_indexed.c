/* Megatron's indexed datasets (MMIDIDX), blends and splits: every dtype
 * code, each bad file with its message, the blending rule's first 1000
 * sources, and evaluation reading only the valid split. The files are
 * written here from the format alone (worker/data/indexed.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/data/data.h"
#include "worker/data/indexed.h"

static char dir[64];
static char prefix[128];

static const int itemsize[9] = {0, 1, 1, 2, 4, 8, 8, 4, 2};

/* Token v as dtype code c, little-endian. */
static void put_token(FILE *f, int c, int64_t v) {
  uint8_t b[8];
  switch (c) {
  case 1: case 2: b[0] = (uint8_t)v; break;
  case 3: case 8: { uint16_t x = (uint16_t)v; memcpy(b, &x, 2); break; }
  case 4: { int32_t x = (int32_t)v; memcpy(b, &x, 4); break; }
  case 5: memcpy(b, &v, 8); break;
  case 6: { double x = (double)v; memcpy(b, &x, 8); break; }
  case 7: { float x = (float)v; memcpy(b, &x, 4); break; }
  }
  fwrite(b, (size_t)itemsize[c], 1, f);
}

/* What write_pair may spoil. */
typedef struct spoil {
  bool magic, version, dtype, truncate, pointer;
  double raw; /* when set, the first token is written as this float64 bit pattern */
} spoil;

/* Writes prefix.bin and prefix.idx: nseq sequences, sequence i of len[i]
 * tokens valued tok(i, k); one document per two sequences. */
static void write_pair(const char *name, int code, int nseq, const int *len,
                       int64_t (*tok)(int, int), const spoil *sp) {
  snprintf(prefix, sizeof prefix, "%s/%s", dir, name);
  char path[160];
  snprintf(path, sizeof path, "%s.bin", prefix);
  FILE *bin = fopen(path, "wb");
  assert_non_null(bin);
  int64_t *ptr = calloc((size_t)nseq + 1, sizeof *ptr), off = 0;
  for (int i = 0; i < nseq; i++) {
    ptr[i] = off;
    for (int k = 0; k < len[i]; k++) put_token(bin, code, tok(i, k));
    off += (int64_t)len[i] * itemsize[code];
  }
  fclose(bin);
  snprintf(path, sizeof path, "%s.idx", prefix);
  FILE *idx = fopen(path, "wb");
  assert_non_null(idx);
  fwrite(sp && sp->magic ? "MMIDIDY\0\0" : "MMIDIDX\0\0", 9, 1, idx);
  uint64_t version = sp && sp->version ? 2 : 1;
  fwrite(&version, 8, 1, idx);
  uint8_t dt = sp && sp->dtype ? 9 : (uint8_t)code;
  fwrite(&dt, 1, 1, idx);
  int ndoc = (nseq + 1) / 2 + 1;
  uint64_t ns = (uint64_t)nseq, nd = (uint64_t)ndoc;
  fwrite(&ns, 8, 1, idx);
  fwrite(&nd, 8, 1, idx);
  for (int i = 0; i < nseq; i++) {
    int32_t l = len[i];
    fwrite(&l, 4, 1, idx);
  }
  if (sp && sp->pointer) ptr[nseq - 1] += 8;
  fwrite(ptr, 8, (size_t)nseq, idx);
  for (int d = 0; d < ndoc; d++) {
    int64_t v = d * 2 < nseq ? d * 2 : nseq;
    if (!(sp && sp->truncate && d == ndoc - 1)) fwrite(&v, 8, 1, idx);
  }
  fclose(idx);
  free(ptr);
}

static int64_t tok_mod(int i, int k) { return (i * 7 + k) % 97; }

static mega_data *open_prefix(int T, int vocab, mega_status want, const char *msg) {
  const char *p = prefix;
  mega_data_opts o = {.seq_len = T, .vocab = vocab};
  mega_data *d = NULL;
  mega_err err = {0};
  assert_int_equal(mega_data_open_set(&p, NULL, 1, &o, &d, &err), want);
  if (msg && !strstr(err.msg, msg)) fail_msg("message '%s' lacks '%s'", err.msg, msg);
  return d;
}

/* Every dtype code reads back the same token stream: the sequences'
 * tokens concatenated in index order, windows across their borders. */
static void test_every_dtype(void **state) {
  (void)state;
  int len[5] = {3, 0, 5, 1, 6}; /* 15 tokens, an empty sequence among them */
  int32_t want[15];
  int n = 0;
  for (int i = 0; i < 5; i++)
    for (int k = 0; k < len[i]; k++) want[n++] = (int32_t)tok_mod(i, k);
  for (int code = 1; code <= 8; code++) {
    write_pair("dt", code, 5, len, tok_mod, NULL);
    mega_data *d = open_prefix(4, 256, MEGA_OK, NULL);
    assert_int_equal(mega_data_size(d), 15);
    assert_int_equal(mega_data_windows(d), 3); /* (15 - 1) / 4 */
    mega_batch_plan p;
    mega_err err = {0};
    assert_int_equal(mega_batch_plan_init(&p, 3, 3, 1, &err), MEGA_OK);
    int32_t tokens[12], targets[12];
    assert_int_equal(mega_data_microbatch(d, &p, 0, 0, 0, tokens, targets, &err), MEGA_OK);
    for (int t = 0; t < 12; t++) {
      assert_int_equal(tokens[t], want[t]);
      assert_int_equal(targets[t], want[t + 1]);
    }
    mega_data_close(d);
  }
}

static void test_bad_magic(void **state) {
  (void)state;
  int len[2] = {4, 4};
  write_pair("magic", 4, 2, len, tok_mod, &(spoil){.magic = true});
  open_prefix(4, 256, MEGA_ERR_INVALID, "magic.idx is not a Megatron indexed dataset: its "
                                        "first bytes are not the magic MMIDIDX");
}

static void test_bad_version(void **state) {
  (void)state;
  int len[2] = {4, 4};
  write_pair("version", 4, 2, len, tok_mod, &(spoil){.version = true});
  open_prefix(4, 256, MEGA_ERR_INVALID, "version.idx has index version 2; mega reads version 1");
}

static void test_bad_dtype(void **state) {
  (void)state;
  int len[2] = {4, 4};
  write_pair("dtype", 4, 2, len, tok_mod, &(spoil){.dtype = true});
  open_prefix(4, 256, MEGA_ERR_INVALID, "dtype.idx has unknown dtype code 9; known codes: 1 uint8");
}

static void test_truncated_index(void **state) {
  (void)state;
  int len[2] = {4, 4};
  write_pair("trunc", 4, 2, len, tok_mod, &(spoil){.truncate = true});
  open_prefix(4, 256, MEGA_ERR_INVALID, "trunc.idx is truncated: 66 bytes cannot hold the 2 "
                                        "sequences and 2 documents its header announces");
  /* shorter than the header itself */
  char path[160];
  snprintf(path, sizeof path, "%s.idx", prefix);
  assert_int_equal(truncate(path, 20), 0);
  open_prefix(4, 256, MEGA_ERR_INVALID, "trunc.idx is truncated: 20 bytes, shorter than the "
                                        "34-byte header");
}

static void test_pointer_past_bin(void **state) {
  (void)state;
  int len[2] = {4, 4};
  write_pair("ptr", 4, 2, len, tok_mod, &(spoil){.pointer = true});
  open_prefix(4, 256, MEGA_ERR_INVALID, "ptr.idx: sequence 1 (4 tokens at byte 24) runs past "
                                        "the end of");
}

static int64_t tok_big(int i, int k) { return i == 1 && k == 2 ? 50258 : k; }
static int64_t tok_neg(int i, int k) { return i == 0 && k == 1 ? -3 : k; }

/* Token ids are checked as they are read: the file opens, the batch that
 * reads the bad id fails, naming it. */
static void test_token_outside_vocab(void **state) {
  (void)state;
  int len[2] = {4, 4};
  write_pair("vocab", 4, 2, len, tok_big, NULL);
  mega_data *d = open_prefix(3, 50258, MEGA_OK, NULL);
  mega_batch_plan p;
  mega_err err = {0};
  assert_int_equal(mega_batch_plan_init(&p, 1, 1, 1, &err), MEGA_OK);
  int32_t tokens[3], targets[3];
  assert_int_equal(mega_data_microbatch(d, &p, 0, 0, 0, tokens, targets, &err), MEGA_OK);
  assert_int_equal(mega_data_microbatch(d, &p, 1, 0, 0, tokens, targets, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "vocab.bin: token 2 of sequence 1 is 50258, not a token id of the "
                       "vocabulary 0..50257"))
    fail_msg("%s", err.msg);
  mega_data_close(d);
  /* negative ids, and fractions in a float dataset */
  write_pair("neg", 3, 2, len, tok_neg, NULL);
  d = open_prefix(3, 256, MEGA_OK, NULL);
  assert_int_equal(mega_data_microbatch(d, &p, 0, 0, 0, tokens, targets, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "token 1 of sequence 0 is -3")) fail_msg("%s", err.msg);
  mega_data_close(d);
}

/* Megatron's build_blending_indices, restated: sample s from the dataset
 * most behind its weight, w[d] * max(s, 1) - c[d], the first on a tie. */
static void test_blend_order(void **state) {
  (void)state;
  int len[1] = {200};
  char a[160], b[160];
  write_pair("blend_a", 8, 1, len, tok_mod, NULL);
  strcpy(a, prefix);
  write_pair("blend_b", 8, 1, len, tok_mod, NULL);
  strcpy(b, prefix);
  const char *paths[2] = {a, b};
  double w[2] = {3, 7}; /* normalized: 0.3, 0.7 */
  mega_data_opts o = {.seq_len = 4, .samples = 600}; /* 1000 also crosses the fast table */
  mega_data *d;
  mega_err err = {0};
  assert_int_equal(mega_data_open_set(paths, w, 2, &o, &d, &err), MEGA_OK);
  /* by hand: s=0 and 1 both weigh max(s,1)=1: 0.3 vs 0.7 -> b; 0.3 vs -0.3 -> a; ... */
  const int first[10] = {1, 0, 1, 1, 0, 1, 1, 0, 1, 1};
  double c[2] = {0, 0}, wn[2] = {0.3, 0.7};
  int64_t k[2] = {0, 0};
  for (int64_t s = 0; s < 1000; s++) {
    double si = s > 1 ? (double)s : 1.0;
    int want = wn[1] * si - c[1] > wn[0] * si - c[0] ? 1 : 0;
    int got;
    int64_t win;
    mega_data_sample_source(d, s, false, &got, &win);
    if (got != want) fail_msg("sample %lld: dataset %d, the rule says %d", (long long)s, got, want);
    if (s < 10) assert_int_equal(got, first[s]);
    assert_int_equal(win, k[want] % 49); /* K = (200 - 1) / 4 windows each */
    c[want] += 1;
    k[want]++;
  }
  assert_int_equal(k[0], 300);
  assert_int_equal(k[1], 700);
  mega_data_close(d);
}

static int64_t tok_seq(int i, int k) { (void)k; return i; }

/* --split 8,1,1 over 100 sequences: train 0..79, valid 80..89, test
 * 90..99 (Megatron's split indices). Every evaluation token comes from the
 * valid split, and training never reads it. */
static void test_split_eval(void **state) {
  (void)state;
  int len[100];
  for (int i = 0; i < 100; i++) len[i] = 5;
  write_pair("split", 4, 100, len, tok_seq, NULL);
  const char *p = prefix;
  mega_data_opts o = {.seq_len = 8, .split = true, .shares = {0.8, 0.1, 0.1}, .eval = true};
  mega_data *d;
  mega_err err = {0};
  assert_int_equal(mega_data_open_set(&p, NULL, 1, &o, &d, &err), MEGA_OK);
  assert_int_equal(mega_data_windows(d), (400 - 1) / 8);
  mega_batch_plan plan;
  assert_int_equal(mega_batch_plan_init(&plan, 4, 2, 2, &err), MEGA_OK);
  int32_t tok[16], tgt[16];
  bool seen_first = false, seen_last = false;
  for (int64_t e = 0; e < 10; e++)
    for (int r = 0; r < 2; r++) {
      assert_int_equal(mega_data_eval_microbatch(d, &plan, e, r, 0, tok, tgt, &err), MEGA_OK);
      for (int t = 0; t < 16; t++) {
        if (tok[t] < 80 || tok[t] > 89 || tgt[t] < 80 || tgt[t] > 89)
          fail_msg("evaluation read sequence %d", tok[t] < 80 || tok[t] > 89 ? tok[t] : tgt[t]);
        seen_first |= tok[t] == 80;
        seen_last |= tgt[t] == 89;
      }
      assert_int_equal(mega_data_microbatch(d, &plan, e, r, 0, tok, tgt, &err), MEGA_OK);
      for (int t = 0; t < 16; t++) assert_true(tok[t] < 80 && tgt[t] < 80);
    }
  assert_true(seen_first && seen_last);
  mega_data_close(d);

  /* a valid split too small for one window */
  o.shares[0] = 0.99, o.shares[1] = 0.01, o.shares[2] = 0;
  assert_int_equal(mega_data_open_set(&p, NULL, 1, &o, &d, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "split's valid split (sequences 99..100) holds 5 tokens, fewer than one "
                       "window"))
    fail_msg("%s", err.msg);
  /* without evaluation the valid split is never read, so never refused */
  o.eval = false;
  assert_int_equal(mega_data_open_set(&p, NULL, 1, &o, &d, &err), MEGA_OK);
  mega_data_close(d);
  /* a plain file has no documents to split */
  char plain[160];
  snprintf(plain, sizeof plain, "%s/plain.txt", dir);
  FILE *f = fopen(plain, "w");
  fputs("some bytes, enough of them for a window", f);
  fclose(f);
  p = plain;
  o.shares[0] = 0.9, o.shares[1] = 0.1;
  assert_int_equal(mega_data_open_set(&p, NULL, 1, &o, &d, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "--split divides an indexed dataset's documents, but")) fail_msg("%s", err.msg);
}

static int64_t tok_100(int i, int k) { (void)i; (void)k; return 100; }
static int64_t tok_200(int i, int k) { return 200 + (i + k) % 2; }

/* --train-data-path A B --valid-data-path V W: evaluation reads V and W
 * only, blended by their weights, training A and B only. */
static void test_valid_datasets(void **state) {
  (void)state;
  int len[3] = {20, 20, 20};
  char a[160], b[160], v[160], w[160];
  write_pair("tv_a", 4, 3, len, tok_seq, NULL); /* 0, 1, 2 */
  strcpy(a, prefix);
  write_pair("tv_b", 8, 3, len, tok_100, NULL);
  strcpy(b, prefix);
  write_pair("tv_v", 3, 3, len, tok_200, NULL); /* 200, 201 */
  strcpy(v, prefix);
  write_pair("tv_w", 1, 3, len, tok_seq, NULL); /* 0, 1, 2 again: told apart by the blend */
  strcpy(w, prefix);
  const char *train[2] = {a, b}, *valid[2] = {v, w};
  double tw[2] = {1, 1}, vw[2] = {0.25, 0.75};
  mega_data_opts o = {.seq_len = 4, .samples = 64, .valid_paths = valid, .valid_weights = vw,
                      .valid_n = 2};
  mega_data *d;
  mega_err err = {0};
  assert_int_equal(mega_data_open_set(train, tw, 2, &o, &d, &err), MEGA_OK);
  int from[2] = {0, 0};
  for (int64_t s = 0; s < 40; s++) {
    int k;
    int64_t win;
    mega_data_sample_source(d, s, true, &k, &win);
    from[k]++;
  }
  assert_int_equal(from[0], 10); /* a quarter from V */
  mega_batch_plan plan;
  assert_int_equal(mega_batch_plan_init(&plan, 4, 4, 1, &err), MEGA_OK);
  int32_t tok[16], tgt[16];
  for (int64_t e = 0; e < 4; e++) {
    assert_int_equal(mega_data_eval_microbatch(d, &plan, e, 0, 0, tok, tgt, &err), MEGA_OK);
    for (int t = 0; t < 16; t++) assert_true(tok[t] >= 200 || tok[t] <= 2);
    if (e == 0) /* sample 0: W, 0.75 ahead of 0.25 */
      for (int t = 0; t < 4; t++) assert_true(tok[t] <= 2);
    assert_int_equal(mega_data_microbatch(d, &plan, e, 0, 0, tok, tgt, &err), MEGA_OK);
    for (int t = 0; t < 16; t++) assert_true(tok[t] == 100 || tok[t] <= 2);
  }
  mega_data_close(d);
}

/* Megatron's get_split_indices on its default 969,30,1 over 1000 sequences. */
static void test_split_megatron_default(void **state) {
  (void)state;
  int len[1000];
  for (int i = 0; i < 1000; i++) len[i] = 2;
  write_pair("split1000", 1, 1000, len, tok_seq, NULL);
  const char *p = prefix;
  mega_data_opts o = {.seq_len = 3, .split = true, .shares = {0.969, 0.03, 0.001}, .eval = true};
  mega_data *d;
  mega_err err = {0};
  assert_int_equal(mega_data_open_set(&p, NULL, 1, &o, &d, &err), MEGA_OK);
  assert_int_equal(mega_data_windows(d), (969 * 2 - 1) / 3);
  mega_batch_plan plan;
  assert_int_equal(mega_batch_plan_init(&plan, 1, 1, 1, &err), MEGA_OK);
  int32_t tok[3], tgt[3];
  assert_int_equal(mega_data_eval_microbatch(d, &plan, 0, 0, 0, tok, tgt, &err), MEGA_OK);
  assert_int_equal(tok[0], 969 % 256); /* the valid split starts at sequence 969 */
  mega_data_close(d);
}

/* The writer (tools/preprocess) puts a dataset under its prefix only when
 * it closes whole: an abandoned write (a bad input line) leaves the one that
 * was there reading as before, and no temporaries. */
static void test_writer_abort_keeps_dataset(void **state) {
  (void)state;
  snprintf(prefix, sizeof prefix, "%s/w", dir);
  mega_err err = {0};
  mega_indexed_writer *w = NULL;
  int32_t a[3] = {5, 6, 7}, b[2] = {8, 9};
  assert_int_equal(mega_indexed_writer_open(prefix, 8, &w, &err), MEGA_OK);
  assert_int_equal(mega_indexed_writer_add(w, a, 3, &err), MEGA_OK);
  assert_int_equal(mega_indexed_writer_close(w, &err), MEGA_OK);
  assert_int_equal(mega_indexed_writer_open(prefix, 8, &w, &err), MEGA_OK);
  assert_int_equal(mega_indexed_writer_add(w, b, 2, &err), MEGA_OK);
  mega_indexed_writer_abort(w);
  mega_indexed *x = NULL;
  assert_int_equal(mega_indexed_open(prefix, &x, &err), MEGA_OK);
  assert_int_equal(mega_indexed_sequences(x), 1);
  int32_t got[3];
  assert_int_equal(mega_indexed_read(x, 0, 0, 3, 256, got, &err), MEGA_OK);
  assert_memory_equal(got, a, sizeof a);
  mega_indexed_close(x);
  char path[160];
  snprintf(path, sizeof path, "%s.bin.tmp", prefix);
  assert_int_not_equal(access(path, F_OK), 0);
  snprintf(path, sizeof path, "%s.idx.tmp", prefix);
  assert_int_not_equal(access(path, F_OK), 0);

  /* A close whose .idx cannot go in place (a directory there) puts the
   * .bin that was there back: the two renames are not one step. */
  snprintf(prefix, sizeof prefix, "%s/w2", dir);
  snprintf(path, sizeof path, "%s.bin", prefix);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("the old bin", f);
  fclose(f);
  snprintf(path, sizeof path, "%s.idx", prefix);
  assert_int_equal(mkdir(path, 0700), 0);
  snprintf(path, sizeof path, "%s.idx/keep", prefix);
  f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(mega_indexed_writer_open(prefix, 8, &w, &err), MEGA_OK);
  assert_int_equal(mega_indexed_writer_add(w, b, 2, &err), MEGA_OK);
  assert_int_equal(mega_indexed_writer_close(w, &err), MEGA_ERR_IO);
  assert_non_null(strstr(err.msg, "w2.idx"));
  char old[32] = {0};
  snprintf(path, sizeof path, "%s.bin", prefix);
  f = fopen(path, "r");
  assert_non_null(f);
  assert_non_null(fgets(old, sizeof old, f));
  fclose(f);
  assert_string_equal(old, "the old bin");
  const char *gone[] = {".bin.old", ".bin.tmp", ".idx.tmp"};
  for (int k = 0; k < 3; k++) {
    snprintf(path, sizeof path, "%s%s", prefix, gone[k]);
    assert_int_not_equal(access(path, F_OK), 0);
  }
  snprintf(path, sizeof path, "%s.idx/keep", prefix);
  unlink(path);
  snprintf(path, sizeof path, "%s.idx", prefix);
  rmdir(path);
  snprintf(path, sizeof path, "%s.bin", prefix);
  unlink(path);
}

/* Megatron's order through mega_data (its samples, token for token, are
 * megatron_order_check.py's): the samples it was built for read, one past
 * its index does not, evaluation needs a valid stream, and a plain file is
 * refused. */
static void test_megatron_order_bounds(void **state) {
  (void)state;
  int len[5] = {3, 0, 5, 1, 6}; /* P = 15 tokens */
  write_pair("mo", 4, 5, len, tok_mod, NULL);
  const char *p = prefix;
  /* T 4, 4 samples: 4*4 + 1 = 17 tokens need E = 2 epochs, which hold
   * (2*15 - 1) / 4 = 7 samples */
  mega_data_opts o = {.seq_len = 4, .vocab = 256, .megatron = true, .seed = 1234,
                      .train_samples = 4};
  mega_data *d = NULL;
  mega_err err = {0};
  assert_int_equal(mega_data_open_set(&p, NULL, 1, &o, &d, &err), MEGA_OK);
  mega_batch_plan plan;
  assert_int_equal(mega_batch_plan_init(&plan, 1, 1, 1, &err), MEGA_OK);
  int32_t tok[4], tgt[4];
  for (int s = 0; s < 7; s++) {
    assert_int_equal(mega_data_microbatch(d, &plan, s, 0, 0, tok, tgt, &err), MEGA_OK);
    for (int t = 0; t < 3; t++) assert_int_equal(tok[t + 1], tgt[t]); /* one stream */
  }
  assert_int_equal(mega_data_microbatch(d, &plan, 7, 0, 0, tok, tgt, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "sample 7 is past the 7 of Megatron's data order")) fail_msg("%s", err.msg);
  assert_int_equal(mega_data_eval_microbatch(d, &plan, 0, 0, 0, tok, tgt, &err),
                   MEGA_ERR_INVALID);
  if (!strstr(err.msg, "evaluates only on a valid split")) fail_msg("%s", err.msg);
  mega_data_close(d);

  char plain[160];
  snprintf(plain, sizeof plain, "%s.bin", prefix); /* no mo.bin.idx: a plain file */
  p = plain;
  assert_int_equal(mega_data_open_set(&p, NULL, 1, &o, &d, &err), MEGA_ERR_INVALID);
  if (!strstr(err.msg, "--data-order megatron reads Megatron's indexed datasets"))
    fail_msg("%s", err.msg);
}

static int setup(void **state) {
  (void)state;
  strcpy(dir, "/tmp/mega-test-indexed-XXXXXX");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_dtype),       cmocka_unit_test(test_megatron_order_bounds),
      cmocka_unit_test(test_bad_magic),
      cmocka_unit_test(test_bad_version),       cmocka_unit_test(test_bad_dtype),
      cmocka_unit_test(test_truncated_index),   cmocka_unit_test(test_pointer_past_bin),
      cmocka_unit_test(test_token_outside_vocab), cmocka_unit_test(test_blend_order),
      cmocka_unit_test(test_split_eval),        cmocka_unit_test(test_split_megatron_default),
      cmocka_unit_test(test_valid_datasets),    cmocka_unit_test(test_writer_abort_keeps_dataset),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
