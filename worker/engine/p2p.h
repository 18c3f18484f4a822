/* Pipeline P2P: the transfers behind the schedule's SF, RF, SB and RB
 * actions, over the pipeline group's communicator.
 *
 * A message is the payload ([B,T,C] floats) followed by a 16-byte trailer
 * holding the sender's wall clock at posting time. The receiver uses it to
 * split each wait into bubble (the sender had not sent yet: the pipeline
 * had nothing for us) and transfer time. With variable sequence lengths a
 * shape message (T, B, C) goes first, as Megatron's _communicate_shapes
 * does, and the receiver sizes its buffer from it.
 *
 * Buffers carry MEGA_P2P_TRAILER_BYTES of room after the payload
 * (mega_p2p_buffer_bytes); the engine allocates them.
 *
 * Matching: a transfer's tag encodes (direction, microbatch, chunk), so
 * every message meets exactly its receive whatever the posting order.
 *
 * Ownership: a mega_p2p borrows its communicator. A mega_p2p_msg is a value
 * the engine owns; its buffer is the engine's until the message is done. */
#ifndef MEGA_WORKER_P2P_H
#define MEGA_WORKER_P2P_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/schedule.h"
#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/comm/comm.h"

#define MEGA_P2P_TRAILER_BYTES 16u

typedef struct mega_p2p mega_p2p;

typedef struct mega_p2p_opts {
  bool batch;          /* --batch-p2p-comm: a step's operations posted together */
  bool variable_seq;   /* --variable-seq-lengths: shapes go first */
  int timeout_ms;      /* per wait; 0: the communicator's */
  /* Where message buffers live: the trailer's timestamp is copied in and
   * out through it (device memory on the cuda backend). NULL: host memory. */
  mega_backend *be;
  /* The shape messages of variable_seq (host memory): a cuda rank's host
   * communicator of the pipeline group. NULL: the data communicator. */
  mega_comm *shape_comm;
} mega_p2p_opts;

/* One transfer. Fill kind, mb, chunk, buf, and for sends and fixed-shape
 * receives the shape (B, T, C); the rest is the p2p layer's. */
typedef struct mega_p2p_msg {
  uint8_t kind; /* MEGA_ACT_SEND_F, RECV_F, SEND_B or RECV_B */
  int mb, chunk;
  int B, T, C;  /* a variable-length receive learns T from the shape message */
  float *buf;   /* B*T*C floats + trailer; a variable-length receive gets it
                   from alloc_fn when the shape arrives */
  /* internal */
  mega_req *req, *shape_req;
  struct mega_p2p *owner;          /* variable receives awaiting their shape: */
  struct mega_p2p_msg *next_unsized; /* the owner's list, in the order posted */
  int64_t shape[4];
  bool posted, data_posted, done;
  double t_post;  /* when this rank posted it (wall clock, seconds) */
  double t_peer;  /* receives: when the sender posted (from the trailer) */
} mega_p2p_msg;

/* Allocates a receive buffer of the given floats (plus trailer room) once a
 * variable-length receive knows its shape. */
typedef mega_status (*mega_p2p_alloc_fn)(void *arg, mega_p2p_msg *m, size_t floats,
                                         mega_err *err);

/* comm is the pipeline group (size pp); rank r's chunk c is virtual stage
 * c*pp + r. opts may be NULL. */
mega_status mega_p2p_create(mega_comm *comm, int pp, int vp, const mega_p2p_opts *opts,
                            mega_p2p **out, mega_err *err);

/* Who sizes variable-length receives (required with variable_seq). */
void mega_p2p_set_alloc(mega_p2p *p, mega_p2p_alloc_fn alloc, void *arg);
void mega_p2p_destroy(mega_p2p *p);

size_t mega_p2p_buffer_bytes(size_t floats);

/* Posts the transfers of one P2P step: all at once with --batch-p2p-comm,
 * else one by one in seed 000's even/odd order (even ranks send-next,
 * recv-prev, send-prev, recv-next; odd ranks recv-prev, send-next,
 * recv-next, send-prev). Sends get their trailer stamped here. */
mega_status mega_p2p_post(mega_p2p *p, mega_p2p_msg *const *msgs, int n, mega_err *err);

/* How a completed wait splits. */
typedef struct mega_p2p_wait {
  double bubble_s;   /* a receive waiting for its sender to send */
  double transfer_s; /* the rest: moving bytes, or a send waiting for its receiver */
} mega_p2p_wait;

/* Waits for one transfer (and a variable-length receive's data, posting it
 * when its shape arrives). Idempotent once done. */
mega_status mega_p2p_wait_msg(mega_p2p *p, mega_p2p_msg *m, mega_p2p_wait *w, mega_err *err);

/* A variable-length receive: waits for its shape and posts its data
 * receive (a no-op otherwise). Waiting for every shape of a step before
 * any data keeps two neighbours that send to each other from each waiting
 * on a data receive the other has not posted yet. */
mega_status mega_p2p_wait_shape(mega_p2p *p, mega_p2p_msg *m, mega_p2p_wait *w, mega_err *err);

/* Never blocks: *done when the transfer completed. */
mega_status mega_p2p_test(mega_p2p *p, mega_p2p_msg *m, bool *done, mega_err *err);

/* Releases the requests of a done (or abandoned) transfer. */
void mega_p2p_release(mega_p2p_msg *m);

/* The pipeline rank at the other end of a transfer of (kind, chunk). */
int mega_p2p_peer(const mega_p2p *p, uint8_t kind, int chunk);

#endif
