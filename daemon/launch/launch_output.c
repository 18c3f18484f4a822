/* A worker's output: every byte to its rank log, and the last stderr lines
 * kept for the exit report (launch_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/launch/launch_internal.h"

static void keep_line(megad_worker *w, const char *s, size_t n) {
  if (n > LINE_MAX_KEPT - 1) n = LINE_MAX_KEPT - 1;
  memcpy(w->tail[w->tail_next], s, n);
  w->tail[w->tail_next][n] = '\0';
  w->tail_next = (w->tail_next + 1) % MEGAD_TAIL_LINES;
  if (w->tail_n < MEGAD_TAIL_LINES) w->tail_n++;
}

void launch_capture(megad_worker *w, const char *buf, size_t n, bool is_err) {
  if (w->log_fd >= 0 && write(w->log_fd, buf, n) < 0) {
    /* a full disk loses log lines, not the job */
  }
  if (!is_err) return;
  for (size_t i = 0; i < n; i++) {
    if (buf[i] == '\n') {
      keep_line(w, w->partial, w->partial_len);
      w->partial_len = 0;
    } else if (w->partial_len < LINE_MAX_KEPT - 1) {
      w->partial[w->partial_len++] = buf[i];
    }
  }
}

char *launch_tail_text(megad_worker *w) {
  if (w->partial_len) {
    keep_line(w, w->partial, w->partial_len);
    w->partial_len = 0;
  }
  size_t cap = (size_t)w->tail_n * LINE_MAX_KEPT + 1, off = 0;
  char *s = malloc(cap);
  if (!s) return NULL;
  s[0] = '\0';
  for (int i = 0; i < w->tail_n; i++) {
    int k = (w->tail_next - w->tail_n + i + MEGAD_TAIL_LINES) % MEGAD_TAIL_LINES;
    off += (size_t)snprintf(s + off, cap - off, "%s%s", off ? "\n" : "", w->tail[k]);
  }
  return s;
}
