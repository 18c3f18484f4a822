/* The bottom of the etcd client: which endpoint calls go to, when to move
 * off it, and what the client notes of each exchange (megad_etcd_ok). Every
 * file of the client above, authentication included, fails over with it. */
#include "daemon/etcd/etcd_internal.h"

#include <stdio.h>

bool etcd_err_failover(const mega_err *err) {
  return err->status == MEGA_ERR_IO || err->status == MEGA_ERR_TIMEOUT;
}

bool megad_etcd_retryable(const mega_err *err) { return etcd_err_failover(err); }

void etcd_endpoint_failed(megad_etcd *e, size_t ep) {
  if (e->cur == ep) e->cur = (ep + 1) % e->nep;
}

void etcd_note(megad_etcd *e, const mega_err *err) {
  if (err->status == MEGA_OK || !etcd_err_failover(err)) {
    e->ok = true;
    e->why[0] = 0;
    return;
  }
  e->ok = false;
  snprintf(e->why, sizeof e->why, "etcd unreachable at %s: %s", e->eps_text, err->msg);
}
