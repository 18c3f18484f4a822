/* The coordinator's queue of waiting jobs: intrusive and doubly linked, so
 * adding and removing cost O(1) (a restarting job walks to its place by age)
 * and a scheduling pass starts at the oldest waiting job instead of walking
 * every job this node ever held. */
#include "daemon/coord/coord_internal.h"

#include <stdlib.h>

#include "daemon/model/util.h"

void coord_wq_add(megad_coord *c, mega_job *j) {
  if (j->coord.wq_in) return;
  mega_job *after = c->wq_tail;
  while (after && after->created_ms > j->created_ms) after = after->coord.wq_prev;
  j->coord.wq_prev = after;
  j->coord.wq_next = after ? after->coord.wq_next : c->wq_head;
  if (j->coord.wq_next) j->coord.wq_next->coord.wq_prev = j;
  else c->wq_tail = j;
  if (after) after->coord.wq_next = j;
  else c->wq_head = j;
  j->coord.wq_in = true;
  j->coord.wq_epoch = 0;
  c->nwaiting++;
}

void coord_wq_remove(megad_coord *c, mega_job *j) {
  if (!j->coord.wq_in) return;
  if (j->coord.wq_prev) j->coord.wq_prev->coord.wq_next = j->coord.wq_next;
  else c->wq_head = j->coord.wq_next;
  if (j->coord.wq_next) j->coord.wq_next->coord.wq_prev = j->coord.wq_prev;
  else c->wq_tail = j->coord.wq_prev;
  j->coord.wq_prev = j->coord.wq_next = NULL;
  j->coord.wq_in = false;
  c->nwaiting--;
}
