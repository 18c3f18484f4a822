/* megactl: the thin client people type. */
#include <stdio.h>
#include <string.h>

#include "client/commands.h"

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
};

static void usage(FILE *f) {
  fprintf(f, "usage: megactl COMMAND [flags]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\nRun 'megactl COMMAND --help' for a command's flags.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "megactl: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
