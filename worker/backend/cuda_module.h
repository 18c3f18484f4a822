/* The cuda module's interface: what megaw (and megad, for discovery) find
 * in libmega_cuda.so with dlopen, so that neither links a CUDA library and
 * one build runs on machines without GPUs. The module exports one symbol,
 * mega_cuda_module_v1, a table of these functions; the loader checks abi.
 *
 * The loader (cuda_load.c) looks for the module in $MEGA_CUDA_MODULE, then
 * beside the running program, then on the library path. */
#ifndef MEGA_WORKER_CUDA_MODULE_H
#define MEGA_WORKER_CUDA_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/comm/comm_impl.h"

/* 4: ops_bytes, so a module whose backend.h ops table differs is refused
 * even when nobody bumped this (the fused classifier and init_normal grew
 * it under 3). */
#define MEGA_CUDA_MODULE_ABI 4
#define MEGA_CUDA_MODULE_SYMBOL "mega_cuda_module_v1"

typedef struct mega_cuda_device {
  char name[96];
  uint64_t memory_bytes;
  int sm_major, sm_minor;
} mega_cuda_device;

/* Where an NCCL group's ranks share rank 0's unique id (megaw passes its
 * rendezvous store, comm.h's mega_store_set and mega_store_get). */
typedef struct mega_cuda_rendezvous {
  void *ctx;
  mega_status (*set)(void *ctx, const char *group, const char *key, const void *value,
                     size_t len, mega_err *err);
  mega_status (*get)(void *ctx, const char *group, const char *key, void **value, size_t *len,
                     int timeout_ms, mega_err *err);
} mega_cuda_rendezvous;

typedef struct mega_cuda_module {
  int abi;          /* MEGA_CUDA_MODULE_ABI */
  size_t ops_bytes; /* sizeof(mega_backend_ops) as the module was built */
  /* Usable devices; 0 with a message in err (no driver, none present). */
  int (*device_count)(mega_err *err);
  mega_status (*device_info)(int device, mega_cuda_device *out, mega_err *err);
  /* The backend on one device (backend.h; mega_backend_destroy frees it). */
  mega_status (*backend_create)(int device, mega_backend **out, mega_err *err);
  /* The versions it was built with, for logs: "CUDA 13.0, cuBLAS ..., NCCL 2.28.9". */
  const char *(*versions)(void);
  /* An NCCL communicator (comm_impl.h) of rank of size, ordered after be's
   * compute stream (be must be this module's backend); the caller wraps it
   * with mega_comm_wrap. Device memory only. */
  mega_status (*nccl_create)(const mega_cuda_rendezvous *rv, const char *group, int rank,
                             int size, mega_backend *be, int timeout_ms,
                             const mega_comm_ops **ops, void **impl, mega_err *err);
} mega_cuda_module;

/* Loads the module (once per process). Fails with MEGA_ERR_UNSUPPORTED and
 * a line that says where it looked when it is not there. */
mega_status mega_cuda_module_load(const mega_cuda_module **out, mega_err *err);

/* The cuda backend on device, through the module: "no CUDA device: ..."
 * (MEGA_ERR_UNSUPPORTED) when the module or a device is missing. */
mega_status mega_backend_cuda_create(int device, mega_backend **out, mega_err *err);

/* An NCCL communicator through the module, meeting through store (as
 * mega_comm_create does for Gloo); be is the rank's cuda backend. */
mega_status mega_comm_create_nccl(mega_store *store, const char *group, int rank, int size,
                                  mega_backend *be, int timeout_ms, mega_comm **out,
                                  mega_err *err);

#endif
