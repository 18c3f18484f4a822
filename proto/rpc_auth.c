/* The token and TLS: reading the files, gRPC core's credentials, and the
 * server's check of a call's metadata. */
#include "proto/rpc_auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc_security.h>

#include "core/secret.h"
#include "proto/rpc_internal.h"

/* ---- files ---- */

static mega_status read_small(const char *flag, const char *path, bool private_only, size_t max,
                              char **out, size_t *len, mega_err *err) {
  *out = NULL;
  if (!path || !path[0]) return mega_fail(err, MEGA_ERR_INVALID, "%s needs a file name", flag);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mega_fail(err, MEGA_ERR_INVALID, "%s %s: %s", flag, path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return mega_fail(err, MEGA_ERR_INVALID, "%s %s: not a regular file", flag, path);
  }
  if (private_only && (st.st_mode & (S_IRWXG | S_IRWXO))) {
    close(fd);
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s %s: group or others may read it (mode %03o); make it private with "
                     "`chmod 600 %s`",
                     flag, path, (unsigned)(st.st_mode & 0777), path);
  }
  if ((size_t)st.st_size > max) {
    close(fd);
    return mega_fail(err, MEGA_ERR_INVALID, "%s %s: %lld bytes is more than the %zu allowed",
                     flag, path, (long long)st.st_size, max);
  }
  char *buf = malloc((size_t)st.st_size + 1);
  if (!buf) {
    close(fd);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory reading %s", path);
  }
  size_t n = 0;
  while (n < (size_t)st.st_size) {
    ssize_t r = read(fd, buf + n, (size_t)st.st_size - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return MEGA_OK;
}

mega_status mega_rpc_read_token(const char *flag, const char *path, bool private_only, char **out,
                                mega_err *err) {
  size_t n;
  char *t;
  mega_status s = read_small(flag, path, private_only, MEGA_RPC_TOKEN_MAX + 2, &t, &n, err);
  if (s != MEGA_OK) return s;
  while (n && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ' || t[n - 1] == '\t'))
    t[--n] = '\0';
  const char *why = NULL;
  if (n < MEGA_RPC_TOKEN_MIN) why = "is shorter than 32 characters, short enough to guess";
  else if (n > MEGA_RPC_TOKEN_MAX) why = "is longer than 4096 characters";
  for (size_t i = 0; !why && i < n; i++)
    if (t[i] <= ' ' || t[i] > '~') why = "holds a space, a control character or non-ASCII";
  if (why) {
    free(t);
    return mega_fail(err, MEGA_ERR_INVALID,
                     "%s %s: the token %s; make one with `head -c 32 /dev/urandom | base64 > %s`",
                     flag, path, why, path);
  }
  *out = t;
  return MEGA_OK;
}

mega_status mega_rpc_read_password(const char *flag, const char *path, char **out,
                                   mega_err *err) {
  size_t n;
  char *t;
  mega_status s = read_small(flag, path, true, 1024, &t, &n, err);
  if (s != MEGA_OK) return s;
  while (n && (t[n - 1] == '\n' || t[n - 1] == '\r')) t[--n] = '\0';
  if (!n || memchr(t, '\0', n)) {
    free(t);
    return mega_fail(err, MEGA_ERR_INVALID, "%s %s: %s", flag, path,
                     n ? "holds a NUL byte" : "is empty: write the password there");
  }
  *out = t;
  return MEGA_OK;
}

mega_status mega_rpc_read_pem(const char *flag, const char *path, bool private_only, char **out,
                              mega_err *err) {
  size_t n;
  mega_status s = read_small(flag, path, private_only, MEGA_RPC_PEM_MAX, out, &n, err);
  if (s != MEGA_OK) return s;
  if (!strstr(*out, "-----BEGIN ")) {
    free(*out);
    *out = NULL;
    return mega_fail(err, MEGA_ERR_INVALID, "%s %s: not a PEM file (no -----BEGIN line)", flag,
                     path);
  }
  return MEGA_OK;
}

/* ---- addresses ---- */

bool mega_rpc_host_is_loopback(const char *host) {
  char h[256];
  size_t len = strlen(host);
  if (len >= sizeof h) return false;
  memcpy(h, host, len + 1);
  if (len >= 2 && h[0] == '[' && h[len - 1] == ']') {
    memmove(h, h + 1, len - 2);
    h[len - 2] = '\0';
  }
  if (!h[0]) return false; /* "" and ":7070" listen on every interface */
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(h, NULL, &hints, &res) != 0 || !res) return false;
  bool all = true;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      const struct sockaddr_in *a = (const void *)ai->ai_addr;
      all &= (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    } else if (ai->ai_family == AF_INET6) {
      const struct sockaddr_in6 *a = (const void *)ai->ai_addr;
      all &= IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) != 0;
    } else {
      all = false;
    }
  }
  freeaddrinfo(res);
  return all;
}

bool mega_rpc_addr_is_local(const char *addr) {
  if (!strncmp(addr, "unix:", 5)) return true;
  const char *colon = strrchr(addr, ':');
  char host[256];
  size_t hl = colon ? (size_t)(colon - addr) : strlen(addr);
  if (hl >= sizeof host) return false;
  memcpy(host, addr, hl);
  host[hl] = '\0';
  return mega_rpc_host_is_loopback(host);
}

/* ---- credentials (rpc_internal.h) ---- */

grpc_server_credentials *mega_rpc_server_creds(const mega_rpc_auth *a) {
  if (!a || !a->tls_cert || !a->tls_key) return grpc_insecure_server_credentials_create();
  grpc_ssl_pem_key_cert_pair pair = {a->tls_key, a->tls_cert};
  grpc_ssl_client_certificate_request_type req =
      a->tls_client_auth ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                         : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  return grpc_ssl_server_credentials_create_ex(a->tls_client_auth ? a->tls_ca : NULL, &pair, 1,
                                               req, NULL);
}

grpc_channel_credentials *mega_rpc_channel_creds(const mega_rpc_auth *a) {
  if (!a || !a->tls_ca) return grpc_insecure_credentials_create();
  grpc_ssl_pem_key_cert_pair pair = {a->tls_key, a->tls_cert};
  return grpc_ssl_credentials_create(a->tls_ca, a->tls_cert && a->tls_key ? &pair : NULL, NULL,
                                     NULL);
}

char *mega_rpc_bearer(const char *token) {
  char *h = NULL;
  if (!token || !token[0] || asprintf(&h, "Bearer %s", token) < 0) return NULL;
  return h;
}

/* Constant time in the value's content: every byte of the expected header
 * is compared whatever the value holds, so timing tells nothing of where
 * a guess went wrong. */
bool mega_rpc_token_matches(const char *want, size_t want_len, const grpc_metadata_array *md) {
  const grpc_metadata *got = NULL;
  for (size_t i = 0; i < md->count; i++) {
    const grpc_slice k = md->metadata[i].key;
    if (GRPC_SLICE_LENGTH(k) == 13 && !memcmp(GRPC_SLICE_START_PTR(k), "authorization", 13)) {
      if (got) return false; /* two tokens: refuse rather than pick one */
      got = &md->metadata[i];
    }
  }
  if (!got) return false;
  const unsigned char *v = GRPC_SLICE_START_PTR(got->value);
  size_t n = GRPC_SLICE_LENGTH(got->value);
  return mega_secret_equal(v, n, want, want_len);
}

bool mega_rpc_has_authorization(const grpc_metadata_array *md) {
  for (size_t i = 0; i < md->count; i++) {
    const grpc_slice k = md->metadata[i].key;
    if (GRPC_SLICE_LENGTH(k) == 13 && !memcmp(GRPC_SLICE_START_PTR(k), "authorization", 13))
      return true;
  }
  return false;
}
