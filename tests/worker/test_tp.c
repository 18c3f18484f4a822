/* Tensor parallelism's pieces that need no group: the slice maps
 * (tp_split.h: the fused QKV by heads, rows, columns), and the
 * vocabulary-parallel embedding and cross-entropy ops of the cpu backend
 * against their whole-vocabulary forms, with the reductions between the
 * steps done here as the TP group would do them. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "worker/backend/backend.h"
#include "worker/model/tp_split.h"

/* The QKV weight [C, 3C] of C = 6, 3 heads of 2, over TP 3: rank r holds
 * columns {2r, 2r+1} of q, of k and of v, in that order. */
static void test_qkv_weight_slices_by_heads(void **state) {
  (void)state;
  enum { C = 6, TP = 3 };
  mega_tp_split s = {.parts = 3, .outer = C, .inner = C};
  float full[C * 3 * C], local[C * 3 * C / TP], back[C * 3 * C];
  for (int i = 0; i < C * 3 * C; i++) full[i] = (float)i;
  memset(back, 0, sizeof back);
  for (int r = 0; r < TP; r++) {
    mega_tp_cut(&s, TP, r, full, local);
    for (int row = 0; row < C; row++)
      for (int part = 0; part < 3; part++)
        for (int j = 0; j < C / TP; j++) {
          int col = part * C + r * (C / TP) + j; /* q, k or v column of head r */
          float want = full[row * 3 * C + col];
          size_t i = (size_t)row * 3 * (C / TP) + (size_t)part * (C / TP) + (size_t)j;
          assert_true(local[i] == want);
          assert_int_equal(mega_tp_full_index(&s, TP, r, i), row * 3 * C + col);
        }
    mega_tp_place(&s, TP, r, local, back);
  }
  assert_memory_equal(back, full, sizeof full);
}

/* The QKV bias [3C] and the other splits: every element lands in exactly
 * one rank's slice, and cut then place gives the tensor back. */
static void test_every_split_partitions(void **state) {
  (void)state;
  enum { R = 4, K = 12, TP = 2 };
  const mega_tp_split splits[] = {
      {.parts = 3, .outer = 1, .inner = K / 3 * 2},   /* QKV bias of C = 8 */
      {.parts = 1, .outer = 1, .inner = R * K},       /* rows */
      {.parts = 1, .outer = R, .inner = K},           /* columns */
      {.parts = 0, .outer = 1, .inner = R * K},       /* replicated */
  };
  for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
    const mega_tp_split *s = &splits[k];
    size_t n = s->outer * s->inner * (size_t)(s->parts ? s->parts : 1);
    size_t local_n = mega_tp_split_replicated(s) ? n : n / TP;
    float *full = malloc(n * sizeof *full), *back = calloc(n, sizeof *back);
    float *local = malloc(n * sizeof *local);
    int *hits = calloc(n, sizeof *hits);
    for (size_t i = 0; i < n; i++) full[i] = (float)i + 0.5f;
    for (int r = 0; r < TP; r++) {
      mega_tp_cut(s, TP, r, full, local);
      for (size_t i = 0; i < local_n; i++) {
        size_t f = mega_tp_full_index(s, TP, r, i);
        assert_true(f < n);
        assert_true(local[i] == full[f]);
        hits[f]++;
      }
      mega_tp_place(s, TP, r, local, back);
    }
    for (size_t i = 0; i < n; i++) assert_int_equal(hits[i], mega_tp_split_replicated(s) ? TP : 1);
    assert_memory_equal(back, full, n * sizeof *full);
    free(full), free(back), free(local), free(hits);
  }
}

static float rnd(unsigned *st) {
  *st = *st * 1103515245u + 12345u;
  return (float)((*st >> 8) & 0xffff) / 65536.0f * 8.0f - 4.0f;
}

/* Vocabulary 12 padded to 16 over TP 4 (slices of 4 ids): targets at
 * every slice boundary, never in the padded rows 12..15 (which still take
 * part in the softmax, as Megatron's do). */
static void test_vocab_parallel_cross_entropy(void **state) {
  (void)state;
  enum { N = 8, V = 16, TP = 4, VL = V / TP };
  const float sc = 0.1f; /* not a power of two: the products round */
  mega_backend *be;
  assert_int_equal(mega_backend_cpu_create(NULL, &be, NULL), MEGA_OK);
  const int32_t tg[N] = {0, 3, 4, 7, 8, 11, 5, 1};
  float logits[N * V], losses[N], probs[N * V], dl[N * V];
  unsigned st = 7;
  for (int i = 0; i < N * V; i++) logits[i] = rnd(&st);
  memcpy(probs, logits, sizeof probs); /* in place: probabilities, then dlogits */
  be->ops->crossentropy_forward(be, losses, probs, tg, N, V);
  memcpy(dl, probs, sizeof dl);
  be->ops->crossentropy_backward(be, dl, tg, 0, sc, N, V);

  float slice[TP][N * VL], rowmax[TP][N], gmax[N], sums[TP][2 * N], gsums[2 * N];
  for (int r = 0; r < TP; r++) {
    for (int n = 0; n < N; n++) memcpy(slice[r] + n * VL, logits + n * V + r * VL, VL * 4);
    be->ops->crossentropy_rowmax(be, rowmax[r], slice[r], N, VL);
  }
  for (int n = 0; n < N; n++) { /* the group's max */
    gmax[n] = rowmax[0][n];
    for (int r = 1; r < TP; r++) gmax[n] = fmaxf(gmax[n], rowmax[r][n]);
  }
  memset(gsums, 0, sizeof gsums);
  for (int r = 0; r < TP; r++) { /* the group's sums */
    be->ops->crossentropy_sums(be, sums[r], slice[r], gmax, tg, r * VL, N, VL);
    for (int i = 0; i < 2 * N; i++) gsums[i] += sums[r][i];
  }
  /* the fused classifier: the two ops' losses and dlogits, bit for bit */
  float fl[N], fd[N * V];
  memcpy(fd, logits, sizeof fd);
  be->ops->crossentropy_forward_grad(be, fl, fd, tg, sc, N, V);
  assert_memory_equal(fl, losses, sizeof fl);
  assert_memory_equal(fd, dl, sizeof fd);
  for (int r = 0; r < TP; r++) {
    float ll[N], fs[N * VL];
    memcpy(fs, slice[r], sizeof fs);
    be->ops->crossentropy_finish(be, ll, slice[r], gmax, gsums, N, VL);
    be->ops->crossentropy_finish_grad(be, fl, fs, gmax, gsums, tg, r * VL, sc, N, VL);
    assert_memory_equal(fl, ll, sizeof fl);
    for (int n = 0; n < N; n++) {
      assert_float_equal(ll[n], losses[n], 2e-6 * fabsf(losses[n]) + 1e-6);
      for (int j = 0; j < VL; j++)
        assert_float_equal(slice[r][n * VL + j], probs[n * V + r * VL + j], 1e-6);
    }
    be->ops->crossentropy_backward(be, slice[r], tg, r * VL, sc, N, VL);
    assert_memory_equal(fs, slice[r], sizeof fs);
    for (int n = 0; n < N; n++)
      for (int j = 0; j < VL; j++) /* the one-hot lands in the target's slice only */
        assert_float_equal(slice[r][n * VL + j], dl[n * V + r * VL + j], 1e-7);
  }
  for (int n = 0; n < N; n++) { /* the whole row's one-hot is at the target */
    float d = probs[n * V + tg[n]] * sc;
    assert_true(d - sc < 0 && dl[n * V + tg[n]] == d - sc);
  }
  mega_backend_destroy(be);
}

/* The vocabulary-parallel embedding: each rank's slice contributes its ids'
 * rows (rank 0 adds wpe); their sum is the whole lookup, and each rank's
 * wte gradient is its rows of the whole one. */
static void test_vocab_parallel_embedding(void **state) {
  (void)state;
  enum { B = 2, T = 3, C = 4, V = 8, TP = 2, VL = V / TP };
  mega_backend *be;
  assert_int_equal(mega_backend_cpu_create(NULL, &be, NULL), MEGA_OK);
  const int32_t tok[B * T] = {0, 3, 4, 7, 2, 5}; /* both sides of the boundary at 4 */
  float wte[V * C], wpe[T * C], whole[B * T * C], sum[B * T * C], part[B * T * C];
  float dout[B * T * C], dwte[V * C], dwpe[T * C];
  unsigned st = 3;
  for (int i = 0; i < V * C; i++) wte[i] = rnd(&st);
  for (int i = 0; i < T * C; i++) wpe[i] = rnd(&st);
  for (int i = 0; i < B * T * C; i++) dout[i] = rnd(&st);
  be->ops->encoder_forward(be, whole, tok, wte, 0, V, wpe, B, T, C);
  memset(dwte, 0, sizeof dwte);
  memset(dwpe, 0, sizeof dwpe);
  be->ops->encoder_backward(be, dwte, 0, V, dwpe, dout, tok, B, T, C);
  memset(sum, 0, sizeof sum);
  for (int r = 0; r < TP; r++) {
    be->ops->encoder_forward(be, part, tok, wte + r * VL * C, r * VL, VL, r == 0 ? wpe : NULL, B,
                             T, C);
    for (int i = 0; i < B * T * C; i++) sum[i] += part[i];
    float g[VL * C];
    memset(g, 0, sizeof g);
    be->ops->encoder_backward(be, g, r * VL, VL, NULL, dout, tok, B, T, C);
    assert_memory_equal(g, dwte + r * VL * C, sizeof g);
  }
  assert_memory_equal(sum, whole, sizeof sum); /* one rank adds each row: exact */
  mega_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_qkv_weight_slices_by_heads),
      cmocka_unit_test(test_every_split_partitions),
      cmocka_unit_test(test_vocab_parallel_cross_entropy),
      cmocka_unit_test(test_vocab_parallel_embedding),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
