/* core/jobspec: job flags as megactl, megad and megaw get them. The input
 * is argv words separated by NUL bytes, after one byte that picks the
 * world size (0: unknown). What parses is checked; a spec turned back into
 * argv must parse to the same spec. */
#include "core/jobspec.h"
#include "core/schedule.h"
#include "fuzz.h"

#define MAX_WORDS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int world = data[0] % 65;
  char *buf = malloc(size);
  memcpy(buf, data + 1, size - 1);
  buf[size - 1] = '\0';
  char *argv[MAX_WORDS + 1];
  int argc = 0;
  for (size_t i = 0; i < size - 1 && argc < MAX_WORDS;) {
    argv[argc++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  argv[argc] = NULL;
  mega_jobspec s;
  mega_jobspec_defaults(&s);
  mega_err err = {0};
  if (mega_jobspec_parse(&s, argc, argv, &err) != MEGA_OK) {
    FUZZ_CHECK(err.msg[0]);
    mega_jobspec_free(&s);
    free(buf);
    return 0;
  }
  if (mega_jobspec_check_all(&s, world, -1, &err) == MEGA_OK) {
    /* what a checked spec promises: the derived values a program uses */
    mega_layout l;
    FUZZ_CHECK(mega_jobspec_layout(&s, &l, &err) == MEGA_OK);
    mega_layout_free(&l);
    FUZZ_CHECK(mega_jobspec_vp(&s) >= 1);
    FUZZ_CHECK(mega_jobspec_padded_vocab(&s) > 0);
    if (world > 0) {
      FUZZ_CHECK(mega_jobspec_dp(&s, world) >= 1);
      FUZZ_CHECK(mega_jobspec_num_microbatches(&s, world) >= 1);
      mega_sched_params p;
      mega_jobspec_sched_params(&s, world, &p);
      FUZZ_CHECK(mega_sched_check_params(&p, &err) == MEGA_OK);
    }
  } else {
    FUZZ_CHECK(!strncmp(err.msg, "invalid job: ", 13));
  }
  int n = 0;
  char **words = mega_jobspec_to_argv(&s, &n);
  FUZZ_CHECK(words);
  mega_jobspec back;
  mega_jobspec_defaults(&back);
  FUZZ_CHECK(mega_jobspec_parse(&back, n, words, &err) == MEGA_OK);
  FUZZ_CHECK(mega_jobspec_equal(&s, &back));
  /* and through JSON */
  json_t *j = mega_jobspec_to_json(&s);
  FUZZ_CHECK(j);
  mega_jobspec fromj;
  mega_jobspec_defaults(&fromj);
  FUZZ_CHECK(mega_jobspec_from_json(&fromj, j, &err) == MEGA_OK);
  FUZZ_CHECK(mega_jobspec_equal(&s, &fromj));
  json_decref(j);
  mega_jobspec_free(&fromj);
  mega_jobspec_free(&back);
  mega_jobspec_argv_free(words);
  mega_jobspec_free(&s);
  free(buf);
  return 0;
}
