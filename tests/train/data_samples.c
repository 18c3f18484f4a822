/* data_samples: prints the token ids of a job's samples as mega_data deals
 * them out, for tests that check the data order from outside (the
 * megatron_order_check.py restatement of Megatron's GPTDataset):
 *
 *   data_samples [job flags]
 *
 * One line per training sample, "train S t0 t1 ... tT" (S the sample
 * number, i*G + j; tokens the sample's T inputs and then its last target),
 * for every sample of --train-iters (a constant --global-batch-size), then
 * "eval S ..." for every evaluation sample the job reads, then "test S ..."
 * for every test sample (the evaluation after training, --split's third
 * share). The job is checked as megaw checks it, world size 1. With
 * --data-cache-path, a line on stderr says how many order indices were read
 * from the cache and how many built. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/jobspec.h"
#include "worker/data/data.h"

static int print_batch(const mega_data *d, const mega_batch_plan *p, int64_t it,
                       mega_data_which which, int T, int32_t *tok, int32_t *tgt) {
  mega_err err = {0};
  static const char *names[] = {"train", "eval", "test"};
  for (int j = 0; j < p->global_batch; j++) {
    mega_status st = which == MEGA_DATA_TEST ? mega_data_test_microbatch(d, p, it, 0, j, tok, tgt, &err)
                     : which == MEGA_DATA_VALID ? mega_data_eval_microbatch(d, p, it, 0, j, tok, tgt, &err)
                                           : mega_data_microbatch(d, p, it, 0, j, tok, tgt, &err);
    if (st != MEGA_OK) {
      fprintf(stderr, "data_samples: %s\n", err.msg);
      return 1;
    }
    printf("%s %lld", names[which], (long long)(it * p->global_batch + j));
    for (int t = 0; t < T; t++) printf(" %d", tok[t]);
    printf(" %d\n", tgt[T - 1]);
  }
  return 0;
}

int main(int argc, char **argv) {
  mega_jobspec job;
  mega_jobspec_defaults(&job);
  mega_err err = {0};
  long long bytes = -1;
  if (mega_jobspec_parse(&job, argc - 1, argv + 1, &err) != MEGA_OK ||
      mega_data_probe(&job, &bytes, &err) != MEGA_OK ||
      mega_jobspec_check_all(&job, 1, bytes, &err) != MEGA_OK) {
    fprintf(stderr, "data_samples: %s\n", err.msg);
    mega_jobspec_free(&job);
    return 2;
  }
  int64_t rampup[3];
  if (mega_jobspec_rampup(&job, rampup)) {
    fprintf(stderr, "data_samples: --rampup-batch-size is not printed here\n");
    mega_jobspec_free(&job);
    return 2;
  }
  mega_data *d = NULL;
  if (mega_data_open_job(&job, &d, &err) != MEGA_OK) {
    fprintf(stderr, "data_samples: %s\n", err.msg);
    mega_jobspec_free(&job);
    return 1;
  }
  char note[1200];
  if (mega_data_cache_note(d, note, sizeof note)) fprintf(stderr, "data_samples: %s\n", note);
  int T = job.seq_length, G = job.global_batch_size;
  mega_batch_plan p;
  mega_batch_plan_init(&p, G, 1, 1, &err);
  int32_t *tok = malloc((size_t)T * sizeof *tok), *tgt = malloc((size_t)T * sizeof *tgt);
  int rc = tok && tgt ? 0 : 1;
  int64_t iters = mega_jobspec_train_iters(&job);
  for (int64_t it = 0; it < iters && rc == 0; it++)
    rc = print_batch(d, &p, it, MEGA_DATA_TRAIN, T, tok, tgt);
  int64_t batches = mega_jobspec_eval_batches(&job);
  for (int64_t e = 0; e < batches && rc == 0; e++)
    rc = print_batch(d, &p, e, MEGA_DATA_VALID, T, tok, tgt);
  for (int64_t e = 0; mega_data_has_test(d) && e < job.eval_iters && rc == 0; e++)
    rc = print_batch(d, &p, e, MEGA_DATA_TEST, T, tok, tgt);
  free(tok);
  free(tgt);
  mega_data_close(d);
  mega_jobspec_free(&job);
  return rc;
}
