/* Values derived from a job spec: data-parallel size, microbatches,
 * the model's shapes and vocabulary, evaluation, virtual stages, and
 * --simulate-compute's parts (jobspec.h); --split's shares and the layer
 * layout, which the check refuses a job by (jobspec_check.c). */
#include "core/jobspec.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/jobspec_internal.h"
#include "core/schedule.h"
#include "core/topology.h"

int mega_jobspec_dp(const mega_jobspec *s, int world_size) {
  long long mp = (long long)s->tensor_model_parallel_size * s->pipeline_model_parallel_size;
  if (mp < 1 || world_size < 1 || world_size % mp) return 0;
  return (int)(world_size / mp);
}

int mega_jobspec_group_size(const mega_jobspec *s) {
  return s->microbatch_group_size_per_vp_stage > 0 ? s->microbatch_group_size_per_vp_stage
                                                   : s->pipeline_model_parallel_size;
}

int mega_jobspec_num_microbatches(const mega_jobspec *s, int world_size) {
  long long per = (long long)s->micro_batch_size * mega_jobspec_dp(s, world_size);
  return per > 0 ? (int)(s->global_batch_size / per) : 0;
}

long long mega_jobspec_tokens_per_iter(const mega_jobspec *s) {
  return (long long)s->global_batch_size * s->seq_length;
}

int mega_jobspec_max_position_embeddings(const mega_jobspec *s) {
  return s->max_position_embeddings > 0 ? s->max_position_embeddings : s->seq_length;
}

bool mega_jobspec_llama(const mega_jobspec *s) {
  return s->position_embedding_type == MEGA_POS_ROPE && s->normalization == MEGA_NORM_RMSNORM &&
         s->swiglu;
}

bool mega_jobspec_gelu_erf(const mega_jobspec *s) {
  if (mega_jobspec_llama(s) || s->openai_gelu) return false;
  return s->no_bias_gelu_fusion || s->disable_bias_linear;
}

int mega_jobspec_ffn_hidden_size(const mega_jobspec *s) {
  if (s->ffn_hidden_size > 0) return s->ffn_hidden_size;
  /* Megatron's: the two SwiGLU projections keep the parameters near 4h's */
  if (s->swiglu) return (int)((4.0 * s->hidden_size * 2.0 / 3.0) / 64.0) * 64;
  return 4 * s->hidden_size;
}

int mega_jobspec_kv_channels(const mega_jobspec *s) {
  if (s->kv_channels > 0) return s->kv_channels;
  return s->num_attention_heads > 0 ? s->hidden_size / s->num_attention_heads : 0;
}

int mega_jobspec_query_groups(const mega_jobspec *s) {
  if (!s->group_query_attention) return s->num_attention_heads;
  return s->num_query_groups > 0 ? s->num_query_groups : 1;
}

int mega_jobspec_tokenizer(const mega_jobspec *s) {
  if (s->tokenizer_type == MEGA_TOKENIZER_BYTES && (s->vocab_file || s->merge_file))
    return MEGA_TOKENIZER_GPT2BPE; /* pretrain_gpt.py's default tokenizer */
  return s->tokenizer_type;
}

int mega_jobspec_tokenizer_vocab(const mega_jobspec *s) {
  if (s->tokenizer_type == MEGA_TOKENIZER_NULL && s->vocab_size > 0) return s->vocab_size + 1;
  if (mega_jobspec_tokenizer(s) == MEGA_TOKENIZER_GPT2BPE) return s->file_vocab;
  return MEGA_VOCAB_SIZE;
}

void mega_jobspec_special_ids(const mega_jobspec *s, int *bos, int *eos) {
  *bos = *eos = -1;
  if (s->tokenizer_type == MEGA_TOKENIZER_NULL && s->vocab_size > 0) *eos = s->vocab_size;
  else if (mega_jobspec_tokenizer(s) == MEGA_TOKENIZER_GPT2BPE && s->file_vocab > 0)
    *bos = *eos = s->file_eod;
}

bool mega_jobspec_evaluates(const mega_jobspec *s) {
  return s->eval_interval > 0 && s->eval_iters > 0;
}

/* Held-out documents for the evaluation at the end: the split's share. */
static bool holds_out(const mega_jobspec *s, int share) {
  double sh[3];
  return s->split && mega_jobspec_split(s, sh, NULL) == MEGA_OK && sh[share] > 0;
}

bool mega_jobspec_evaluates_at_end(const mega_jobspec *s) {
  return s->eval_iters > 0 &&
         (s->eval_interval > 0 || s->valid_data_path.n > 0 || holds_out(s, 1));
}

bool mega_jobspec_tests_at_end(const mega_jobspec *s) {
  return s->eval_iters > 0 && holds_out(s, 2);
}

int64_t mega_jobspec_eval_batches(const mega_jobspec *s) {
  if (!mega_jobspec_evaluates_at_end(s)) return 0;
  int64_t points = s->eval_interval > 0 ? mega_jobspec_train_iters(s) / s->eval_interval : 0;
  return (points + 1) * s->eval_iters;
}

/* The proviso on a test share: the note is written before the data is
 * read, and a share shorter than one window gives no test set (data.c). */
static void test_proviso(const mega_jobspec *s, char *buf, size_t n) {
  snprintf(buf, n, " unless it holds fewer than --seq-length %d + 1 tokens in a dataset (rank "
                   "0 then says it skips it)", s->seq_length);
}

/* Without --eval-interval: what the end of training evaluates, if anything. */
static bool end_note(const mega_jobspec *s, char *buf, size_t n) {
  bool valid = mega_jobspec_evaluates_at_end(s), test = mega_jobspec_tests_at_end(s);
  if (!valid && !test) return false;
  char proviso[160] = "";
  if (test) test_proviso(s, proviso, sizeof proviso);
  if (s->valid_data_path.n)
    snprintf(buf, n, "no --eval-interval: only the end of training evaluates, as Megatron's "
                     "does after its last iteration, %d batches of --global-batch-size from "
                     "--valid-data-path", s->eval_iters);
  else
    snprintf(buf, n, "no --eval-interval: only the end of training evaluates, as Megatron's "
                     "does after its last iteration, %d batches of --global-batch-size on "
                     "%s%s%s of --split %s%s", s->eval_iters, valid ? "the valid share" : "",
             valid && test ? " and then on " : "", test ? "the test share" : "", s->split,
             proviso);
  return true;
}

bool mega_jobspec_eval_note(const mega_jobspec *s, char *buf, size_t n) {
  if (s->eval_interval > 0 && s->eval_iters == 0) {
    snprintf(buf, n, "--eval-iters 0: no evaluation (as in Megatron), whatever --eval-interval "
                     "says");
    return true;
  }
  if (!mega_jobspec_evaluates(s)) return end_note(s, buf, n);
  double sh[3];
  if (s->valid_data_path.n)
    snprintf(buf, n, "evaluation every %d iterations and after the last reads "
                     "--valid-data-path (%d batches of --global-batch-size)", s->eval_interval,
             s->eval_iters);
  else if (s->split && mega_jobspec_split(s, sh, NULL) == MEGA_OK) {
    char proviso[160] = "";
    if (sh[2] > 0) test_proviso(s, proviso, sizeof proviso);
    snprintf(buf, n, "evaluation every %d iterations and after the last reads the valid share "
                     "of --split %s: %.4g%% of each dataset's documents, which training does "
                     "not read%s%s", s->eval_interval, s->split, 100 * sh[1],
             sh[2] > 0 ? "; the test share is evaluated once, after the last iteration," : "",
             proviso);
  }
  else
    snprintf(buf, n, "no --split: training reads all of the data, and evaluation every %d "
                     "iterations and after the last reads windows counted back from the end of the training "
                     "stream, which training reads too (Megatron would take --split 969,30,1); "
                     "give --split to hold documents out", s->eval_interval);
  return true;
}

bool mega_jobspec_cuda_attention_note(const mega_jobspec *s, char *buf, size_t n) {
  int hs = mega_jobspec_kv_channels(s), T = s->seq_length;
  int tp = s->tensor_model_parallel_size > 0 ? s->tensor_model_parallel_size : 1;
  /* the shapes the cuda backend's flash attention takes (backend.h's
   * mega_attn_flash_shape; the strides are multiples of 8 at these heads) */
  if (!(s->attention_dropout > 0) || !s->bf16 || !(hs == 64 || hs == 128) || T <= hs)
    return false;
  double rows = (double)s->micro_batch_size * (s->num_attention_heads / tp) * T;
  const double mib = 1024.0 * 1024.0;
  snprintf(buf, n,
           "--attention-dropout %g with --bf16: on cuda attention runs unfused, as fp32 "
           "batched GEMMs (neither mega's flash kernels nor cuDNN draw its mask), slower than "
           "flash attention, and each layer keeps its [%d, %d, %d, %d] probabilities: %.1f MiB "
           "a layer for each microbatch in flight, where flash attention keeps %.1f MiB",
           s->attention_dropout, s->micro_batch_size, s->num_attention_heads / tp, T, T,
           4 * rows * T / mib, 4 * rows * (1 + hs) / mib);
  return true;
}

int mega_jobspec_padded_vocab(const mega_jobspec *s) {
  long long by = s->make_vocab_size_divisible_by > 0 ? s->make_vocab_size_divisible_by : 128;
  long long multiple = by * (s->tensor_model_parallel_size > 0 ? s->tensor_model_parallel_size : 1);
  long long v = mega_jobspec_tokenizer_vocab(s);
  long long padded = (v + multiple - 1) / multiple * multiple;
  return padded > INT_MAX ? INT_MAX : (int)padded;
}

int mega_jobspec_vp(const mega_jobspec *s) {
  mega_layout l;
  if (mega_jobspec_layout(s, &l, NULL) != MEGA_OK) {
    int vp = s->virtual_pipeline_model_parallel_size;
    return vp > 0 ? vp : 1;
  }
  int vp = l.vp;
  mega_layout_free(&l);
  return vp;
}

mega_status mega_jobspec_parse_simulate_compute(const char *str, mega_sim_compute *out,
                                                mega_err *err) {
  static const char *const part_names[] = {"F_MS", "B_MS", "W_MS"};
  mega_sim_compute r = {0};
  double v[3] = {0};
  int n = 0;
  const char *p = str ? str : "";
  char part[64];
  for (;;) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (n == 3 || len >= sizeof part)
      return mega_fail(err, MEGA_ERR_INVALID,
                       "--simulate-compute '%s': expected F_MS:B_MS or F_MS:B_MS:W_MS, "
                       "e.g. 2:4 or 2:2:2",
                       str ? str : "");
    memcpy(part, p, len);
    part[len] = '\0';
    char what[96];
    snprintf(what, sizeof what, "--simulate-compute %s", part_names[n]);
    mega_status st = mega_jf_parse_float_text(what, part, &v[n], err);
    if (st != MEGA_OK) return st;
    if (v[n] < 0)
      return mega_fail(err, MEGA_ERR_INVALID, "%s must be at least 0 ms (got %s)", what, part);
    n++;
    if (!colon) break;
    p = colon + 1;
  }
  if (n < 2)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--simulate-compute '%s': expected F_MS:B_MS or F_MS:B_MS:W_MS, "
                     "e.g. 2:4 or 2:2:2",
                     str ? str : "");
  r.f_ms = v[0];
  r.b_ms = v[1];
  r.w_ms = v[2];
  r.has_w = n == 3;
  if (out) *out = r;
  return MEGA_OK;
}

/* ---- --split and the layout ---- */

/* Megatron's parse_and_normalize_split: every run of digits and dots is a
 * number (so "969,30,1", "90/5/5" and a quoted "'99,1,0'" all read), up
 * to three, the missing ones 0. A sign or a letter is refused rather than
 * skipped, so "-5" never reads as 5. */
mega_status mega_jobspec_split(const mega_jobspec *s, double out[3], mega_err *err) {
  out[0] = 1, out[1] = out[2] = 0;
  if (!s->split) return MEGA_OK;
  double v[3] = {0};
  int n = 0;
  for (const char *p = s->split; *p;) {
    size_t len = strspn(p, "0123456789.");
    if (!len) {
      if (*p == '-' || *p == '+' || isalpha((unsigned char)*p))
        return mega_fail(err, MEGA_ERR_INVALID,
                         "--split '%s': expected up to three non-negative numbers, the train, "
                         "valid and test shares, e.g. 969,30,1", s->split);
      p++;
      continue;
    }
    char num[64], *end;
    snprintf(num, sizeof num, "%.*s", (int)(len < 63 ? len : 63), p);
    errno = 0;
    double x = strtod(num, &end);
    if (n == 3 || *end || end == num || errno == ERANGE || !isfinite(x))
      return mega_fail(err, MEGA_ERR_INVALID,
                       "--split '%s': expected up to three non-negative numbers, the train, "
                       "valid and test shares, e.g. 969,30,1", s->split);
    v[n++] = x;
    p += len;
  }
  if (n == 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--split '%s': expected up to three non-negative numbers, the train, "
                     "valid and test shares, e.g. 969,30,1", s->split);
  double sum = v[0] + v[1] + v[2];
  if (!(sum > 0))
    return mega_fail(err, MEGA_ERR_INVALID, "--split '%s': the shares add up to 0", s->split);
  for (int k = 0; k < 3; k++) out[k] = v[k] / sum;
  return MEGA_OK;
}

/* A stage with no letter would fail every rank's model build at start;
 * refuse it with the layout instead. */
static mega_status check_no_empty_stage(mega_layout *l, bool from_string, mega_err *err) {
  for (int st = 0; st < l->nstages; st++) {
    if (l->stage_start[st + 1] > l->stage_start[st]) continue;
    char chunk[48] = "";
    if (l->vp > 1) snprintf(chunk, sizeof chunk, " (model chunk %d)", st / l->pp);
    char *shown = mega_layout_format(l);
    mega_status bad = mega_fail(
        err, MEGA_ERR_INVALID,
        "invalid job: pipeline rank %d%s would build nothing (no decoder layer, embedding or "
        "loss) in the layout %s: %s",
        st % l->pp, chunk, shown ? shown : "?",
        from_string ? "give every stage of --pipeline-model-parallel-layout a letter"
                    : "give more --num-layers, a smaller --pipeline-model-parallel-size, or "
                      "fewer --decoder-first/last-pipeline-num-layers");
    free(shown);
    mega_layout_free(l);
    return bad;
  }
  return MEGA_OK;
}

/* The layout, and with it VP, as Megatron derives them: from the layout
 * string, else from --num-layers-per-virtual-pipeline-stage, else from the
 * VP flag with the uniform split. */
mega_status mega_jobspec_layout(const mega_jobspec *s, mega_layout *out, mega_err *err) {
  memset(out, 0, sizeof *out);
  int pp = s->pipeline_model_parallel_size, vp_flag = s->virtual_pipeline_model_parallel_size;
  int first = s->decoder_first_pipeline_num_layers, last = s->decoder_last_pipeline_num_layers;
  int nlpvs = s->num_layers_per_virtual_pipeline_stage;
  bool uneven = first >= 0 || last >= 0;
  const char *uneven_flag =
      first >= 0 ? "--decoder-first-pipeline-num-layers" : "--decoder-last-pipeline-num-layers";
  mega_err sub = {0};
  if (s->pipeline_model_parallel_layout) {
    if (uneven)
      return BAD("--pipeline-model-parallel-layout cannot be combined with %s; the layout "
                 "already places every layer",
                 uneven_flag);
    if (nlpvs > 0)
      return BAD("--pipeline-model-parallel-layout cannot be combined with "
                 "--num-layers-per-virtual-pipeline-stage; the layout's stage count sets VP");
    mega_status st = mega_layout_parse(s->pipeline_model_parallel_layout, pp, out, &sub);
    if (st != MEGA_OK)
      return mega_fail(err, st, "invalid job: --pipeline-model-parallel-layout: %s", sub.msg);
    int stages = out->nstages;
    if (vp_flag > 0 && vp_flag != out->vp) {
      mega_layout_free(out);
      return BAD("--virtual-pipeline-model-parallel-size %d disagrees with the layout, whose %d "
                 "stages at PP = %d mean VP = %d",
                 vp_flag, stages, pp, stages / pp);
    }
    if (pp == 1 && stages > 1) {
      mega_layout_free(out);
      return BAD("the layout's %d stages at PP = 1 make a virtual pipeline (VP = %d), which "
                 "needs --pipeline-model-parallel-size > 1",
                 stages, stages);
    }
    return check_no_empty_stage(out, true, err);
  }
  int vp = vp_flag > 0 ? vp_flag : 1;
  if (nlpvs > 0) {
    if (uneven)
      return BAD("--num-layers-per-virtual-pipeline-stage cannot be combined with %s; give "
                 "--virtual-pipeline-model-parallel-size instead",
                 uneven_flag);
    if (s->num_layers % pp)
      return BAD("--num-layers %d is not divisible by --pipeline-model-parallel-size %d, so "
                 "--num-layers-per-virtual-pipeline-stage cannot split it",
                 s->num_layers, pp);
    int per_rank = s->num_layers / pp;
    if (per_rank % nlpvs)
      return BAD("the %d layers per pipeline rank (--num-layers %d / PP %d) are not divisible "
                 "by --num-layers-per-virtual-pipeline-stage %d",
                 per_rank, s->num_layers, pp, nlpvs);
    if (vp_flag > 0 && vp_flag != per_rank / nlpvs)
      return BAD("--virtual-pipeline-model-parallel-size %d disagrees with "
                 "--num-layers-per-virtual-pipeline-stage %d, which gives VP = %d "
                 "(%d layers per pipeline rank)",
                 vp_flag, nlpvs, per_rank / nlpvs, per_rank);
    vp = per_rank / nlpvs;
  }
  if (vp > 1 && pp == 1)
    return BAD("a virtual pipeline (VP = %d) needs --pipeline-model-parallel-size > 1", vp);
  mega_status st = mega_layout_uniform(s->num_layers, pp, vp, first, last, out, &sub);
  if (st != MEGA_OK) return mega_fail(err, st, "invalid job: %s", sub.msg);
  return check_no_empty_stage(out, false, err);
}
