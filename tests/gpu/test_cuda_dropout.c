/* test_cuda_backend's attention dropout: the cuda backend's attention with
 * a mask (the batched GEMMs and mega_kb_attn_dropout, attn_gemm.c) against
 * the cpu backend's, forward and backward, fp32 and under --bf16, where a
 * shape flash attention or cuDNN would take without the mask must run the
 * GEMMs instead, in buffers exactly as large as attention_sizes says for
 * dims that carry the mask; and buffers sized without it refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dropout.h"
#include "tests/gpu/cuda_check.h"

static mega_attn_dropout mask(int head0) {
  return mega_attn_dropout_of(0.2, mega_dropout_key(7, 3, MEGA_DROP_ATTN_PROBS), 41, head0);
}

/* One shape on be (cuda) against the cpu backend, both under bf16 or not:
 * q, k, v views of one fused buffer (GPT-2's) or separate (grouped-query). */
static void drop_case(mega_backend *be, const char *path, bool bf16, int B_, int T_, int NH_,
                      int G_, int hs, bool fused) {
  mega_err err = {0};
  size_t N_ = (size_t)B_ * T_, nq = N_ * NH_ * hs, nk = N_ * G_ * hs;
  int ldq = fused ? NH_ * hs + 2 * G_ * hs : NH_ * hs, ldkv = fused ? ldq : G_ * hs;
  size_t nall = fused ? N_ * ldq : nq + 2 * nk, tt = (size_t)B_ * NH_ * T_ * T_;
  mega_attn_dims ad = {.B = B_, .T = T_, .NH = NH_, .G = G_, .hs = hs, .ldq = ldq,
                       .ldkv = ldkv, .drop = mask(NH_)};
  char what[160];
  snprintf(what, sizeof what, "%s attention dropout%s B%d T%d NH%d G%d hs%d%s", path,
           bf16 ? " --bf16" : "", B_, T_, NH_, G_, hs, fused ? " fused qkv" : "");
  if (be->ops->set_bf16(be, bf16, &err) || cpu->ops->set_bf16(cpu, bf16, &err)) {
    printf("FAIL %s: set_bf16: %s\n", what, err.msg);
    failures++;
    return;
  }
  /* the batched GEMMs' full sizes, however the shape would run unmasked */
  be->ops->attention_sizes(be, &ad, &ad.att_cap, &ad.scratch_cap);
  if (ad.att_cap != tt || ad.scratch_cap != tt + nq) {
    printf("FAIL %s sizes: att %zu, scratch %zu\n", what, ad.att_cap, ad.scratch_cap);
    failures++;
  }
  float *x = vec(nall, 51 + hs, 1), *dy = vec(nq, 53, 1);
  const float *q = x, *k = fused ? x + NH_ * hs : x + nq;
  const float *v = fused ? x + (NH_ + G_) * hs : x + nq + nk;
  size_t ko = (size_t)(k - x), vo = (size_t)(v - x);
  float *att = calloc(tt, 4), *scr = calloc(tt + nq, 4), *y = calloc(nq, 4), *g = calloc(nall, 4);
  float *gx = up(x, nall * 4), *gdy = up(dy, nq * 4), *gatt = dev_zero(ad.att_cap * 4);
  float *gscr = dev_zero(ad.scratch_cap * 4), *gy = dev_zero(nq * 4), *gg = dev_zero(nall * 4);
  cpu->ops->attention_forward(cpu, y, att, scr, q, k, v, &ad);
  be->ops->attention_forward(be, gy, gatt, gscr, gx, gx + ko, gx + vo, &ad);
  cpu->ops->attention_backward(cpu, g, g + ko, g + vo, scr, dy, q, k, v, att, &ad);
  be->ops->attention_backward(be, gg, gg + ko, gg + vo, gscr, gdy, gx, gx + ko, gx + vo, gatt,
                               &ad);
  if (be->ops->synchronize(be, &err)) {
    printf("FAIL %s: %s\n", what, err.msg);
    failures++;
  } else {
    same(what, gy, y, nq, 1e-4);
    same(strcat(what, " backward"), gg, g, nall, 1e-3);
  }
  be->ops->set_bf16(be, false, &err);
  cpu->ops->set_bf16(cpu, false, &err);
  free(x), free(dy), free(att), free(scr), free(y), free(g);
}

void test_attention_dropout(const mega_cuda_module *m) {
  for (int bf16 = 0; bf16 < 2; bf16++) {
    drop_case(gpu, "cuda", bf16, Bt, T, NH, 2, C / NH, false); /* grouped-query */
    drop_case(gpu, "cuda", bf16, 2, 130, 2, 2, 64, true);      /* a flash shape unmasked */
    drop_case(gpu, "cuda", bf16, 1, 200, 4, 2, 128, false);
  }
  /* cuDNN required: the mask still takes the GEMMs, never cuDNN's own.
   * (Outside test_cudnn_attention's markers: the kit turns cuDNN's
   * attention off only for a failure inside them.) */
  mega_err err = {0};
  mega_backend *dnn;
  if (strstr(m->versions(), ", cuDNN 9.")) {
    setenv("MEGA_CUDNN_ATTENTION", "require", 1);
    if (m->backend_create(0, &dnn, &err)) {
      printf("FAIL creating a backend under MEGA_CUDNN_ATTENTION=require: %s\n", err.msg);
      failures++;
    } else {
      drop_case(dnn, "MEGA_CUDNN_ATTENTION=require", true, 2, 256, 4, 2, 64, false);
      mega_backend_destroy(dnn);
    }
    setenv("MEGA_CUDNN_ATTENTION", "off", 1);
  }
  attention_sizes_guard(m, true, "size them with attention_sizes on dims that carry");
}
