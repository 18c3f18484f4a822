/* MEGA_HD marks element math shared by the CUDA kernels and the cpu
 * backend: __host__ __device__ under nvcc, nothing in C. */
#ifndef MEGA_KERNELS_HD_H
#define MEGA_KERNELS_HD_H

#ifdef __CUDACC__
#define MEGA_HD __host__ __device__
#else
#define MEGA_HD
#endif

#endif
