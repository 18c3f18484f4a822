#include "core/throttle.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct source {
  char key[MEGA_THROTTLE_KEY_MAX]; /* "": a free slot */
  uint32_t fails;
  int64_t last_ms;  /* the last failure */
  int64_t until_ms; /* held off until */
} source;

struct mega_throttle {
  source s[MEGA_THROTTLE_SOURCES];
};

mega_throttle *mega_throttle_new(void) { return calloc(1, sizeof(mega_throttle)); }

void mega_throttle_free(mega_throttle *t) { free(t); }

/* A scan: the table is small and only failures and logins look at it. */
static source *find(const mega_throttle *t, const char *key, int64_t now_ms) {
  for (size_t i = 0; i < MEGA_THROTTLE_SOURCES; i++) {
    const source *s = &t->s[i];
    if (s->key[0] && !strncmp(s->key, key, sizeof s->key - 1) &&
        now_ms - s->last_ms < MEGA_THROTTLE_FORGET_MS)
      return (source *)s;
  }
  return NULL;
}

int64_t mega_throttle_wait(const mega_throttle *t, const char *source_, int64_t now_ms) {
  const source *s = find(t, source_, now_ms);
  return s && s->until_ms > now_ms ? s->until_ms - now_ms : 0;
}

int64_t mega_throttle_fail(mega_throttle *t, const char *key, int64_t now_ms) {
  source *s = find(t, key, now_ms);
  if (!s) { /* a free or forgotten slot, else the one that failed least recently */
    s = &t->s[0];
    for (size_t i = 0; i < MEGA_THROTTLE_SOURCES; i++) {
      source *c = &t->s[i];
      if (!c->key[0] || now_ms - c->last_ms >= MEGA_THROTTLE_FORGET_MS) {
        s = c;
        break;
      }
      if (c->last_ms < s->last_ms) s = c;
    }
    memset(s, 0, sizeof *s);
    snprintf(s->key, sizeof s->key, "%s", key);
  }
  s->fails++;
  s->last_ms = now_ms;
  if (s->fails <= MEGA_THROTTLE_FREE) return 0;
  uint32_t k = s->fails - MEGA_THROTTLE_FREE - 1;
  int64_t hold = k >= 6 ? MEGA_THROTTLE_MAX_MS : (int64_t)MEGA_THROTTLE_FIRST_MS << k;
  if (hold > MEGA_THROTTLE_MAX_MS) hold = MEGA_THROTTLE_MAX_MS;
  s->until_ms = now_ms + hold;
  return hold;
}

void mega_throttle_forget(mega_throttle *t, const char *key) {
  for (size_t i = 0; i < MEGA_THROTTLE_SOURCES; i++)
    if (t->s[i].key[0] && !strncmp(t->s[i].key, key, sizeof t->s[i].key - 1))
      t->s[i].key[0] = '\0';
}

const char *mega_throttle_source(const char *peer, char *buf, size_t cap) {
  if (!cap) return buf;
  if (!peer) peer = "";
  if (!strncmp(peer, "unix:", 5) || !strncmp(peer, "unix-abstract:", 14)) {
    snprintf(buf, cap, "unix");
    return buf;
  }
  if (!strncmp(peer, "ipv4:", 5) || !strncmp(peer, "ipv6:", 5)) peer += 5;
  /* gRPC writes peers as URIs: "ipv6:%5B::1%5D:4711" (%25 for a zone's %) */
  char plain[MEGA_THROTTLE_KEY_MAX + 8];
  size_t w = 0;
  for (const char *p = peer; *p && w < sizeof plain - 1; p++) {
    unsigned v;
    if (p[0] == '%' && isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2]) &&
        sscanf(p + 1, "%2x", &v) == 1) {
      plain[w++] = (char)v;
      p += 2;
    } else {
      plain[w++] = *p;
    }
  }
  plain[w] = '\0';
  peer = plain;
  size_t n = strlen(peer);
  bool bracketed = peer[0] == '[';
  if (bracketed) { /* [v6]:port */
    const char *end = strchr(peer, ']');
    peer++;
    n = end ? (size_t)(end - peer) : strlen(peer);
  } else if (strchr(peer, ':') == strrchr(peer, ':') && strchr(peer, ':')) {
    n = (size_t)(strchr(peer, ':') - peer); /* v4:port; a bare v6 has several */
  }
  /* an IPv4 client of a dual-stack listener is the same source as over IPv4 */
  if (n > 7 && !strncasecmp(peer, "::ffff:", 7) && memchr(peer + 7, '.', n - 7)) {
    peer += 7;
    n -= 7;
  }
  snprintf(buf, cap, "%.*s", (int)n, peer);
  return buf;
}
