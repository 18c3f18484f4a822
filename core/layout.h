/* Pipeline layer layouts: which layers each (pp_rank, vp_stage) builds.
 *
 * Megatron's --pipeline-model-parallel-layout strings use the letters
 * E (embedding), t (transformer decoder layer), m (multi-token prediction)
 * and L (loss: final norm, LM head, cross-entropy). '|' ends a stage;
 * "(...)*n" and "x*n" repeat; commas are cosmetic. Stage s of the flat list
 * belongs to pp_rank = s % PP, vp_stage = s / PP, so the string's stage count
 * must be a multiple of PP and VP = stages / PP.
 *
 * Example (seed 001): "Et*3|(tt|)*29,m|L" at PP=16 gives VP=2, with
 * [0][0] = "Ettt", [0][1] = "tt", [14][1] = "m", [15][1] = "L".
 *
 * The layout owns its arrays; free it with mega_layout_free. */
#ifndef MEGA_CORE_LAYOUT_H
#define MEGA_CORE_LAYOUT_H

#include "core/status.h"

enum {
  MEGA_LAYER_EMBEDDING = 'E',
  MEGA_LAYER_DECODER = 't',
  MEGA_LAYER_MTP = 'm',
  MEGA_LAYER_LOSS = 'L',
};

typedef struct mega_layout {
  int pp, vp;
  int nstages;      /* pp * vp, in the string's order */
  int *stage_start; /* nstages + 1 offsets into kinds */
  char *kinds;      /* every stage's letters, concatenated, NUL-terminated */
  int *before;      /* [4][nstages + 1]: letters of each kind (E, t, m, L) in the
                       stages before, so counts and offsets cost O(1) */
} mega_layout;

/* Parses a layout string. Errors name the 1-based column and the problem:
 * an unknown letter, unbalanced parentheses, a bad repeat count, a stage count
 * that is not a multiple of pp, no E in the first stage, no L in the last, an
 * E or L anywhere else. */
mega_status mega_layout_parse(const char *str, int pp, mega_layout *out, mega_err *err);

/* Megatron's split without a layout string: num_layers decoder layers over
 * pp*vp stages, E on stage (0,0) and L on (pp-1, vp-1). first/last are
 * --decoder-first/last-pipeline-num-layers, or -1 when not given; the
 * remaining layers are split evenly over the other pipeline ranks. Every
 * per-rank count must divide by vp. */
mega_status mega_layout_uniform(int num_layers, int pp, int vp, int first, int last,
                                mega_layout *out, mega_err *err);

void mega_layout_free(mega_layout *l);

/* The letters of stage (pp_rank, vp_stage); *len gets their count. Not
 * NUL-terminated at len. */
const char *mega_layout_stage(const mega_layout *l, int pp_rank, int vp_stage, int *len);

/* How many layers of a kind the stage builds (Megatron's get_num_layers_to_build). */
int mega_layout_count(const mega_layout *l, int pp_rank, int vp_stage, char kind);

/* Global index of the stage's first layer of a kind: the count of that kind
 * in all earlier stages, in model order (vp-major). */
int mega_layout_offset(const mega_layout *l, int pp_rank, int vp_stage, char kind);

/* Writes the stage's global layer ids of a kind to ids; returns their count. */
int mega_layout_ids(const mega_layout *l, int pp_rank, int vp_stage, char kind, int *ids);

/* Total layers of a kind in the whole model. */
int mega_layout_total(const mega_layout *l, char kind);

/* The expanded string, stages joined by '|' ("Ettt|tt|...|L"). Caller frees. */
char *mega_layout_format(const mega_layout *l);

#endif
