#include "core/topology.h"

mega_status mega_topo_init(mega_topo *t, int world, int tp, int pp, mega_err *err) {
  if (world < 1)
    return mega_fail(err, MEGA_ERR_INVALID, "world size must be at least 1 (got %d)", world);
  if (tp < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "tensor-parallel size (TP) must be at least 1 (got %d)", tp);
  if (pp < 1)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "pipeline-parallel size (PP) must be at least 1 (got %d)", pp);
  long long mp = (long long)tp * pp;
  if (world % mp != 0)
    return mega_fail(err, MEGA_ERR_INVALID,
                     "world size %d is not divisible by TP·PP = %lld (TP %d × PP %d); "
                     "use a world size that is a multiple of %lld",
                     world, mp, tp, pp, mp);
  t->world = world;
  t->tp = tp;
  t->pp = pp;
  t->dp = (int)(world / mp);
  return MEGA_OK;
}

mega_coord mega_topo_coord(const mega_topo *t, int rank) {
  mega_coord c = {-1, -1, -1};
  if (rank < 0 || rank >= t->world) return c;
  c.tp = rank % t->tp;
  c.dp = (rank / t->tp) % t->dp;
  c.pp = rank / (t->tp * t->dp);
  return c;
}

int mega_topo_rank(const mega_topo *t, mega_coord c) {
  if (c.tp < 0 || c.tp >= t->tp || c.dp < 0 || c.dp >= t->dp || c.pp < 0 || c.pp >= t->pp)
    return -1;
  return c.tp + t->tp * (c.dp + t->dp * c.pp);
}

int mega_topo_num_groups(const mega_topo *t, mega_group_kind k) {
  switch (k) {
  case MEGA_GROUP_TP: return t->dp * t->pp;
  case MEGA_GROUP_DP: return t->tp * t->pp;
  case MEGA_GROUP_PP: return t->tp * t->dp;
  case MEGA_GROUP_MP: return t->dp;
  case MEGA_GROUP_EMBD: return t->tp * t->dp;
  default: return 0;
  }
}

int mega_topo_group_size(const mega_topo *t, mega_group_kind k) {
  switch (k) {
  case MEGA_GROUP_TP: return t->tp;
  case MEGA_GROUP_DP: return t->dp;
  case MEGA_GROUP_PP: return t->pp;
  case MEGA_GROUP_MP: return t->tp * t->pp;
  case MEGA_GROUP_EMBD: return t->pp == 1 ? 1 : 2;
  default: return 0;
  }
}

void mega_topo_group(const mega_topo *t, mega_group_kind k, int idx, int *out) {
  if (idx < 0 || idx >= mega_topo_num_groups(t, k)) return;
  mega_coord c;
  switch (k) {
  case MEGA_GROUP_TP: /* idx = dp + DP*pp, so the group starts at TP*idx */
    for (int i = 0; i < t->tp; i++) out[i] = t->tp * idx + i;
    break;
  case MEGA_GROUP_DP: /* idx = tp + TP*pp */
    c.tp = idx % t->tp;
    c.pp = idx / t->tp;
    for (c.dp = 0; c.dp < t->dp; c.dp++) out[c.dp] = mega_topo_rank(t, c);
    break;
  case MEGA_GROUP_PP: /* idx = tp + TP*dp */
    c.tp = idx % t->tp;
    c.dp = idx / t->tp;
    for (c.pp = 0; c.pp < t->pp; c.pp++) out[c.pp] = mega_topo_rank(t, c);
    break;
  case MEGA_GROUP_MP: { /* idx = dp; pp-major then tp keeps the ranks ascending */
    int n = 0;
    c.dp = idx;
    for (c.pp = 0; c.pp < t->pp; c.pp++)
      for (c.tp = 0; c.tp < t->tp; c.tp++) out[n++] = mega_topo_rank(t, c);
    break;
  }
  case MEGA_GROUP_EMBD: /* the PP group's ends */
    c.tp = idx % t->tp;
    c.dp = idx / t->tp;
    c.pp = 0;
    out[0] = mega_topo_rank(t, c);
    if (t->pp > 1) {
      c.pp = t->pp - 1;
      out[1] = mega_topo_rank(t, c);
    }
    break;
  default: break;
  }
}

int mega_topo_group_of(const mega_topo *t, mega_group_kind k, int rank, int *pos) {
  if (rank < 0 || rank >= t->world) return -1;
  mega_coord c = mega_topo_coord(t, rank);
  int idx, p;
  switch (k) {
  case MEGA_GROUP_TP: idx = c.dp + t->dp * c.pp; p = c.tp; break;
  case MEGA_GROUP_DP: idx = c.tp + t->tp * c.pp; p = c.dp; break;
  case MEGA_GROUP_PP: idx = c.tp + t->tp * c.dp; p = c.pp; break;
  case MEGA_GROUP_MP: idx = c.dp; p = c.tp + t->tp * c.pp; break;
  case MEGA_GROUP_EMBD:
    if (c.pp != 0 && c.pp != t->pp - 1) return -1;
    idx = c.tp + t->tp * c.dp;
    p = c.pp == 0 ? 0 : 1;
    break;
  default: return -1;
  }
  if (pos) *pos = p;
  return idx;
}

int mega_topo_device(int rank, int devices_per_node) {
  if (rank < 0 || devices_per_node < 1) return -1;
  return rank % devices_per_node;
}

const char *mega_group_kind_name(mega_group_kind k) {
  switch (k) {
  case MEGA_GROUP_TP: return "tp";
  case MEGA_GROUP_DP: return "dp";
  case MEGA_GROUP_PP: return "pp";
  case MEGA_GROUP_MP: return "mp";
  case MEGA_GROUP_EMBD: return "embd";
  default: return "unknown";
  }
}
