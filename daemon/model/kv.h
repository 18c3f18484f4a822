/* The daemon's key-value store: the rendezvous that workers' Gloo stores
 * talk to, through their daemon, on the job's coordinator. Keys are strings,
 * values are bytes. A wait is answered when its key is set, or fails when its
 * timer fires or the key's prefix is deleted.
 *
 * Single-threaded: call everything on the loop thread. The store copies keys
 * and values; a value passed to a callback is valid during the call only.
 *
 * Cost: a set, get or wait is O(1) (keys hashed, each key's waits kept with
 * it), so a rendezvous of R ranks costs O(R) however many wait at once; a
 * cancel walks the pending waits, and delete_prefix the whole store. */
#ifndef MEGA_DAEMON_KV_H
#define MEGA_DAEMON_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/status.h"

typedef struct mega_kv mega_kv;

/* s is MEGA_OK with the value, MEGA_ERR_TIMEOUT, or MEGA_ERR_CANCELLED (the
 * wait was cancelled, its prefix deleted, or the store freed). */
typedef void (*mega_kv_wait_cb)(void *ctx, mega_status s, const uint8_t *val, size_t len);

mega_kv *mega_kv_new(uv_loop_t *loop);

/* Frees the store; pending waits are answered MEGA_ERR_CANCELLED first.
 * Their timers close on the loop's next turn, so keep running the loop. */
void mega_kv_free(mega_kv *kv);

/* Sets (or replaces) a key and answers every wait on it. */
mega_status mega_kv_set(mega_kv *kv, const char *key, const void *val, size_t len, mega_err *err);

/* Looks a key up without waiting. */
bool mega_kv_get(mega_kv *kv, const char *key, const uint8_t **val, size_t *len);

/* Part `part` of a value taken as `parts` equal slices (parts 0: all of it):
 * *out points into val. INVALID when part >= parts or len is not a multiple
 * of parts. */
mega_status mega_kv_slice(const uint8_t *val, size_t len, uint32_t parts, uint32_t part,
                          const uint8_t **out, size_t *out_len, mega_err *err);

/* Answers cb exactly once: at once if the key is there, else when it is set
 * or after timeout_ms (<= 0: wait until set or cancelled). Returns an id for
 * mega_kv_cancel; 0 when cb was already called. */
uint64_t mega_kv_wait(mega_kv *kv, const char *key, int timeout_ms, mega_kv_wait_cb cb,
                      void *ctx);

/* Cancels a pending wait (its cb gets MEGA_ERR_CANCELLED); unknown ids are ignored. */
void mega_kv_cancel(mega_kv *kv, uint64_t id);

/* Removes every key with the prefix and cancels the waits on such keys; a
 * job's keys go when the job ends. */
void mega_kv_delete_prefix(mega_kv *kv, const char *prefix);

size_t mega_kv_size(const mega_kv *kv);
size_t mega_kv_pending(const mega_kv *kv);

#endif
