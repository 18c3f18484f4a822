/* megactl: the thin client people type. */
#include <stdio.h>
#include <string.h>

#include "client/commands.h"
#include "client/conn.h"
#include "core/version.h"

typedef int (*command_fn)(int argc, char **argv);

/* megactl --version: this build alone, asking no megad (as megad --version
 * and megaw --version); megactl version shows megad's too. */
static int print_version(void) {
  printf("megactl %s\n", mega_version());
  return 0;
}

static const struct {
  const char *name;
  command_fn fn;
  const char *summary;
} commands[] = {
    {"version", megactl_version, "print megactl's build and the answering megad's"},
    {"plan", megactl_plan, "print, simulate and draw a pipeline schedule (no cluster needed)"},
    {"submit", megactl_submit, "submit a training job; prints its id last"},
    {"watch", megactl_watch, "follow a job's steps and events until it ends"},
    {"status", megactl_status, "show one job"},
    {"ls", megactl_ls, "list jobs"},
    {"cancel", megactl_cancel, "cancel jobs (several ids, or --all-pending)"},
    {"resume", megactl_resume, "restart a failed job from its newest checkpoint"},
    {"rescale", megactl_rescale, "re-plan a running job on N nodes at its next checkpoint"},
    {"nodes", megactl_nodes, "list the cluster's nodes; nodes forget NAME drops a dead one"},
    {"trace", megactl_trace, "download a job's Chrome trace"},
    {"etcd-dump", megactl_etcd_dump, "print a cluster's keys in etcd, values decoded"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: megactl [--server ADDR] [--token-file FILE] [--tls-ca FILE] COMMAND [flags]\n\n"
             "commands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\nRun 'megactl COMMAND --help' for a command's flags.\n"
             "--server ADDR (before or after the command) is megad's host:port or unix:/path;\n"
             "the default is $MEGA_SERVER, else " MEGACTL_DEFAULT_SERVER ".\n"
             "--token-file FILE ($MEGA_TOKEN_FILE) holds the cluster token megad asks for;\n"
             "--tls-ca FILE ($MEGA_TLS_CA) is the CA of megad's certificate (TLS), and\n"
             "--tls-cert/--tls-key FILE ($MEGA_TLS_CERT/$MEGA_TLS_KEY) this client's own\n"
             "certificate when megad asks for one (--tls-client-auth).\n");
}

static int run(int argc, char **argv) {
  /* --server and the security flags before the command; each cluster
   * command also takes them after. */
  while (argc > 1 && !strncmp(argv[1], "--", 2) && argv[1][2]) {
    int i = 1, r;
    const char *server;
    if (!strcmp(argv[1], "--server") && argc < 3) {
      fprintf(stderr, "megactl: --server needs a value (host:port or unix:/path)\n");
      return 2;
    }
    if ((r = megactl_flag_value("", argc, argv, &i, "--server", &server)) == 1)
      megactl_set_server(server);
    else if (!r)
      r = megactl_security_flag("", argc, argv, &i);
    if (r < 0) return 2;
    if (!r) break;
    argc -= i - 1;
    argv += i - 1;
  }
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) return print_version();
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "megactl: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}

int main(int argc, char **argv) {
  int rc = run(argc, argv);
  /* a command that failed said why; one that did not fails for lost output */
  return rc == 0 && !megactl_output_ok(0) ? MEGACTL_EXIT_FAIL : rc;
}
