/* TLS files checked before gRPC ever uses them (rpc_auth.h). gRPC core
 * takes PEM text and fails late: a key that is not the certificate's made
 * the listening port fail to bind with no word of TLS, and an expired
 * certificate, or one its peers' CA did not sign, started a server that no
 * client could talk to. OpenSSL (which gRPC links anyway) parses the same
 * text here and says which file is wrong and how. */
#include <limits.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "proto/rpc_auth.h"

/* The certificate's subject, for messages. */
static void subject_of(X509 *c, char *buf, size_t len) {
  X509_NAME_oneline(X509_get_subject_name(c), buf, (int)len);
}

/* "2026-11-28 11:38 UTC" for an ASN1_TIME. */
static void time_text(const ASN1_TIME *t, char *buf, size_t len) {
  struct tm tm;
  if (!ASN1_TIME_to_tm(t, &tm) || !strftime(buf, len, "%Y-%m-%d %H:%M UTC", &tm))
    snprintf(buf, len, "(unreadable)");
}

/* Every certificate in pem after the first (a chain's intermediates). */
static STACK_OF(X509) *rest_of_chain(const char *pem) {
  STACK_OF(X509) *st = sk_X509_new_null();
  BIO *b = BIO_new_mem_buf(pem, -1);
  X509 *c = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL; /* the leaf itself */
  X509_free(c);
  while (st && b && (c = PEM_read_bio_X509(b, NULL, NULL, NULL)))
    if (!sk_X509_push(st, c)) X509_free(c);
  BIO_free(b);
  ERR_clear_error();
  return st;
}

/* A store of every certificate in ca_pem; NULL when there is none. */
static X509_STORE *ca_store(const char *ca_pem, int *n) {
  X509_STORE *store = X509_STORE_new();
  BIO *b = BIO_new_mem_buf(ca_pem, -1);
  X509 *c;
  *n = 0;
  while (store && b && (c = PEM_read_bio_X509(b, NULL, NULL, NULL))) {
    if (X509_STORE_add_cert(store, c)) (*n)++;
    X509_free(c);
  }
  BIO_free(b);
  ERR_clear_error();
  if (!*n) {
    X509_STORE_free(store);
    return NULL;
  }
  return store;
}

static mega_status verify_against_ca(X509 *cert, const char *cert_pem, const char *cert_flag,
                                     const char *ca_flag, const char *ca_pem, mega_err *err) {
  int n;
  X509_STORE *store = ca_store(ca_pem, &n);
  if (!store)
    return mega_fail(err, MEGA_ERR_INVALID, "%s holds no certificate OpenSSL can read", ca_flag);
  STACK_OF(X509) *chain = rest_of_chain(cert_pem);
  X509_STORE_CTX *ctx = X509_STORE_CTX_new();
  mega_status s = MEGA_OK;
  if (!ctx || !X509_STORE_CTX_init(ctx, store, cert, chain)) {
    s = mega_fail(err, MEGA_ERR_NOMEM, "out of memory checking %s", cert_flag);
  } else if (X509_verify_cert(ctx) != 1) {
    int e = X509_STORE_CTX_get_error(ctx);
    char subj[256];
    subject_of(cert, subj, sizeof subj);
    s = mega_fail(err, MEGA_ERR_INVALID,
                  "%s (%s) does not verify against %s: %s; peers check it against the same CA "
                  "and would refuse every handshake (give the certificate that CA signed, or "
                  "that CA)", cert_flag, subj, ca_flag, X509_verify_cert_error_string(e));
  }
  X509_STORE_CTX_free(ctx);
  sk_X509_pop_free(chain, X509_free);
  X509_STORE_free(store);
  ERR_clear_error();
  return s;
}

mega_status mega_rpc_check_tls(const char *cert_flag, const char *cert_pem, const char *key_flag,
                               const char *key_pem, const char *ca_flag, const char *ca_pem,
                               long *secs_left, mega_err *err) {
  BIO *cb = BIO_new_mem_buf(cert_pem, -1), *kb = BIO_new_mem_buf(key_pem, -1);
  X509 *cert = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
  EVP_PKEY *key = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
  BIO_free(cb);
  BIO_free(kb);
  ERR_clear_error();
  mega_status s = MEGA_OK;
  char subj[256] = "", when[64];
  if (cert) subject_of(cert, subj, sizeof subj);
  if (!cert)
    s = mega_fail(err, MEGA_ERR_INVALID, "%s holds no certificate OpenSSL can read (a PEM "
                  "\"BEGIN CERTIFICATE\" block)", cert_flag);
  else if (!key)
    s = mega_fail(err, MEGA_ERR_INVALID, "%s holds no private key OpenSSL can read (an "
                  "unencrypted PEM key)", key_flag);
  else if (X509_check_private_key(cert, key) != 1)
    s = mega_fail(err, MEGA_ERR_INVALID, "%s is not the key of %s (%s): give the key the "
                  "certificate was made for", key_flag, cert_flag, subj);
  else if (X509_cmp_current_time(X509_get0_notBefore(cert)) >= 0) {
    time_text(X509_get0_notBefore(cert), when, sizeof when);
    s = mega_fail(err, MEGA_ERR_INVALID, "%s (%s) is not valid until %s (is this machine's "
                  "clock right?)", cert_flag, subj, when);
  } else if (X509_cmp_current_time(X509_get0_notAfter(cert)) <= 0) {
    time_text(X509_get0_notAfter(cert), when, sizeof when);
    s = mega_fail(err, MEGA_ERR_INVALID, "%s (%s) expired on %s: every peer would refuse it; "
                  "give a renewed certificate", cert_flag, subj, when);
  } else if (ca_pem) {
    s = verify_against_ca(cert, cert_pem, cert_flag, ca_flag, ca_pem, err);
  }
  if (s == MEGA_OK && secs_left) {
    int days = 0, secs = 0;
    *secs_left = ASN1_TIME_diff(&days, &secs, NULL, X509_get0_notAfter(cert))
                     ? (long)days * 86400 + secs
                     : LONG_MAX;
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  ERR_clear_error();
  return s;
}
