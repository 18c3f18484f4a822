/* megactl: the thin client people type. */
#include <stdio.h>
#include <string.h>

#include "client/commands.h"
#include "client/conn.h"

typedef int (*command_fn)(int argc, char **argv);

static int cmd_version(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("megactl %s\n", MEGA_VERSION);
  return 0;
}

static const struct {
  const char *name;
  command_fn fn;
  const char *summary;
} commands[] = {
    {"version", cmd_version, "print megactl's version"},
    {"plan", megactl_plan, "print, simulate and draw a pipeline schedule (no cluster needed)"},
    {"submit", megactl_submit, "submit a training job; prints its id last"},
    {"watch", megactl_watch, "follow a job's steps and events until it ends"},
    {"status", megactl_status, "show one job"},
    {"ls", megactl_ls, "list jobs"},
    {"cancel", megactl_cancel, "cancel a job"},
    {"resume", megactl_resume, "restart a failed job from its newest checkpoint"},
    {"rescale", megactl_rescale, "re-plan a running job on N nodes at its next checkpoint"},
    {"nodes", megactl_nodes, "list the cluster's nodes"},
    {"trace", megactl_trace, "download a job's Chrome trace"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: megactl [--server ADDR] COMMAND [flags]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\nRun 'megactl COMMAND --help' for a command's flags.\n"
             "--server ADDR (before or after the command) is megad's host:port or unix:/path;\n"
             "the default is $MEGA_SERVER, else " MEGACTL_DEFAULT_SERVER ".\n");
}

int main(int argc, char **argv) {
  /* --server before the command; each cluster command also takes it after. */
  while (argc > 1 && !strncmp(argv[1], "--server", 8) && (argv[1][8] == '=' || !argv[1][8])) {
    if (argv[1][8] == '=') {
      megactl_set_server(argv[1] + 9);
      argc -= 1, argv += 1;
    } else if (argc > 2) {
      megactl_set_server(argv[2]);
      argc -= 2, argv += 2;
    } else {
      fprintf(stderr, "megactl: --server needs a value (host:port or unix:/path)\n");
      return 2;
    }
  }
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  /* as megad --version and megaw --version */
  if (!strcmp(argv[1], "--version")) return cmd_version(argc - 1, argv + 1);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "megactl: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
