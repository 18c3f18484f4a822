/* Slurm's host lists: "gpu[01-04,07],cpu3" -> gpu01 gpu02 gpu03 gpu04 gpu07
 * cpu3, as `scontrol show hostnames` expands them (checked against
 * slurm-wlm 22.05's scontrol, tests/core/test_hostlist.c):
 *
 *   - entries are separated by commas outside brackets; empty ones vanish;
 *   - a bracket holds ranges and numbers separated by commas ("01-04,07");
 *     a range's numbers keep the width of its low end ("008-011" ->
 *     008 009 010 011, "1-010" -> 1 .. 10);
 *   - several brackets in one entry multiply ("a[1-2]b[3-4]" -> a1b3 a1b4
 *     a2b3 a2b4);
 *   - names repeat as often as they are listed, in order.
 *
 * A range that runs backwards, a bracket left open or a bracket with
 * anything but digits, '-' and ',' is refused with a message naming it.
 * Pure: no I/O, no globals. */
#ifndef MEGA_CORE_HOSTLIST_H
#define MEGA_CORE_HOSTLIST_H

#include <stddef.h>

#include "core/status.h"

/* At most this many names from one list (a typo like n[1-99999999] fails
 * instead of eating the memory). */
#define MEGA_HOSTLIST_MAX 65536

/* Expands list into *out, an array of *n strings (the caller's: free with
 * mega_hostlist_free). On failure *out is NULL and *n 0. */
mega_status mega_hostlist_expand(const char *list, char ***out, size_t *n, mega_err *err);
void mega_hostlist_free(char **names, size_t n);

#endif
