/* What megactl's cluster commands share: the server address, the channel
 * to megad, one-line errors, and a small flag reader.
 *
 * The server is, first to last: --server given to the command, --server
 * given before the command (main sets it with megactl_set_server),
 * $MEGA_SERVER, 127.0.0.1:7070; any of them may list several, separated
 * by commas, and a call moves to the next one that answers.
 *
 * Exit statuses: 0 success, 1 failure (megad unreachable or refusing, a job
 * that failed), 2 a bad command line (including a job megactl or megad
 * finds invalid). */
#ifndef MEGA_CLIENT_CONN_H
#define MEGA_CLIENT_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "core/status.h"
#include "proto/mega_rpc.h"
#include "proto/rpc_client.h"

#define MEGACTL_EXIT_FAIL 1
#define MEGACTL_EXIT_USAGE 2

#define MEGACTL_DEFAULT_SERVER "127.0.0.1:7070"
#define MEGACTL_TIMEOUT_MS 10000 /* one unary call */

/* The address from before the command; addr must outlive the process's
 * commands (argv does). NULL forgets it. */
void megactl_set_server(const char *addr);

/* The addresses a command talks to, given its own --server value (or
 * NULL): one, or several separated by commas ("h1:7070,h2:7070"), tried in
 * order as etcdctl tries its endpoints. */
const char *megactl_server(const char *flag_value);
/* How many; and the i-th (modulo their count), into buf. */
size_t megactl_server_count(const char *flag_value);
const char *megactl_server_at(const char *flag_value, size_t i, char *buf, size_t len);
/* Checks every address of the list for a port megad could listen on
 * (HOST:PORT with PORT 1..65535, or unix:/path): MEGA_ERR_INVALID naming
 * the address and where it came from (--server, $MEGA_SERVER) otherwise.
 * megactl_server_usage prints that and returns MEGACTL_EXIT_USAGE, or
 * returns 0 when every address is fine. megactl_parse_common calls it. */
mega_status megactl_check_server(const char *flag_value, mega_err *err);
int megactl_server_usage(const char *flag_value);
/* Whether err says the server did not answer at all (not reachable, or no
 * answer in time), so another server may be tried; an answer, even an
 * error, is not. */
bool megactl_unreachable(const mega_err *err);

/* --token-file, --tls-ca, --tls-cert, --tls-key, before or after the
 * command; like megactl_flag_value (1, 0 or -1). Without them megactl
 * reads $MEGA_TOKEN_FILE, $MEGA_TLS_CA, $MEGA_TLS_CERT and $MEGA_TLS_KEY. */
int megactl_security_flag(const char *cmd, int argc, char **argv, int *i);

/* Opens a channel to the megad at address (lazily: a dead address shows in
 * the first call) carrying the token and TLS settings. The caller frees
 * *out with mega_rpc_channel_free. megactl_connect opens the first server
 * of flag_value's list. */
mega_status megactl_connect_to(const char *address, mega_rpc_channel **out, mega_err *err);
mega_status megactl_connect(const char *flag_value, mega_rpc_channel **out, mega_err *err);

/* One unary call to the megad that flag_value (or the default) names, the
 * next server of the list when one does not answer: on MEGA_OK *resp is the
 * caller's to free with protobuf_c_message_free_unpacked. */
mega_status megactl_unary(const char *flag_value, const mega_rpc_method *m,
                          const ProtobufCMessage *req, unsigned timeout_ms,
                          ProtobufCMessage **resp, mega_err *err);

/* The build of the megad flag_value names (as its view of itself says),
 * into buf; false (buf "") when it does not answer. */
bool megactl_server_version(const char *flag_value, char *buf, size_t len);

/* Prints "megactl: MSG" on stderr; returns MEGACTL_EXIT_FAIL. */
int megactl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Whether everything written to stdout reached it (flushed now); if not (a
 * full disk, a closed file), says so with the reason (seen: the errno of
 * the failed write, where the caller kept it; 0 if not) and returns false:
 * a command whose output was lost fails, or a script takes a cut file for
 * the whole. */
bool megactl_output_ok(int seen);

/* Prints "megactl CMD: MSG; see 'megactl CMD --help'" on stderr; returns
 * MEGACTL_EXIT_USAGE. */
int megactl_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints the error of a call about job_id: "no job 'ID'" for NOT_FOUND,
 * err's sentence otherwise. Returns MEGACTL_EXIT_FAIL. */
int megactl_job_error(const char *job_id, const mega_err *err);

/* ---- flags ---- */

/* Reads the flag at argv[*i] when it is `name` ("--state"), as "--state V"
 * or "--state=V". Returns 1 and sets *value (and advances *i past it) when
 * it matched, 0 when argv[*i] is another word, -1 (with a usage line
 * printed for cmd) when the value is missing. */
int megactl_flag_value(const char *cmd, int argc, char **argv, int *i, const char *name,
                       const char **value);

/* The flags most commands share: --json (when has_json), --server, the
 * security flags, --help, and one positional JOB (when wants_job). */
typedef struct megactl_common {
  bool json, help;
  const char *server; /* NULL: not given */
  const char *job;    /* the positional JOB */
} megactl_common;

/* A command's own flags: like megactl_flag_value (1 matched, 0 another word,
 * -1 a usage error already printed). */
typedef int (*megactl_extra_fn)(const char *cmd, int argc, char **argv, int *i, void *ctx);

/* Reads argv[1..argc) into cf, offering each word first to extra (may be
 * NULL). Returns 0, or the exit status of a usage error (printed). On
 * --help it stops with cf->help set. */
int megactl_parse_common(const char *cmd, int argc, char **argv, bool wants_job, bool has_json,
                         megactl_common *cf, megactl_extra_fn extra, void *ctx);

/* Parses a positive integer (1..1000000). */
bool megactl_parse_count(const char *s, uint32_t *out);

/* True when a is "--help" or "-h". */
bool megactl_is_help(const char *a);

/* True when a looks like a flag (starts with '-' and is not "-"). */
bool megactl_is_flag(const char *a);

/* ---- output ---- */

/* Prints j (consumed) and a newline on stdout; returns the exit status.
 * j NULL means memory ran out. */
int megactl_print_json(json_t *j, size_t flags);

int64_t megactl_now_ms(void); /* Unix ms */

/* ---- terminal ---- */

/* The width of f's terminal ($COLUMNS, else the tty's, else 80). */
int megactl_term_width(FILE *f);

/* Whether to color f: a tty, NO_COLOR unset, TERM not "dumb". */
bool megactl_use_color(FILE *f);

/* Whether the locale's character set is UTF-8 (for block characters). */
bool megactl_utf8(void);

#endif
