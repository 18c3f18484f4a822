/* The node table of membership (members.h): nodes found, added, described
 * and lost. Below members.c (heartbeats) and members_etcd.c (etcd), which
 * both keep it. */
#include "daemon/members/members_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/util.h"

const char *members_state_name(Mega__V1__NodeState s) {
  switch (s) {
  case MEGA__V1__NODE_STATE__NODE_STATE_ALIVE: return "alive";
  case MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT: return "suspect";
  case MEGA__V1__NODE_STATE__NODE_STATE_DEAD: return "dead";
  case MEGA__V1__NODE_STATE__NODE_STATE_LEFT: return "left";
  default: return "unknown";
  }
}

void members_node_free(megad_node *n) {
  if (!n) return;
  free(n->id);
  free(n->address);
  free(n->version);
  free(n->backend);
  free(n->device_name);
  for (size_t i = 0; i < n->njob_ids; i++) free(n->job_ids[i]);
  free(n->job_ids);
  free(n);
}

megad_node *megad_members_find(megad_members *m, const char *id) {
  for (size_t i = 0; id && i < m->nnodes; i++)
    if (!strcmp(m->nodes[i]->id, id)) return m->nodes[i];
  return NULL;
}

megad_node *megad_members_self(megad_members *m) { return m->nodes[0]; }

bool megad_node_usable(const megad_node *n) {
  return n->state == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
}

megad_node *members_node_add(megad_members *m, const char *id, const char *address) {
  megad_node **v = realloc(m->nodes, (m->nnodes + 1) * sizeof *v);
  if (!v) return NULL;
  m->nodes = v;
  megad_node *n = calloc(1, sizeof *n);
  if (!n || !(n->id = strdup(id)) || !(n->address = megad_strdup(address))) {
    members_node_free(n);
    return NULL;
  }
  n->state = MEGA__V1__NODE_STATE__NODE_STATE_ALIVE;
  n->seen_ms = uv_now(m->b->loop);
  m->nodes[m->nnodes++] = n;
  m->view_version++;
  return n;
}

void members_set_address(megad_members *m, megad_node *n, const char *address, uint64_t inc) {
  if (!address || !address[0] || inc < n->address_inc) return;
  n->address_inc = inc;
  if (!strcmp(n->address, address)) return;
  char *a = strdup(address);
  if (!a) return;
  megad_forget_channel(m->b, n->address);
  free(n->address);
  n->address = a;
}

void members_set_str(char **dst, const char *src) {
  if (!src || (*dst && !strcmp(*dst, src))) return;
  char *c = strdup(src);
  if (!c) return;
  free(*dst);
  *dst = c;
}

void members_set_job_ids(megad_node *n, char **ids, size_t k) {
  char **v = calloc(k ? k : 1, sizeof *v);
  if (!v) return;
  for (size_t i = 0; i < k; i++) v[i] = megad_strdup(ids[i]);
  for (size_t i = 0; i < n->njob_ids; i++) free(n->job_ids[i]);
  free(n->job_ids);
  n->job_ids = v;
  n->njob_ids = k;
}

void members_node_msg(megad_node *n, Mega__V1__Node *m) {
  mega__v1__node__init(m);
  m->id = n->id;
  m->address = n->address;
  m->state = n->state;
  m->slots = n->slots;
  m->slots_used = n->slots_used;
  m->backend = n->backend ? n->backend : "";
  m->device_name = n->device_name ? n->device_name : "";
  m->incarnation = n->incarnation;
  m->last_heartbeat_unix_ms = n->last_heartbeat_unix_ms;
  m->version = n->version ? n->version : "";
  m->job_ids = n->job_ids;
  m->n_job_ids = n->njob_ids;
}

/* Refreshes what this node says about itself. */
void members_refresh_self(megad_members *m) {
  megad_node *self = megad_members_self(m);
  const char *ids[256];
  size_t k = 0;
  if (m->cbs.self_load) self->slots_used = m->cbs.self_load(m->cbs.arg, ids, 256, &k);
  members_set_job_ids(self, (char **)ids, k);
  self->last_heartbeat_unix_ms = megad_unix_ms();
}

void members_node_lost(megad_members *m, megad_node *n, Mega__V1__NodeState to, const char *why) {
  n->state = to;
  m->view_version++;
  members_set_job_ids(n, NULL, 0); /* its ranks are gone with it */
  megad_forget_channel(m->b, n->address);
  megad_warn(m->b, "%s", why);
  if (m->cbs.node_lost) m->cbs.node_lost(m->cbs.arg, n, why);
}
