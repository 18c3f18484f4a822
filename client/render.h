/* Terminal drawing of a simulated schedule for `megactl plan`: a timeline
 * with one row per rank (in the manner of seed 000's diagrams), then each
 * rank's phases, peak in-flight activations, busy and idle time and bubble,
 * and the totals. Nothing here owns memory past a call. */
#ifndef MEGA_CLIENT_RENDER_H
#define MEGA_CLIENT_RENDER_H

#include <stdbool.h>
#include <stdio.h>

#include "core/sim.h"

/* Draws into f for a terminal `width` columns wide (at least 40 is used);
 * color adds ANSI colors for F, B and W. Returns 0, or -1 when memory ran
 * out (nothing useful was written then). */
int plan_render_text(FILE *f, const mega_schedule *s, const mega_sim *sim, const mega_cost *cost,
                     int width, bool color);

#endif
