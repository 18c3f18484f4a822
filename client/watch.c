/* megactl watch: follow a job until it ends (Control.WatchJob with replay,
 * so a late watcher still sees every step the coordinator holds). The
 * stream follows the job across attempts (restarts and rescales are event
 * lines); when it breaks before the job ended (its coordinator restarted),
 * the watch reconnects and skips what it already showed.
 *
 * Three outputs: on a terminal, a block redrawn in place with events
 * printed above it; otherwise one plain line per iteration and per event;
 * with --json, one StepMetrics object per line and nothing else. On a
 * terminal a reader thread takes the stream, so the block can be redrawn
 * at most every REDRAW_MS and the elapsed time ticks between steps. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/commands.h"
#include "client/conn.h"
#include "client/view.h"
#include "core/duration.h"
#include "core/exitcode.h"
#include "proto/pb_json.h"

#define REDRAW_MS 100
#define TICK_MS 1000
#define RECONNECT_MS 120000 /* how long a broken watch keeps trying, by default */

typedef enum { OUT_LIVE, OUT_PLAIN, OUT_JSON } out_mode;

typedef struct watch {
  const char *job_id;
  out_mode mode;
  view_opts vo;
  view_model model;
  Mega__V1__GetJobResponse *first; /* GetJob's answer; the model points into it */
  Mega__V1__WatchJobResponse *step_msg; /* holds model.step */
  ProtobufCMessage *final_owner;        /* holds final_job */
  const Mega__V1__Job *final_job;       /* the job as it ended */
  int drawn;                            /* lines of the live block on screen */
  size_t received;                      /* stream messages, shown or not */
  int64_t last_draw_ms;
  /* what was shown, so a reconnect's replay shows nothing twice */
  view_seen seen_steps;
  int64_t seen_event_ms;
  uint32_t seen_sigs[64]; /* events at seen_event_ms */
  int nsigs;
  int out_errno; /* why stdout took no more (0: it takes all) */
} watch;

static uint32_t event_sig(const Mega__V1__JobEvent *e) {
  uint32_t h = 2166136261u ^ (uint32_t)e->kind;
  for (const char *p = e->message ? e->message : ""; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
  return h;
}

/* True when the item was shown already (a reconnect replays history). */
static bool seen_before(watch *w, const Mega__V1__WatchJobResponse *r) {
  if (r->item_case == MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP)
    return view_seen_step(&w->seen_steps, r->step->attempt, r->step->iteration);
  if (r->item_case != MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT) return false;
  int64_t t = r->event->time_unix_ms;
  uint32_t sig = event_sig(r->event);
  if (t < w->seen_event_ms) return true;
  if (t == w->seen_event_ms)
    for (int i = 0; i < w->nsigs; i++)
      if (w->seen_sigs[i] == sig) return true;
  if (t > w->seen_event_ms) w->nsigs = 0;
  w->seen_event_ms = t;
  if (w->nsigs < 64) w->seen_sigs[w->nsigs++] = sig;
  return false;
}

static bool is_ended(Mega__V1__JobState s) {
  return s == MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED ||
         s == MEGA__V1__JOB_STATE__JOB_STATE_FAILED ||
         s == MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED ||
         s == MEGA__V1__JOB_STATE__JOB_STATE_STOPPED;
}

/* ---- drawing ---- */

static void clear_block(watch *w) {
  if (w->drawn > 0) printf("\r\x1b[%dA\x1b[J", w->drawn);
  w->drawn = 0;
}

static void draw_block(watch *w) {
  w->vo.width = megactl_term_width(stdout);
  clear_block(w);
  w->drawn = view_render(stdout, &w->model, megactl_now_ms(), &w->vo);
  fflush(stdout);
  w->last_draw_ms = megactl_now_ms();
}

/* Takes one stream message (ownership passes to w); returns true when the
 * stream has said its last word (final_state). */
static bool take(watch *w, Mega__V1__WatchJobResponse *r) {
  w->received++;
  if (seen_before(w, r)) {
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return false;
  }
  switch (r->item_case) {
  case MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP: {
    /* a step sent again after a takeover, older than one shown: its line
     * says so, and the block keeps the newest */
    const Mega__V1__StepMetrics *cur = w->model.step;
    bool late = cur && (r->step->attempt < cur->attempt ||
                        (r->step->attempt == cur->attempt && r->step->iteration < cur->iteration));
    if (w->mode == OUT_JSON) {
      mega_step_metrics_write(stdout, r->step);
    } else if (w->mode == OUT_PLAIN || late) { /* live: a line above the block, as events */
      if (w->mode == OUT_LIVE) clear_block(w);
      if (late) printf("(late, attempt %u) ", r->step->attempt);
      view_step_line(stdout, r->step, w->model.train_iters);
      fflush(stdout);
    }
    if (late) {
      protobuf_c_message_free_unpacked(&r->base, NULL);
      return false;
    }
    if (w->step_msg) protobuf_c_message_free_unpacked(&w->step_msg->base, NULL);
    w->step_msg = r;
    w->model.step = r->step;
    if (r->step->attempt > w->model.attempt) w->model.attempt = r->step->attempt;
    if (w->model.state == MEGA__V1__JOB_STATE__JOB_STATE_PENDING)
      w->model.state = MEGA__V1__JOB_STATE__JOB_STATE_RUNNING;
    return false;
  }
  case MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT:
    view_model_event(&w->model, r->event);
    if (w->mode == OUT_LIVE) clear_block(w);
    if (w->mode != OUT_JSON) {
      view_event_line(stdout, r->event, &w->vo);
      fflush(stdout);
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return false;
  case MEGA__V1__WATCH_JOB_RESPONSE__ITEM_FINAL_STATE: {
    const Mega__V1__StepMetrics *step = w->model.step;
    view_model_from_job(&w->model, r->final_state);
    w->model.step = step;
    if (w->final_owner) protobuf_c_message_free_unpacked(w->final_owner, NULL);
    w->final_owner = &r->base;
    w->final_job = r->final_state;
    return true;
  }
  case MEGA__V1__WATCH_JOB_RESPONSE__ITEM_GAP: {
    /* megad skipped steps for this watcher (or no longer has them): say so */
    const Mega__V1__WatchGap *g = r->gap;
    char why[512];
    view_escape(g->reason, why, sizeof why);
    if (w->mode == OUT_JSON) {
      megactl_print_json(json_pack("{s:{s:I,s:I,s:I,s:I,s:s}}", "gap", "missed_steps",
                                   (json_int_t)g->missed_steps, "first_iteration",
                                   (json_int_t)g->first_iteration, "last_iteration",
                                   (json_int_t)g->last_iteration, "missed_events",
                                   (json_int_t)g->missed_events, "reason", why),
                         JSON_COMPACT);
    } else {
      if (w->mode == OUT_LIVE) clear_block(w);
      view_gap_line(stdout, g, why);
    }
    fflush(stdout);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return false;
  }
  default: protobuf_c_message_free_unpacked(&r->base, NULL); return false;
  }
}

/* ---- the live mode's reader thread ---- */

typedef struct queue {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  Mega__V1__WatchJobResponse **items;
  size_t n, cap;
  bool done;
  mega_err err; /* the stream's end: MEGA_OK or why it failed */
  mega_rpc_stream *s;
} queue;

static void *reader(void *arg) {
  queue *q = arg;
  for (;;) {
    ProtobufCMessage *m = NULL;
    mega_err err = {0};
    mega_status st = mega_rpc_stream_next(q->s, &m, &err);
    pthread_mutex_lock(&q->mu);
    if (st == MEGA_OK && m && q->n == q->cap) {
      size_t cap = q->cap ? 2 * q->cap : 64;
      void *p = realloc(q->items, cap * sizeof *q->items);
      if (!p) {
        protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
        st = mega_fail(&err, MEGA_ERR_NOMEM, "out of memory reading the watch stream");
      } else {
        q->items = p;
        q->cap = cap;
      }
    }
    if (st == MEGA_OK && m) {
      q->items[q->n++] = (Mega__V1__WatchJobResponse *)m;
    } else {
      q->done = true;
      q->err = err;
      q->err.status = st;
    }
    bool stop = q->done;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (stop) return NULL;
  }
}

/* Returns the stream's end status in *err. */
static void run_live(watch *w, mega_rpc_stream *s, mega_err *err) {
  queue q = {.s = s};
  pthread_mutex_init(&q.mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&q.cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_t th;
  if (pthread_create(&th, NULL, reader, &q) != 0) {
    mega_fail(err, MEGA_ERR_INTERNAL, "cannot start a thread to read the watch stream");
    return;
  }
  draw_block(w);
  bool dirty = false;
  size_t batch_cap = 0;
  Mega__V1__WatchJobResponse **batch = NULL;
  for (;;) {
    pthread_mutex_lock(&q.mu);
    if (q.n == 0 && !q.done) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      ts.tv_nsec += (long)REDRAW_MS * 1000000L;
      if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&q.cv, &q.mu, &ts);
    }
    /* Swap the queue's array out, so the reader never waits on drawing. */
    Mega__V1__WatchJobResponse **items = q.items;
    size_t n = q.n, cap = q.cap;
    q.items = batch;
    q.cap = batch_cap;
    q.n = 0;
    bool done = q.done;
    pthread_mutex_unlock(&q.mu);
    for (size_t i = 0; i < n; i++) {
      take(w, items[i]);
      dirty = true;
    }
    batch = items;
    batch_cap = cap;
    int64_t now = megactl_now_ms();
    if (done || (dirty && now - w->last_draw_ms >= REDRAW_MS) || now - w->last_draw_ms >= TICK_MS) {
      draw_block(w);
      dirty = false;
    }
    if (done) break;
  }
  pthread_join(th, NULL);
  *err = q.err;
  free(q.items);
  free(batch);
  pthread_mutex_destroy(&q.mu);
  pthread_cond_destroy(&q.cv);
}

/* The plain and JSON modes read the stream directly. */
static void run_plain(watch *w, mega_rpc_stream *s, mega_err *err) {
  for (;;) {
    ProtobufCMessage *m = NULL;
    if (mega_rpc_stream_next(s, &m, err) != MEGA_OK || !m) return;
    take(w, (Mega__V1__WatchJobResponse *)m);
    if (ferror(stdout)) { /* nowhere to show the rest */
      w->out_errno = errno;
      return;
    }
  }
}

/* ---- the command ---- */

typedef struct watch_opts {
  bool plain;
  unsigned reconnect_ms;
} watch_opts;

static int watch_extra(const char *cmd, int argc, char **argv, int *i, void *ctx) {
  watch_opts *o = ctx;
  if (strcmp(argv[*i], "--plain") == 0) {
    o->plain = true;
    (*i)++;
    return 1;
  }
  const char *v;
  int r = megactl_flag_value(cmd, argc, argv, i, "--reconnect-timeout", &v);
  if (r <= 0) return r;
  mega_err err = {0};
  if (mega_duration_parse("--reconnect-timeout", v, 0, 3600000, &o->reconnect_ms, &err) !=
      MEGA_OK) {
    megactl_usage(cmd, "%s", err.msg);
    return -1;
  }
  return 1;
}

static void free_watch(watch *w) {
  if (w->first) protobuf_c_message_free_unpacked(&w->first->base, NULL);
  if (w->step_msg) protobuf_c_message_free_unpacked(&w->step_msg->base, NULL);
  if (w->final_owner) protobuf_c_message_free_unpacked(w->final_owner, NULL);
}

/* The stream ended cleanly without a final state (an older megad, or a
 * coordinator that handed the job on): ask for the job once more. */
static void ended_without_final(watch *w, mega_rpc_channel *ch) {
  Mega__V1__GetJobRequest get = MEGA__V1__GET_JOB_REQUEST__INIT;
  get.job_id = (char *)w->job_id;
  ProtobufCMessage *out = NULL;
  if (mega_rpc_unary(ch, &mega_control_get_job, &get.base, MEGACTL_TIMEOUT_MS, &out, NULL) !=
      MEGA_OK)
    return;
  const Mega__V1__Job *j = ((Mega__V1__GetJobResponse *)out)->job;
  if (!j || !is_ended(j->state)) {
    protobuf_c_message_free_unpacked(out, NULL);
    return;
  }
  const Mega__V1__StepMetrics *step = w->model.step;
  view_model_from_job(&w->model, j);
  w->model.step = step;
  w->final_owner = out;
  w->final_job = j;
}

/* The exit status for how the job ended, with the cause on stderr. */
static int verdict(const watch *w) {
  const view_model *v = &w->model;
  const Mega__V1__Job *j = w->final_job;
  const char *why = j && j->error && j->error[0] ? j->error : NULL;
  if (w->mode != OUT_JSON) {
    printf("job %s %s", v->job_id, view_state_name(v->state));
    if (v->step) printf(" at iteration %llu", (unsigned long long)v->step->iteration);
    if (v->started_ms && v->ended_ms > v->started_ms) {
      char d[32];
      view_duration((double)(v->ended_ms - v->started_ms) / 1e3, d, sizeof d);
      printf(" after %s", d);
    }
    printf("\n");
    fflush(stdout);
  }
  switch (v->state) {
  case MEGA__V1__JOB_STATE__JOB_STATE_SUCCEEDED: return 0;
  case MEGA__V1__JOB_STATE__JOB_STATE_STOPPED: /* not a failure: it goes on when run again */
    fprintf(stderr, "megactl: job %s %s\n", v->job_id, why ? why : "stopped");
    return MEGA_EXIT_REQUEUE;
  case MEGA__V1__JOB_STATE__JOB_STATE_CANCELLED:
    /* megad may already say "cancelled: REASON" */
    if (why && !strncmp(why, "cancelled", 9)) return megactl_fail("job %s was %s", v->job_id, why);
    return why ? megactl_fail("job %s was cancelled: %s", v->job_id, why)
               : megactl_fail("job %s was cancelled", v->job_id);
  default:
    return megactl_fail("job %s %s: %s", v->job_id, view_state_name(v->state),
                        why ? why : "megad gave no cause");
  }
}

int megactl_watch(int argc, char **argv) {
  megactl_common cf;
  watch_opts o = {.reconnect_ms = RECONNECT_MS};
  int rc = megactl_parse_common("watch", argc, argv, true, true, &cf, watch_extra, &o);
  if (rc) return rc;
  if (cf.help) {
    printf("usage: megactl watch JOB [--json | --plain] [--reconnect-timeout D] [--server ADDR]\n\n"
           "Follows a job until it ends. On a terminal the view is redrawn in place:\n"
           "iteration and progress, loss, grad norm, learning rate, step time, tokens/s,\n"
           "and each pipeline stage's bubble (the fraction of the step it sat idle,\n"
           "averaged over its data-parallel ranks, split into warmup/steady/cooldown when\n"
           "the workers report it), with job events as lines above. Otherwise, or with\n"
           "--plain, it prints one line per iteration and per event.\n\n"
           "  --json   one JSON object per iteration, nothing else on stdout; keys:\n"
           "           iteration, attempt, loss (null without one), grad_norm, lr,\n"
           "           step_time_s, tokens_per_s, world_size, ranks (empty for the\n"
           "           older steps of a replay: megad keeps the newest 64 steps' ranks);\n"
           "           where they happened eval_loss, final_eval_loss and test_loss (the\n"
           "           evaluation after training), and skipped\n"
           "           (each rank: rank, pp_rank, dp_rank, tp_rank, compute_s, tp_comm_s,\n"
           "           bubble_s, p2p_wait_s, grad_sync_exposed_s, peak_activation_bytes,\n"
           "           param_bytes, grad_bytes, optimizer_state_bytes, step_time_s,\n"
           "           bubble_warmup_s, bubble_steady_s, bubble_cooldown_s, peak_inflight)\n"
           "  --plain  plain lines even on a terminal\n"
           "  --reconnect-timeout D\n"
           "           how long a broken watch keeps trying (default 120s; 0s: not at all)\n\n"
           "The watch follows the job across restarts and rescales (shown as events), and\n"
           "through a restart of its coordinator or (with etcd) a takeover by another node:\n"
           "a broken stream is opened again (on the next server when --server lists\n"
           "several), and nothing is shown twice.\n\n"
           "Exit status: 0 when the job succeeded; 1 when it failed or was cancelled (the\n"
           "cause on stderr); %d when it stopped early as asked (--exit-signal-handler,\n"
           "--exit-interval, --exit-duration-in-mins) after its checkpoint: megactl resume\n"
           "goes on from it (a batch script's \"requeue\"); %d when the watch was lost (no\n"
           "megad answered for --reconnect-timeout): how the job ends is not known here.\n",
           MEGA_EXIT_REQUEUE, MEGA_EXIT_LOST);
    return 0;
  }
  if (cf.json && o.plain) return megactl_usage("watch", "--json and --plain do not go together");

  watch w = {.job_id = cf.job};
  w.mode = cf.json ? OUT_JSON : o.plain || !isatty(fileno(stdout)) ? OUT_PLAIN : OUT_LIVE;
  w.vo.color = w.mode == OUT_LIVE && megactl_use_color(stdout);
  w.vo.unicode = w.mode == OUT_LIVE && megactl_utf8();
  w.vo.width = megactl_term_width(stdout);

  mega_err err = {0};
  mega_rpc_channel *ch = NULL;
  ProtobufCMessage *out = NULL;
  Mega__V1__GetJobRequest get = MEGA__V1__GET_JOB_REQUEST__INIT;
  get.job_id = (char *)cf.job;
  /* the first server of --server's list that answers; the watch moves on
   * along the list when its stream breaks */
  size_t si = 0, nservers = megactl_server_count(cf.server);
  char addr[512];
  for (;; si++) {
    mega_rpc_channel_free(ch);
    ch = NULL;
    mega_status st = megactl_connect_to(megactl_server_at(cf.server, si, addr, sizeof addr), &ch,
                                        &err);
    if (st == MEGA_OK)
      st = mega_rpc_unary(ch, &mega_control_get_job, &get.base, MEGACTL_TIMEOUT_MS, &out, &err);
    if (st == MEGA_OK) break;
    if (si + 1 >= nservers || !megactl_unreachable(&err)) {
      mega_rpc_channel_free(ch);
      return megactl_job_error(cf.job, &err);
    }
  }
  w.first = (Mega__V1__GetJobResponse *)out;
  if (!w.first->job) {
    free_watch(&w);
    mega_rpc_channel_free(ch);
    return megactl_fail("megad answered GetJob without a job");
  }
  view_model_from_job(&w.model, w.first->job);

  Mega__V1__WatchJobRequest req = MEGA__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = (char *)cf.job;
  req.replay = true;
  int64_t broken_since = 0;
  for (;;) {
    mega_rpc_stream *s = NULL;
    size_t received = w.received;
    if (mega_rpc_stream_open(ch, &mega_control_watch_job, &req.base, 0, &s, &err) == MEGA_OK) {
      if (w.mode == OUT_LIVE)
        run_live(&w, s, &err);
      else
        run_plain(&w, s, &err);
      mega_rpc_stream_close(s);
    }
    if (!megactl_output_ok(w.out_errno)) { /* the job goes on; this watch cannot show it */
      rc = MEGACTL_EXIT_FAIL;
      break;
    }
    if (!w.final_job && err.status == MEGA_OK) ended_without_final(&w, ch);
    if (w.final_job) {
      rc = verdict(&w);
      break;
    }
    if (err.status == MEGA_OK) {
      rc = megactl_fail("megad ended the watch of %s before the job ended", cf.job);
      break;
    }
    if (err.status == MEGA_ERR_NOT_FOUND || err.status == MEGA_ERR_INVALID) {
      rc = megactl_job_error(cf.job, &err);
      break;
    }
    /* a stream that answered before it broke ends the outage: this break
     * is a new one, with its own --reconnect-timeout */
    if (w.received > received) broken_since = 0;
    /* the stream broke (its coordinator restarting): try again for a while */
    int64_t now = megactl_now_ms();
    if (!broken_since) {
      broken_since = now;
      if (w.mode == OUT_LIVE) clear_block(&w);
      fprintf(stderr, "megactl: lost the watch of %s (%s); reconnecting\n", cf.job, err.msg);
    }
    if (now - broken_since >= (int64_t)o.reconnect_ms) {
      megactl_fail("lost the watch of %s: %s", cf.job, err.msg);
      rc = MEGA_EXIT_LOST;
      break;
    }
    sleep(1);
    memset(&err, 0, sizeof err);
    if (nservers > 1) { /* the next server of the list */
      mega_rpc_channel_free(ch);
      ch = NULL;
      if (megactl_connect_to(megactl_server_at(cf.server, ++si, addr, sizeof addr), &ch, &err) !=
          MEGA_OK) {
        megactl_fail("lost the watch of %s: %s", cf.job, err.msg);
        rc = MEGA_EXIT_LOST;
        break;
      }
    }
  }
  free_watch(&w);
  mega_rpc_channel_free(ch);
  return rc;
}
