/* etcd's v3 methods that megad calls, as method tables for the rpc wrapper
 * (proto/etcd.proto). Watch and LeaseKeepAlive are bidirectional streams in
 * etcd; we send one request and half-close, so they are server streams here
 * (see daemon/etcd/etcd.h). */
#ifndef MEGA_PROTO_ETCD_RPC_H
#define MEGA_PROTO_ETCD_RPC_H

#include "proto/etcd.pb-c.h"
#include "proto/rpc.h"

extern const mega_rpc_method etcd_kv_range;
extern const mega_rpc_method etcd_kv_put;
extern const mega_rpc_method etcd_kv_delete_range;
extern const mega_rpc_method etcd_kv_txn;
extern const mega_rpc_method etcd_watch_watch;            /* server stream */
extern const mega_rpc_method etcd_lease_grant;
extern const mega_rpc_method etcd_lease_revoke;
extern const mega_rpc_method etcd_lease_keep_alive;       /* server stream */
extern const mega_rpc_method etcd_auth_authenticate;

#endif
