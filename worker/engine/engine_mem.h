/* The engine's memory: pools of P2P buffers and of per-microbatch
 * activations, reused across microbatches and iterations, and a count of
 * the bytes in use (what the schedule needs at once). Private to the engine.
 *
 * Ownership: the pool owns every buffer and mega_gpt_acts it hands out; a
 * mega_ebuf is a borrowed view, given back with mega_emem_put. */
#ifndef MEGA_WORKER_ENGINE_MEM_H
#define MEGA_WORKER_ENGINE_MEM_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "worker/backend/backend.h"
#include "worker/model/gpt.h"

typedef struct mega_ebuf {
  float *p;      /* backend memory, with P2P trailer room after the payload */
  size_t floats; /* payload size */
} mega_ebuf;

typedef struct mega_emem_entry mega_emem_entry;

typedef struct mega_emem {
  mega_backend *be;
  mega_emem_entry *bufs, *acts; /* pooled, in use or free */
  size_t live_bytes;
} mega_emem;

void mega_emem_init(mega_emem *m, mega_backend *be);
void mega_emem_free(mega_emem *m);

/* Fills b with a buffer of `floats` (b must be empty). */
mega_status mega_emem_get(mega_emem *m, mega_ebuf *b, size_t floats, mega_err *err);
/* Gives b's buffer back and empties b; an empty b is fine. */
void mega_emem_put(mega_emem *m, mega_ebuf *b);

mega_status mega_emem_get_acts(mega_emem *m, mega_gpt_stage *stage, int chunk, int B, int T,
                               mega_gpt_acts **out, mega_err *err);
void mega_emem_put_acts(mega_emem *m, mega_gpt_acts *a); /* NULL is fine */

#endif
