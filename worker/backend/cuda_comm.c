/* An NCCL communicator through the cuda module (cuda_module.h): its unique
 * id shared through the rank's rendezvous store. Apart from cuda_load.c so
 * that megad, which links no communicator, can load the module too. */
#include "worker/backend/cuda_module.h"

static mega_status rv_set(void *ctx, const char *group, const char *key, const void *value,
                          size_t len, mega_err *err) {
  return mega_store_set(ctx, group, key, value, len, err);
}

static mega_status rv_get(void *ctx, const char *group, const char *key, void **value,
                          size_t *len, int timeout_ms, mega_err *err) {
  return mega_store_get(ctx, group, key, value, len, timeout_ms, err);
}

mega_status mega_comm_create_nccl(mega_store *store, const char *group, int rank, int size,
                                  mega_backend *be, int timeout_ms, mega_comm **out,
                                  mega_err *err) {
  *out = NULL;
  const mega_cuda_module *m;
  mega_status st = mega_cuda_module_load(&m, err);
  if (st != MEGA_OK) return st;
  mega_cuda_rendezvous rv = {.ctx = store, .set = rv_set, .get = rv_get};
  const mega_comm_ops *ops;
  void *impl;
  st = m->nccl_create(&rv, group, rank, size, be, timeout_ms, &ops, &impl, err);
  return st == MEGA_OK ? mega_comm_wrap(ops, impl, rank, size, out, err) : st;
}

