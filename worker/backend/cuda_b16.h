/* --bf16's rounded copies, kept while their source is unchanged (inside
 * the cuda module only).
 *
 * A GEMM under --bf16 reads bf16 copies of its fp32 inputs. The same
 * buffer is an input more than once: an activation in the forward and in
 * the weight gradient, an output gradient in the input and the weight
 * gradients, a weight in every micro batch's forward and backward until
 * the optimizer steps. So the copy of (x, n) is kept and handed out again
 * until something writes into [x, x + n): every op of the cuda backend,
 * and every NCCL operation of the module, says what it is about to write
 * (mega_cu_b16_wrote) before it is enqueued. An op whose whole output is
 * a GEMM's next input (a norm's, GELU's, the classifier's gradient) puts
 * the copy instead (mega_cu_b16_put) and writes it in the same kernel,
 * sparing the GEMM a rounding pass. Copies are stream-ordered
 * (cudaMallocAsync on the compute stream, which every reader is on), so
 * dropping one never frees memory a queued GEMM still reads.
 *
 * The budget bounds the bytes kept (and the pool's reserve); past it the
 * least recently used go, and a copy that finds no memory at all is made
 * in the caller's scratch instead. Ops and NCCL operations must be posted
 * from one thread (the rank's training thread): a copy handed out is kept
 * from eviction only until that thread's op is queued. A copy is the same
 * bits whether it is new, kept or put (a producer writes
 * mega_bf16_bits of the very fp32 value it stores, as mega_cu_to_bf16
 * would round it), so results do not depend on what the cache held. */
#ifndef MEGA_WORKER_CUDA_B16_H
#define MEGA_WORKER_CUDA_B16_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

typedef struct mega_cu_b16 mega_cu_b16;

/* NULL when the device has no stream-ordered allocator (the caller then
 * rounds into scratch each time). */
mega_cu_b16 *mega_cu_b16_create(int device, cudaStream_t stream, size_t budget);
void mega_cu_b16_destroy(mega_cu_b16 *c);

/* x's n floats as bf16 (on 256 bytes): the kept copy, or a new one
 * rounded on the stream. NULL with *cuda_err set after a CUDA failure;
 * NULL with *cuda_err 0 when there is no room even after letting every
 * other copy go, or n is 0: the caller rounds into scratch of its own. */
const uint16_t *mega_cu_b16_get(mega_cu_b16 *c, const float *x, size_t n, int *cuda_err);

/* x's n floats are about to be written, by a kernel that also fills the
 * returned buffer (n bf16, on 256 bytes) with every value's bf16 bits:
 * copies of anything in [x, x + n) go and the new one is kept as get's.
 * NULL (no room, n 0, no cache; *cuda_err set after a CUDA failure): the
 * kernel writes fp32 only and a GEMM's get rounds later. */
uint16_t *mega_cu_b16_put(mega_cu_b16 *c, const float *x, size_t n, int *cuda_err);

/* [p, p + bytes) is about to be written: copies of anything in it go. */
void mega_cu_b16_wrote(mega_cu_b16 *c, const void *p, size_t bytes);

/* Every copy goes (memory freed or allocated, --bf16 switched). */
void mega_cu_b16_clear(mega_cu_b16 *c);
/* Every copy but the pinned ones (the last few gets: an op inside
 * bf16_copy may hold one whose GEMM is not queued yet) goes, and the
 * memory is handed back to the device (synchronizes): before an
 * allocation outside the pool gives up for lack of memory. */
void mega_cu_b16_release(mega_cu_b16 *c);

#endif
