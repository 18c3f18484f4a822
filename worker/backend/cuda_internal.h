/* Inside the cuda module only. */
#ifndef MEGA_WORKER_CUDA_INTERNAL_H
#define MEGA_WORKER_CUDA_INTERNAL_H

#include "worker/backend/cuda_module.h"

#include <cuda_runtime_api.h>

mega_status mega_cuda_backend_create(int device, mega_backend **out, mega_err *err);
/* be's compute stream, or NULL when be is not this module's backend. */
cudaStream_t mega_cuda_backend_stream(mega_backend *be);
/* [p, p + bytes) of be's device memory is about to be written outside its
 * ops (NCCL): its kept bf16 copies there go (cuda_b16.h). */
void mega_cuda_backend_wrote(mega_backend *be, const void *p, size_t bytes);
mega_status mega_cuda_nccl_create(const mega_cuda_rendezvous *rv, const char *group, int rank,
                                  int size, mega_backend *be, int timeout_ms,
                                  const mega_comm_ops **ops, void **impl, mega_err *err);

#endif
