/* Schedules as data.
 *
 * A schedule is, for each pipeline rank, an ordered list of actions. The
 * generators build the list for every schedule kind, the validator proves a
 * list is sound, core/sim predicts its timeline, and the worker's engine
 * executes the same list. A new schedule is a generator plus tests.
 *
 * Actions name a microbatch and a model chunk (the rank's local chunk index,
 * 0..vp-1). Chunk c of rank r is virtual stage c*pp + r; its output goes to
 * virtual stage c*pp + r + 1, which wraps from the last rank to rank 0.
 *
 * Compute actions:
 *   F  forward of (mb, chunk)
 *   B  backward: the input gradient. It also does the weight gradient unless
 *      the rank has a W for the same (mb, chunk); a rank has a W for every
 *      B or for none.
 *   W  weight gradient (zero-bubble schedules)
 * Communication actions, with the peer implied by the chunk:
 *   SF send F's output forward       RF receive the input of F
 *   SB send B's input gradient back  RB receive the output gradient of B
 *
 * Gradient-sync actions, one of each per model chunk and iteration (or none
 * at all on a rank), the data-parallel reduction of seeds 002 and 003:
 *   GS launch the chunk's gradient reduction (what its buckets have not
 *      launched yet); after the chunk's last backward (its last W when the
 *      rank has W's). When GS follows that action at once, the buckets
 *      launch during it, as their layers finish (Megatron's
 *      enable_grad_sync on the last backward).
 *   GW wait for the chunk's reduction (finish_grad_sync); after its GS.
 * Their microbatch is always 0: "GS0.1" is chunk 1's launch.
 *
 * A maximal run of communication actions (SF, RF, SB, RB) between two
 * other actions is one P2P step: the engine posts its operations together
 * (batched, or in the even/odd order of seed 000) and the validator checks
 * that no step can wait forever. GS and GW never wait for another pipeline
 * rank (only for the same stage's data-parallel peers, which run the same
 * list), so they are not part of any step.
 *
 * Text form, one action per token, one rank per line:
 *
 *   mega-schedule v1 kind=1f1b pp=2 vp=1 microbatches=2 group=2
 *   0: F0.0 SF0.0 F1.0 SF1.0 RB0.0 B0.0 RB1.0 B1.0
 *   1: RF0.0 F0.0 B0.0 SB0.0 RF1.0 F1.0 B1.0 SB1.0
 *
 * Tokens are KIND MB '.' CHUNK. Blank lines and lines starting with '#' are
 * ignored. mega_sched_parse(mega_sched_format(s)) equals s exactly.
 *
 * Ownership: a mega_schedule owns its rank arrays; free it with
 * mega_sched_free. Strings returned by the format functions are the
 * caller's to free(). */
#ifndef MEGA_CORE_SCHEDULE_H
#define MEGA_CORE_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

typedef enum mega_act_kind {
  MEGA_ACT_F,
  MEGA_ACT_B,
  MEGA_ACT_W,
  MEGA_ACT_SEND_F,
  MEGA_ACT_RECV_F,
  MEGA_ACT_SEND_B,
  MEGA_ACT_RECV_B,
  MEGA_ACT_GRAD_SYNC, /* "GS" */
  MEGA_ACT_GRAD_WAIT, /* "GW" */
  MEGA_ACT_KINDS
} mega_act_kind;

/* True for SF, RF, SB and RB: the actions that make up P2P steps. */
static inline bool mega_act_is_p2p(uint8_t k) {
  return k >= MEGA_ACT_SEND_F && k <= MEGA_ACT_RECV_B;
}

typedef struct mega_action {
  uint8_t kind;   /* mega_act_kind */
  uint16_t chunk; /* local model chunk, 0..vp-1 */
  int32_t mb;     /* microbatch, 0..microbatches-1 */
} mega_action;

typedef enum mega_sched_kind {
  MEGA_SCHED_NO_PIPELINING, /* pp = 1: F then B for each microbatch */
  MEGA_SCHED_GPIPE,         /* all forwards, then all backwards */
  MEGA_SCHED_1F1B,          /* Megatron's non-interleaved schedule */
  MEGA_SCHED_INTERLEAVED,   /* Megatron's interleaved 1F1B, vp > 1 */
  MEGA_SCHED_ZB_H1,         /* zero bubble H1: B and W apart, 1F1B's peak memory */
  MEGA_SCHED_FORWARD_ONLY,  /* evaluation */
  MEGA_SCHED_CUSTOM,        /* loaded from text; no kind-specific memory bound */
  MEGA_SCHED_KINDS
} mega_sched_kind;

/* Where a generator places each chunk's GS (GW always go at the end of a
 * rank's list, in launch order). Seed 003. */
typedef enum mega_grad_sync {
  MEGA_GRAD_SYNC_NONE,    /* no GS/GW actions: forward-only, or no data parallelism to plan */
  MEGA_GRAD_SYNC_END,     /* after the rank's schedule (Megatron without --overlap-grad-reduce) */
  MEGA_GRAD_SYNC_LAST_BACKWARD, /* right after the chunk's last backward, so its buckets launch
                                   during it and the reduction runs in the cooldown
                                   (--overlap-grad-reduce) */
  MEGA_GRAD_SYNC_ALIGNED, /* --align-grad-reduce: rank r launches chunk c after its backward
                             number k_c + r, k_c being the chunk's last, so every stage launches
                             together; past the rank's last backward, at the end */
  MEGA_GRAD_SYNC_KINDS
} mega_grad_sync;

/* What a schedule can hold (mega_sched_init refuses more). */
#define MEGA_SCHED_MAX_PP 65536
#define MEGA_SCHED_MAX_VP 4096
#define MEGA_SCHED_MAX_VIRTUAL_MB (1 << 24) /* microbatches * vp */

typedef struct mega_sched_params {
  mega_sched_kind kind;
  int pp;           /* --pipeline-model-parallel-size */
  int vp;           /* --virtual-pipeline-model-parallel-size (1 when absent) */
  int microbatches; /* per pipeline, per iteration */
  int group_size;   /* --microbatch-group-size-per-vp-stage; 0 means pp */
  mega_grad_sync grad_sync; /* MEGA_GRAD_SYNC_NONE when zeroed */
} mega_sched_params;

typedef struct mega_sched_rank {
  mega_action *acts;
  int n, cap;
} mega_sched_rank;

typedef struct mega_schedule {
  mega_sched_kind kind;
  int pp, vp, microbatches, group_size;
  mega_sched_rank *ranks; /* [pp] */
} mega_schedule;

/* Megatron's phase counts, in (virtual) microbatches. */
typedef struct mega_phases {
  int warmup, steady, cooldown;
} mega_phases;

const char *mega_sched_kind_name(mega_sched_kind k); /* "1f1b", "zb-h1", ... */
mega_status mega_sched_kind_parse(const char *name, mega_sched_kind *out, mega_err *err);
const char *mega_act_kind_name(mega_act_kind k);     /* "F", "SF", ... */

/* Seed 000's decision tree: no-pipelining at pp=1, interleaved when vp>1,
 * else 1F1B. */
mega_sched_kind mega_sched_default_kind(int pp, int vp);

/* Checks a combination of parameters the way Megatron does, with a message
 * that says how to fix it: vp>1 needs pp>1 and the interleaved schedule;
 * interleaved needs pp <= group_size <= microbatches; no-pipelining needs
 * pp=1; and so on. Fills group_size's default. */
mega_status mega_sched_check_params(mega_sched_params *p, mega_err *err);

/* Megatron's warmup count for a rank: pp-rank-1 (1F1B), or
 * (pp-rank-1)*2 + (vp-1)*group_size (interleaved), capped by the total, with
 * seed 003's edge case: when every microbatch would be warmup, warmup is
 * total-1 and one remains for the steady phase. */
int mega_sched_num_warmup(const mega_sched_params *p, int rank);

/* Megatron's schedule table for the interleaved schedule: entry k is the
 * (microbatch, chunk) of forward virtual microbatch k. out needs
 * microbatches*vp entries. For pp=2, M=5, vp=2, N=3 the microbatches are
 * 0 1 2 0 1 2 3 4 3 4 and the chunks 0 0 0 1 1 1 0 0 1 1 (seed 000). */
void mega_sched_table(int microbatches, int vp, int group_size, int (*out)[2]);

/* Builds every rank's action list, communication included, and the GS/GW
 * actions p->grad_sync asks for. */
mega_status mega_sched_generate(const mega_sched_params *p, mega_schedule *out, mega_err *err);

/* Proves a schedule sound, or says the first problem with its rank and
 * action: every (mb, chunk) is forwarded once (and, unless forward-only,
 * backwarded once) on each rank; F before B before W; each F or B has the
 * receive it needs before it; sends and receives pair up across ranks in
 * the same order; no P2P step can wait forever; the peak of in-flight
 * activations stays within mega_sched_inflight_bound; and a rank with GS/GW
 * actions has exactly one GS per chunk, after the chunk's last backward,
 * and exactly one GW per chunk, after its GS. */
mega_status mega_sched_validate(const mega_schedule *s, mega_err *err);

/* Phase counts read back from the action list: warmup is the forwards before
 * the first backward, less the one that opens the steady phase. */
mega_phases mega_sched_phases(const mega_schedule *s, int rank);

/* In-flight activations: a (mb, chunk) counts from its F until its W (or its
 * B when it has no W); a forward-only schedule frees each at its F's end. */
int mega_sched_peak_inflight(const mega_schedule *s, int rank);

/* The most in-flight activations the kind allows on a rank: min(pp-rank, M)
 * for 1F1B, M for GPipe, min(warmup+1, M*vp) for interleaved, 1 for
 * no-pipelining and forward-only, M*vp for custom. ZB-H1: min(pp, M) on
 * every rank. As in the paper, each rank delays its W's until it holds as
 * many activations as 1F1B's first rank (F to B still follows 1F1B's
 * min(pp-rank, M)); with min(pp-rank, M) counted F to W the last rank could
 * defer no W, and no order could get below 2/3 of 1F1B's bubble. */
int mega_sched_inflight_bound(const mega_schedule *s, int rank);

/* The rank and chunk at the other end of a communication action. */
void mega_sched_peer(const mega_schedule *s, int rank, mega_action a, int *peer_rank,
                     int *peer_chunk);

/* True when (chunk, rank) is the first / last virtual stage of the model. */
bool mega_sched_is_first_stage(const mega_schedule *s, int rank, int chunk);
bool mega_sched_is_last_stage(const mega_schedule *s, int rank, int chunk);

/* The weight-gradient action of a rank (W when it has W's, else B): the
 * action that completes a microbatch's parameter gradients. */
mega_act_kind mega_sched_grad_kind(const mega_schedule *s, int rank);

/* Text form (see above). */
char *mega_sched_format(const mega_schedule *s);
char *mega_sched_format_rank(const mega_schedule *s, int rank); /* one line's actions */
mega_status mega_sched_parse(const char *text, mega_schedule *out, mega_err *err);
/* "F3.1" into buf (at least 24 bytes); returns buf. */
char *mega_action_format(mega_action a, char *buf);

bool mega_sched_equal(const mega_schedule *a, const mega_schedule *b);

/* Building blocks for generators and hand-written schedules. */
mega_status mega_sched_init(mega_schedule *s, mega_sched_kind kind, int pp, int vp,
                            int microbatches, int group_size, mega_err *err);
mega_status mega_sched_push(mega_schedule *s, int rank, mega_action a, mega_err *err);
void mega_sched_free(mega_schedule *s);

#endif
