/* A stage's parameters: the Hugging Face tables of GPT-2 and Llama (names,
 * shapes, weight decay, offsets in the flat buffer) and their initial
 * values (norms 1, biases 0, projections at std/sqrt(2L)), and a
 * tensor-parallel stage's as its slices of the whole stage's. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpt_fixture.h"

/* The whole model of 4 layers (init std 0.2) on a cpu backend of its own. */
static mega_gpt_stage *whole_stage(fx_model variant, mega_backend **be) {
  mega_err err = {0};
  mega_gpt_config cfg;
  fx_model_config(&cfg, 0.2f, variant);
  cfg.num_layers = 4;
  mega_gpt_stage_desc d = {true, true, 0, 4};
  mega_gpt_stage *s;
  assert_int_equal(mega_backend_cpu_create(NULL, be, &err), MEGA_OK);
  if (mega_gpt_stage_create(*be, &cfg, &d, &s, &err)) fail_msg("%s", err.msg);
  return s;
}

static void free_stage(mega_gpt_stage *s, mega_backend *be) {
  mega_gpt_stage_destroy(s);
  mega_backend_destroy(be);
}

static void param_table_is_hf_order_and_shapes(void **state) {
  (void)state;
  mega_backend *be;
  mega_gpt_stage *st = whole_stage(FX_GPT2, &be);
  int np;
  const mega_param_info *p = mega_gpt_params(st, &np);
  assert_int_equal(np, 2 + 12 * 4 + 2);
  assert_string_equal(p[0].name, "transformer.wte.weight");
  assert_int_equal(p[0].shape[0], 256);
  assert_int_equal(p[0].shape[1], 16);
  assert_string_equal(p[1].name, "transformer.wpe.weight");
  assert_string_equal(p[2].name, "transformer.h.0.ln_1.weight");
  assert_string_equal(p[4].name, "transformer.h.0.attn.c_attn.weight");
  assert_int_equal(p[4].shape[0], 16);
  assert_int_equal(p[4].shape[1], 48);
  assert_true(p[4].decay);
  assert_false(p[5].decay);
  assert_string_equal(p[12].name, "transformer.h.0.mlp.c_proj.weight");
  assert_int_equal(p[12].shape[0], 64);
  assert_string_equal(p[np - 1].name, "transformer.ln_f.bias");
  size_t end = 0;
  for (int i = 0; i < np; i++) {
    assert_true(p[i].offset >= end);
    end = p[i].offset + p[i].numel;
  }
  assert_true(end <= mega_gpt_num_params(st));
  /* initialisation: LN weights 1, biases 0, projections at std/sqrt(2L) */
  const float *w = mega_gpt_param_data(st);
  assert_true(w[p[2].offset] == 1.0f && w[p[3].offset] == 0.0f);
  double v4 = 0, v12 = 0;
  for (size_t i = 0; i < p[4].numel; i++) v4 += (double)w[p[4].offset + i] * w[p[4].offset + i];
  for (size_t i = 0; i < p[12].numel; i++)
    v12 += (double)w[p[12].offset + i] * w[p[12].offset + i];
  double std4 = sqrt(v4 / p[4].numel), std12 = sqrt(v12 / p[12].numel);
  printf("# c_attn std %.4f (want 0.2), mlp.c_proj std %.4f (want %.4f)\n", std4, std12,
         0.2 / sqrt(8.0));
  assert_true(fabs(std4 - 0.2) < 0.02);
  assert_true(fabs(std12 - 0.2 / sqrt(8.0)) < 0.01);
  free_stage(st, be);
}

/* Llama's Hugging Face names, shapes (nn.Linear: [out, in]) and init. */
static void llama_param_table(void **state) {
  (void)state;
  mega_backend *be;
  mega_gpt_stage *st = whole_stage(FX_LLAMA, &be);
  int np;
  const mega_param_info *p = mega_gpt_params(st, &np);
  assert_int_equal(np, 1 + 9 * 4 + 2);
  static const char *const names[] = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
  };
  static const int shapes[][2] = {{256, 16}, {16, 0}, {24, 16}, {12, 16}, {12, 16},
                                  {16, 24},  {16, 0}, {24, 16}, {24, 16}, {16, 24}};
  for (int i = 0; i < 10; i++) {
    assert_string_equal(p[i].name, names[i]);
    assert_int_equal(p[i].shape[0], shapes[i][0]);
    assert_int_equal(p[i].shape[1], shapes[i][1]);
    assert_true(p[i].decay == (shapes[i][1] != 0));
  }
  assert_string_equal(p[np - 2].name, "model.norm.weight");
  assert_string_equal(p[np - 1].name, "lm_head.weight");
  const float *w = mega_gpt_param_data(st);
  assert_true(w[p[1].offset] == 1.0f && w[p[np - 2].offset] == 1.0f);
  double v5 = 0;
  for (size_t i = 0; i < p[5].numel; i++) v5 += (double)w[p[5].offset + i] * w[p[5].offset + i];
  printf("# o_proj std %.4f (want %.4f)\n", sqrt(v5 / p[5].numel), 0.2 / sqrt(8.0));
  assert_true(fabs(sqrt(v5 / p[5].numel) - 0.2 / sqrt(8.0)) < 0.02);
  free_stage(st, be);
}

/* Every parameter of a TP=2 stage starts as its slice of the TP=1 stage's
 * (mega_tp_cut), bit for bit: the draws made where the parameters live
 * (init_normal) at tp_split.h's full index, for GPT-2's rows, columns and
 * fused QKV and Llama's q, k, v, gate and up, on a pool of three threads. */
static void tp_slices_start_as_the_whole(void **state) {
  (void)state;
  mega_err err = {0};
  mega_backend_cpu_opts o = {.threads = 3};
  mega_backend *be;
  assert_int_equal(mega_backend_cpu_create(&o, &be, &err), MEGA_OK);
  for (int m = 0; m < 2; m++) {
    mega_gpt_config cfg;
    fx_model_config(&cfg, 0.02f, m ? FX_LLAMA : FX_GPT2);
    mega_gpt_stage_desc whole = {true, true, 0, cfg.num_layers};
    mega_gpt_stage *s1;
    if (mega_gpt_stage_create(be, &cfg, &whole, &s1, &err)) fail_msg("%s", err.msg);
    for (int r = 0; r < 2; r++) {
      mega_gpt_stage_desc d = {true, true, 0, cfg.num_layers, {2, r, false, &fx_tp_noop, NULL}};
      mega_gpt_stage *s2;
      if (mega_gpt_stage_create(be, &cfg, &d, &s2, &err)) fail_msg("tp rank %d: %s", r, err.msg);
      int np;
      const mega_param_info *p = mega_gpt_params(s2, &np);
      for (int i = 0; i < np; i++) {
        const mega_param_info *f = mega_gpt_param_find(s1, p[i].name);
        assert_non_null(f);
        float *want = malloc(p[i].numel * sizeof *want);
        mega_tp_cut(&p[i].tp, 2, r, mega_gpt_param_data(s1) + f->offset, want);
        if (memcmp(want, mega_gpt_param_data(s2) + p[i].offset, p[i].numel * sizeof *want))
          fail_msg("%s, tp rank %d: not its slice of the whole", p[i].name, r);
        free(want);
      }
      mega_gpt_stage_destroy(s2);
    }
    mega_gpt_stage_destroy(s1);
  }
  mega_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(param_table_is_hf_order_and_shapes),
      cmocka_unit_test(llama_param_table),
      cmocka_unit_test(tp_slices_start_as_the_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
