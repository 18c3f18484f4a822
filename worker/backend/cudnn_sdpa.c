/* cuDNN's fused attention graphs (cudnn_sdpa.h). Built without cuDNN's
 * headers (MEGA_NO_CUDNN, worker/meson.build), loading fails with that
 * reason and the rest is never reached. */
#include "worker/backend/cudnn_sdpa.h"

#include <stdio.h>

bool mega_sdpa_version_takes(size_t version, int64_t T, bool backward, char *why, size_t cap) {
  if (version < 91002) {
    snprintf(why, cap, "cuDNN %zu.%zu.%zu is older than the 9.10.2 the attention graphs need "
             "(9.10.0 and 9.10.1 have known SDPA bugs)", version / 10000, version / 100 % 100,
             version % 100);
    return false;
  }
  if (backward && T > 0 && T % 128 && version < 91600) { /* 9.15.x: every patch */
    snprintf(why, cap, "cuDNN %zu.%zu's attention backward needs T a multiple of 128 (T %lld; "
             "9.16 and later take any)", version / 10000, version / 100 % 100, (long long)T);
    return false;
  }
  return true;
}

#ifdef MEGA_NO_CUDNN

static bool absent(char *why, size_t cap) {
  snprintf(why, cap, "mega was built without cuDNN's headers (cudnn_graph.h)");
  return false;
}

const mega_cudnn *mega_cudnn_load(char *why, size_t cap) {
  absent(why, cap);
  return NULL;
}
size_t mega_cudnn_version(const mega_cudnn *api) {
  (void)api;
  return 0;
}
void *mega_cudnn_handle(const mega_cudnn *api, void *stream, char *why, size_t cap) {
  (void)api, (void)stream;
  absent(why, cap);
  return NULL;
}
void mega_cudnn_handle_free(const mega_cudnn *api, void *handle) { (void)api, (void)handle; }
mega_sdpa *mega_sdpa_build(const mega_cudnn *api, const mega_sdpa_shape *shape, bool backward,
                           char *why, size_t cap) {
  (void)api, (void)shape, (void)backward;
  absent(why, cap);
  return NULL;
}
int mega_sdpa_op_count(const mega_sdpa *g) {
  (void)g;
  return 0;
}
void mega_sdpa_free(mega_sdpa *g) { (void)g; }
bool mega_sdpa_plan(mega_sdpa *g, void *handle, char *why, size_t cap) {
  (void)g, (void)handle;
  return absent(why, cap);
}
size_t mega_sdpa_workspace(const mega_sdpa *g) {
  (void)g;
  return 0;
}
bool mega_sdpa_run(mega_sdpa *g, void *handle, const mega_sdpa_io *io, char *why, size_t cap) {
  (void)g, (void)handle, (void)io;
  return absent(why, cap);
}
#else

#include <cudnn_graph.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct mega_cudnn {
  size_t version;
  const char *(*error_string)(cudnnStatus_t);
  void (*last_error)(char *, size_t);
  cudnnStatus_t (*create)(cudnnHandle_t *);
  cudnnStatus_t (*destroy)(cudnnHandle_t);
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*create_desc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
  cudnnStatus_t (*destroy_desc)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*set)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                       cudnnBackendAttributeType_t, int64_t, const void *);
  cudnnStatus_t (*get)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                       cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct mega_cudnn lib;
static bool loaded;
static char load_why[300];

static void load(void) {
  void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(load_why, sizeof load_why, "libcudnn.so.9 is not there (%.250s)", e ? e : "?");
    return;
  }
  size_t (*version)(void) = (size_t (*)(void))dlsym(h, "cudnnGetVersion");
#define SYM(field, name)                                        \
  if (!(*(void **)&lib.field = dlsym(h, name))) {               \
    snprintf(load_why, sizeof load_why, "libcudnn.so.9 has no %s", name); \
    return;                                                     \
  }
  SYM(error_string, "cudnnGetErrorString");
  SYM(last_error, "cudnnGetLastErrorString");
  SYM(create, "cudnnCreate");
  SYM(destroy, "cudnnDestroy");
  SYM(set_stream, "cudnnSetStream");
  SYM(create_desc, "cudnnBackendCreateDescriptor");
  SYM(destroy_desc, "cudnnBackendDestroyDescriptor");
  SYM(set, "cudnnBackendSetAttribute");
  SYM(get, "cudnnBackendGetAttribute");
  SYM(finalize, "cudnnBackendFinalize");
  SYM(execute, "cudnnBackendExecute");
#undef SYM
  lib.version = version ? version() : 0;
  /* before 9.6 the caller zeroes the dQ accumulator, before 9.10 the mask
   * wants -FLT_MAX for -inf (cudnn-frontend): neither is done here */
  if (!mega_sdpa_version_takes(lib.version, 0, false, load_why, sizeof load_why)) return;
  loaded = true; /* never closed: cuDNN's sub-libraries stay loaded */
}

const mega_cudnn *mega_cudnn_load(char *why, size_t cap) {
  pthread_once(&once, load);
  if (loaded) return &lib;
  snprintf(why, cap, "%s", load_why);
  return NULL;
}

size_t mega_cudnn_version(const mega_cudnn *api) { return api->version; }

/* why: what failed, cuDNN's status and its last message. */
static void say(const mega_cudnn *api, cudnnStatus_t st, const char *what, char *why,
                size_t cap) {
  char last[160] = "";
  api->last_error(last, sizeof last);
  snprintf(why, cap, "cuDNN: %s: %s%s%s", what, api->error_string(st), *last ? ": " : "", last);
}

void *mega_cudnn_handle(const mega_cudnn *api, void *stream, char *why, size_t cap) {
  cudnnHandle_t h;
  cudnnStatus_t st = api->create(&h);
  if (st != CUDNN_STATUS_SUCCESS) {
    say(api, st, "creating a handle", why, cap);
    return NULL;
  }
  if ((st = api->set_stream(h, (cudaStream_t)stream)) != CUDNN_STATUS_SUCCESS) {
    say(api, st, "setting the handle's stream", why, cap);
    api->destroy(h);
    return NULL;
  }
  return h;
}

void mega_cudnn_handle_free(const mega_cudnn *api, void *handle) {
  if (handle) api->destroy((cudnnHandle_t)handle);
}

/* ---- graphs ---- */

#define MAX_DESC 192
#define MAX_OPS 40

/* The graph's non-virtual tensors. */
enum {
  U_Q = 1, U_K, U_V, U_O, U_STATS, U_DO, U_DQ, U_DK, U_DV, U_SUM, U_DQACC,
  U_SCALE, U_NEGINF, U_ONE, U_FIRST_VIRTUAL = 100
};

struct mega_sdpa {
  const mega_cudnn *api;
  mega_sdpa_shape s;
  bool backward;
  cudnnBackendDescriptor_t desc[MAX_DESC]; /* all made, freed together */
  int ndesc;
  cudnnBackendDescriptor_t ops[MAX_OPS];
  int nops;
  int64_t next_uid;
  cudnnBackendDescriptor_t plan;
  int64_t cudnn_workspace; /* bytes */
  float scale, neg_inf, one; /* the by-value scalars' values */
  bool failed;
  char why[300];
};

static bool ok(mega_sdpa *g, cudnnStatus_t st, const char *what) {
  if (st == CUDNN_STATUS_SUCCESS) return true;
  if (!g->failed) say(g->api, st, what, g->why, sizeof g->why);
  g->failed = true;
  return false;
}

static cudnnBackendDescriptor_t make(mega_sdpa *g, cudnnBackendDescriptorType_t type,
                                     const char *what) {
  cudnnBackendDescriptor_t d = NULL;
  if (g->failed) return NULL;
  if (g->ndesc == MAX_DESC) {
    snprintf(g->why, sizeof g->why, "cuDNN graph: more than %d descriptors", MAX_DESC);
    g->failed = true;
    return NULL;
  }
  if (!ok(g, g->api->create_desc(type, &d), what)) return NULL;
  g->desc[g->ndesc++] = d;
  return d;
}

static void set(mega_sdpa *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t n, const void *v, const char *what) {
  if (!g->failed && d) ok(g, g->api->set(d, name, type, n, v), what);
}

static void set_desc(mega_sdpa *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t v, const char *what) {
  set(g, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

static void done(mega_sdpa *g, cudnnBackendDescriptor_t d, const char *what) {
  if (!g->failed && d) ok(g, g->api->finalize(d), what);
}

typedef struct dims4 {
  int64_t d[4], s[4];
} dims4;

static cudnnBackendDescriptor_t tensor(mega_sdpa *g, int64_t uid, cudnnDataType_t type,
                                       dims4 l, bool is_virtual, bool by_value) {
  cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "a tensor");
  int64_t align = 16;
  if (uid == 0) uid = g->next_uid++;
  set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "a tensor's type");
  set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, l.d, "a tensor's dimensions");
  set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, l.s, "a tensor's strides");
  set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "a tensor's id");
  set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "a tensor's alignment");
  if (is_virtual)
    set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "virtual");
  if (by_value)
    set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "by value");
  done(g, t, "finalizing a tensor");
  return t;
}

static cudnnBackendDescriptor_t virt(mega_sdpa *g, cudnnDataType_t type, dims4 l) {
  return tensor(g, 0, type, l, true, false);
}

static void add_op(mega_sdpa *g, cudnnBackendDescriptor_t op, const char *what) {
  done(g, op, what);
  if (g->failed) return;
  if (g->nops == MAX_OPS) {
    snprintf(g->why, sizeof g->why, "cuDNN graph: more than %d operations", MAX_OPS);
    g->failed = true;
    return;
  }
  g->ops[g->nops++] = op;
}

/* y = mode(x, b, t) computed in prec; axis for GEN_INDEX (else -1). */
static void pw(mega_sdpa *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
               cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
               cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis,
               const char *what) {
  cudnnBackendDescriptor_t d = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what);
  set(g, d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, what);
  set(g, d, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, what);
  if (axis >= 0) set(g, d, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, what);
  done(g, d, what);
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
  float one = 1.0f;
  set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, d, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, what);
  if (b) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, what);
  if (t) set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, what);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, what);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, what);
  add_op(g, op, what);
}

static void matmul(mega_sdpa *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c, const char *what) {
  cudnnBackendDescriptor_t d = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, what);
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  set(g, d, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, what);
  done(g, d, what);
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, d, what);
  add_op(g, op, what);
}

static void reduce(mega_sdpa *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t y, const char *what) {
  cudnnBackendDescriptor_t d = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what);
  cudnnDataType_t f = CUDNN_DATA_FLOAT;
  set(g, d, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, what);
  set(g, d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, what);
  done(g, d, what);
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, d, what);
  add_op(g, op, what);
}

static void reshape(mega_sdpa *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                    const char *what) {
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, what);
  set_desc(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, what);
  add_op(g, op, what);
}

/* [B, h, T, hs] with row stride ld (interleaved heads, backend.h's layout) */
static dims4 heads(const mega_sdpa_shape *s, int64_t h, int64_t ld) {
  return (dims4){{s->B, h, s->T, s->hs}, {s->T * ld, s->hs, ld, 1}};
}

/* the same, read as its transpose [B, h, hs, T] */
static dims4 heads_t(const mega_sdpa_shape *s, int64_t h, int64_t ld) {
  return (dims4){{s->B, h, s->hs, s->T}, {s->T * ld, s->hs, 1, ld}};
}

static dims4 scores(const mega_sdpa_shape *s) { /* [B, NH, T, T] */
  int64_t T = s->T;
  return (dims4){{s->B, s->NH, T, T}, {s->NH * T * T, T * T, T, 1}};
}

static dims4 scores_t(const mega_sdpa_shape *s) { /* the scores read transposed */
  int64_t T = s->T;
  return (dims4){{s->B, s->NH, T, T}, {s->NH * T * T, T * T, 1, T}};
}

static dims4 rows(const mega_sdpa_shape *s) { /* [B, NH, T, 1] */
  return (dims4){{s->B, s->NH, s->T, 1}, {s->NH * s->T, s->T, 1, 1}};
}

static const dims4 scalar = {{1, 1, 1, 1}, {1, 1, 1, 1}};

/* x with the causal mask: -inf where the key comes after the query (row
 * index >= column index is kept), as cudnn-frontend's causal mask lowers. */
static cudnnBackendDescriptor_t causal(mega_sdpa *g, cudnnBackendDescriptor_t x,
                                       cudnnBackendDescriptor_t neg_inf) {
  dims4 ss = scores(&g->s);
  cudnnBackendDescriptor_t r = virt(g, CUDNN_DATA_INT32, ss), c = virt(g, CUDNN_DATA_INT32, ss);
  cudnnBackendDescriptor_t keep = virt(g, CUDNN_DATA_BOOLEAN, ss);
  cudnnBackendDescriptor_t y = virt(g, CUDNN_DATA_FLOAT, ss);
  pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, r, 2, "row index");
  pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, c, 3, "column index");
  pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, r, c, NULL, keep, -1, "causal compare");
  pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg_inf, keep, y, -1, "causal mask");
  return y;
}

static void build_forward(mega_sdpa *g) {
  const mega_sdpa_shape *s = &g->s;
  const cudnnDataType_t F = CUDNN_DATA_FLOAT, H = CUDNN_DATA_BFLOAT16;
  dims4 ss = scores(s), rr = rows(s);
  /* fewer K/V heads broadcast over their query heads in the matmuls */
  cudnnBackendDescriptor_t q = tensor(g, U_Q, H, heads(s, s->NH, s->ldq), false, false);
  cudnnBackendDescriptor_t kt = tensor(g, U_K, H, heads_t(s, s->G, s->ldkv), false, false);
  cudnnBackendDescriptor_t v = tensor(g, U_V, H, heads(s, s->G, s->ldkv), false, false);
  cudnnBackendDescriptor_t o = tensor(g, U_O, H, heads(s, s->NH, s->ldo), false, false);
  cudnnBackendDescriptor_t stats = tensor(g, U_STATS, F, rr, false, false);
  cudnnBackendDescriptor_t scale = tensor(g, U_SCALE, F, scalar, false, true);
  cudnnBackendDescriptor_t neg_inf = tensor(g, U_NEGINF, F, scalar, false, true);

  cudnnBackendDescriptor_t sc = virt(g, F, ss), sc1 = virt(g, F, ss);
  matmul(g, q, kt, sc, "Q K^T");
  pw(g, CUDNN_POINTWISE_MUL, F, sc, scale, NULL, sc1, -1, "the scale");
  cudnnBackendDescriptor_t m = causal(g, sc1, neg_inf);
  /* softmax with its statistics, as cudnn-frontend's composite softmax */
  cudnnBackendDescriptor_t mx = virt(g, F, rr), sub = virt(g, F, ss), e = virt(g, F, ss);
  cudnnBackendDescriptor_t sum = virt(g, F, rr), lg = virt(g, F, rr), p = virt(g, H, ss);
  reduce(g, CUDNN_REDUCE_TENSOR_MAX, m, mx, "row max");
  pw(g, CUDNN_POINTWISE_SUB, F, m, mx, NULL, sub, -1, "minus the max");
  pw(g, CUDNN_POINTWISE_EXP, F, sub, NULL, NULL, e, -1, "exp");
  reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, sum, "row sum");
  pw(g, CUDNN_POINTWISE_LOG, F, sum, NULL, NULL, lg, -1, "log of the sum");
  pw(g, CUDNN_POINTWISE_ADD, F, mx, lg, NULL, stats, -1, "the statistics");
  pw(g, CUDNN_POINTWISE_DIV, F, e, sum, NULL, p, -1, "the probabilities");
  matmul(g, p, v, o, "P V");
}

/* dK or dV = a b into y: directly when every query head has its own K/V
 * head; else per query head into a virtual [B, NH, T, hs], whose heads
 * are then summed into y's G, as cudnn-frontend's composite lowering. */
static void head_grad(mega_sdpa *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t y, const char *what) {
  const mega_sdpa_shape *s = &g->s;
  if (s->G == s->NH) {
    matmul(g, a, b, y, what);
    return;
  }
  dims4 full = {{s->B, s->NH, s->T, s->hs}, {s->NH * s->T * s->hs, s->T * s->hs, s->hs, 1}};
  cudnnBackendDescriptor_t per_head = virt(g, CUDNN_DATA_BFLOAT16, full);
  matmul(g, a, b, per_head, what);
  reduce(g, CUDNN_REDUCE_TENSOR_ADD, per_head, y, "summing a group's heads");
}

static void build_backward(mega_sdpa *g) {
  const mega_sdpa_shape *s = &g->s;
  const cudnnDataType_t F = CUDNN_DATA_FLOAT, H = CUDNN_DATA_BFLOAT16;
  dims4 ss = scores(s), rr = rows(s), st = scores_t(s);
  int64_t B = s->B, NH = s->NH, T = s->T, hs = s->hs;
  cudnnBackendDescriptor_t q = tensor(g, U_Q, H, heads(s, NH, s->ldq), false, false);
  cudnnBackendDescriptor_t kt = tensor(g, U_K, H, heads_t(s, s->G, s->ldkv), false, false);
  cudnnBackendDescriptor_t vt = tensor(g, U_V, H, heads_t(s, s->G, s->ldkv), false, false);
  cudnnBackendDescriptor_t o = tensor(g, U_O, H, heads(s, NH, s->ldo), false, false);
  cudnnBackendDescriptor_t dout = tensor(g, U_DO, H, heads(s, NH, s->ldo), false, false);
  cudnnBackendDescriptor_t stats = tensor(g, U_STATS, F, rr, false, false);
  cudnnBackendDescriptor_t dq = tensor(g, U_DQ, H, heads(s, NH, s->ldg), false, false);
  cudnnBackendDescriptor_t dk = tensor(g, U_DK, H, heads(s, s->G, s->ldg), false, false);
  cudnnBackendDescriptor_t dv = tensor(g, U_DV, H, heads(s, s->G, s->ldg), false, false);
  cudnnBackendDescriptor_t dsum = tensor(g, U_SUM, F, rr, false, false);
  dims4 acc = {{B, NH, T, hs}, {NH * T * hs, T * hs, hs, 1}};
  cudnnBackendDescriptor_t dq_acc = tensor(g, U_DQACC, F, acc, false, false);
  cudnnBackendDescriptor_t scale = tensor(g, U_SCALE, F, scalar, false, true);
  cudnnBackendDescriptor_t neg_inf = tensor(g, U_NEGINF, F, scalar, false, true);
  cudnnBackendDescriptor_t one = tensor(g, U_ONE, F, scalar, false, true);

  /* D = rowsum(dO * O), kept in the workspace */
  dims4 prod = {{B, NH, T, hs}, {NH * T * hs, T * hs, NH * hs, 1}};
  cudnnBackendDescriptor_t dxo = virt(g, F, prod), red = virt(g, F, rr);
  pw(g, CUDNN_POINTWISE_MUL, F, dout, o, NULL, dxo, -1, "dO O");
  reduce(g, CUDNN_REDUCE_TENSOR_ADD, dxo, red, "rowsum(dO O)");
  pw(g, CUDNN_POINTWISE_MUL, F, red, one, NULL, dsum, -1, "D");
  /* P again from the statistics */
  cudnnBackendDescriptor_t sc = virt(g, F, ss), sc1 = virt(g, F, ss), sc2 = virt(g, F, ss);
  matmul(g, q, kt, sc, "Q K^T");
  pw(g, CUDNN_POINTWISE_MUL, F, sc, scale, NULL, sc1, -1, "the scale");
  pw(g, CUDNN_POINTWISE_SUB, F, sc1, stats, NULL, sc2, -1, "minus the statistics");
  cudnnBackendDescriptor_t m = causal(g, sc2, neg_inf);
  cudnnBackendDescriptor_t p = virt(g, F, ss), pt = virt(g, H, st);
  pw(g, CUDNN_POINTWISE_EXP, F, m, NULL, NULL, p, -1, "P");
  reshape(g, p, pt, "P^T");
  head_grad(g, pt, dout, dv, "dV = P^T dO");
  /* dS = P (dP - D) scale */
  cudnnBackendDescriptor_t dp = virt(g, F, ss), d1 = virt(g, F, ss), d2 = virt(g, F, ss);
  cudnnBackendDescriptor_t ds = virt(g, F, ss), dst = virt(g, H, st);
  matmul(g, dout, vt, dp, "dP = dO V^T");
  pw(g, CUDNN_POINTWISE_SUB, F, dp, dsum, NULL, d1, -1, "dP - D");
  pw(g, CUDNN_POINTWISE_MUL, F, d1, p, NULL, d2, -1, "times P");
  pw(g, CUDNN_POINTWISE_MUL, F, d2, scale, NULL, ds, -1, "dS");
  reshape(g, ds, dst, "dS^T");
  head_grad(g, dst, q, dk, "dK = dS^T Q");
  cudnnBackendDescriptor_t k = virt(g, H, heads(s, s->G, s->ldkv));
  reshape(g, kt, k, "K");
  matmul(g, ds, k, dq_acc, "dQ = dS K");
  pw(g, CUDNN_POINTWISE_IDENTITY, F, dq_acc, NULL, NULL, dq, -1, "dQ to bf16");
}

mega_sdpa *mega_sdpa_build(const mega_cudnn *api, const mega_sdpa_shape *shape, bool backward,
                           char *why, size_t cap) {
  const mega_sdpa_shape *s = shape;
  int64_t C = s->NH * s->hs;
  /* cuDNN 9.19 divides by zero on a reduction over an empty row: refuse first */
  if (s->B < 1 || s->T < 1 || s->NH < 1 || s->G < 1 || s->hs < 1 || s->NH % s->G ||
      s->ldq < C || s->ldkv < s->G * s->hs || s->ldo < C || s->ldg < C) {
    snprintf(why, cap,
             "cuDNN attention: B %lld, T %lld, NH %lld, G %lld, hs %lld need to be at least 1, "
             "G to divide NH and the row strides (%lld, %lld, %lld, %lld) to hold the heads",
             (long long)s->B, (long long)s->T, (long long)s->NH, (long long)s->G,
             (long long)s->hs, (long long)s->ldq, (long long)s->ldkv, (long long)s->ldo,
             (long long)s->ldg);
    return NULL;
  }
  if (!mega_sdpa_version_takes(api->version, s->T, backward, why, cap)) return NULL;
  mega_sdpa *g = calloc(1, sizeof *g);
  if (!g) {
    snprintf(why, cap, "cuDNN graph: out of memory");
    return NULL;
  }
  g->api = api;
  g->s = *shape;
  g->backward = backward;
  g->next_uid = U_FIRST_VIRTUAL;
  g->scale = shape->scale;
  g->neg_inf = -__builtin_inff();
  g->one = 1.0f;
  if (backward)
    build_backward(g);
  else
    build_forward(g);
  if (g->failed) {
    snprintf(why, cap, "%s", g->why);
    mega_sdpa_free(g);
    return NULL;
  }
  return g;
}

int mega_sdpa_op_count(const mega_sdpa *g) { return g->nops; }

void mega_sdpa_free(mega_sdpa *g) {
  if (!g) return;
  if (g->plan) g->api->destroy_desc(g->plan);
  for (int i = g->ndesc - 1; i >= 0; i--) g->api->destroy_desc(g->desc[i]);
  free(g);
}

/* ---- on a device ---- */

#define MAX_CONFIGS 16

/* A plan from the first of mode's engines that takes the graph; false
 * with why (the heuristics' refusal, or the last engine's). */
static bool plan_with(mega_sdpa *g, cudnnHandle_t h, cudnnBackendDescriptor_t graph,
                      cudnnBackendHeurMode_t mode, char *why, size_t cap) {
  const mega_cudnn *api = g->api;
  cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
  cudnnBackendDescriptor_t cfg[MAX_CONFIGS];
  for (int i = 0; i < MAX_CONFIGS; i++)
    cfg[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "an engine configuration");
  if (g->failed) {
    snprintf(why, cap, "%.180s", g->why);
    return false;
  }
  int64_t n = 0;
  cudnnStatus_t st = api->set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  if (st == CUDNN_STATUS_SUCCESS)
    st = api->set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (st == CUDNN_STATUS_SUCCESS) st = api->finalize(heur);
  if (st == CUDNN_STATUS_SUCCESS)
    st = api->get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                  MAX_CONFIGS, &n, cfg);
  if (st != CUDNN_STATUS_SUCCESS) {
    say(api, st, "the heuristics", why, cap);
    return false;
  }
  if (n > MAX_CONFIGS) n = MAX_CONFIGS; /* the count may be the whole list's */
  char last[200] = "";
  for (int64_t i = 0; i < n; i++) {
    cudnnBackendDescriptor_t plan;
    if ((st = api->create_desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan))) {
      say(api, st, "a plan", why, cap);
      return false;
    }
    st = api->set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    if (st == CUDNN_STATUS_SUCCESS)
      st = api->set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                    1, &cfg[i]);
    if (st == CUDNN_STATUS_SUCCESS) st = api->finalize(plan);
    int64_t ws = 0, got = 0;
    if (st == CUDNN_STATUS_SUCCESS)
      st = api->get(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &ws);
    if (st == CUDNN_STATUS_SUCCESS) {
      g->plan = plan;
      g->cudnn_workspace = ws;
      return true;
    }
    say(api, st, "finalizing a plan", last, sizeof last);
    api->destroy_desc(plan);
  }
  snprintf(why, cap, "%lld engine%s declined the graph%s%.120s", (long long)n,
           n == 1 ? "" : "s", n ? "; the last: " : "", last);
  return false;
}

bool mega_sdpa_plan(mega_sdpa *g, void *handle, char *why, size_t cap) {
  cudnnHandle_t h = handle;
  cudnnBackendDescriptor_t graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "a graph");
  set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "the graph's handle");
  set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops,
      "the graph's operations");
  done(g, graph, "finalizing the graph");
  if (g->failed) {
    snprintf(why, cap, "%s", g->why);
    return false;
  }
  /* heuristics mode A first, as cudnn-frontend; its fallback list next */
  char a[200], fallback[200];
  if (plan_with(g, h, graph, CUDNN_HEUR_MODE_A, a, sizeof a) ||
      plan_with(g, h, graph, CUDNN_HEUR_MODE_FALLBACK, fallback, sizeof fallback))
    return true;
  snprintf(why, cap, "heuristics A: %.190s; fallback: %.190s", a, fallback);
  return false;
}

static size_t up16(size_t n) { return (n + 15) / 16 * 16; }

size_t mega_sdpa_workspace(const mega_sdpa *g) {
  const mega_sdpa_shape *s = &g->s;
  size_t rows = (size_t)s->B * s->NH * s->T;
  size_t own = g->backward ? up16(rows * 4) + up16(rows * s->hs * 4) : 0;
  return up16((size_t)g->cudnn_workspace) + own;
}

bool mega_sdpa_run(mega_sdpa *g, void *handle, const mega_sdpa_io *io, char *why, size_t cap) {
  const mega_cudnn *api = g->api;
  if (!g->plan) {
    snprintf(why, cap, "cuDNN attention: run before a plan");
    return false;
  }
  int64_t uids[16];
  void *ptrs[16];
  int n = 0;
#define IO(u, p) (uids[n] = (u), ptrs[n++] = (void *)(p))
  IO(U_Q, io->q), IO(U_K, io->k), IO(U_V, io->v), IO(U_O, io->o), IO(U_STATS, io->stats);
  IO(U_SCALE, &g->scale), IO(U_NEGINF, &g->neg_inf);
  if (g->backward) {
    const mega_sdpa_shape *s = &g->s;
    char *own = (char *)io->workspace + up16((size_t)g->cudnn_workspace);
    size_t rows = (size_t)s->B * s->NH * s->T;
    IO(U_DO, io->dout), IO(U_DQ, io->dq), IO(U_DK, io->dk), IO(U_DV, io->dv), IO(U_ONE, &g->one);
    IO(U_SUM, own), IO(U_DQACC, own + up16(rows * 4));
  }
#undef IO
  cudnnBackendDescriptor_t pack;
  cudnnStatus_t st = api->create_desc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (st != CUDNN_STATUS_SUCCESS) {
    say(api, st, "a variant pack", why, cap);
    return false;
  }
  void *ws = io->workspace;
  st = api->set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (st == CUDNN_STATUS_SUCCESS)
    st = api->set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (st == CUDNN_STATUS_SUCCESS)
    st = api->set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (st == CUDNN_STATUS_SUCCESS) st = api->finalize(pack);
  if (st == CUDNN_STATUS_SUCCESS) st = api->execute((cudnnHandle_t)handle, g->plan, pack);
  api->destroy_desc(pack);
  if (st != CUDNN_STATUS_SUCCESS) {
    say(api, st, g->backward ? "attention backward" : "attention", why, cap);
    return false;
  }
  return true;
}
#endif
