/* The training data and its order. The order never depends on the parallel
 * layout, which is what lets every (TP, PP, DP) layout give the same losses.
 *
 * The vocabulary is bytes. With n bytes in the file and sequence length T
 * there are K = floor((n-1)/T) windows; window k has inputs bytes[kT, kT+T)
 * and targets bytes[kT+1, kT+T+1). Sample j (0 <= j < G) of iteration i
 * (0-based) is window (i*G + j) mod K. DP rank d takes samples
 * [d*G/DP, (d+1)*G/DP) and splits them into consecutive microbatches of
 * micro_batch samples each.
 *
 * mega_data maps the file read-only once and is then immutable, so any number
 * of threads may read it at once. */
#ifndef MEGA_WORKER_DATA_H
#define MEGA_WORKER_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct mega_data mega_data;

/* How a global batch is dealt out. */
typedef struct mega_batch_plan {
  int global_batch; /* G: samples per iteration */
  int micro_batch;  /* samples per microbatch */
  int dp_size;      /* data-parallel ranks */
  int num_micro;    /* derived: G / (micro_batch * dp_size) per rank */
} mega_batch_plan;

/* Checks G % (micro_batch * dp_size) == 0 and fills num_micro. */
mega_status mega_batch_plan_init(mega_batch_plan *p, int global_batch, int micro_batch,
                                 int dp_size, mega_err *err);

/* The size of the file at path, for mega_jobspec_check before the data is
 * opened (so the user sees the job checker's message). */
mega_status mega_data_file_size(const char *path, long long *bytes, mega_err *err);

/* Maps path read-only. Fails (MEGA_ERR_IO) when it cannot be read and
 * (MEGA_ERR_INVALID) when it holds less than one window, seq_len + 1 bytes.
 * The caller owns *out and frees it with mega_data_close. */
mega_status mega_data_open(const char *path, int seq_len, mega_data **out, mega_err *err);
void mega_data_close(mega_data *d);

size_t mega_data_size(const mega_data *d);   /* n: bytes in the file */
int64_t mega_data_windows(const mega_data *d); /* K */
int mega_data_seq_len(const mega_data *d);   /* T */

/* The window of sample j of iteration i: (i*G + j) mod K. */
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

/* Evaluation batches count windows from the end of the file: sample j of
 * evaluation iteration e is window K-1 - ((e*G + j) mod K), dealt to DP
 * ranks and microbatches as training samples are. (A file used only for
 * training overlaps its evaluation windows; give evaluation its own text
 * by appending it to the end of the training file.) */
mega_status mega_data_eval_microbatch(const mega_data *d, const mega_batch_plan *p,
                                      int64_t eval_iteration, int dp_rank, int micro,
                                      int32_t *tokens, int32_t *targets, mega_err *err);

/* --variable-seq-lengths: microbatches of one iteration differ in length
 * while the data order stays the same. Global microbatch k of an iteration
 * (samples [k*b, (k+1)*b), whatever the data-parallel split) of iteration i
 * keeps the first T - ((i*G/b + k) mod 4) * floor(T/8) tokens of each of its
 * windows, so lengths cycle through T, 7T/8, 3T/4, 5T/8. first_sample is the
 * microbatch's first sample in the iteration (mega_batch_first_sample). */
int mega_data_variable_seq_len(int seq_len, const mega_batch_plan *p, int64_t iteration,
                               int first_sample);

#endif
