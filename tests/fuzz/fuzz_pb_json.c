/* proto/pb_json: any message megactl prints as JSON (status, ls, nodes,
 * watch --json), from bytes as the wire brings them. The first byte picks
 * the message type. */
#include "proto/pb_json.h"
#include "fuzz.h"

static const ProtobufCMessageDescriptor *const types[] = {
    &mega__v1__job__descriptor,
    &mega__v1__job_event__descriptor,
    &mega__v1__step_metrics__descriptor,
    &mega__v1__watch_job_response__descriptor,
    &mega__v1__list_jobs_response__descriptor,
    &mega__v1__get_job_response__descriptor,
    &mega__v1__list_nodes_response__descriptor,
    &mega__v1__job_spec__descriptor,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const ProtobufCMessageDescriptor *desc = types[data[0] % (sizeof types / sizeof types[0])];
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, size - 1, data + 1);
  if (!m) return 0;
  json_t *j = mega_pb_json(m);
  FUZZ_CHECK(j);
  char *text = json_dumps(j, JSON_COMPACT);
  FUZZ_CHECK(text);
  /* what megactl prints reads back as JSON */
  json_error_t jerr;
  json_t *back = json_loads(text, 0, &jerr);
  FUZZ_CHECK(back);
  json_decref(back);
  free(text);
  json_decref(j);
  if (desc == &mega__v1__step_metrics__descriptor) {
    json_t *s = mega_step_metrics_json((const Mega__V1__StepMetrics *)m);
    FUZZ_CHECK(s);
    json_decref(s);
    FILE *devnull = fopen("/dev/null", "w");
    FUZZ_CHECK(devnull && mega_step_metrics_write(devnull, (const Mega__V1__StepMetrics *)m));
    fclose(devnull);
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
