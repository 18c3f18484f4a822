#include "worker/rank/rank.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/schedule.h"
#include "core/topology.h"
#include "worker/backend/cuda_module.h"
#include "worker/data/data.h"
#include "worker/engine/chunks.h"
#include "worker/engine/engine.h"
#include "worker/optim/lr_sched.h"
#include "worker/rank/rank_internal.h"

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

mega_status mega_rank_create(const mega_rank_env *env, mega_rank **out, mega_err *err) {
  *out = NULL;
  const mega_jobspec *job = env->job;
  if (env->world_size < 1 || env->rank < 0 || env->rank >= env->world_size)
    return mega_fail(err, MEGA_ERR_INVALID, "rank %d is out of range for world size %d",
                     env->rank, env->world_size);
  if (env->world_size > 1 && !env->kv == !env->store_dir)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "a world of %d ranks needs exactly one rendezvous store (the daemon's "
                     "key-value store or a store directory)", env->world_size);
  mega_rank *r = calloc(1, sizeof *r);
  if (!r) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory creating rank %d", env->rank);
  r->env = *env;
  r->job = job;
  pthread_mutex_init(&r->comm_lock, NULL);
  mega_abort_guard_init(&r->guard);
  mega_status st = mega_topo_init(&r->topo, env->world_size, job->tensor_model_parallel_size,
                                  job->pipeline_model_parallel_size, err);
  if (st != MEGA_OK) {
    free(r);
    return st;
  }
  r->me = mega_topo_coord(&r->topo, env->rank);
  *out = r;
  return MEGA_OK;
}

/* How long an abort lets the norm's last sums finish (abort_guard.h): they
 * take milliseconds between live peers; a hung one costs this much. */
#define ABORT_GRACE_MS 500

void mega_rank_abort(mega_rank *r, const char *reason) {
  if (atomic_exchange(&r->aborted, true)) return;
  snprintf(r->abort_reason, sizeof r->abort_reason, "%s", reason ? reason : "aborted");
  mega_abort_guard_close(&r->guard, ABORT_GRACE_MS);
  pthread_mutex_lock(&r->comm_lock);
  for (int g = 0; g < NGROUPS; g++) rank_comm_abort_locked(r, g);
  pthread_mutex_unlock(&r->comm_lock);
}

static mega_status check_abort(mega_rank *r, mega_err *err) {
  if (!atomic_load(&r->aborted)) return MEGA_OK;
  return mega_fail(err, MEGA_ERR_CANCELLED, "rank %d aborted: %s", r->env.rank, r->abort_reason);
}

/* ---- set-up ---- */

static mega_status build_schedule(mega_rank *r, bool forward_only, mega_schedule *out,
                                  mega_err *err) {
  const mega_jobspec *j = r->job;
  int pp = j->pipeline_model_parallel_size, vp = r->layout.vp;
  mega_sched_params p = {
      .kind = j->schedule >= 0 ? (mega_sched_kind)j->schedule : mega_sched_default_kind(pp, vp),
      .pp = pp, .vp = vp,
      .microbatches = forward_only ? r->eval_plan.num_micro : r->plan.num_micro,
      .group_size = vp > 1 ? mega_jobspec_group_size(j) : 0,
      /* seed 003: without overlap the reduction follows the schedule */
      .grad_sync = !j->overlap_grad_reduce ? MEGA_GRAD_SYNC_END
                   : j->align_grad_reduce  ? MEGA_GRAD_SYNC_ALIGNED
                                           : MEGA_GRAD_SYNC_LAST_BACKWARD};
  if (forward_only) {
    p.kind = MEGA_SCHED_FORWARD_ONLY;
    p.grad_sync = MEGA_GRAD_SYNC_NONE;
  }
  mega_status st = mega_sched_check_params(&p, err);
  if (st == MEGA_OK) st = mega_sched_generate(&p, out, err);
  if (st == MEGA_OK) st = mega_sched_validate(out, err);
  if (st != MEGA_OK) mega_err_prefix(err, "schedule");
  return st;
}

static mega_status build_optimizer(mega_rank *r, mega_err *err) {
  const mega_jobspec *j = r->job;
  mega_optim_hparams hp = {.beta1 = j->adam_beta1, .beta2 = j->adam_beta2, .eps = j->adam_eps,
                           .weight_decay = j->weight_decay, .clip_grad = j->clip_grad};
  if (j->use_distributed_optimizer) { /* this rank's shards only, and the copy it keeps */
    size_t n, nc;
    const mega_optim_range *ranges = mega_grads_ranges(r->chunks.grads, &n);
    mega_status st = mega_optim_create(r->be, ranges, n, &hp, &r->optim, err);
    const mega_optim_range *copy = mega_grads_copy_ranges(r->chunks.grads, &nc);
    if (st == MEGA_OK && mega_grads_copy_shard(r->chunks.grads) >= 0)
      st = mega_optim_create(r->be, copy, nc, &hp, &r->copy, err);
    if (st != MEGA_OK) mega_err_prefix(err, "the optimizer shard copy");
    return st;
  }
  mega_status st = mega_optim_create(r->be, r->chunks.ranges, r->chunks.nparams, &hp, &r->optim,
                                     err);
  if (st == MEGA_OK) mega_chunks_bind_optim(&r->chunks, r->optim);
  return st;
}

static mega_status make_engine(mega_rank *r, const mega_schedule *sched, mega_data_which which,
                               mega_engine **out, mega_err *err) {
  bool eval = which != MEGA_DATA_TRAIN;
  const mega_jobspec *j = r->job;
  mega_engine_config ec = {
      .sched = sched, .pp_rank = r->me.pp, .chunks = r->chunks.stages, .be = r->be,
      .p2p = r->p2p, .grads = eval ? NULL : r->chunks.grads, .data = r->data,
      .plan = eval ? &r->eval_plan : &r->plan,
      .dp_rank = r->me.dp,
      .seq_len = j->seq_length, .hidden = j->hidden_size,
      .stream_split = j->sequence_parallel ? r->topo.tp : 1, .overlap_p2p = j->overlap_p2p_comm,
      .overlap_warmup_flush = j->overlap_p2p_comm_warmup_flush,
      .deallocate_outputs = j->deallocate_pipeline_outputs,
      .variable_seq = j->variable_seq_lengths && !eval, .forward_only = eval,
      .eval_data = which == MEGA_DATA_VALID, .test_data = which == MEGA_DATA_TEST};
  mega_status st = MEGA_OK;
  if (j->simulate_compute) {
    mega_sim_compute sc;
    st = mega_jobspec_parse_simulate_compute(j->simulate_compute, &sc, err);
    ec.simulate = r->simulate = true;
    ec.sim_f_ms = sc.f_ms;
    ec.sim_b_ms = sc.b_ms;
    ec.sim_w_ms = sc.has_w ? sc.w_ms : 0;
  }
  if (st == MEGA_OK) st = mega_engine_create(&ec, out, err);
  return st;
}

static mega_status build_engine(mega_rank *r, mega_err *err) {
  const mega_jobspec *j = r->job;
  mega_status st = MEGA_OK;
  if (r->dcomm[GROUP_PP]) {
    mega_p2p_opts po = {.batch = j->batch_p2p_comm, .variable_seq = j->variable_seq_lengths,
                        .be = r->be, .shape_comm = r->hcomm[GROUP_PP]};
    st = mega_p2p_create(r->dcomm[GROUP_PP], r->sched.pp, r->sched.vp, &po, &r->p2p, err);
  }
  if (st == MEGA_OK) st = make_engine(r, &r->sched, MEGA_DATA_TRAIN, &r->engine, err);
  if (st == MEGA_OK && mega_jobspec_evaluates_at_end(j))
    st = make_engine(r, &r->eval_sched, MEGA_DATA_VALID, &r->eval_engine, err);
  if (st == MEGA_OK && mega_data_has_test(r->data))
    st = make_engine(r, &r->eval_sched, MEGA_DATA_TEST, &r->test_engine, err);
  return st;
}

/* Room for iteration K's spans (--trace-iteration): every action of the
 * rank's current schedule, and the optimizer's. */
static mega_status size_spans(mega_rank *r, mega_err *err) {
  if (r->job->trace_iteration <= 0) return MEGA_OK;
  size_t cap = (size_t)r->sched.ranks[r->me.pp].n * 2 + 16 +
               2 * ((size_t)mega_grads_num_buckets(r->chunks.grads) + 1);
  if (cap <= r->span_cap) return MEGA_OK;
  mega_rank_span *spans = realloc(r->spans, cap * sizeof *spans);
  if (!spans) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for the trace");
  r->spans = spans;
  r->span_cap = cap;
  return MEGA_OK;
}

/* The plan, schedule and engine for iteration it's global batch. A
 * --rampup-batch-size job rebuilds them each time its batch grows; the
 * plan's iter0 and sample0 keep the data order the closed formula of the
 * flags (worker/data/data.h). */
static mega_status ensure_batch(mega_rank *r, int64_t it, mega_err *err) {
  const mega_jobspec *j = r->job;
  int G = mega_jobspec_batch_of(j, it);
  if (G == r->plan.global_batch && r->engine) return MEGA_OK;
  mega_batch_plan p;
  mega_status st = mega_batch_plan_init(&p, G, j->micro_batch_size, r->topo.dp, err);
  if (st != MEGA_OK) return st;
  p.iter0 = it;
  p.sample0 = mega_jobspec_samples_before(j, it);
  mega_engine_destroy(r->engine);
  r->engine = NULL;
  mega_sched_free(&r->sched);
  r->plan = p;
  st = build_schedule(r, false, &r->sched, err);
  if (st == MEGA_OK) st = make_engine(r, &r->sched, MEGA_DATA_TRAIN, &r->engine, err);
  if (st == MEGA_OK) st = size_spans(r, err);
  if (st != MEGA_OK)
    mega_err_prefix(err, "global batch %d from iteration %lld", G, (long long)it + 1);
  return st;
}

/* --backend: cuda through its module on the rank's device (the
 * assignment's, else its local rank); auto takes cuda for a single rank
 * where a GPU's device files are, and says why when it falls back. Rank 0
 * on cuda says when attention dropout takes --bf16's flash attention away
 * (mega_jobspec_cuda_attention_note). */
static mega_status pick_backend(mega_rank *r, mega_err *err) {
  const mega_jobspec *j = r->job;
  int kind = j->backend;
  bool gpu = access("/dev/nvidiactl", F_OK) == 0;
  if (kind == MEGA_JOB_BACKEND_AUTO)
    kind = gpu && r->env.world_size == 1 ? MEGA_JOB_BACKEND_CUDA : MEGA_JOB_BACKEND_CPU;
  if (kind == MEGA_JOB_BACKEND_CUDA) {
    int dev = r->env.device >= 0 ? r->env.device : r->env.local_rank;
    mega_err why = {0};
    mega_status st = mega_backend_cuda_create(dev, &r->be, j->backend == MEGA_JOB_BACKEND_CUDA ? err : &why);
    char note[512];
    if (st == MEGA_OK && r->env.rank == 0 &&
        mega_jobspec_cuda_attention_note(j, note, sizeof note))
      fprintf(stderr, "megaw: %s\n", note);
    if (st == MEGA_OK || j->backend == MEGA_JOB_BACKEND_CUDA) return st;
    fprintf(stderr, "megaw: rank %d: --backend auto: using cpu (%s)\n", r->env.rank, why.msg);
  }
  mega_backend_cpu_opts bo = {.threads = j->blas_threads,
                              .track_memory = r->env.check_comm_memory};
  return mega_backend_cpu_create(&bo, &r->be, err);
}

/* The backend, in --bf16 mode when asked. */
static mega_status make_backend(mega_rank *r, mega_err *err) {
  mega_status st = pick_backend(r, err);
  if (st == MEGA_OK && r->job->bf16) st = r->be->ops->set_bf16(r->be, true, err);
  return st;
}

/* Whose optimizer shard this rank copies: the data-parallel rank one node
 * away. Ranks are contiguous per node and TP varies fastest, so a node
 * holds local_world_size / TP consecutive data-parallel ranks of a stage;
 * a shift of that many puts every copy on another node (when DP is larger;
 * else no node holds a copy of another's, and a shift of 1 still covers
 * the loss of a worker). */
static int copy_shift(const mega_rank *r) {
  int per_node = r->env.local_world_size / r->topo.tp;
  return per_node >= 1 && per_node < r->topo.dp ? per_node : 1;
}

/* The draws skipped for a checkpoint that was gone by the time of the load. */
static mega_status draw_params(mega_rank *r, mega_err *err) {
  mega_status st = MEGA_OK;
  for (int v = 0; v < r->chunks.vp && st == MEGA_OK; v++)
    st = mega_gpt_init_params(r->chunks.stages[v], err);
  return st;
}

/* An allocation that failed says which tensor and how much; this says
 * what to change, once. */
static mega_status memory_advice(const mega_rank *r, mega_status st, mega_err *err) {
  static const char advice[] =
      "needs more memory than it may use (RAM, ulimit -v, a cgroup's limit): spread the model "
      "over more ranks (--pipeline-model-parallel-size, --tensor-model-parallel-size), or take a "
      "smaller --micro-batch-size, --seq-length or model";
  if (st != MEGA_ERR_NOMEM || !err || strstr(err->msg, advice)) return st;
  size_t n = strlen(err->msg);
  snprintf(err->msg + n, sizeof err->msg - n, "; rank %d %s", r->env.rank, advice);
  return st;
}

mega_status mega_rank_setup(mega_rank *r, mega_err *err) {
  const mega_jobspec *j = r->job;
  if (r->be) return MEGA_OK;
  r->start_s = rank_now_s();
  rank_phase(r, "setup");
  mega_status st = make_backend(r, err);
  if (st == MEGA_OK) st = mega_jobspec_layout(j, &r->layout, err);
  mega_grads_opts go = {.dp_size = r->topo.dp, .dp_rank = r->me.dp,
                        .overlap = j->overlap_grad_reduce,
                        .distributed = j->use_distributed_optimizer,
                        .average_in_collective = j->average_in_collective,
                        .bucket_size = j->bucket_size,
                        .shard_copy_shift = j->no_optimizer_shard_copy ? 0 : copy_shift(r)};
  mega_gpt_tp tp;
  if (st == MEGA_OK) st = rank_tp_init(r, &tp, err);
  /* The replicas' state, or a checkpoint's, overwrites every parameter
   * (a missing tensor is an error), so drawing them first would be thrown
   * away: seconds for a GPT-2-sized model on a cpu rank. Only a look at
   * --load here; the load verifies, and draws after all if it finds none. */
  bool no_init = r->env.replicas != NULL || mega_ckpt_present(j->load);
  if (st == MEGA_OK)
    st = mega_chunks_build(&r->chunks, r->be, j, &r->layout, r->me.pp, &tp, &go, no_init, err);
  /* training's plan starts at iteration 0's batch (ensure_batch moves it
   * with a rampup); evaluation always takes --global-batch-size, as in
   * Megatron */
  if (st == MEGA_OK)
    st = mega_batch_plan_init(&r->plan, mega_jobspec_batch_of(j, 0), j->micro_batch_size,
                              r->topo.dp, err);
  if (st == MEGA_OK)
    st = mega_batch_plan_init(&r->eval_plan, j->global_batch_size, j->micro_batch_size,
                              r->topo.dp, err);
  if (st == MEGA_OK) {
    r->lr = mega_lr_sched_from_job(j);
    st = mega_lr_sched_check(&r->lr, err);
  }
  if (st == MEGA_OK) st = mega_data_open_job(j, &r->data, err);
  char note[1200];
  if (st == MEGA_OK && mega_data_cache_note(r->data, note, sizeof note))
    fprintf(stderr, "megaw: rank %d: %s\n", r->env.rank, note);
  if (st == MEGA_OK && mega_data_no_test(r->data)) {
    snprintf(note, sizeof note, "the evaluation after training skips the test share: %s",
             mega_data_no_test(r->data));
    rank_note(r, note);
  }
  if (st == MEGA_OK) st = build_schedule(r, false, &r->sched, err);
  if (st == MEGA_OK && (mega_jobspec_evaluates_at_end(j) || mega_data_has_test(r->data)))
    st = build_schedule(r, true, &r->eval_sched, err);
  if (st == MEGA_OK) st = build_optimizer(r, err);
  if (st == MEGA_OK) st = mega_rank_ckpt_check(j, err);
  /* The committer makes SAVE (a bad one fails now, not at the first save)
   * and clears interrupted saves before the groups exist, so no rank can be
   * writing into it yet. */
  if (st == MEGA_OK && j->save && r->env.rank == 0) st = mega_ckpt_prepare_save(j->save, err);
  if (st == MEGA_OK) st = rank_build_groups(r, err);
  if (st == MEGA_OK)
    mega_grads_set_comm(r->chunks.grads, r->dcomm[GROUP_DP], r->hcomm[GROUP_DP]);
  if (st == MEGA_OK) st = mega_grads_set_tied_comm(r->chunks.grads, r->dcomm[GROUP_EMBD], err);
  if (st == MEGA_OK) st = build_engine(r, err);
  if (st == MEGA_OK) st = size_spans(r, err);
  if (st == MEGA_OK && r->env.replicas) { /* the replicas' state is newer than any --load */
    st = rank_fetch_replicas(r, err);
  } else if (st == MEGA_OK && j->load) {
    st = rank_load_checkpoint(r, err);
    if (st == MEGA_OK) r->iteration = r->loaded.iteration;
    if (st == MEGA_OK) r->eval_done = r->loaded.eval_done;
    if (st == MEGA_OK && no_init && !r->loaded.loaded) st = draw_params(r, err);
  }
  if (st == MEGA_OK) st = mega_grads_copy_take_params(r->chunks.grads, err);
  if (st == MEGA_OK) st = rank_build_saver(r, err);
  r->ready = st == MEGA_OK;
  st = memory_advice(r, st, err);
  if (st != MEGA_OK) rank_same_job_failed(r, err ? err->msg : NULL);
  return st;
}

/* ---- one iteration ---- */

/* Over the pipeline group: the sum of the gradients' squares (for the
 * global norm) and the latest schedule end (when the pipeline drained). */
static mega_status pipeline_stats(mega_comm *c, double *sumsq, double *end, mega_err *err) {
  if (!c) return MEGA_OK;
  int n = mega_comm_size(c);
  double mine[2] = {*sumsq, *end}, all[2 * n];
  size_t counts[n];
  for (int i = 0; i < n; i++) counts[i] = sizeof mine;
  mega_status st = mega_comm_all_gather(c, mine, all, counts, MEGA_DT_BYTE, 0, err);
  if (st != MEGA_OK) return st;
  *sumsq = 0;
  for (int i = 0; i < n; i++) {
    *sumsq += all[2 * i];
    if (all[2 * i + 1] > *end) *end = all[2 * i + 1];
  }
  return MEGA_OK;
}

/* finalize_model_grads: the data-parallel reductions (the schedule's GWs
 * waited for them already; this finds nothing left) and the
 * sequence-parallel layernorms' sum. The tied embedding's sum is no longer
 * here: the loss stage's copy joined the embedding stage's wte bucket
 * before its reduction, and the total comes back to the loss stage while
 * the ranks go on (grads.h; mega_grads_wait_tied). *reduced: when the last
 * of these sums was done (wall clock; 0: none ran), which leaves out the
 * norm's shares the waits take between them. */
static mega_status finalize_grads(mega_rank *r, double *reduced, mega_err *err) {
  mega_status st = MEGA_OK;
  for (int v = 0; v < r->chunks.vp && st == MEGA_OK; v++)
    st = mega_grads_wait(r->chunks.grads, v, err);
  *reduced = mega_grads_reduced_at(r->chunks.grads);
  if (st == MEGA_OK && r->topo.tp > 1 && r->job->sequence_parallel) {
    st = rank_tp_finalize_grads(r, err);
    *reduced = wall_s();
  }
  return st;
}

static uint64_t replica_tokens(const mega_rank *r, int64_t it) {
  uint64_t n = 0;
  for (int m = 0; m < r->plan.num_micro; m++)
    n += (uint64_t)r->plan.micro_batch * (uint64_t)mega_engine_seq_len(r->engine, it, m);
  return n;
}

mega_status mega_rank_step(mega_rank *r, mega_rank_metrics *m, mega_err *err) {
  int64_t it = r->iteration;
  rank_phase(r, "train");
  double t0 = wall_s();
  *m = (mega_rank_metrics){.iteration = it + 1, .rank = r->env.rank, .pp_rank = r->me.pp,
                           .dp_rank = r->me.dp, .tp_rank = r->me.tp,
                           .step_start_unix_us = (int64_t)(t0 * 1e6)};
  r->nspans = 0;
  double cpu0, runq0, pcpu0;
  rank_thread_clock(&cpu0, &runq0, &pcpu0);
  mega_status st = ensure_batch(r, it, err);
  if (st == MEGA_OK) st = mega_grads_start(r->chunks.grads, err);
  mega_engine_result res;
  bool trace = r->job->trace_iteration == it + 1 && r->spans;
  if (st == MEGA_OK)
    st = mega_engine_run(r->engine, it, &res, trace ? r->spans : NULL, r->span_cap, &r->nspans,
                         t0, err);
  if (st != MEGA_OK) return st;
  double te = wall_s(); /* the engine's last span (a GW's wait) ended by now */

  /* The rank's pipeline work ended at ts; since then it has waited for its
   * gradient reductions (the schedule's GWs) and the pipeline's drain. */
  double ts = res.work_end_wall, tg;
  st = finalize_grads(r, &tg, err);
  /* the shard copy's gradients, once they are final (grads.h): the tied
   * embedding's total is among them, so the loss stage waits for it here.
   * Posted now, waited after the norm's sum over DP. */
  if (st == MEGA_OK && r->copy) st = mega_grads_wait_tied(r->chunks.grads, err);
  if (st == MEGA_OK && r->copy) st = mega_grads_post_copy(r->chunks.grads, err);
  /* The loss is known on the last stage; its replicas add their sums. */
  bool has_loss = mega_sched_is_last_stage(&r->sched, r->me.pp, r->sched.vp - 1) &&
                  !r->simulate;
  double loss_sum = res.loss_sum;
  if (st == MEGA_OK && has_loss) {
    st = rank_sum_doubles(r->hcomm[GROUP_DP], &loss_sum, err);
    tg = wall_s();
  }
  /* tg: the gradients reduced (finish_grad_sync, finalize_model_grads), the
   * norm's shares the waits took meanwhile left out: they are the
   * optimizer's, as in Megatron's timers */
  if (tg < ts) tg = ts;
  /* The global norm counts every element once: the shards this rank owns
   * summed over the data-parallel group (distributed optimizer), the slices
   * over the TP group (replicated tensors counted by TP rank 0), the stages
   * over the pipeline, the tied copy left out. */
  double sumsq = 0, drained = ts;
  if (st == MEGA_OK) st = mega_grads_sumsq(r->chunks.grads, &sumsq, err);
  if (st == MEGA_OK && r->job->use_distributed_optimizer)
    st = rank_sum_doubles(r->hcomm[GROUP_DP], &sumsq, err);
  /* The copy's exchange ends before the sums over TP and the pipeline, so
   * a peer that died before its gradients came stops this rank where its
   * TP and pipeline peers stop too. Waited later, the survivors of one
   * failure held different iterations (one stage stepped, another not),
   * which no replica plan can join. */
  double tc = wall_s();
  if (st == MEGA_OK && r->copy) st = mega_grads_wait_copy(r->chunks.grads, err);
  double copy_s = wall_s() - tc;
  /* the sums over TP and the pipeline are barriers: an abort lets them end
   * (abort_guard.h); the loss stage's copy of the embedding, its total
   * sent back meanwhile, is among what a rank past them steps with */
  bool guarded = st == MEGA_OK && mega_abort_guard_enter(&r->guard);
  if (st == MEGA_OK && !guarded) st = check_abort(r, err);
  if (st == MEGA_OK) st = rank_sum_doubles(r->hcomm[GROUP_TP], &sumsq, err);
  if (st == MEGA_OK) st = pipeline_stats(r->hcomm[GROUP_PP], &sumsq, &drained, err);
  if (st == MEGA_OK) st = mega_grads_wait_tied(r->chunks.grads, err);
  if (guarded) mega_abort_guard_leave(&r->guard);
  double tsync = wall_s();
  /* Waiting here while another stage still runs its schedule is pipeline
   * bubble (the drain), not gradient sync. Clocks of two nodes may disagree
   * a little: the split is clamped to the wait. */
  double tail = (drained < tsync ? drained : tsync) - ts;
  if (tail < 0) tail = 0;
  /* Exposed: the reductions' end past the pipeline's (the norm that follows
   * is the optimizer's, as in Megatron's timers). */
  double exposed = tg - (drained > ts ? drained : ts);
  if (exposed < 0) exposed = 0;
  /* Megatron's scheduler counts the samples consumed before this step */
  double lr = mega_lr_at(&r->lr, (double)mega_batch_plan_start(&r->plan, it));
  mega_optim_result or = {.grad_norm = sqrt(sumsq)};
  /* distributed optimizer: every rank gets every updated parameter; with
   * --overlap-param-gather forward waits for each bucket when it needs it */
  if (st == MEGA_OK && !r->simulate) {
    r->stepping = true; /* from here a failure leaves this iteration half applied */
    st = mega_optim_step(r->optim, sumsq, lr, &or, err);
    /* the shard copy takes its owner's very step (grads.h) on parameters
     * of its own, while the gather moves this rank's shard; a gather that
     * fails to start still lets it step, so the rank holds both at N */
    mega_status gst = st;
    if (st == MEGA_OK) gst = mega_grads_gather_params(r->chunks.grads, true, err);
    tc = wall_s();
    mega_err cerr = {0};
    if (st == MEGA_OK && r->copy) st = mega_optim_step(r->copy, sumsq, lr, NULL, &cerr);
    copy_s += wall_s() - tc;
    if (st == MEGA_OK) r->stepped = true;
    if (st != MEGA_OK && gst == MEGA_OK) *err = cerr;
    if (st == MEGA_OK) st = gst;
  }
  if (st == MEGA_OK && r->simulate) st = mega_grads_gather_params(r->chunks.grads, true, err);
  if (st == MEGA_OK && !r->job->overlap_param_gather &&
      (st = mega_grads_wait_params(r->chunks.grads, -1, err)) != MEGA_OK)
    mega_err_prefix(err, "gathering the updated parameters");
  if (st == MEGA_OK) st = r->be->ops->synchronize(r->be, err);
  if (st != MEGA_OK) {
    mega_err_prefix(err, "iteration %lld", (long long)it + 1);
    return st;
  }
  double t1 = wall_s();
  if (st == MEGA_OK) st = rank_collect_reductions(r, t0, trace, err);
  if (st != MEGA_OK) return st;
  r->stepping = r->stepped = false;
  if (trace) {
    /* The schedule's GWs after ts are the engine's spans, ending when this
     * thread woke, after the comm thread's last reduction (tg): grad-sync
     * holds them and the norm starts after them, so the track's spans nest
     * (a trace viewer drops spans that overlap partly). */
    double tq = tg > te ? tg : te;
    if (tq > tsync) tq = tsync;
    if (r->nspans < r->span_cap)
      r->spans[r->nspans++] = (mega_rank_span){.name = "grad-sync", .cat = "grad_sync",
                                               .start_us = (ts - t0) * 1e6,
                                               .dur_us = (tq - ts) * 1e6};
    if (r->nspans < r->span_cap)
      r->spans[r->nspans++] = (mega_rank_span){.name = "grad-norm", .cat = "optimizer",
                                               .start_us = (tq - t0) * 1e6,
                                               .dur_us = (tsync - tq) * 1e6};
    if (r->nspans < r->span_cap)
      r->spans[r->nspans++] = (mega_rank_span){.name = "optimizer", .cat = "optimizer",
                                               .start_us = (tsync - t0) * 1e6,
                                               .dur_us = (t1 - tsync) * 1e6};
  }
  r->iteration++;
  uint64_t tokens = replica_tokens(r, it);
  /* the replicas' own counts: under --variable-seq-lengths they differ, and
   * this one's times DP made each DP rank report another loss */
  uint64_t global_tokens = mega_engine_iteration_tokens(r->engine, it);
  m->has_loss = has_loss;
  m->loss = has_loss ? loss_sum / (double)global_tokens : 0;
  m->has_grad_norm = true;
  m->grad_norm = or.grad_norm;
  m->lr = lr;
  m->tokens = tokens;
  m->global_tokens = global_tokens;
  m->global_batch = r->plan.global_batch;
  m->step_time_s = t1 - t0;
  m->compute_s = res.compute_s;
  m->tp_comm_s = rank_tp_take_comm_s(r);
  m->bubble_s = res.bubble_s + tail;
  m->bubble_warmup_s = res.bubble_warmup_s;
  m->bubble_steady_s = res.bubble_steady_s;
  m->bubble_cooldown_s = res.bubble_cooldown_s + tail;
  m->p2p_wait_s = res.p2p_wait_s;
  m->grad_sync_exposed_s = exposed;
  m->peak_activation_bytes = res.peak_bytes;
  m->peak_inflight = res.peak_inflight;
  m->param_bytes = mega_grads_param_bytes(r->chunks.grads);
  m->grad_bytes = mega_grads_grad_bytes(r->chunks.grads);
  m->optimizer_state_bytes = mega_optim_state_bytes(r->optim);
  m->work_end_s = ts - t0;
  m->drained_s = (drained > ts ? drained : ts) - t0;
  m->reduced_s = tg - t0;
  double cpu1, runq1, pcpu1;
  rank_thread_clock(&cpu1, &runq1, &pcpu1);
  m->thread_cpu_s = cpu1 - cpu0;
  m->thread_runq_s = runq0 >= 0 && runq1 >= 0 ? runq1 - runq0 : -1;
  m->process_cpu_s = pcpu1 - pcpu0;
  m->reductions = r->reductions;
  m->nreductions = r->nreductions;
  m->shard_copy_bytes =
      r->copy ? mega_optim_state_bytes(r->copy) + mega_grads_copy_param_bytes(r->chunks.grads) : 0;
  m->shard_copy_s = r->copy ? copy_s : 0;
  m->spans = trace ? r->spans : NULL;
  m->nspans = trace ? r->nspans : 0;
  if (r->eval_engine && r->job->eval_interval > 0 && r->iteration % r->job->eval_interval == 0)
    return rank_evaluate(r, m, err);
  return MEGA_OK;
}

int64_t mega_rank_iteration(const mega_rank *r) { return r->iteration; }
const char *mega_rank_loaded_path(const mega_rank *r) {
  return r->loaded.loaded ? r->loaded.path : NULL;
}
const char *mega_rank_load_notice(const mega_rank *r) {
  return r->loaded.notice[0] ? r->loaded.notice : NULL;
}

size_t mega_rank_num_params(const mega_rank *r) {
  size_t n = 0; /* the tensors' elements, not the buffers' padding */
  for (size_t k = 0; r->chunks.ranges && k < r->chunks.nparams; k++) n += r->chunks.ranges[k].numel;
  return n;
}

mega_status mega_rank_run(mega_rank *r, mega_err *err) {
  mega_status st = mega_rank_setup(r, err);
  if (st == MEGA_OK && r->job->save && r->job->save_initial && r->iteration == 0)
    st = mega_rank_save(r, err);
  int64_t iters = mega_jobspec_train_iters(r->job);
  if (st == MEGA_OK && r->iteration >= iters) { /* the history says why no step came */
    char note[600];
    const char *from = mega_rank_loaded_path(r);
    snprintf(note, sizeof note, "already at iteration %lld of %lld%s%s: nothing to train",
             (long long)r->iteration, (long long)iters, from ? " in " : "", from ? from : "");
    rank_note(r, note);
  }
  while (st == MEGA_OK && r->iteration < iters) {
    st = check_abort(r, err);
    if (st != MEGA_OK) break;
    mega_rank_metrics m;
    int64_t before = r->iteration;
    st = mega_rank_step(r, &m, err);
    /* a trained iteration is reported whatever follows (its evaluation may
     * have failed); the last one's report waits for the evaluation after
     * training (rank_end) */
    bool trained = r->iteration > before, last = st == MEGA_OK && r->iteration == iters;
    if (trained && !last && r->env.on_step) r->env.on_step(r->env.arg, &m);
    if (st != MEGA_OK) break;
    bool saved = mega_rank_ckpt_due(r->job, r->iteration);
    if (saved) st = mega_rank_save(r, err);
    bool stop = false;
    if (st == MEGA_OK) st = rank_exit_check(r, &stop, err);
    /* Megatron's order: the due save, then a stop saves if it was not one */
    if (stop && r->job->save && !saved) st = mega_rank_save(r, err);
    /* an exit (flag, signal, duration) leaves train() by sys.exit: no
     * evaluation after it, even at the last iteration; a normal end
     * evaluates after its save */
    if (last) st = rank_end(r, &m, st, stop, err);
    if (stop) break;
  }
  /* --overlap-param-gather leaves the last gathers in flight: finish them
   * before the communicators go, or a peer still in them would fail. */
  if (st == MEGA_OK) st = mega_grads_wait_params(r->chunks.grads, -1, err);
  /* The last save's write may still run (--async-save). After a failure
   * its gathers could wait on writers that will never come: abandon it. */
  if (st != MEGA_OK) {
    pthread_mutex_lock(&r->comm_lock);
    rank_comm_abort_locked(r, GROUP_CKPT);
    pthread_mutex_unlock(&r->comm_lock);
  }
  if (r->saver) {
    if (st == MEGA_OK) rank_phase(r, "checkpoint");
    mega_err werr = {0};
    mega_status ws = mega_rank_save_wait(r, &werr);
    if (st == MEGA_OK && ws != MEGA_OK) {
      st = ws;
      if (err) *err = werr;
    }
  }
  /* A communicator fails with the cause of the first broken link; an abort
   * explains itself better. */
  if (st != MEGA_OK && atomic_load(&r->aborted) && st != MEGA_ERR_CANCELLED) check_abort(r, err);
  return memory_advice(r, st, err);
}

void mega_rank_destroy(mega_rank *r) {
  if (!r) return;
  mega_rank_saver_destroy(r->saver); /* waits for its thread, which uses GROUP_CKPT */
  free(r->save_params);
  mega_engine_destroy(r->engine);
  mega_engine_destroy(r->eval_engine);
  mega_engine_destroy(r->test_engine);
  mega_p2p_destroy(r->p2p);
  rank_comm_destroy_all(r);
  pthread_mutex_destroy(&r->comm_lock);
  mega_abort_guard_destroy(&r->guard);
  mega_store_close(r->store);
  rank_tp_free(r);
  mega_optim_destroy(r->optim);
  mega_optim_destroy(r->copy);
  mega_chunks_free(&r->chunks);
  mega_sched_free(&r->sched);
  mega_sched_free(&r->eval_sched);
  mega_layout_free(&r->layout);
  mega_data_close(r->data);
  mega_backend_destroy(r->be);
  free(r->spans);
  free(r->reductions);
  free(r);
}
