/* Text output of `megactl ls`, `status` and `nodes`: pure functions of the
 * messages (and of now, for ages), so tests can render constructed ones.
 * Times are shown in local time. Nothing here keeps a pointer past a call. */
#ifndef MEGA_CLIENT_TABLES_H
#define MEGA_CLIENT_TABLES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/mega.pb-c.h"

/* ID NAME STATE WORLD TP/PP/DP ITER AGE, one row per job, in the order
 * given; "no jobs" when n is 0. */
void tables_jobs(FILE *f, Mega__V1__Job *const *jobs, size_t n, int64_t now_ms);

/* "key  value" lines about one job: state and error, world and layout,
 * progress, times, placement, the spec. */
void tables_job_detail(FILE *f, const Mega__V1__Job *job, int64_t now_ms);

/* ID ADDRESS STATE BACKEND SLOTS DEVICE HEARTBEAT VERSION JOBS, with '*'
 * before the node that answered (self_id), and a line after when the live
 * nodes run more than one build. */
void tables_nodes(FILE *f, Mega__V1__Node *const *nodes, size_t n, const char *self_id,
                  int64_t now_ms);

/* A short age: "4s", "12m", "3h", "2d"; "-" when then_ms is 0. */
void tables_age(int64_t then_ms, int64_t now_ms, char *buf, size_t n);
/* After megad refused what this megactl took (a job's flags): words that
 * say the two are different builds, into buf, when server (megad's version,
 * "" from one that does not name it) is not own; else "". */
void tables_other_build(const char *server, const char *own, char *buf, size_t n);

/* Global ranks as ranges: "0-3,6,8-9". */
void tables_ranks(const uint32_t *ranks, size_t n, char *buf, size_t cap);

#endif
