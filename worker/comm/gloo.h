/* The Gloo communicator's entry points (gloo_*.cc), for gloo_ops.c: comm.h's
 * calls on Gloo's own objects. */
#ifndef MEGA_WORKER_GLOO_H
#define MEGA_WORKER_GLOO_H

#include "worker/comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct GlooComm GlooComm;
typedef struct GlooReq GlooReq;

mega_status gloo_comm_create(mega_store *store, const char *group, int rank, int size,
                             const char *hostname, int timeout_ms, GlooComm **out,
                             mega_err *err);
void gloo_comm_destroy(GlooComm *comm);
mega_status gloo_comm_status(const GlooComm *comm, mega_err *err);
void gloo_comm_abort(GlooComm *comm);
const char *gloo_comm_transport(const GlooComm *comm);
mega_status gloo_isend(GlooComm *comm, const void *buf, size_t nbytes, int peer, uint32_t tag,
                       GlooReq **req, mega_err *err);
mega_status gloo_irecv(GlooComm *comm, void *buf, size_t nbytes, int peer, uint32_t tag,
                       GlooReq **req, mega_err *err);
mega_status gloo_iall_reduce(GlooComm *comm, float *buf, size_t count, bool max,
                             int timeout_ms, GlooReq **req, mega_err *err);
mega_status gloo_iall_gather(GlooComm *comm, const void *in, void *out, const size_t *counts,
                             mega_dtype dt, int timeout_ms, GlooReq **req, mega_err *err);
mega_status gloo_ibroadcast(GlooComm *comm, void *buf, size_t count, mega_dtype dt, int root,
                            int timeout_ms, GlooReq **req, mega_err *err);
mega_status gloo_ireduce_scatter(GlooComm *comm, const float *in, float *out,
                                 const size_t *counts, int timeout_ms, GlooReq **req,
                                 mega_err *err);
mega_status gloo_ibarrier(GlooComm *comm, int timeout_ms, GlooReq **req, mega_err *err);
mega_status gloo_req_wait(GlooReq *req, int timeout_ms, mega_err *err);
mega_status gloo_req_test(GlooReq *req, bool *done, mega_err *err);
void gloo_req_free(GlooReq *req);
bool gloo_req_times(const GlooReq *req, mega_req_times *t);

#ifdef __cplusplus
}
#endif

#endif
