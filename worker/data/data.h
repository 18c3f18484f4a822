/* The training data and its order. The order never depends on the parallel
 * layout, which is what lets every (TP, PP, DP) layout give the same losses.
 *
 * A dataset is a plain file, whose bytes are the tokens, or Megatron's
 * indexed dataset (worker/data/indexed.h), whose sequences' tokens, concatenated
 * in index order, are the stream. With n tokens in the stream and sequence
 * length T there are K = floor((n-1)/T) windows; window k has inputs
 * tokens[kT, kT+T) and targets tokens[kT+1, kT+T+1). Sample j (0 <= j < G)
 * of iteration i (0-based) is sample s = i*G + j (with a batch rampup, s =
 * c_i + j, c_i the samples consumed before iteration i: mega_batch_plan);
 * with one dataset it is window s mod K. DP rank d takes samples [d*G/DP, (d+1)*G/DP) and splits
 * them into consecutive microbatches of micro_batch samples each.
 *
 * A blend of datasets with weights w (normalized to sum 1) takes sample s
 * from the dataset d maximizing w[d]*max(s,1) - c[d], the lowest d on a
 * tie, where c[d] counts the samples taken from d before s (Megatron's
 * build_blending_indices); it is that dataset's window c[d] mod K_d.
 *
 * A split (train, valid, test shares of each indexed dataset's sequences,
 * Megatron's get_split_indices) makes each share its own stream: training
 * reads the train stream, evaluation the valid one, and the evaluation after
 * training ends the test one too. Separate valid datasets
 * (--valid-data-path) are evaluation's streams instead, blended alike.
 *
 * With Megatron's order (opts.megatron, --data-order megatron) each
 * stream is instead a Megatron-LM GPTDataset over its documents
 * (worker/data/gpt_order.h), built for the samples Megatron would ask of
 * it, and a dataset's sample c is that GPTDataset's sample c: the blend,
 * the split, the DP ranks and the microbatches deal samples out as above.
 *
 * mega_data maps the files read-only once and is then immutable, so any
 * number of threads may read it at once. */
#ifndef MEGA_WORKER_DATA_H
#define MEGA_WORKER_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/jobspec.h"
#include "core/status.h"

typedef struct mega_data mega_data;

/* How a global batch is dealt out. A plan holds for iterations from iter0
 * on, as long as their batch is G: iteration i's first sample is sample0 +
 * (i - iter0) * G. A constant batch has one plan with iter0 = sample0 = 0,
 * so iteration i starts at i*G; a --rampup-batch-size job gets a new plan
 * at each batch size it reaches (sample0 the samples consumed before it). */
typedef struct mega_batch_plan {
  int global_batch; /* G: samples per iteration */
  int micro_batch;  /* samples per microbatch */
  int dp_size;      /* data-parallel ranks */
  int num_micro;    /* derived: G / (micro_batch * dp_size) per rank */
  int64_t iter0, sample0;
} mega_batch_plan;

/* Checks G % (micro_batch * dp_size) == 0 and fills num_micro; iter0 and
 * sample0 are 0. */
mega_status mega_batch_plan_init(mega_batch_plan *p, int global_batch, int micro_batch,
                                 int dp_size, mega_err *err);
/* The first sample number of iteration it under p. */
int64_t mega_batch_plan_start(const mega_batch_plan *p, int64_t it);

/* The size of the file at path, for mega_jobspec_check before the data is
 * opened (so the user sees the job checker's message). */
mega_status mega_data_file_size(const char *path, long long *bytes, mega_err *err);

/* Checks that every dataset of the job can be read (a file, or
 * PREFIX.bin and PREFIX.idx) and sets *bytes to the size of the one plain
 * file when the data is a single plain file, else -1: mega_jobspec_check's
 * data_bytes. With --data-order megatron a plain file is refused
 * (MEGA_ERR_INVALID): that order reads indexed datasets only. */
mega_status mega_data_probe(const mega_jobspec *job, long long *bytes, mega_err *err);

typedef struct mega_data_opts {
  int seq_len;      /* T */
  int vocab;        /* token ids must be below it; 0: 256 (bytes) */
  bool split;       /* shares below are given */
  double shares[3]; /* train, valid, test, summing to 1 */
  bool eval;        /* with split: evaluation reads the valid split, which must
                       hold a window (its share > 0) */
  bool test;        /* with split: the end of training reads the test split (its
                       third share); one too small for a window in any dataset
                       gives no test set (mega_data_has_test) */
  /* --valid-data-path: evaluation reads these datasets (blended by their
   * weights, each from its start) instead; valid_n 0: none */
  const char *const *valid_paths;
  const double *valid_weights;
  int valid_n;
  int64_t samples;  /* blends: sample numbers below it are looked up fast */
  /* Megatron's order: every dataset indexed, each stream a GPTDataset
   * seeded with seed. train_samples and valid_samples are the sizes
   * Megatron asks of the training and the valid blend (its
   * train_valid_test_num_samples); each dataset of a blend is built for
   * ceil(ceil(size * w) * 1.005) samples (w its normalized weight), and a
   * lone dataset for size, except that train_blend_of_one builds a lone
   * training dataset as a blend (Megatron's --data-path 1.0 PREFIX). */
  bool megatron;
  uint32_t seed;
  int64_t train_samples, valid_samples, test_samples;
  bool train_blend_of_one;
  /* --data-cache-path: Megatron's order's indices are read from and
   * written to this directory (gpt_order.h); NULL: built in memory */
  const char *cache_dir;
} mega_data_opts;

/* Opens n datasets (a plain file or an indexed PREFIX each) with their
 * weights (NULL when n is 1). Fails (MEGA_ERR_IO) when a file cannot be
 * read and (MEGA_ERR_INVALID) when one is bad or a stream the job reads
 * holds less than one window (T + 1 tokens). The caller owns *out and frees
 * it with mega_data_close. */
mega_status mega_data_open_set(const char *const *paths, const double *weights, int n,
                               const mega_data_opts *o, mega_data **out, mega_err *err);
/* One dataset, byte vocabulary, no split. */
mega_status mega_data_open(const char *path, int seq_len, mega_data **out, mega_err *err);
/* The datasets, vocabulary and split of a checked job. */
mega_status mega_data_open_job(const mega_jobspec *job, mega_data **out, mega_err *err);
void mega_data_close(mega_data *d);

/* With --data-cache-path: a line for the log into buf (n bytes), how many
 * order indices were read from the cache and how many built, and why any
 * cache file was replaced; false (buf untouched) without a cache. */
bool mega_data_cache_note(const mega_data *d, char *buf, size_t n);

size_t mega_data_size(const mega_data *d);     /* tokens in dataset 0 */
int64_t mega_data_windows(const mega_data *d); /* K of dataset 0's training stream */
int mega_data_seq_len(const mega_data *d);     /* T */

/* Where sample s (i*G + j) comes from: its dataset and its window in that
 * dataset's training (eval false) or evaluation stream. Evaluation without
 * a split counts windows from the end of the training stream. In
 * Megatron's order *window is the dataset's sample number (the index into
 * its GPTDataset), which may lie past the samples it holds (copying such a
 * microbatch fails). */
void mega_data_sample_source(const mega_data *d, int64_t s, bool eval, int *dataset,
                             int64_t *window);

/* Which of a job's streams a batch reads. */
typedef enum mega_data_which { MEGA_DATA_TRAIN, MEGA_DATA_VALID, MEGA_DATA_TEST } mega_data_which;

/* Whether the data holds a test split (mega_data_opts.test). */
bool mega_data_has_test(const mega_data *d);
/* Why a test split asked for (mega_data_opts.test) holds none: the first
 * dataset whose test share is shorter than one window, and what to change.
 * NULL when none was asked for or it is there. Owned by d. */
const char *mega_data_no_test(const mega_data *d);

/* File order: the window of sample j of iteration i in dataset 0, one dataset:
 * (i*G + j) mod K. */
int64_t mega_data_sample_window(const mega_data *d, int64_t iteration, int global_batch,
                                int sample);

/* The first sample (0 <= s < G) of microbatch `micro` on DP rank dp_rank. */
int mega_batch_first_sample(const mega_batch_plan *p, int dp_rank, int micro);

/* Writes microbatch `micro` (0 <= micro < num_micro) of DP rank dp_rank in
 * iteration `iteration`: tokens and targets are [micro_batch][T] row-major,
 * caller-owned, micro_batch * T entries each. */
mega_status mega_data_microbatch(const mega_data *d, const mega_batch_plan *p, int64_t iteration,
                                 int dp_rank, int micro, int32_t *tokens, int32_t *targets,
                                 mega_err *err);

/* Evaluation batches: sample j of evaluation iteration e is sample e*G + j
 * of the evaluation streams, dealt to DP ranks and microbatches as training
 * samples are. With a split they are the valid split's windows in order;
 * without one they count windows from the end of the training stream,
 * K-1 - ((e*G + j) mod K). (A file used only for training overlaps its
 * evaluation windows; give evaluation its own text with --split, or by
 * appending it to the end of the training file.) */
mega_status mega_data_eval_microbatch(const mega_data *d, const mega_batch_plan *p,
                                      int64_t eval_iteration, int dp_rank, int micro,
                                      int32_t *tokens, int32_t *targets, mega_err *err);

/* Test batches (the end of training, Megatron's test set): sample j of test
 * iteration e is sample e*G + j of the test split's streams, blended as
 * training's, dealt out alike; the split's windows in order (file order),
 * or Megatron's test GPTDataset, built for --eval-iters x G samples and
 * read from its start. MEGA_ERR_INVALID without a test split. */
mega_status mega_data_test_microbatch(const mega_data *d, const mega_batch_plan *p,
                                      int64_t test_iteration, int dp_rank, int micro,
                                      int32_t *tokens, int32_t *targets, mega_err *err);

/* --variable-seq-lengths: microbatches of one iteration differ in length
 * while the data order stays the same. Global microbatch k of an iteration
 * (samples [k*b, (k+1)*b), whatever the data-parallel split) of iteration i
 * keeps the first T - ((s_i/b + k) mod 4) * floor(T/8) tokens of each of its
 * windows (s_i the iteration's first sample, i*G without a rampup), so
 * lengths cycle through T, 7T/8, 3T/4, 5T/8. first_sample is the
 * microbatch's first sample in the iteration (mega_batch_first_sample). */
int mega_data_variable_seq_len(int seq_len, const mega_batch_plan *p, int64_t iteration,
                               int first_sample);

#endif
