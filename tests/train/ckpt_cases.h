/* What the checkpoint tests share (test_checkpoint.c, test_ckpt_damage.c):
 * a tiny model with optimizer state, saving it, loading it back through
 * resolve, and comparing two bit for bit. */
#ifndef MEGA_TESTS_TRAIN_CKPT_CASES_H
#define MEGA_TESTS_TRAIN_CKPT_CASES_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "tiny_model.h"
#include "worker/ckpt/checkpoint.h"

typedef tu_model model;

static inline void model_make(model *m, uint64_t seed) {
  assert_true(tu_model_make(m, seed, 2, 0.1));
}
static inline void model_free(model *m) { tu_model_free(m); }

static inline void assert_same(const model *a, const model *b) {
  assert_int_equal(a->n, b->n);
  for (size_t i = 0; i < a->n; i++) {
    size_t bytes = a->cp[i].numel * sizeof(float);
    assert_memory_equal(a->cp[i].param, b->cp[i].param, bytes);
    assert_memory_equal(a->cp[i].exp_avg, b->cp[i].exp_avg, bytes);
    assert_memory_equal(a->cp[i].exp_avg_sq, b->cp[i].exp_avg_sq, bytes);
  }
}

static inline mega_ckpt_state state_at(int64_t it) {
  return (mega_ckpt_state){.iteration = it, .consumed_samples = 4 * it, .optimizer_steps = it};
}

static inline void save_ok(model *m, const char *dir, int64_t it, uint64_t limit) {
  mega_err err = {0};
  mega_ckpt_state s = state_at(it);
  mega_ckpt_save_opts o = {.max_shard_bytes = limit};
  mega_status st = mega_ckpt_save(dir, m->be, &m->cfg, NULL, &s, m->cp, m->n, &o, &err);
  if (st != MEGA_OK) fail_msg("save: %s", err.msg);
}

/* Resolves dir and loads into m; returns the status, message in err. */
static inline mega_status load(model *m, const char *dir, mega_ckpt_state *s, mega_err *err) {
  char *path = NULL;
  mega_status st = mega_ckpt_resolve(dir, &path, NULL, err);
  if (st != MEGA_OK) return st;
  st = mega_ckpt_load(path, m->be, &m->cfg, NULL, m->cp, m->n, s, err);
  free(path);
  return st;
}

#endif
