/* Inside membership, files stacked: members.c over members_etcd.c
 * (membership from etcd) over members_nodes.c (the node table). Not for the
 * rest of megad (members.h is the contract). */
#ifndef MEGA_DAEMON_MEMBERS_INTERNAL_H
#define MEGA_DAEMON_MEMBERS_INTERNAL_H

#include "daemon/members/members.h"

/* members_nodes.c */
const char *members_state_name(Mega__V1__NodeState s);
void members_node_free(megad_node *n);
megad_node *members_node_add(megad_members *m, const char *id, const char *address);
/* n's address in incarnation inc (0: unknown): calls go there, unless an
 * address of a later incarnation is known already (views bring old news
 * after new). */
void members_set_address(megad_members *m, megad_node *n, const char *address, uint64_t inc);
void members_set_str(char **dst, const char *src);
/* n's build; says so in the log when it becomes one other than this node's. */
void members_set_version(megad_members *m, megad_node *n, const char *v);
void members_set_job_ids(megad_node *n, char **ids, size_t k);
/* n as a message; strings borrowed from n. */
void members_node_msg(megad_node *n, Mega__V1__Node *m);
/* Refreshes what this node says about itself (load, job ids). */
void members_refresh_self(megad_members *m);
/* n is lost (DEAD, LEFT, or ALIVE again as a new incarnation): callbacks. */
void members_node_lost(megad_members *m, megad_node *n, Mega__V1__NodeState to, const char *why);
/* Whether id was forgotten at incarnation inc or a later one: news of it
 * from others is old news. */
bool members_forgotten(const megad_members *m, const char *id, uint64_t inc);
/* id spoke to this node itself: it is not forgotten any more. */
void members_unforget(megad_members *m, const char *id);

/* etcd mode (members_etcd.c) */
void members_etcd_start(megad_members *m);
void members_etcd_leave(megad_members *m);
typedef struct members_loads_wait {
  megad_members_loads_cb cb;
  void *arg;
} members_loads_wait;

#endif
