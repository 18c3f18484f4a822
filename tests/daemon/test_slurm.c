/* daemon/slurm: a megad's name, peers and slots from a Slurm allocation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/slurm.h"

static void peers_are_the_other_nodes(void **state) {
  (void)state;
  char *p = NULL;
  size_t n = 0;
  mega_err err = {0};
  assert_int_equal(megad_slurm_peers("gpu[01-04,07],cpu3", "gpu02", 7070, &p, &n, &err), MEGA_OK);
  assert_string_equal(p, "gpu01:7070,gpu03:7070,gpu04:7070,gpu07:7070,cpu3:7070");
  assert_int_equal(n, 6);
  free(p);
  assert_int_equal(megad_slurm_peers("n1", "n1", 9, &p, &n, &err), MEGA_OK);
  assert_string_equal(p, ""); /* alone */
  assert_int_equal(n, 1);
  free(p);
  assert_int_equal(megad_slurm_peers("n[1-2],n1", "n2", 9, &p, &n, &err), MEGA_OK);
  assert_string_equal(p, "n1:9"); /* each once */
  assert_int_equal(n, 2);
  free(p);
  assert_int_equal(megad_slurm_peers("n[1-2]", "vm", 9, &p, &n, &err), MEGA_ERR_INVALID);
  assert_null(p);
  assert_non_null(strstr(err.msg, "vm, is not in SLURM_JOB_NODELIST n[1-2]: give --node-name"));
  assert_int_equal(megad_slurm_peers("n[2-1]", "n1", 9, &p, &n, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "SLURM_JOB_NODELIST: host list entry 'n[2-1]'"));
}

static void from_the_environment(void **state) {
  (void)state;
  megad_slurm s;
  mega_err err = {0};
  unsetenv("SLURM_JOB_NODELIST");
  unsetenv("SLURM_NODELIST");
  assert_int_equal(megad_slurm_from_env("0.0.0.0:7070", NULL, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "SLURM_JOB_NODELIST is not set; start megad with srun"));
  setenv("SLURM_JOB_NODELIST", "n[1-3]", 1);
  setenv("SLURMD_NODENAME", "n3", 1);
  setenv("SLURM_CPUS_ON_NODE", "16", 1);
  unsetenv("SLURM_GPUS_ON_NODE");
  assert_int_equal(megad_slurm_from_env("0.0.0.0:0", NULL, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "needs --listen HOST:PORT with a fixed port"));
  assert_int_equal(megad_slurm_from_env("unix:/x", NULL, &s, &err), MEGA_ERR_INVALID);
  /* atoi took these as 7070: every node would have looked for its peers there */
  assert_int_equal(megad_slurm_from_env("0.0.0.0:7070x", NULL, &s, &err), MEGA_ERR_INVALID);
  assert_int_equal(megad_slurm_from_env("0.0.0.0: 7070", NULL, &s, &err), MEGA_ERR_INVALID);
  assert_int_equal(megad_slurm_from_env("0.0.0.0:7070", NULL, &s, &err), MEGA_OK);
  assert_string_equal(s.node_name, "n3");
  assert_string_equal(s.peers, "n1:7070,n2:7070");
  assert_int_equal(s.nnodes, 3);
  assert_int_equal(s.gpu_slots, 0);
  assert_int_equal(s.cpu_slots, 16);
  megad_slurm_free(&s);
  setenv("SLURM_GPUS_ON_NODE", "8", 1);
  assert_int_equal(megad_slurm_from_env("n1:7070", "n1", &s, &err), MEGA_OK);
  assert_null(s.node_name); /* --node-name was given */
  assert_string_equal(s.peers, "n2:7070,n3:7070");
  assert_int_equal(s.gpu_slots, 8);
  megad_slurm_free(&s);
  setenv("SLURM_GPUS_ON_NODE", "lots", 1);
  assert_int_equal(megad_slurm_from_env("n1:7070", "n1", &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "is not a count; give --slots N"));
  unsetenv("SLURMD_NODENAME");
  unsetenv("SLURM_GPUS_ON_NODE");
  assert_int_equal(megad_slurm_from_env("n1:7070", NULL, &s, &err), MEGA_ERR_INVALID);
  assert_non_null(strstr(err.msg, "SLURMD_NODENAME is not set"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(peers_are_the_other_nodes),
      cmocka_unit_test(from_the_environment),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
