/* The coordinator's queue of waiting jobs: intrusive and doubly linked, so
 * adding and removing cost O(1) (a restarting job walks to its place by age)
 * and a scheduling pass starts at the oldest waiting job instead of walking
 * every job this node ever held. */
#include "daemon/coord_internal.h"

void coord_wq_add(megad_coord *c, mega_job *j) {
  if (j->wq_in) return;
  mega_job *after = c->wq_tail;
  while (after && after->created_ms > j->created_ms) after = after->wq_prev;
  j->wq_prev = after;
  j->wq_next = after ? after->wq_next : c->wq_head;
  if (j->wq_next) j->wq_next->wq_prev = j;
  else c->wq_tail = j;
  if (after) after->wq_next = j;
  else c->wq_head = j;
  j->wq_in = true;
  j->wq_epoch = 0;
  c->nwaiting++;
}

void coord_wq_remove(megad_coord *c, mega_job *j) {
  if (!j->wq_in) return;
  if (j->wq_prev) j->wq_prev->wq_next = j->wq_next;
  else c->wq_head = j->wq_next;
  if (j->wq_next) j->wq_next->wq_prev = j->wq_prev;
  else c->wq_tail = j->wq_prev;
  j->wq_prev = j->wq_next = NULL;
  j->wq_in = false;
  c->nwaiting--;
}
