/* The node table of membership (members.h): nodes found, added, described
 * and lost. Below members.c (heartbeats) and members_etcd.c (etcd), which
 * both keep it. */
#include "daemon/members/members_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/version.h"
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

void members_set_version(megad_members *m, megad_node *n, const char *v) {
  bool same = n->version && v && !strcmp(n->version, v);
  members_set_str(&n->version, v);
  if (same || !v || !strcmp(v, mega_version())) return;
  megad_log(m->b, "node %s runs mega %s, this node %s: a job's ranks run one build, so this "
            "node places no ranks of its jobs there and starts none of that node's jobs "
            "(README \"Upgrading\")", n->id,
            v[0] ? v : "of no version (an older build)", mega_version());
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
  n->probe_at_ms = 0; /* the next tick asks it first */
  n->probe_gap_ms = 0;
  m->view_version++;
  members_set_job_ids(n, NULL, 0); /* its ranks are gone with it */
  megad_forget_channel(m->b, n->address);
  megad_warn(m->b, "%s", why);
  if (m->cbs.node_lost) m->cbs.node_lost(m->cbs.arg, n, why);
}

/* ---- forgetting ---- */

bool members_forgotten(const megad_members *m, const char *id, uint64_t inc) {
  for (size_t i = 0; i < MEGAD_MEMBERS_FORGOTTEN_MAX; i++)
    if (m->forgotten[i].id[0] && !strcmp(m->forgotten[i].id, id))
      return inc <= m->forgotten[i].incarnation;
  return false;
}

void members_unforget(megad_members *m, const char *id) {
  for (size_t i = 0; i < MEGAD_MEMBERS_FORGOTTEN_MAX; i++)
    if (!strcmp(m->forgotten[i].id, id)) m->forgotten[i].id[0] = '\0';
}

static void remember_forgotten(megad_members *m, const char *id, uint64_t inc) {
  members_unforget(m, id);
  megad_forgotten *f = &m->forgotten[m->forgotten_next];
  m->forgotten_next = (m->forgotten_next + 1) % MEGAD_MEMBERS_FORGOTTEN_MAX;
  snprintf(f->id, sizeof f->id, "%s", id);
  f->incarnation = inc;
}

mega_status megad_members_forget(megad_members *m, const char *id, uint64_t inc, bool unknown_ok,
                                 mega_err *err) {
  if (!id || !id[0]) return mega_fail(err, MEGA_ERR_INVALID, "which node? give its name");
  if (strlen(id) > MEGAD_NODE_NAME_MAX)
    return mega_fail(err, MEGA_ERR_INVALID, "a node name is at most %d bytes",
                     MEGAD_NODE_NAME_MAX);
  size_t i = 0;
  while (i < m->nnodes && strcmp(m->nodes[i]->id, id)) i++;
  if (i == m->nnodes) {
    if (!unknown_ok)
      return mega_fail(err, MEGA_ERR_NOT_FOUND,
                       "node %s lists no node '%s' (megactl nodes lists those it does)",
                       m->b->node_id, id);
    remember_forgotten(m, id, inc);
    return MEGA_OK;
  }
  megad_node *n = m->nodes[i];
  if (n->self)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "node %s cannot forget itself: ask another node, after stopping this one",
                     id);
  if (n->state == MEGA__V1__NODE_STATE__NODE_STATE_ALIVE ||
      n->state == MEGA__V1__NODE_STATE__NODE_STATE_SUSPECT)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "node %s is %s here (heard from %.1f s ago): stop its megad first; only a "
                     "dead or departed node can be forgotten",
                     id, members_state_name(n->state),
                     (double)(uv_now(m->b->loop) - n->seen_ms) / 1000);
  remember_forgotten(m, id, n->incarnation > inc ? n->incarnation : inc);
  megad_forget_channel(m->b, n->address);
  megad_log(m->b, "node %s (%s, %s) forgotten", id, n->address, members_state_name(n->state));
  members_node_free(n);
  memmove(&m->nodes[i], &m->nodes[i + 1], (m->nnodes - i - 1) * sizeof *m->nodes);
  m->nnodes--;
  m->view_version++;
  return MEGA_OK;
}
