#include "proto/etcd_rpc.h"

#define METHOD(var, service, name, req, resp, kind)                                   \
  const mega_rpc_method var = {"/etcdserverpb." service "/" name,                    \
                               &etcdserverpb__##req##__descriptor,                  \
                               &etcdserverpb__##resp##__descriptor, kind}

METHOD(etcd_kv_range, "KV", "Range", range_request, range_response, MEGA_RPC_UNARY);
METHOD(etcd_kv_put, "KV", "Put", put_request, put_response, MEGA_RPC_UNARY);
METHOD(etcd_kv_delete_range, "KV", "DeleteRange", delete_range_request, delete_range_response, MEGA_RPC_UNARY);
METHOD(etcd_kv_txn, "KV", "Txn", txn_request, txn_response, MEGA_RPC_UNARY);
METHOD(etcd_watch_watch, "Watch", "Watch", watch_request, watch_response, MEGA_RPC_SERVER_STREAM);
METHOD(etcd_lease_grant, "Lease", "LeaseGrant", lease_grant_request, lease_grant_response, MEGA_RPC_UNARY);
METHOD(etcd_lease_revoke, "Lease", "LeaseRevoke", lease_revoke_request, lease_revoke_response, MEGA_RPC_UNARY);
METHOD(etcd_auth_authenticate, "Auth", "Authenticate", authenticate_request,
       authenticate_response, MEGA_RPC_UNARY);
METHOD(etcd_lease_keep_alive, "Lease", "LeaseKeepAlive", lease_keep_alive_request, lease_keep_alive_response, MEGA_RPC_SERVER_STREAM);
