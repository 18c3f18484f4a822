#include "proto/rpc_internal.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <grpc/support/log.h>
#include <string.h>

mega_status mega_rpc_pack(const ProtobufCMessage *msg, const ProtobufCMessageDescriptor *want,
                          size_t max, grpc_byte_buffer **out, mega_err *err) {
  *out = NULL;
  if (!msg || msg->descriptor != want)
    return mega_fail(err, MEGA_ERR_INTERNAL, "message is a %s, but the method takes a %s",
                     msg ? msg->descriptor->name : "NULL", want->name);
  size_t len = protobuf_c_message_get_packed_size(msg);
  if (len > max)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "a %s of %zu bytes exceeds the message limit of %zu bytes", want->name, len,
                     max);
  grpc_slice s = grpc_slice_malloc(len);
  protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
  *out = grpc_raw_byte_buffer_create(&s, 1); /* takes its own reference */
  grpc_slice_unref(s);
  return MEGA_OK;
}

ProtobufCMessage *mega_rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc) {
  grpc_byte_buffer_reader r;
  if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
  grpc_slice s = grpc_byte_buffer_reader_readall(&r);
  grpc_byte_buffer_reader_destroy(&r);
  ProtobufCMessage *m =
      protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
  grpc_slice_unref(s);
  return m;
}

gpr_timespec mega_rpc_deadline(unsigned timeout_ms) {
  if (timeout_ms == 0) return gpr_inf_future(GPR_CLOCK_REALTIME);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_millis((int64_t)timeout_ms, GPR_TIMESPAN));
}

/* ---- logging ---- */

static mega_rpc_log_fn log_fn;

static void log_trampoline(gpr_log_func_args *a) {
  if (!log_fn) return;
  int sev = a->severity == GPR_LOG_SEVERITY_DEBUG ? 0 : a->severity == GPR_LOG_SEVERITY_INFO ? 1 : 2;
  log_fn(sev, a->file, a->line, a->message);
}

void mega_rpc_set_log(mega_rpc_log_fn fn) {
  log_fn = fn;
  gpr_set_log_function(log_trampoline);
}

void mega_rpc_lib_ref(void) { grpc_init(); }

void mega_rpc_lib_unref(void) { grpc_shutdown(); }

bool mega_rpc_wait_released(unsigned timeout_ms) {
  /* grpc_is_initialized takes gRPC's init lock, which a deferred clean-up
   * holds until it is done. */
  for (unsigned waited = 0; grpc_is_initialized(); waited++) {
    if (waited >= timeout_ms) return false;
    gpr_sleep_until(gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(1, GPR_TIMESPAN)));
  }
  return true;
}

const char *mega_rpc_method_name(const mega_rpc_method *m) {
  const char *slash = strrchr(m->path, '/');
  return slash ? slash + 1 : m->path;
}
