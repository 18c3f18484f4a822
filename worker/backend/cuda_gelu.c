/* GPT-2's c_fc and its GELU in one cuBLASLt GEMM each way under --bf16
 * (backend.h, matmul_gelu_*): forward, the GELU_AUX_BIAS epilogue writes
 * the GELU's input and output; backward, the DGELU epilogue multiplies the
 * input gradient by GELU' of the kept input. Each saves a pass over an
 * [N, 4C] activation. Without --bf16, and for shapes cuBLASLt declines,
 * the two ops run as they would apart. */
#include "worker/backend/cuda_impl.h"

void mega_cu__matmul_gelu_forward(mega_backend *be, float *out, float *pre, const float *inp,
                                  const float *w, const float *bias, int N, int C, int OC,
                                  mega_wlayout lay) {
  cuda_impl *c = impl_of(be);
  bool tb = lay == MEGA_W_OUT_IN;
  int ldw = tb ? C : OC;
  if (c->bf16 && c->lt && N > 0 && OC > 0 && C > 0) {
    mega_cu__wrote(be, out, (size_t)N * OC);
    mega_cu__wrote(be, pre, (size_t)N * OC);
    /* never NULL for want of room (scratch then), so the GELU does not
     * change formula with what the kept copies hold */
    const uint16_t *a = mega_cu__bf16_copy(be, 0, inp, (size_t)N * C);
    const uint16_t *b = a ? mega_cu__bf16_copy(be, 1, w, (size_t)C * OC) : NULL;
    /* column-major: out^T [OC, N] = GELU(op(W)^T inp^T + bias), as matmul_forward */
    if (b && mega_cu_lt_gemm_gelu(c->lt, tb, false, OC, N, C, b, ldw, a, C, bias, pre, out, OC) ==
                 CUBLAS_STATUS_SUCCESS)
      return;
  }
  be->ops->matmul_forward(be, pre, inp, w, bias, NULL, N, C, OC, lay);
  be->ops->gelu_forward(be, out, pre, (size_t)N * OC);
}

void mega_cu__matmul_gelu_backward_input(mega_backend *be, float *dpre, const float *dout,
                                         const float *w, const float *pre, int N, int C, int OC,
                                         mega_wlayout lay) {
  cuda_impl *c = impl_of(be);
  bool tb = lay == MEGA_W_IN_OUT;
  int ldw = tb ? OC : C;
  if (c->bf16 && c->lt && N > 0 && C > 0 && OC > 0) {
    mega_cu__wrote(be, dpre, (size_t)N * C);
    const uint16_t *a = mega_cu__bf16_copy(be, 0, dout, (size_t)N * OC);
    const uint16_t *b = a ? mega_cu__bf16_copy(be, 1, w, (size_t)C * OC) : NULL;
    /* column-major: dpre^T [C, N] = (op(W) dout^T) * GELU'(pre^T), as
     * matmul_backward_input */
    if (b && mega_cu_lt_gemm_dgelu(c->lt, tb, false, C, N, OC, b, ldw, a, OC, pre, dpre, C) ==
                 CUBLAS_STATUS_SUCCESS)
      return;
  }
  be->ops->matmul_backward_input(be, dpre, dout, w, N, C, OC, lay, false);
  be->ops->gelu_backward(be, dpre, pre, dpre, (size_t)N * C);
}
