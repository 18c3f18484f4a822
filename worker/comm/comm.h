/* The communicator: what the engine uses to move bytes between ranks.
 *
 * A narrow, NCCL-like C interface. The cpu backend fills it with Gloo over
 * TCP (gloo_*.cc, a C++ shim behind extern "C"); a cuda backend fills the
 * same calls with NCCL. Ranks here are always ranks *within the group* of
 * the communicator, 0..size-1.
 *
 * Rendezvous. Ranks of a group meet through a key-value store: either Gloo's
 * FileStore on a directory every rank can see (tests, single node), or a C
 * vtable (mega_kv_ops) the worker backs with its daemon's store. A store
 * carries a prefix (job and attempt, e.g. "job7/a0"); each communicator adds
 * its group name, so every key reads "<prefix>/<group>/<gloo key>". Keys are
 * write-once (FileStore keeps its files): build a group again after a failure
 * under a new prefix or group name.
 *
 * Requests. mega_comm_isend/irecv and the mega_comm_i* collectives return a
 * mega_req that the caller owns and gives back with mega_req_free.
 * Buffer lifetime: the memory of a request must stay valid (and, for a send
 * or collective input, unchanged) until mega_req_wait returns MEGA_OK or
 * mega_req_test reports it done with MEGA_OK; after any other result, until
 * mega_req_free returns. Freeing a request before a wait or test has seen it
 * complete cancels it, and since neither Gloo nor NCCL can withdraw a posted
 * operation, that breaks the communicator (mega_comm_status then says so).
 *
 * Matching. A send and a receive match by (peer, tag); several outstanding
 * operations with the same (peer, tag) match in the order they were posted.
 * Sizes must agree exactly on both sides. Gloo cannot survive a send larger
 * than the receive posted for it, so its P2P matches by size too: a send and
 * a receive of other sizes never meet, and both time out.
 *
 * Ordering. Collectives of one communicator (blocking or not) run one at a
 * time on its comm thread, in the order the calling process issued them;
 * every rank must issue the same collectives in the same order. Gloo checks:
 * ranks whose collectives differ (operation, type, sizes, root) fail with
 * MEGA_ERR_INVALID naming both calls and break the communicator; NCCL does
 * not. P2P
 * operations do not queue behind collectives: they run at once and overlap.
 *
 * Threads. Different requests and communicators may be used from different
 * threads at once; one request is used by one thread at a time.
 * mega_comm_abort may be called from any thread at any time; destroy a
 * communicator only once no other thread is inside a call on it (abort
 * first to get them out).
 *
 * Timeouts. Every wait is bounded. A timeout_ms <= 0 means the
 * communicator's timeout (given at creation). A wait that times out returns
 * MEGA_ERR_TIMEOUT and breaks the communicator: Gloo closes every connection
 * of the group when an operation times out, so a timeout is a failure
 * detector, not a polling tool; poll with mega_req_test. A P2P wait's
 * timeout counts from the call; a collective's from the moment it starts on
 * the comm thread (the collectives queued before it are bounded by their
 * own timeouts).
 *
 * Failures. A closed or reset connection gives MEGA_ERR_PEER with a message
 * naming the peer's rank (usually within tens of milliseconds of its death,
 * on the ranks that talk to it). After the first failure the communicator is
 * broken: every pending and later call fails at once with the first cause,
 * and the connections of the group are closed, so the other ranks learn of
 * it promptly too. A broken communicator is only good for mega_comm_destroy.
 *
 * Shared memory. The collectives of a group marked with
 * mega_store_group_here (all its ranks on this node) go through a segment
 * in /dev/shm the ranks map at creation (unlinked once all have: nothing is
 * left behind); P2P stays on TCP. The failure contract is the same: a rank
 * that dies (seen through its pidfd), or breaks, aborts or destroys its
 * communicator, fails the others' collectives with MEGA_ERR_PEER naming
 * it, within about 10 ms of their next wait. Where any rank cannot map the segment or has
 * MEGA_COMM_SHM=0 in its environment, the group's collectives stay on TCP
 * (the ranks agree at creation); mega_comm_transport says which.
 *
 * Process-wide effect: creating the first communicator sets SIGPIPE to
 * SIG_IGN if it was SIG_DFL, because Gloo writes to sockets with writev and
 * a peer's death must be an error, not the end of this process. */
#ifndef MEGA_WORKER_COMM_H
#define MEGA_WORKER_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {  /* core/status.h has no C++ guards of its own */
#endif

#include "core/status.h"

typedef struct mega_store mega_store;
typedef struct mega_comm mega_comm;
typedef struct mega_req mega_req;

/* ---- Stores ------------------------------------------------------------ */

/* One rank's part of a group's rendezvous: set set_key (when not NULL) to
 * set_len bytes of set_value, then wait for every prefix + keys[i] and
 * return their values: whole when parts is 0, else only slice part[i] of
 * value i taken as `parts` equal slices (MEGA_ERR_INVALID when it is not a
 * multiple of parts). Keys, set_key too, are prefix + the name. here: every
 * rank of the group is on this node, so the node's daemon may serve it
 * without the job's coordinator. */
typedef struct mega_kv_gather {
  const char *prefix;
  const char *set_key;
  const void *set_value;
  size_t set_len;
  const char *const *keys;
  size_t nkeys;
  uint32_t parts;
  const uint32_t *part;
  bool here;
} mega_kv_gather;

/* A key-value store the caller implements (the worker forwards to megad).
 * Functions may be called from any thread that creates a communicator, and
 * concurrently from several such threads; ctx is passed back unchanged.
 * A failing function returns its status and fills err (it may be NULL). */
typedef struct mega_kv_ops {
  /* Stores len bytes of value under key (keys are set once). */
  mega_status (*set)(void *ctx, const char *key, const void *value,
                     size_t len, mega_err *err);
  /* Waits up to timeout_ms for key to exist, then returns its value in
   * *value (allocated with malloc; the caller frees it) and *len.
   * Returns MEGA_ERR_TIMEOUT when the key did not appear in time. */
  mega_status (*get)(void *ctx, const char *key, void **value, size_t *len,
                     int timeout_ms, mega_err *err);
  /* Waits up to timeout_ms until every one of the nkeys keys exists. */
  mega_status (*wait)(void *ctx, const char *const *keys, size_t nkeys,
                      int timeout_ms, mega_err *err);
  /* A rank's part of a group's rendezvous in one call (may be NULL: then a
   * set, a get per key, and the slicing here): g (comm.h above) says what.
   * Waits up to timeout_ms until every key exists, then returns their
   * values one after another in *out (malloc'd; the caller frees it), value
   * i lens[i] bytes. */
  mega_status (*gather)(void *ctx, const struct mega_kv_gather *g, int timeout_ms,
                        void **out, size_t *lens, mega_err *err);
} mega_kv_ops;

/* Gloo's FileStore on directory dir (must exist, shared by all ranks).
 * prefix namespaces the keys (job/attempt); it must be non-empty. */
mega_status mega_store_open_file(const char *dir, const char *prefix,
                                 mega_store **out, mega_err *err);

/* A store over the caller's vtable. ops and ctx are borrowed: they must stay
 * valid until mega_store_close. */
mega_status mega_store_open_kv(const mega_kv_ops *ops, void *ctx,
                               const char *prefix, mega_store **out,
                               mega_err *err);

/* Every rank of group lives on this node (the rank knows its node's
 * ranks): its rendezvous may stay on the node (mega_kv_gather.here). Only
 * for the ranks of one node: a group that spans nodes must not be marked.
 * Before the group is created. */
mega_status mega_store_group_here(mega_store *store, const char *group, mega_err *err);

/* A store is only used while mega_comm_create runs; it may be closed as soon
 * as the communicators it served exist. NULL is ignored. */
void mega_store_close(mega_store *store);

/* One value under "<prefix>/<group>/<key>": what a communicator other than
 * Gloo shares at creation (NCCL's unique id). get waits up to timeout_ms
 * for the key and returns a malloc'd copy the caller frees. */
mega_status mega_store_set(mega_store *store, const char *group, const char *key,
                           const void *value, size_t len, mega_err *err);
mega_status mega_store_get(mega_store *store, const char *group, const char *key,
                           void **value, size_t *len, int timeout_ms, mega_err *err);

/* ---- Communicators ------------------------------------------------------ */

/* Creates rank `rank` of a group of `size` ranks called `group` (unique
 * within the store's prefix), connecting to every other rank. Blocks until
 * all ranks of the group have joined, or timeout_ms (> 0) passes
 * (MEGA_ERR_TIMEOUT). hostname is the address this rank binds and peers dial
 * (NULL means "127.0.0.1", loopback only). timeout_ms also becomes the
 * default timeout of every later operation. The caller owns *out. */
mega_status mega_comm_create(mega_store *store, const char *group, int rank,
                             int size, const char *hostname, int timeout_ms,
                             mega_comm **out, mega_err *err);

/* Ends the communicator. Work still pending is cancelled first (as by
 * mega_comm_abort); requests not yet freed stay safe to wait on (they report
 * MEGA_ERR_CANCELLED) and to free. NULL is ignored. */
void mega_comm_destroy(mega_comm *comm);

/* How the communicator moves collectives' bytes: "gloo" (Gloo's TCP),
 * "gloo+shm" (a group marked with mega_store_group_here, all on this node:
 * collectives through a shared-memory segment, P2P on Gloo), "nccl". */
const char *mega_comm_transport(const mega_comm *comm);

int mega_comm_rank(const mega_comm *comm);
int mega_comm_size(const mega_comm *comm);

/* MEGA_OK while healthy; otherwise the first cause (PEER, TIMEOUT,
 * CANCELLED, ...) with its message. */
mega_status mega_comm_status(const mega_comm *comm, mega_err *err);

/* Cancels everything on the communicator, from any thread: every pending
 * and future wait returns MEGA_ERR_CANCELLED promptly. The group's
 * connections are closed (Gloo has no other way to stop an operation in
 * flight), which the peers see as this rank's failure (MEGA_ERR_PEER). The
 * collective running on the comm thread stops with them, a transfer half
 * written to or read from a socket too (Gloo would leave that wait to its
 * timeout; the communicator wakes it). A blocking collective (or
 * mega_req_free of its request) returns once the comm thread has let go of
 * the caller's buffers. Abort is final. */
void mega_comm_abort(mega_comm *comm);

/* ---- Point to point ---------------------------------------------------- */

/* Posts a send of nbytes from buf to rank peer, matched by tag, and returns
 * at once. nbytes may be 0 (buf may then be NULL). */
mega_status mega_comm_isend(mega_comm *comm, const void *buf, size_t nbytes,
                            int peer, uint32_t tag, mega_req **req,
                            mega_err *err);

/* Posts a receive of exactly nbytes into buf from rank peer. */
mega_status mega_comm_irecv(mega_comm *comm, void *buf, size_t nbytes,
                            int peer, uint32_t tag, mega_req **req,
                            mega_err *err);

/* ---- Requests ---------------------------------------------------------- */

/* Waits until req completes, at most timeout_ms (<= 0: the communicator's
 * timeout). Returns MEGA_OK, or the request's failure. Waiting again on a
 * completed request returns the same result. */
mega_status mega_req_wait(mega_req *req, int timeout_ms, mega_err *err);

/* Never blocks: *done tells whether req has completed. Returns MEGA_OK while
 * it runs or when it completed well, else its failure (with *done true).
 * Gloo has only blocking waits, so the first test of a P2P request hands it
 * to a helper thread of the communicator that blocks for it (bounded by the
 * communicator's timeout from then on); requests only waited on cost no
 * thread. */
mega_status mega_req_test(mega_req *req, bool *done, mega_err *err);

/* Releases req; see "Buffer lifetime" above. NULL is ignored. */
void mega_req_free(mega_req *req);

/* When a collective ran, for measurements (seed 003: how much of a gradient
 * reduction the pipeline hid). Times are CLOCK_REALTIME seconds, so ranks
 * on one node compare them; the comm thread's figures are its own thread's
 * CPU time and its time runnable but waiting for a core (Linux schedstat;
 * -1 where unknown) while the collective ran. */
typedef struct mega_req_times {
  double queued;  /* issued by the caller */
  double started; /* the comm thread began it (the collectives before it were done) */
  double done;    /* the comm thread finished it (the peers had all taken part) */
  double cpu_s, runq_s;
} mega_req_times;

/* Fills *t for a collective that has completed (a wait or test saw it);
 * false for P2P requests, requests still running, and implementations that
 * do not record times (NCCL), *t then zeroed. */
bool mega_req_get_times(const mega_req *req, mega_req_times *t);

/* ---- Collectives --------------------------------------------------------
 * Each blocking call is its mega_comm_i* twin followed by mega_req_wait with
 * the same timeout. timeout_ms also bounds the collective itself.
 * Collectives move float32 (MEGA_DT_F32) or raw bytes (MEGA_DT_BYTE). */

typedef enum mega_dtype {
  MEGA_DT_F32 = 0,
  MEGA_DT_BYTE,
} mega_dtype;

/* Sums count floats of buf over all ranks, in place: a ring on Gloo's P2P
 * (a reduce-scatter, then an all-gather), Gloo's own algorithm (segments of
 * at most 1M floats, two in flight) but for small buffers (16K floats a
 * rank or fewer), which go in one segment a rank's chunk. */
mega_status mega_comm_all_reduce(mega_comm *comm, float *buf, size_t count,
                                 int timeout_ms, mega_err *err);
mega_status mega_comm_iall_reduce(mega_comm *comm, float *buf, size_t count,
                                  int timeout_ms, mega_req **req,
                                  mega_err *err);
/* The element-wise maximum instead of the sum (a vocabulary-parallel
 * softmax's row maxima). */
mega_status mega_comm_all_reduce_max(mega_comm *comm, float *buf, size_t count,
                                     int timeout_ms, mega_err *err);
mega_status mega_comm_iall_reduce_max(mega_comm *comm, float *buf, size_t count,
                                      int timeout_ms, mega_req **req, mega_err *err);

/* Rank r contributes counts[r] elements from in; out receives every rank's
 * elements, rank by rank (sum(counts) elements). in may point into out at
 * this rank's place (in place). counts is copied; it needs no lifetime. */
mega_status mega_comm_all_gather(mega_comm *comm, const void *in, void *out,
                                 const size_t *counts, mega_dtype dt,
                                 int timeout_ms, mega_err *err);
mega_status mega_comm_iall_gather(mega_comm *comm, const void *in, void *out,
                                  const size_t *counts, mega_dtype dt,
                                  int timeout_ms, mega_req **req,
                                  mega_err *err);

/* Copies count elements of buf on rank root to buf on every rank. */
mega_status mega_comm_broadcast(mega_comm *comm, void *buf, size_t count,
                                mega_dtype dt, int root, int timeout_ms,
                                mega_err *err);
mega_status mega_comm_ibroadcast(mega_comm *comm, void *buf, size_t count,
                                 mega_dtype dt, int root, int timeout_ms,
                                 mega_req **req, mega_err *err);

/* in holds sum(counts) floats on every rank, laid out rank by rank; out
 * (counts[rank] floats) receives the sum over ranks of this rank's part.
 * Either out does not overlap in, and in is not modified; or out is this
 * rank's own part of in (in + the counts before it: in place, as the
 * distributed optimizer reduces a bucket into its shard), and only that
 * part changes.
 * Cost: a ring of size-1 steps. Each rank sends every chunk but its own
 * once and receives every chunk but its left neighbour's (for equal counts,
 * (n-1)/n of the data each way: half an all-reduce's traffic), pays size-1
 * latencies, adds each received chunk once, and holds two scratch chunks of
 * max(counts) floats. Built on Gloo's P2P, since Gloo has no usable
 * reduce-scatter; a step does not overlap its transfer with its sum. */
mega_status mega_comm_reduce_scatter(mega_comm *comm, const float *in,
                                     float *out, const size_t *counts,
                                     int timeout_ms, mega_err *err);
mega_status mega_comm_ireduce_scatter(mega_comm *comm, const float *in,
                                      float *out, const size_t *counts,
                                      int timeout_ms, mega_req **req,
                                      mega_err *err);

mega_status mega_comm_barrier(mega_comm *comm, int timeout_ms, mega_err *err);
mega_status mega_comm_ibarrier(mega_comm *comm, int timeout_ms,
                               mega_req **req, mega_err *err);

#ifdef __cplusplus
}
#endif

#endif
