/* megactl plan run as a user runs it, for the plan tests: the built binary
 * (the test's argv[1]) in a child process, its stdout and stderr captured in
 * files of a temporary directory, and what to expect of them. Every helper
 * fails the running cmocka test. */
#ifndef MEGA_TESTS_PLAN_RUN_H
#define MEGA_TESTS_PLAN_RUN_H

#include <jansson.h>

/* Takes megactl's path from argv[1], makes the temporary directory and
 * sets COLUMNS to 80; nonzero (with why on stderr) if it cannot. */
int plan_init(int argc, char **argv);
/* Removes the directory and all in it: 0, or 1 (with why on stderr) if it
 * cannot, which fails the test (a test run leaves nothing in /tmp). */
int plan_cleanup(void);

typedef struct result {
  int status; /* exit status */
  char *out, *err;
} result;

/* Runs `megactl plan ARGS...` (NULL-terminated); fails the test if it does
 * not exit within 60 s. Free with result_free. */
result plan(const char *first, ...);
void result_free(result *r);
/* r is a usage error (status 2) whose message says why; frees it. */
void refused(result r, const char *why);
/* One readable line on stderr, nothing on stdout, and the exit status;
 * frees r. */
void expect_error(result r, int status, const char *needle);
/* r succeeded with nothing on stderr: *out is its stdout as JSON. */
void ok_json(result *r, json_t **out);
json_t *parse_json(const char *text);
/* o's field key, which must be a number. */
double num(json_t *o, const char *key);

/* A file's whole text (malloc'd), and a file written with text. */
char *slurp(const char *path);
void spit(const char *path, const char *text);
/* name in the temporary directory (one of four static buffers, reused). */
char *tmp_path(const char *name);

#endif
