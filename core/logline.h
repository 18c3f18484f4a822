/* The readable training log of megaw and megad run, as Megatron prints it
 * (training_log and evaluate_and_print_results), so a Megatron user's log
 * greps and parsers keep working:
 *
 *  [2026-01-02 03:04:05.678901] iteration      100/  500000 | consumed samples:   1600 |
 *  elapsed time per iteration (ms): 812.3 | throughput per GPU (TFLOP/s/GPU): 1.2 |
 *  learning rate: 1.500000E-04 | global batch size:    16 | lm loss: 5.123456E+00 |
 *  loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 |
 *  number of nan iterations:   0 | tokens per second: 2014 |
 *
 * on one line every --log-interval iterations (and the last), the loss and
 * the time the means over those iterations; the throughput only with
 * --log-throughput. mega adds what Megatron's line lacks at its end (tokens
 * per second: the iterations' tokens over their time, so it is the tokens
 * of an iteration over the elapsed time per iteration; megad run: the
 * pipeline bubble). An evaluation prints
 * Megatron's validation block. A plain value; nothing allocates. */
#ifndef MEGA_CORE_LOGLINE_H
#define MEGA_CORE_LOGLINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/jobspec.h"

/* What accumulates between two lines. Zero it to start. */
typedef struct mega_logline {
  int64_t iters, losses, skipped, nans;
  double loss_sum, time_sum, tokens_sum;
} mega_logline;

/* One iteration: its loss (when known; a skipped step's loss is counted as
 * Megatron counts it, in the skipped and nan counts), its time and rate. */
void mega_logline_add(mega_logline *l, bool has_loss, double loss, bool skipped,
                      double step_time_s, double tokens_per_s);

/* The values of the line's iteration. */
typedef struct mega_logline_step {
  int64_t iteration; /* 1-based */
  int world;         /* ranks, for the throughput per GPU */
  int global_batch;  /* this iteration's */
  double lr, grad_norm;
  bool has_grad_norm;
  const char *extra; /* more " key: value |" fields, or NULL */
} mega_logline_step;

/* Whether iteration (1-based) prints a line: every --log-interval, and the
 * last one. */
bool mega_logline_due(const mega_jobspec *s, int64_t iteration);

/* Writes the line (with a newline) into buf and restarts the accumulator.
 * Returns what snprintf does. */
int mega_logline_format(mega_logline *l, const mega_jobspec *s, const mega_logline_step *st,
                        char *buf, size_t n);

/* Megatron's validation block, three lines: dashes, " validation loss at
 * iteration N | lm loss value: ... | lm loss PPL: ... | ", dashes. */
int mega_logline_eval(int64_t iteration, double eval_loss, char *buf, size_t n);
/* The blocks of the evaluation after training, Megatron's words: "...
 * validation loss at iteration N on validation set | ..." (has_valid), then
 * "... on test set | ..." (has_test), into buf (empty when neither). */
int mega_logline_end_eval(int64_t iteration, bool has_valid, double valid_loss, bool has_test,
                          double test_loss, char *buf, size_t n);

/* Megatron's num_floating_point_operations for one iteration of `batch`
 * samples of a dense model: the MLP of --ffn-hidden-size (SwiGLU's three
 * GEMMs counted as 3/2 of two), q of --kv-channels x heads and k, v of
 * --kv-channels x query groups, the causal half of the attention scores, the
 * logits over the padded vocabulary; forward and backward, x3. */
double mega_jobspec_flops(const mega_jobspec *s, int batch);

#endif
