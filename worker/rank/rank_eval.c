/* Evaluation: every --eval-interval iterations, and after training as
 * Megatron's pretrain does (the validation set, then the test set), and
 * the end of a run at its last iteration around it. */
#include <stdio.h>

#include "worker/rank/rank_internal.h"

/* --eval-iters forward-only batches of engine's stream (worker/data/data.h)
 * from batch *done on, which counts them; their mean loss, on the last
 * stage, in *loss and *has. A failure counts none of them (a held state
 * counts no half evaluation). */
static mega_status evaluate(mega_rank *r, mega_engine *engine, int64_t *done, bool *has,
                            double *loss, mega_err *err) {
  double loss_sum = 0, tokens = 0;
  bool last = mega_sched_is_last_stage(&r->eval_sched, r->me.pp, r->eval_sched.vp - 1);
  mega_status st = mega_grads_wait_params(r->chunks.grads, -1, err);
  if (st != MEGA_OK) return st;
  int64_t first = *done;
  for (int k = 0; k < r->job->eval_iters; k++) {
    mega_engine_result res;
    st = mega_engine_run(engine, (*done)++, &res, NULL, 0, NULL, 0, err);
    if (st != MEGA_OK) break;
    loss_sum += res.loss_sum;
    tokens += (double)res.tokens;
  }
  if (st == MEGA_OK && last && !r->simulate) {
    st = rank_sum_doubles(r->hcomm[GROUP_DP], &loss_sum, err);
    if (st == MEGA_OK) st = rank_sum_doubles(r->hcomm[GROUP_DP], &tokens, err);
  }
  if (st != MEGA_OK) {
    *done = first;
    return st;
  }
  if (!last || r->simulate) return MEGA_OK;
  *has = true;
  *loss = tokens > 0 ? loss_sum / tokens : 0;
  return MEGA_OK;
}

mega_status rank_evaluate(mega_rank *r, mega_rank_metrics *m, mega_err *err) {
  rank_phase(r, "eval");
  mega_status st = evaluate(r, r->eval_engine, &r->eval_done, &m->has_eval_loss, &m->eval_loss,
                            err);
  if (st != MEGA_OK)
    mega_err_prefix(err, "evaluation after iteration %lld", (long long)r->iteration);
  return st;
}

/* After the last iteration of a run that ended normally, as Megatron's
 * pretrain: the validation set, going on from the batches evaluated so
 * far, then the test set from its start. */
static mega_status evaluate_at_end(mega_rank *r, mega_rank_metrics *m, mega_err *err) {
  if (!r->eval_engine && !r->test_engine) return MEGA_OK;
  rank_phase(r, "eval");
  mega_status st = MEGA_OK;
  const char *set = "validation";
  if (r->eval_engine)
    st = evaluate(r, r->eval_engine, &r->eval_done, &m->has_final_eval_loss,
                  &m->final_eval_loss, err);
  int64_t test_done = 0;
  if (st == MEGA_OK && r->test_engine) {
    set = "test";
    st = evaluate(r, r->test_engine, &test_done, &m->has_test_loss, &m->test_loss, err);
  }
  if (st != MEGA_OK)
    mega_err_prefix(err, "the evaluation after training failed on the %s set (iteration %lld "
                    "is trained and reported)", set, (long long)r->iteration);
  return st;
}

void rank_note(mega_rank *r, const char *note) {
  if (r->env.rank == 0 && r->env.on_note) r->env.on_note(r->env.arg, note);
}

mega_status rank_end(mega_rank *r, mega_rank_metrics *m, mega_status st, bool stop,
                     mega_err *err) {
  if (st == MEGA_OK && stop) {
    /* Megatron's train() exits (sys.exit) before pretrain evaluates; with
     * nothing left to train, the run has ended rather than stopped */
    char note[512];
    snprintf(note, sizeof note, "no evaluation after training: %s ends the run at its last "
             "iteration (%lld) first, as Megatron's exit comes before its evaluation after "
             "training", r->stopped, (long long)r->iteration);
    rank_note(r, note);
    r->stopped[0] = '\0';
    r->stopped_mine = false;
  }
  if (st == MEGA_OK && !stop) st = evaluate_at_end(r, m, err);
  if (r->env.on_step) r->env.on_step(r->env.arg, m);
  return st;
}
