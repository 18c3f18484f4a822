/* A megaw of another build, for test_megad_versions: the real pipe code
 * (worker/rank/link.h), but this program links no mega_build.c, so its
 * Hello says MEGA_VERSION alone (core/version.h), as a megaw older than the
 * builds that name their commit does. It says hello, then waits for megad
 * to stop it. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "worker/rank/link.h"

int main(void) {
  const char *fd = getenv("MEGA_WORKER_FD");
  mega_link *l = NULL;
  mega_err err = {0};
  if (!fd || mega_link_open(atoi(fd), 0, &l, &err) != MEGA_OK ||
      mega_link_start(l, NULL, NULL, &err) != MEGA_OK ||
      mega_link_send_hello(l, "cpu", &err) != MEGA_OK) {
    fprintf(stderr, "megaw_other_build: %s\n", fd ? err.msg : "no MEGA_WORKER_FD");
    return 1;
  }
  for (;;) pause(); /* megad kills it */
}
