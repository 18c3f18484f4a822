/* Private to core/jobspec*.c: the flag table and the typed setters that
 * parsing, checking and serialization share. */
#ifndef MEGA_CORE_JOBSPEC_INTERNAL_H
#define MEGA_CORE_JOBSPEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/jobspec.h"

typedef struct flagdef {
  mega_jobflag info;
  size_t off;
  long long idef; /* int, bool, enum */
  double fdef;    /* float */
} flagdef;

extern const flagdef mega_jf_table[];
extern const int mega_jf_nflags;
#define NFLAGS mega_jf_nflags

/* A refusal of the job; err is the function's. */
#define BAD(...) mega_fail(err, MEGA_ERR_INVALID, "invalid job: " __VA_ARGS__)

#define FIELD(s, f, type) ((type *)((char *)(s) + (f)->off))
#define CFIELD(s, f, type) ((const type *)((const char *)(s) + (f)->off))

int mega_jf_nchoices(const flagdef *f);
bool mega_jf_is_default(const mega_jobspec *s, const flagdef *f);
void mega_jf_set_default(mega_jobspec *s, const flagdef *f);
void mega_jf_format_double(double v, char *buf, size_t n);
/* The one place a flag's bounds are enforced; lead starts the message. */
mega_status mega_jf_check_bounds(const flagdef *f, double v, const char *lead, mega_err *err);
mega_status mega_jf_set_string(mega_jobspec *s, const flagdef *f, const char *v, mega_err *err);
/* Replaces the list with copies of words[0..n). */
mega_status mega_jf_set_list(mega_jobspec *s, const flagdef *f, const char *const *words, int n,
                             mega_err *err);
void mega_jf_list_free(mega_strlist *l);
mega_status mega_jf_set_enum(mega_jobspec *s, const flagdef *f, const char *v, mega_err *err);
mega_status mega_jf_set_int(mega_jobspec *s, const flagdef *f, int v, mega_err *err);
mega_status mega_jf_set_float(mega_jobspec *s, const flagdef *f, double v, mega_err *err);
mega_status mega_jf_parse_float_text(const char *name, const char *v, double *out, mega_err *err);

/* jobspec_batch.c: --train-iters/--train-samples and the rampup (dp 0:
 * not known yet), and the LR flags. Messages start "invalid job: ". */
mega_status mega_jobspec_check_batch(const mega_jobspec *s, int dp, mega_err *err);
mega_status mega_jobspec_check_lr(const mega_jobspec *s, mega_err *err);

/* Megatron's flags mega knows but does not take as its own (jobspec_compat.c).
 * argv[*i]'s name is its first n characters. An accepted value (one that
 * restates what mega does) is consumed: MEGA_OK, *i advanced, nothing
 * stored. Any other is MEGA_ERR_INVALID with the reason and what to use
 * instead; MEGA_ERR_NOT_FOUND when Megatron's flag is not in the table. */
mega_status mega_jf_compat_parse(int argc, char *const *argv, int *i, size_t n, mega_err *err);
int mega_jf_compat_count(void);
/* mega's name for Megatron's spelling arg[0..n) of one of mega's flags, or NULL;
 * *off: Megatron's spelling sets that boolean flag false (store_false) */
const char *mega_jf_compat_alias(const char *arg, size_t n, bool *off);
/* Entry k's flag name, for suggestions; NULL for a prefix entry. */
const char *mega_jf_compat_name(int k);
/* The accepted flags as help text (malloc'd; NULL when out of memory). */
char *mega_jf_compat_help(void);
/* For a value of mega's enum flag `name` that mega does not take but
 * Megatron does (Llama2Tokenizer, yarn): why, and what to give instead, as
 * a clause to end the refusal with (static); NULL when there is none. */
const char *mega_jf_compat_enum_hint(const char *name);

#endif
