/* The job-spec tests' shared pieces: a small valid job (base), specs built
 * on it, the expectations on parse and check errors, and a spec with every
 * flag away from its default. Every helper fails the running cmocka test. */
#ifndef MEGA_TESTS_JOBSPEC_FIXTURE_H
#define MEGA_TESTS_JOBSPEC_FIXTURE_H

#include "core/jobspec.h"

extern const char *const jf_base_argv[];
extern const int jf_base_argc;
#define base_argv jf_base_argv
#define BASE_ARGC jf_base_argc

/* an argv literal and its length, in the two orders the calls take */
#define NARGS(...) (int)(sizeof((char *[]){__VA_ARGS__}) / sizeof(char *))
#define ARGV(...) (char *const[]){__VA_ARGS__}, NARGS(__VA_ARGS__)
#define PARSE_ARGS(...) NARGS(__VA_ARGS__), (char *const[]){__VA_ARGS__}

void expect_msg(const mega_err *err, const char *want);
/* base, then extra flags on top; fails the test when parsing fails */
void make_spec(mega_jobspec *s, char *const *extra, int n);
void expect_parse_error(char *const *argv, int argc, mega_status want_st, const char *want);
/* check with base + extra flags, at the given world size and data size */
void expect_check_error(char *const *extra, int n, int world, long long bytes, const char *want);
void expect_check_ok(char *const *extra, int n, int world, long long bytes);
/* A spec with every flag away from its default. */
void make_full(mega_jobspec *s);

#endif
