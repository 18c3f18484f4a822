/* megaw generate: text from a checkpoint (worker/generate.h).
 *
 *   megaw generate --load DIR --prompt TEXT [--max-new-tokens N]
 *                  [--temperature T] [--top-k K] [--seed S]
 *                  [--tokenizer-type GPT2BPETokenizer --vocab-file F --merge-file F]
 *
 * With the byte tokenizer the prompt's bytes are its tokens and stdout gets
 * the prompt, then the continuation's bytes, then a newline. With
 * NullTokenizer the prompt is token ids separated by spaces (Megatron's
 * NullTokenizer.text_to_ids) and so is the output. GPT2BPETokenizer (for a
 * model trained on ids tools/preprocess wrote) encodes the prompt and
 * decodes the output as text. */
#include "worker/megaw_generate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/nofollow.h"
#include "worker/backend/backend.h"
#include "worker/data/bpe.h"
#include "worker/generate.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: megaw generate --load DIR --prompt TEXT [--max-new-tokens N]\n"
          "                      [--temperature T] [--top-k K] [--seed S]\n\n"
          "Continues TEXT with the model of DIR's newest complete checkpoint, on this\n"
          "machine alone (one rank). With the byte tokenizer TEXT's bytes are the tokens;\n"
          "with NullTokenizer TEXT is token ids separated by spaces.\n\n"
          "  --load DIR            a --save directory (or one iter_* directory in it)\n"
          "  --prompt TEXT         what to continue\n"
          "  --max-new-tokens N    tokens to add (default 64)\n"
          "  --temperature T       0 (the default) is greedy: the likeliest token each time;\n"
          "                        above 0, sample from softmax(logits / T)\n"
          "  --top-k K             sample only among the K likeliest tokens (default 0: all)\n"
          "  --seed S              the sampling's seed (default 1234); the same seed gives\n"
          "                        the same text\n"
          "  --tokenizer-type GPT2BPETokenizer --vocab-file F --merge-file F\n"
          "                        read and write text with GPT-2's BPE (a model trained on\n"
          "                        ids from tools/preprocess), instead of the checkpoint's\n"
          "                        tokenizer\n");
}

static int bad(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "megaw generate: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, " (see megaw generate --help)\n");
  return 2;
}

/* "--flag value" or "--flag=value" for flag name; *i advances. */
static const char *value(int argc, char **argv, int *i, const char *name) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n)) return NULL;
  if (argv[*i][n] == '=') return argv[(*i)++] + n + 1;
  if (argv[*i][n] || *i + 1 >= argc) return NULL;
  *i += 2;
  return argv[*i - 1];
}

static bool number(const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end || errno || !isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

/* NullTokenizer's text_to_ids: ids separated by spaces. */
static int parse_ids(const char *text, int32_t *out, int cap) {
  int n = 0;
  const char *p = text;
  while (*p) {
    while (*p == ' ') p++;
    if (!*p) break;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || (*end && *end != ' ') || errno || v < 0 || v > INT32_MAX || n == cap) return -1;
    out[n++] = (int32_t)v;
    p = end;
  }
  return n;
}

int megaw_generate(int argc, char **argv) {
  const char *load = NULL, *prompt = NULL, *tok = NULL, *vocab = NULL, *merges = NULL, *v;
  mega_gen_opts o = {.max_new_tokens = 64, .temperature = 0, .top_k = 0, .seed = 1234};
  bool seed_given = false;
  for (int i = 1; i < argc;) {
    double x;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if ((v = value(argc, argv, &i, "--load"))) {
      load = v;
    } else if ((v = value(argc, argv, &i, "--prompt"))) {
      prompt = v;
    } else if ((v = value(argc, argv, &i, "--tokenizer-type"))) {
      if (strcmp(v, "GPT2BPETokenizer"))
        return bad("--tokenizer-type: '%s' is not GPT2BPETokenizer%s (without the flag, the "
                   "checkpoint's tokenizer)", v, "");
      tok = v;
    } else if ((v = value(argc, argv, &i, "--vocab-file"))) {
      vocab = v;
    } else if ((v = value(argc, argv, &i, "--merge-file"))) {
      merges = v;
    } else if ((v = value(argc, argv, &i, "--max-new-tokens"))) {
      if (!number(v, 0, 1 << 20, &x) || x != floor(x))
        return bad("--max-new-tokens: '%s' is not a whole number from 0 to 1048576%s", v, "");
      o.max_new_tokens = (int)x;
    } else if ((v = value(argc, argv, &i, "--temperature"))) {
      if (!number(v, 0, 1e6, &x)) return bad("--temperature: '%s' is not a number from 0 to 1e6%s", v, "");
      o.temperature = x;
    } else if ((v = value(argc, argv, &i, "--top-k"))) {
      if (!number(v, 0, 1 << 30, &x) || x != floor(x))
        return bad("--top-k: '%s' is not a whole number from 0 to 1073741824%s", v, "");
      o.top_k = (int)x;
    } else if ((v = value(argc, argv, &i, "--seed"))) {
      if (!number(v, 0, 9007199254740992.0, &x) || x != floor(x))
        return bad("--seed: '%s' is not a whole number from 0 to 2^53 = 9007199254740992%s", v,
                   "");
      o.seed = (uint64_t)x;
      seed_given = true;
    } else {
      return bad("unknown flag or missing value '%s'%s", argv[i], "");
    }
  }
  if (!load || !prompt) return bad("%s%s is required", !load ? "--load DIR" : "--prompt TEXT", "");
  /* greedy picks the most likely id: k and a seed would change nothing */
  if ((o.top_k > 0 || seed_given) && !(o.temperature > 0))
    return bad("%s samples, so it needs --temperature above 0 (without it, the most likely "
               "token is taken)%s", o.top_k > 0 ? "--top-k" : "--seed", "");
  if ((tok || vocab || merges) && !(tok && vocab && merges))
    return bad("--tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file%s%s", "",
               "");

  mega_err err = {0};
  mega_backend *be = NULL;
  mega_gen_model m = {0};
  mega_bpe *bpe = NULL;
  mega_bpe_ids pids = {0};
  char *text = NULL;
  size_t tlen;
  int rc = 1;
  size_t plen = strlen(prompt);
  int32_t *ids = malloc((plen + 1) * sizeof *ids);
  int32_t *out = malloc(((size_t)o.max_new_tokens + 1) * sizeof *out);
  if (!ids || !out) {
    fprintf(stderr, "megaw generate: out of memory\n");
    goto done;
  }
  /* --load resolved once; nothing under it is followed (core/nofollow.h) */
  char *real_load = mega_nf_resolve(load);
  if (mega_backend_cpu_create(NULL, &be, &err) != MEGA_OK ||
      mega_gen_load(real_load ? real_load : load, be, &m, &err)) {
    free(real_load);
    fprintf(stderr, "megaw generate: %s\n", err.msg);
    goto done;
  }
  free(real_load);
  if (m.notice) fprintf(stderr, "megaw generate: %s\n", m.notice);
  /* a model trained with --tokenizer-type GPT2BPETokenizer reads and writes
   * text through the files it trained with, unless others are given */
  if (!tok && m.tokenizer == MEGA_TOKENIZER_GPT2BPE && m.vocab_file && m.merge_file)
    tok = "GPT2BPETokenizer", vocab = m.vocab_file, merges = m.merge_file;
  if (tok && (mega_bpe_load(vocab, merges, &bpe, &err) != MEGA_OK ||
              mega_gen_use_vocab(&m, mega_bpe_vocab_size(bpe), mega_bpe_eod(bpe), &err) != MEGA_OK ||
              mega_bpe_encode(bpe, prompt, plen, &pids, &err) != MEGA_OK)) {
    fprintf(stderr, "megaw generate: %s\n", err.msg);
    goto done;
  }
  bool bytes = !bpe && m.tokenizer == MEGA_TOKENIZER_BYTES;
  int n = (int)plen;
  if (bpe) {
    n = (int)pids.n;
    memcpy(ids, pids.ids, pids.n * sizeof *ids); /* never more ids than bytes */
  } else if (bytes) {
    for (size_t k = 0; k < plen; k++) ids[k] = (unsigned char)prompt[k];
  } else if ((n = parse_ids(prompt, ids, (int)plen + 1)) < 0) {
    rc = bad("--prompt '%s': this checkpoint's NullTokenizer reads token ids separated by "
             "spaces%s", prompt, "");
    goto done;
  }
  int nout = 0;
  if (mega_gen_run(&m, ids, n, &o, out, &nout, &err) != MEGA_OK) {
    fprintf(stderr, "megaw generate: %s\n", err.msg);
    goto done;
  }
  if (bpe) {
    if (mega_bpe_decode(bpe, out, (size_t)nout, &text, &tlen, &err) != MEGA_OK) {
      fprintf(stderr, "megaw generate: %s\n", err.msg);
      goto done;
    }
    fwrite(prompt, 1, plen, stdout);
    fwrite(text, 1, tlen, stdout);
  } else if (bytes) {
    fwrite(prompt, 1, plen, stdout);
    for (int k = 0; k < nout; k++) putchar(out[k]);
  } else {
    for (int k = 0; k < n; k++) printf("%s%d", k ? " " : "", ids[k]);
    for (int k = 0; k < nout; k++) printf(" %d", out[k]);
  }
  putchar('\n');
  /* the text is all this command makes: a full disk or a closed pipe is an error */
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "megaw generate: cannot write the text to stdout: %s\n", strerror(errno));
    goto done;
  }
  rc = 0;
done:
  mega_gen_free(&m);
  mega_bpe_free(bpe);
  free(pids.ids);
  free(text);
  if (be) mega_backend_destroy(be);
  free(ids);
  free(out);
  return rc;
}
