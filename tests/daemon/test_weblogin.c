/* daemon/web/weblogin: the web view's login with the token, its session
 * cookie, forged and expired sessions, where it returns to, logout, the
 * form, and wrong tokens from one address held off. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/throttle.h"
#include "daemon/web/weblogin.h"

/* Wrong tokens from one address: a few are free, then that address's
 * logins are held off (not looked at, right token or not) for a second,
 * doubled by each further wrong one; another address is not, and the right
 * token once the hold is over starts the address afresh. */
static void test_login_guesses_held_off(void **state) {
  (void)state;
  megad_web_login *l = megad_web_login_new("Zm9vYmFy+c2VjcmV0/dG9rZW4=");
  const char *right = "token=Zm9vYmFy%2Bc2VjcmV0%2FdG9rZW4%3D";
  char *cookie, *loc;
  uint64_t refused;
  int64_t retry = -1, t = 1000;
  for (int i = 0; i < MEGA_THROTTLE_FREE; i++) {
    assert_false(megad_web_login_post(l, "token=guess", "10.0.0.9", t++, &cookie, &loc, &refused,
                                      &retry));
    assert_int_equal(retry, 0);
  }
  assert_false(megad_web_login_post(l, "token=guess", "10.0.0.9", t, &cookie, &loc, &refused,
                                    &retry));
  assert_int_equal(retry, MEGA_THROTTLE_FIRST_MS);
  /* held: even the right token is not looked at */
  assert_false(megad_web_login_post(l, right, "10.0.0.9", t + 500, &cookie, &loc, &refused, &retry));
  assert_int_equal(retry, 500);
  assert_null(cookie);
  /* another address is not held */
  assert_true(megad_web_login_post(l, right, "10.0.0.7", t + 500, &cookie, &loc, &refused, &retry));
  assert_int_equal(retry, 0);
  free(cookie);
  free(loc);
  /* over: one more wrong one holds it twice as long */
  t += MEGA_THROTTLE_FIRST_MS;
  assert_false(megad_web_login_post(l, "token=guess", "10.0.0.9", t, &cookie, &loc, &refused,
                                    &retry));
  assert_int_equal(retry, 2 * MEGA_THROTTLE_FIRST_MS);
  t += 2 * MEGA_THROTTLE_FIRST_MS;
  assert_true(megad_web_login_post(l, right, "10.0.0.9", t, &cookie, &loc, &refused, &retry));
  free(cookie);
  free(loc);
  /* afresh: the next wrong one is free again */
  assert_false(megad_web_login_post(l, "token=guess", "10.0.0.9", t + 1, &cookie, &loc, &refused,
                                    &retry));
  assert_int_equal(retry, 0);
  megad_web_login_free(l);
}

static void test_login(void **state) {
  (void)state;
  const char *token = "Zm9vYmFy+c2VjcmV0/dG9rZW4=";
  megad_web_login *l = megad_web_login_new(token);
  char *cookie, *loc;
  uint64_t refused;
  /* wrong tokens: refused; the log line is due at most once a second */
  assert_false(megad_web_login_post(l, "token=nope&next=/", "10.0.0.1", 1000, &cookie, &loc,
                                    &refused, NULL));
  assert_null(cookie);
  assert_int_equal(refused, 1);
  assert_false(megad_web_login_post(l, "token=Zm9vYmFy+c2VjcmV0/dG9rZW4=", "10.0.0.1", 1100,
                                    &cookie, &loc, &refused, NULL)); /* '+' is a space */
  assert_int_equal(refused, 0);
  assert_false(megad_web_login_post(l, "next=/", "10.0.0.1", 1200, &cookie, &loc, &refused, NULL));
  assert_false(megad_web_login_post(l, "", "10.0.0.1", 2100, &cookie, &loc, &refused, NULL));
  assert_int_equal(refused, 3);
  /* the right one: a session cookie, not the token */
  assert_true(megad_web_login_post(l, "token=Zm9vYmFy%2Bc2VjcmV0%2FdG9rZW4%3D&next=/jobs/j-1-n1",
                                   "10.0.0.1", 3000, &cookie, &loc, &refused, NULL));
  assert_string_equal(loc, "/jobs/j-1-n1");
  assert_int_equal(strncmp(cookie, "mega_session=", 13), 0);
  assert_non_null(strstr(cookie, "; HttpOnly"));
  assert_non_null(strstr(cookie, "; SameSite=Strict"));
  assert_non_null(strstr(cookie, "; Path=/"));
  assert_null(strstr(cookie, token));
  assert_null(strstr(cookie, "c2VjcmV0"));
  char hdr[256], id[80];
  sscanf(cookie, "mega_session=%70[0-9a-f]", id);
  assert_int_equal(strlen(id), 64);
  snprintf(hdr, sizeof hdr, "theme=dark; mega_session=%s; x=1", id);
  assert_true(megad_web_session_ok(l, hdr, 4000));
  assert_false(megad_web_session_ok(l, NULL, 4000));
  assert_false(megad_web_session_ok(l, "mega_session=", 4000));
  /* forged: one character off, a prefix, the token itself */
  char forged[256];
  snprintf(forged, sizeof forged, "mega_session=%s", id);
  forged[13] = forged[13] == 'a' ? 'b' : 'a';
  assert_false(megad_web_session_ok(l, forged, 4000));
  snprintf(forged, sizeof forged, "mega_session=%.63s", id);
  assert_false(megad_web_session_ok(l, forged, 4000));
  snprintf(forged, sizeof forged, "mega_session=%s", token);
  assert_false(megad_web_session_ok(l, forged, 4000));
  snprintf(forged, sizeof forged, "other_session=%s", id);
  assert_false(megad_web_session_ok(l, forged, 4000));
  /* it expires */
  assert_false(megad_web_session_ok(l, hdr, 3000 + (int64_t)MEGAD_WEB_SESSION_S * 1000 + 1));
  free(cookie);
  free(loc);
  /* a next that leaves megad returns to / */
  const char *bad[] = {"//evil.example/", "http://evil.example/", "/a\"b", "/x?<y>", "jobs"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char form[256], enc[96];
    size_t o = 0;
    for (const char *p = bad[i]; *p; p++) o += (size_t)snprintf(enc + o, sizeof enc - o, "%%%02X", (unsigned char)*p);
    snprintf(form, sizeof form, "token=Zm9vYmFy%%2Bc2VjcmV0%%2FdG9rZW4%%3D&next=%s", enc);
    assert_true(megad_web_login_post(l, form, "10.0.0.1", 5000, &cookie, &loc, &refused, NULL));
    assert_string_equal(loc, "/");
    free(cookie);
    free(loc);
  }
  /* logout forgets the session and clears the cookie */
  assert_true(megad_web_login_post(l, "token=Zm9vYmFy%2Bc2VjcmV0%2FdG9rZW4%3D", "10.0.0.1", 6000,
                                   &cookie, &loc, &refused, NULL));
  sscanf(cookie, "mega_session=%70[0-9a-f]", id);
  snprintf(hdr, sizeof hdr, "mega_session=%s", id);
  free(cookie);
  free(loc);
  assert_true(megad_web_session_ok(l, hdr, 6001));
  megad_web_logout(l, hdr, &cookie);
  assert_non_null(strstr(cookie, "Max-Age=0"));
  free(cookie);
  assert_false(megad_web_session_ok(l, hdr, 6002));
  /* the form: no script, the next path kept only when plain */
  size_t len;
  char *page = megad_web_login_form("/jobs/j-1-n1", true, &len);
  assert_non_null(strstr(page, "name=\"next\" value=\"/jobs/j-1-n1\""));
  assert_non_null(strstr(page, "id=\"wrong\""));
  assert_null(strstr(page, "<script"));
  free(page);
  page = megad_web_login_form("/jobs/\"><script>", false, &len);
  assert_non_null(strstr(page, "name=\"next\" value=\"/\""));
  assert_null(strstr(page, "<script"));
  assert_null(strstr(page, "id=\"wrong\""));
  free(page);
  megad_web_login_free(l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_login),
      cmocka_unit_test(test_login_guesses_held_off),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
