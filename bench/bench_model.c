/* Training-step throughput of the GPT-2 or Llama on the cpu backend:
 * forward, both backward halves and AdamW, on one stage holding the whole
 * model.
 *
 *   bench_model [--threads N] [--steps S] [--warmup W] [--channels C]
 *               [--layers L] [--heads H] [--seq T] [--batch B] [--vocab V]
 *               [--llama] [--groups G] [--ffn F] [--profile]
 *
 * Defaults: GPT-2, C=256, 4 layers, 4 heads, T=256, B=8, V=256, 1 BLAS thread.
 * --llama: the Llama of the same width and depth (RoPE, RMSNorm, SwiGLU of
 * F = Megatron's int(8C/3 / 64) x 64, G = H/2 query groups, untied head, no
 * biases); --groups and --ffn change G and F. Prints the stage's creation
 * time with its initial weights (stage=) in its first line, one line per step
 * (wall time and process CPU time), then "tokens/s min/median/max".
 * --profile prints time by phase. bench/bench_model.py runs this next to
 * PyTorch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/rng.h"
#include "worker/backend/backend.h"
#include "worker/model/gpt.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of the whole process: with one thread, the step's cost without
 * the time other processes on the shared cores took from it. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int die(const mega_err *err) {
  fprintf(stderr, "bench_model: %s\n", err->msg);
  return 1;
}

int main(int argc, char **argv) {
  int threads = 1, steps = 10, warmup = 2, C = 256, L = 4, NH = 4, T = 256, B = 8, V = 256;
  int profile = 0, llama = 0, G = 0, F = 0;
  for (int i = 1; i < argc; i++) {
    int *dst = NULL;
    if (!strcmp(argv[i], "--threads")) dst = &threads;
    else if (!strcmp(argv[i], "--steps")) dst = &steps;
    else if (!strcmp(argv[i], "--warmup")) dst = &warmup;
    else if (!strcmp(argv[i], "--channels")) dst = &C;
    else if (!strcmp(argv[i], "--layers")) dst = &L;
    else if (!strcmp(argv[i], "--heads")) dst = &NH;
    else if (!strcmp(argv[i], "--seq")) dst = &T;
    else if (!strcmp(argv[i], "--batch")) dst = &B;
    else if (!strcmp(argv[i], "--vocab")) dst = &V;
    else if (!strcmp(argv[i], "--groups")) dst = &G;
    else if (!strcmp(argv[i], "--ffn")) dst = &F;
    else if (!strcmp(argv[i], "--llama")) llama = 1;
    else if (!strcmp(argv[i], "--profile")) profile = 1;
    else {
      fprintf(stderr, "bench_model: unknown argument %s (see the file's header)\n", argv[i]);
      return 2;
    }
    if (dst) {
      if (i + 1 >= argc || (*dst = atoi(argv[++i])) < 1) {
        fprintf(stderr, "bench_model: %s needs a positive integer\n", argv[i - 1]);
        return 2;
      }
    }
  }
  mega_err err = {0};
  mega_backend *be;
  mega_backend_cpu_opts opts = {.threads = threads};
  if (mega_backend_cpu_create(&opts, &be, &err)) return die(&err);
  mega_gpt_config cfg;
  mega_gpt_config_default(&cfg);
  cfg.channels = C;
  cfg.num_layers = L;
  cfg.num_heads = NH;
  cfg.max_seq_len = T;
  cfg.vocab_size = V;
  if (llama) {
    cfg.arch = MEGA_GPT_ARCH_LLAMA;
    cfg.num_kv_heads = G ? G : (NH > 1 ? NH / 2 : 1);
    cfg.ffn_hidden = F ? F : (int)(4.0 * C * 2.0 / 3.0 / 64.0) * 64;
    cfg.untied = true;
    cfg.no_bias = true;
  } else if (F) {
    cfg.ffn_hidden = F;
  }
  mega_gpt_stage_desc whole = {true, true, 0, L};
  mega_gpt_stage *s;
  mega_gpt_acts *a;
  double s0 = now(); /* the stage with its initial weights (backend init_normal) */
  if (mega_gpt_stage_create(be, &cfg, &whole, &s, &err)) return die(&err);
  double create_s = now() - s0;
  if (mega_gpt_acts_create(s, B, T, &a, &err)) return die(&err);
  size_t n = mega_gpt_num_params(s);
  void *m, *v;
  if (be->ops->alloc(be, n * sizeof(float), &m, &err) ||
      be->ops->alloc(be, n * sizeof(float), &v, &err))
    return die(&err);
  int np;
  const mega_param_info *pi = mega_gpt_params(s, &np);
  int32_t *tok = malloc(sizeof *tok * (B * T + 1));
  for (int i = 0; i <= B * T; i++) tok[i] = (int32_t)(mega_splitmix64(i) % (uint64_t)V);
  printf("# %s C=%d layers=%d heads=%d groups=%d ffn=%d T=%d B=%d V=%d threads=%d blas=%s "
         "params=%zu acts=%.1f MiB stage=%.2f s\n",
         llama ? "llama" : "gpt2", C, L, NH, mega_gpt_kv_heads(&cfg), mega_gpt_ffn(&cfg), T, B,
         V, threads, mega_backend_cpu_blas_core(), n, mega_gpt_acts_bytes(a) / 1048576.0,
         create_s);
  double *dt = malloc(sizeof *dt * steps), ph[4] = {0};
  mega_gpt_acts_set_loss_scale(a, 1.0f / (B * T)); /* the fused classifier, as the engine runs */
  for (int it = 0; it < warmup + steps; it++) {
    double t0 = now(), c0 = cpu_now(), loss;
    mega_gpt_zero_grad(s);
    if (mega_gpt_forward(s, a, tok, NULL, tok + 1, NULL, &loss, &err)) return die(&err);
    double t1 = now();
    if (mega_gpt_backward_input(s, a, NULL, 1.0f / (B * T), NULL, &err)) return die(&err);
    double t2 = now();
    if (mega_gpt_backward_weight(s, a, &err)) return die(&err);
    double t3 = now();
    for (int i = 0; i < np; i++) {
      mega_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = pi[i].decay ? 0.1f : 0.0f, .grad_scale = 1.0f,
                              .step = it + 1};
      be->ops->adamw(be, mega_gpt_param_data(s) + pi[i].offset,
                     mega_gpt_grad_data(s) + pi[i].offset, (float *)m + pi[i].offset,
                     (float *)v + pi[i].offset, pi[i].numel, &hp);
    }
    double t4 = now(), c4 = cpu_now();
    if (it < warmup) continue;
    int k = it - warmup;
    dt[k] = t4 - t0;
    ph[0] += t1 - t0;
    ph[1] += t2 - t1;
    ph[2] += t3 - t2;
    ph[3] += t4 - t3;
    printf("step %d loss %.4f time %.1f ms cpu %.1f ms cpu-tokens/s %.0f tokens/s %.0f\n", k,
           loss / (B * T), dt[k] * 1e3, (c4 - c0) * 1e3, B * T / (c4 - c0), B * T / dt[k]);
  }
  if (profile)
    printf("# per step: forward %.1f ms, backward_input %.1f ms, backward_weight %.1f ms, "
           "adamw %.1f ms\n",
           ph[0] / steps * 1e3, ph[1] / steps * 1e3, ph[2] / steps * 1e3, ph[3] / steps * 1e3);
  qsort(dt, steps, sizeof *dt, cmp);
  printf("tokens/s min %.0f median %.0f max %.0f\n", B * T / dt[steps - 1],
         B * T / dt[steps / 2], B * T / dt[0]);
  free(dt);
  free(tok);
  be->ops->free(be, m);
  be->ops->free(be, v);
  mega_gpt_acts_destroy(a);
  mega_gpt_stage_destroy(s);
  mega_backend_destroy(be);
  return 0;
}
