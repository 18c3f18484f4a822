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
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
