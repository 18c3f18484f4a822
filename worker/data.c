#include "worker/data.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct mega_data {
  const uint8_t *bytes; /* mapped, read-only */
  size_t n;
  int seq_len;
  int64_t windows;
};

mega_status mega_batch_plan_init(mega_batch_plan *p, int global_batch, int micro_batch,
                                 int dp_size, mega_err *err) {
  if (global_batch < 1 || micro_batch < 1 || dp_size < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--global-batch-size, --micro-batch-size and the data-parallel size must be "
                     ">= 1 (got %d, %d, %d)", global_batch, micro_batch, dp_size);
  if (global_batch % (micro_batch * dp_size) != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--global-batch-size (%d) must be a multiple of --micro-batch-size (%d) "
                     "times the data-parallel size (%d)", global_batch, micro_batch, dp_size);
  p->global_batch = global_batch;
  p->micro_batch = micro_batch;
  p->dp_size = dp_size;
  p->num_micro = global_batch / (micro_batch * dp_size);
  return MEGA_OK;
}

mega_status mega_data_file_size(const char *path, long long *bytes, mega_err *err) {
  struct stat st;
  if (stat(path, &st) != 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot read --data-path '%s': %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return mega_fail(err, MEGA_ERR_IO, "--data-path '%s' is not a regular file", path);
  *bytes = (long long)st.st_size;
  return MEGA_OK;
}

mega_status mega_data_open(const char *path, int seq_len, mega_data **out, mega_err *err) {
  *out = NULL;
  if (seq_len < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "--seq-length must be >= 1 (got %d)", seq_len);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return mega_fail(err, MEGA_ERR_IO, "cannot open --data-path '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return mega_fail(err, MEGA_ERR_IO, "--data-path '%s' is not a regular file", path);
  }
  size_t n = (size_t)st.st_size;
  if (n < (size_t)seq_len + 1) {
    close(fd);
    return mega_fail(err, MEGA_ERR_INVALID,
                     "--data-path '%s' holds %zu bytes, fewer than one window of --seq-length %d "
                     "plus 1 target byte (%d); use a larger file or a shorter --seq-length",
                     path, n, seq_len, seq_len + 1);
  }
  void *map = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
  int saved = errno;
  close(fd);
  if (map == MAP_FAILED)
    return mega_fail(err, MEGA_ERR_IO, "cannot map --data-path '%s': %s", path, strerror(saved));
  mega_data *d = calloc(1, sizeof *d);
  if (!d) {
    munmap(map, n);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory opening the data");
  }
  d->bytes = map;
  d->n = n;
  d->seq_len = seq_len;
  d->windows = (int64_t)((n - 1) / (size_t)seq_len);
  *out = d;
  return MEGA_OK;
}

void mega_data_close(mega_data *d) {
  if (!d) return;
  munmap((void *)d->bytes, d->n);
  free(d);
}

size_t mega_data_size(const mega_data *d) { return d->n; }
int64_t mega_data_windows(const mega_data *d) { return d->windows; }
int mega_data_seq_len(const mega_data *d) { return d->seq_len; }

int64_t mega_data_sample_window(const mega_data *d, int64_t iteration, int global_batch,
                                int sample) {
  /* (i*G + j) mod K without overflow for any realistic i: reduce each term. */
  int64_t K = d->windows;
  int64_t a = (iteration % K) * ((int64_t)global_batch % K) % K;
  return (a + sample % K) % K;
}

int mega_batch_first_sample(const mega_batch_plan *p, int dp_rank, int micro) {
  return dp_rank * (p->global_batch / p->dp_size) + micro * p->micro_batch;
}

/* Copies microbatch `micro` of DP rank dp_rank, with window(sample) giving
 * each sample's window. */
static mega_status copy_microbatch(const mega_data *d, const mega_batch_plan *p, int64_t iteration,
                                   int dp_rank, int micro, bool eval, int32_t *tokens,
                                   int32_t *targets, mega_err *err) {
  if (iteration < 0 || dp_rank < 0 || dp_rank >= p->dp_size || micro < 0 ||
      micro >= p->num_micro)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "no microbatch %d of DP rank %d in %siteration %lld (%d microbatches, DP %d)",
                     micro, dp_rank, eval ? "evaluation " : "", (long long)iteration,
                     p->num_micro, p->dp_size);
  int T = d->seq_len;
  int first = mega_batch_first_sample(p, dp_rank, micro);
  for (int b = 0; b < p->micro_batch; b++) {
    int64_t k = mega_data_sample_window(d, iteration, p->global_batch, first + b);
    if (eval) k = d->windows - 1 - k;
    const uint8_t *src = d->bytes + (size_t)k * (size_t)T;
    for (int t = 0; t < T; t++) {
      tokens[(size_t)b * T + t] = src[t];
      targets[(size_t)b * T + t] = src[t + 1];
    }
  }
  return MEGA_OK;
}

mega_status mega_data_microbatch(const mega_data *d, const mega_batch_plan *p, int64_t iteration,
                                 int dp_rank, int micro, int32_t *tokens, int32_t *targets,
                                 mega_err *err) {
  return copy_microbatch(d, p, iteration, dp_rank, micro, false, tokens, targets, err);
}

mega_status mega_data_eval_microbatch(const mega_data *d, const mega_batch_plan *p,
                                      int64_t eval_iteration, int dp_rank, int micro,
                                      int32_t *tokens, int32_t *targets, mega_err *err) {
  return copy_microbatch(d, p, eval_iteration, dp_rank, micro, true, tokens, targets, err);
}

int mega_data_variable_seq_len(int seq_len, const mega_batch_plan *p, int64_t iteration,
                               int first_sample) {
  int64_t per_iter = p->global_batch / p->micro_batch;
  int64_t k = iteration * per_iter + first_sample / p->micro_batch;
  return seq_len - (int)(k % 4) * (seq_len / 8);
}
