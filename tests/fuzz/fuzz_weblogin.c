/* daemon/web: what anyone who can reach megad's web view sends it: the
 * login form's body (token=...&next=...), a Cookie header, and the page to
 * return to. The input is those three separated by NUL bytes.
 *
 * A form field decodes to text that encodes and decodes back to itself.
 * A login succeeds exactly when the token field is the token; its cookie
 * then names a live session, and where it sends the browser is a path of
 * this megad (no "//host", nothing that leaves a header or an HTML
 * attribute). A cookie header from the input never names a session, and
 * logging it out ends none. The login form puts no tag of the input's in
 * the page. */
#include <ctype.h>

#include "daemon/web/web.h"
#include "daemon/web/weblogin.h"
#include "fuzz.h"

static const char TOKEN[] = "s3cr3t/t+k n%";

static bool safe_path(const char *p) {
  if (p[0] != '/' || p[1] == '/') return false;
  for (; *p; p++)
    if (!isalnum((unsigned char)*p) && !strchr("/-_.~%", *p)) return false;
  return true;
}

static size_t count(const char *s, char c) {
  size_t n = 0;
  for (; *s; s++) n += *s == c;
  return n;
}

/* A field decodes to what it reads back as once percent-encoded. */
static void field(const char *form, const char *key, size_t cap) {
  char *buf = malloc(cap);
  FUZZ_CHECK(buf);
  if (megad_web_form_get(form, key, buf, cap)) {
    size_t n = strlen(buf);
    FUZZ_CHECK(n < cap);
    char *enc = malloc(3 * n + 3), *back = malloc(cap);
    FUZZ_CHECK(enc && back);
    size_t o = 0;
    enc[o++] = 'k', enc[o++] = '=';
    for (size_t i = 0; i < n; i++)
      o += (size_t)sprintf(enc + o, isalnum((unsigned char)buf[i]) ? "%c" : "%%%02X",
                           (unsigned char)buf[i]);
    enc[o] = '\0';
    FUZZ_CHECK(megad_web_form_get(enc, "k", back, cap) && !strcmp(back, buf));
    free(enc);
    free(back);
  }
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *in = malloc(size + 3); /* three NULs after: each part ends */
  FUZZ_CHECK(in);
  memcpy(in, data, size);
  memset(in + size, 0, 3);
  const char *form = in, *cookie_hdr = form + strlen(form) + 1;
  const char *next = cookie_hdr + strlen(cookie_hdr) + 1;

  field(form, "token", 4097);
  field(form, "next", 520);
  field(form, "token", 4);

  megad_web_login *l = megad_web_login_new(TOKEN);
  FUZZ_CHECK(l);
  char sent[4097];
  bool want = megad_web_form_get(form, "token", sent, sizeof sent) && !strcmp(sent, TOKEN);
  char *set_cookie = NULL, *location = NULL;
  uint64_t refusals = 0;
  bool ok = megad_web_login_post(l, form, "10.0.0.1", 1000, &set_cookie, &location, &refusals, NULL);
  FUZZ_CHECK(ok == want);
  FUZZ_CHECK(!megad_web_session_ok(l, cookie_hdr, 2000));
  if (ok) {
    FUZZ_CHECK(set_cookie && location && safe_path(location));
    /* "mega_session=ID; ..." as the browser sends it back */
    char sent_cookie[256];
    snprintf(sent_cookie, sizeof sent_cookie, "a=b; %.*s", (int)strcspn(set_cookie, ";"),
             set_cookie);
    FUZZ_CHECK(megad_web_session_ok(l, sent_cookie, 2000));
    FUZZ_CHECK(!megad_web_session_ok(l, cookie_hdr, 2000));
    char *cleared = NULL;
    megad_web_logout(l, cookie_hdr, &cleared);
    free(cleared);
    FUZZ_CHECK(megad_web_session_ok(l, sent_cookie, 2000));
  } else {
    FUZZ_CHECK(!set_cookie && !location && refusals == 1);
  }
  free(set_cookie);
  free(location);
  megad_web_login_free(l);

  size_t len = 0, len0 = 0;
  char *page = megad_web_login_form(next, size & 1, &len);
  char *plain = megad_web_login_form("/", size & 1, &len0);
  FUZZ_CHECK(page && plain && len == strlen(page));
  FUZZ_CHECK(count(page, '<') == count(plain, '<') && count(page, '"') == count(plain, '"'));
  const char *v = strstr(page, "name=\"next\" value=\"");
  FUZZ_CHECK(v);
  v += strlen("name=\"next\" value=\"");
  char back[600];
  size_t vl = strcspn(v, "\"");
  FUZZ_CHECK(vl < sizeof back);
  memcpy(back, v, vl);
  back[vl] = '\0';
  FUZZ_CHECK(safe_path(back));
  free(page);
  free(plain);
  free(in);
  return 0;
}
