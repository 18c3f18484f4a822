/* Data-parallel gradients as Megatron keeps them (seeds 002 and 003;
 * megatron/core/distributed/param_and_grad_buffer.py).
 *
 * Buffers. Each model chunk has one contiguous gradient buffer and one
 * parameter buffer of the same layout; every parameter and its gradient are
 * views into them (the chunk's stage is rebound onto them, mega_gpt_rebind).
 * Parameters are laid out in the order backward completes their gradients
 * (mega_gpt_units: ln_f and the head, the last block, ..., the first block,
 * the embedding), each parameter's own elements in reverse model order, so
 * the buffer reads the model back to front as Megatron's does. Every tensor
 * starts on a 16-float boundary.
 *
 * Buckets. Walking the buffer from its start, a bucket closes once it holds
 * bucket_size elements (Megatron's default max(40M, 1M x DP)); without
 * overlap the whole buffer is one bucket but for a loss-only stage's copy
 * of wte, always alone (it is sent, not reduced: see below). The embedding
 * stage's wte gets a bucket of its own whenever there is more than one
 * bucket or the optimizer is distributed: its shards must cover the same
 * elements on both stages. With the distributed optimizer each
 * bucket is padded to a multiple of 16 x DP, so it splits into DP equal,
 * aligned shards; rank d owns shard d. Padding stays zero.
 *
 * An iteration (the engine drives it from the schedule's actions):
 *
 *   mega_grads_start(g)                 nothing launched, nothing zeroed
 *   mega_grads_zero(g, n) ...           until true: zero the gradients
 *   ... backward of every microbatch but a chunk's last only accumulates
 *       (no_sync: nothing is sent) ...
 *   mega_grads_enable(g, c, true)       the chunk's last backward begins:
 *     each unit the model finishes marks its parameters ready
 *     (mega_grads_ready); a bucket whose parameters are all ready is
 *     launched at once, asynchronously, and backward goes on
 *   mega_grads_enable(g, c, false)
 *   mega_grads_launch(g, c)             GRAD_SYNC: launch what is left
 *   mega_grads_wait(g, c)               GRAD_WAIT: finish_grad_sync
 *   mega_grads_wait_tied(g)             the tied embedding's total (below)
 *
 * A launch all-reduces the bucket over the data-parallel group, or with the
 * distributed optimizer reduce-scatters it (this rank's shard gets the sum;
 * the rest of the bucket is stale and nobody reads it). With
 * average_in_collective the reduction's result is scaled by 1/DP as part of
 * the collective, and backward's loss scale is DP times larger (see
 * mega_grads_loss_scale_factor). Launches go to the communicator in bucket
 * order within a backward, which is the same on every data-parallel rank,
 * so every rank issues the same collectives in the same order (comm.h).
 *
 * The tied embedding (GPT-2's wte: the first stage's input embedding, and
 * the LM head of the last stage, which keeps a copy): the two copies'
 * gradients are summed across the two stages and DP (Megatron's
 * _allreduce_embedding_grads). With the embedding group set
 * (mega_grads_set_tied_comm), the loss stage does not reduce its copy: the
 * copy's bucket, alone and launched first (the head's gradient is its
 * backward's first), is sent unreduced to the embedding stage of the same
 * coordinate, which adds it into its own wte gradient just before its wte
 * bucket launches, so that bucket's data-parallel reduction yields the
 * total at once (sum over DP of both copies; the rank's shard of it with
 * the distributed optimizer). The embedding stage then sends that total
 * back without waiting for it; the loss stage receives it into its copy's
 * place (the same shard) and waits for it only in mega_grads_wait_tied.
 * The embedding stage's backward thus ends with its own last bucket, not
 * with a second collective over the embedding group after it.
 *
 * Distributed optimizer: mega_grads_ranges gives the optimizer the
 * parameter pieces this rank owns; after its step mega_grads_gather_params
 * all-gathers every bucket's updated shards in place.
 *
 * The shard copy. A distributed optimizer's moments exist once, on the rank
 * that owns the shard, so a lost rank would take its part of Adam's state
 * with it. With shard_copy_shift s each rank d also steps a copy of shard
 * (d - s) mod DP: after the reductions (and finalize_model_grads) it sends
 * its own shard's final gradients to rank (d + s) mod DP and receives shard
 * (d - s)'s into that shard's place in its own gradient buffer
 * (mega_grads_post_copy, then mega_grads_wait_copy: the transfer overlaps
 * the norm's sums over DP and ends before those over TP and the pipeline,
 * which act as barriers: see mega_rank_step); a second
 * optimizer over mega_grads_copy_ranges then takes the very step the owner
 * takes, on the same inputs, so the copy's moments and parameters are bit
 * for bit the owner's. The copy has parameters of its own (not the
 * buffer's, which the all-gather writes), so its step runs while the
 * gather is in flight. It costs one shard's parameters and two moments in
 * memory and, per step, one shard's gradients sent and one shard's AdamW
 * step. A rank that finished step N therefore holds shards d and (d - s)
 * at N whatever happened to their owners.
 *
 * Threads: everything runs on the rank's training thread (the model's
 * callback too); the communicator's own thread does the transfers.
 *
 * Ownership: mega_grads owns the buffers (backend memory of be) and borrows
 * the stages, the backend and the communicator, which must outlive it:
 * destroy it once the stages are no longer run, and before the stages (it
 * unhooks their callbacks; a stage never frees the buffers it borrows). */
#ifndef MEGA_WORKER_GRADS_H
#define MEGA_WORKER_GRADS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/comm/comm.h"
#include "worker/model/gpt.h"
#include "worker/optim/optim.h"

typedef struct mega_grads_opts {
  int dp_size, dp_rank;
  bool overlap;               /* --overlap-grad-reduce: buckets of bucket_size */
  bool distributed;           /* --use-distributed-optimizer */
  bool average_in_collective; /* --average-in-collective */
  long long bucket_size;      /* elements; <= 0: max(40M, 1M x DP) */
  /* Distributed optimizer at DP > 1: each rank also keeps a copy of the
   * shard of data-parallel rank (dp_rank - shift) mod DP (see "The shard
   * copy" above); 0: no copy. */
  int shard_copy_shift;
} mega_grads_opts;

/* Megatron's default bucket size for a data-parallel size. */
long long mega_grads_default_bucket_size(int dp_size);

typedef struct mega_grads_bucket {
  int chunk;
  size_t offset, numel;   /* floats, in the chunk's buffers; numel padded */
  size_t numel_unpadded;  /* up to the end of its last tensor */
  int param_lo, param_hi; /* it holds the chunk's params [param_lo, param_hi) */
  bool tied;              /* the tied embedding (or the loss stage's copy) alone */
  bool tied_copy;         /* the loss-only stage's copy of wte */
  size_t shard_offset, shard_numel; /* this rank's part, from offset: the whole
                                       bucket unless distributed */
} mega_grads_bucket;

typedef struct mega_grads mega_grads;

/* Lays out and allocates the buffers of the vp chunks, rebinds each stage
 * onto them (its current parameters are copied) and registers for their
 * grads-done callbacks. */
mega_status mega_grads_create(mega_backend *be, mega_gpt_stage *const *stages, int vp,
                              const mega_grads_opts *opts, mega_grads **out, mega_err *err);
void mega_grads_destroy(mega_grads *g); /* NULL is fine; waits for nothing: wait first */

/* The data-parallel communicators (NULL when DP is 1: launches then reduce
 * nothing): dp moves the buffers (backend memory: buckets, shards,
 * parameters), host the whole moments a checkpoint gathers (host memory;
 * NULL: dp). Set them before the first launch. */
void mega_grads_set_comm(mega_grads *g, mega_comm *dp, mega_comm *host);

int mega_grads_num_buckets(const mega_grads *g);
const mega_grads_bucket *mega_grads_bucket_at(const mega_grads *g, int i); /* chunk order */
/* The buckets of chunk c are [*first, *first + *count). */
void mega_grads_chunk_buckets(const mega_grads *g, int c, int *first, int *count);

/* Resets the iteration: nothing ready, nothing launched, the gradients
 * still to zero (mega_grads_zero). Every launched reduction must have been
 * waited. */
mega_status mega_grads_start(mega_grads *g, mega_err *err);

/* Zeroes up to max_floats more of the gradients (chunk by chunk, each
 * buffer from its start); true once all of them are zero. Every backward
 * of the iteration must come after it returned true (mega_grads_ready
 * reports one that did not). The engine zeroes a slice at a time while
 * the rank waits for a receive (its warmup bubble) and the rest before its
 * first backward: on the cpu backend a stage's memset is milliseconds, and
 * at the iteration's start it delayed the pipeline by as much, by a
 * different amount on each data-parallel replica. */
bool mega_grads_zero(mega_grads *g, size_t max_floats);
/* Counts the gradients as zeroed without writing them; they must be zero
 * already (--simulate-compute, whose backward writes none). Until the next
 * mega_grads_start their norm is 0 without a pass over them: under
 * --simulate-compute that pass was the one compute left beside the
 * reductions on the cores (about 1 ms a million floats, and the last
 * buckets' ran beside the last reductions). */
void mega_grads_still_zero(mega_grads *g);

/* Readiness-driven launches for chunk c on or off (the chunk's last
 * backward; everything else runs under no_sync). */
void mega_grads_enable(mega_grads *g, int c, bool on);

/* Params [first, first+count) of chunk c have this microbatch's gradients.
 * Counted only while enabled; a bucket all of whose params are counted is
 * launched. Whether enabled or not, the buckets whose reductions are over
 * are taken (mega_grads_wait's work for them: 1/DP and the norm's share;
 * the tied embedding's bucket excepted), so that work runs while backward
 * does, not beside the last reductions. A failure is kept and returned by
 * the next mega_grads_launch or mega_grads_wait (the model's callback
 * cannot fail). */
void mega_grads_ready(mega_grads *g, int c, int first, int count);

/* GRAD_SYNC: launches every bucket of chunk c not launched yet. */
mega_status mega_grads_launch(mega_grads *g, int c, mega_err *err);
/* GRAD_WAIT: waits for every bucket of chunk c (launching any left), then
 * applies average_in_collective's 1/DP to what this rank owns. */
mega_status mega_grads_wait(mega_grads *g, int c, mega_err *err);

/* When bucket b's reduction ran in this iteration, for measurements
 * (CLOCK_REALTIME seconds; 0 where it did not happen or the communicator
 * records no times): launched (by backward or the GS), begun and finished
 * on the data-parallel communicator's thread, and taken (a later backward
 * unit found it done, or its GW or finalize waited for it); cpu_s and runq_s are that thread's (comm.h's
 * mega_req_times; -1 unknown). */
typedef struct mega_grads_timing {
  double launched, started, done, waited;
  double cpu_s, runq_s;
} mega_grads_timing;
const mega_grads_timing *mega_grads_timing_of(const mega_grads *g, int b);
/* When the last of this iteration's reductions finished (its comm thread's
 * time, else when its wait returned), excluding the norm's shares the
 * waits take; 0 when none ran. */
double mega_grads_reduced_at(const mega_grads *g);

/* Observes every launch (tests): fn(arg, bucket index). */
void mega_grads_on_launch(mega_grads *g, void (*fn)(void *arg, int bucket), void *arg);

/* What the loss scale of backward is multiplied by: DP with
 * average_in_collective (the collective divides by DP), else 1. */
double mega_grads_loss_scale_factor(const mega_grads *g);

/* Sum of squares of the gradients this rank owns after the reduction (its
 * shards with the distributed optimizer, else everything), the loss
 * stage's copy of wte left out, and TP-replicated tensors counted by TP
 * rank 0 alone, so that summed over the data-parallel group (distributed),
 * the TP group and the pipeline each element counts exactly once. Call it
 * once the gradients are final (after the embedding and sequence-parallel
 * sums). mega_grads_wait already took each reduced bucket's share (while
 * later buckets still ran, so the norm is off the step's tail), except
 * the sequence-parallel layernorms', which a later sum changes, and the
 * tied embedding's (summed before its bucket's reduction now, but kept for
 * the end like them): this takes those and adds all up. The result is the
 * same bits whenever the buckets finished. */
mega_status mega_grads_sumsq(mega_grads *g, double *out, mega_err *err);

/* The tied embedding's exchange ("The tied embedding" above). embd: the
 * embedding group (the first and the last stage of one data-parallel and
 * TP coordinate; NULL, or a group of one, when PP is 1 or the head is
 * untied: no exchange). Set it before the first start; it allocates the
 * embedding stage's receive buffer (wte's size). */
mega_status mega_grads_set_tied_comm(mega_grads *g, mega_comm *embd, mega_err *err);
/* Waits for what the exchange left in flight: on the loss stage the total
 * (its copy's final gradient: call it before the optimizer or the shard
 * copy read it), on the embedding stage the total's send back (before the
 * gradients are zeroed again). Call it every iteration, after the chunks'
 * waits. */
mega_status mega_grads_wait_tied(mega_grads *g, mega_err *err);
/* The exchange's times in this iteration, as a bucket's (launched 0: none
 * ran; P2P has no comm-thread times, so done is when the wait returned).
 * Embedding stage: the copy's receive posted (launched), its wte bucket's
 * launch waiting for it (started), the copy there (done, waited). Loss
 * stage: the copy sent (launched, started), the total there (done,
 * waited). *floats: the tensor's size. */
const mega_grads_timing *mega_grads_tied_timing(const mega_grads *g, size_t *floats);

/* The optimizer's ranges: with the distributed optimizer, each parameter's
 * piece inside this rank's shards; else every parameter whole. The array
 * is g's (valid until destroy). */
const mega_optim_range *mega_grads_ranges(const mega_grads *g, size_t *n);

/* Where each of those ranges sits: param is its tensor's index among the
 * chunks' parameters (chunk by chunk, mega_gpt_params order: mega_chunks'
 * order), elem its first element within that tensor. Parallel to the
 * ranges, g's. */
typedef struct mega_grads_piece {
  size_t param, elem;
} mega_grads_piece;
const mega_grads_piece *mega_grads_pieces(const mega_grads *g, size_t *n);

/* The shard copy (shard_copy_shift): whose shard it is (-1: none), its
 * ranges for the copy's optimizer (its own parameters; the gradients in
 * this rank's buffer at that shard's place) and where they sit. */
int mega_grads_copy_shard(const mega_grads *g);
const mega_optim_range *mega_grads_copy_ranges(const mega_grads *g, size_t *n);
const mega_grads_piece *mega_grads_copy_pieces(const mega_grads *g, size_t *n);
/* Sets the copy's parameters from this rank's buffer at that shard's
 * place: call once the buffers hold the job's starting parameters (after
 * create, a load or a fetch from replicas). A no-op without a copy. */
mega_status mega_grads_copy_take_params(mega_grads *g, mega_err *err);
/* The memory the copy's parameters take (0 without a copy). */
size_t mega_grads_copy_param_bytes(const mega_grads *g);
/* After finalize_model_grads: posts the send of this rank's shard of the
 * gradients to the rank that copies it and the receive of the copied
 * shard's (both over the data-parallel communicator). Until the wait, the
 * own shard's gradients must not change and the copied shard's place is
 * the transfer's. wait: both done (or the first failure); post waits for
 * one still in flight first. No-ops without a copy. */
mega_status mega_grads_post_copy(mega_grads *g, mega_err *err);
mega_status mega_grads_wait_copy(mega_grads *g, mega_err *err);

/* Distributed optimizer, after the step: all-gathers every bucket's
 * parameter shards in place, so every rank holds every updated parameter.
 * Without async it waits for them; with async (--overlap-param-gather) it
 * returns at once, and mega_grads_wait_params waits (c < 0: every chunk).
 * A no-op without the distributed optimizer or at DP 1. */
mega_status mega_grads_gather_params(mega_grads *g, bool async, mega_err *err);
mega_status mega_grads_wait_params(mega_grads *g, int c, mega_err *err);
/* Whether every parameter gather launched so far was waited and succeeded:
 * false while one is in flight or after one failed, when buckets may hold
 * a mix of old and new parameters (only this rank's own shards, and the
 * copied one, are then known to be whole). */
bool mega_grads_params_whole(const mega_grads *g);
/* After a failure (the communicator aborted): waits for and releases every
 * reduction and gather still in flight, so nothing writes the buffers any
 * more. */
void mega_grads_quiesce(mega_grads *g);
/* Params [first, first+count) of chunk c are about to be read (forward):
 * waits for the gathers of their buckets still in flight. The model calls
 * it through its params-needed callback; a failure is kept like a launch's
 * and returned by mega_grads_wait_params or mega_grads_launch. */
void mega_grads_need(mega_grads *g, int c, int first, int count);

/* Checkpoints of a distributed optimizer: whole moments in the buffers'
 * layout (per chunk and moment one host array of mega_gpt_num_params
 * floats, so a parameter's moments sit at its mega_param_info.offset).
 * gather fills every element on every rank from the optimizer's shards (a
 * collective: every data-parallel rank calls it); scatter copies this
 * rank's shards out of whole moments into the optimizer. */
mega_status mega_grads_gather_moments(mega_grads *g, mega_optim *o, float *const *exp_avg,
                                      float *const *exp_avg_sq, mega_err *err);
mega_status mega_grads_scatter_moments(mega_grads *g, mega_optim *o, float *const *exp_avg,
                                       float *const *exp_avg_sq, mega_err *err);
/* The same into the shard copy's optimizer (over mega_grads_copy_ranges). */
mega_status mega_grads_scatter_copy_moments(mega_grads *g, mega_optim *copy,
                                            float *const *exp_avg, float *const *exp_avg_sq,
                                            mega_err *err);

/* Resident bytes: parameter buffers and gradient buffers of all chunks. */
size_t mega_grads_param_bytes(const mega_grads *g);
size_t mega_grads_grad_bytes(const mega_grads *g);

#endif
