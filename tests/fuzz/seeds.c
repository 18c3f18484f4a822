/* Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/NAME/)
 * from the real writers, so a seed is what the program itself produces:
 *   fuzz_seeds OUTDIR        (scripts/fuzz --seeds runs it into corpus/)
 * Each file is the target's input: its selector byte (if any), then the
 * bytes. */
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/jobspec.h"
#include "core/schedule.h"
#include "daemon/model/job.h"
#include "daemon/model/journal.h"
#include "proto/frame.h"
#include "proto/mega.pb-c.h"
#include "worker/ckpt/ckpt_internal.h"
#include "worker/data/gpt_order.h"
#include "worker/data/indexed.h"
#include "worker/model/gpt.h"
#include "worker/model/safetensors.h"
#include "fuzz.h"
#include "order_keys.h"
#include "replica_fixture.h"

static const char *out;

static void put(const char *target, const char *name, int sel, const void *data, size_t n) {
  char p[4096];
  snprintf(p, sizeof p, "%s/%s", out, target);
  if (mkdir(p, 0755) && errno != EEXIST) abort();
  snprintf(p, sizeof p, "%s/%s/%s", out, target, name);
  FILE *f = fopen(p, "wb");
  if (!f) abort();
  if (sel >= 0) fputc(sel, f);
  if (n) fwrite(data, 1, n, f);
  fclose(f);
}

static void put_str(const char *target, const char *name, int sel, const char *s) {
  put(target, name, sel, s, strlen(s));
}

static void *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) abort();
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *b = malloc((size_t)len + 1);
  if (fread(b, 1, (size_t)len, f) != (size_t)len) abort();
  fclose(f);
  *n = (size_t)len;
  return b;
}

static void layouts(void) {
  put_str("layout", "seed001", 15, "Et*3|(tt|)*29,m|L");
  put_str("layout", "pp1", 0, "EttL");
  put_str("layout", "pp2", 1, "Ett|ttL");
  put_str("layout", "pp2vp2", 1, "Et|t|t|tL");
  put_str("layout", "pp4", 3, "E(t|)*3tL");
}

static void hostlists(void) {
  put_str("hostlist", "ranges", -1, "gpu[01-04,07],cpu3");
  put_str("hostlist", "product", -1, "a[1-2]b[3-4]");
  put_str("hostlist", "widths", -1, "n[008-011],n[1-010]");
  put_str("hostlist", "spaces", -1, " r1-n[1,3] ,, x y ");
  put_str("hostlist", "backwards", -1, "n[3-1]");
  put_str("hostlist", "open", -1, "n[1-2");
  put_str("hostlist", "repeats", -1, "n[1-3],n2, n1 ,m,n[3-4]");
}

static void durations(void) {
  put_str("duration", "ms", 1, "250ms");
  put_str("duration", "s", 0, "1.5s");
  put_str("duration", "m", 3, "2m");
  put_str("duration", "h", 5, "1h");
  put_str("duration", "bare", 0, "250");
  put_str("duration", "unit", 7, "3days");
  put_str("duration", "range", 6, "1s");
}

static void utf8s(void) {
  put_str("utf8", "ascii", -1, "job-7 /data/train_text_document");
  put_str("utf8", "multi", -1, "\xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x80 \xf4\x8f\xbf\xbf");
  put_str("utf8", "overlong", -1, "\xc0\xaf \xe0\x80\xaf \xf0\x80\x80\xaf");
  put_str("utf8", "surrogate", -1, "\xed\xa0\x80\xed\xbf\xbf");
  put_str("utf8", "past", -1, "\xf4\x90\x80\x80 \xf5\x80\x80\x80 \xff");
  put_str("utf8", "cut", -1, "ab\xe2\x82");
  put("utf8", "nul", -1, "a\0\xc3\xa9\xc3", 5);
}

/* fuzz_bpe's input: mode, the lengths of vocab.json and merges.txt, them,
 * the text. */
static void bpe_seed(const char *name, int mode, const char *vocab, const char *merges,
                     const char *text) {
  size_t nv = strlen(vocab), nm = strlen(merges), nt = strlen(text);
  uint8_t *b = malloc(4 + nv + nm + nt);
  b[0] = (uint8_t)nv, b[1] = (uint8_t)(nv >> 8), b[2] = (uint8_t)nm, b[3] = (uint8_t)(nm >> 8);
  memcpy(b + 4, vocab, nv);
  memcpy(b + 4 + nv, merges, nm);
  memcpy(b + 4 + nv + nm, text, nt);
  put("bpe", name, mode, b, 4 + nv + nm + nt);
  free(b);
}

static void bpes(void) {
  /* GPT-2's first merges (\xc4\xa0 is the space's token) */
  const char *merges = "#version: 0.2\n\xc4\xa0 t\nh e\n\xc4\xa0 a\ni n\n\xc4\xa0t he\n"
                       "e r\no n\n\xc4\xa0 s\ne d\n\xc4\xa0 w\no u\nr e\n";
  bpe_seed("built", 0, "", merges,
           "The weather's fine; we'll read 1234 lines.\n\n  \xc3\xa9t\xc3\xa9 \xe2\x80\x94 "
           "\xe4\xb8\xad\xe6\x96\x87\t\xff\xfe end  ");
  bpe_seed("crlf", 2, "", "h e\r\nhe llo\r\nl l\r\n", "hello hello");
  bpe_seed("own", 1,
           "{\"h\": 0, \"e\": 1, \"l\": 2, \"o\": 3, \"\xc4\xa0\": 4, \"he\": 5, "
           "\"ll\": 6, \"<|endoftext|>\": 7}",
           "h e\nl l\n", "hello hell");
  bpe_seed("own_missing", 3, "{\"h\": 0, \"e\": 1}", "h e\n", "he");
  bpe_seed("bad_merge", 0, "", "a b c\n", "abc");
}

/* fuzz_weblogin's input: the form, the Cookie header and the page to
 * return to, NUL-separated. */
static void weblogin(const char *name, const char *form, const char *cookie, const char *next) {
  char b[1024];
  size_t nf = strlen(form), nc = strlen(cookie), nn = strlen(next);
  memcpy(b, form, nf + 1);
  memcpy(b + nf + 1, cookie, nc + 1);
  memcpy(b + nf + nc + 2, next, nn);
  put("weblogin", name, -1, b, nf + nc + nn + 2);
}

static void weblogins(void) {
  weblogin("right", "token=s3cr3t%2Ft%2Bk+n%25&next=%2Fjobs%2Fj-1", "a=1; mega_session=00ff",
           "/jobs/j-1");
  weblogin("wrong", "next=%2F&token=s3cr3t", "mega_session=", "/");
  weblogin("offsite", "token=s3cr3t%2Ft%2Bk%20n%25&next=%2F%2Fevil.example", "mega_session",
           "//evil.example/");
  weblogin("markup", "token=%ZZ&next=%2F%22%3E%3Cscript%3E", "x=1;;mega_session=a;b",
           "/\"><script>alert(1)</script>");
}

static void schedules(void) {
  mega_sched_params ps[] = {
      {MEGA_SCHED_1F1B, 2, 1, 4, 0, MEGA_GRAD_SYNC_NONE},
      {MEGA_SCHED_INTERLEAVED, 2, 2, 4, 0, MEGA_GRAD_SYNC_LAST_BACKWARD},
      {MEGA_SCHED_ZB_H1, 3, 1, 3, 0, MEGA_GRAD_SYNC_END},
      {MEGA_SCHED_GPIPE, 2, 1, 2, 0, MEGA_GRAD_SYNC_ALIGNED},
      {MEGA_SCHED_NO_PIPELINING, 1, 1, 2, 0, MEGA_GRAD_SYNC_NONE},
      {MEGA_SCHED_FORWARD_ONLY, 2, 1, 2, 0, MEGA_GRAD_SYNC_NONE},
  };
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    mega_schedule s;
    mega_err err = {0};
    if (mega_sched_generate(&ps[i], &s, &err) != MEGA_OK) {
      fprintf(stderr, "seeds: %s\n", err.msg);
      abort();
    }
    char *t = mega_sched_format(&s);
    put_str("schedule", mega_sched_kind_name(ps[i].kind), -1, t);
    free(t);
    mega_sched_free(&s);
  }
}

static const char *const tiny[] = {"--num-layers", "2", "--hidden-size", "32",
                                   "--num-attention-heads", "2", "--seq-length", "16",
                                   "--micro-batch-size", "2", "--global-batch-size", "4",
                                   "--lr", "0.001", "--train-iters", "20",
                                   "--data-path", "/tmp/tiny.txt"};

static void jobspecs(void) {
  const char *extra[][10] = {
      {NULL},
      {"--pipeline-model-parallel-size", "2", NULL},
      {"--pipeline-model-parallel-size=2", "--virtual-pipeline-model-parallel-size", "2",
       "--num-layers", "4", NULL},
      {"--pipeline-model-parallel-layout", "Et|tL", "--pipeline-model-parallel-size", "2",
       "--overlap-grad-reduce", NULL},
      {"--schedule", "zb-h1", "--pipeline-model-parallel-size", "2", "--save", "/tmp/ck",
       "--save-interval", "5", NULL},
      {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer", "--lr-decay-style",
       "cosine", "--lr-warmup-iters", "2", NULL},
  };
  int worlds[] = {1, 2, 4, 2, 2, 4};
  for (size_t e = 0; e < sizeof extra / sizeof extra[0]; e++) {
    char buf[2048];
    size_t n = 0;
    const char *words[64];
    int nw = 0;
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) words[nw++] = tiny[i];
    for (int i = 0; extra[e][i]; i++) words[nw++] = extra[e][i];
    for (int i = 0; i < nw; i++) {
      size_t l = strlen(words[i]) + 1;
      memcpy(buf + n, words[i], l);
      n += l;
    }
    char name[32];
    snprintf(name, sizeof name, "spec%zu", e);
    put("jobspec", name, worlds[e], buf, n - 1);
    /* the same spec as JSON */
    mega_jobspec s;
    mega_jobspec_defaults(&s);
    mega_err err = {0};
    if (mega_jobspec_parse(&s, nw, (char *const *)words, &err) != MEGA_OK) {
      fprintf(stderr, "seeds: %s\n", err.msg);
      abort();
    }
    json_t *j = mega_jobspec_to_json(&s);
    char *t = json_dumps(j, JSON_COMPACT);
    put_str("jobspec_json", name, -1, t);
    free(t);
    json_decref(j);
    mega_jobspec_free(&s);
  }
}

static Mega__V1__RankMetrics rm[2];
static Mega__V1__RankMetrics *rmp[2] = {&rm[0], &rm[1]};

static void step_metrics(Mega__V1__StepMetrics *s) {
  mega__v1__step_metrics__init(s);
  s->iteration = 3;
  s->loss = 5.25;
  s->lr = 1e-3;
  s->step_time_s = 0.5;
  s->tokens_per_s = 128;
  for (int r = 0; r < 2; r++) {
    mega__v1__rank_metrics__init(&rm[r]);
    rm[r].rank = (uint32_t)r;
    rm[r].pp_rank = (uint32_t)r;
    rm[r].bubble_s = 0.1;
    rm[r].step_time_s = 0.5;
    rm[r].peak_activation_bytes = 4096;
  }
  s->ranks = rmp;
  s->n_ranks = 2;
}

static void pack_put(const char *target, const char *name, int sel, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *b = malloc(n + 1);
  protobuf_c_message_pack(m, b);
  put(target, name, sel, b, n);
  free(b);
}

static void frames(void) {
  uint8_t *all = NULL;
  size_t alln = 0;
  Mega__V1__WorkerHello hello = MEGA__V1__WORKER_HELLO__INIT;
  hello.rank = 1;
  hello.pid = 1234;
  hello.version = "0.1.0";
  hello.device = "cpu";
  Mega__V1__RankMetrics m = MEGA__V1__RANK_METRICS__INIT;
  m.rank = 1;
  m.bubble_s = 0.25;
  Mega__V1__ActionSpan span = MEGA__V1__ACTION_SPAN__INIT, *spans[1] = {&span};
  span.name = "F0.0";
  span.cat = "compute";
  span.dur_us = 10;
  Mega__V1__StepReport step = MEGA__V1__STEP_REPORT__INIT;
  step.iteration = 7;
  step.metrics = &m;
  step.has_loss = true;
  step.loss = 4.5;
  step.spans = spans;
  step.n_spans = 1;
  Mega__V1__Progress prog = MEGA__V1__PROGRESS__INIT;
  prog.phase = "train";
  prog.iteration = 7;
  Mega__V1__WorkerFrame wf[3];
  for (int i = 0; i < 3; i++) mega__v1__worker_frame__init(&wf[i]);
  wf[0].msg_case = MEGA__V1__WORKER_FRAME__MSG_HELLO;
  wf[0].hello = &hello;
  wf[1].msg_case = MEGA__V1__WORKER_FRAME__MSG_STEP;
  wf[1].step = &step;
  wf[2].msg_case = MEGA__V1__WORKER_FRAME__MSG_PROGRESS;
  wf[2].progress = &prog;
  for (int i = 0; i < 3; i++) {
    uint8_t *b;
    size_t n;
    mega_err err = {0};
    if (mega_frame_encode(&wf[i].base, 0, &b, &n, &err) != MEGA_OK) abort();
    char name[32];
    snprintf(name, sizeof name, "worker%d", i);
    put("frame", name, 2 * (i + 1), b, n); /* even: WorkerFrame, cut in reads of i+2 bytes */
    all = realloc(all, alln + n);
    memcpy(all + alln, b, n);
    alln += n;
    free(b);
  }
  put("frame", "worker_all", 6, all, alln);
  free(all);
  Mega__V1__Abort ab = MEGA__V1__ABORT__INIT;
  ab.reason = "cancelled";
  ab.grace_ms = 2000;
  Mega__V1__DaemonFrame df = MEGA__V1__DAEMON_FRAME__INIT;
  df.msg_case = MEGA__V1__DAEMON_FRAME__MSG_ABORT;
  df.abort = &ab;
  uint8_t *b;
  size_t n;
  mega_err err = {0};
  if (mega_frame_encode(&df.base, 0, &b, &n, &err) != MEGA_OK) abort();
  put("frame", "daemon_abort", 1, b, n);
  free(b);

  /* pb_json: the types' indices in fuzz_pb_json.c */
  Mega__V1__StepMetrics sm;
  step_metrics(&sm);
  pack_put("pb_json", "step_metrics", 2, &sm.base);
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_RESTARTING;
  ev.message = "attempt 1 ended";
  ev.has_rank = true;
  ev.rank = 1;
  pack_put("pb_json", "job_event", 1, &ev.base);
  Mega__V1__WatchJobResponse w = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  w.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP;
  w.step = &sm;
  pack_put("pb_json", "watch_step", 3, &w.base);
}

/* A job as megad journals it. */
static mega_job *make_job(const char *id) {
  Mega__V1__JobSpec spec = MEGA__V1__JOB_SPEC__INIT;
  spec.name = "tiny";
  spec.args = (char **)tiny;
  spec.n_args = sizeof tiny / sizeof tiny[0];
  spec.nnodes_min = spec.nnodes_max = spec.nproc_per_node = 1;
  mega_job *j = NULL;
  mega_err err = {0};
  if (mega_job_new(id, &spec, "n1", 1700000000000, &j, &err) != MEGA_OK) {
    fprintf(stderr, "seeds: %s\n", err.msg);
    abort();
  }
  return j;
}

static void journals(void) {
  const char *dir = fuzz_dir();
  char p[512];
  snprintf(p, sizeof p, "%s/journal", dir);
  unlink(p);
  mega_journal *jn;
  mega_err err = {0};
  if (mega_journal_open(p, &jn, &err) != MEGA_OK) abort();
  mega_job *j = make_job("j-1-n1");
  uint8_t *b;
  size_t n;
  if (mega_jrec_job(j, &b, &n, &err) != MEGA_OK) abort();
  mega_journal_append(jn, b, n, &err);
  free(b);
  Mega__V1__JobEvent ev = MEGA__V1__JOB_EVENT__INIT;
  ev.kind = MEGA__V1__JOB_EVENT_KIND__JOB_EVENT_KIND_SUBMITTED;
  ev.message = "submitted";
  if (mega_jrec_event(j->id, &ev, &b, &n, &err) != MEGA_OK) abort();
  mega_journal_append(jn, b, n, &err);
  free(b);
  Mega__V1__StepMetrics sm;
  step_metrics(&sm);
  if (mega_jrec_step(j->id, &sm, &b, &n, &err) != MEGA_OK) abort();
  mega_journal_append(jn, b, n, &err);
  free(b);
  if (mega_job_transition(j, MEGA_JOB_RUNNING, 1700000001000, NULL, &err) != MEGA_OK) abort();
  if (mega_jrec_job(j, &b, &n, &err) != MEGA_OK) abort();
  mega_journal_append(jn, b, n, &err);
  free(b);
  mega_job_free(j);
  mega_journal_close(jn);
  void *all = slurp(p, &n);
  put("journal", "jobs", -1, all, n);
  put("journal", "torn", -1, all, n - 3);
  ((uint8_t *)all)[12] ^= 0x40; /* damage in the first record */
  put("journal", "damaged", -1, all, n);
  free(all);
  put("journal", "empty", -1, "", 0);
}

static void tensors(void) {
  const char *dir = fuzz_dir();
  char p[512];
  snprintf(p, sizeof p, "%s/t.safetensors", dir);
  float a[6] = {1, 2, 3, 4, 5, 6}, s = 0.5f;
  mega_st_tensor t[] = {{.name = "h.0.attn.c_attn.weight", .ndim = 2, .shape = {2, 3}, .numel = 6,
                         .data = a},
                        {.name = "scale", .ndim = 0, .numel = 1, .data = &s}};
  mega_st_meta meta[] = {{"format", "pt"}};
  mega_err err = {0};
  if (mega_st_write(p, t, 2, meta, 1, &err) != MEGA_OK) abort();
  size_t n;
  void *b = slurp(p, &n);
  put("safetensors", "two", -1, b, n);
  free(b);
  if (mega_st_write(p, t, 1, NULL, 0, &err) != MEGA_OK) abort();
  b = slurp(p, &n);
  put("safetensors", "one", -1, b, n);
  free(b);
  unlink(p);
}

static void checkpoints(void) {
  /* 0: the index fuzz_ckpt.c's two shards match */
  put_str("ckpt", "index", 0,
          "{\"metadata\": {\"total_size\": 32}, \"weight_map\": {\"wte\": "
          "\"model-00001-of-00002.safetensors\", \"ln.b\": \"model-00002-of-00002.safetensors\"}}");
  /* 1: a manifest of the three files fuzz_ckpt.c writes */
  const char *dir = fuzz_dir();
  fuzz_file("config.json", (const uint8_t *)"{}\n", 3);
  fuzz_file("trainer_state.json", (const uint8_t *)"{}\n", 3);
  fuzz_file("a.bin", (const uint8_t *)"abc", 3);
  mega_ckpt_file files[3] = {{.name = "config.json"}, {.name = "trainer_state.json"},
                             {.name = "a.bin"}};
  mega_err err = {0};
  for (int i = 0; i < 3; i++) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, files[i].name);
    if (mega_ckpt_file_sum(p, &files[i].size, &files[i].crc32, &err) != MEGA_OK) abort();
  }
  if (mega_ckpt_write_manifest(dir, 10, 1, files, 3, &err) != MEGA_OK) abort();
  char p[512];
  snprintf(p, sizeof p, "%s/manifest.json", dir);
  size_t n;
  void *b = slurp(p, &n);
  put("ckpt", "manifest", 1, b, n);
  free(b);
  /* 2: the latest file */
  put_str("ckpt", "latest", 2, "10\n");
  put_str("ckpt", "latest_release", 2, "release\n");
  /* 3: trainer_state.json for fuzz_ckpt.c's config and job */
  mega_jobspec job;
  mega_jobspec_defaults(&job);
  job.num_layers = 2;
  job.hidden_size = 32;
  job.num_attention_heads = 2;
  job.seq_length = 16;
  mega_ckpt_state st = {.iteration = 10, .consumed_samples = 40, .optimizer_steps = 10,
                        .attempt = 1, .has_sched = true,
                        .sched = {.lr = 1e-3, .min_lr = 0, .warmup = 0, .decay = 20}};
  json_t *j = mega_ckpt_state_json(&st, &job, true);
  char *t = json_dumps(j, JSON_INDENT(2));
  put_str("ckpt", "trainer_state", 3, t);
  free(t);
  json_decref(j);
  mega_jobspec_free(&job);
  fuzz_clean();
}

/* An MMIDIDX pair as tools/preprocess writes it, as fuzz_indexed's input. */
static void indexed(int dtype, const char *name) {
  char prefix[512], p[600];
  snprintf(prefix, sizeof prefix, "%s/d", fuzz_dir());
  mega_indexed_writer *w;
  mega_err err = {0};
  if (mega_indexed_writer_open(prefix, dtype, &w, &err) != MEGA_OK) abort();
  int32_t a[5] = {1, 2, 3, 50, 255}, b[2] = {7, 9};
  if (mega_indexed_writer_add(w, a, 5, &err) != MEGA_OK ||
      mega_indexed_writer_add(w, b, 2, &err) != MEGA_OK ||
      mega_indexed_writer_close(w, &err) != MEGA_OK) {
    fprintf(stderr, "seeds: %s\n", err.msg);
    abort();
  }
  size_t ni, nb;
  snprintf(p, sizeof p, "%s.idx", prefix);
  uint8_t *idx = slurp(p, &ni);
  snprintf(p, sizeof p, "%s.bin", prefix);
  uint8_t *bin = slurp(p, &nb);
  uint8_t *all = malloc(2 + ni + nb);
  all[0] = (uint8_t)ni;
  all[1] = (uint8_t)(ni >> 8);
  memcpy(all + 2, idx, ni);
  memcpy(all + 2 + ni, bin, nb);
  put("indexed", name, -1, all, 2 + ni + nb);
  free(all);
  free(idx);
  free(bin);
  fuzz_clean();
}

/* Each of fuzz_order_cache's keys' cache file as mega writes it. */
static void order_caches(void) {
  for (int i = 0; i < 4; i++) {
    const order_key *k = &order_keys[i];
    mega_gpt_order *o = NULL;
    mega_gpt_cache_how how;
    mega_err err = {0};
    if (mega_gpt_order_open(order_cum, k->doc0, k->doc1, k->T, k->samples, k->seed, fuzz_dir(),
                            &o, &how, NULL, 0, &err) != MEGA_OK) {
      fprintf(stderr, "seeds: %s\n", err.msg);
      abort();
    }
    mega_gpt_order_free(o);
    char p[512];
    mega_gpt_order_cache_path(order_cum, k->doc0, k->doc1, k->T, k->samples, k->seed, fuzz_dir(),
                              p, sizeof p);
    size_t n;
    void *b = slurp(p, &n);
    put("order_cache", k->name, i, b, n);
    free(b);
    fuzz_clean();
  }
}

/* fuzz_ckpt_config's input: config.json as a save writes it. */
static void config(const char *name, const mega_gpt_config *c, const mega_jobspec *job) {
  json_t *j = mega_ckpt_config_json(c, job);
  char *t = json_dumps(j, mega_ckpt_config_flags(j));
  put_str("ckpt_config", name, -1, t);
  free(t);
  json_decref(j);
}

static void configs(void) {
  mega_gpt_config c;
  mega_gpt_config_default(&c);
  c.num_layers = 2, c.channels = 32, c.num_heads = 2, c.max_seq_len = 16;
  config("gpt2", &c, NULL);
  c.untied = true, c.gelu_erf = true, c.ffn_hidden = 48;
  c.hidden_dropout = 0.1, c.attention_dropout = 0.05;
  config("gpt2_untied_erf", &c, NULL);
  mega_gpt_config_default(&c);
  c.arch = MEGA_GPT_ARCH_LLAMA, c.num_layers = 2, c.channels = 64, c.num_heads = 4;
  c.num_kv_heads = 2, c.ffn_hidden = 96, c.max_seq_len = 32, c.untied = true;
  c.no_bias = true, c.ln_eps = 1e-6f, c.rope_theta = 500000, c.rotary_percent = 0.5;
  config("llama_gqa", &c, NULL);
  c.no_bias = false, c.untied = false, c.head_dim = 8, c.rotary_percent = 1;
  mega_jobspec job;
  mega_jobspec_defaults(&job);
  config("llama_bias_ids", &c, &job);
  mega_jobspec_free(&job);
}

/* A growing byte string. */
typedef struct bytes {
  uint8_t *b;
  size_t n;
} bytes;

static void add(bytes *s, const void *p, size_t n) {
  s->b = realloc(s->b, s->n + n);
  memcpy(s->b + s->n, p, n);
  s->n += n;
}

static void add_frame(bytes *s, const ProtobufCMessage *m) {
  uint8_t *b;
  size_t n;
  mega_err err = {0};
  if (mega_frame_encode(m, 0, &b, &n, &err) != MEGA_OK) abort();
  add(s, b, n);
  free(b);
}

/* A donor's header, as rank_hold.c answers a fetch. */
static void add_header(bytes *s, int donor, const char *error) {
  Mega__V1__ReplicaHeader h = MEGA__V1__REPLICA_HEADER__INIT;
  h.error = (char *)error;
  h.job_id = REPLICA_JOB;
  h.attempt = REPLICA_ATTEMPT;
  h.rank = (uint32_t)donor;
  h.iteration = REPLICA_ITERATION;
  h.optimizer_steps = 7;
  h.eval_done = 2;
  h.ntensors = 3;
  add_frame(s, &h.base);
}

/* A piece and its floats (kind 0: END, no floats). */
static void add_piece(bytes *s, int kind, size_t tensor, size_t offset, size_t count) {
  Mega__V1__ReplicaPiece p = MEGA__V1__REPLICA_PIECE__INIT;
  p.kind = (Mega__V1__ReplicaPieceKind)kind;
  p.tensor = tensor;
  p.offset = offset;
  p.count = count;
  add_frame(s, &p.base);
  for (size_t i = 0; i < count; i++) {
    float x = (float)(kind * 100 + (int)tensor * 10 + (int)(offset + i));
    add(s, &x, sizeof x);
  }
}

/* fuzz_replica's input: the moments' memory, then donors' answers. */
static void replicas(void) {
  bytes one = {0}, two = {0}, no = {0};
  add(&one, "\0", 1); /* one donor with everything, as a rank without a distributed optimizer */
  add_header(&one, 0, "");
  for (size_t t = 0; t < 3; t++)
    for (int kind = 1; kind <= 3; kind++) add_piece(&one, kind, t, 0, replica_sizes[t]);
  add_piece(&one, 0, 0, 0, 0);
  put("replica", "one_donor", -1, one.b, one.n);
  /* the parameters from one, the moments from another in two shards */
  add(&two, "\1", 1);
  add_header(&two, 0, "");
  for (size_t t = 0; t < 3; t++) add_piece(&two, 1, t, 0, replica_sizes[t]);
  add_piece(&two, 0, 0, 0, 0);
  add_header(&two, 1, "");
  for (size_t t = 0; t < 3; t++)
    for (int kind = 2; kind <= 3; kind++) {
      size_t half = replica_sizes[t] / 2;
      if (half) add_piece(&two, kind, t, 0, half);
      add_piece(&two, kind, t, half, replica_sizes[t] - half);
    }
  add_piece(&two, 0, 0, 0, 0);
  put("replica", "two_donors", -1, two.b, two.n);
  add(&no, "\0", 1);
  add_header(&no, 0, "the token does not match (only the attempt the coordinator planned may "
                     "fetch)");
  put("replica", "refused", -1, no.b, no.n);
  free(one.b);
  free(two.b);
  free(no.b);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds OUTDIR\n");
    return 2;
  }
  out = argv[1];
  layouts();
  hostlists();
  durations();
  utf8s();
  bpes();
  weblogins();
  schedules();
  jobspecs();
  frames();
  journals();
  tensors();
  checkpoints();
  indexed(8, "uint16");
  indexed(4, "int32");
  order_caches();
  replicas();
  configs();
  return 0;
}
