#include "proto/pb_json.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/utf8.h"
#include "proto/step_bubble.h"

static json_t *real_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* Each set_new consumes its value, also on failure (jansson's rule), so a
 * chain of them needs only one check at the end. */
static int set(json_t *obj, const char *key, json_t *v) {
  return json_object_set_new(obj, key, v) == 0 ? 0 : 1;
}

static json_t *rank_json(const Mega__V1__RankMetrics *r) {
  json_t *o = json_object();
  if (!o) return NULL;
  int bad = 0;
  bad |= set(o, "rank", json_integer(r->rank));
  bad |= set(o, "pp_rank", json_integer(r->pp_rank));
  bad |= set(o, "dp_rank", json_integer(r->dp_rank));
  bad |= set(o, "tp_rank", json_integer(r->tp_rank));
  bad |= set(o, "compute_s", real_or_null(r->compute_s));
  bad |= set(o, "tp_comm_s", real_or_null(r->tp_comm_s));
  bad |= set(o, "bubble_s", real_or_null(r->bubble_s));
  bad |= set(o, "p2p_wait_s", real_or_null(r->p2p_wait_s));
  bad |= set(o, "grad_sync_exposed_s", real_or_null(r->grad_sync_exposed_s));
  bad |= set(o, "peak_activation_bytes", json_integer((json_int_t)r->peak_activation_bytes));
  bad |= set(o, "param_bytes", json_integer((json_int_t)r->param_bytes));
  bad |= set(o, "grad_bytes", json_integer((json_int_t)r->grad_bytes));
  bad |= set(o, "optimizer_state_bytes", json_integer((json_int_t)r->optimizer_state_bytes));
  /* what megactl watch, the web view and /metrics compute the bubble from:
   * each rank's bubble over its own step time, and the phases they stack */
  bad |= set(o, "step_time_s", real_or_null(r->step_time_s));
  bad |= set(o, "bubble_warmup_s", real_or_null(r->bubble_warmup_s));
  bad |= set(o, "bubble_steady_s", real_or_null(r->bubble_steady_s));
  bad |= set(o, "bubble_cooldown_s", real_or_null(r->bubble_cooldown_s));
  bad |= set(o, "peak_inflight", json_integer(r->peak_inflight));
  if (bad) {
    json_decref(o);
    return NULL;
  }
  return o;
}

json_t *mega_step_metrics_json(const Mega__V1__StepMetrics *m) {
  json_t *o = json_object(), *ranks = json_array();
  if (!o || !ranks) {
    json_decref(o);
    json_decref(ranks);
    return NULL;
  }
  int bad = 0;
  for (size_t i = 0; i < m->n_ranks && !bad; i++)
    bad |= json_array_append_new(ranks, rank_json(m->ranks[i])) != 0;
  bad |= set(o, "iteration", json_integer((json_int_t)m->iteration));
  bad |= set(o, "attempt", json_integer((json_int_t)m->attempt));
  bad |= set(o, "loss", m->no_loss ? json_null() : real_or_null(m->loss));
  bad |= set(o, "grad_norm", real_or_null(m->grad_norm));
  bad |= set(o, "lr", real_or_null(m->lr));
  bad |= set(o, "step_time_s", real_or_null(m->step_time_s));
  bad |= set(o, "tokens_per_s", real_or_null(m->tokens_per_s));
  /* as megaw --json: present only where they happened */
  if (m->has_eval_loss) bad |= set(o, "eval_loss", real_or_null(m->eval_loss));
  if (m->has_final_eval_loss) bad |= set(o, "final_eval_loss", real_or_null(m->final_eval_loss));
  if (m->has_test_loss) bad |= set(o, "test_loss", real_or_null(m->test_loss));
  if (m->skipped) bad |= set(o, "skipped", json_true());
  bad |= set(o, "world_size", json_integer((json_int_t)mega_step_world(m)));
  /* empty for a replay's old steps: megad keeps the newest steps' ranks */
  bad |= set(o, "ranks", ranks);
  if (bad) {
    json_decref(o);
    return NULL;
  }
  return o;
}

bool mega_step_metrics_write(FILE *f, const Mega__V1__StepMetrics *m) {
  json_t *j = mega_step_metrics_json(m);
  if (!j) return false;
  bool ok = json_dumpf(j, f, JSON_COMPACT | JSON_REAL_PRECISION(17)) == 0;
  json_decref(j);
  ok = fputc('\n', f) != EOF && ok;
  return fflush(f) == 0 && ok;
}

/* ---- generic ---- */

static json_t *base64(const ProtobufCBinaryData *b) {
  static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t n = (b->len + 2) / 3 * 4;
  char *s = malloc(n + 1);
  if (!s) return NULL;
  size_t o = 0;
  for (size_t i = 0; i < b->len; i += 3) {
    uint32_t v = (uint32_t)b->data[i] << 16;
    if (i + 1 < b->len) v |= (uint32_t)b->data[i + 1] << 8;
    if (i + 2 < b->len) v |= b->data[i + 2];
    s[o++] = abc[v >> 18 & 63];
    s[o++] = abc[v >> 12 & 63];
    s[o++] = i + 1 < b->len ? abc[v >> 6 & 63] : '=';
    s[o++] = i + 2 < b->len ? abc[v & 63] : '=';
  }
  s[o] = '\0';
  json_t *j = json_stringn(s, o);
  free(s);
  return j;
}

static size_t elem_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32:
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: return 4;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64: return 8;
  case PROTOBUF_C_TYPE_FLOAT: return sizeof(float);
  case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
  case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_ENUM: return sizeof(int);
  case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
  case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
  case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
  }
  return 0;
}

static json_t *value_json(const ProtobufCFieldDescriptor *f, const void *p) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32:
  case PROTOBUF_C_TYPE_SINT32:
  case PROTOBUF_C_TYPE_SFIXED32: return json_integer(*(const int32_t *)p);
  case PROTOBUF_C_TYPE_UINT32:
  case PROTOBUF_C_TYPE_FIXED32: return json_integer(*(const uint32_t *)p);
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64: return json_integer(*(const int64_t *)p);
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64: return json_integer((json_int_t) * (const uint64_t *)p);
  case PROTOBUF_C_TYPE_FLOAT: return real_or_null(*(const float *)p);
  case PROTOBUF_C_TYPE_DOUBLE: return real_or_null(*(const double *)p);
  case PROTOBUF_C_TYPE_BOOL: return json_boolean(*(const protobuf_c_boolean *)p);
  case PROTOBUF_C_TYPE_ENUM: {
    int v = *(const int *)p;
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
    return ev ? json_string(ev->name) : json_integer(v);
  }
  case PROTOBUF_C_TYPE_STRING: {
    /* proto3 strings are UTF-8, but protobuf-c does not check: whatever
     * came over the wire is shown, its bad bytes as U+FFFD */
    const char *s = *(char *const *)p;
    if (!s || mega_utf8_valid(s)) return json_string(s ? s : "");
    char *fixed = mega_utf8_sanitize(s);
    json_t *j = fixed ? json_string(fixed) : NULL;
    free(fixed);
    return j;
  }
  case PROTOBUF_C_TYPE_BYTES: return base64(p);
  case PROTOBUF_C_TYPE_MESSAGE: {
    const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
    return m ? mega_pb_json(m) : json_null();
  }
  }
  return json_null();
}

static json_t *field_json(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  const char *base = (const char *)m;
  if (f->label != PROTOBUF_C_LABEL_REPEATED) return value_json(f, base + f->offset);
  json_t *a = json_array();
  if (!a) return NULL;
  size_t n = *(const size_t *)(base + f->quantifier_offset);
  const char *items = *(char *const *)(base + f->offset);
  size_t sz = elem_size(f->type);
  for (size_t i = 0; i < n; i++)
    if (json_array_append_new(a, value_json(f, items + i * sz)) != 0) {
      json_decref(a);
      return NULL;
    }
  return a;
}

json_t *mega_pb_json(const ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  json_t *o = json_object();
  if (!o) return NULL;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
      uint32_t which = *(const uint32_t *)((const char *)m + f->quantifier_offset);
      if (which != f->id) continue;
    }
    if (set(o, f->name, field_json(m, f))) {
      json_decref(o);
      return NULL;
    }
  }
  return o;
}
