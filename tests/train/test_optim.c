/* AdamW on small vectors against hand-computed values: bias correction,
 * decoupled weight decay on decay ranges only, global-norm clipping and the
 * two-phase norm. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tests/worker/count_backend.h"
#include "worker/backend/backend.h"
#include "worker/optim/optim.h"

#define near(a, b) assert_true(fabs((double)(a) - (double)(b)) < 1e-6)

typedef struct fix {
  mega_backend *be;
  float *p, *g; /* backend memory: [0,2) decays, [2,4) does not */
  mega_optim *o;
} fix;

static void make(fix *f, double wd, double clip) {
  mega_err err = {0};
  assert_int_equal(mega_backend_cpu_create(NULL, &f->be, &err), MEGA_OK);
  assert_int_equal(f->be->ops->alloc(f->be, 4 * sizeof(float), (void **)&f->p, &err), MEGA_OK);
  assert_int_equal(f->be->ops->alloc(f->be, 4 * sizeof(float), (void **)&f->g, &err), MEGA_OK);
  float p0[4] = {1.0f, -2.0f, 1.0f, -2.0f};
  memcpy(f->p, p0, sizeof p0); /* cpu backend memory is host memory */
  mega_optim_range r[2] = {
      {.params = f->p, .grads = f->g, .numel = 2, .decay = true},
      {.params = f->p + 2, .grads = f->g + 2, .numel = 2, .decay = false},
  };
  mega_optim_hparams hp = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = wd,
                           .clip_grad = clip};
  assert_int_equal(mega_optim_create(f->be, r, 2, &hp, &f->o, &err), MEGA_OK);
}

static void destroy(fix *f) {
  mega_optim_destroy(f->o);
  f->be->ops->free(f->be, f->p);
  f->be->ops->free(f->be, f->g);
  mega_backend_destroy(f->be);
}

static void set_grads(fix *f, float a, float b) {
  float g[4] = {a, b, a, b};
  memcpy(f->g, g, sizeof g);
}

static void step(fix *f, double lr, mega_optim_result *res) {
  mega_err err = {0};
  double ss;
  assert_int_equal(mega_optim_grad_sumsq(f->o, &ss, &err), MEGA_OK);
  assert_int_equal(mega_optim_step(f->o, ss, lr, res, &err), MEGA_OK);
}

/* Two steps, lr 0.1, weight decay 0.1, no clipping:
 * step 1: m = 0.1 g, v = 0.001 g^2, m_hat/sqrt(v_hat) = sign(g), so
 *   decay:    p = p - 0.1 (sign(g) + 0.1 p) = 0.89, -1.88
 *   no decay: p = p - 0.1 sign(g)           = 0.9,  -1.9
 * step 2 with g = (-0.5, 2): m = (-0.005, 0.11), v = (0.00049975, 0.004999),
 *   bias corrections 0.19 and 0.001999, m_hat = (-0.0263158, 0.578947),
 *   sqrt(v_hat) = (0.5, 1.581139); p -= 0.1 (m_hat / sqrt(v_hat) + wd p). */
static void test_two_steps_decay_ranges(void **state) {
  (void)state;
  fix f;
  make(&f, 0.1, 0.0);
  mega_optim_result res;
  set_grads(&f, 0.5f, -1.0f);
  step(&f, 0.1, &res);
  assert_int_equal(res.step, 1);
  near(res.grad_norm, sqrt(2 * (0.25 + 1.0)));
  near(res.clip_coef, 1.0);
  near(f.p[0], 0.89);
  near(f.p[1], -1.88);
  near(f.p[2], 0.9);
  near(f.p[3], -1.9);
  near(mega_optim_exp_avg(f.o, 0)[0], 0.05);
  near(mega_optim_exp_avg_sq(f.o, 1)[1], 0.001);

  set_grads(&f, -0.5f, 2.0f);
  step(&f, 0.1, &res);
  assert_int_equal(mega_optim_steps(f.o), 2);
  near(f.p[0], 0.8863631597694736);
  near(f.p[1], -1.897810353462075);
  near(f.p[2], 0.9052631597894736);
  near(f.p[3], -1.9366103534720749);
  near(mega_optim_exp_avg(f.o, 1)[0], -0.005);
  near(mega_optim_exp_avg_sq(f.o, 0)[1], 0.004999);
  destroy(&f);
}

/* Gradients (3, 4) in each range: local norm sqrt(50); clip 1 scales them by
 * 1/(sqrt(50) + 1e-6), visible in m = 0.1 * g * coef. */
static void test_clipping(void **state) {
  (void)state;
  fix f;
  make(&f, 0.0, 1.0);
  set_grads(&f, 3.0f, 4.0f);
  mega_optim_result res;
  step(&f, 0.01, &res);
  double norm = sqrt(50.0), coef = 1.0 / (norm + 1e-6);
  near(res.grad_norm, norm);
  near(res.clip_coef, coef);
  near(mega_optim_exp_avg(f.o, 0)[0], 0.1 * 3.0 * coef);
  near(mega_optim_exp_avg(f.o, 1)[1], 0.1 * 4.0 * coef);
  near(mega_optim_exp_avg_sq(f.o, 0)[1], 0.001 * 16.0 * coef * coef);
  /* the grad buffers themselves are untouched */
  near(f.g[0], 3.0);
  destroy(&f);

  /* below the threshold: no scaling */
  make(&f, 0.0, 100.0);
  set_grads(&f, 3.0f, 4.0f);
  step(&f, 0.01, &res);
  near(res.clip_coef, 1.0);
  near(mega_optim_exp_avg(f.o, 0)[0], 0.3);
  destroy(&f);
}

/* The norm is global: another rank's sum of squares changes the clip. */
static void test_two_phase_global_norm(void **state) {
  (void)state;
  fix f;
  make(&f, 0.0, 1.0);
  set_grads(&f, 3.0f, 4.0f);
  mega_err err = {0};
  double local;
  assert_int_equal(mega_optim_grad_sumsq(f.o, &local, &err), MEGA_OK);
  near(local, 50.0);
  double global = local + 50.0; /* as if all-reduced with an equal rank */
  mega_optim_result res;
  assert_int_equal(mega_optim_step(f.o, global, 0.01, &res, &err), MEGA_OK);
  near(res.grad_norm, 10.0);
  near(mega_optim_exp_avg(f.o, 0)[0], 0.1 * 3.0 / (10.0 + 1e-6));
  destroy(&f);
}

/* Ranges of odd sizes (one empty), decay on and off, gradients clipped
 * (a scale below 1): on a backend with the many-range ops a step is one
 * AdamW call and the norm one posted batch and one copy back, with the
 * bits of the per-range loop (a backend without them) and of sum_squares
 * added in range order. */
static void test_many_ranges_one_call(void **state) {
  (void)state;
  enum { K = 5, TOTAL = 33 + 0 + 1 + 70000 + 515 };
  const size_t n[K] = {33, 0, 1, 70000, 515};
  mega_err err = {0};
  mega_backend *cpu, *plain;
  fx_counts calls = {0}, none = {0};
  assert_int_equal(mega_backend_cpu_create(NULL, &cpu, &err), MEGA_OK);
  mega_backend *posting = fx_counting(cpu, &calls, true);
  assert_non_null(posting);
  assert_non_null(plain = fx_counting(cpu, &none, false));
  float *buf[3]; /* params of each optimizer, and the shared gradients */
  for (int b = 0; b < 3; b++) {
    assert_int_equal(cpu->ops->alloc(cpu, TOTAL * sizeof(float), (void **)&buf[b], &err),
                     MEGA_OK);
    for (size_t i = 0; i < TOTAL; i++)
      buf[b][i] = (float)((i * 7919 + (b == 2) * 13) % 101) / 50.0f - 1.0f;
  }
  mega_optim_range r[2][K];
  for (int o = 0; o < 2; o++)
    for (size_t k = 0, off = 0; k < K; off += n[k], k++)
      r[o][k] = (mega_optim_range){.params = buf[o] + off, .grads = buf[2] + off, .numel = n[k],
                                   .decay = k % 2 == 0};
  mega_optim_hparams hp = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                           .clip_grad = 1.0};
  mega_optim *o[2];
  assert_int_equal(mega_optim_create(posting, r[0], K, &hp, &o[0], &err), MEGA_OK);
  assert_int_equal(mega_optim_create(plain, r[1], K, &hp, &o[1], &err), MEGA_OK);
  for (int s = 0; s < 3; s++) {
    calls = (fx_counts){0};
    double ss[2], want = 0;
    for (int k = 0; k < 2; k++)
      assert_int_equal(mega_optim_grad_sumsq(o[k], &ss[k], &err), MEGA_OK);
    for (size_t k = 0, off = 0; k < K; off += n[k], k++) {
      double one;
      assert_int_equal(cpu->ops->sum_squares(cpu, buf[2] + off, n[k], &one, &err), MEGA_OK);
      want += one;
    }
    assert_memory_equal(&ss[0], &want, sizeof want);
    assert_memory_equal(&ss[1], &want, sizeof want);
    mega_optim_result res;
    for (int k = 0; k < 2; k++)
      assert_int_equal(mega_optim_step(o[k], ss[k], 1e-2, &res, &err), MEGA_OK);
    assert_true(res.clip_coef < 1.0);
    assert_int_equal(calls.sum_squares_post, 1);
    assert_int_equal(calls.d2h, 1);
    assert_int_equal(calls.sum_squares, 0);
    assert_int_equal(calls.adamw_ranges, 1);
    assert_int_equal(calls.adamw, 0);
    assert_memory_equal(buf[0], buf[1], TOTAL * sizeof(float));
    for (int k = 0; k < K; k++) {
      assert_memory_equal(mega_optim_exp_avg(o[0], k), mega_optim_exp_avg(o[1], k), n[k] * 4);
      assert_memory_equal(mega_optim_exp_avg_sq(o[0], k), mega_optim_exp_avg_sq(o[1], k),
                          n[k] * 4);
    }
    for (size_t i = 0; i < TOTAL; i++) buf[2][i] *= -1.5f; /* new gradients */
  }
  /* the fallback: adamw per non-empty range, sum_squares per range */
  assert_int_equal(none.adamw, 3 * (K - 1));
  assert_int_equal(none.sum_squares, 3 * (K - 1));
  for (int k = 0; k < 2; k++) mega_optim_destroy(o[k]);
  for (int b = 0; b < 3; b++) cpu->ops->free(cpu, buf[b]);
  mega_backend_destroy(posting);
  mega_backend_destroy(plain);
  mega_backend_destroy(cpu);
}

static void test_errors(void **state) {
  (void)state;
  fix f;
  make(&f, 0.0, 1.0);
  set_grads(&f, 1.0f, 1.0f);
  mega_err err = {0};
  assert_int_equal(mega_optim_step(f.o, NAN, 0.1, NULL, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "gradient norm"));
  assert_int_equal(mega_optim_step(f.o, INFINITY, 0.1, NULL, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_optim_steps(f.o), 0);
  near(f.p[0], 1.0); /* unchanged */
  destroy(&f);

  mega_backend *be;
  assert_int_equal(mega_backend_cpu_create(NULL, &be, &err), MEGA_OK);
  mega_optim *o = NULL;
  mega_optim_hparams hp = {.beta1 = 1.0, .beta2 = 0.999, .eps = 1e-8};
  assert_int_equal(mega_optim_create(be, NULL, 0, &hp, &o, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--adam-beta1"));
  hp.beta1 = 0.9;
  hp.eps = 0.0;
  assert_int_equal(mega_optim_create(be, NULL, 0, &hp, &o, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "--adam-eps"));
  assert_null(o);
  mega_backend_destroy(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_steps_decay_ranges),
      cmocka_unit_test(test_clipping),
      cmocka_unit_test(test_two_phase_global_norm),
      cmocka_unit_test(test_many_ranges_one_call),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
