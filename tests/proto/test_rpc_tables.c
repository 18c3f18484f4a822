/* The hand-written method tables against protoc-c's service descriptors, and
 * the status mapping. (Stream flags are checked against protoc's own view of
 * mega.proto by interop.py, since protoc-c drops them.) */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "proto/mega_rpc.h"

static void check_service(const ProtobufCServiceDescriptor *svc,
                          const mega_rpc_method *const *table) {
  size_t n = 0;
  for (; table[n]; n++) {
    const mega_rpc_method *m = table[n];
    assert_true(n < svc->n_methods);
    const ProtobufCMethodDescriptor *d = &svc->methods[n]; /* same order as the .proto */
    char path[128];
    snprintf(path, sizeof path, "/%s/%s", svc->name, d->name);
    assert_string_equal(m->path, path);
    assert_string_equal(mega_rpc_method_name(m), d->name);
    assert_ptr_equal(m->request, d->input);
    assert_ptr_equal(m->response, d->output);
    assert_true(m->kind == MEGA_RPC_UNARY || m->kind == MEGA_RPC_SERVER_STREAM);
  }
  assert_int_equal(n, svc->n_methods);
}

static void test_tables_match_protoc_c(void **state) {
  (void)state;
  check_service(&mega__v1__control__descriptor, mega_control_methods);
  check_service(&mega__v1__peer__descriptor, mega_peer_methods);
  assert_int_equal(mega_control_watch_job.kind, MEGA_RPC_SERVER_STREAM);
  assert_int_equal(mega_control_get_trace.kind, MEGA_RPC_SERVER_STREAM);
  assert_int_equal(mega_peer_kv_wait.kind, MEGA_RPC_UNARY);
  /* the peer token guards exactly the Peer methods by this prefix */
  size_t pl = strlen(MEGA_PEER_PATH_PREFIX);
  for (size_t i = 0; mega_peer_methods[i]; i++)
    assert_int_equal(strncmp(mega_peer_methods[i]->path, MEGA_PEER_PATH_PREFIX, pl), 0);
  for (size_t i = 0; mega_control_methods[i]; i++)
    assert_int_not_equal(strncmp(mega_control_methods[i]->path, MEGA_PEER_PATH_PREFIX, pl), 0);
}

static void test_status_round_trip(void **state) {
  (void)state;
  for (mega_status s = MEGA_OK; s <= MEGA_ERR_INTERNAL; s++) {
    mega_status back = mega_rpc_status_from_code(mega_rpc_code_from_status(s));
    if (s == MEGA_ERR_IO) assert_int_equal(back, MEGA_ERR_INTERNAL); /* documented */
    else assert_int_equal(back, s);
  }
  assert_int_equal(mega_rpc_code_from_status(MEGA_ERR_NOT_FOUND), MEGA_RPC_NOT_FOUND);
  assert_int_equal(mega_rpc_code_from_status(MEGA_ERR_INVALID), MEGA_RPC_INVALID_ARGUMENT);
  assert_int_equal(mega_rpc_status_from_code(MEGA_RPC_UNAVAILABLE), MEGA_ERR_IO);
  assert_int_equal(mega_rpc_status_from_code(MEGA_RPC_FAILED_PRECONDITION), MEGA_ERR_INVALID);
  assert_int_equal(mega_rpc_status_from_code((mega_rpc_code)99), MEGA_ERR_INTERNAL);
  assert_string_equal(mega_rpc_code_name(MEGA_RPC_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
  assert_string_equal(mega_rpc_code_name(MEGA_RPC_UNAUTHENTICATED), "UNAUTHENTICATED");
  assert_string_equal(mega_rpc_code_name((mega_rpc_code)99), "UNKNOWN");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tables_match_protoc_c),
      cmocka_unit_test(test_status_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
