/* Stage equivalence: a model split into pipeline stages computes the same
 * initial weights, loss and gradients as the single stage; and the stage
 * API's contracts (the split backward, the fused classifier, errors on bad
 * configs and calls). The parameter tables and their initial values are
 * test_params.c's. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "gpt_fixture.h"

#define B 2
#define T 8

typedef struct model {
  mega_backend *be;
  mega_gpt_config cfg;
  int n;
  mega_gpt_stage *st[4];
  mega_gpt_acts *acts[4];
} model;

/* The architecture model_init builds (gpt_fixture.h). */
static fx_model variant = FX_GPT2;

static void model_init(model *m, const mega_gpt_stage_desc *descs, int n) {
  mega_err err = {0};
  memset(m, 0, sizeof *m);
  fx_model_config(&m->cfg, 0.2f, variant);
  m->cfg.num_layers = 4;
  assert_int_equal(mega_backend_cpu_create(NULL, &m->be, &err), MEGA_OK);
  m->n = n;
  for (int i = 0; i < n; i++) {
    if (mega_gpt_stage_create(m->be, &m->cfg, &descs[i], &m->st[i], &err) != MEGA_OK)
      fail_msg("stage %d: %s", i, err.msg);
    if (mega_gpt_acts_create(m->st[i], B, T, &m->acts[i], &err) != MEGA_OK)
      fail_msg("acts %d: %s", i, err.msg);
  }
}

static void model_free(model *m) {
  for (int i = 0; i < m->n; i++) {
    mega_gpt_acts_destroy(m->acts[i]);
    mega_gpt_stage_destroy(m->st[i]);
  }
  mega_backend_destroy(m->be);
}

/* Runs forward and both backward halves through every stage in pipeline
 * order, passing activations and their gradients along, the loss's gradient
 * scaled by loss_scale; returns the loss. */
static double model_step_scaled(model *m, const int32_t *tokens, const int32_t *targets,
                                float loss_scale) {
  mega_err err = {0};
  size_t NC = (size_t)B * T * m->cfg.channels;
  float *x = calloc(NC, sizeof *x), *y = calloc(NC, sizeof *y);
  assert_non_null(x);
  assert_non_null(y);
  double loss = NAN;
  for (int i = 0; i < m->n; i++) {
    bool first = i == 0, last = i == m->n - 1;
    mega_gpt_zero_grad(m->st[i]);
    if (mega_gpt_forward(m->st[i], m->acts[i], first ? tokens : NULL, first ? NULL : x,
                         last ? targets : NULL, last ? NULL : y, &loss, &err) != MEGA_OK)
      fail_msg("forward %d: %s", i, err.msg);
    memcpy(x, y, NC * sizeof *x);
  }
  /* x now holds the gradient flowing back */
  for (int i = m->n - 1; i >= 0; i--) {
    bool first = i == 0, last = i == m->n - 1;
    if (mega_gpt_backward_input(m->st[i], m->acts[i], last ? NULL : x, loss_scale,
                                first ? NULL : y, &err) != MEGA_OK)
      fail_msg("backward_input %d: %s", i, err.msg);
    if (mega_gpt_backward_weight(m->st[i], m->acts[i], &err) != MEGA_OK)
      fail_msg("backward_weight %d: %s", i, err.msg);
    memcpy(x, y, NC * sizeof *x);
  }
  free(x);
  free(y);
  return loss;
}

static double model_step(model *m, const int32_t *tokens, const int32_t *targets) {
  return model_step_scaled(m, tokens, targets, 1.0f / (B * T));
}

/* Param (or, with grads, gradient) `name` summed over every stage holding it. */
static void gather(model *m, const char *name, bool grads, float *out, size_t n) {
  memset(out, 0, n * sizeof *out);
  int found = 0;
  for (int i = 0; i < m->n; i++) {
    const mega_param_info *pi = mega_gpt_param_find(m->st[i], name);
    if (!pi) continue;
    assert_int_equal(pi->numel, n);
    const float *src = (grads ? mega_gpt_grad_data(m->st[i]) : mega_gpt_param_data(m->st[i])) +
                       pi->offset;
    if (!grads && found) {
      /* a tied copy starts bitwise equal */
      assert_memory_equal(out, src, n * sizeof *out);
      continue;
    }
    for (size_t k = 0; k < n; k++) out[k] += src[k];
    found++;
  }
  if (!found) fail_msg("no stage holds %s", name);
}

static void assert_close(const float *a, const float *b, size_t n, double tol,
                         const char *what) {
  double scale = 0.0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(a[i]));
  for (size_t i = 0; i < n; i++)
    if (fabs((double)a[i] - b[i]) > tol * (scale + 1e-30))
      fail_msg("%s[%zu]: single stage %.9g, split %.9g", what, i, a[i], b[i]);
}

static void compare_with_single(const mega_gpt_stage_desc *descs, int n) {
  model one, split;
  mega_gpt_stage_desc whole = {true, true, 0, 4};
  model_init(&one, &whole, 1);
  model_init(&split, descs, n);
  int32_t tokens[B * T], targets[B * T];
  fx_ids(tokens, B * T, 256, 5);
  fx_ids(targets, B * T, 256, 6);
  int np;
  const mega_param_info *params = mega_gpt_params(one.st[0], &np);
  float *a = malloc(mega_gpt_num_params(one.st[0]) * sizeof *a),
        *b = malloc(mega_gpt_num_params(one.st[0]) * sizeof *b);
  assert_non_null(a);
  assert_non_null(b);
  /* identical initial weights, whatever the split */
  for (int i = 0; i < np; i++) {
    gather(&split, params[i].name, false, b, params[i].numel);
    assert_memory_equal(mega_gpt_param_data(one.st[0]) + params[i].offset, b,
                        params[i].numel * sizeof *b);
  }
  double l1 = model_step(&one, tokens, targets), l2 = model_step(&split, tokens, targets);
  printf("# loss single %.9f split %.9f\n", l1, l2);
  assert_true(fabs(l1 - l2) <= 1e-6 * fabs(l1));
  /* the same gradients; wte's is the sum of the embedding's and the head's */
  for (int i = 0; i < np; i++) {
    memcpy(a, mega_gpt_grad_data(one.st[0]) + params[i].offset, params[i].numel * sizeof *a);
    gather(&split, params[i].name, true, b, params[i].numel);
    assert_close(a, b, params[i].numel, 1e-5, params[i].name);
  }
  free(a);
  free(b);
  model_free(&one);
  model_free(&split);
}

static void two_stages_match_single(void **state) {
  (void)state;
  mega_gpt_stage_desc d[2] = {{true, false, 0, 2}, {false, true, 2, 2}};
  compare_with_single(d, 2);
}

static void four_stages_with_bare_embedding_and_loss(void **state) {
  (void)state;
  /* Et | t t t | t | L : embedding-only and loss-only stages */
  mega_gpt_stage_desc d[4] = {
      {true, false, 0, 0}, {false, false, 0, 3}, {false, false, 3, 1}, {false, true, 4, 0}};
  compare_with_single(d, 4);
}

static void loss_stage_head_is_a_tied_copy(void **state) {
  (void)state;
  model m;
  mega_gpt_stage_desc d[2] = {{true, false, 0, 2}, {false, true, 2, 2}};
  model_init(&m, d, 2);
  const mega_param_info *emb = mega_gpt_param_find(m.st[0], "transformer.wte.weight");
  const mega_param_info *head = mega_gpt_param_find(m.st[1], "transformer.wte.weight");
  assert_non_null(emb);
  assert_non_null(head);
  assert_false(emb->tied_copy);
  assert_true(head->tied_copy);
  assert_true(head->decay);
  assert_null(mega_gpt_param_find(m.st[1], "transformer.wpe.weight"));
  assert_null(mega_gpt_param_find(m.st[0], "transformer.ln_f.weight"));
  assert_non_null(mega_gpt_param_find(m.st[1], "transformer.h.3.mlp.c_proj.bias"));
  assert_null(mega_gpt_param_find(m.st[1], "transformer.h.1.mlp.c_proj.bias"));
  model_free(&m);
}

/* The Llamas split as GPT-2 is, with the untied head alone on its stage
 * and a tied one copied. */
static void llama_stages_match_single(void **state) {
  (void)state;
  mega_gpt_stage_desc two[2] = {{true, false, 0, 2}, {false, true, 2, 2}};
  mega_gpt_stage_desc four[4] = {
      {true, false, 0, 0}, {false, false, 0, 3}, {false, false, 3, 1}, {false, true, 4, 0}};
  for (fx_model m = FX_LLAMA; m <= FX_LLAMA_TIED; m++) {
    variant = m;
    compare_with_single(two, 2);
    compare_with_single(four, 4);
    model md;
    model_init(&md, two, 2);
    const mega_param_info *emb = mega_gpt_param_find(md.st[0], "model.embed_tokens.weight");
    const mega_param_info *copy = mega_gpt_param_find(md.st[1], "model.embed_tokens.weight");
    const mega_param_info *head = mega_gpt_param_find(md.st[1], "lm_head.weight");
    assert_non_null(emb);
    assert_true(emb->tied_embedding == (m == FX_LLAMA_TIED));
    if (m == FX_LLAMA) { /* untied: a head of its own, nothing shared */
      assert_null(copy);
      assert_non_null(head);
      assert_false(head->tied_copy || head->tied_embedding);
    } else {
      assert_null(head);
      assert_non_null(copy);
      assert_true(copy->tied_copy && copy->tied_embedding);
    }
    model_free(&md);
  }
  variant = FX_GPT2;
}

/* backward_input alone leaves the gradients alone; backward_weight then adds
 * exactly the step's gradients, and accumulates across microbatches. */
static void split_backward_halves_and_accumulation(void **state) {
  (void)state;
  model m;
  mega_gpt_stage_desc d = {true, true, 0, 4};
  model_init(&m, &d, 1);
  mega_gpt_stage *s = m.st[0];
  mega_err err = {0};
  size_t n = mega_gpt_num_params(s);
  int32_t tokens[B * T], targets[B * T];
  fx_ids(tokens, B * T, 256, 5);
  fx_ids(targets, B * T, 256, 6);
  float *g1 = malloc(n * sizeof *g1);
  assert_non_null(g1);
  model_step(&m, tokens, targets);
  memcpy(g1, mega_gpt_grad_data(s), n * sizeof *g1);
  double loss;
  assert_int_equal(mega_gpt_forward(s, m.acts[0], tokens, NULL, targets, NULL, &loss, &err),
                   MEGA_OK);
  assert_int_equal(mega_gpt_backward_input(s, m.acts[0], NULL, 1.0f / (B * T), NULL, &err),
                   MEGA_OK);
  assert_memory_equal(g1, mega_gpt_grad_data(s), n * sizeof *g1);
  assert_int_equal(mega_gpt_backward_weight(s, m.acts[0], &err), MEGA_OK);
  /* BLAS adds into a non-zero C in its own order: equal to rounding */
  int np;
  const mega_param_info *p = mega_gpt_params(s, &np);
  float *g2 = malloc(n * sizeof *g2);
  assert_non_null(g2);
  for (size_t i = 0; i < n; i++) g2[i] = 0.5f * mega_gpt_grad_data(s)[i];
  for (int i = 0; i < np; i++)
    assert_close(g1 + p[i].offset, g2 + p[i].offset, p[i].numel, 1e-6, p[i].name);
  free(g2);
  free(g1);
  model_free(&m);
}

/* The fused classifier (mega_gpt_acts_set_loss_scale): the loss and every
 * gradient bit for bit those of the probabilities then the backward's
 * scale, on the whole model and split in two; a backward given another
 * scale fails and says which, and 0 turns it off again. */
static void fused_classifier_same_bits(void **state) {
  (void)state;
  mega_gpt_stage_desc whole = {true, true, 0, 4}, halves[2] = {{true, false, 0, 2},
                                                               {false, true, 2, 2}};
  const mega_gpt_stage_desc *cases[2] = {&whole, halves};
  int32_t tokens[B * T], targets[B * T];
  fx_ids(tokens, B * T, 256, 5);
  fx_ids(targets, B * T, 256, 6);
  for (int c = 0; c < 2; c++) {
    model m;
    model_init(&m, cases[c], c ? 2 : 1);
    mega_gpt_stage *ls = m.st[m.n - 1];
    size_t n[4];
    float *g1[4];
    const float sc = 0.1f / (B * T); /* not a power of two: the products round */
    double l1 = model_step_scaled(&m, tokens, targets, sc);
    for (int i = 0; i < m.n; i++) {
      n[i] = mega_gpt_num_params(m.st[i]);
      g1[i] = malloc(n[i] * sizeof(float));
      memcpy(g1[i], mega_gpt_grad_data(m.st[i]), n[i] * sizeof(float));
    }
    mega_gpt_acts_set_loss_scale(m.acts[m.n - 1], sc);
    double l2 = model_step_scaled(&m, tokens, targets, sc);
    assert_memory_equal(&l1, &l2, sizeof l1);
    for (int i = 0; i < m.n; i++) {
      assert_memory_equal(g1[i], mega_gpt_grad_data(m.st[i]), n[i] * sizeof(float));
      free(g1[i]);
    }
    /* the scale the forward used must be the backward's */
    mega_err err = {0};
    double loss;
    float *x = m.n > 1 ? calloc((size_t)B * T * m.cfg.channels, sizeof *x) : NULL;
    mega_gpt_acts_set_loss_scale(m.acts[m.n - 1], 0.5f);
    assert_int_equal(mega_gpt_forward(ls, m.acts[m.n - 1], m.n > 1 ? NULL : tokens, x, targets,
                                      NULL, &loss, &err),
                     MEGA_OK);
    float *dx = m.n > 1 ? calloc((size_t)B * T * m.cfg.channels, sizeof *dx) : NULL;
    assert_int_equal(mega_gpt_backward_input(ls, m.acts[m.n - 1], NULL, 0.25f, dx, &err),
                     MEGA_ERR_INVALID);
    assert_non_null(strstr(err.msg, "0.25 is not the 0.5"));
    mega_gpt_acts_set_loss_scale(m.acts[m.n - 1], 0.0f);
    assert_float_equal(model_step_scaled(&m, tokens, targets, sc), l1, 0);
    free(x), free(dx);
    model_free(&m);
  }
}

typedef struct unit_log {
  int n, first[64], count[64];
} unit_log;

static void log_unit(void *arg, int first, int count) {
  unit_log *l = arg;
  assert_true(l->n < 64);
  l->first[l->n] = first;
  l->count[l->n++] = count;
}

/* mega_gpt_backward (input and weight halves block by block) gives the
 * same bits as the two halves; both report each unit as it finishes, in
 * backward order: ln_f (and the head copy), blocks last to first, the
 * embedding; every parameter exactly once. After mega_gpt_rebind into
 * buffers laid out the other way round, a step gives the same bits. */
static void fused_backward_units_and_rebind(void **state) {
  (void)state;
  mega_err err = {0};
  const mega_gpt_stage_desc descs[2] = {{true, true, 0, 4}, {false, true, 1, 3}};
  for (int k = 0; k < 4; k++) { /* GPT-2, then the untied Llama */
    variant = k < 2 ? FX_GPT2 : FX_LLAMA;
    bool llama = k >= 2;
    model m;
    model_init(&m, &descs[k % 2], 1);
    variant = FX_GPT2;
    mega_gpt_stage *s = m.st[0];
    bool emb = descs[k % 2].embedding, own_head = llama || !emb;
    size_t n = mega_gpt_num_params(s), NC = (size_t)B * T * m.cfg.channels;
    int np, nu;
    const mega_param_info *p = mega_gpt_params(s, &np);
    const mega_gpt_unit *u = mega_gpt_units(s, &nu);
    /* 6 per block; the final norm; the embedding; a head of its own */
    assert_int_equal(nu, 6 * descs[k % 2].num_layers + 1 + emb + own_head);
    int32_t tokens[B * T], targets[B * T];
    fx_ids(tokens, B * T, 256, 5);
    fx_ids(targets, B * T, 256, 6);
    float *in = malloc(NC * sizeof *in), *din1 = malloc(NC * sizeof *din1),
          *din2 = malloc(NC * sizeof *din2), *g1 = malloc(n * sizeof *g1);
    fx_normals(in, NC, 1.0f, 9);
    double loss;
    unit_log log = {0};
    mega_gpt_on_grads_done(s, log_unit, &log);
    /* the two halves */
    mega_gpt_zero_grad(s);
    assert_int_equal(mega_gpt_forward(s, m.acts[0], emb ? tokens : NULL, emb ? NULL : in,
                                      targets, NULL, &loss, &err), MEGA_OK);
    assert_int_equal(mega_gpt_backward_input(s, m.acts[0], NULL, 0.1f, emb ? NULL : din1, &err),
                     MEGA_OK);
    assert_int_equal(log.n, 0); /* the input half completes no parameter gradient */
    assert_int_equal(mega_gpt_backward_weight(s, m.acts[0], &err), MEGA_OK);
    memcpy(g1, mega_gpt_grad_data(s), n * sizeof *g1);
    assert_int_equal(log.n, nu);
    int seen[64] = {0};
    for (int i = 0; i < nu; i++) {
      assert_int_equal(log.first[i], u[i].first);
      assert_int_equal(log.count[i], u[i].count);
      for (int j = 0; j < u[i].count; j++) seen[u[i].first + j]++;
    }
    for (int i = 0; i < np; i++) assert_int_equal(seen[i], 1);
    /* the head copy and ln_f first, the blocks from the last (mlp.c_proj
     * first, ln_1 last), the embedding last */
    int b0 = own_head ? 2 : 1;
    const char *wte = llama ? "model.embed_tokens.weight" : "transformer.wte.weight";
    if (own_head) assert_string_equal(p[u[0].first].name, llama ? "lm_head.weight" : wte);
    assert_string_equal(p[u[b0 - 1].first].name,
                        llama ? "model.norm.weight" : "transformer.ln_f.weight");
    assert_string_equal(p[u[b0].first].name, llama ? "model.layers.3.mlp.down_proj.weight"
                                                   : "transformer.h.3.mlp.c_proj.weight");
    assert_string_equal(p[u[b0 + 1].first].name, llama ? "model.layers.3.mlp.gate_proj.weight"
                                                       : "transformer.h.3.mlp.c_fc.weight");
    assert_int_equal(u[b0 + 1].count, llama ? 2 : 2); /* gate and up; c_fc and its bias */
    assert_int_equal(u[b0 + 4].count, llama ? 3 : 2); /* q, k, v; c_attn and its bias */
    assert_string_equal(p[u[b0 + 5].first].name, llama ? "model.layers.3.input_layernorm.weight"
                                                       : "transformer.h.3.ln_1.weight");
    assert_int_equal(u[b0].layer, descs[k % 2].num_layers - 1);
    assert_string_equal(p[u[b0 + 6].first].name, llama ? "model.layers.2.mlp.down_proj.weight"
                                                       : "transformer.h.2.mlp.c_proj.weight");
    if (emb) assert_string_equal(p[u[nu - 1].first].name, wte);
    /* fused */
    log.n = 0;
    mega_gpt_zero_grad(s);
    assert_int_equal(mega_gpt_forward(s, m.acts[0], emb ? tokens : NULL, emb ? NULL : in,
                                      targets, NULL, &loss, &err), MEGA_OK);
    assert_int_equal(mega_gpt_backward(s, m.acts[0], NULL, 0.1f, emb ? NULL : din2, &err),
                     MEGA_OK);
    assert_int_equal(log.n, nu);
    assert_memory_equal(g1, mega_gpt_grad_data(s), n * sizeof *g1);
    if (!emb) assert_memory_equal(din1, din2, NC * sizeof *din1);
    /* rebind: reverse order, 32-float gaps */
    size_t *off = calloc((size_t)np, sizeof *off), total = 0;
    for (int i = np - 1; i >= 0; i--) {
      off[i] = total + 32;
      total = off[i] + p[i].numel;
    }
    float *pb = calloc(total, sizeof *pb), *gb = calloc(total, sizeof *gb);
    float *before = malloc(n * sizeof *before);
    memcpy(before, mega_gpt_param_data(s), n * sizeof *before);
    size_t old_off[64];
    for (int i = 0; i < np; i++) old_off[i] = p[i].offset;
    assert_int_equal(mega_gpt_rebind(s, pb, gb, total, off, &err), MEGA_OK);
    assert_ptr_equal(mega_gpt_param_data(s), pb);
    assert_int_equal(mega_gpt_num_params(s), total);
    for (int i = 0; i < np; i++) {
      assert_int_equal(p[i].offset, off[i]);
      assert_memory_equal(pb + off[i], before + old_off[i], p[i].numel * sizeof(float));
    }
    mega_gpt_zero_grad(s);
    assert_int_equal(mega_gpt_forward(s, m.acts[0], emb ? tokens : NULL, emb ? NULL : in,
                                      targets, NULL, &loss, &err), MEGA_OK);
    assert_int_equal(mega_gpt_backward(s, m.acts[0], NULL, 0.1f, emb ? NULL : din2, &err),
                     MEGA_OK);
    for (int i = 0; i < np; i++)
      assert_memory_equal(gb + off[i], g1 + old_off[i], p[i].numel * sizeof(float));
    off[0] = total; /* out of the buffer */
    assert_int_equal(mega_gpt_rebind(s, pb, gb, total, off, &err), MEGA_ERR_INVALID);
    free(off);
    free(before);
    free(in);
    free(din1);
    free(din2);
    free(g1);
    model_free(&m); /* the stage borrows pb and gb: they outlive it */
    free(pb);
    free(gb);
  }
}

static void bad_configs_and_calls_fail_clearly(void **state) {
  (void)state;
  mega_backend *be;
  mega_err err = {0};
  mega_gpt_stage *s = NULL;
  mega_gpt_acts *a = NULL;
  assert_int_equal(mega_backend_cpu_create(NULL, &be, &err), MEGA_OK);
  mega_gpt_config cfg;
  fx_config(&cfg, 0.02f);
  mega_gpt_stage_desc whole = {true, true, 0, 2};
  cfg.num_heads = 3;
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &whole, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "num_heads (3) must divide channels (16)"));
  fx_config(&cfg, 0.02f);
  mega_gpt_stage_desc outside = {false, true, 1, 2};
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &outside, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "outside the model's 2 layers"));
  mega_gpt_stage_desc empty = {false, false, 1, 0};
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &empty, &s, &err), MEGA_ERR_INVALID);
  cfg.ln_eps = 0.0f;
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &whole, &s, &err), MEGA_ERR_INVALID);
  fx_config(&cfg, 0.02f);
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &whole, &s, &err), MEGA_OK);
  assert_int_equal(mega_gpt_acts_create(s, 2, 9, &a, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "exceeds max_seq_len 8"));
  assert_int_equal(mega_gpt_acts_create(s, 2, 4, &a, &err), MEGA_OK);
  int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 256}, tgt[8] = {0};
  double loss;
  assert_int_equal(mega_gpt_backward_input(s, a, NULL, 1.0f, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "needs a forward first"));
  assert_int_equal(mega_gpt_forward(s, a, tok, NULL, tgt, NULL, &loss, &err),
                   MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "tokens[1][3] = 256 is outside the vocabulary"));
  tok[7] = 7;
  float junk[2 * 4 * 16];
  assert_int_equal(mega_gpt_forward(s, a, tok, junk, tgt, NULL, &loss, &err),
                   MEGA_ERR_INVALID);
  assert_int_equal(mega_gpt_forward(s, a, NULL, NULL, tgt, NULL, &loss, &err),
                   MEGA_ERR_INVALID);
  /* logits only: no backward */
  assert_int_equal(mega_gpt_forward(s, a, tok, NULL, NULL, NULL, NULL, &err), MEGA_OK);
  assert_non_null(mega_gpt_acts_logits(a));
  assert_int_equal(mega_gpt_backward_input(s, a, NULL, 1.0f, NULL, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_gpt_forward(s, a, tok, NULL, tgt, NULL, &loss, &err), MEGA_OK);
  assert_null(mega_gpt_acts_logits(a)); /* the loss wrote over them */
  assert_int_equal(mega_gpt_backward_weight(s, a, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "backward_input first"));
  assert_int_equal(mega_gpt_backward_input(s, a, NULL, 1.0f, NULL, &err), MEGA_OK);
  assert_int_equal(mega_gpt_backward_input(s, a, NULL, 1.0f, NULL, &err), MEGA_ERR_INVALID);
  assert_true(mega_gpt_acts_bytes(a) > 0);
  mega_gpt_acts_destroy(a);
  mega_gpt_stage_destroy(s);
  /* what each architecture cannot hold */
  fx_config(&cfg, 0.02f);
  cfg.num_kv_heads = 1;
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &whole, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "GPT-2 has no grouped-query attention"));
  fx_config(&cfg, 0.02f);
  cfg.no_bias = true;
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &whole, &s, &err), MEGA_ERR_INVALID);
  fx_model_config(&cfg, 0.02f, FX_LLAMA);
  cfg.num_kv_heads = 3;
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &whole, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "multiple of num_kv_heads (3)"));
  fx_model_config(&cfg, 0.02f, FX_LLAMA);
  cfg.rotary_percent = 0.5; /* 3 of head_dim 6 */
  assert_int_equal(mega_gpt_stage_create(be, &cfg, &whole, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "must be even"));
  /* Megatron's and Hugging Face's int(head_dim * rotary_percent), in
   * double: 100 x 0.29 rotates 28 channels, 100 x 0.53 rotates 53 */
  fx_model_config(&cfg, 0.02f, FX_LLAMA);
  cfg.head_dim = 100;
  cfg.rotary_percent = 0.29;
  assert_int_equal(mega_gpt_rot_dim(&cfg), 28);
  cfg.rotary_percent = 0.53;
  assert_int_equal(mega_gpt_rot_dim(&cfg), 53);
  mega_backend_destroy(be);
}

static size_t carved(size_t floats) { return (floats * sizeof(float) + 63) / 64 * 64; }

/* A loss stage's activations beyond a middle stage's of the same blocks:
 * resid[L] and its gradient dlnf [N,C], ln_f's output [N,C] and statistics
 * [N] each, the losses [N], and one [N, V/tp] buffer: the logits, which the
 * loss overwrites with its probabilities and the backward with dlogits (no
 * second one); under TP the row maxima [N] and sums [2N] too. (Only sizes:
 * the collectives never run.) */
static void loss_stage_holds_one_vocabulary_buffer(void **state) {
  (void)state;
    mega_err err = {0};
  mega_gpt_config cfg;
  fx_config(&cfg, 0.02f);
  cfg.num_layers = 4;
  mega_backend *be;
  assert_int_equal(mega_backend_cpu_create(NULL, &be, &err), MEGA_OK);
  for (int tp = 1; tp <= 2; tp++) {
    mega_gpt_stage_desc d[2] = {{false, false, 2, 2, {tp, 0, false, &fx_tp_noop, NULL}},
                                {false, true, 2, 2, {tp, 0, false, &fx_tp_noop, NULL}}};
    size_t bytes[2];
    for (int k = 0; k < 2; k++) {
      mega_gpt_stage *s;
      mega_gpt_acts *a;
      if (mega_gpt_stage_create(be, &cfg, &d[k], &s, &err) ||
          mega_gpt_acts_create(s, B, T, &a, &err))
        fail_msg("tp %d: %s", tp, err.msg);
      bytes[k] = mega_gpt_acts_bytes(a);
      mega_gpt_acts_destroy(a);
      mega_gpt_stage_destroy(s);
    }
    size_t N = B * T, C = cfg.channels, Vl = cfg.vocab_size / tp;
    size_t want = 3 * carved(N * C) + 2 * carved(N) + carved(N) + carved(N * Vl) +
                  (tp > 1 ? carved(N) + carved(2 * N) : 0);
    if (bytes[1] - bytes[0] != want)
      fail_msg("tp %d: the loss stage holds %zu bytes more than a middle stage, not %zu (one "
               "[N, V/tp] buffer of %zu)", tp, bytes[1] - bytes[0], want, carved(N * Vl));
  }
  mega_backend_destroy(be);
}

/* Microbatches of different lengths on one stage, each its own acts. */
static void variable_lengths_in_flight(void **state) {
  (void)state;
  model m;
  mega_gpt_stage_desc d = {true, true, 0, 4};
  model_init(&m, &d, 1);
  mega_err err = {0};
  mega_gpt_stage *s = m.st[0];
  mega_gpt_acts *shortacts = NULL;
  assert_int_equal(mega_gpt_acts_create(s, 1, 3, &shortacts, &err), MEGA_OK);
  int32_t tok[B * T], tgt[B * T];
  fx_ids(tok, B * T, 256, 5);
  fx_ids(tgt, B * T, 256, 6);
  double l_long, l_short, l_short2;
  /* causal: the first 3 positions of sequence 0 do not see the rest (the
   * logits of forwards without targets: a loss writes over them) */
  assert_int_equal(mega_gpt_forward(s, m.acts[0], tok, NULL, NULL, NULL, NULL, &err), MEGA_OK);
  assert_int_equal(mega_gpt_forward(s, shortacts, tok, NULL, NULL, NULL, NULL, &err), MEGA_OK);
  const float *lg = mega_gpt_acts_logits(m.acts[0]), *ls = mega_gpt_acts_logits(shortacts);
  for (int i = 0; i < 3 * 256; i++) assert_true(fabsf(lg[i] - ls[i]) <= 1e-5f);
  assert_int_equal(mega_gpt_forward(s, m.acts[0], tok, NULL, tgt, NULL, &l_long, &err),
                   MEGA_OK);
  assert_int_equal(mega_gpt_forward(s, shortacts, tok, NULL, tgt, NULL, &l_short, &err),
                   MEGA_OK);
  assert_int_equal(mega_gpt_backward_input(s, shortacts, NULL, 1.0f, NULL, &err), MEGA_OK);
  assert_int_equal(mega_gpt_backward_input(s, m.acts[0], NULL, 1.0f, NULL, &err), MEGA_OK);
  assert_int_equal(mega_gpt_backward_weight(s, shortacts, &err), MEGA_OK);
  assert_int_equal(mega_gpt_backward_weight(s, m.acts[0], &err), MEGA_OK);
  assert_int_equal(mega_gpt_forward(s, shortacts, tok, NULL, tgt, NULL, &l_short2, &err),
                   MEGA_OK);
  assert_true(l_short == l_short2);
  mega_gpt_acts_destroy(shortacts);
  model_free(&m);
}

/* More threads change nothing but rounding. */
static void threads_give_the_same_step(void **state) {
  (void)state;
  model one, three;
  mega_gpt_stage_desc d = {true, true, 0, 4};
  model_init(&one, &d, 1);
  model_init(&three, &d, 1);
  mega_err err = {0};
  assert_int_equal(three.be->ops->set_threads(three.be, 3, &err), MEGA_OK);
  int32_t tokens[B * T], targets[B * T];
  fx_ids(tokens, B * T, 256, 5);
  fx_ids(targets, B * T, 256, 6);
  double l1 = model_step(&one, tokens, targets), l3 = model_step(&three, tokens, targets);
  assert_true(fabs(l1 - l3) <= 1e-6 * fabs(l1));
  int np;
  const mega_param_info *p = mega_gpt_params(one.st[0], &np);
  for (int i = 0; i < np; i++)
    assert_close(mega_gpt_grad_data(one.st[0]) + p[i].offset,
                 mega_gpt_grad_data(three.st[0]) + p[i].offset, p[i].numel, 1e-5, p[i].name);
  model_free(&one);
  model_free(&three);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(two_stages_match_single),
      cmocka_unit_test(four_stages_with_bare_embedding_and_loss),
      cmocka_unit_test(loss_stage_head_is_a_tied_copy),
      cmocka_unit_test(llama_stages_match_single),
      cmocka_unit_test(split_backward_halves_and_accumulation),
      cmocka_unit_test(fused_classifier_same_bits),
      cmocka_unit_test(fused_backward_units_and_rebind),
      cmocka_unit_test(bad_configs_and_calls_fail_clearly),
      cmocka_unit_test(variable_lengths_in_flight),
      cmocka_unit_test(loss_stage_holds_one_vocabulary_buffer),
      cmocka_unit_test(threads_give_the_same_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
