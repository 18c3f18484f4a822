/* JSON forms of mega's messages, shared by megactl and megad so that
 * `megactl watch --json` and `megad run --json` print the same lines.
 *
 *   mega_step_metrics_json  the fixed form of one merged step, one object
 *                           per line in --json output (keys below)
 *   mega_pb_json            any message, generically from its descriptor
 *                           (megactl status/ls/nodes --json)
 *
 * Non-finite doubles (a NaN loss) become null: JSON has no NaN.
 * Both return a new reference (the caller's to json_decref), or NULL when
 * out of memory. */
#ifndef MEGA_PROTO_PB_JSON_H
#define MEGA_PROTO_PB_JSON_H

#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

#include "proto/mega.pb-c.h"

/* Exactly these keys, in this order:
 *   iteration, attempt, loss, grad_norm, lr, step_time_s, tokens_per_s,
 *   eval_loss (only after an evaluation), final_eval_loss and test_loss
 *   (only on the last iteration, after the evaluation after training), skipped (true, only when the
 *   optimizer skipped the step),
 *   ranks: [{rank, pp_rank, dp_rank, tp_rank, compute_s, tp_comm_s, bubble_s,
 *            p2p_wait_s, grad_sync_exposed_s, peak_activation_bytes,
 *            param_bytes, grad_bytes, optimizer_state_bytes, step_time_s,
 *            bubble_warmup_s, bubble_steady_s, bubble_cooldown_s,
 *            peak_inflight}] */
json_t *mega_step_metrics_json(const Mega__V1__StepMetrics *m);

/* Writes mega_step_metrics_json(m) to f as one compact line (doubles with
 * 17 significant digits, so they read back exactly) and flushes f: the
 * --json line of `megactl watch` and `megad run`. False when memory ran out
 * or the write failed. */
bool mega_step_metrics_write(FILE *f, const Mega__V1__StepMetrics *m);

/* Every field under its .proto name (snake_case), defaults included; enums
 * by value name ("JOB_STATE_RUNNING"); 64-bit integers as JSON numbers;
 * bytes as base64; an unset message field as null; of a oneof, only the
 * member that is set. */
json_t *mega_pb_json(const ProtobufCMessage *m);

#endif
