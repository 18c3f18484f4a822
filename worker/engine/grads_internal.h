/* Inside worker/engine/grads*.c only: the gradient buffers' state
 * (grads.h). grads.c, the buffers, buckets, reductions and the parameter
 * gather, calls down into grads_shard.c, the distributed optimizer's shards
 * (a bucket's all-gather, the copy's exchange, the moments' gather and
 * scatter), and grads_tied.c, the tied embedding's exchange between the
 * pipeline's ends. */
#ifndef MEGA_WORKER_GRADS_INTERNAL_H
#define MEGA_WORKER_GRADS_INTERNAL_H

#include "worker/engine/grads.h"

typedef struct chunk {
  mega_grads *g;
  int index;
  mega_gpt_stage *stage;
  float *params, *grads;
  size_t numel;
  int b0, nb;     /* its buckets [b0, b0 + nb) */
  int *bucket_of; /* per param */
  bool enabled;
} chunk;

/* Optimizer ranges over one shard of the buffers (or every parameter
 * whole), with what the optimizer does not know: where each sits. */
typedef struct range_set {
  mega_optim_range *ranges;
  int *chunk;
  size_t *pos; /* of each range in its chunk's buffers */
  /* left out of the norm: a piece of the loss-only stage's copy of wte, or
   * of a TP-replicated tensor on a TP rank other than 0 (rank 0 counts it) */
  bool *skip;
  mega_grads_piece *piece;
  /* The norm's share of each range (own only, read back from
   * norm_slots), taken once its bucket is reduced (by a backward unit
   * that finds it done, or the wait, while later buckets still run)
   * rather than all at the end; late ranges (the sequence-parallel
   * layernorms, which change after the data-parallel sum, and the tied
   * embedding) are mega_grads_sumsq's to take. */
  int *bucket;
  bool *late;
  double *sumsq;
  size_t n;
} range_set;

/* The tied embedding's exchange with the other end of the pipeline
 * (grads_tied.c). */
typedef enum { TIED_NONE, TIED_FIRST, TIED_COPY } tied_role;
typedef struct tied_xchg {
  mega_comm *comm; /* the embedding group, 2 ranks; NULL: no exchange */
  tied_role role;  /* the embedding stage's wte, or the loss stage's copy */
  int peer, bucket;
  float *grad;     /* the whole tensor's gradient (this TP rank's slice) */
  size_t numel;
  float *region;   /* the total's part this rank owns: its shard, or the whole */
  size_t nregion;
  float *in;       /* the embedding stage's: the copy received (backend memory) */
  mega_req *recv, *send;
  bool returned;   /* the total sent back (or its receive posted) this iteration */
  mega_grads_timing timing;
} tied_xchg;

struct mega_grads {
  mega_backend *be;
  mega_grads_opts o;
  int vp;
  chunk *chunks;
  mega_grads_bucket *buckets;
  int nbuckets;
  int *ready;       /* per bucket: params counted this iteration */
  bool *launched;   /* per bucket */
  mega_req **req;   /* per bucket: the reduction in flight */
  mega_req **preq;  /* per bucket: the parameter all-gather in flight */
  mega_grads_timing *timing; /* per bucket, this iteration */
  mega_comm *comm;  /* backend memory */
  mega_comm *hcomm; /* host memory: the moments' gather */
  range_set own;    /* what this rank's optimizer steps */
  range_set copy;   /* the shard it keeps a copy of (shard_copy_shift); n 0: none */
  int copy_shard;   /* whose shard that is; -1: none */
  /* the copy's own parameters (backend memory): each bucket's piece of the
   * copied shard at copy_at[b], so its step never touches the buffers the
   * parameter all-gather writes and can run while it is in flight */
  float *copy_params;
  size_t *copy_at, copy_numel;
  mega_req **copy_req; /* its exchange in flight (2 per bucket); NULL: none */
  tied_xchg tied;
  /* parameter gathers launched and not yet waited well; one that failed
   * may have left a bucket half written */
  int gathers_pending;
  bool gather_failed;
  bool *normed; /* per bucket: own's squares taken this iteration */
  /* the reductions launched this iteration, in launch order (one
   * communicator runs them in it); before order[taken] all are taken */
  int *order;
  int norder, taken;
  /* own's squares are posted into norm_slots (backend memory, one per
   * range; norm_post the list being posted) and read back with one copy
   * in mega_grads_sumsq: a wait per range would stall the device's queue */
  double *norm_slots;
  mega_sumsq_range *norm_post;
  /* mega_grads_zero's progress this iteration: chunks [0, zero_chunk)
   * are zero, and zero_chunk's first zero_at floats */
  int zero_chunk;
  size_t zero_at;
  bool still_zero; /* mega_grads_still_zero this iteration: the norm is 0, unread */
  mega_status failed; /* a launch from the model's callback that failed */
  mega_err fail_err;
  void (*on_launch)(void *, int);
  void *on_launch_arg;
};

/* Gives the copy its own parameters (grads_shard.c): allocates them and
 * points copy's ranges there. */
mega_status mega_grads__copy_own_params(mega_grads *g, mega_err *err);

/* All-gathers bucket b's shards of buf (laid out as the chunk's buffers)
 * in place, over comm (grads_shard.c: the parameter gather's, and the
 * moments' for a checkpoint). */
mega_status mega_grads__gather_bucket(mega_grads *g, mega_comm *comm, int b, float *buf,
                                      mega_req **req, mega_err *err);

/* The tied exchange's hooks (grads_tied.c). start: at mega_grads_start.
 * launch: before bucket b's reduction; *sent: the loss stage's copy went to
 * the embedding stage instead (no data-parallel reduction). reduced: after
 * bucket b's wait. quiesce and free: mega_grads_quiesce's and destroy's. */
mega_status mega_grads__tied_start(mega_grads *g, mega_err *err);
mega_status mega_grads__tied_launch(mega_grads *g, int b, bool *sent, mega_err *err);
mega_status mega_grads__tied_reduced(mega_grads *g, int b, mega_err *err);
void mega_grads__tied_quiesce(mega_grads *g);
void mega_grads__tied_free(mega_grads *g);

#endif
