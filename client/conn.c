#include "client/conn.h"
#include "client/view.h"
#include "core/port.h"

#include <errno.h>
#include <langinfo.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/time.h>
#include <unistd.h>

/* What megad's "cannot reach" gets (once, after every server's reason). */
#define UNREACHABLE_HINT                                                                      \
  "is megad running there? Point megactl at another with --server HOST:PORT or "            \
  "MEGA_SERVER=HOST:PORT, or start one: megad serve --listen 127.0.0.1:7070 --state-dir DIR " \
  "--slots N"

/* Set once by main from the words before the command. */
static const char *global_server;
/* --token-file, --tls-ca, --tls-cert, --tls-key (before or after the command) */
static const char *sec_files[4];
static const char *const sec_flags[4] = {"--token-file", "--tls-ca", "--tls-cert", "--tls-key"};
static const char *const sec_envs[4] = {"MEGA_TOKEN_FILE", "MEGA_TLS_CA", "MEGA_TLS_CERT",
                                        "MEGA_TLS_KEY"};

int megactl_security_flag(const char *cmd, int argc, char **argv, int *i) {
  for (int k = 0; k < 4; k++) {
    int r = megactl_flag_value(cmd, argc, argv, i, sec_flags[k], &sec_files[k]);
    if (r) return r;
  }
  return 0;
}

void megactl_set_server(const char *addr) { global_server = addr; }

const char *megactl_server(const char *flag_value) {
  if (flag_value && flag_value[0]) return flag_value;
  if (global_server && global_server[0]) return global_server;
  const char *env = getenv("MEGA_SERVER");
  if (env && env[0]) return env;
  return MEGACTL_DEFAULT_SERVER;
}

size_t megactl_server_count(const char *flag_value) {
  size_t n = 1;
  for (const char *p = megactl_server(flag_value); *p; p++) n += *p == ',';
  return n;
}

const char *megactl_server_at(const char *flag_value, size_t i, char *buf, size_t len) {
  const char *p = megactl_server(flag_value);
  size_t n = megactl_server_count(flag_value);
  for (size_t k = 0; k < i % n; k++) p = strchr(p, ',') + 1;
  size_t w = strcspn(p, ",");
  snprintf(buf, len, "%.*s", (int)w, p);
  return buf;
}

/* Where megactl_server(flag_value) came from, for messages. */
static const char *server_source(const char *flag_value) {
  if ((flag_value && flag_value[0]) || (global_server && global_server[0])) return "--server";
  const char *env = getenv("MEGA_SERVER");
  return env && env[0] ? "$MEGA_SERVER" : "the default server";
}

/* Whether address names a port megad could listen on: unix:PATH, or
 * anything ending in :PORT, PORT in digits from 1 to 65535 (gRPC would
 * wrap 99999 round to another port, and take 'abc' for a name it cannot
 * resolve). *why says what is wrong otherwise. */
static bool port_ok(const char *address, char *why, size_t len) {
  if (!strncmp(address, "unix:", 5) || !strncmp(address, "unix-abstract:", 14)) return true;
  const char *colon = strrchr(address, ':');
  size_t n = strlen(address);
  if (!colon || (n && address[n - 1] == ']')) {
    snprintf(why, len, "no port: give HOST:PORT or unix:/path");
    return false;
  }
  const char *p = colon + 1;
  unsigned port;
  if (!mega_port_parse(p, strlen(p), &port) || port < 1) {
    snprintf(why, len, "'%.32s' is not a port (a number from 1 to 65535)", p);
    return false;
  }
  return true;
}

mega_status megactl_check_server(const char *flag_value, mega_err *err) {
  size_t n = megactl_server_count(flag_value);
  for (size_t i = 0; i < n; i++) {
    char addr[512], why[128];
    megactl_server_at(flag_value, i, addr, sizeof addr);
    if (addr[0] && !port_ok(addr, why, sizeof why)) /* an empty one: megactl_connect_to says */
      return mega_fail(err, MEGA_ERR_INVALID, "%s %s: %s", server_source(flag_value), addr, why);
  }
  return MEGA_OK;
}

bool megactl_unreachable(const mega_err *err) {
  return (err->status == MEGA_ERR_IO && !strncmp(err->msg, "cannot reach ", 13)) ||
         (err->status == MEGA_ERR_TIMEOUT && strstr(err->msg, " did not answer "));
}

mega_status megactl_connect_to(const char *address, mega_rpc_channel **out, mega_err *err) {
  *out = NULL;
  if (!address[0])
    return mega_fail(err, MEGA_ERR_INVALID, "an empty megad address in --server or $MEGA_SERVER");
  char why[128];
  if (!port_ok(address, why, sizeof why))
    return mega_fail(err, MEGA_ERR_INVALID, "megad address %s: %s", address, why);
  char *pem[4] = {NULL}; /* the token, then the PEMs */
  char what[4][300];       /* how each was given, for messages */
  mega_status st = MEGA_OK;
  for (int k = 0; k < 4 && st == MEGA_OK; k++) {
    const char *path = sec_files[k] ? sec_files[k] : getenv(sec_envs[k]);
    if (!path || !path[0]) continue;
    char flag[32];
    snprintf(flag, sizeof flag, sec_files[k] ? "%s" : "$%s",
             sec_files[k] ? sec_flags[k] : sec_envs[k]);
    snprintf(what[k], sizeof what[k], sec_files[k] ? "%s %s" : "%s (%s)", flag, path);
    st = k == 0 ? mega_rpc_read_token(flag, path, false, &pem[k], err)
                : mega_rpc_read_pem(flag, path, false, &pem[k], err);
  }
  if (st == MEGA_OK && !pem[2] != !pem[3])
    st = mega_fail(err, MEGA_ERR_INVALID, "--tls-cert and --tls-key go together");
  if (st == MEGA_OK && pem[2] && !pem[1])
    st = mega_fail(err, MEGA_ERR_INVALID, "--tls-cert needs --tls-ca (the CA of megad's "
                   "certificate)");
  /* this client's certificate: a pair, valid now (megad checks the CA) */
  if (st == MEGA_OK && pem[2])
    st = mega_rpc_check_tls(what[2], pem[2], what[3], pem[3], NULL, NULL, NULL, err);
  mega_rpc_auth auth = {.token = pem[0], .tls_ca = pem[1], .tls_cert = pem[2], .tls_key = pem[3]};
  mega_rpc_channel_opts opts = {.peer_name = "megad", .auth = &auth,
                                .auth_hint = "pass --token-file or set MEGA_TOKEN_FILE",
                                .unreachable_hint = UNREACHABLE_HINT};
  if (st == MEGA_OK) st = mega_rpc_channel_new(address, &opts, out, err);
  for (int k = 0; k < 4; k++) {
    if (pem[k]) memset(pem[k], 0, strlen(pem[k]));
    free(pem[k]);
  }
  return st;
}

mega_status megactl_connect(const char *flag_value, mega_rpc_channel **out, mega_err *err) {
  char addr[512];
  return megactl_connect_to(megactl_server_at(flag_value, 0, addr, sizeof addr), out, err);
}

/* Each server's failure (less the hint, said once at the end), for the
 * sentence when none answered. */
static void add_failure(char *all, size_t len, const mega_err *e, size_t i) {
  size_t used = strlen(all), n = strlen(e->msg);
  const char *hint = strstr(e->msg, "; " UNREACHABLE_HINT);
  if (hint) n = (size_t)(hint - e->msg);
  const char *sep = i ? "; " : "";
  for (const char *p = sep; *p && used + 1 < len; p++) all[used++] = *p;
  for (size_t k = 0; k < n && used + 1 < len; k++) all[used++] = e->msg[k];
  all[used] = '\0'; /* cut when too long: the first servers' reasons matter most */
}

mega_status megactl_unary(const char *flag_value, const mega_rpc_method *m,
                          const ProtobufCMessage *req, unsigned timeout_ms,
                          ProtobufCMessage **resp, mega_err *err) {
  *resp = NULL;
  size_t n = megactl_server_count(flag_value);
  char all[MEGA_ERR_MSG_MAX] = "";
  mega_status st = MEGA_OK;
  for (size_t i = 0; i < n; i++) {
    char addr[512];
    mega_rpc_channel *ch = NULL;
    st = megactl_connect_to(megactl_server_at(flag_value, i, addr, sizeof addr), &ch, err);
    if (st == MEGA_OK) st = mega_rpc_unary(ch, m, req, timeout_ms, resp, err);
    mega_rpc_channel_free(ch);
    /* as etcdctl does: the next server only when this one did not answer */
    if (st == MEGA_OK || !megactl_unreachable(err)) return st;
    add_failure(all, sizeof all, err, i);
  }
  if (n > 1) mega_fail(err, st, "no megad answered: %s; %s", all, UNREACHABLE_HINT);
  return st;
}

bool megactl_server_version(const char *flag_value, char *buf, size_t len) {
  buf[0] = '\0';
  Mega__V1__ListNodesRequest req = MEGA__V1__LIST_NODES_REQUEST__INIT;
  ProtobufCMessage *out = NULL;
  mega_err err = {0};
  if (megactl_unary(flag_value, &mega_control_list_nodes, &req.base, MEGACTL_TIMEOUT_MS, &out,
                    &err) != MEGA_OK)
    return false;
  const Mega__V1__ListNodesResponse *r = (const void *)out;
  bool found = false;
  for (size_t i = 0; i < r->n_nodes && !found; i++)
    if ((found = !strcmp(r->nodes[i]->id, r->self_node_id)))
      snprintf(buf, len, "%s", r->nodes[i]->version);
  protobuf_c_message_free_unpacked(out, NULL);
  return found;
}

int megactl_fail(const char *fmt, ...) {
  char msg[2048], esc[4096]; /* megad's words may hold anything: escape them */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "megactl: %s\n", view_escape(msg, esc, sizeof esc));
  return MEGACTL_EXIT_FAIL;
}

bool megactl_output_ok(int seen) {
  errno = 0;
  bool flushed = fflush(stdout) == 0;
  int e = flushed ? seen : errno;
  if (flushed && !ferror(stdout)) return true;
  megactl_fail("cannot write its output (stdout): %s",
               e ? strerror(e) : "a write failed (a full disk, or a file that was closed)");
  return false;
}

int megactl_usage(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const char *sp = cmd[0] ? " " : ""; /* "": a flag before the command */
  fprintf(stderr, "megactl%s%s: ", sp, cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "; see 'megactl%s%s --help'\n", sp, cmd);
  va_end(ap);
  return MEGACTL_EXIT_USAGE;
}

int megactl_server_usage(const char *flag_value) {
  mega_err err = {0};
  if (megactl_check_server(flag_value, &err) == MEGA_OK) return 0;
  fprintf(stderr, "megactl: %s\n", err.msg);
  return MEGACTL_EXIT_USAGE;
}

int megactl_job_error(const char *job_id, const mega_err *err) {
  if (err->status == MEGA_ERR_NOT_FOUND) return megactl_fail("no job '%s'", job_id);
  return megactl_fail("%s", err->msg);
}

int megactl_flag_value(const char *cmd, int argc, char **argv, int *i, const char *name,
                       const char **value) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0) return 0;
  if (a[n] == '=') {
    *value = a + n + 1;
    (*i)++;
    return 1;
  }
  if (a[n] != '\0') return 0;
  if (*i + 1 >= argc) {
    megactl_usage(cmd, "%s needs a value", name);
    return -1;
  }
  *value = argv[*i + 1];
  *i += 2;
  return 1;
}

int megactl_parse_common(const char *cmd, int argc, char **argv, bool wants_job, bool has_json,
                         megactl_common *cf, megactl_extra_fn extra, void *ctx) {
  memset(cf, 0, sizeof *cf);
  for (int i = 1; i < argc;) {
    const char *a = argv[i];
    int r;
    if (megactl_is_help(a)) {
      cf->help = true;
      return 0;
    }
    if (has_json && !strcmp(a, "--json")) {
      cf->json = true;
      i++;
      continue;
    }
    if ((r = megactl_flag_value(cmd, argc, argv, &i, "--server", &cf->server)) ||
        (r = megactl_security_flag(cmd, argc, argv, &i)) ||
        (extra && (r = extra(cmd, argc, argv, &i, ctx)))) {
      if (r < 0) return MEGACTL_EXIT_USAGE;
      continue;
    }
    if (megactl_is_flag(a)) return megactl_usage(cmd, "unknown flag '%s'", a);
    if (!wants_job || cf->job) return megactl_usage(cmd, "unexpected word '%s'", a);
    cf->job = a;
    i++;
  }
  if (wants_job && !cf->job) return megactl_usage(cmd, "which job? give its id, e.g. j-1");
  return megactl_server_usage(cf->server);
}

bool megactl_parse_count(const char *s, uint32_t *out) {
  char *end;
  if (!s[0] || s[0] == '-' || s[0] == '+') return false;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (*end || errno || v < 1 || v > 1000000) return false;
  *out = (uint32_t)v;
  return true;
}

int megactl_print_json(json_t *j, size_t flags) {
  if (!j) return megactl_fail("out of memory building JSON");
  int rc = json_dumpf(j, stdout, flags) == 0 ? 0 : megactl_fail("cannot write JSON to stdout");
  json_decref(j);
  if (rc == 0) fputc('\n', stdout);
  return rc;
}

int64_t megactl_now_ms(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

bool megactl_is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

bool megactl_is_flag(const char *a) { return a[0] == '-' && a[1] != '\0'; }

int megactl_term_width(FILE *f) {
  const char *cols = getenv("COLUMNS");
  if (cols && atoi(cols) > 0) return atoi(cols);
  struct winsize ws;
  if (isatty(fileno(f)) && ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return ws.ws_col;
  return 80;
}

bool megactl_use_color(FILE *f) {
  const char *term = getenv("TERM");
  return isatty(fileno(f)) && !getenv("NO_COLOR") && term && strcmp(term, "dumb") != 0;
}

bool megactl_utf8(void) {
  if (!setlocale(LC_CTYPE, "")) return false;
  const char *cs = nl_langinfo(CODESET);
  return cs && (!strcasecmp(cs, "UTF-8") || !strcasecmp(cs, "utf8"));
}
