#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/jobspec.h"
#include "core/schedule.h"
#include "jobspec_fixture.h"

static void test_defaults(void **state) {
  (void)state;
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  assert_int_equal(s.num_layers, 0);
  assert_int_equal(s.max_position_embeddings, -1);
  assert_true(fabs(s.init_method_std - 0.02) < 1e-15);
  assert_int_equal(s.seed, 1234);
  assert_int_equal(s.data_path.n, 0);
  assert_int_equal(s.tokenizer_type, MEGA_TOKENIZER_BYTES);
  assert_int_equal(s.make_vocab_size_divisible_by, 128);
  assert_true(isnan(s.lr));
  assert_true(s.min_lr == 0);
  assert_int_equal(s.lr_warmup_iters, 0);
  assert_int_equal(s.lr_decay_iters, -1);
  assert_int_equal(s.lr_decay_style, MEGA_LR_LINEAR);
  assert_true(s.weight_decay == 0.01);
  assert_true(s.adam_beta1 == 0.9);
  assert_true(s.adam_beta2 == 0.999);
  assert_true(s.adam_eps == 1e-8);
  assert_true(s.clip_grad == 1.0);
  assert_null(s.save);
  assert_int_equal(s.save_interval, 0);
  assert_false(s.save_initial);
  assert_int_equal(s.eval_interval, 0);
  assert_int_equal(s.eval_iters, 100); /* Megatron's default */
  assert_int_equal(s.tensor_model_parallel_size, 1);
  assert_int_equal(s.pipeline_model_parallel_size, 1);
  assert_int_equal(s.virtual_pipeline_model_parallel_size, -1);
  assert_int_equal(s.num_layers_per_virtual_pipeline_stage, -1);
  assert_int_equal(s.microbatch_group_size_per_vp_stage, -1);
  assert_null(s.pipeline_model_parallel_layout);
  assert_int_equal(s.decoder_first_pipeline_num_layers, -1);
  assert_int_equal(s.decoder_last_pipeline_num_layers, -1);
  assert_int_equal(s.schedule, MEGA_JOB_SCHEDULE_AUTO);
  assert_false(s.batch_p2p_comm || s.overlap_p2p_comm || s.overlap_p2p_comm_warmup_flush ||
               s.variable_seq_lengths || s.deallocate_pipeline_outputs);
  assert_int_equal(s.recompute_granularity, MEGA_RECOMPUTE_NONE);
  assert_false(s.overlap_grad_reduce || s.align_grad_reduce || s.use_distributed_optimizer);
  assert_int_equal(s.bucket_size, -1);
  assert_int_equal(s.blas_threads, 1);
  assert_int_equal(s.trace_iteration, 0);
  assert_null(s.simulate_compute);
  assert_int_equal(s.log_interval, 100); /* Megatron's default */

  /* derived defaults */
  make_spec(&s, NULL, 0);
  assert_int_equal(mega_jobspec_max_position_embeddings(&s), 32);
  assert_int_equal(mega_jobspec_lr_decay_iters(&s), 10);
  assert_int_equal(mega_jobspec_vp(&s), 1);
  assert_int_equal(mega_jobspec_group_size(&s), 1);
  mega_jobspec_free(&s);
}

static void test_table(void **state) {
  (void)state;
  int n = mega_jobspec_flag_count();
  assert_true(n >= 50);
  assert_null(mega_jobspec_flag(n));
  assert_null(mega_jobspec_flag(-1));
  int required = 0;
  for (int i = 0; i < n; i++) {
    const mega_jobflag *f = mega_jobspec_flag(i);
    assert_non_null(f);
    assert_true(strncmp(f->name, "--", 2) == 0);
    /* the JSON key is Megatron's args name: the flag without "--", '-' -> '_' */
    char key[96];
    snprintf(key, sizeof key, "%s", f->name + 2);
    for (char *p = key; *p; p++)
      if (*p == '-') *p = '_';
    assert_string_equal(f->key, key);
    assert_true(f->help && strlen(f->help) > 10);
    assert_true(f->group && *f->group);
    assert_non_null(f->default_text);
    assert_ptr_equal(mega_jobspec_flag_find(f->name), f);
    if (f->type == MEGA_JOBFLAG_BOOL) {
      assert_null(f->metavar);
      assert_string_equal(f->default_text, "off"); /* to_argv can only say "on" */
    } else {
      assert_non_null(f->metavar);
    }
    assert_true((f->type == MEGA_JOBFLAG_ENUM) == (f->choices != NULL));
    required += f->required;
    /* a group's flags stay together: a new group has not been seen before */
    if (i > 0 && strcmp(mega_jobspec_flag(i - 1)->group, f->group) != 0)
      for (int j = 0; j < i; j++) assert_string_not_equal(mega_jobspec_flag(j)->group, f->group);
  }
  /* and --data-path, unless --train-data-path, and --train-iters, unless
   * --train-samples (check) */
  assert_int_equal(required, 7);
  assert_null(mega_jobspec_flag_find("--nope"));
  assert_null(mega_jobspec_flag_find("hidden-size"));
  assert_null(mega_jobspec_flag_find(NULL));
  const mega_jobflag *f = mega_jobspec_flag_find("--lr-decay-style");
  assert_int_equal(f->type, MEGA_JOBFLAG_ENUM);
  assert_string_equal(f->choices[0], "constant");
  assert_string_equal(f->default_text, "linear");
  f = mega_jobspec_flag_find("--adam-beta1");
  assert_true(f->min == 0 && f->max == 1 && f->max_exclusive && !f->min_exclusive);
}

static void test_both_syntaxes(void **state) {
  (void)state;
  mega_jobspec a, b;
  mega_err err = {0};
  mega_jobspec_defaults(&a);
  mega_jobspec_defaults(&b);
  assert_int_equal(mega_jobspec_parse(&a, PARSE_ARGS("--hidden-size", "64", "--lr", "3e-4", "--save",
                                               "/ckpt", "--schedule", "zb-h1", "--save-initial"),
                                      &err),
                   MEGA_OK);
  assert_int_equal(mega_jobspec_parse(&b, PARSE_ARGS("--hidden-size=64", "--lr=3e-4", "--save=/ckpt",
                                               "--schedule=zb-h1", "--save-initial"),
                                      &err),
                   MEGA_OK);
  assert_true(mega_jobspec_equal(&a, &b));
  assert_int_equal(a.hidden_size, 64);
  assert_true(a.lr == 3e-4);
  assert_string_equal(a.save, "/ckpt");
  assert_int_equal(a.schedule, MEGA_SCHED_ZB_H1);
  assert_true(a.save_initial);

  /* a later value replaces an earlier one (and the old string is freed) */
  assert_int_equal(mega_jobspec_parse(&a, PARSE_ARGS("--save", "/other", "--hidden-size=128"), &err),
                   MEGA_OK);
  assert_string_equal(a.save, "/other");
  assert_int_equal(a.hidden_size, 128);

  /* a value may contain '=' and may look like a flag after '=' */
  assert_int_equal(mega_jobspec_parse(&a, PARSE_ARGS("--data-path=a=b", "--load=--odd"), &err), MEGA_OK);
  assert_int_equal(a.data_path.n, 1);
  assert_string_equal(a.data_path.v[0], "a=b");
  assert_string_equal(a.load, "--odd");
  /* negative numbers are values, not flags */
  assert_int_equal(mega_jobspec_parse(&a, PARSE_ARGS("--seed", "-0"), &err), MEGA_OK);

  const char *names[] = {"no-pipelining", "gpipe", "1f1b", "interleaved", "zb-h1"};
  const int kinds[] = {MEGA_SCHED_NO_PIPELINING, MEGA_SCHED_GPIPE, MEGA_SCHED_1F1B,
                       MEGA_SCHED_INTERLEAVED, MEGA_SCHED_ZB_H1};
  for (int k = 0; k < 5; k++) {
    char *argv[] = {"--schedule", (char *)names[k]};
    assert_int_equal(mega_jobspec_parse(&a, 2, argv, &err), MEGA_OK);
    assert_int_equal(a.schedule, kinds[k]);
  }
  assert_int_equal(mega_jobspec_parse(&a, PARSE_ARGS("--recompute-granularity", "selective",
                                               "--lr-decay-style", "cosine"),
                                      &err),
                   MEGA_OK);
  assert_int_equal(a.recompute_granularity, MEGA_RECOMPUTE_SELECTIVE);
  assert_int_equal(a.lr_decay_style, MEGA_LR_COSINE);

  const char *bools[] = {"--save-initial", "--batch-p2p-comm", "--overlap-p2p-comm",
                         "--overlap-p2p-comm-warmup-flush", "--variable-seq-lengths",
                         "--deallocate-pipeline-outputs", "--overlap-grad-reduce",
                         "--align-grad-reduce", "--use-distributed-optimizer"};
  mega_jobspec_free(&b);
  for (int k = 0; k < 9; k++) {
    char *argv[] = {(char *)bools[k]};
    assert_int_equal(mega_jobspec_parse(&b, 1, argv, &err), MEGA_OK);
  }
  assert_true(b.save_initial && b.batch_p2p_comm && b.overlap_p2p_comm &&
              b.overlap_p2p_comm_warmup_flush && b.variable_seq_lengths &&
              b.deallocate_pipeline_outputs && b.overlap_grad_reduce && b.align_grad_reduce &&
              b.use_distributed_optimizer);
  mega_jobspec_free(&a);
  mega_jobspec_free(&b);
}

/* A caller with its own flags tries the job flags first, then its own. */
static void test_parse_flag_loop(void **state) {
  (void)state;
  char *argv[] = {"megactl", "--num-layers", "4", "--nodes", "2", "--lr=0.5", "--follow"};
  int argc = 7, nodes = 0;
  bool follow = false;
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  for (int i = 1; i < argc;) {
    mega_err err = {0};
    int before = i;
    mega_status st = mega_jobspec_parse_flag(&s, argc, argv, &i, &err);
    if (st == MEGA_ERR_NOT_FOUND) {
      assert_int_equal(i, before);
      expect_msg(&err, "unknown flag");
      if (strcmp(argv[i], "--nodes") == 0) {
        nodes = atoi(argv[i + 1]);
        i += 2;
      } else if (strcmp(argv[i], "--follow") == 0) {
        follow = true;
        i++;
      } else {
        fail_msg("unexpected %s", argv[i]);
      }
      continue;
    }
    assert_int_equal(st, MEGA_OK);
  }
  assert_int_equal(s.num_layers, 4);
  assert_true(s.lr == 0.5);
  assert_int_equal(nodes, 2);
  assert_true(follow);

  mega_err err = {0};
  int i = 0;
  char *words[] = {"submit"};
  assert_int_equal(mega_jobspec_parse_flag(&s, 1, words, &i, &err), MEGA_ERR_NOT_FOUND);
  expect_msg(&err, "unexpected argument 'submit' (job flags start with --)");
  i = 1;
  assert_int_equal(mega_jobspec_parse_flag(&s, 1, words, &i, &err), MEGA_ERR_INVALID);
  mega_jobspec_free(&s);
}

static void test_unknown_flags(void **state) {
  (void)state;
  expect_parse_error(ARGV("--hiden-size", "4"), MEGA_ERR_INVALID,
                     "unknown flag '--hiden-size'; did you mean --hidden-size?");
  expect_parse_error(ARGV("--tensor-parallel-size=2"), MEGA_ERR_INVALID,
                     "unknown flag '--tensor-parallel-size'");
  expect_parse_error(ARGV("--xyz"), MEGA_ERR_INVALID, "unknown flag '--xyz'");
  expect_parse_error(ARGV("--num-layers", "4", "extra"), MEGA_ERR_INVALID,
                     "unexpected argument 'extra'");
  expect_parse_error(ARGV("-num-layers", "4"), MEGA_ERR_INVALID, "unexpected argument '-num-layers'");
  /* Megatron's abbreviations are not accepted: names match exactly */
  expect_parse_error(ARGV("--num-layer", "4"), MEGA_ERR_INVALID, "did you mean --num-layers?");

  mega_jobspec s;
  mega_err err = {0};
  mega_jobspec_defaults(&s);
  int i = 0;
  char *argv[] = {"--hiden-size", "4"};
  assert_int_equal(mega_jobspec_parse_flag(&s, 2, argv, &i, &err), MEGA_ERR_NOT_FOUND);
  assert_int_equal(i, 0);
  mega_jobspec_free(&s);
}

static void test_value_errors(void **state) {
  (void)state;
  expect_parse_error(ARGV("--hidden-size", "abc"), MEGA_ERR_INVALID,
                     "--hidden-size: 'abc' is not a whole number");
  expect_parse_error(ARGV("--hidden-size", "12abc"), MEGA_ERR_INVALID,
                     "--hidden-size: '12abc' is not a whole number");
  expect_parse_error(ARGV("--hidden-size", "1.5"), MEGA_ERR_INVALID, "'1.5' is not a whole number");
  expect_parse_error(ARGV("--hidden-size", " 5"), MEGA_ERR_INVALID, "' 5' is not a whole number");
  expect_parse_error(ARGV("--hidden-size="), MEGA_ERR_INVALID, "--hidden-size: '' is not a whole number");
  expect_parse_error(ARGV("--hidden-size", "99999999999"), MEGA_ERR_INVALID,
                     "--hidden-size: '99999999999' is out of range (at most 2147483647)");
  expect_parse_error(ARGV("--seed", "99999999999999999999999"), MEGA_ERR_INVALID, "is out of range");
  expect_parse_error(ARGV("--hidden-size", "0"), MEGA_ERR_INVALID,
                     "--hidden-size must be at least 1 (got 0)");
  expect_parse_error(ARGV("--tensor-model-parallel-size", "-2"), MEGA_ERR_INVALID,
                     "--tensor-model-parallel-size must be at least 1 (got -2)");
  expect_parse_error(ARGV("--pipeline-model-parallel-size=0"), MEGA_ERR_INVALID,
                     "--pipeline-model-parallel-size must be at least 1 (got 0)");
  expect_parse_error(ARGV("--eval-iters", "-1"), MEGA_ERR_INVALID,
                     "--eval-iters must be at least 0 (got -1)");
  expect_parse_error(ARGV("--decoder-first-pipeline-num-layers", "-1"), MEGA_ERR_INVALID,
                     "--decoder-first-pipeline-num-layers must be at least 0 (got -1)");
  expect_parse_error(ARGV("--lr", "1e400"), MEGA_ERR_INVALID, "--lr: '1e400' is too large to represent");
  expect_parse_error(ARGV("--lr", "1e-400"), MEGA_ERR_INVALID, "--lr: '1e-400' is too small to represent");
  expect_parse_error(ARGV("--lr", "0.1x"), MEGA_ERR_INVALID, "--lr: '0.1x' is not a number");
  expect_parse_error(ARGV("--lr", "fast"), MEGA_ERR_INVALID, "--lr: 'fast' is not a number");
  expect_parse_error(ARGV("--lr", "nan"), MEGA_ERR_INVALID, "--lr: 'nan' is not a finite number");
  expect_parse_error(ARGV("--lr", "inf"), MEGA_ERR_INVALID, "--lr: 'inf' is not a finite number");
  expect_parse_error(ARGV("--lr", "-0.1"), MEGA_ERR_INVALID, "--lr must be at least 0 (got -0.1)");
  expect_parse_error(ARGV("--adam-beta1", "1"), MEGA_ERR_INVALID, "--adam-beta1 must be less than 1 (got 1)");
  /* the model's own bounds, refused where the job is read (not when it starts) */
  expect_parse_error(ARGV("--rotary-base", "1"), MEGA_ERR_INVALID,
                     "--rotary-base must be at least 2 (got 1)");
  expect_parse_error(ARGV("--norm-epsilon", "1e-50"), MEGA_ERR_INVALID,
                     "--norm-epsilon must be at least 1e-30 (got 1e-50)");
  expect_parse_error(ARGV("--norm-epsilon", "1e300"), MEGA_ERR_INVALID,
                     "--norm-epsilon must be at most 1e+30 (got 1e+300)");
  expect_parse_error(ARGV("--init-method-std", "1e300"), MEGA_ERR_INVALID,
                     "--init-method-std must be at most 1e+30 (got 1e+300)");
  expect_parse_error(ARGV("--adam-beta2=-0.5"), MEGA_ERR_INVALID, "--adam-beta2 must be at least 0 (got -0.5)");
  expect_parse_error(ARGV("--adam-eps", "0"), MEGA_ERR_INVALID, "--adam-eps must be greater than 0 (got 0)");
  expect_parse_error(ARGV("--init-method-std", "0"), MEGA_ERR_INVALID,
                     "--init-method-std must be greater than 0 (got 0)");
  expect_parse_error(ARGV("--clip-grad", "-1"), MEGA_ERR_INVALID, "--clip-grad must be at least 0");
  expect_parse_error(ARGV("--lr-decay-style", "exponential"), MEGA_ERR_INVALID,
                     "--lr-decay-style: 'exponential' is not one of constant, linear, cosine");
  expect_parse_error(ARGV("--schedule", "1F1B"), MEGA_ERR_INVALID,
                     "--schedule: '1F1B' is not one of no-pipelining, gpipe, 1f1b, interleaved, zb-h1");
  expect_parse_error(ARGV("--recompute-granularity", "none"), MEGA_ERR_INVALID,
                     "'none' is not one of full, selective");
  expect_parse_error(ARGV("--save-initial=yes"), MEGA_ERR_INVALID,
                     "--save-initial takes no value (got '--save-initial=yes')");
  expect_parse_error(ARGV("--hidden-size"), MEGA_ERR_INVALID, "--hidden-size needs a value (--hidden-size N)");
  expect_parse_error(ARGV("--save", "--load", "x"), MEGA_ERR_INVALID, "--save needs a value (--save DIR)");
  expect_parse_error(ARGV("--save="), MEGA_ERR_INVALID, "--save: the value is empty");
  expect_parse_error(ARGV("--data-path", ""), MEGA_ERR_INVALID, "--data-path: the value is empty");

  /* a failed parse leaves the field as it was */
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  mega_err err = {0};
  assert_int_equal(mega_jobspec_parse(&s, PARSE_ARGS("--seed", "7", "--seed", "x"), &err), MEGA_ERR_INVALID);
  assert_int_equal(s.seed, 7);
  mega_jobspec_free(&s);
}

/* Megatron's recomputation rules: full needs a method and a layer count of
 * at most one model chunk's layers; selective takes neither. */
static void test_recompute_flags(void **state) {
  (void)state;
  expect_check_ok(ARGV("--recompute-granularity", "selective"), 1, -1);
  expect_check_ok(ARGV("--recompute-granularity", "full", "--recompute-method", "uniform",
                       "--recompute-num-layers", "1"), 1, -1);
  expect_check_ok(ARGV("--recompute-granularity", "full", "--recompute-method", "block",
                       "--recompute-num-layers", "4"), 1, -1);
  expect_check_ok(ARGV("--recompute-granularity", "full", "--recompute-method", "uniform",
                       "--recompute-num-layers", "3", "--pipeline-model-parallel-size", "2",
                       "--pipeline-model-parallel-layout", "Et|tttL"), 2, -1);
  expect_check_error(ARGV("--recompute-method", "uniform"), 1, -1,
                     "--recompute-method needs --recompute-granularity full");
  expect_check_error(ARGV("--recompute-num-layers", "2"), 1, -1,
                     "--recompute-num-layers needs --recompute-granularity full");
  expect_check_error(ARGV("--recompute-granularity", "full"), 1, -1,
                     "--recompute-granularity full needs --recompute-method uniform|block");
  expect_check_error(ARGV("--recompute-granularity", "full", "--recompute-method", "uniform"), 1,
                     -1, "--recompute-granularity full needs --recompute-num-layers N, between 1 "
                         "and the 4 decoder layers of the largest model chunk");
  expect_check_error(ARGV("--recompute-granularity", "full", "--recompute-method", "block",
                          "--recompute-num-layers", "3", "--pipeline-model-parallel-size", "2"),
                     2, -1, "--recompute-num-layers 3 is more than the 2 decoder layers of the "
                            "largest model chunk; use 1 to 2");
  expect_check_error(ARGV("--recompute-granularity", "full", "--recompute-method", "block",
                          "--recompute-num-layers", "2", "--pipeline-model-parallel-size", "2",
                          "--virtual-pipeline-model-parallel-size", "2"),
                     2, -1, "--recompute-num-layers 2 is more than the 1 decoder layers");
  expect_check_error(ARGV("--recompute-granularity", "selective", "--recompute-method", "block"),
                     1, -1, "--recompute-method is for --recompute-granularity full");
  expect_check_error(ARGV("--recompute-granularity", "selective", "--recompute-num-layers", "1"),
                     1, -1, "--recompute-num-layers is for --recompute-granularity full");
  expect_check_error(ARGV("--recompute-granularity", "selective", "--simulate-compute", "1:2"),
                     1, -1, "recomputes nothing");
  expect_parse_error(ARGV("--recompute-method", "fancy"), MEGA_ERR_INVALID,
                     "--recompute-method: 'fancy' is not one of uniform, block");
  expect_parse_error(ARGV("--recompute-num-layers", "0"), MEGA_ERR_INVALID,
                     "--recompute-num-layers must be at least 1 (got 0)");
}

#define LLAMA "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu"

/* The model's flags: Megatron's defaults and derived sizes, a Llama's
 * flags as its scripts give them, and the refusals with their reasons. */
static void test_model_flags(void **state) {
  (void)state;
  mega_jobspec s;
  make_spec(&s, NULL, 0);
  assert_false(mega_jobspec_llama(&s));
  assert_int_equal(s.position_embedding_type, MEGA_POS_LEARNED_ABSOLUTE);
  assert_int_equal(s.normalization, MEGA_NORM_LAYERNORM);
  assert_int_equal(s.rotary_base, 10000);
  assert_true(s.rotary_percent == 1.0 && s.norm_epsilon == 1e-5);
  assert_int_equal(mega_jobspec_ffn_hidden_size(&s), 256);
  assert_int_equal(mega_jobspec_kv_channels(&s), 16);
  assert_int_equal(mega_jobspec_query_groups(&s), 4);
  assert_int_equal(s.context_parallel_size, 1);
  mega_jobspec_free(&s);

  make_spec(&s, ARGV(LLAMA, "--ffn-hidden-size", "96", "--group-query-attention",
                     "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
                     "--disable-bias-linear", "--kv-channels", "8", "--rotary-base", "500000",
                     "--rotary-percent", "0.5", "--norm-epsilon", "1e-6", "--attention-dropout",
                     "0", "--hidden-dropout", "0", "--context-parallel-size", "1",
                     "--use-mcore-models", "--transformer-impl", "local"));
  assert_true(mega_jobspec_llama(&s));
  assert_int_equal(mega_jobspec_ffn_hidden_size(&s), 96);
  assert_int_equal(mega_jobspec_query_groups(&s), 2);
  assert_int_equal(mega_jobspec_kv_channels(&s), 8);
  assert_int_equal(s.rotary_base, 500000);
  mega_err err = {0};
  if (mega_jobspec_check(&s, 2, -1, &err) != MEGA_OK) fail_msg("%s", err.msg);
  s.tensor_model_parallel_size = 2;
  if (mega_jobspec_check(&s, 2, -1, &err) != MEGA_OK) fail_msg("%s", err.msg);
  mega_jobspec_free(&s);

  /* Megatron's SwiGLU width and --group-query-attention's one group */
  make_spec(&s, ARGV(LLAMA, "--hidden-size", "4096", "--num-attention-heads", "32",
                     "--group-query-attention"));
  assert_int_equal(mega_jobspec_ffn_hidden_size(&s), 10880);
  assert_int_equal(mega_jobspec_query_groups(&s), 1);
  mega_jobspec_free(&s);
  /* Llama's heads may be wider or narrower than hidden / heads */
  expect_check_ok(ARGV(LLAMA, "--ffn-hidden-size", "128", "--num-attention-heads", "6",
                       "--kv-channels", "16"),
                  1, -1);
  expect_check_ok(ARGV("--kv-channels", "16"), 1, -1); /* GPT-2's own width */

  /* the four the issue names: heads by groups, groups by TP, SwiGLU's
   * width, the rotated share */
  expect_check_error(ARGV(LLAMA, "--ffn-hidden-size", "128", "--group-query-attention",
                          "--num-query-groups", "3"),
                     1, -1,
                     "invalid job: --num-attention-heads 4 is not divisible by "
                     "--num-query-groups 3: each query group shares its key and value heads "
                     "with the same number of query heads");
  /* the query groups' default under TP: the flag to give, not a count never given */
  expect_check_error(ARGV(LLAMA, "--ffn-hidden-size", "128", "--group-query-attention",
                          "--tensor-model-parallel-size", "2"),
                     2, -1,
                     "invalid job: --group-query-attention without --num-query-groups is one "
                     "key/value head for all query heads (Megatron's default --num-query-groups "
                     "1), which --tensor-model-parallel-size 2 cannot split: each "
                     "tensor-parallel rank holds whole query groups; give --num-query-groups G, "
                     "a multiple of 2");
  expect_check_error(ARGV(LLAMA, "--ffn-hidden-size", "128", "--group-query-attention",
                          "--num-query-groups", "1", "--tensor-model-parallel-size", "2"),
                     2, -1,
                     "invalid job: --num-query-groups 1 is not divisible by "
                     "--tensor-model-parallel-size 2: each tensor-parallel rank holds whole "
                     "query groups");
  expect_check_error(ARGV(LLAMA, "--hidden-size", "16"), 1, -1,
                     "invalid job: --swiglu without --ffn-hidden-size takes Megatron's default "
                     "int(4 x 16 x 2/3 / 64) x 64 = 0 for --hidden-size 16; give "
                     "--ffn-hidden-size N");
  make_spec(&s, ARGV(LLAMA));
  assert_int_equal(mega_jobspec_ffn_hidden_size(&s), 128); /* int(170.7 / 64) x 64 */
  mega_jobspec_free(&s);
  expect_check_error(ARGV(LLAMA, "--ffn-hidden-size", "33", "--tensor-model-parallel-size", "2"),
                     2, -1,
                     "the MLP's width 33 (--ffn-hidden-size) is not divisible by "
                     "--tensor-model-parallel-size 2");
  expect_parse_error(ARGV("--rotary-percent", "0"), MEGA_ERR_INVALID,
                     "--rotary-percent must be greater than 0 (got 0)");
  expect_parse_error(ARGV("--rotary-percent", "1.5"), MEGA_ERR_INVALID,
                     "--rotary-percent must be at most 1 (got 1.5)");
  expect_check_ok(ARGV(LLAMA, "--ffn-hidden-size", "128", "--rotary-percent", "0.25"), 1, -1);
  /* Megatron's int(kv_channels * rotary_percent), in double: 100 x 0.29 is
   * 28.999999999999996, 28 channels (in float it would be 29, refused) */
  expect_check_ok(ARGV(LLAMA, "--ffn-hidden-size", "128", "--kv-channels", "100",
                       "--rotary-percent", "0.29"),
                  1, -1);
  expect_check_error(ARGV(LLAMA, "--ffn-hidden-size", "128", "--rotary-percent", "0.1"), 1, -1,
                     "--rotary-percent 0.1 of 16 channels per head rotates 1; RoPE turns pairs "
                     "of channels, so that must be even and at least 2");

  /* two architectures, each whole */
  expect_check_error(ARGV("--swiglu"), 1, -1,
                     "invalid job: --swiglu without --position-embedding-type rope: mega trains "
                     "GPT-2 (learned_absolute positions, LayerNorm, GELU) or Llama "
                     "(--position-embedding-type rope --normalization RMSNorm --swiglu), the "
                     "two Hugging Face architectures its checkpoints are; give all three for "
                     "Llama, or none for GPT-2");
  expect_check_error(ARGV("--normalization", "RMSNorm", "--swiglu"), 1, -1,
                     "--normalization RMSNorm without --position-embedding-type rope");
  expect_check_error(ARGV("--position-embedding-type", "rope", "--swiglu"), 1, -1,
                     "--position-embedding-type rope without --normalization RMSNorm");
  expect_check_error(ARGV("--group-query-attention"), 1, -1,
                     "--group-query-attention needs the Llama architecture");
  expect_check_error(ARGV("--disable-bias-linear"), 1, -1,
                     "--disable-bias-linear needs the Llama architecture (--position-embedding-"
                     "type rope --normalization RMSNorm --swiglu): Hugging Face's GPT-2 has "
                     "biases always");
  expect_check_error(ARGV("--kv-channels", "8"), 1, -1,
                     "--kv-channels 8: GPT-2's heads are --hidden-size / --num-attention-heads "
                     "wide");
  expect_check_error(ARGV("--rotary-base", "500000"), 1, -1,
                     "--rotary-base needs --position-embedding-type rope");
  expect_check_error(ARGV(LLAMA, "--ffn-hidden-size", "128", "--num-query-groups", "2"), 1, -1,
                     "--num-query-groups needs --group-query-attention");
  /* what restates mega takes only mega's value */
  /* attention dropout works too, on either backend */
  expect_check_ok(ARGV("--attention-dropout", "0.1"), 1, -1);
  expect_check_ok(ARGV("--attention-dropout", "0.1", "--backend", "cpu"), 1, -1);
  expect_check_ok(ARGV("--attention-dropout", "0.1", "--backend", "cuda"), 1, -1);
  expect_check_ok(ARGV("--attention-dropout", "0.1", "--backend", "cuda", "--bf16"), 1, -1);
  expect_parse_error(ARGV("--attention-dropout", "1"), MEGA_ERR_INVALID,
                     "--attention-dropout must be less than 1 (got 1)");
  /* hidden dropout works, at a probability in [0, 1) */
  expect_check_ok(ARGV("--hidden-dropout", "0.1"), 1, -1);
  expect_parse_error(ARGV("--hidden-dropout", "1"), MEGA_ERR_INVALID,
                     "--hidden-dropout must be less than 1 (got 1)");
  expect_parse_error(ARGV("--hidden-dropout", "-0.1"), MEGA_ERR_INVALID,
                     "--hidden-dropout must be at least 0 (got -0.1)");
  expect_check_error(ARGV("--context-parallel-size", "2"), 1, -1,
                     "--context-parallel-size 2: mega has no context parallelism");
  expect_check_error(ARGV("--transformer-impl", "transformer_engine"), 1, -1,
                     "--transformer-impl transformer_engine: mega runs its own kernels");
  expect_parse_error(ARGV("--normalization", "rmsnorm"), MEGA_ERR_INVALID,
                     "--normalization: 'rmsnorm' is not one of LayerNorm, RMSNorm");
}

static void test_simulate_compute(void **state) {
  (void)state;
  mega_sim_compute c;
  mega_err err = {0};
  assert_int_equal(mega_jobspec_parse_simulate_compute("2:4.5", &c, &err), MEGA_OK);
  assert_true(c.f_ms == 2 && c.b_ms == 4.5 && c.w_ms == 0 && !c.has_w);
  assert_int_equal(mega_jobspec_parse_simulate_compute("1:1:0.25", &c, &err), MEGA_OK);
  assert_true(c.f_ms == 1 && c.b_ms == 1 && c.w_ms == 0.25 && c.has_w);
  assert_int_equal(mega_jobspec_parse_simulate_compute("", &c, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_jobspec_parse_simulate_compute(NULL, &c, &err), MEGA_ERR_INVALID);
  assert_int_equal(mega_jobspec_parse_simulate_compute("1:2 ", &c, &err), MEGA_ERR_INVALID);
  expect_msg(&err, "B_MS: '2 ' is not a number");
}

static void test_derived(void **state) {
  (void)state;
  mega_jobspec s;
  make_spec(&s, ARGV("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                     "--global-batch-size", "16", "--num-layers", "8",
                     "--num-layers-per-virtual-pipeline-stage", "2"));
  mega_err err = {0};
  assert_int_equal(mega_jobspec_check(&s, 8, 1000, &err), MEGA_OK);
  assert_int_equal(mega_jobspec_dp(&s, 8), 2);
  assert_int_equal(mega_jobspec_dp(&s, 6), 0);
  assert_int_equal(mega_jobspec_num_microbatches(&s, 8), 4); /* 16 / (2 × 2) */
  assert_int_equal(mega_jobspec_num_microbatches(&s, 4), 8);
  assert_int_equal(mega_jobspec_tokens_per_iter(&s), 16 * 32);
  assert_int_equal(mega_jobspec_vp(&s), 2);
  assert_int_equal(mega_jobspec_group_size(&s), 2);
  assert_int_equal(mega_jobspec_padded_vocab(&s), 256);
  mega_layout l;
  assert_int_equal(mega_jobspec_layout(&s, &l, &err), MEGA_OK);
  assert_int_equal(l.pp, 2);
  assert_int_equal(l.vp, 2);
  char *str = mega_layout_format(&l);
  assert_string_equal(str, "Ett|tt|tt|ttL");
  free(str);
  mega_layout_free(&l);

  s.tensor_model_parallel_size = 3;
  assert_int_equal(mega_jobspec_padded_vocab(&s), 384);
  s.tensor_model_parallel_size = 4;
  assert_int_equal(mega_jobspec_padded_vocab(&s), 512);
  s.microbatch_group_size_per_vp_stage = 3;
  assert_int_equal(mega_jobspec_group_size(&s), 3);
  mega_jobspec_free(&s);

  make_spec(&s, ARGV("--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                     "Et|t|t|tL", "--max-position-embeddings", "64", "--lr-decay-iters", "7"));
  assert_int_equal(mega_jobspec_vp(&s), 2);
  assert_int_equal(mega_jobspec_max_position_embeddings(&s), 64);
  assert_int_equal(mega_jobspec_lr_decay_iters(&s), 7);
  assert_int_equal(mega_jobspec_layout(&s, &l, &err), MEGA_OK);
  assert_int_equal(mega_layout_count(&l, 1, 1, MEGA_LAYER_LOSS), 1);
  mega_layout_free(&l);
  mega_jobspec_free(&s);
}

/* The flags that name a file or a directory, which megactl submit makes
 * absolute (it once missed --vocab-file and --merge-file): the table says
 * which, so a new FILE or DIR flag is one too. */
static void test_path_fields(void **state) {
  (void)state;
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  char **got[16];
  int n = mega_jobspec_path_fields(&s, got, 16);
  assert_int_equal(mega_jobspec_path_fields(&s, NULL, 0), n);
  char **want[] = {&s.data_cache_path, &s.vocab_file, &s.merge_file, &s.save, &s.load};
  assert_int_equal(n, 5);
  for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
    bool found = false;
    for (int i = 0; i < n; i++) found |= got[i] == want[k];
    assert_true(found);
  }
  /* and every other string flag names no file */
  int strings = 0;
  for (int i = 0; i < mega_jobspec_flag_count(); i++) {
    const mega_jobflag *f = mega_jobspec_flag(i);
    if (f->type == MEGA_JOBFLAG_STRING && !strstr(f->metavar, "FILE") && !strstr(f->metavar, "DIR"))
      strings++;
    if (f->type == MEGA_JOBFLAG_STRING && strstr(f->help, "file") &&
        strcmp(f->metavar, "FILE") && strcmp(f->metavar, "DIR"))
      fail_msg("%s reads like a path but its metavar is %s", f->name, f->metavar);
  }
  assert_true(strings >= 1); /* --split, the layout, --simulate-compute */
  char **one[2];
  assert_int_equal(mega_jobspec_path_fields(&s, one, 2), 5); /* cap bounds what is written */
  mega_jobspec_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),       cmocka_unit_test(test_table),
      cmocka_unit_test(test_both_syntaxes),  cmocka_unit_test(test_parse_flag_loop),
      cmocka_unit_test(test_unknown_flags),  cmocka_unit_test(test_value_errors),
      cmocka_unit_test(test_recompute_flags),  cmocka_unit_test(test_model_flags),
      cmocka_unit_test(test_simulate_compute), cmocka_unit_test(test_derived),
      cmocka_unit_test(test_path_fields),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
