/* Comparing secrets (tokens, session ids) without telling an attacker, by
 * the time it takes, how much of a guess was right. */
#ifndef MEGA_CORE_SECRET_H
#define MEGA_CORE_SECRET_H

#include <stdbool.h>
#include <stddef.h>

/* Whether sent (sent_len bytes) equals want (want_len bytes). The time taken
 * depends on want_len only, never on where the first difference is or on
 * sent_len; either pointer may be NULL when its length is 0. */
bool mega_secret_equal(const void *sent, size_t sent_len, const void *want, size_t want_len);

#endif
