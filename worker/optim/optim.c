#include "worker/optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct mega_optim {
  mega_backend *be;
  mega_optim_hparams hp;
  mega_optim_range *ranges;
  size_t n;
  float *moments; /* one allocation: per range, m then v */
  size_t *offset; /* of range i's m in moments; v follows at + numel */
  int64_t steps;
  /* The ranges that hold elements, as the backend's many-range ops take
   * them: built once, since the ranges never change (so the cuda backend
   * uploads AdamW's table once). sums: their squares (backend memory),
   * read back with one copy into host_sums. */
  mega_adamw_range *adam;
  mega_sumsq_range *sq;
  size_t nt; /* entries of both */
  double *sums, *host_sums;
};

static mega_status check_hparams(const mega_optim_hparams *hp, mega_err *err) {
  if (!(hp->beta1 >= 0.0 && hp->beta1 < 1.0))
    return mega_fail(err, MEGA_ERR_INVALID, "--adam-beta1 must be in [0, 1) (got %g)", hp->beta1);
  if (!(hp->beta2 >= 0.0 && hp->beta2 < 1.0))
    return mega_fail(err, MEGA_ERR_INVALID, "--adam-beta2 must be in [0, 1) (got %g)", hp->beta2);
  if (!(hp->eps > 0.0) || !isfinite(hp->eps))
    return mega_fail(err, MEGA_ERR_INVALID, "--adam-eps must be > 0 (got %g)", hp->eps);
  if (!(hp->weight_decay >= 0.0) || !isfinite(hp->weight_decay))
    return mega_fail(err, MEGA_ERR_INVALID, "--weight-decay must be >= 0 (got %g)",
                     hp->weight_decay);
  if (!(hp->clip_grad >= 0.0) || !isfinite(hp->clip_grad))
    return mega_fail(err, MEGA_ERR_INVALID, "--clip-grad must be >= 0 (got %g)", hp->clip_grad);
  return MEGA_OK;
}

/* The non-empty ranges as AdamW's and the norm's tables; the weight decay
 * is fixed per range by hp, so it is in the table too. */
static mega_status build_tables(mega_optim *o, mega_err *err) {
  size_t n = o->n ? o->n : 1;
  o->adam = calloc(n, sizeof *o->adam);
  o->sq = calloc(n, sizeof *o->sq);
  o->host_sums = calloc(n, sizeof *o->host_sums);
  if (!o->adam || !o->sq || !o->host_sums)
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory creating the optimizer");
  mega_status st = o->be->ops->alloc(o->be, n * sizeof(double), (void **)&o->sums, err);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "allocating the gradient norm's sums (%zu doubles)", n);
    return st;
  }
  for (size_t i = 0; i < o->n; i++) {
    const mega_optim_range *r = &o->ranges[i];
    if (r->numel == 0) continue;
    float *m = o->moments + o->offset[i];
    o->adam[o->nt] = (mega_adamw_range){
        .params = r->params, .grads = r->grads, .m = m, .v = m + r->numel, .n = r->numel,
        .weight_decay = r->decay ? (float)o->hp.weight_decay : 0.0f};
    o->sq[o->nt] = (mega_sumsq_range){.x = r->grads, .n = r->numel, .out = &o->sums[o->nt]};
    o->nt++;
  }
  return MEGA_OK;
}

mega_status mega_optim_create(mega_backend *be, const mega_optim_range *ranges, size_t n,
                              const mega_optim_hparams *hp, mega_optim **out, mega_err *err) {
  *out = NULL;
  mega_status st = check_hparams(hp, err);
  if (st != MEGA_OK) return st;
  for (size_t i = 0; i < n; i++)
    if (ranges[i].numel > 0 && (!ranges[i].params || !ranges[i].grads))
      return mega_fail(err, MEGA_ERR_INTERNAL, "optimizer range %zu has no buffers", i);
  mega_optim *o = calloc(1, sizeof *o);
  if (!o) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory creating the optimizer");
  o->be = be;
  o->hp = *hp;
  o->n = n;
  o->ranges = calloc(n ? n : 1, sizeof *o->ranges);
  o->offset = calloc(n ? n : 1, sizeof *o->offset);
  if (!o->ranges || !o->offset) {
    mega_optim_destroy(o);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory creating the optimizer");
  }
  memcpy(o->ranges, ranges, n * sizeof *ranges);
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    o->offset[i] = total;
    total += 2 * ranges[i].numel;
  }
  st = be->ops->alloc(be, (total ? total : 1) * sizeof(float), (void **)&o->moments, err);
  if (st != MEGA_OK) mega_err_prefix(err, "allocating the optimizer's moments (%zu floats)", total);
  if (st == MEGA_OK) st = build_tables(o, err);
  if (st != MEGA_OK) {
    mega_optim_destroy(o);
    return st;
  }
  *out = o;
  return MEGA_OK;
}

void mega_optim_destroy(mega_optim *o) {
  if (!o) return;
  if (o->moments) o->be->ops->free(o->be, o->moments);
  if (o->sums) o->be->ops->free(o->be, o->sums);
  free(o->adam);
  free(o->sq);
  free(o->host_sums);
  free(o->ranges);
  free(o->offset);
  free(o);
}

mega_status mega_optim_grad_sumsq(const mega_optim *o, double *out, mega_err *err) {
  /* every range posted, then one copy back (not a wait per range), added
   * in range order as before */
  mega_status st = mega_sum_squares_post(o->be, o->sq, o->nt, err);
  if (st == MEGA_OK && o->nt)
    st = o->be->ops->memcpy(o->be, o->host_sums, o->sums, o->nt * sizeof(double),
                            MEGA_COPY_D2H, err);
  if (st != MEGA_OK) return st;
  double total = 0.0;
  for (size_t i = 0; i < o->nt; i++) total += o->host_sums[i];
  *out = total;
  return MEGA_OK;
}

mega_status mega_optim_step(mega_optim *o, double global_sumsq, double lr,
                            mega_optim_result *res, mega_err *err) {
  double norm = sqrt(global_sumsq);
  if (!isfinite(norm))
    return mega_fail(err, MEGA_ERR_INVALID,
                     "the gradient norm is %g at optimizer step %lld; training diverged "
                     "(try a lower --lr or a --clip-grad)", norm, (long long)o->steps + 1);
  if (!(lr >= 0.0) || !isfinite(lr))
    return mega_fail(err, MEGA_ERR_INVALID, "learning rate %g is not a finite number >= 0", lr);
  /* As clip_grad_norm_: the coefficient is computed and applied in float. */
  float coef = 1.0f;
  if (o->hp.clip_grad > 0.0) {
    float c = (float)o->hp.clip_grad / ((float)norm + 1e-6f);
    if (c < 1.0f) coef = c;
  }
  o->steps++;
  mega_adamw_params hp = {
      .lr = (float)lr,
      .beta1 = (float)o->hp.beta1,
      .beta2 = (float)o->hp.beta2,
      .eps = (float)o->hp.eps,
      .grad_scale = coef,
      .step = (int)o->steps,
  };
  mega_adamw_ranges(o->be, o->adam, o->nt, &hp); /* each range's own decay */
  if (res) {
    res->grad_norm = norm;
    res->clip_coef = coef;
    res->step = o->steps;
  }
  return MEGA_OK;
}

size_t mega_optim_num_ranges(const mega_optim *o) { return o->n; }

const mega_optim_range *mega_optim_range_at(const mega_optim *o, size_t i) {
  return i < o->n ? &o->ranges[i] : NULL;
}

float *mega_optim_exp_avg(mega_optim *o, size_t i) {
  return i < o->n ? o->moments + o->offset[i] : NULL;
}

float *mega_optim_exp_avg_sq(mega_optim *o, size_t i) {
  return i < o->n ? o->moments + o->offset[i] + o->ranges[i].numel : NULL;
}

size_t mega_optim_state_bytes(const mega_optim *o) {
  size_t n = 0;
  for (size_t i = 0; i < o->n; i++) n += 2 * o->ranges[i].numel;
  return n * sizeof(float);
}

int64_t mega_optim_steps(const mega_optim *o) { return o->steps; }
void mega_optim_set_steps(mega_optim *o, int64_t steps) { o->steps = steps; }
