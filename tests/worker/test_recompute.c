/* Activation recomputation (gpt.h's mega_gpt_recompute): full uniform,
 * full block and selective give bit-identical losses, outputs, input
 * gradients and parameter gradients to keeping every activation, with the
 * unit callbacks in the same order, on every kind of stage of GPT-2 and of
 * Llama, through the split backward in zero-bubble order (another
 * microbatch's backward_input between a backward_input and its
 * backward_weight), the interleaved mega_gpt_backward, and microbatches of
 * two lengths (the stage's scratch grows while acts point into it). And the
 * memory is really saved. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpt_fixture.h"

#define B 2
#define L 5   /* the model's layers */
#define NMB 5 /* microbatches per run */
#define MAX_EVENTS 4096

typedef struct run {
  double loss[NMB];
  float *out[NMB], *din[NMB]; /* [B*T*C] each, per microbatch */
  float *grad;
  size_t numel;
  int events[MAX_EVENTS], nevents; /* +first+1: grads done; -(first+1): params needed */
  size_t acts_bytes, scratch_bytes;
} run;

static void on_done(void *arg, int first, int count) {
  (void)count;
  run *r = arg;
  assert_true(r->nevents < MAX_EVENTS);
  r->events[r->nevents++] = first + 1;
}

static void on_needed(void *arg, int first, int count) {
  (void)count;
  run *r = arg;
  assert_true(r->nevents < MAX_EVENTS);
  r->events[r->nevents++] = -(first + 1);
}

static const int lens[NMB] = {4, 8, 8, 4, 8}; /* the second grows the scratch */

static void bwd_input(fx_probe *p) {
  const mega_gpt_stage_desc *d = mega_gpt_stage_desc_get(p->s);
  mega_err err = {0};
  if (mega_gpt_backward_input(p->s, p->a, d->loss ? NULL : p->R, 1.0f / (float)(B * p->T),
                              d->embedding ? NULL : p->dinput, &err) != MEGA_OK)
    fail_msg("backward_input: %s", err.msg);
}

static void bwd_weight(fx_probe *p) {
  mega_err err = {0};
  if (mega_gpt_backward_weight(p->s, p->a, &err) != MEGA_OK)
    fail_msg("backward_weight: %s", err.msg);
}

static void bwd_both(fx_probe *p) {
  const mega_gpt_stage_desc *d = mega_gpt_stage_desc_get(p->s);
  mega_err err = {0};
  if (mega_gpt_backward(p->s, p->a, d->loss ? NULL : p->R, 1.0f / (float)(B * p->T),
                        d->embedding ? NULL : p->dinput, &err) != MEGA_OK)
    fail_msg("backward: %s", err.msg);
}

/* The architecture make_stage builds: the tests run as GPT-2 and again as
 * the untied Llama (the group's setup sets it), and both again with hidden
 * dropout, then with attention dropout, whose masks the reruns must
 * regenerate. */
static fx_model variant = FX_GPT2;
static double dropout = 0.0, attn_dropout = 0.0;

/* A stage of the L-layer model on a fresh cpu backend. */
static mega_gpt_stage *make_stage(const mega_gpt_stage_desc *d, mega_backend **be) {
  mega_err err = {0};
  mega_gpt_config cfg;
  mega_gpt_stage *s;
  fx_model_config(&cfg, 0.2f, variant);
  cfg.num_layers = L;
  cfg.hidden_dropout = dropout;
  cfg.attention_dropout = attn_dropout;
  assert_int_equal(mega_backend_cpu_create(NULL, be, &err), MEGA_OK);
  if (mega_gpt_stage_create(*be, &cfg, d, &s, &err) != MEGA_OK) fail_msg("%s", err.msg);
  return s;
}

/* With d.split_backward, microbatches 0-2 in zero-bubble order (F0 F1 F2
 * Bi0 Bi1 W0 Bi2 W2 W1), else with the interleaved backward (F0 F1 F2 B1
 * B0 B2); then 3-4 with the interleaved backward (F3 F4 B4 B3). */
static void run_stage(mega_gpt_stage_desc d, run *r) {
  mega_backend *be;
  mega_gpt_stage *s = make_stage(&d, &be);
  mega_gpt_config cfg = *mega_gpt_stage_config(s);
  memset(r, 0, sizeof *r);
  mega_gpt_on_grads_done(s, on_done, r);
  mega_gpt_on_params_needed(s, on_needed, r);
  fx_probe p[NMB];
  for (int m = 0; m < NMB; m++) {
    fx_probe_init(&p[m], s, B, lens[m], 100 + 10 * (uint64_t)m);
    mega_gpt_acts_set_samples(p[m].a, B * m); /* no effect without dropout */
  }
  for (int m = 0; m < 3; m++) fx_probe_forward(&p[m], &r->loss[m]);
  if (d.split_backward) {
    bwd_input(&p[0]);
    bwd_input(&p[1]);
    bwd_weight(&p[0]);
    bwd_input(&p[2]);
    bwd_weight(&p[2]);
    bwd_weight(&p[1]);
  } else {
    bwd_both(&p[1]);
    bwd_both(&p[0]);
    bwd_both(&p[2]);
  }
  fx_probe_forward(&p[3], &r->loss[3]);
  fx_probe_forward(&p[4], &r->loss[4]);
  bwd_both(&p[4]);
  bwd_both(&p[3]);
  for (int m = 0; m < NMB; m++) {
    size_t n = (size_t)B * lens[m] * cfg.channels * sizeof(float);
    r->out[m] = malloc(n);
    r->din[m] = malloc(n);
    assert_non_null(r->out[m]);
    assert_non_null(r->din[m]);
    memcpy(r->out[m], p[m].output, n);
    memcpy(r->din[m], p[m].dinput, n);
  }
  r->acts_bytes = mega_gpt_acts_bytes(p[1].a); /* a T = 8 one */
  r->scratch_bytes = mega_gpt_scratch_bytes(s);
  r->numel = mega_gpt_num_params(s);
  r->grad = malloc(r->numel * sizeof(float));
  assert_non_null(r->grad);
  memcpy(r->grad, mega_gpt_grad_data(s), r->numel * sizeof(float));
  for (int m = 0; m < NMB; m++) fx_probe_free(&p[m]);
  mega_gpt_stage_destroy(s);
  mega_backend_destroy(be);
}

static void run_free(run *r) {
  for (int m = 0; m < NMB; m++) {
    free(r->out[m]);
    free(r->din[m]);
  }
  free(r->grad);
}

static void assert_same(const run *want, const run *got, const char *what) {
  for (int m = 0; m < NMB; m++) {
    size_t n = (size_t)B * lens[m] * 16 * sizeof(float);
    if (memcmp(&want->loss[m], &got->loss[m], sizeof(double)))
      fail_msg("%s: microbatch %d loss %.17g, want %.17g", what, m, got->loss[m], want->loss[m]);
    if (memcmp(want->out[m], got->out[m], n)) fail_msg("%s: microbatch %d output differs", what, m);
    if (memcmp(want->din[m], got->din[m], n)) fail_msg("%s: microbatch %d dinput differs", what, m);
  }
  assert_int_equal(want->numel, got->numel);
  for (size_t i = 0; i < want->numel; i++)
    if (memcmp(&want->grad[i], &got->grad[i], sizeof(float)))
      fail_msg("%s: grad[%zu] = %.9g, want %.9g", what, i, (double)got->grad[i],
               (double)want->grad[i]);
  assert_int_equal(want->nevents, got->nevents);
  assert_memory_equal(want->events, got->events, sizeof(int) * (size_t)want->nevents);
}

typedef struct mode {
  const char *name;
  mega_gpt_recompute kind;
  int n;
  bool scratch_smaller; /* acts + scratch below keeping everything */
} mode;

static const mode modes[] = {
    {"full uniform 1", MEGA_GPT_RECOMPUTE_UNIFORM, 1, true},
    {"full uniform 2", MEGA_GPT_RECOMPUTE_UNIFORM, 2, true},
    {"full uniform 9", MEGA_GPT_RECOMPUTE_UNIFORM, 9, false}, /* one group: the whole chunk */
    {"full block 2", MEGA_GPT_RECOMPUTE_BLOCK, 2, true},
    {"full block 9", MEGA_GPT_RECOMPUTE_BLOCK, 9, true}, /* every block, each alone */
    {"selective", MEGA_GPT_RECOMPUTE_SELECTIVE, 0, true},
};

static void check_stage_split(mega_gpt_stage_desc d) {
  run none, got;
  run_stage(d, &none);
  assert_int_equal(none.scratch_bytes, 0);
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    mega_gpt_stage_desc dm = d;
    dm.recompute = modes[i].kind;
    dm.recompute_layers = modes[i].n;
    run_stage(dm, &got);
    char what[96];
    snprintf(what, sizeof what, "%s (stage layers %d..%d, emb %d, loss %d%s)", modes[i].name,
             d.first_layer, d.first_layer + d.num_layers - 1, d.embedding, d.loss,
             d.split_backward ? ", split backward" : "");
    assert_same(&none, &got, what);
    if (d.num_layers > 1) {
      /* each microbatch in flight holds less; the scratch is once per stage */
      if (!(got.acts_bytes < none.acts_bytes))
        fail_msg("%s: acts %zu bytes, no less than %zu", what, got.acts_bytes, none.acts_bytes);
      assert_true(got.scratch_bytes > 0);
      if (modes[i].scratch_smaller && !(got.acts_bytes + got.scratch_bytes < none.acts_bytes))
        fail_msg("%s: acts %zu + scratch %zu bytes, no less than %zu", what, got.acts_bytes,
                 got.scratch_bytes, none.acts_bytes);
    }
    run_free(&got);
  }
  run_free(&none);
}

/* Both ways of running backward: the halves apart and interleaved. */
static void check_stage(mega_gpt_stage_desc d) {
  d.split_backward = true;
  check_stage_split(d);
  d.split_backward = false;
  check_stage_split(d);
}

static void whole_model(void **state) {
  (void)state;
  check_stage((mega_gpt_stage_desc){.embedding = true, .loss = true, .num_layers = L});
}

static void first_stage(void **state) {
  (void)state;
  check_stage((mega_gpt_stage_desc){.embedding = true, .num_layers = 3});
}

/* Its last group's output is the caller's buffer: the rerun must not
 * write it. */
static void middle_stage(void **state) {
  (void)state;
  check_stage((mega_gpt_stage_desc){.first_layer = 1, .num_layers = 3});
}

static void last_stage(void **state) {
  (void)state;
  check_stage((mega_gpt_stage_desc){.loss = true, .first_layer = 2, .num_layers = 3});
}

/* Stages without blocks keep working and need no scratch. */
static void no_blocks(void **state) {
  (void)state;
  check_stage((mega_gpt_stage_desc){.loss = true, .first_layer = L, .num_layers = 0});
}

/* The more layers a group reruns, the less the acts keep: uniform N
 * keeps one input per group; block N keeps every block past the first N. */
static void bytes_order(void **state) {
  (void)state;
  mega_gpt_stage_desc d = {.embedding = true, .loss = true, .num_layers = L};
  run r[4];
  const mode m[4] = {{"none", MEGA_GPT_RECOMPUTE_NONE, 0, 0},
                     {"block 1", MEGA_GPT_RECOMPUTE_BLOCK, 1, 0},
                     {"block 3", MEGA_GPT_RECOMPUTE_BLOCK, 3, 0},
                     {"uniform 1", MEGA_GPT_RECOMPUTE_UNIFORM, 1, 0}};
  for (int i = 0; i < 4; i++) {
    d.recompute = m[i].kind;
    d.recompute_layers = m[i].n;
    run_stage(d, &r[i]);
  }
  assert_true(r[1].acts_bytes < r[0].acts_bytes);
  assert_true(r[2].acts_bytes < r[1].acts_bytes);
  assert_true(r[3].acts_bytes < r[2].acts_bytes);
  /* block 1, block 3 and uniform 1 all rerun one block at a time */
  assert_int_equal(r[1].scratch_bytes, r[2].scratch_bytes);
  assert_int_equal(r[1].scratch_bytes, r[3].scratch_bytes);
  for (int i = 0; i < 4; i++) run_free(&r[i]);
}

/* Without split_backward, full recomputation keeps a rerun block's output
 * gradients in the shared scratch, so less stays per microbatch, and the
 * halves refuse to run apart. */
static void split_backward(void **state) {
  (void)state;
  mega_gpt_stage_desc d = {.embedding = true, .loss = true, .num_layers = L,
                           .recompute = MEGA_GPT_RECOMPUTE_UNIFORM, .recompute_layers = 1};
  run apart, joined;
  d.split_backward = true;
  run_stage(d, &apart);
  d.split_backward = false;
  run_stage(d, &joined);
  assert_true(joined.acts_bytes < apart.acts_bytes);
  assert_true(joined.scratch_bytes > apart.scratch_bytes);
  run_free(&apart);
  run_free(&joined);

  mega_err err = {0};
  mega_backend *be;
  mega_gpt_stage *s = make_stage(&d, &be);
  fx_probe p;
  fx_probe_init(&p, s, B, 8, 5);
  double loss;
  fx_probe_forward(&p, &loss);
  assert_int_equal(mega_gpt_backward_input(s, p.a, NULL, 0.1f, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "split_backward"));
  bwd_both(&p); /* the acts are still good for the joined backward */
  fx_probe_free(&p);
  mega_gpt_stage_destroy(s);
  mega_backend_destroy(be);
}

static void bad_desc(void **state) {
  (void)state;
  mega_err err = {0};
  mega_backend *be;
  mega_gpt_config cfg;
  mega_gpt_stage *s = NULL;
  fx_config(&cfg, 0.2f);
  assert_int_equal(mega_backend_cpu_create(NULL, &be, &err), MEGA_OK);
  mega_gpt_stage_desc d = {.embedding = true, .loss = true, .num_layers = 2,
                           .recompute = MEGA_GPT_RECOMPUTE_UNIFORM};
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &d, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "recompute_layers"));
  d.recompute = (mega_gpt_recompute)7;
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &d, &s, &err), MEGA_ERR_INVALID);
  mega_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(whole_model), cmocka_unit_test(first_stage),
      cmocka_unit_test(middle_stage), cmocka_unit_test(last_stage),
      cmocka_unit_test(no_blocks),   cmocka_unit_test(bytes_order),
      cmocka_unit_test(split_backward),
      cmocka_unit_test(bad_desc),
  };
  int failed = cmocka_run_group_tests_name("gpt-2", tests, NULL, NULL);
  variant = FX_LLAMA;
  failed += cmocka_run_group_tests_name("llama", tests, NULL, NULL);
  dropout = 0.2;
  failed += cmocka_run_group_tests_name("llama, hidden dropout", tests, NULL, NULL);
  variant = FX_GPT2;
  failed += cmocka_run_group_tests_name("gpt-2, hidden dropout", tests, NULL, NULL);
  dropout = 0.0;
  attn_dropout = 0.2;
  failed += cmocka_run_group_tests_name("gpt-2, attention dropout", tests, NULL, NULL);
  variant = FX_LLAMA;
  return failed + cmocka_run_group_tests_name("llama, attention dropout", tests, NULL, NULL);
}
