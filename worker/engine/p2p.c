#include "worker/engine/p2p.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct mega_p2p {
  mega_comm *comm;       /* the activations (backend memory) */
  mega_comm *shape_comm; /* the shape messages (host memory) */
  int rank, pp, vp;
  mega_p2p_opts opts;
  mega_p2p_alloc_fn alloc;
  void *alloc_arg;
  /* Variable-length receives whose data is not posted yet, in the order
   * they were posted: NCCL matches a peer's messages by order, not by tag,
   * so each posts its data only after those from the same peer before it
   * (the sender posts its data in that order too). */
  mega_p2p_msg *unsized;
};

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool is_send(uint8_t kind) { return kind == MEGA_ACT_SEND_F || kind == MEGA_ACT_SEND_B; }

static bool is_forward(uint8_t kind) {
  return kind == MEGA_ACT_SEND_F || kind == MEGA_ACT_RECV_F;
}

int mega_p2p_peer(const mega_p2p *p, uint8_t kind, int chunk) {
  (void)chunk;
  bool to_next = kind == MEGA_ACT_SEND_F || kind == MEGA_ACT_RECV_B;
  return (p->rank + (to_next ? 1 : p->pp - 1)) % p->pp;
}

/* Both ends name a transfer by its sender's virtual stage. */
static uint32_t tag_of(const mega_p2p *p, const mega_p2p_msg *m, bool shape) {
  int vs = m->chunk * p->pp + p->rank;
  if (m->kind == MEGA_ACT_RECV_F) vs -= 1;
  if (m->kind == MEGA_ACT_RECV_B) vs += 1;
  uint64_t stages = (uint64_t)p->pp * (uint64_t)p->vp;
  uint64_t t = (((uint64_t)m->mb * stages + (uint64_t)vs) * 2 + !is_forward(m->kind)) * 2 + shape;
  return (uint32_t)t;
}

mega_status mega_p2p_create(mega_comm *comm, int pp, int vp, const mega_p2p_opts *opts,
                            mega_p2p **out, mega_err *err) {
  if (mega_comm_size(comm) != pp)
    return mega_fail(err, MEGA_ERR_INTERNAL, "p2p: the pipeline communicator has %d ranks, not %d",
                     mega_comm_size(comm), pp);
  mega_p2p *p = calloc(1, sizeof *p);
  if (!p) return mega_fail(err, MEGA_ERR_NOMEM, "p2p: out of memory");
  p->comm = comm;
  p->rank = mega_comm_rank(comm);
  p->pp = pp;
  p->vp = vp;
  if (opts) p->opts = *opts;
  p->shape_comm = p->opts.shape_comm ? p->opts.shape_comm : comm;
  if (mega_comm_size(p->shape_comm) != pp || mega_comm_rank(p->shape_comm) != p->rank) {
    free(p);
    return mega_fail(err, MEGA_ERR_INTERNAL, "p2p: the shape communicator is not the pipeline's");
  }
  *out = p;
  return MEGA_OK;
}

void mega_p2p_destroy(mega_p2p *p) { free(p); }

void mega_p2p_set_alloc(mega_p2p *p, mega_p2p_alloc_fn alloc, void *arg) {
  p->alloc = alloc;
  p->alloc_arg = arg;
}

size_t mega_p2p_buffer_bytes(size_t floats) { return floats * sizeof(float) + MEGA_P2P_TRAILER_BYTES; }

/* The tags are 32 bits: the schedule's size must fit. Checked once per
 * iteration by the engine through this. */
static mega_status check_tag_room(const mega_p2p *p, int mb, mega_err *err) {
  uint64_t stages = (uint64_t)p->pp * (uint64_t)p->vp;
  if (((uint64_t)mb + 1) * stages * 4 > UINT32_MAX)
    return mega_fail(err, MEGA_ERR_UNSUPPORTED,
                     "p2p: microbatch %d with %llu pipeline stages overflows the 32-bit tags", mb,
                     (unsigned long long)stages);
  return MEGA_OK;
}

static size_t payload_floats(const mega_p2p_msg *m) {
  return (size_t)m->B * (size_t)m->T * (size_t)m->C;
}

/* The 8-byte trailer to or from a message buffer (backend memory). */
static mega_status trailer_copy(mega_p2p *p, void *dst, const void *src, mega_copy_kind kind,
                                mega_err *err) {
  mega_backend *be = p->opts.be;
  if (!be) {
    memcpy(dst, src, sizeof(double));
    return MEGA_OK;
  }
  return be->ops->memcpy(be, dst, src, sizeof(double), kind, err);
}

static mega_status post_data(mega_p2p *p, mega_p2p_msg *m, mega_err *err) {
  int peer = mega_p2p_peer(p, m->kind, m->chunk);
  size_t bytes = mega_p2p_buffer_bytes(payload_floats(m));
  uint32_t tag = tag_of(p, m, false);
  mega_status st;
  if (is_send(m->kind)) {
    double now = wall_s();
    st = trailer_copy(p, (uint8_t *)m->buf + payload_floats(m) * sizeof(float), &now,
                      MEGA_COPY_H2D, err);
    if (st == MEGA_OK) st = mega_comm_isend(p->comm, m->buf, bytes, peer, tag, &m->req, err);
  } else {
    st = mega_comm_irecv(p->comm, m->buf, bytes, peer, tag, &m->req, err);
  }
  if (st == MEGA_OK) m->data_posted = true;
  return st;
}

static mega_status post_one(mega_p2p *p, mega_p2p_msg *m, mega_err *err) {
  mega_status st = check_tag_room(p, m->mb, err);
  if (st != MEGA_OK) return st;
  m->t_post = wall_s();
  m->posted = true;
  if (!p->opts.variable_seq) return post_data(p, m, err);
  int peer = mega_p2p_peer(p, m->kind, m->chunk);
  uint32_t tag = tag_of(p, m, true);
  if (is_send(m->kind)) {
    m->shape[0] = m->T;
    m->shape[1] = m->B;
    m->shape[2] = m->C;
    m->shape[3] = (int64_t)(m->t_post * 1e6); /* lets the receiver tell bubble from transfer */
    st = mega_comm_isend(p->shape_comm, m->shape, sizeof m->shape, peer, tag, &m->shape_req,
                         err);
    return st == MEGA_OK ? post_data(p, m, err) : st;
  }
  /* A receive posts its data only once the shape says how much. */
  st = mega_comm_irecv(p->shape_comm, m->shape, sizeof m->shape, peer, tag, &m->shape_req, err);
  if (st == MEGA_OK) {
    mega_p2p_msg **at = &p->unsized;
    while (*at) at = &(*at)->next_unsized;
    *at = m;
    m->owner = p;
    m->next_unsized = NULL;
  }
  return st;
}

/* Seed 000's order, by direction: send-next, recv-prev, send-prev, recv-next
 * on even ranks; recv-prev, send-next, recv-next, send-prev on odd ones. */
static int order_key(int rank, uint8_t kind) {
  static const int even[MEGA_ACT_KINDS] = {[MEGA_ACT_SEND_F] = 0, [MEGA_ACT_RECV_F] = 1,
                                           [MEGA_ACT_SEND_B] = 2, [MEGA_ACT_RECV_B] = 3};
  static const int odd[MEGA_ACT_KINDS] = {[MEGA_ACT_RECV_F] = 0, [MEGA_ACT_SEND_F] = 1,
                                          [MEGA_ACT_RECV_B] = 2, [MEGA_ACT_SEND_B] = 3};
  return rank % 2 ? odd[kind] : even[kind];
}

mega_status mega_p2p_post(mega_p2p *p, mega_p2p_msg *const *msgs, int n, mega_err *err) {
  if (p->opts.batch) {
    for (int i = 0; i < n; i++) {
      mega_status st = post_one(p, msgs[i], err);
      if (st != MEGA_OK) return st;
    }
    return MEGA_OK;
  }
  for (int key = 0; key < 4; key++)
    for (int i = 0; i < n; i++) {
      if (order_key(p->rank, msgs[i]->kind) != key) continue;
      mega_status st = post_one(p, msgs[i], err);
      if (st != MEGA_OK) return st;
    }
  return MEGA_OK;
}

/* A variable-length receive: the shape has arrived, so size and post the data. */
static mega_status post_after_shape(mega_p2p *p, mega_p2p_msg *m, mega_err *err) {
  int64_t T = m->shape[0], B = m->shape[1], C = m->shape[2];
  if (T <= 0 || B <= 0 || C <= 0 || T > (1 << 24) || B > (1 << 24) || C > (1 << 24))
    return mega_fail(err, MEGA_ERR_PEER, "p2p: pipeline rank %d sent a bad shape [%lld, %lld, %lld]",
                     mega_p2p_peer(p, m->kind, m->chunk), (long long)T, (long long)B,
                     (long long)C);
  m->T = (int)T;
  m->B = (int)B;
  m->C = (int)C;
  if (!p->alloc) return mega_fail(err, MEGA_ERR_INTERNAL, "p2p: no allocator for variable shapes");
  mega_status st = p->alloc(p->alloc_arg, m, payload_floats(m), err);
  return st == MEGA_OK ? post_data(p, m, err) : st;
}

static void unlink_unsized(mega_p2p_msg *m) {
  if (!m->owner) return;
  for (mega_p2p_msg **at = &m->owner->unsized; *at; at = &(*at)->next_unsized)
    if (*at == m) {
      *at = m->next_unsized;
      break;
    }
  m->owner = NULL;
  m->next_unsized = NULL;
}

/* Posts m's data once its shape is here, after the data of every earlier
 * variable receive from the same peer. block: wait for their shapes;
 * otherwise *ready says whether m's data could be posted yet. */
static mega_status post_in_order(mega_p2p *p, mega_p2p_msg *m, bool block, bool *ready,
                                 mega_err *err) {
  int peer = mega_p2p_peer(p, m->kind, m->chunk);
  *ready = false;
  while (!m->data_posted) {
    mega_p2p_msg *q = p->unsized;
    while (q && q != m && mega_p2p_peer(p, q->kind, q->chunk) != peer) q = q->next_unsized;
    if (!q) return mega_fail(err, MEGA_ERR_INTERNAL, "p2p: a variable receive left its queue");
    mega_status st;
    if (block) {
      st = mega_req_wait(q->shape_req, p->opts.timeout_ms, err);
    } else {
      bool d = false;
      st = mega_req_test(q->shape_req, &d, err);
      if (st == MEGA_OK && !d) return MEGA_OK;
    }
    unlink_unsized(q);
    if (st == MEGA_OK) st = post_after_shape(p, q, err);
    if (st != MEGA_OK) return st;
  }
  *ready = true;
  return MEGA_OK;
}

static mega_status finish(mega_p2p *p, mega_p2p_msg *m, mega_err *err) {
  m->done = true;
  if (is_send(m->kind)) return MEGA_OK;
  return trailer_copy(p, &m->t_peer, (uint8_t *)m->buf + payload_floats(m) * sizeof(float),
                      MEGA_COPY_D2H, err);
}

static void split_wait(const mega_p2p_msg *m, double t0, double t1, double t_peer,
                       mega_p2p_wait *w) {
  if (!w) return;
  /* Before the sender posted, the pipeline had nothing for us. Clocks of
   * two nodes may disagree a little; the split is clamped to the wait. */
  double waited = t1 - t0, idle = is_send(m->kind) ? 0.0 : t_peer - t0;
  if (idle < 0) idle = 0;
  if (idle > waited) idle = waited;
  w->bubble_s = idle;
  w->transfer_s = waited - idle;
}

mega_status mega_p2p_wait_shape(mega_p2p *p, mega_p2p_msg *m, mega_p2p_wait *w, mega_err *err) {
  if (w) *w = (mega_p2p_wait){0};
  if (is_send(m->kind) || !m->shape_req || m->data_posted) return MEGA_OK;
  double t0 = wall_s();
  bool ready;
  mega_status st = post_in_order(p, m, true, &ready, err);
  if (st == MEGA_OK) split_wait(m, t0, wall_s(), (double)m->shape[3] * 1e-6, w);
  return st;
}

mega_status mega_p2p_wait_msg(mega_p2p *p, mega_p2p_msg *m, mega_p2p_wait *w, mega_err *err) {
  if (w) *w = (mega_p2p_wait){0};
  if (m->done) return MEGA_OK;
  if (!m->posted) return mega_fail(err, MEGA_ERR_INTERNAL, "p2p: waiting on a transfer never posted");
  double t0 = wall_s();
  mega_status st;
  bool ready;
  if (m->shape_req && !m->data_posted && (st = post_in_order(p, m, true, &ready, err)) != MEGA_OK)
    return st;
  if (m->shape_req && is_send(m->kind)) {
    st = mega_req_wait(m->shape_req, p->opts.timeout_ms, err);
    if (st != MEGA_OK) return st;
  }
  st = mega_req_wait(m->req, p->opts.timeout_ms, err);
  if (st == MEGA_OK) st = finish(p, m, err);
  if (st != MEGA_OK) return st;
  split_wait(m, t0, wall_s(), m->t_peer, w);
  return MEGA_OK;
}

mega_status mega_p2p_test(mega_p2p *p, mega_p2p_msg *m, bool *done, mega_err *err) {
  *done = m->done;
  if (m->done || !m->posted) return MEGA_OK;
  bool d = false;
  mega_status st;
  if (m->shape_req && !m->data_posted) {
    st = post_in_order(p, m, false, &d, err);
    if (st != MEGA_OK || !d) return st;
  }
  if (m->shape_req && is_send(m->kind)) {
    st = mega_req_test(m->shape_req, &d, err);
    if (st != MEGA_OK || !d) return st;
  }
  st = mega_req_test(m->req, &d, err);
  if (st != MEGA_OK || !d) return st;
  st = finish(p, m, err);
  *done = st == MEGA_OK;
  return st;
}

void mega_p2p_release(mega_p2p_msg *m) {
  unlink_unsized(m);
  mega_req_free(m->req);
  mega_req_free(m->shape_req);
  m->req = m->shape_req = NULL;
}
