/* Gradient buffers and buckets (worker/engine/grads.h): the layout (reverse
 * order, alignment, padding, the tied embedding's own bucket), the
 * distributed optimizer's shards, and when buckets launch: each exactly
 * once per iteration, during the last microbatch's backward as its layers
 * finish, and never under no_sync. DP is 1 here (no communicator: a launch
 * reduces nothing but is observed); the reductions themselves are checked
 * against the single rank by tests/engine/pipeline_check.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "count_backend.h"
#include "gpt_fixture.h"
#include "worker/engine/grads.h"

#define B 2
#define T 8

typedef struct fixture {
  mega_backend *be;
  mega_backend *cpu; /* under be when it counts (setup_counted); else NULL */
  fx_counts counts;
  mega_gpt_config cfg;
  mega_gpt_stage *stage;
  mega_grads *g;
} fixture;

static void setup_on(fixture *f, mega_gpt_stage_desc d, mega_grads_opts o) {
  mega_err err = {0};
  fx_config(&f->cfg, 0.2f);
  f->cfg.num_layers = 4;
  if (mega_gpt_stage_create(f->be, &f->cfg, &d, &f->stage, &err) != MEGA_OK) fail_msg("%s", err.msg);
  if (mega_grads_create(f->be, &f->stage, 1, &o, &f->g, &err) != MEGA_OK) fail_msg("%s", err.msg);
}

static void setup(fixture *f, mega_gpt_stage_desc d, mega_grads_opts o) {
  memset(f, 0, sizeof *f);
  assert_int_equal(mega_backend_cpu_create(NULL, &f->be, NULL), MEGA_OK);
  setup_on(f, d, o);
}

/* On a cpu backend that counts its calls (count_backend.h); ranges: with
 * the many-range ops. */
static void setup_counted(fixture *f, mega_gpt_stage_desc d, mega_grads_opts o, bool ranges) {
  memset(f, 0, sizeof *f);
  assert_int_equal(mega_backend_cpu_create(NULL, &f->cpu, NULL), MEGA_OK);
  assert_non_null(f->be = fx_counting(f->cpu, &f->counts, ranges));
  setup_on(f, d, o);
}

static void teardown(fixture *f) {
  mega_grads_destroy(f->g); /* first: it unhooks itself from the stage */
  mega_gpt_stage_destroy(f->stage);
  mega_backend_destroy(f->be);
  mega_backend_destroy(f->cpu);
}

/* Buckets tile the buffer; each holds a run of params; offsets descend with
 * the param index; every tensor is 16-aligned. */
static void check_tiling(fixture *f, size_t pad) {
  int np, nb = mega_grads_num_buckets(f->g);
  const mega_param_info *p = mega_gpt_params(f->stage, &np);
  size_t at = 0;
  int covered = 0;
  for (int b = 0; b < nb; b++) {
    const mega_grads_bucket *k = mega_grads_bucket_at(f->g, b);
    assert_int_equal(k->offset, at);
    assert_int_equal(k->numel % pad, 0);
    assert_true(k->numel_unpadded <= k->numel && k->numel - k->numel_unpadded < pad + 16);
    assert_true(k->param_lo < k->param_hi);
    for (int i = k->param_lo; i < k->param_hi; i++) {
      assert_true(p[i].offset >= k->offset);
      assert_true(p[i].offset + p[i].numel <= k->offset + k->numel_unpadded);
    }
    covered += k->param_hi - k->param_lo;
    at += k->numel;
  }
  assert_int_equal(covered, np);
  assert_int_equal(at, mega_gpt_num_params(f->stage));
  for (int i = 0; i < np; i++) {
    assert_int_equal(p[i].offset % 16, 0);
    if (i > 0) assert_true(p[i].offset + p[i].numel <= p[i - 1].offset);
  }
  /* bucket 0 starts with the param backward finishes first */
  assert_int_equal(p[np - 1].offset, 0);
}

static void layout_reverse_order_and_buckets(void **state) {
  (void)state;
  fixture f;
  /* One stage with everything; C=16: a block is 12*16*16 + 13*16 = 3280 floats. */
  setup(&f, (mega_gpt_stage_desc){true, true, 0, 4},
        (mega_grads_opts){.dp_size = 1, .overlap = true, .bucket_size = 5000});
  check_tiling(&f, 16);
  int np, nb = mega_grads_num_buckets(&*f.g);
  const mega_param_info *p = mega_gpt_params(f.stage, &np);
  assert_true(nb >= 3);
  /* Every bucket but the last reaches the size; the tied embedding (wte,
   * param 0) ends the last, with the params before it that did not fill
   * one (wpe and the first block's last): one collective fewer at the end
   * of the backward. With the distributed optimizer it is alone (below). */
  for (int b = 0; b < nb - 1; b++)
    assert_true(mega_grads_bucket_at(f.g, b)->numel_unpadded >= 5000);
  const mega_grads_bucket *last = mega_grads_bucket_at(f.g, nb - 1);
  assert_true(last->tied && !last->tied_copy);
  assert_int_equal(last->param_lo, 0);
  assert_true(last->param_hi > 2); /* wte, wpe and more */
  assert_true(last->numel_unpadded < 5000 + (size_t)p[0].numel);
  assert_string_equal(p[0].name, "transformer.wte.weight");
  for (int b = 0; b < nb - 1; b++) assert_false(mega_grads_bucket_at(f.g, b)->tied);
  teardown(&f);

  /* Without overlap: one bucket, whatever its size. */
  setup(&f, (mega_gpt_stage_desc){true, true, 0, 4}, (mega_grads_opts){.dp_size = 1});
  check_tiling(&f, 16);
  assert_int_equal(mega_grads_num_buckets(f.g), 1);
  assert_false(mega_grads_bucket_at(f.g, 0)->tied);
  teardown(&f);

  /* A loss-only stage: its copy of wte is the first bucket, alone. */
  setup(&f, (mega_gpt_stage_desc){false, true, 2, 2},
        (mega_grads_opts){.dp_size = 1, .overlap = true, .bucket_size = 100000});
  check_tiling(&f, 16);
  p = mega_gpt_params(f.stage, &np);
  assert_int_equal(mega_grads_num_buckets(f.g), 2);
  const mega_grads_bucket *first = mega_grads_bucket_at(f.g, 0);
  assert_true(first->tied && first->tied_copy);
  assert_int_equal(first->param_lo, np - 1);
  assert_string_equal(p[np - 1].name, "transformer.wte.weight");
  teardown(&f);
}

/* Distributed optimizer: buckets padded to 16 x DP; DP ranks' shards split
 * each bucket evenly; their optimizer ranges cover every element of every
 * parameter exactly once; without overlap the tied embedding still gets its
 * own bucket. */
static void distributed_shards_cover_each_element_once(void **state) {
  (void)state;
  enum { DP = 3 };
  fixture f[DP];
  for (int overlap = 0; overlap < 2; overlap++) {
    for (int d = 0; d < DP; d++)
      setup(&f[d], (mega_gpt_stage_desc){true, false, 0, 3},
            (mega_grads_opts){.dp_size = DP, .dp_rank = d, .overlap = overlap != 0,
                              .distributed = true, .bucket_size = 3000});
    check_tiling(&f[0], 16 * DP);
    int np, nb = mega_grads_num_buckets(f[0].g);
    const mega_param_info *p = mega_gpt_params(f[0].stage, &np);
    assert_int_equal(nb, overlap ? 5 : 2); /* 3 blocks (+ wpe), and wte alone */
    assert_true(mega_grads_bucket_at(f[0].g, nb - 1)->tied);
    size_t total = mega_gpt_num_params(f[0].stage);
    unsigned char *seen = calloc(total, 1);
    size_t owned = 0;
    for (int d = 0; d < DP; d++) {
      for (int b = 0; b < nb; b++) {
        const mega_grads_bucket *k = mega_grads_bucket_at(f[d].g, b);
        assert_int_equal(k->shard_numel * DP, k->numel);
        assert_int_equal(k->shard_offset, k->shard_numel * (size_t)d);
        assert_int_equal(k->shard_numel % 16, 0);
      }
      size_t nr;
      const mega_optim_range *r = mega_grads_ranges(f[d].g, &nr);
      const float *base = mega_gpt_param_data(f[d].stage);
      for (size_t i = 0; i < nr; i++) {
        size_t at = (size_t)(r[i].params - base);
        assert_ptr_equal(r[i].grads, mega_gpt_grad_data(f[d].stage) + at);
        for (size_t e = 0; e < r[i].numel; e++) seen[at + e]++;
        owned += r[i].numel;
      }
    }
    size_t numel = 0;
    for (int i = 0; i < np; i++) {
      numel += p[i].numel;
      for (size_t e = 0; e < p[i].numel; e++) assert_int_equal(seen[p[i].offset + e], 1);
    }
    assert_int_equal(owned, numel);
    free(seen);
    for (int d = 0; d < DP; d++) teardown(&f[d]);
  }
}

/* The shard copy: rank d's copy of shard (d - 1) mod DP steps the same
 * pieces as that shard's owner, on gradients in d's buffer at that shard's
 * place, but on parameters of its own (the all-gather writes the buffer's
 * while the copy steps), which take the buffer's values on request. */
static void shard_copy_has_its_own_params(void **state) {
  (void)state;
  enum { DP = 3 };
  fixture f[DP];
  for (int d = 0; d < DP; d++)
    setup(&f[d], (mega_gpt_stage_desc){true, false, 0, 3},
          (mega_grads_opts){.dp_size = DP, .dp_rank = d, .overlap = true, .distributed = true,
                            .bucket_size = 3000, .shard_copy_shift = 1});
  for (int d = 0; d < DP; d++) {
    int c = (d + DP - 1) % DP;
    assert_int_equal(mega_grads_copy_shard(f[d].g), c);
    size_t nc, no;
    const mega_optim_range *cr = mega_grads_copy_ranges(f[d].g, &nc);
    const mega_optim_range *own = mega_grads_ranges(f[c].g, &no);
    const mega_grads_piece *cp = mega_grads_copy_pieces(f[d].g, &nc);
    const mega_grads_piece *op = mega_grads_pieces(f[c].g, &no);
    assert_int_equal(nc, no);
    float *base = mega_gpt_param_data(f[d].stage), *cbase = mega_gpt_param_data(f[c].stage);
    size_t total = mega_gpt_num_params(f[d].stage), bytes = 0;
    for (size_t i = 0; i < nc; i++) {
      assert_int_equal(cp[i].param, op[i].param);
      assert_int_equal(cp[i].elem, op[i].elem);
      assert_int_equal(cr[i].numel, own[i].numel);
      assert_int_equal(cr[i].decay, own[i].decay);
      size_t at = (size_t)(own[i].params - cbase); /* the same place in every rank's buffers */
      assert_ptr_equal(cr[i].grads, mega_gpt_grad_data(f[d].stage) + at);
      assert_true(cr[i].params + cr[i].numel <= base || cr[i].params >= base + total);
      bytes += cr[i].numel * sizeof(float);
    }
    assert_true(mega_grads_copy_param_bytes(f[d].g) >= bytes);
    /* distinct values in the buffer; the copy takes them only when asked */
    for (size_t e = 0; e < total; e++) base[e] = (float)e + 0.5f;
    for (size_t i = 0; i < nc; i++) assert_float_equal(cr[i].params[0], 0, 0); /* zero-filled */
    mega_err err = {0};
    assert_int_equal(mega_grads_copy_take_params(f[d].g, &err), MEGA_OK);
    for (size_t i = 0; i < nc; i++) {
      size_t at = (size_t)(own[i].params - cbase);
      assert_memory_equal(cr[i].params, base + at, cr[i].numel * sizeof(float));
    }
  }
  for (int d = 0; d < DP; d++) teardown(&f[d]);
}

/* ---- when buckets launch ---- */

typedef struct watch {
  mega_grads *g;
  int units;          /* units backward has finished in this microbatch */
  int nlaunch;
  int bucket[64];
  int at_unit[64];    /* units finished when each launch happened */
} watch;

static void count_unit(void *arg, int first, int count) {
  watch *w = arg;
  w->units++;
  mega_grads_ready(w->g, 0, first, count);
}

static void record_launch(void *arg, int bucket) {
  watch *w = arg;
  assert_true(w->nlaunch < 64);
  w->bucket[w->nlaunch] = bucket;
  w->at_unit[w->nlaunch++] = w->units;
}

/* Index of the unit whose end completes bucket b: the unit holding its
 * lowest-indexed param (units finish params in descending index order). */
static int unit_completing(fixture *f, int b) {
  int nu;
  const mega_gpt_unit *u = mega_gpt_units(f->stage, &nu);
  const mega_grads_bucket *k = mega_grads_bucket_at(f->g, b);
  int last = 0;
  for (int i = 0; i < nu; i++)
    for (int j = 0; j < u[i].count; j++)
      if (u[i].first + j >= k->param_lo && u[i].first + j < k->param_hi && i + 1 > last)
        last = i + 1;
  return last;
}

static void run_iteration(fixture *f, watch *w, int micro, bool split) {
  mega_err err = {0};
  mega_gpt_acts *a;
  assert_int_equal(mega_gpt_acts_create(f->stage, B, T, &a, &err), MEGA_OK);
  int32_t tokens[B * T], targets[B * T];
  assert_int_equal(mega_grads_start(f->g, &err), MEGA_OK);
  while (!mega_grads_zero(f->g, 1000)) { /* in slices, as the engine's waits do */
  }
  w->nlaunch = 0;
  for (int mb = 0; mb < micro; mb++) {
    bool last = mb == micro - 1;
    fx_ids(tokens, B * T, 256, 10 + (uint64_t)mb);
    fx_ids(targets, B * T, 256, 20 + (uint64_t)mb);
    double loss;
    assert_int_equal(mega_gpt_forward(f->stage, a, tokens, NULL, targets, NULL, &loss, &err),
                     MEGA_OK);
    mega_grads_enable(f->g, 0, last);
    w->units = 0;
    if (split) {
      assert_int_equal(mega_gpt_backward_input(f->stage, a, NULL, 0.01f, NULL, &err), MEGA_OK);
      assert_int_equal(w->nlaunch, 0); /* the input half finishes no gradient */
      assert_int_equal(mega_gpt_backward_weight(f->stage, a, &err), MEGA_OK);
    } else {
      assert_int_equal(mega_gpt_backward(f->stage, a, NULL, 0.01f, NULL, &err), MEGA_OK);
    }
    mega_grads_enable(f->g, 0, false);
    if (!last) assert_int_equal(w->nlaunch, 0); /* no_sync: nothing sent */
  }
  int n = w->nlaunch;
  assert_int_equal(mega_grads_launch(f->g, 0, &err), MEGA_OK);
  assert_int_equal(w->nlaunch, n); /* GRAD_SYNC finds nothing left */
  assert_int_equal(mega_grads_wait(f->g, 0, &err), MEGA_OK);
  mega_gpt_acts_destroy(a);
}

static void buckets_launch_once_during_last_backward(void **state) {
  (void)state;
  for (int split = 0; split < 2; split++) {
    fixture f;
    setup(&f, (mega_gpt_stage_desc){true, true, 0, 4},
          (mega_grads_opts){.dp_size = 1, .overlap = true, .bucket_size = 4000});
    watch w = {.g = f.g};
    mega_gpt_on_grads_done(f.stage, count_unit, &w);
    mega_grads_on_launch(f.g, record_launch, &w);
    int nb = mega_grads_num_buckets(f.g), nu;
    mega_gpt_units(f.stage, &nu);
    assert_true(nb >= 4);
    for (int it = 0; it < 2; it++) {
      run_iteration(&f, &w, 3, split != 0);
      /* each bucket exactly once, in order, as soon as its last layer
       * finished: all but the last while backward still had layers to go */
      assert_int_equal(w.nlaunch, nb);
      for (int i = 0; i < nb; i++) {
        assert_int_equal(w.bucket[i], i);
        assert_int_equal(w.at_unit[i], unit_completing(&f, i));
      }
      assert_true(w.at_unit[0] < nu - 2);
    }
    teardown(&f);
  }
  /* Without overlap the one bucket launches at the end of the backward. */
  fixture f;
  setup(&f, (mega_gpt_stage_desc){true, true, 0, 4}, (mega_grads_opts){.dp_size = 1});
  watch w = {.g = f.g};
  mega_gpt_on_grads_done(f.stage, count_unit, &w);
  mega_grads_on_launch(f.g, record_launch, &w);
  run_iteration(&f, &w, 2, false);
  int nu;
  mega_gpt_units(f.stage, &nu);
  assert_int_equal(w.nlaunch, 1);
  assert_int_equal(w.at_unit[0], nu);
  teardown(&f);
}

/* The norm's squares: posted bucket by bucket as each wait returns, the
 * rest (the tied embedding, late) at the end, and read back with one copy;
 * the bits of sum_squares over the optimizer's ranges added in range
 * order, with the posting ops or without. */
static void norm_posts_and_reads_back_once(void **state) {
  (void)state;
  double got[2];
  for (int ranges = 0; ranges < 2; ranges++) {
    fixture f;
    setup_counted(&f, (mega_gpt_stage_desc){true, true, 0, 4},
                  (mega_grads_opts){.dp_size = 1, .overlap = true, .bucket_size = 4000},
                  ranges != 0);
    watch w = {.g = f.g};
    mega_gpt_on_grads_done(f.stage, count_unit, &w);
    int nb = mega_grads_num_buckets(f.g);
    assert_true(nb >= 4);
    run_iteration(&f, &w, 2, false);
    fx_counts waits = f.counts;
    mega_err err = {0};
    assert_int_equal(mega_grads_sumsq(f.g, &got[ranges], &err), MEGA_OK);
    assert_int_equal(f.counts.d2h - waits.d2h, 1);
    if (ranges) assert_int_equal(waits.d2h, 0); /* the waits did not wait for the device */
    if (ranges) {
      assert_int_equal(waits.sum_squares_post, nb);
      assert_int_equal(f.counts.sum_squares_post, nb + 1);
      assert_int_equal(f.counts.sum_squares, 0);
    }
    size_t n;
    const mega_optim_range *r = mega_grads_ranges(f.g, &n);
    double want = 0;
    for (size_t i = 0; i < n; i++) {
      double one;
      assert_int_equal(f.cpu->ops->sum_squares(f.cpu, r[i].grads, r[i].numel, &one, &err),
                       MEGA_OK);
      want += one;
    }
    assert_true(want > 0);
    assert_memory_equal(&got[ranges], &want, sizeof want);
    teardown(&f);
  }
}

/* Gradients counted as zero (mega_grads_still_zero: --simulate-compute,
 * whose backward writes none) have a norm of 0 without a pass over them,
 * until the next start: the one whose zeroing runs reads them again. The
 * buffer is written here against the contract, to show it is not read. */
static void still_zero_needs_no_norm_pass(void **state) {
  (void)state;
  fixture f;
  setup_counted(&f, (mega_gpt_stage_desc){true, true, 0, 4}, (mega_grads_opts){.dp_size = 1},
                true);
  float *grads = mega_gpt_grad_data(f.stage);
  mega_err err = {0};
  double sumsq = -1;
  for (int it = 0; it < 2; it++) {
    assert_int_equal(mega_grads_start(f.g, &err), MEGA_OK);
    if (it == 0) mega_grads_still_zero(f.g);
    else assert_true(mega_grads_zero(f.g, SIZE_MAX));
    grads[0] = 3.0f;
    fx_counts before = f.counts;
    assert_int_equal(mega_grads_wait(f.g, 0, &err), MEGA_OK);
    assert_int_equal(mega_grads_sumsq(f.g, &sumsq, &err), MEGA_OK);
    int posts = f.counts.sum_squares_post - before.sum_squares_post;
    if (it == 0) {
      assert_true(sumsq == 0.0);
      assert_int_equal(posts, 0);
      assert_int_equal(f.counts.d2h - before.d2h, 0);
    } else {
      assert_true(sumsq == 9.0);
      assert_true(posts > 0);
    }
  }
  teardown(&f);
}

/* mega_grads_zero zeroes the buffer slice by slice from its start, and
 * says when it is done; a backward before that is reported, not summed
 * into last iteration's gradients. */
static void zero_in_slices_and_backward_only_after(void **state) {
  (void)state;
  fixture f;
  setup(&f, (mega_gpt_stage_desc){true, true, 0, 4}, (mega_grads_opts){.dp_size = 1});
  float *grads = mega_gpt_grad_data(f.stage);
  size_t n = mega_grads_grad_bytes(f.g) / sizeof(float);
  assert_true(n > 3000);
  for (size_t i = 0; i < n; i++) grads[i] = 7.0f;
  mega_err err = {0};
  assert_int_equal(mega_grads_start(f.g, &err), MEGA_OK);
  assert_false(mega_grads_zero(f.g, 1000));
  assert_false(mega_grads_zero(f.g, 1000));
  assert_true(grads[1999] == 0.0f);
  assert_true(grads[2000] == 7.0f && grads[n - 1] == 7.0f);
  assert_true(mega_grads_zero(f.g, SIZE_MAX));
  for (size_t i = 0; i < n; i++)
    if (grads[i] != 0.0f) fail_msg("gradient %zu is %g after zeroing", i, grads[i]);
  assert_true(mega_grads_zero(f.g, 1)); /* done stays done */

  /* a backward into gradients not zeroed yet */
  mega_gpt_acts *a;
  assert_int_equal(mega_gpt_acts_create(f.stage, B, T, &a, &err), MEGA_OK);
  int32_t tokens[B * T], targets[B * T];
  fx_ids(tokens, B * T, 256, 1);
  fx_ids(targets, B * T, 256, 2);
  double loss;
  assert_int_equal(mega_grads_start(f.g, &err), MEGA_OK);
  assert_int_equal(mega_gpt_forward(f.stage, a, tokens, NULL, targets, NULL, &loss, &err), MEGA_OK);
  assert_int_equal(mega_gpt_backward(f.stage, a, NULL, 0.01f, NULL, &err), MEGA_OK);
  assert_int_equal(mega_grads_wait(f.g, 0, &err), MEGA_ERR_INTERNAL);
  assert_non_null(strstr(err.msg, "before mega_grads_zero"));
  mega_gpt_acts_destroy(a);
  teardown(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(layout_reverse_order_and_buckets),
      cmocka_unit_test(distributed_shards_cover_each_element_once),
      cmocka_unit_test(shard_copy_has_its_own_params),
      cmocka_unit_test(buckets_launch_once_during_last_backward),
      cmocka_unit_test(norm_posts_and_reads_back_once),
      cmocka_unit_test(still_zero_needs_no_norm_pass),
      cmocka_unit_test(zero_in_slices_and_backward_only_after),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
