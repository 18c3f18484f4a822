/* An append-only journal of opaque records, the daemon's memory across
 * restarts. Each record is framed as
 *
 *   u32 length (little endian) | u32 crc32 of the payload | payload
 *
 * and made durable with fdatasync before append returns, so a job is
 * journaled before megad answers its submitter.
 *
 * An append that fails (a full disk, ulimit -f) is cut back to where it
 * began, so the file holds whole records only, and later appends follow
 * them. A crash can only tear the last record: a record cut short (its header
 * cut, or a length that runs past the end of the file) with nothing valid
 * after it is a torn tail, and replay cuts the file there, so the next
 * append starts clean. Anything else that is not a valid record is damage (a
 * flipped bit, a bad disk, a zeroed block), wherever it is, even at the end:
 * replay skips only the damaged bytes, replays every good record, and
 * rewrites the journal from the good records. An empty record is never
 * valid (nothing writes one; zeros would read as a run of them). Whatever is
 * cut or skipped, the file as found is kept (PATH.damaged-UNIXTIME, a new
 * name each time), and the report says what happened, for the caller to
 * say loudly.
 *
 * The journal owns its file descriptor; records passed to the replay
 * callback are valid only during the call. */
#ifndef MEGA_DAEMON_JOURNAL_H
#define MEGA_DAEMON_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define MEGA_JOURNAL_MAX_RECORD (64u << 20)

typedef struct mega_journal mega_journal;

/* Returns non-zero to stop the replay early (an error in the caller). */
typedef int (*mega_journal_fn)(void *ctx, const uint8_t *rec, size_t len);

/* Opens (creating if needed) the journal at path. */
mega_status mega_journal_open(const char *path, mega_journal **out, mega_err *err);

typedef struct mega_journal_report {
  size_t records;         /* replayed */
  size_t torn_bytes;      /* cut from a torn tail */
  size_t damaged_bytes;   /* skipped: not records, and not a torn tail */
  size_t damaged_regions;
  size_t first_damage;    /* the first damaged region's offset (when there is one) */
  char copy[4096];        /* the file as found, kept when anything was cut or skipped ("" else) */
} mega_journal_report;

/* Calls fn for every intact record, in order; rep (may be NULL) says what
 * was cut or skipped. Call once, before the first append. */
mega_status mega_journal_replay(mega_journal *j, mega_journal_fn fn, void *ctx,
                                mega_journal_report *rep, mega_err *err);

/* len must be 1 to MEGA_JOURNAL_MAX_RECORD (MEGA_ERR_INVALID otherwise).
 * On MEGA_ERR_IO nothing of the record is left in the file. */
mega_status mega_journal_append(mega_journal *j, const void *rec, size_t len, mega_err *err);
/* n records, made durable together by one fdatasync (a batch costs one
 * disk flush, not n); all of them or, on an error, none. */
mega_status mega_journal_append_many(mega_journal *j, const void *const *recs, const size_t *lens,
                                     size_t n, mega_err *err);

/* Replaces the whole journal with the given records, atomically (temp file,
 * fsync, rename), to keep it from growing without bound. On an error before
 * the rename the old journal stays in use; after it (its directory not
 * synced) the new one is in use, and the error says so. */
mega_status mega_journal_rewrite(mega_journal *j, const void *const *recs, const size_t *lens,
                                 size_t n, mega_err *err);

void mega_journal_close(mega_journal *j);

#endif
