/* Causal attention through cuDNN's fused flash kernels (the backend graph
 * API, cuDNN 9), for the cuda backend under --bf16 (cuda_sdpa.c).
 *
 * libcudnn.so.9 is loaded with dlopen on first use, so the cuda module
 * loads without it and a machine without cuDNN keeps the flash kernels
 * (kernels/flash_mma.cu). A graph is the composition cuDNN's runtime
 * fusion recognises as scaled dot-product attention (the one
 * cudnn-frontend's composite SDPA node lowers to): S = Q K^T, a scale, the
 * causal mask, softmax with its statistics (log-sum-exp), O = P V; the
 * backward recomputes P from the statistics.
 *
 * Two steps, so that the first can be tested on a machine without a
 * device: mega_sdpa_build makes and finalizes every tensor and operation
 * (cuDNN checks their shapes then); mega_sdpa_plan asks cuDNN's heuristics
 * for an engine on a handle, which needs the device. Only what a GPT or a
 * Llama layer needs: causal, no dropout, no bias, bf16 in and out, fp32
 * statistics. */
#ifndef MEGA_WORKER_CUDNN_SDPA_H
#define MEGA_WORKER_CUDNN_SDPA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The loaded library: NULL with why filled when it cannot be loaded. Once
 * per process; never unloaded. */
typedef struct mega_cudnn mega_cudnn;
const mega_cudnn *mega_cudnn_load(char *why, size_t cap);
size_t mega_cudnn_version(const mega_cudnn *api); /* 91900 for 9.19.0 */

/* Whether cuDNN `version` runs these graphs right, as cudnn-frontend
 * decides: 9.10.2 or later (9.10.0 and 9.10.1 have known SDPA bugs, both
 * ways), and through 9.15 a backward only where T is a multiple of 128
 * (cudnn-frontend adds a padding mask for other lengths there; these
 * graphs have none, so the flash kernels take those shapes). T <= 0: the
 * version alone. false with why. */
bool mega_sdpa_version_takes(size_t version, int64_t T, bool backward, char *why, size_t cap);

/* A cuDNN handle on a stream (cudaStream_t); NULL with why without a device. */
void *mega_cudnn_handle(const mega_cudnn *api, void *stream, char *why, size_t cap);
void mega_cudnn_handle_free(const mega_cudnn *api, void *handle);

/* Layouts as backend.h's attention: row n = b*T + t of q holds the NH
 * heads' hs values at q + n*ldq; k and v hold G heads (G divides NH:
 * grouped-query attention when fewer) at ldkv; o, dout: ldo; the
 * gradients dq, dk, dv: ldg. All in bf16 elements. */
typedef struct mega_sdpa_shape {
  int64_t B, T, NH, G, hs;
  int64_t ldq, ldkv, ldo, ldg;
  float scale; /* 1/sqrt(hs) */
} mega_sdpa_shape;

typedef struct mega_sdpa mega_sdpa;

/* The forward (backward false) or the backward graph of shape, its
 * operations finalized. NULL with why on a failure. */
mega_sdpa *mega_sdpa_build(const mega_cudnn *api, const mega_sdpa_shape *shape, bool backward,
                           char *why, size_t cap);
int mega_sdpa_op_count(const mega_sdpa *g);
void mega_sdpa_free(mega_sdpa *g);

/* An execution plan on handle: false with why when no engine takes the
 * graph (the caller keeps its own kernels). */
bool mega_sdpa_plan(mega_sdpa *g, void *handle, char *why, size_t cap);
/* Device memory run needs besides its tensors (after mega_sdpa_plan):
 * cuDNN's workspace and, for the backward, the softmax sums and the fp32
 * dQ accumulator it keeps there. */
size_t mega_sdpa_workspace(const mega_sdpa *g);

/* Device pointers. stats: fp32 [B, NH, T] (log-sum-exp of each row's
 * scaled scores, natural log), written by the forward, read by the
 * backward. The rest bf16 in the layouts above. */
typedef struct mega_sdpa_io {
  const void *q, *k, *v;
  void *o;          /* written by the forward, read by the backward */
  float *stats;
  const void *dout; /* backward */
  void *dq, *dk, *dv;
  void *workspace; /* mega_sdpa_workspace bytes, 16-byte aligned */
} mega_sdpa_io;

/* Runs the plan on the handle's stream; false with why. */
bool mega_sdpa_run(mega_sdpa *g, void *handle, const mega_sdpa_io *io, char *why, size_t cap);

#endif
