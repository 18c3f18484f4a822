/* core/hostlist: Slurm's node lists (SLURM_JOB_NODELIST, --nodelist) as
 * megad expands them. The input is the list. What expands must name at
 * most MEGA_HOSTLIST_MAX hosts, each non-empty, without a comma or a
 * bracket and without space at either end; so the names joined by commas
 * are a list of their own, which must expand to the same names. A refusal
 * says why and hands back nothing.
 *
 * megad --peers slurm makes a node's peers of the list: every name but
 * the node's own, each once, in the list's order, at the port; a node not
 * in the list is refused. */
#include <ctype.h>

#include "core/hostlist.h"
#include "daemon/slurm.h"
#include "fuzz.h"

/* The peers of names[self] as megad_slurm_peers should make them. */
static void peers(const char *list, char **names, size_t n, size_t self) {
  char *got = NULL;
  size_t nnodes = 0;
  mega_err err = {0};
  FUZZ_CHECK(megad_slurm_peers(list, "", 7070, &got, &nnodes, &err) != MEGA_OK && err.msg[0]);
  FUZZ_CHECK(!got);
  FUZZ_CHECK(megad_slurm_peers(list, names[self], 7070, &got, &nnodes, &err) == MEGA_OK);
  FUZZ_CHECK(got && nnodes >= 1 && nnodes <= n);
  const char *p = got;
  if (n <= 4096) { /* the plain way, for lists that allow it */
    size_t entries = 0;
    for (size_t i = 0; i < n; i++) {
      bool seen = !strcmp(names[i], names[self]);
      for (size_t k = 0; k < i && !seen; k++) seen = !strcmp(names[k], names[i]);
      if (seen) continue;
      size_t len = strlen(names[i]);
      FUZZ_CHECK(!strncmp(p, names[i], len) && !strncmp(p + len, ":7070", 5));
      p += len + 5;
      FUZZ_CHECK(*p == (entries + 2 < nnodes ? ',' : '\0'));
      p += *p == ',';
      entries++;
    }
    FUZZ_CHECK(entries + 1 == nnodes && !*p);
  } else {
    size_t commas = 0;
    for (; *p; p++) commas += *p == ',';
    FUZZ_CHECK(got[0] ? commas + 2 == nnodes : nnodes == 1);
  }
  free(got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = fuzz_str(data, size);
  char **names = NULL;
  size_t n = 0;
  mega_err err = {0};
  if (mega_hostlist_expand(s, &names, &n, &err) != MEGA_OK) {
    FUZZ_CHECK(err.msg[0] && !names && n == 0);
    free(s);
    return 0;
  }
  FUZZ_CHECK(names && n >= 1 && n <= MEGA_HOSTLIST_MAX);
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(names[i]);
    FUZZ_CHECK(len > 0 && !strpbrk(names[i], ",[]"));
    FUZZ_CHECK(!isspace((unsigned char)names[i][0]) &&
               !isspace((unsigned char)names[i][len - 1]));
    total += len + 1;
  }
  /* the names as a plain list expand to themselves */
  char *joined = malloc(total);
  FUZZ_CHECK(joined);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(names[i]);
    memcpy(joined + o, names[i], len);
    o += len;
    joined[o++] = i + 1 < n ? ',' : '\0';
  }
  char **back = NULL;
  size_t nb = 0;
  FUZZ_CHECK(mega_hostlist_expand(joined, &back, &nb, &err) == MEGA_OK);
  FUZZ_CHECK(nb == n);
  for (size_t i = 0; i < n; i++) FUZZ_CHECK(!strcmp(back[i], names[i]));
  mega_hostlist_free(back, nb);
  free(joined);
  peers(s, names, n, size % n);
  mega_hostlist_free(names, n);
  free(s);
  return 0;
}
