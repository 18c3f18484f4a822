/* The GPUs the cuda module sees, for a program that offers them as slots
 * (megad) and needs nothing else of the backend: no CUDA header, no
 * backend.h. Implemented by the loader (cuda_load.c). */
#ifndef MEGA_WORKER_BACKEND_CUDA_DEVICES_H
#define MEGA_WORKER_BACKEND_CUDA_DEVICES_H

#include <stddef.h>

/* How many GPUs the module sees (0 without the module or a driver), and in
 * name a line for logs and `megactl nodes`: "2 x NVIDIA H100 80GB HBM3 (79 GiB)"
 * (empty when there are none). */
int mega_cuda_devices_describe(char *name, size_t cap);

#endif
