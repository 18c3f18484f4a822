/* daemon/journal: megad's journal as found on disk after anything, replayed
 * into a jobs table the way megad does at start (each record through
 * mega_jobs_apply). Damage and torn tails are cut or skipped, never a
 * crash; a second replay of what the first left replays cleanly. */
#include "daemon/model/job.h"
#include "daemon/model/journal.h"
#include "fuzz.h"

static int apply(void *ctx, const uint8_t *rec, size_t len) {
  mega_err err = {0};
  if (mega_jobs_apply(ctx, rec, len, &err) != MEGA_OK) FUZZ_CHECK(err.msg[0]);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_clean();
  const char *path = fuzz_file("journal", data, size);
  char p[512];
  snprintf(p, sizeof p, "%s", path);
  mega_jobs t;
  mega_jobs_init(&t);
  mega_journal *j = NULL;
  mega_err err = {0};
  mega_journal_report rep = {0};
  FUZZ_CHECK(mega_journal_open(p, &j, &err) == MEGA_OK);
  FUZZ_CHECK(mega_journal_replay(j, apply, &t, &rep, &err) == MEGA_OK);
  mega_journal_close(j);
  /* whatever was cut or skipped, the file as found was kept */
  FUZZ_CHECK(!(rep.torn_bytes || rep.damaged_bytes) || rep.copy[0]);
  FUZZ_CHECK(!rep.damaged_regions == !rep.damaged_bytes);
  size_t replayed = rep.records;
  /* what the replay kept is a clean journal with the same records */
  mega_journal_report again = {0};
  mega_jobs t2;
  mega_jobs_init(&t2);
  FUZZ_CHECK(mega_journal_open(p, &j, &err) == MEGA_OK);
  FUZZ_CHECK(mega_journal_replay(j, apply, &t2, &again, &err) == MEGA_OK);
  FUZZ_CHECK(again.records == replayed && !again.torn_bytes && !again.damaged_bytes);
  FUZZ_CHECK(t2.n == t.n);
  mega_journal_close(j);
  mega_jobs_free(&t2);
  mega_jobs_free(&t);
  return 0;
}
