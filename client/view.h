/* The drawing of `megactl watch`, as pure functions of the messages, so a
 * test can render constructed StepMetrics and read the text.
 *
 * On a terminal, watch redraws a block in place (view_render), with job
 * events printed above it as lines that stay (view_event_line). Otherwise
 * it prints one plain line per iteration (view_step_line) and the same
 * event lines. Nothing here owns memory past a call; a view_model points
 * into the messages it was filled from. */
#ifndef MEGA_CLIENT_VIEW_H
#define MEGA_CLIENT_VIEW_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/mega.pb-c.h"
#include "proto/step_bubble.h"

typedef struct view_opts {
  int width;    /* terminal columns; lines never exceed it (at least 40 is used) */
  bool color;   /* ANSI colors */
  bool unicode; /* block characters; ASCII otherwise */
} view_opts;

/* What the live block shows: the job as GetJob gave it, kept current by
 * the events and steps of the watch. */
typedef struct view_model {
  const char *job_id, *name;
  Mega__V1__JobState state;
  uint32_t world, tp, pp, dp, vp, attempt;
  uint64_t train_iters;
  int64_t started_ms, ended_ms; /* Unix ms; 0: not yet */
  const Mega__V1__StepMetrics *step; /* the latest; NULL before the first */
} view_model;

void view_model_from_job(view_model *v, const Mega__V1__Job *job);
/* Moves the state along an event (started: running, restarting, ...). */
void view_model_event(view_model *v, const Mega__V1__JobEvent *e);

/* One pipeline stage's bubble as fractions of the step time, averaged over
 * the stage's ranks (its data- and tensor-parallel replicas): what every
 * output shows (proto/step_bubble.h). */
typedef mega_stage_bubble view_stage;

/* Fills out[s] for stages 0..n-1, n = the largest pp_rank + 1, at most max;
 * returns n (0 when the step has no ranks). */
int view_stage_bubbles(const Mega__V1__StepMetrics *m, view_stage *out, int max);

/* Draws the live block; now_ms (Unix ms) gives the elapsed time of a
 * running job. Returns the number of lines written, each ending in '\n'
 * and at most o->width columns wide. */
int view_render(FILE *f, const view_model *v, int64_t now_ms, const view_opts *o);

/* One plain line for an iteration:
 *   iter 3/3 loss 5.5451 grad_norm 0.8123 lr 1.000e-04 step 0.0123s tokens/s 5210 bubble 12.3% 10.1% */
void view_step_line(FILE *f, const Mega__V1__StepMetrics *m, uint64_t train_iters);

/* The steps a watch has shown, so that a reconnect's replay of the history
 * shows none twice: per attempt, the latest iteration shown. Per attempt,
 * not one mark for all: a step a node sends again after a takeover can come
 * after a later attempt's steps, and is news. */
#define VIEW_SEEN_ATTEMPTS 64
typedef struct view_seen {
  struct {
    uint32_t attempt;
    uint64_t iteration;
  } v[VIEW_SEEN_ATTEMPTS];
  int n;
} view_seen;

/* True when (attempt, iteration) was shown already; otherwise records it.
 * Past VIEW_SEEN_ATTEMPTS attempts the oldest is forgotten (its steps, if
 * replayed, show again). */
bool view_seen_step(view_seen *s, uint32_t attempt, uint64_t iteration);

/* One line for a job event: "12:00:01 rank failed  worker exited ... [rank 3, node n1]".
 * The time is local time. */
void view_event_line(FILE *f, const Mega__V1__JobEvent *e, const view_opts *o);

/* One line for a gap marker, why already escaped: "missed 12 steps
 * (iterations 1..12): WHY", with " and 3 events" when events went too, or
 * "missed 3 events: WHY" when only they did. */
void view_gap_line(FILE *f, const Mega__V1__WatchGap *g, const char *why);

/* "placed", "rank failed", ... */
const char *view_event_kind_name(Mega__V1__JobEventKind k);
/* "pending", "running", ... */
const char *view_state_name(Mega__V1__JobState s);

/* 12 ms, 1.23 s, 2m05s, 3h02m: a duration in seconds, short. */
void view_duration(double s, char *buf, size_t n);

/* s with every control character escaped ("\n", "\t", "\x1b"; also C1
 * controls in UTF-8), so text from megad cannot move the cursor or change
 * colors on the user's terminal. Truncated to n - 1 bytes; returns buf. */
const char *view_escape(const char *s, char *buf, size_t n);
/* 512, 12.3k, 4.56M: a rate or count, short. */
void view_si(double v, char *buf, size_t n);

#endif
