/* Inside the cuda module only. */
#ifndef MEGA_WORKER_CUDA_INTERNAL_H
#define MEGA_WORKER_CUDA_INTERNAL_H

#include "worker/backend/cuda_module.h"

mega_status mega_cuda_backend_create(int device, mega_backend **out, mega_err *err);

#endif
