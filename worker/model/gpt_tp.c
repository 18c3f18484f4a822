/* A stage's tensor-parallel linears and the dropout around them (gpt_tp.h). */
#include "worker/model/gpt_tp.h"

mega_status gpt_gather_rows(mega_gpt_stage *s, mega_gpt_acts *a, float *whole, mega_err *err) {
  if (!gpt_sp_on(s)) return MEGA_OK;
  size_t n = (size_t)a->R * s->cfg.channels;
  return s->desc.tp.ops->all_gather(s->desc.tp.ctx, gpt_my_rows(s, a, whole), whole, n, err);
}

mega_status gpt_gather_into(mega_gpt_stage *s, mega_gpt_acts *a, const float *rows,
                            float *whole, mega_err *err) {
  if (!gpt_sp_on(s)) return MEGA_OK;
  size_t n = (size_t)a->R * s->cfg.channels;
  return s->desc.tp.ops->all_gather(s->desc.tp.ctx, rows, whole, n, err);
}

mega_status gpt_reduce_rows(mega_gpt_stage *s, mega_gpt_acts *a, float *out, mega_err *err) {
  if (!gpt_tp_on(s)) return MEGA_OK;
  size_t rc = (size_t)a->R * s->cfg.channels;
  if (gpt_sp_on(s)) return s->desc.tp.ops->reduce_scatter(s->desc.tp.ctx, a->partial, out, rc, err);
  return s->desc.tp.ops->all_reduce(s->desc.tp.ctx, out, rc, err);
}

mega_dropout gpt_drop_of(const mega_gpt_stage *s, const mega_gpt_acts *a, int l, int site,
                         int64_t row0) {
  int layer = l < 0 ? -1 : s->desc.first_layer + l;
  return mega_dropout_of(s->cfg.hidden_dropout, mega_dropout_key(s->cfg.seed, layer, site),
                         a->fwd_sample, row0, a->T);
}

mega_status gpt_row_parallel_forward(mega_gpt_stage *s, mega_gpt_acts *a, float *out,
                                     const float *in, const float *w, const float *bias,
                                     const float *x, int K, int l, int site, mega_err *err) {
  const mega_backend_ops *o = s->be->ops;
  int N = a->B * a->T, C = s->cfg.channels;
  bool drop = gpt_drop_on(s, a);
  if (!gpt_tp_on(s) && !drop) {
    o->matmul_forward(s->be, out, in, w, bias, x, N, K, C, s->lay);
    return MEGA_OK;
  }
  o->matmul_forward(s->be, gpt_partial_for(s, a, out), in, w, NULL, NULL, N, K, C, s->lay);
  mega_status st = gpt_reduce_rows(s, a, out, err);
  if (st) return st;
  if (drop) {
    mega_dropout d = gpt_drop_of(s, a, l, site, gpt_stream_row0(s, a));
    o->bias_dropout_add(s->be, out, x, out, bias, a->R, C, &d);
  } else {
    o->bias_residual_forward(s->be, out, x, out, bias, a->R, C);
  }
  return MEGA_OK;
}

mega_status gpt_out_grad(mega_gpt_stage *s, mega_gpt_acts *a, const float *dy, float *dall,
                         int l, int site, mega_err *err) {
  mega_backend *be = s->be;
  int N = a->B * a->T, C = s->cfg.channels;
  mega_status st = gpt_gather_into(s, a, dy, dall, err);
  if (st) return st;
  const float *src = gpt_sp_on(s) ? dall : dy;
  if (gpt_drop_on(s, a)) {
    mega_dropout d = gpt_drop_of(s, a, l, site, 0);
    be->ops->bias_dropout_add(be, dall, NULL, src, NULL, N, C, &d);
  } else if (src != dall) { /* dropout's buffers, in an evaluation forward's backward */
    return be->ops->memcpy(be, dall, src, (size_t)N * C * sizeof(float), MEGA_COPY_D2D, err);
  }
  return MEGA_OK;
}

mega_status gpt_column_parallel_backward(mega_gpt_stage *s, mega_gpt_acts *a, float *din,
                                         const gpt_col_grad *g, int n, mega_err *err) {
  int N = a->B * a->T, C = s->cfg.channels;
  for (int i = 0; i < n; i++)
    s->be->ops->matmul_backward_input(s->be, gpt_partial_for(s, a, din), g[i].dout,
                                      s->param + g[i].w, N, C, g[i].K, s->lay, i > 0);
  return gpt_reduce_rows(s, a, din, err);
}
