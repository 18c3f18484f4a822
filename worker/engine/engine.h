/* The engine: one loop that executes this rank's action list from
 * core/schedule for one iteration, whatever the schedule.
 *
 * F, B and W run on the rank's stage models (one per model chunk). A run
 * of communication actions between two compute actions is one P2P step: it
 * is posted together (worker/engine/p2p.h). Sends complete in the background: they
 * never hold up compute, as core/sim models them (except with
 * --deallocate-pipeline-outputs and no overlap, where a step waits for its
 * sends so each output is freed the moment it is sent, as in Megatron). Without
 * --overlap-p2p-comm the step's receives are waited at once; with it, each
 * receive is waited only by the compute action that needs its data, and in
 * the steady phase the receives of the next step are posted one step ahead
 * so their transfer overlaps this rank's compute
 * (--overlap-p2p-comm-warmup-flush prefetches in warmup and cooldown too, as
 * Megatron's flag does).
 *
 * Memory: per (microbatch, chunk) the engine holds the activations the
 * backward needs (mega_gpt_acts), the received input until F has copied it,
 * the output until it is sent (--deallocate-pipeline-outputs) or until its
 * backward, and the gradients in flight. It counts the bytes of all of them
 * and reports the peak. Buffers and activations are pooled across
 * microbatches and iterations, so the count is what the schedule needs, not
 * what malloc was asked.
 *
 * Gradient sync: GS and GW run the chunk's data-parallel reduction through
 * worker/grads (launch, wait). When a chunk's GS follows its last backward
 * (B, or W with zero-bubble), that backward runs with the chunk's buckets
 * enabled: each layer that finishes marks its parameters ready and a full
 * bucket launches at once (a plain B runs input and weight halves layer by
 * layer for that: mega_gpt_backward); every other backward only
 * accumulates (no_sync). The time a GW waits is reported (grad_wait_s),
 * with work_end_wall, the moment the rank's other work ended, so the rank
 * can tell the pipeline's drain from the exposed reduction.
 *
 * Measurement: every action is timed. Compute is F, B and W; a wait for a
 * receive is bubble while its sender had not yet sent (the pipeline had
 * nothing for this rank) and transfer time after; the bubble is split by
 * the phase (warmup, steady, cooldown) of the compute action that waited.
 *
 * --simulate-compute: F, B and W sleep, split over the chunk's units
 * (mega_gpt_units) in proportion to their parameters, and each unit of a
 * backward marks its parameters ready as its share ends, so overlap is
 * measured on real-sized gradient buffers without compute competing for the
 * cores.
 *
 * Ownership: the engine borrows everything in its config, which must
 * outlive it. */
#ifndef MEGA_WORKER_ENGINE_H
#define MEGA_WORKER_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/jobspec.h"
#include "core/schedule.h"
#include "core/status.h"
#include "worker/data/data.h"
#include "worker/engine/grads.h"
#include "worker/engine/p2p.h"
#include "worker/engine/span.h"
#include "worker/model/gpt.h"

typedef struct mega_engine_config {
  const mega_schedule *sched;
  int pp_rank;
  mega_gpt_stage *const *chunks; /* [sched->vp] */
  mega_backend *be;
  mega_p2p *p2p;                 /* NULL when pp == 1 */
  mega_grads *grads;             /* the chunks' gradient buffers; NULL when forward_only */
  const mega_data *data;
  const mega_batch_plan *plan;
  int dp_rank;
  int seq_len, hidden;
  int stream_split;        /* sequence parallelism: activations are [B*T/split, hidden]; 0 or 1: whole */
  bool overlap_p2p;        /* --overlap-p2p-comm */
  bool overlap_warmup_flush; /* --overlap-p2p-comm-warmup-flush */
  bool deallocate_outputs; /* --deallocate-pipeline-outputs */
  bool variable_seq;       /* --variable-seq-lengths */
  bool forward_only;       /* evaluation: no backward, no gradients */
  bool eval_data;          /* read the evaluation windows (mega_data_eval_microbatch) */
  bool test_data;          /* read the test split's (mega_data_test_microbatch) instead */
  /* --simulate-compute: F, B and W sleep instead of computing (ms for the
   * rank's whole share; a chunk sleeps 1/vp of it). */
  bool simulate;
  double sim_f_ms, sim_b_ms, sim_w_ms;
} mega_engine_config;

typedef struct mega_engine_result {
  double loss_sum;   /* last stage: sum of token losses of this replica */
  uint64_t tokens;   /* target tokens this replica's microbatches hold */
  double schedule_s; /* wall time from the first action to the last */
  double compute_s;
  double bubble_s, bubble_warmup_s, bubble_steady_s, bubble_cooldown_s;
  double p2p_wait_s;
  size_t peak_bytes; /* activations (each chunk's recompute scratch too) and P2P buffers alive at once */
  int peak_inflight; /* (microbatch, chunk) activations alive at once */
  double grad_wait_s;   /* in GW actions */
  double work_end_wall; /* wall clock when the last action other than GS and GW ended */
} mega_engine_result;

typedef struct mega_engine mega_engine;

mega_status mega_engine_create(const mega_engine_config *cfg, mega_engine **out, mega_err *err);
void mega_engine_destroy(mega_engine *e);

/* Runs the schedule once for `iteration` (0-based, which picks the data).
 * Gradients accumulate into the chunks' grad buffers, which it zeroes
 * (mega_grads_zero) while the rank waits and before its first backward.
 * With spans non-NULL, every action's span is appended there (cap entries
 * at most; *nspans counts them), times from t0_wall (seconds, wall clock). */
mega_status mega_engine_run(mega_engine *e, int64_t iteration, mega_engine_result *res,
                            mega_rank_span *spans, size_t cap, size_t *nspans, double t0_wall,
                            mega_err *err);

/* Sizes a variable-length receive once its shape is known (a
 * mega_p2p_alloc_fn; give it the engine). */
mega_status mega_engine_alloc_recv(void *engine, mega_p2p_msg *m, size_t floats, mega_err *err);

/* Sequence length of microbatch `micro` (of this replica) in an iteration:
 * seq_len, or with --variable-seq-lengths the length the data order gives
 * it (worker/data/data.h). */
int mega_engine_seq_len(const mega_engine *e, int64_t iteration, int micro);

/* Target tokens of an iteration over every data-parallel replica: the
 * denominator of its mean loss. With --variable-seq-lengths replicas may
 * hold different numbers (their microbatches have different lengths), so
 * this is not this replica's count times DP. */
uint64_t mega_engine_iteration_tokens(const mega_engine *e, int64_t iteration);

#endif
