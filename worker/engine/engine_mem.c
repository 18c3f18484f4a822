#include "worker/engine/engine_mem.h"

#include <stdlib.h>

#include "worker/engine/p2p.h"

struct mega_emem_entry {
  mega_emem_entry *next;
  bool in_use;
  size_t bytes;
  float *p;              /* a buffer */
  mega_gpt_acts *acts;   /* or activations of (stage, B, T) */
  mega_gpt_stage *stage;
  int B, T;
};

void mega_emem_init(mega_emem *m, mega_backend *be) { *m = (mega_emem){.be = be}; }

void mega_emem_free(mega_emem *m) {
  for (mega_emem_entry *e = m->bufs, *next; e; e = next) {
    next = e->next;
    m->be->ops->free(m->be, e->p);
    free(e);
  }
  for (mega_emem_entry *e = m->acts, *next; e; e = next) {
    next = e->next;
    mega_gpt_acts_destroy(e->acts);
    free(e);
  }
  *m = (mega_emem){.be = m->be};
}

mega_status mega_emem_get(mega_emem *m, mega_ebuf *b, size_t floats, mega_err *err) {
  size_t bytes = mega_p2p_buffer_bytes(floats);
  mega_emem_entry *e = m->bufs;
  while (e && (e->in_use || e->bytes != bytes)) e = e->next;
  if (!e) {
    e = calloc(1, sizeof *e);
    if (!e) return mega_fail(err, MEGA_ERR_NOMEM, "engine: out of memory");
    void *p;
    mega_status st = m->be->ops->alloc(m->be, bytes, &p, err);
    if (st != MEGA_OK) {
      free(e);
      return st;
    }
    e->p = p;
    e->bytes = bytes;
    e->next = m->bufs;
    m->bufs = e;
  }
  e->in_use = true;
  m->live_bytes += bytes;
  *b = (mega_ebuf){.p = e->p, .floats = floats};
  return MEGA_OK;
}

void mega_emem_put(mega_emem *m, mega_ebuf *b) {
  if (!b->p) return;
  for (mega_emem_entry *e = m->bufs; e; e = e->next)
    if (e->p == b->p && e->in_use) {
      e->in_use = false;
      m->live_bytes -= e->bytes;
      break;
    }
  *b = (mega_ebuf){0};
}

mega_status mega_emem_get_acts(mega_emem *m, mega_gpt_stage *stage, int chunk, int B, int T,
                               mega_gpt_acts **out, mega_err *err) {
  (void)chunk;
  mega_emem_entry *e = m->acts;
  while (e && (e->in_use || e->stage != stage || e->B != B || e->T != T)) e = e->next;
  if (!e) {
    e = calloc(1, sizeof *e);
    if (!e) return mega_fail(err, MEGA_ERR_NOMEM, "engine: out of memory");
    mega_status st = mega_gpt_acts_create(stage, B, T, &e->acts, err);
    if (st != MEGA_OK) {
      free(e);
      return st;
    }
    e->stage = stage;
    e->B = B;
    e->T = T;
    e->bytes = mega_gpt_acts_bytes(e->acts);
    e->next = m->acts;
    m->acts = e;
  }
  e->in_use = true;
  m->live_bytes += e->bytes;
  *out = e->acts;
  return MEGA_OK;
}

void mega_emem_put_acts(mega_emem *m, mega_gpt_acts *a) {
  if (!a) return;
  for (mega_emem_entry *e = m->acts; e; e = e->next)
    if (e->acts == a && e->in_use) {
      e->in_use = false;
      m->live_bytes -= e->bytes;
      return;
    }
}
