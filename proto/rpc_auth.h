/* Who may call, and over what: a cluster token every call carries as
 * `authorization: Bearer TOKEN`, and TLS through gRPC core's SSL
 * credentials (mutual TLS when the server asks for client certificates).
 *
 * A server (rpc_server.h) given a token refuses every call without it with
 * UNAUTHENTICATED, comparing in constant time; a channel (rpc_client.h)
 * given a token sends it on every call. TLS is on for a server given
 * tls_cert and tls_key, and for a channel given tls_ca.
 *
 * A server may hold a second token, the peer token: the methods under its
 * peer prefix (rpc_server.h) take only that one, and a call to them with
 * the (client) token gets PERMISSION_DENIED; its other methods take either
 * token. So clients, holding the token alone, cannot act as servers' peers. */
#ifndef MEGA_PROTO_RPC_AUTH_H
#define MEGA_PROTO_RPC_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

/* Every string is the caller's and is copied where it is kept. */
typedef struct mega_rpc_auth {
  const char *token;    /* the cluster token; NULL or "": none */
  const char *peer_token; /* server: the token the peer prefix's methods take (see
                             above); NULL or "": they take token. Channel: unused */
  const char *tls_ca;   /* PEM. Channel: the CA that signs servers (TLS on when set).
                           Server: the CA that signs clients (for tls_client_auth) */
  const char *tls_cert; /* PEM: this side's certificate chain (server; channel for mTLS) */
  const char *tls_key;  /* PEM: its private key */
  bool tls_client_auth; /* server: require a client certificate signed by tls_ca */
} mega_rpc_auth;

/* Shortest and longest token, and longest PEM file, accepted. 32: what
 * `head -c 32 /dev/urandom | base64` (44) and `openssl rand -hex 16` make. */
#define MEGA_RPC_TOKEN_MIN 32
#define MEGA_RPC_TOKEN_MAX 4096
#define MEGA_RPC_PEM_MAX (1u << 20)

/* Reads the token in path (trailing whitespace dropped) into *out (the
 * caller frees it). flag names the file in messages ("--token-file").
 * private_only refuses a file that group or others may read (megad does;
 * the error says `chmod 600 PATH`). A token is MEGA_RPC_TOKEN_MIN to MEGA_RPC_TOKEN_MAX
 * printable ASCII characters without spaces. */
mega_status mega_rpc_read_token(const char *flag, const char *path, bool private_only, char **out,
                                mega_err *err);

/* Reads a password (one line; its newline dropped) from a private file
 * (mode 600 or stricter) into *out (the caller frees it). */
mega_status mega_rpc_read_password(const char *flag, const char *path, char **out,
                                   mega_err *err);

/* Reads a PEM file (a certificate, a key, a CA bundle) into *out (the caller
 * frees it). private_only as above (for keys). */
mega_status mega_rpc_read_pem(const char *flag, const char *path, bool private_only, char **out,
                              mega_err *err);

/* Checks, before any handshake, what would make every handshake fail
 * (rpc_tls.c, with OpenSSL): cert_pem's first certificate and key_pem's
 * key parse and belong together; the certificate is valid now (not
 * expired, not yet to come); and, given ca_pem, it verifies against those
 * CAs (the chain's other certificates in cert_pem may link it to them).
 * Messages name the files by cert_flag, key_flag and ca_flag. *secs_left
 * (may be NULL): seconds until the certificate expires. */
mega_status mega_rpc_check_tls(const char *cert_flag, const char *cert_pem, const char *key_flag,
                               const char *key_pem, const char *ca_flag, const char *ca_pem,
                               long *secs_left, mega_err *err);

/* Whether host (no port; "[::1]", "127.0.0.5", "localhost") names only
 * loopback addresses. A name that does not resolve is not loopback. */
bool mega_rpc_host_is_loopback(const char *host);

/* Whether a listen address ("host:port", "unix:/path") reaches only this
 * machine: a unix socket or a loopback host. */
bool mega_rpc_addr_is_local(const char *addr);

#endif
