/* megactl etcd-dump: a cluster's tree in etcd, readably. The values are
 * protobuf (README "No single point of failure"): nodes are mega.v1.Node,
 * a job's record, events and last step are megad's JournalRecords (the
 * journal's own format, daemon/model/megad.proto), a coordinator key is a
 * node id. One Range of the prefix, straight from etcd (no megad needed),
 * with the same TLS and authentication flags as megad serve. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/commands.h"
#include "client/conn.h"
#include "daemon/model/megad.pb-c.h"
#include "proto/etcd_rpc.h"
#include "proto/pb_json.h"
#include "proto/rpc_client.h"

typedef struct dump_opts {
  const char *endpoints, *prefix, *cacert, *cert, *key, *user, *password_file;
  bool json, keys_only;
} dump_opts;

static int dump_flag(const char *cmd, int argc, char **argv, int *i, void *ctx) {
  dump_opts *o = ctx;
  static const struct {
    const char *name;
    size_t off;
  } flags[] = {
      {"--etcd-endpoints", offsetof(dump_opts, endpoints)},
      {"--etcd-prefix", offsetof(dump_opts, prefix)},
      {"--etcd-cacert", offsetof(dump_opts, cacert)},
      {"--etcd-cert", offsetof(dump_opts, cert)},
      {"--etcd-key", offsetof(dump_opts, key)},
      {"--etcd-user", offsetof(dump_opts, user)},
      {"--etcd-password-file", offsetof(dump_opts, password_file)},
  };
  if (!strcmp(argv[*i], "--keys-only")) {
    o->keys_only = true;
    (*i)++;
    return 1;
  }
  for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) {
    int r = megactl_flag_value(cmd, argc, argv, i, flags[k].name,
                               (const char **)((char *)o + flags[k].off));
    if (r) return r;
  }
  return 0;
}

/* "http://h:p" -> "h:p" (the first endpoint only: etcd answers for all). */
static void first_endpoint(const char *eps, char *out, size_t len) {
  const char *s = strstr(eps, "://") ? strstr(eps, "://") + 3 : eps;
  size_t n = strcspn(s, ",/");
  snprintf(out, len, "%.*s", (int)n, s);
}

/* A token from Auth.Authenticate; NULL (with err) if refused. */
static char *authenticate(const char *ep, const mega_rpc_auth *tls, const dump_opts *o,
                          mega_err *err) {
  char *pw = NULL;
  if (mega_rpc_read_password("--etcd-password-file", o->password_file, &pw, err) != MEGA_OK)
    return NULL;
  mega_rpc_channel_opts co = {.peer_name = "etcd", .auth = tls};
  mega_rpc_channel *ch = NULL;
  Etcdserverpb__AuthenticateRequest r = ETCDSERVERPB__AUTHENTICATE_REQUEST__INIT;
  r.name = (char *)o->user;
  r.password = pw;
  ProtobufCMessage *resp = NULL;
  char *token = NULL;
  if (mega_rpc_channel_new(ep, &co, &ch, err) == MEGA_OK &&
      mega_rpc_unary(ch, &etcd_auth_authenticate, &r.base, 5000, &resp, err) == MEGA_OK) {
    token = strdup(((Etcdserverpb__AuthenticateResponse *)resp)->token);
    protobuf_c_message_free_unpacked(resp, NULL);
  }
  mega_rpc_channel_free(ch);
  memset(pw, 0, strlen(pw));
  free(pw);
  return token;
}

/* The value of key (under prefix) as JSON: decoded where the key says what
 * it is, else text (or base64 when it is not text). */
static json_t *value_json(const char *rest, const uint8_t *v, size_t n) {
  ProtobufCMessage *m = NULL;
  if (!strncmp(rest, "nodes/", 6) || !strncmp(rest, "load/", 5))
    m = protobuf_c_message_unpack(&mega__v1__node__descriptor, NULL, n, v);
  else if (!strncmp(rest, "j/", 2))
    m = protobuf_c_message_unpack(&megad__v1__journal_record__descriptor, NULL, n, v);
  if (m) {
    json_t *j = mega_pb_json(m);
    protobuf_c_message_free_unpacked(m, NULL);
    return j;
  }
  bool text = true;
  for (size_t i = 0; i < n && text; i++) text = isprint(v[i]) || v[i] == '\n' || v[i] == '\t';
  if (text) return json_stringn((const char *)v, n);
  static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *s = malloc(4 * ((n + 2) / 3) + 1);
  if (!s) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t w = (uint32_t)v[i] << 16 | (i + 1 < n ? (uint32_t)v[i + 1] << 8 : 0) |
                 (i + 2 < n ? v[i + 2] : 0);
    s[k++] = b64[w >> 18 & 63];
    s[k++] = b64[w >> 12 & 63];
    s[k++] = i + 1 < n ? b64[w >> 6 & 63] : '=';
    s[k++] = i + 2 < n ? b64[w & 63] : '=';
  }
  s[k] = 0;
  json_t *j = json_pack("{s:s}", "base64", s);
  free(s);
  return j;
}

static int print_kvs(const Etcdserverpb__RangeResponse *r, const dump_opts *o) {
  size_t plen = strlen(o->prefix);
  for (size_t i = 0; i < r->n_kvs; i++) {
    const Mvccpb__KeyValue *kv = r->kvs[i];
    char key[kv->key.len + 1];
    memcpy(key, kv->key.data, kv->key.len);
    key[kv->key.len] = 0;
    if (o->keys_only) {
      printf("%s\n", key);
      continue;
    }
    const char *rest = kv->key.len >= plen ? key + plen : key;
    json_t *v = value_json(rest, kv->value.data, kv->value.len);
    if (o->json) {
      json_t *line = json_pack("{s:s, s:I, s:I, s:o?}", "key", key, "mod_revision",
                               (json_int_t)kv->mod_revision, "lease", (json_int_t)kv->lease,
                               "value", v);
      int rc = megactl_print_json(line, JSON_COMPACT | JSON_PRESERVE_ORDER);
      if (rc) return rc;
      continue;
    }
    printf("%s  (revision %lld%s%llx)\n", key, (long long)kv->mod_revision,
           kv->lease ? ", lease " : "", (unsigned long long)kv->lease);
    char *text = v ? json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY)
                   : NULL;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n"))
      printf("    %s\n", line);
    free(text);
    json_decref(v);
  }
  fflush(stdout);
  return 0;
}

static void usage(void) {
  printf("usage: megactl etcd-dump --etcd-endpoints URL[,URL...] [--etcd-prefix P]\n"
         "                         [--json | --keys-only] [TLS and auth flags]\n\n"
         "Prints every key of a cluster's tree in etcd (megad serve --etcd-endpoints) with\n"
         "its value decoded: P/nodes/ID (a mega.v1.Node), P/load/ID (the node's load: a\n"
         "mega.v1.Node with slots used and job ids), P/j/ID/0 (the job's record),\n"
         "P/j/ID/e/N (its events), P/j/ID/s (its last step) (megad's JournalRecords), and\n"
         "P/c/ID (the node that coordinates the job, under that node's lease). It reads\n"
         "etcd directly, so it works with every megad down.\n\n"
         "  --etcd-prefix P        the cluster's prefix (megad serve --etcd-prefix; default mega/)\n"
         "  --json                 one object per key: key, mod_revision, lease, value\n"
         "  --keys-only            the keys alone\n"
         "  --etcd-cacert FILE, --etcd-cert FILE, --etcd-key FILE, --etcd-user NAME,\n"
         "  --etcd-password-file FILE   as megad serve takes them\n");
}

int megactl_etcd_dump(int argc, char **argv) {
  dump_opts o = {.prefix = "mega/"};
  for (int i = 1; i < argc;) {
    if (megactl_is_help(argv[i])) {
      usage();
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      o.json = true;
      i++;
      continue;
    }
    int r = dump_flag("etcd-dump", argc, argv, &i, &o);
    if (r < 0) return 2;
    if (!r) return megactl_usage("etcd-dump", "unknown argument '%s'", argv[i]);
  }
  if (!o.endpoints) return megactl_usage("etcd-dump", "give --etcd-endpoints URL");
  if (!o.prefix[0] || o.prefix[strlen(o.prefix) - 1] != '/')
    return megactl_usage("etcd-dump", "--etcd-prefix '%s' must end with '/'", o.prefix);
  if (o.json && o.keys_only) return megactl_usage("etcd-dump", "--json or --keys-only, not both");
  if (!o.user != !o.password_file)
    return megactl_usage("etcd-dump", "--etcd-user and --etcd-password-file go together");
  mega_err err = {0};
  char *pem[3] = {NULL, NULL, NULL};
  const char *files[3] = {o.cacert, o.cert, o.key};
  static const char *const names[3] = {"--etcd-cacert", "--etcd-cert", "--etcd-key"};
  int rc = 0;
  for (int k = 0; k < 3 && !rc; k++)
    if (files[k] && mega_rpc_read_pem(names[k], files[k], k == 2, &pem[k], &err) != MEGA_OK)
      rc = megactl_fail("%s", err.msg);
  mega_rpc_auth tls = {.tls_ca = pem[0], .tls_cert = pem[1], .tls_key = pem[2]};
  char ep[256];
  first_endpoint(o.endpoints, ep, sizeof ep);
  char *token = NULL;
  if (!rc && o.user && !(token = authenticate(ep, pem[0] ? &tls : NULL, &o, &err)))
    rc = megactl_fail("authenticating to etcd as %s: %s", o.user, err.msg);
  mega_rpc_channel *ch = NULL;
  mega_rpc_channel_opts co = {.peer_name = "etcd", .auth = pem[0] ? &tls : NULL,
                              .header_key = token ? "token" : NULL, .header_value = token};
  ProtobufCMessage *resp = NULL;
  if (!rc) {
    size_t n = strlen(o.prefix);
    char end[n + 1];
    memcpy(end, o.prefix, n);
    end[n - 1] = (char)(o.prefix[n - 1] + 1); /* the prefix's range end: '/' + 1 */
    Etcdserverpb__RangeRequest r = ETCDSERVERPB__RANGE_REQUEST__INIT;
    r.key = (ProtobufCBinaryData){n, (uint8_t *)o.prefix};
    r.range_end = (ProtobufCBinaryData){n, (uint8_t *)end};
    r.keys_only = o.keys_only;
    if (mega_rpc_channel_new(ep, &co, &ch, &err) != MEGA_OK ||
        mega_rpc_unary(ch, &etcd_kv_range, &r.base, 10000, &resp, &err) != MEGA_OK)
      rc = megactl_fail("reading %s from etcd at %s: %s", o.prefix, ep, err.msg);
  }
  if (!rc) rc = print_kvs((Etcdserverpb__RangeResponse *)resp, &o);
  if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  mega_rpc_channel_free(ch);
  free(token);
  for (int k = 0; k < 3; k++) free(pem[k]);
  return rc;
}
