#include "core/logline.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

void mega_logline_add(mega_logline *l, bool has_loss, double loss, bool skipped,
                      double step_time_s, double tokens_per_s) {
  l->iters++;
  l->time_sum += step_time_s;
  l->tokens_sum += tokens_per_s * step_time_s; /* this iteration's tokens */
  if (skipped) {
    l->skipped++;
    if (has_loss && !isfinite(loss)) l->nans++;
  } else if (has_loss) {
    l->losses++;
    l->loss_sum += loss;
  }
}

bool mega_logline_due(const mega_jobspec *s, int64_t iteration) {
  int every = s->log_interval > 0 ? s->log_interval : 1;
  return iteration % every == 0 || iteration == mega_jobspec_train_iters(s);
}

double mega_jobspec_flops(const mega_jobspec *s, int batch) {
  /* Megatron's transformer_flops for a dense model: per token, each GEMM
   * three times (forward, both backward halves), two operations per
   * multiply-add. Attention: q, k and v (k and v one head per query group),
   * the causal half of QK^T and PV, the output projection; the MLP's two
   * GEMMs (SwiGLU's three: x 3/2); the logits over the padded vocabulary. */
  double h = s->hidden_size, T = s->seq_length, L = s->num_layers;
  double V = mega_jobspec_padded_vocab(s), ffn = mega_jobspec_ffn_hidden_size(s);
  double q = (double)mega_jobspec_kv_channels(s) * s->num_attention_heads;
  double kv = (double)mega_jobspec_kv_channels(s) * mega_jobspec_query_groups(s);
  double attn = h * (q + 2 * kv) + q * T / 2 * 2 + q * h;
  double mlp = 2 * h * ffn * (s->swiglu ? 1.5 : 1.0);
  double per_token = 3 * 2 * (L * (mlp + attn) + h * V);
  return (double)batch * T * per_token;
}

static void stamp(char *buf, size_t n) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  localtime_r(&tv.tv_sec, &tm);
  char day[32];
  strftime(day, sizeof day, "%Y-%m-%d %H:%M:%S", &tm);
  snprintf(buf, n, "%s.%06ld", day, (long)tv.tv_usec);
}

int mega_logline_format(mega_logline *l, const mega_jobspec *s, const mega_logline_step *st,
                        char *buf, size_t n) {
  char when[48], thr[96] = "", loss[64] = "", gn[48] = "";
  stamp(when, sizeof when);
  double per_iter = l->iters ? l->time_sum / (double)l->iters : 0;
  if (s->log_throughput) {
    double tf = per_iter > 0 && st->world > 0
                    ? mega_jobspec_flops(s, st->global_batch) / (per_iter * 1e12 * st->world)
                    : 0;
    snprintf(thr, sizeof thr, " throughput per GPU (TFLOP/s/GPU): %.1f |", tf);
  }
  if (l->losses) snprintf(loss, sizeof loss, " lm loss: %.6E |", l->loss_sum / (double)l->losses);
  if (st->has_grad_norm) snprintf(gn, sizeof gn, " grad norm: %.3f |", st->grad_norm);
  int r = snprintf(buf, n,
                   " [%s] iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per "
                   "iteration (ms): %.1f |%s learning rate: %.6E | global batch size: %5d |%s "
                   "loss scale: 1.0 |%s number of skipped iterations: %3lld | number of nan "
                   "iterations: %3lld | tokens per second: %.0f |%s\n",
                   when, (long long)st->iteration, (long long)mega_jobspec_train_iters(s),
                   (long long)mega_jobspec_samples_before(s, st->iteration), per_iter * 1000.0,
                   thr, st->lr, st->global_batch, loss, gn, (long long)l->skipped,
                   (long long)l->nans, l->time_sum > 0 ? l->tokens_sum / l->time_sum : 0,
                   st->extra ? st->extra : "");
  *l = (mega_logline){0};
  return r;
}

static int eval_block(int64_t iteration, const char *set, double eval_loss, char *buf,
                      size_t n) {
  char line[256];
  double ppl = exp(eval_loss < 20 ? eval_loss : 20);
  int len = snprintf(line, sizeof line,
                     " validation loss at iteration %lld%s | lm loss value: %.6E | lm loss PPL: "
                     "%.6E | ", (long long)iteration, set, eval_loss, ppl);
  char dashes[260];
  int d = len + 1 < (int)sizeof dashes - 1 ? len + 1 : (int)sizeof dashes - 1;
  memset(dashes, '-', (size_t)d);
  dashes[d] = '\0';
  return snprintf(buf, n, "%s\n%s\n%s\n", dashes, line, dashes);
}

int mega_logline_eval(int64_t iteration, double eval_loss, char *buf, size_t n) {
  return eval_block(iteration, "", eval_loss, buf, n);
}

int mega_logline_end_eval(int64_t iteration, bool has_valid, double valid_loss, bool has_test,
                          double test_loss, char *buf, size_t n) {
  int len = 0;
  if (n) buf[0] = '\0';
  if (has_valid) len = eval_block(iteration, " on validation set", valid_loss, buf, n);
  if (len < 0 || (size_t)len >= n) return len;
  if (has_test) {
    int more = eval_block(iteration, " on test set", test_loss, buf + len, n - (size_t)len);
    len = more < 0 ? more : len + more;
  }
  return len;
}
