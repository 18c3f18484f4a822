/* Rank topology in Megatron's order: TP varies fastest, then DP, then PP.
 *
 *   rank = tp + TP * (dp + DP * pp)
 *
 * With world 16, TP 2, PP 4 (so DP 2) the DP groups are
 * [0,2] [1,3] [4,6] [5,7] [8,10] [9,11] [12,14] [13,15] and the PP groups
 * [0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15] (seed 004).
 *
 * mega_topo is a plain value; nothing here allocates. */
#ifndef MEGA_CORE_TOPOLOGY_H
#define MEGA_CORE_TOPOLOGY_H

#include "core/status.h"

typedef struct mega_topo {
  int world, tp, pp, dp;
} mega_topo;

typedef struct mega_coord {
  int tp, dp, pp;
} mega_coord;

typedef enum mega_group_kind {
  MEGA_GROUP_TP,   /* same dp and pp: contiguous ranks */
  MEGA_GROUP_DP,   /* same tp and pp */
  MEGA_GROUP_PP,   /* same tp and dp: one pipeline */
  MEGA_GROUP_MP,   /* same dp: every tp and pp rank of one model replica */
  MEGA_GROUP_EMBD, /* first and last stage of each pipeline (one rank when PP=1) */
  MEGA_GROUP_KINDS
} mega_group_kind;

/* Checks the sizes: all positive, world divisible by tp*pp. DP is derived. */
mega_status mega_topo_init(mega_topo *t, int world, int tp, int pp, mega_err *err);

mega_coord mega_topo_coord(const mega_topo *t, int rank);
int mega_topo_rank(const mega_topo *t, mega_coord c);

int mega_topo_num_groups(const mega_topo *t, mega_group_kind k);
int mega_topo_group_size(const mega_topo *t, mega_group_kind k);

/* Writes the ranks of group idx, ascending, to out[mega_topo_group_size()].
 * Groups are numbered as Megatron enumerates them: DP groups stage by stage,
 * then by tp; PP and EMBD groups by (tp + TP*dp); TP groups by (dp + DP*pp);
 * MP groups by dp. */
void mega_topo_group(const mega_topo *t, mega_group_kind k, int idx, int *out);

/* The index of the group of kind k that holds rank, or -1 when it is in none
 * (a middle stage has no EMBD group). *pos, when not NULL, gets the rank's
 * position in that group. */
int mega_topo_group_of(const mega_topo *t, mega_group_kind k, int rank, int *pos);

/* Round robin across a node's devices: rank % devices_per_node. */
int mega_topo_device(int rank, int devices_per_node);

const char *mega_group_kind_name(mega_group_kind k);

#endif
