/* A discrete-event simulation of a schedule under a cost model.
 *
 * Compute: T_f, T_b and T_w are the times of one microbatch through a rank's
 * whole share of layers, so with vp chunks each F, B or W costs 1/vp of them.
 * A B without a W costs T_b + T_w.
 *
 * Communication: a send is posted when its action is reached and never
 * blocks; its data arrives p2p_latency + activation_bytes / p2p_bandwidth
 * later. A receive blocks until the data has arrived. The defaults (all
 * zero, bandwidth 0 meaning infinite) make the closed forms exact:
 *   1F1B, T_f = T_b:  makespan (M+P-1)(T_f+T_b), bubble (P-1)/(M+P-1);
 *   interleaved, M a multiple of P: bubble (P-1)/(V*M+P-1).
 *
 * Gradient sync (GS, GW): each rank has one data-parallel communicator
 * whose collectives run one at a time in launch order. A chunk's reduction
 * costs grad_sync / vp (grad_sync is the whole rank's), split into
 * grad_buckets buckets: equal, or as grad_bucket_sizes gives them (the
 * engine's are not: full buckets, then what is left of the chunk). When a
 * GS follows its chunk's last backward at once, a bucket is ready as far
 * through that backward as the buckets up to it are through the chunk's
 * floats, as the engine launches buckets while layers finish; otherwise
 * every bucket is ready at the GS. A GW waits until the chunk's last bucket
 * is done. A rank's exposed grad sync is how long its reductions outlast
 * the pipeline: max(0, its end - the latest end of any rank's other
 * actions), the engine's grad_sync_exposed_s (waiting while another stage
 * still computes is bubble). The tied embedding's sum across the first
 * and last stage costs nothing here: the engine adds the loss stage's
 * copy (sent when its head's gradient is done, its backward's first step)
 * into the first stage's wte bucket before that bucket's reduction, and
 * sends the total back while both go on (worker/engine/grads.h).
 *
 * Latency (grad_sync_latency): every collective also costs a fixed time
 * whatever its size, each bucket. On one machine most of it is CPU,
 * so with shared lanes it is shared like the bytes. Without it, time goes
 * by floats alone, and the small collectives that end a first stage's
 * backward cost nothing (bench_dp.py timeline shows they do).
 *
 * Shared links (grad_sync_lanes > 0): the stages' data-parallel groups do
 * not each have links of their own but share what moves their bytes (the
 * cores of one machine, as Gloo on loopback: bench_comm lanes measures
 * it): at most grad_sync_lanes reductions run at full speed at once, and
 * when k > lanes run, each runs at lanes/k of it. The engine's GWs come at
 * the end of each rank's list, so the reductions are computed after the
 * pipeline, in time order across ranks; a schedule with anything but GWs
 * after a rank's first GW is refused then. 0 keeps each rank's
 * communicator independent (a cluster, where each stage's DP group has its
 * links). grad_sync_slowdown says the same as measured (bench_comm lanes):
 * slowdown[k-1] is how much slower each of k reductions at once runs than
 * one alone (k = 1..n; from n on their total speed stays n's); on two
 * cores two pairs ran 1.5x slower where lanes of 1.9 (fitted to four) say
 * 1.05x. Lanes L are slowdowns max(1, k/L).
 *
 * Ownership: mega_sim_run fills a caller-owned mega_sim whose arrays it
 * allocates; free them with mega_sim_free. */
#ifndef MEGA_CORE_SIM_H
#define MEGA_CORE_SIM_H

#include "core/schedule.h"

typedef struct mega_cost {
  double t_f, t_b, t_w;
  double p2p_latency;      /* per message, in the same time unit */
  double p2p_bandwidth;    /* bytes per time unit; 0 means infinite */
  double activation_bytes; /* bytes of one activation or gradient message */
  double grad_sync;        /* one rank's data-parallel gradient reduction, all chunks */
  int grad_buckets;        /* buckets per chunk (< 1: 1) */
  const double *grad_bucket_sizes; /* [grad_buckets] relative sizes in launch order, every
                                      chunk alike; NULL: equal */
  double grad_sync_lanes;  /* reductions at full speed at once across ranks (>= 1); 0: each its own */
  double grad_sync_latency; /* per collective, on top of its share of grad_sync */
  const double *grad_sync_slowdown; /* [n]: k reductions at once each run slowdown[k-1]
                                       times slower (>= 1); NULL: lanes */
  int grad_sync_slowdown_n;
} mega_cost;

typedef struct mega_span {
  double start, end;
} mega_span;

typedef struct mega_sim_rank {
  mega_span *spans; /* one per action, parallel to the schedule's acts; a
                       receive's span is the time it waited */
  double busy;      /* time in F, B and W */
  double idle;      /* makespan - busy */
  double bubble_fraction; /* idle / makespan */
  double end;       /* when the rank's last action ends */
  int peak_inflight;
  double work_end;  /* when its last action other than GS and GW ends */
  double grad_sync_exposed; /* see above */
  mega_span *reduce; /* when its data-parallel communicator reduced each bucket */
  int nreduce;
} mega_sim_rank;

typedef struct mega_sim {
  int pp;
  double makespan;
  double bubble_fraction; /* mean over ranks */
  double grad_sync_exposed; /* mean over ranks */
  mega_sim_rank *ranks;   /* [pp] */
} mega_sim;

/* The most bucket reductions (pp x vp x grad_buckets) one run simulates:
 * each costs memory and time, and a count past this is a typing error
 * rather than a model (a bucket is tens of millions of floats). */
#define MEGA_SIM_MAX_REDUCTIONS (1 << 20)

/* Runs the schedule. Fails with a message naming the stuck ranks and
 * actions if it cannot finish (a schedule that has not been validated), or
 * past MEGA_SIM_MAX_REDUCTIONS. */
mega_status mega_sim_run(const mega_schedule *s, const mega_cost *cost, mega_sim *out,
                         mega_err *err);
void mega_sim_free(mega_sim *sim);

#endif
