/* PyTorch parity, llm.c style: a committed tiny checkpoint
 * (tests/ref/gpt_tiny.safetensors or llama_tiny.safetensors, written by this
 * program's --write-ckpt mode) goes through our forward and backward, and
 * the logits, loss and every gradient must match what tests/ref/make_ref.py
 * computed with PyTorch in float64 (tests/ref/{gpt,llama}_tiny_ref
 * .safetensors). The model's config travels in the checkpoint's metadata
 * (tests/ref/ref_config.h).
 *
 *   test_parity CKPT REF                    run the tests
 *   test_parity --write-ckpt CKPT [llama]   (re)write the checkpoint: GPT-2,
 *                                           or the Llama (2 layers, hidden
 *                                           64, 4 heads over 2 query groups,
 *                                           SwiGLU of 128, RMSNorm, RoPE,
 *                                           untied, no biases) */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpt_fixture.h"
#include "tests/ref/ref_config.h"
#include "worker/model/safetensors.h"

#define B 2
#define T 12 /* < max_seq_len: wpe's last rows get no gradient */

static const char *ckpt_path, *ref_path;

static void parity_config(mega_gpt_config *cfg, bool llama) {
  mega_gpt_config_default(cfg);
  cfg->vocab_size = 256;
  cfg->max_seq_len = 16;
  cfg->num_layers = 2;
  cfg->num_heads = 4;
  cfg->channels = 32;
  cfg->init_std = 0.1f;
  cfg->seed = 42;
  if (!llama) return;
  cfg->arch = MEGA_GPT_ARCH_LLAMA;
  cfg->channels = 64;
  cfg->num_kv_heads = 2;
  cfg->ffn_hidden = 128;
  cfg->untied = true;
  cfg->no_bias = true;
}

static int write_ckpt(const char *path, bool llama) {
  mega_err err = {0};
  mega_backend *be;
  mega_gpt_stage *s;
  mega_gpt_config cfg;
  parity_config(&cfg, llama);
  mega_gpt_stage_desc whole = {true, true, 0, cfg.num_layers};
  if (mega_backend_cpu_create(NULL, &be, &err) ||
      mega_gpt_stage_create(be, &cfg, &whole, &s, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  int np;
  const mega_param_info *p = mega_gpt_params(s, &np);
  mega_st_tensor *ts = calloc((size_t)np + 2, sizeof *ts);
  int32_t tok[B * T], tgt[B * T];
  float ftok[B * T], ftgt[B * T];
  fx_ids(tok, B * T, cfg.vocab_size, 11);
  fx_ids(tgt, B * T, cfg.vocab_size, 12);
  for (int i = 0; i < B * T; i++) {
    ftok[i] = (float)tok[i];
    ftgt[i] = (float)tgt[i];
  }
  for (int i = 0; i < np; i++)
    ts[i] = (mega_st_tensor){.name = p[i].name, .ndim = p[i].ndim,
                             .shape = {p[i].shape[0], p[i].shape[1]}, .numel = p[i].numel,
                             .data = mega_gpt_param_data(s) + p[i].offset};
  ts[np] = (mega_st_tensor){"input.tokens", 2, {B, T}, B * T, ftok};
  ts[np + 1] = (mega_st_tensor){"input.targets", 2, {B, T}, B * T, ftgt};
  char v[REF_META_N][32];
  mega_st_meta meta[REF_META_N];
  size_t nmeta = ref_config_meta(&cfg, meta, v);
  int rc = mega_st_write(path, ts, (size_t)np + 2, meta, nmeta, &err) != MEGA_OK;
  if (rc) fprintf(stderr, "%s\n", err.msg);
  free(ts);
  mega_gpt_stage_destroy(s);
  mega_backend_destroy(be);
  return rc;
}

typedef struct parity {
  mega_backend *be;
  mega_st_file *ckpt, *ref;
  mega_gpt_stage *s;
  mega_gpt_acts *a;
  int32_t tok[B * T], tgt[B * T];
} parity;

static void open_all(parity *p) {
  mega_err err = {0};
  memset(p, 0, sizeof *p);
  if (mega_st_open(ckpt_path, &p->ckpt, &err) || mega_st_open(ref_path, &p->ref, &err))
    fail_msg("%s", err.msg);
  mega_gpt_config cfg;
  ref_config_read(p->ckpt, &cfg);
  mega_gpt_stage_desc whole = {true, true, 0, cfg.num_layers};
  assert_int_equal(mega_backend_cpu_create(NULL, &p->be, &err), MEGA_OK);
  assert_int_equal(mega_gpt_stage_create(p->be, &cfg, &whole, &p->s, &err), MEGA_OK);
  const mega_st_file *files[1] = {p->ckpt};
  if (mega_gpt_load_safetensors(p->s, files, 1, &err)) fail_msg("%s", err.msg);
  assert_int_equal(mega_gpt_acts_create(p->s, B, T, &p->a, &err), MEGA_OK);
  float f[B * T];
  int64_t shape[2] = {B, T};
  assert_int_equal(mega_st_read_f32(p->ckpt, "input.tokens", f, B * T, shape, 2, &err), 0);
  for (int i = 0; i < B * T; i++) p->tok[i] = (int32_t)f[i];
  assert_int_equal(mega_st_read_f32(p->ckpt, "input.targets", f, B * T, shape, 2, &err), 0);
  for (int i = 0; i < B * T; i++) p->tgt[i] = (int32_t)f[i];
}

static void close_all(parity *p) {
  mega_gpt_acts_destroy(p->a);
  mega_gpt_stage_destroy(p->s);
  mega_backend_destroy(p->be);
  mega_st_close(p->ckpt);
  mega_st_close(p->ref);
}

/* |ours - ref| <= tol * max|ref| elementwise, reported with the worst. */
static double compare(const char *name, const float *ours, const mega_st_file *ref,
                      const char *refname, size_t n, double tol) {
  float *want = malloc(n * sizeof *want);
  mega_err err = {0};
  assert_non_null(want);
  if (mega_st_read_f32(ref, refname, want, n, NULL, 0, &err)) fail_msg("%s", err.msg);
  double scale = 0.0, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)ours[i] - want[i]);
    if (d > worst) {
      worst = d;
      at = i;
    }
  }
  double rel = scale > 0 ? worst / scale : worst;
  if (rel > tol)
    fail_msg("%s[%zu]: ours %.9g, PyTorch %.9g (error %.3g of max |ref| %.3g, allowed %.3g)",
             name, at, ours[at], want[at], rel, scale, tol);
  free(want);
  return rel;
}

static void forward_and_backward_match_pytorch(void **state) {
  (void)state;
  parity p;
  open_all(&p);
  mega_err err = {0};
  double loss_sum;
  /* the logits from a forward without targets (a loss writes over them) */
  assert_int_equal(mega_gpt_forward(p.s, p.a, p.tok, NULL, NULL, NULL, NULL, &err), 0);
  double worst = compare("logits", mega_gpt_acts_logits(p.a), p.ref, "logits",
                         (size_t)B * T * 256, 1e-5);
  assert_int_equal(mega_gpt_forward(p.s, p.a, p.tok, NULL, p.tgt, NULL, &loss_sum, &err), 0);
  float loss = (float)(loss_sum / (B * T)), want;
  assert_int_equal(mega_st_read_f32(p.ref, "loss", &want, 1, NULL, 0, &err), MEGA_OK);
  printf("# loss ours %.7f PyTorch %.7f\n", (double)loss, (double)want);
  assert_true(fabsf(loss - want) <= 1e-5f * fabsf(want));
  mega_gpt_zero_grad(p.s);
  assert_int_equal(mega_gpt_backward_input(p.s, p.a, NULL, 1.0f / (B * T), NULL, &err), 0);
  assert_int_equal(mega_gpt_backward_weight(p.s, p.a, &err), 0);
  int np;
  const mega_param_info *pi = mega_gpt_params(p.s, &np);
  for (int i = 0; i < np; i++) {
    char refname[80];
    snprintf(refname, sizeof refname, "grad.%s", pi[i].name);
    double r = compare(pi[i].name, mega_gpt_grad_data(p.s) + pi[i].offset, p.ref, refname,
                       pi[i].numel, 2e-5);
    worst = fmax(worst, r);
  }
  printf("# %d gradients and the logits match; worst error %.2g of the tensor's max\n", np,
         worst);
  close_all(&p);
}

/* The same through a 2-stage split: a tied wte's gradient is the sum. */
static void split_stages_match_pytorch(void **state) {
  (void)state;
  parity p;
  open_all(&p);
  mega_err err = {0};
  mega_gpt_config cfg = *mega_gpt_stage_config(p.s);
  mega_gpt_stage_desc d0 = {true, false, 0, 1}, d1 = {false, true, 1, 1};
  mega_gpt_stage *s0, *s1;
  mega_gpt_acts *a0, *a1;
  const mega_st_file *files[1] = {p.ckpt};
  assert_int_equal(mega_gpt_stage_create(p.be, &cfg, &d0, &s0, &err), 0);
  assert_int_equal(mega_gpt_stage_create(p.be, &cfg, &d1, &s1, &err), 0);
  assert_int_equal(mega_gpt_load_safetensors(s0, files, 1, &err), 0);
  assert_int_equal(mega_gpt_load_safetensors(s1, files, 1, &err), 0);
  assert_int_equal(mega_gpt_acts_create(s0, B, T, &a0, &err), 0);
  assert_int_equal(mega_gpt_acts_create(s1, B, T, &a1, &err), 0);
  size_t NC = (size_t)B * T * cfg.channels;
  float *x = malloc(NC * sizeof *x), *dx = malloc(NC * sizeof *dx);
  double loss_sum;
  assert_int_equal(mega_gpt_forward(s0, a0, p.tok, NULL, NULL, x, NULL, &err), 0);
  assert_int_equal(mega_gpt_forward(s1, a1, NULL, x, p.tgt, NULL, &loss_sum, &err), 0);
  assert_int_equal(mega_gpt_backward_input(s1, a1, NULL, 1.0f / (B * T), dx, &err), 0);
  assert_int_equal(mega_gpt_backward_input(s0, a0, dx, 0.0f, NULL, &err), 0);
  assert_int_equal(mega_gpt_backward_weight(s1, a1, &err), 0);
  assert_int_equal(mega_gpt_backward_weight(s0, a0, &err), 0);
  assert_int_equal(mega_gpt_forward(s1, a1, NULL, x, NULL, NULL, NULL, &err), 0);
  compare("logits", mega_gpt_acts_logits(a1), p.ref, "logits", (size_t)B * T * 256, 1e-5);
  mega_gpt_stage *stages[2] = {s0, s1};
  int checked = 0;
  int np;
  const mega_param_info *all = mega_gpt_params(p.s, &np);
  for (int i = 0; i < np; i++) {
    float *sum = calloc(all[i].numel, sizeof *sum);
    for (int k = 0; k < 2; k++) {
      const mega_param_info *pi = mega_gpt_param_find(stages[k], all[i].name);
      if (!pi) continue;
      for (size_t j = 0; j < pi->numel; j++) sum[j] += mega_gpt_grad_data(stages[k])[pi->offset + j];
      checked++;
    }
    char refname[80];
    snprintf(refname, sizeof refname, "grad.%s", all[i].name);
    compare(all[i].name, sum, p.ref, refname, all[i].numel, 2e-5);
    free(sum);
  }
  assert_int_equal(checked, np + (cfg.untied ? 0 : 1)); /* a tied wte twice */
  free(x);
  free(dx);
  mega_gpt_acts_destroy(a0);
  mega_gpt_acts_destroy(a1);
  mega_gpt_stage_destroy(s0);
  mega_gpt_stage_destroy(s1);
  close_all(&p);
}

/* The committed checkpoint is today's initialisation: the init (and so
 * every run's starting point) has not drifted. */
static void checkpoint_is_current_init(void **state) {
  (void)state;
  parity p;
  open_all(&p);
  mega_err err = {0};
  mega_gpt_stage *fresh;
  assert_int_equal(mega_gpt_stage_create(p.be, mega_gpt_stage_config(p.s),
                                         mega_gpt_stage_desc_get(p.s), &fresh, &err), 0);
  /* equal to the last bit on glibc; allow a libm that rounds differently */
  const float *a = mega_gpt_param_data(fresh), *b = mega_gpt_param_data(p.s);
  for (size_t i = 0; i < mega_gpt_num_params(fresh); i++)
    if (fabsf(a[i] - b[i]) > 1e-6f * fabsf(b[i]))
      fail_msg("param float %zu: init gives %.9g, the checkpoint holds %.9g", i, a[i], b[i]);
  mega_gpt_stage_destroy(fresh);
  close_all(&p);
}

int main(int argc, char **argv) {
  if ((argc == 3 || argc == 4) && strcmp(argv[1], "--write-ckpt") == 0)
    return write_ckpt(argv[2], argc == 4 && !strcmp(argv[3], "llama"));
  if (argc != 3) {
    fprintf(stderr, "usage: %s CKPT REF | --write-ckpt CKPT [llama]\n", argv[0]);
    return 2;
  }
  ckpt_path = argv[1];
  ref_path = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(forward_and_backward_match_pytorch),
      cmocka_unit_test(split_stages_match_pytorch),
      cmocka_unit_test(checkpoint_is_current_init),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
