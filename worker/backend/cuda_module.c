/* libmega_cuda.so's one export: the module table (cuda_module.h). */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "worker/backend/cuda_internal.h"
#include "worker/backend/cudnn_sdpa.h"

static int device_count(mega_err *err) {
  int n = 0; /* cudaGetDeviceCount leaves it unwritten without a driver */
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    mega_fail(err, MEGA_ERR_UNSUPPORTED, "no CUDA device: %s", cudaGetErrorString(e));
    return 0;
  }
  if (n < 1) mega_fail(err, MEGA_ERR_UNSUPPORTED, "no CUDA device: the driver reports none");
  return n;
}

static mega_status device_info(int device, mega_cuda_device *out, mega_err *err) {
  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e != cudaSuccess)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED, "CUDA device %d: %s", device,
                     cudaGetErrorString(e));
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%.95s", p.name);
  out->memory_bytes = (uint64_t)p.totalGlobalMem;
  out->sm_major = p.major;
  out->sm_minor = p.minor;
  return MEGA_OK;
}

/* cuDNN is loaded at run time (cudnn_sdpa.h): the one found, or why none. */
static const char *versions(void) {
  static char buf[400];
  int nccl = 0;
  ncclGetVersion(&nccl);
  char why[300], dnn[320];
  const mega_cudnn *api = mega_cudnn_load(why, sizeof why);
  size_t v = api ? mega_cudnn_version(api) : 0;
  if (api) /* "cuDNN 9.19.0": what test_cuda_backend looks for */
    snprintf(dnn, sizeof dnn, "cuDNN %zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
  else
    snprintf(dnn, sizeof dnn, "no cuDNN (%s)", why);
  snprintf(buf, sizeof buf, "CUDA %d.%d, cuBLAS %d, NCCL %d.%d.%d, %s", CUDART_VERSION / 1000,
           CUDART_VERSION % 1000 / 10, CUBLAS_VERSION, nccl / 10000, nccl / 100 % 100,
           nccl % 100, dnn);
  return buf;
}

__attribute__((visibility("default"))) const mega_cuda_module mega_cuda_module_v1 = {
    .abi = MEGA_CUDA_MODULE_ABI,
    .ops_bytes = sizeof(mega_backend_ops),
    .device_count = device_count,
    .device_info = device_info,
    .backend_create = mega_cuda_backend_create,
    .versions = versions,
    .nccl_create = mega_cuda_nccl_create,
};
