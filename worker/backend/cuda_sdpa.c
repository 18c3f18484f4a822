/* The cuda backend's attention through cuDNN (cudnn_sdpa.h), under --bf16
 * where flash attention would run (cuda_attn.c). Per backend one cuDNN
 * handle; per shape the forward and the backward plans, built together
 * on the shape's first forward, so that a shape either graph declines
 * stays on the flash kernels both ways (said once on stderr).
 *
 * Only where the flash kernels would run (head sizes 64 and 128), so they
 * are the fallback wherever cuDNN is missing or declines a shape; a
 * failure while a plan runs is an error like any op's. MEGA_CUDNN_ATTENTION (read when the backend
 * first attends): "auto" (the default) uses cuDNN where it takes the
 * shape; "off" keeps the flash kernels; "require" fails the op with the
 * reason where cuDNN does not (the device kit's check that it runs).
 *
 * Where cuDNN runs, att holds the rows' log-sum-exp [B*NH*T] (as the flash
 * kernels') and then the bf16 output the backward reads. The gradients
 * come out in bf16 and are widened into dq, dk and dv. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/launch.h"
#include "worker/backend/cuda_impl.h"
#include "worker/backend/cudnn_sdpa.h"

#define SHAPES 16

typedef struct sdpa_shape {
  mega_attn_dims key; /* same_shape ignores the caps */
  mega_sdpa *fwd, *bwd; /* both NULL: cuDNN declined the shape */
} sdpa_shape;

typedef enum { MODE_AUTO, MODE_OFF, MODE_REQUIRE } sdpa_mode;

struct mega_cu_sdpa {
  sdpa_mode mode;
  const mega_cudnn *api;
  void *handle;
  sdpa_shape shapes[SHAPES];
  int nshapes;
  bool said_align, said_full; /* those lines, once each */
  void *ws, *grads; /* the workspace; the bf16 gradients */
  size_t ws_cap, grads_cap;
};

static void fail(mega_backend *be, mega_status st, const char *why) {
  cuda_impl *c = impl_of(be);
  if (c->sticky != MEGA_OK) return;
  c->sticky = st;
  snprintf(c->why, sizeof c->why, "cuda backend: %.440s", why);
}

/* cuDNN will not take a shape (or any): a failure under require; else a
 * line on stderr and the flash kernels (callers say each reason once). */
static void decline(mega_backend *be, struct mega_cu_sdpa *s, const char *why) {
  if (s->mode == MODE_REQUIRE) {
    fail(be, MEGA_ERR_UNSUPPORTED, why);
    return;
  }
  fprintf(stderr, "cuda backend: %s; the flash kernels instead\n", why);
}

/* The backend's state, made on first use; NULL under "off" or without
 * cuDNN or a handle (said, and under "require" a failure). */
static struct mega_cu_sdpa *state(mega_backend *be) {
  cuda_impl *c = impl_of(be);
  if (c->sdpa) return c->sdpa->handle ? c->sdpa : NULL;
  struct mega_cu_sdpa *s = calloc(1, sizeof *s);
  if (!s) { /* sticky: a later call must not decide otherwise than this one */
    fail(be, MEGA_ERR_NOMEM, "cuDNN attention: out of host memory");
    return NULL;
  }
  c->sdpa = s;
  const char *env = getenv("MEGA_CUDNN_ATTENTION");
  s->mode = !env || !*env || !strcmp(env, "auto") ? MODE_AUTO
            : !strcmp(env, "off")                 ? MODE_OFF
            : !strcmp(env, "require")             ? MODE_REQUIRE
                                                  : (sdpa_mode)-1;
  if ((int)s->mode == -1) {
    char why[160];
    snprintf(why, sizeof why, "MEGA_CUDNN_ATTENTION=%.40s: use auto, off or require", env);
    fail(be, MEGA_ERR_INVALID, why);
    return NULL;
  }
  if (s->mode == MODE_OFF) return NULL;
  char why[300];
  if ((s->api = mega_cudnn_load(why, sizeof why)))
    s->handle = mega_cudnn_handle(s->api, c->stream, why, sizeof why);
  if (!s->handle) {
    cudaGetLastError(); /* what a failed cudnnCreate left is not flash's failure */
    decline(be, s, why);
    return NULL;
  }
  return s;
}

static bool same_shape(const mega_attn_dims *a, const mega_attn_dims *b) {
  return a->B == b->B && a->T == b->T && a->NH == b->NH && a->G == b->G && a->hs == b->hs &&
         a->ldq == b->ldq && a->ldkv == b->ldkv;
}

/* The bf16 gradients' rows: dq's NH heads, then dk's and dv's G each. */
static int64_t grads_ld(const mega_attn_dims *d) { return (int64_t)(d->NH + 2 * d->G) * d->hs; }

/* Plans for d, built on first sight; NULL where cuDNN declines it. */
static sdpa_shape *plans(mega_backend *be, struct mega_cu_sdpa *s, const mega_attn_dims *d) {
  for (int i = 0; i < s->nshapes; i++)
    if (same_shape(&s->shapes[i].key, d)) return &s->shapes[i];
  if (s->nshapes == SHAPES) { /* more shapes than a model has: flash */
    if (!s->said_full) decline(be, s, "cuDNN attention: plans for 16 shapes already; more");
    s->said_full = true;
    return NULL;
  }
  sdpa_shape *e = &s->shapes[s->nshapes++];
  e->key = *d;
  mega_sdpa_shape sh = {.B = d->B, .T = d->T, .NH = d->NH, .G = d->G, .hs = d->hs,
                        .ldq = d->ldq, .ldkv = d->ldkv, .ldo = (int64_t)d->NH * d->hs,
                        .ldg = grads_ld(d), .scale = 1.0f / sqrtf(d->hs)};
  char why[300] = "";
  bool ok = (e->fwd = mega_sdpa_build(s->api, &sh, false, why, sizeof why)) &&
            (e->bwd = mega_sdpa_build(s->api, &sh, true, why, sizeof why)) &&
            mega_sdpa_plan(e->fwd, s->handle, why, sizeof why) &&
            mega_sdpa_plan(e->bwd, s->handle, why, sizeof why);
  cudaGetLastError(); /* what cuDNN's probing left is not the next kernel's failure */
  if (ok) return e;
  mega_sdpa_free(e->fwd);
  mega_sdpa_free(e->bwd);
  e->fwd = e->bwd = NULL;
  char msg[440];
  snprintf(msg, sizeof msg, "cuDNN attention B%d T%d NH%d G%d hs%d ldq %d ldkv %d: %s", d->B,
           d->T, d->NH, d->G, d->hs, d->ldq, d->ldkv, why);
  decline(be, s, msg);
  return NULL;
}

static bool on16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The bf16 output's place in att: after the rows' log-sum-exp. */
static uint16_t *out16_of(const float *att, const mega_attn_dims *d) {
  return (uint16_t *)(att + (size_t)d->B * d->NH * d->T);
}

/* cuDNN's plans for d when it takes it: a pure function of the shape and
 * att's alignment, so that the forward and the backward agree. */
static sdpa_shape *takes(mega_backend *be, const mega_attn_dims *d, const float *att) {
  struct mega_cu_sdpa *s = state(be);
  if (!s) return NULL;
  if (!on16(att) || !on16(out16_of(att, d))) {
    if (!s->said_align)
      decline(be, s, "cuDNN attention: att, or its output copy after B*NH*T floats, does not "
                      "start on 16 bytes");
    s->said_align = true;
    return NULL;
  }
  sdpa_shape *e = plans(be, s, d);
  return e && e->fwd ? e : NULL;
}

static void run(mega_backend *be, mega_sdpa *g, mega_sdpa_io *io) {
  struct mega_cu_sdpa *s = impl_of(be)->sdpa;
  size_t bytes = mega_sdpa_workspace(g);
  io->workspace = mega_cu__grow(be, &s->ws, &s->ws_cap, bytes > 256 ? bytes : 256,
                                "cuDNN attention's workspace");
  char why[300];
  if (io->workspace && !mega_sdpa_run(g, s->handle, io, why, sizeof why))
    fail(be, MEGA_ERR_INTERNAL, why);
  mega_cu__note(be, cudaGetLastError(), "cuDNN attention"); /* not the widening's */
}

#define S(be) ((mega_cu_stream)impl_of(be)->stream)

bool mega_cu__sdpa_forward(mega_backend *be, float *out, float *att, const uint16_t *q,
                           const uint16_t *k, const uint16_t *v, const mega_attn_dims *d) {
  sdpa_shape *e = takes(be, d, att);
  if (!e) return false;
  int64_t N = (int64_t)d->B * d->T, C = (int64_t)d->NH * d->hs;
  uint16_t *o16 = out16_of(att, d);
  mega_sdpa_io io = {.q = q, .k = k, .v = v, .o = o16, .stats = att};
  run(be, e->fwd, &io);
  /* out is the projection's input: its bf16 copy is o16's bits again */
  uint16_t *p16 = mega_cu__produced(be, out, (size_t)(N * C));
  mega_cu__filled(be, mega_cu_from_bf16(S(be), out, p16, C, o16, C, N, C),
                  "widening attention's output", out, NULL, (size_t)(N * C));
  if (impl_of(be)->sticky != MEGA_OK) mega_cu__wrote(be, out, (size_t)(N * C)); /* not run */
  return true;
}

/* Where cuDNN writes the bf16 gradients (row stride grads_ld): when dq, dk
 * and dv are one [N, ld] buffer's columns in that order (GPT-2's fused
 * qkv), the bf16 copy the qkv GEMM's backward reads of that buffer, so no
 * rounding pass makes it again; else the glue's scratch. NULL: noted. The
 * put comes after the op's four gets, which cuda_b16.c keeps pinned. */
static uint16_t *grads_out(mega_backend *be, struct mega_cu_sdpa *s, float *dq, float *dk,
                           float *dv, const mega_attn_dims *d) {
  int64_t N = (int64_t)d->B * d->T, C = (int64_t)d->NH * d->hs, Ck = (int64_t)d->G * d->hs;
  int64_t ld = grads_ld(d);
  if (dk == dq + C && dv == dk + Ck && d->ldq == ld && d->ldkv == ld) {
    uint16_t *p = mega_cu__produced(be, dq, (size_t)(N * ld));
    if (p) return p;
  }
  return mega_cu__grow(be, &s->grads, &s->grads_cap, (size_t)(N * ld) * 2,
                       "cuDNN attention's bf16 gradients");
}

bool mega_cu__sdpa_backward(mega_backend *be, float *dq, float *dk, float *dv,
                            const uint16_t *dout, const uint16_t *q, const uint16_t *k,
                            const uint16_t *v, const float *att, const mega_attn_dims *d) {
  sdpa_shape *e = takes(be, d, att);
  if (!e) return false;
  struct mega_cu_sdpa *s = impl_of(be)->sdpa;
  int64_t N = (int64_t)d->B * d->T, C = (int64_t)d->NH * d->hs, Ck = (int64_t)d->G * d->hs;
  int64_t ld = grads_ld(d);
  uint16_t *g = grads_out(be, s, dq, dk, dv, d);
  if (!g) return true; /* noted */
  uint16_t *o16 = out16_of(att, d);
  mega_sdpa_io io = {.q = q, .k = k, .v = v, .o = o16, .stats = (float *)att, .dout = dout,
                     .dq = g, .dk = g + C, .dv = g + C + Ck};
  run(be, e->bwd, &io);
  const char *what = "widening attention's gradients";
  mega_cu__note(be, mega_cu_from_bf16(S(be), dq, NULL, d->ldq, g, ld, N, C), what);
  mega_cu__note(be, mega_cu_from_bf16(S(be), dk, NULL, d->ldkv, g + C, ld, N, Ck), what);
  mega_cu__note(be, mega_cu_from_bf16(S(be), dv, NULL, d->ldkv, g + C + Ck, ld, N, Ck), what);
  if (g != s->grads && impl_of(be)->sticky != MEGA_OK) /* g is dq's copy: only if all ran */
    mega_cu__wrote(be, dq, (size_t)(N * ld));
  return true;
}

void mega_cu__sdpa_destroy(mega_backend *be) {
  struct mega_cu_sdpa *s = impl_of(be)->sdpa;
  if (!s) return;
  for (int i = 0; i < s->nshapes; i++) {
    mega_sdpa_free(s->shapes[i].fwd);
    mega_sdpa_free(s->shapes[i].bwd);
  }
  if (s->ws) cudaFree(s->ws);
  if (s->grads) cudaFree(s->grads);
  mega_cudnn_handle_free(s->api, s->handle);
  free(s);
}
