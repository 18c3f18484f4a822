/* The rendezvous store as a service: the key-value store (daemon/model/kv.h) that
 * workers' Gloo stores reach through their daemon, waits on several keys
 * with one deadline, and the Peer KvSet/KvGet/KvWait/KvGather calls through
 * which other nodes' workers reach it on the job's coordinator.
 *
 * On the loop thread only. Ownership: owns the store; borrows its base. */
#ifndef MEGA_DAEMON_KVSERVE_H
#define MEGA_DAEMON_KVSERVE_H

#include <stddef.h>

#include "daemon/base.h"
#include "daemon/model/kv.h"
#include "proto/rpc_server.h"

typedef struct megad_kvserve {
  megad_base *b;
  mega_kv *kv;
} megad_kvserve;

mega_status megad_kvserve_init(megad_kvserve *ks, megad_base *b, mega_err *err);
void megad_kvserve_free(megad_kvserve *ks);
void megad_kvserve_register(megad_kvserve *ks, mega_rpc_server *srv);

typedef struct megad_kvwait megad_kvwait;
/* s: MEGA_OK, MEGA_ERR_TIMEOUT or MEGA_ERR_CANCELLED; msg says which key. */
typedef void (*megad_kvwait_fn)(void *arg, mega_status s, const char *msg);
/* Waits until every key exists, or timeout_ms (<= 0: no limit). May call fn
 * before returning (and then returns NULL). */
megad_kvwait *megad_kvwait_start(megad_kvserve *ks, char *const *keys, size_t n, int timeout_ms,
                                 megad_kvwait_fn fn, void *arg);
/* fn is not called after this. */
void megad_kvwait_cancel(megad_kvwait *w);

/* A gather (a rank's part of a group's rendezvous in one request,
 * proto/mega.proto KvGatherRequest), for the Peer call here and this node's
 * own workers in the launcher: check it, make its set, spell its keys out
 * (prefix + key; free with megad_kv_gather_keys_free; NULL when out of
 * memory), and once they exist, its values: out[i] points into the store,
 * valid until it changes. */
mega_status megad_kv_gather_check(const Mega__V1__KvGatherRequest *g, mega_err *err);
mega_status megad_kv_gather_set(megad_kvserve *ks, const Mega__V1__KvGatherRequest *g,
                                mega_err *err);
char **megad_kv_gather_keys(const Mega__V1__KvGatherRequest *g);
void megad_kv_gather_keys_free(char **keys, size_t n);
mega_status megad_kv_gather_values(megad_kvserve *ks, char *const *keys, size_t n,
                                   uint32_t parts, const uint32_t *part,
                                   ProtobufCBinaryData *out, mega_err *err);

#endif
