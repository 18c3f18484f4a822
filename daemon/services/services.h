/* The service layer: what the wire asks of megad, on top of every other
 * layer. control.c serves Control (forwarding calls about a job to its
 * coordinator when another node owns it; forget.c drops a node gone for
 * good from every view), peer.c the Peer calls about jobs,
 * metrics.c GET /metrics (served by http.c). Members and kvserve register their own calls. */
#ifndef MEGA_DAEMON_SERVICES_H
#define MEGA_DAEMON_SERVICES_H

#include "daemon/coord/coord.h"

typedef struct megad_services {
  megad_base *b;
  megad_jobs *jobs;
  megad_members *members;
  megad_launcher *L;
  megad_coord *coord;
  mega_rpc_server *srv; /* for its per-method counts; may be NULL */
  void *http;           /* metrics.c */
  const char *token; /* the cluster token (NULL: none): /metrics wants it as a bearer token */
  /* coordinators a forwarded call could not reach, and since when (unix
   * ms); cleared by the next answer (forward.c) */
  struct {
    char node[MEGAD_NODE_NAME_MAX + 1];
    int64_t since_ms;
  } unreachable[16];
} megad_services;

/* The largest request megad reads: a job spec is far smaller, and a bigger
 * message is refused by gRPC before it is parsed. */
#define MEGAD_MAX_REQUEST_BYTES (4u << 20)

void megad_control_register(megad_services *s, mega_rpc_server *srv);
/* Control.ForgetNode (forget.c; megad_control_register registers it). */
void megad_on_forget_node(mega_rpc_call *call, const ProtobufCMessage *msg, void *data);
/* Whether this megad takes new jobs now (false, with why, while etcd is
 * unreachable or a write to it is not yet durable, or while it stops):
 * SubmitJob's test, and GET /readyz's. */
bool megad_services_ready(megad_services *s, const char **why);
void megad_peer_register(megad_services *s, mega_rpc_server *srv);

/* Answers call from this node's own copy of job_id (etcd mode: the
 * mirror) when its coordinator cannot be reached, saying since when; true
 * when it answered. */
typedef bool (*megad_forward_fallback)(megad_services *s, mega_rpc_call *call,
                                       const char *job_id, int64_t unreachable_ms);

/* Forwards a call about job_id to the job's coordinator (from the id,
 * "j-N-NODE") when that is another node, relaying the answer or stream.
 * Returns false, touching nothing, when this node is the coordinator or the
 * node is not known: the caller answers then. When the coordinator cannot
 * be reached (or is down), fallback (may be NULL) may answer; otherwise the
 * call fails ABORTED, naming this node and the coordinator, so a client
 * neither takes the coordinator's address for its own server's nor this
 * node for unreachable, and may ask again (a takeover is seconds away). */
bool megad_forward(megad_services *s, mega_rpc_call *call, const char *job_id,
                   const ProtobufCMessage *req, megad_forward_fallback fallback);
/* Since when (unix ms) a forwarded call could not reach node; 0: it
 * answered the last one, or none was tried. */
int64_t megad_unreachable_since(const megad_services *s, const char *node);

/* GET /metrics on addr ("HOST:PORT"); token (NULL: open) is then wanted as
 * `Authorization: Bearer TOKEN`. Open whatever the token, for probes (a
 * Kubernetes kubelet's): GET /healthz (200 "ok" while megad's loop answers)
 * and GET /readyz (200 while megad_services_ready, else 503 and why). */
mega_status megad_metrics_start(megad_services *s, const char *addr, const char *token,
                                mega_err *err);
void megad_metrics_stop(megad_services *s);

#endif
