#include "daemon/model/replicas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SHARDS 4096

static bool holds_shard(const Mega__V1__RankHeld *h, uint32_t s) {
  for (size_t i = 0; i < h->n_shards; i++)
    if (h->shards[i] == s) return true;
  return false;
}

/* The plan being built: one source per donor used. */
typedef struct build {
  Mega__V1__ReplicaSource *src;
  uint32_t **shards; /* per source, its shard list */
  size_t n, cap;
} build;

static void build_free(build *b) {
  for (size_t i = 0; i < b->n; i++) free(b->shards[i]);
  free(b->src);
  free(b->shards);
  *b = (build){0};
}

/* The source for donor d, made when first needed. */
static Mega__V1__ReplicaSource *source_of(build *b, const mega_replica_donor *d, uint32_t dp) {
  for (size_t i = 0; i < b->n; i++)
    if (b->src[i].donor_rank == d->rank) return &b->src[i];
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 8;
    Mega__V1__ReplicaSource *s = realloc(b->src, cap * sizeof *s);
    if (s) b->src = s;
    uint32_t **sh = s ? realloc(b->shards, cap * sizeof *sh) : NULL;
    if (!s || !sh) return NULL;
    b->shards = sh;
    b->cap = cap;
  }
  uint32_t *list = calloc(dp ? dp : 1, sizeof *list);
  if (!list) return NULL;
  Mega__V1__ReplicaSource *s = &b->src[b->n];
  b->shards[b->n++] = list;
  mega__v1__replica_source__init(s);
  s->pp = d->held->pp;
  s->tp = d->held->tp;
  s->donor_rank = d->rank;
  s->node_id = (char *)(d->node_id ? d->node_id : "");
  s->address = d->held->address;
  s->token = d->held->token;
  s->shards = list;
  return s;
}

/* Whether d runs the build the plan is for. */
static bool same_build(const mega_replicas_in *in, const mega_replica_donor *d) {
  return !in->version || (d->version && !strcmp(d->version, in->version));
}

/* The k-th (mod count) donor of (pp, tp) at iteration m that ok() accepts:
 * rotating k spreads the coordinates of a stage over its donors. */
static const mega_replica_donor *pick(const mega_replicas_in *in, uint32_t pp, uint32_t tp,
                                      uint64_t m, size_t k,
                                      bool (*ok)(const Mega__V1__RankHeld *, uint32_t),
                                      uint32_t arg) {
  size_t count = 0;
  for (size_t i = 0; i < in->ndonors; i++) {
    const Mega__V1__RankHeld *h = in->donors[i].held;
    count += h->pp == pp && h->tp == tp && h->iteration == m && ok(h, arg) &&
             same_build(in, &in->donors[i]);
  }
  if (!count) return NULL;
  size_t want = k % count;
  for (size_t i = 0; i < in->ndonors; i++) {
    const Mega__V1__RankHeld *h = in->donors[i].held;
    if (h->pp == pp && h->tp == tp && h->iteration == m && ok(h, arg) &&
        same_build(in, &in->donors[i]) && !want--)
      return &in->donors[i];
  }
  return NULL;
}

static bool has_all(const Mega__V1__RankHeld *h, uint32_t unused) {
  (void)unused;
  return h->all_params && h->full_moments;
}
static bool has_params(const Mega__V1__RankHeld *h, uint32_t unused) {
  (void)unused;
  return h->all_params;
}
static bool has_shard(const Mega__V1__RankHeld *h, uint32_t s) { return holds_shard(h, s); }

static const char *where(const mega_replicas_in *in, uint32_t pp, uint32_t tp, char *buf,
                         size_t len) {
  if (in->tp > 1) snprintf(buf, len, "pipeline stage %u, tensor rank %u", pp, tp);
  else snprintf(buf, len, "pipeline stage %u", pp);
  return buf;
}

/* One coordinate at iteration m into b; false with why when it cannot. */
static bool cover(const mega_replicas_in *in, uint32_t pp, uint32_t tp, uint64_t m, build *b,
                  bool *nomem, char *why, size_t len) {
  size_t k = (size_t)pp * in->tp + tp;
  char at[96];
  if (!in->distributed) {
    const mega_replica_donor *d = pick(in, pp, tp, m, k, has_all, 0);
    if (!d) {
      snprintf(why, len, "no replica of %s holds iteration %llu", where(in, pp, tp, at, sizeof at),
               (unsigned long long)m);
      return false;
    }
    Mega__V1__ReplicaSource *s = source_of(b, d, in->dp);
    if (!s) return !(*nomem = true);
    s->params = s->full_moments = true;
    return true;
  }
  const mega_replica_donor *pd = pick(in, pp, tp, m, k, has_params, 0);
  for (uint32_t sh = 0; sh < in->dp; sh++) {
    const mega_replica_donor *d = pd && holds_shard(pd->held, sh) ? pd
                                                                    : pick(in, pp, tp, m, k + sh,
                                                                           has_shard, sh);
    if (!d) {
      snprintf(why, len,
               "shard %u of %s's optimizer state at iteration %llu is on no surviving rank (its "
               "owner and the rank keeping its copy are gone)",
               sh, where(in, pp, tp, at, sizeof at), (unsigned long long)m);
      return false;
    }
    Mega__V1__ReplicaSource *s = source_of(b, d, in->dp);
    if (!s) return !(*nomem = true);
    s->shards[s->n_shards++] = sh;
    s->shard_params = !pd;
  }
  if (pd) {
    Mega__V1__ReplicaSource *s = source_of(b, pd, in->dp);
    if (!s) return !(*nomem = true);
    s->params = true;
  }
  return true;
}

static int cmp_desc(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x < y) - (x > y);
}

/* Packs the built plan and unpacks it again: one message protobuf-c frees. */
static mega_status finish(const mega_replicas_in *in, uint64_t m, build *b,
                          Mega__V1__ReplicaPlan **out, mega_err *err) {
  Mega__V1__ReplicaSource **ptrs = calloc(b->n + 1, sizeof *ptrs);
  if (!ptrs) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for a replica plan");
  for (size_t i = 0; i < b->n; i++) ptrs[i] = &b->src[i];
  Mega__V1__ReplicaPlan p = MEGA__V1__REPLICA_PLAN__INIT;
  p.attempt = in->attempt;
  p.iteration = m;
  p.dp_size = in->dp;
  p.sources = ptrs;
  p.n_sources = b->n;
  size_t len = protobuf_c_message_get_packed_size(&p.base);
  uint8_t *buf = malloc(len ? len : 1);
  if (buf) protobuf_c_message_pack(&p.base, buf);
  *out = buf ? mega__v1__replica_plan__unpack(NULL, len, buf) : NULL;
  free(buf);
  free(ptrs);
  return *out ? MEGA_OK : mega_fail(err, MEGA_ERR_NOMEM, "out of memory for a replica plan");
}

mega_status mega_replicas_plan(const mega_replicas_in *in, Mega__V1__ReplicaPlan **out,
                               char *why, size_t len, mega_err *err) {
  *out = NULL;
  why[0] = '\0';
  if (!in->ndonors) {
    snprintf(why, len, "no rank kept its state");
    return MEGA_OK;
  }
  if (in->distributed && in->dp > MAX_SHARDS)
    return mega_fail(err, MEGA_ERR_INVALID, "DP %u is more than a plan covers", in->dp);
  uint64_t *its = calloc(in->ndonors, sizeof *its);
  if (!its) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for a replica plan");
  size_t n = 0;
  const mega_replica_donor *other = NULL;
  for (size_t i = 0; i < in->ndonors; i++) {
    if (!same_build(in, &in->donors[i])) {
      if (!other) other = &in->donors[i];
      continue;
    }
    if (in->donors[i].held->iteration < in->floor) continue; /* never got its state */
    bool seen = false;
    for (size_t k = 0; k < n && !seen; k++) seen = its[k] == in->donors[i].held->iteration;
    if (!seen) its[n++] = in->donors[i].held->iteration;
  }
  if (!n) {
    free(its);
    if (other)
      snprintf(why, len, "the ranks that kept it ran another build of mega (node %s: %s, not "
               "%s), and a job's ranks run one build", other->node_id,
               other->version && other->version[0] ? other->version : "version not known",
               in->version);
    else
      snprintf(why, len, "no rank of attempt %u had its state yet (they were taking the "
               "replicas' state of iteration %llu)", in->attempt,
               (unsigned long long)in->floor);
    return MEGA_OK;
  }
  qsort(its, n, sizeof *its, cmp_desc);
  mega_status st = MEGA_OK;
  bool nomem = false;
  for (size_t i = 0; i < n && !*out && !nomem; i++) {
    uint64_t m = its[i];
    build b = {0};
    char w[320];
    bool ok = true;
    for (uint32_t pp = 0; pp < in->pp && ok; pp++)
      for (uint32_t tp = 0; tp < in->tp && ok; tp++)
        ok = cover(in, pp, tp, m, &b, &nomem, w, sizeof w);
    if (ok && m < in->ckpt_iteration) {
      snprintf(w, sizeof w, "the checkpoint of iteration %llu is newer than the replicas' state",
               (unsigned long long)in->ckpt_iteration);
      ok = false;
    }
    if (ok) st = finish(in, m, &b, out, err);
    else if (i == 0 && !nomem) snprintf(why, len, "%s", w); /* the newest's reason */
    build_free(&b);
  }
  free(its);
  if (nomem) return mega_fail(err, MEGA_ERR_NOMEM, "out of memory for a replica plan");
  if (st == MEGA_OK && !*out && other) {
    char w[400];
    snprintf(w, sizeof w, "%s (node %s's ranks, which ran another build of mega, are no "
             "donors)", why, other->node_id);
    snprintf(why, len, "%s", w);
  }
  if (st == MEGA_OK && !*out && in->dp == 1) {
    char w[400];
    snprintf(w, sizeof w, "DP is 1, so no stage has a replica: %s", why);
    snprintf(why, len, "%s", w);
  }
  return st;
}

void mega_replicas_plan_free(Mega__V1__ReplicaPlan *p) {
  if (p) protobuf_c_message_free_unpacked(&p->base, NULL);
}

size_t mega_replicas_plan_nodes(const Mega__V1__ReplicaPlan *p, const char **ids, size_t max) {
  size_t n = 0;
  for (size_t i = 0; p && i < p->n_sources && n < max; i++) {
    const char *id = p->sources[i]->node_id;
    bool dup = false;
    for (size_t k = 0; k < n && !dup; k++) dup = !strcmp(ids[k], id);
    if (!dup) ids[n++] = id;
  }
  return n;
}
