/* Small helpers shared by megad's files. */
#ifndef MEGA_DAEMON_UTIL_H
#define MEGA_DAEMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

/* A deep copy of m (pack, then unpack), the caller's to free with
 * protobuf_c_message_free_unpacked; NULL when out of memory. */
ProtobufCMessage *megad_pb_copy(const ProtobufCMessage *m);

/* Packs m into a new buffer (*buf, the caller frees); false when out of memory. */
bool megad_pb_pack(const ProtobufCMessage *m, uint8_t **buf, size_t *len);

int64_t megad_unix_ms(void);
int64_t megad_unix_us(void);

/* A new incarnation of this megad: later starts (and re-registrations)
 * get larger numbers, so "an older incarnation" means what it says; the
 * start's millisecond in the high bits, the pid's low 20 bits below. */
uint64_t megad_new_incarnation(void);

/* strdup that treats NULL as "". */
char *megad_strdup(const char *s);

/* A signal's name for messages: "Killed", "Segmentation fault", ... */
const char *megad_signal_name(int sig);

/* What a worker's death by sig most likely means, for a user who did not
 * send it (megad's own stops are reported as theirs, never by signal), and
 * where to look; NULL for a signal with nothing more to say. Static text. */
const char *megad_signal_hint(int sig);

/* Whether this node sees every dataset of the job (--data-path, or
 * --train-data-path and --valid-data-path): a file, or an indexed dataset
 * PREFIX.bin and PREFIX.idx (as worker/data reads them). When not, *flag
 * names the flag, *bad the first missing path (the spec's string) and *why
 * what is wrong ("No such file or directory", "it is not a file"). */
struct mega_jobspec;
bool megad_data_visible(const struct mega_jobspec *s, const char **flag, const char **bad,
                        const char **why);

#endif
