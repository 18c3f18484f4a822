/* AdamW over a list of flat ranges, with global-norm gradient clipping.
 *
 * The optimizer sees only ranges (params, grads, numel, decay), never the
 * model: a pipeline rank passes the ranges of all its chunks, and a
 * distributed optimizer passes the shard it owns. Each range gets its own
 * first and second moment buffers.
 *
 * A step has two phases so that the global gradient norm can span ranks:
 *
 *   double local;
 *   mega_optim_grad_sumsq(o, &local, &err);    // this rank's sum of squares
 *   ... all-reduce(local) over the ranks that share the model ...
 *   mega_optim_step(o, global, lr, &res, &err);
 *
 * step follows torch.optim.AdamW (decoupled weight decay, bias correction)
 * with torch.nn.utils.clip_grad_norm_ before it: norm = sqrt(global),
 * coef = clip_grad / (norm + 1e-6), and the gradients are scaled by coef
 * when coef < 1 (clip_grad 0 turns clipping off). Ranges whose decay flag is
 * false get no weight decay. The grad buffers are read, never changed.
 *
 * Every range steps in one backend call (mega_adamw_ranges: one launch on
 * cuda), and the norm posts every range's squares and reads them back with
 * one copy (mega_sum_squares_post), adding them in range order as before:
 * a step waits for the device once, not once per range.
 *
 * Ownership: the ranges' buffers are borrowed (backend memory of be, which
 * must outlive the optimizer); the moment buffers are the optimizer's. */
#ifndef MEGA_WORKER_OPTIM_H
#define MEGA_WORKER_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "worker/backend/backend.h"

typedef struct mega_optim_range {
  float *params;      /* backend memory, borrowed */
  const float *grads; /* backend memory, borrowed */
  size_t numel;
  bool decay;         /* apply weight decay (2-D weights) */
} mega_optim_range;

typedef struct mega_optim_hparams {
  double beta1, beta2, eps;
  double weight_decay;
  double clip_grad; /* max global norm; 0 disables clipping */
} mega_optim_hparams;

/* What one step did. */
typedef struct mega_optim_result {
  double grad_norm;  /* before clipping */
  double clip_coef;  /* the factor applied to the gradients (1 when none) */
  int64_t step;      /* the step count after this step (1 for the first) */
} mega_optim_result;

typedef struct mega_optim mega_optim;

/* Copies the range list and allocates zeroed moments. hp is checked
 * (betas in [0, 1), eps > 0, weight_decay >= 0, clip_grad >= 0). */
mega_status mega_optim_create(mega_backend *be, const mega_optim_range *ranges, size_t n,
                              const mega_optim_hparams *hp, mega_optim **out, mega_err *err);
void mega_optim_destroy(mega_optim *o); /* NULL is fine */

/* Phase one: the sum of squares of every gradient of every range. */
mega_status mega_optim_grad_sumsq(const mega_optim *o, double *out, mega_err *err);

/* Phase two: clip with the global sum of squares and update every range at
 * rate lr. A non-finite norm is MEGA_ERR_INVALID and changes nothing. res
 * may be NULL. */
mega_status mega_optim_step(mega_optim *o, double global_sumsq, double lr,
                            mega_optim_result *res, mega_err *err);

size_t mega_optim_num_ranges(const mega_optim *o);
const mega_optim_range *mega_optim_range_at(const mega_optim *o, size_t i);
/* Moment buffers of range i (backend memory, range numel floats each);
 * a checkpoint reads and writes them in place. */
float *mega_optim_exp_avg(mega_optim *o, size_t i);
float *mega_optim_exp_avg_sq(mega_optim *o, size_t i);
/* Bytes of the optimizer's state: the two moments of every range. (The
 * model trains in fp32, so the parameters are the master weights; there is
 * no second copy.) */
size_t mega_optim_state_bytes(const mega_optim *o);
/* Steps taken so far (bias correction uses it); set it when resuming. */
int64_t mega_optim_steps(const mega_optim *o);
void mega_optim_set_steps(mega_optim *o, int64_t steps);

#endif
