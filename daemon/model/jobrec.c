/* Journal records of jobs (daemon/model/megad.proto) and their replay. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/job.h"
#include "daemon/model/megad.pb-c.h"
#include "daemon/model/util.h"

static mega_status pack(const Megad__V1__JournalRecord *r, uint8_t **buf, size_t *len,
                        mega_err *err) {
  if (!megad_pb_pack(&r->base, buf, len))
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory packing a journal record");
  return MEGA_OK;
}

mega_status mega_jrec_job(const mega_job *j, uint8_t **buf, size_t *len, mega_err *err) {
  mega_job_msg m;
  mega_status s = mega_job_msg_init(&m, j, err);
  if (s != MEGA_OK) return s;
  Megad__V1__JobRecord jr = MEGAD__V1__JOB_RECORD__INIT;
  jr.job = &m.job;
  jr.checkpoint_iteration = j->ckpt_iteration;
  jr.checkpoint_path = j->ckpt_path ? j->ckpt_path : "";
  Megad__V1__JournalRecord r = MEGAD__V1__JOURNAL_RECORD__INIT;
  r.rec_case = MEGAD__V1__JOURNAL_RECORD__REC_JOB;
  r.job = &jr;
  s = pack(&r, buf, len, err);
  mega_job_msg_free(&m);
  return s;
}

mega_status mega_jrec_event(const char *job_id, const Mega__V1__JobEvent *ev, uint8_t **buf,
                            size_t *len, mega_err *err) {
  Megad__V1__EventRecord er = MEGAD__V1__EVENT_RECORD__INIT;
  er.job_id = (char *)job_id;
  er.event = (Mega__V1__JobEvent *)ev;
  Megad__V1__JournalRecord r = MEGAD__V1__JOURNAL_RECORD__INIT;
  r.rec_case = MEGAD__V1__JOURNAL_RECORD__REC_EVENT;
  r.event = &er;
  return pack(&r, buf, len, err);
}

mega_status mega_jrec_step(const char *job_id, const Mega__V1__StepMetrics *step, uint8_t **buf,
                           size_t *len, mega_err *err) {
  Megad__V1__StepRecord sr = MEGAD__V1__STEP_RECORD__INIT;
  sr.job_id = (char *)job_id;
  sr.step = (Mega__V1__StepMetrics *)step;
  Megad__V1__JournalRecord r = MEGAD__V1__JOURNAL_RECORD__INIT;
  r.rec_case = MEGAD__V1__JOURNAL_RECORD__REC_STEP;
  r.step = &sr;
  return pack(&r, buf, len, err);
}

mega_status mega_jrec_forget(const char *job_id, uint8_t **buf, size_t *len, mega_err *err) {
  Megad__V1__ForgetRecord fr = MEGAD__V1__FORGET_RECORD__INIT;
  fr.job_id = (char *)job_id;
  Megad__V1__JournalRecord r = MEGAD__V1__JOURNAL_RECORD__INIT;
  r.rec_case = MEGAD__V1__JOURNAL_RECORD__REC_FORGET;
  r.forget = &fr;
  return pack(&r, buf, len, err);
}

/* A replayed job record replaces the job's journaled state; the history,
 * which comes from other records, stays. */
static mega_status apply_job(mega_jobs *t, const Megad__V1__JobRecord *jr, mega_err *err) {
  if (!jr->job || !jr->job->id || !jr->job->id[0])
    return mega_fail(err, MEGA_ERR_INVALID, "a job record without a job id");
  mega_job *nj;
  mega_status s = mega_job_from_msg(jr->job, &nj, err);
  if (s != MEGA_OK) return s;
  /* older journals kept the checkpoint beside the Job message only */
  if (jr->checkpoint_iteration > nj->ckpt_iteration) nj->ckpt_iteration = jr->checkpoint_iteration;
  if (!nj->ckpt_path && jr->checkpoint_path && jr->checkpoint_path[0] &&
      !(nj->ckpt_path = strdup(jr->checkpoint_path))) {
    mega_job_free(nj);
    return mega_fail(err, MEGA_ERR_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < t->n; i++) {
    mega_job *old = t->v[i];
    if (strcmp(old->id, nj->id)) continue;
    nj->hist = old->hist;
    nj->etcd.fence = old->etcd.fence; /* from the coordinator key, not the record */
    nj->etcd.orphan = old->etcd.orphan;
    memset(&old->hist, 0, sizeof old->hist);
    mega_job_free(old);
    t->v[i] = nj;
    return MEGA_OK;
  }
  s = mega_jobs_add(t, nj, err);
  if (s != MEGA_OK) mega_job_free(nj);
  return s;
}

static mega_status apply_item(mega_jobs *t, const char *job_id,
                              const Mega__V1__WatchJobResponse *item, mega_err *err) {
  mega_job *j = mega_jobs_table_find(t, job_id);
  if (j) return mega_job_hist_push(&j->hist, item, err);
  t->orphan_items++;
  if (!job_id) return MEGA_OK;
  bool known = false;
  for (size_t i = 0; i < t->norphans && !known; i++) known = !strcmp(t->orphans[i], job_id);
  if (!known && t->norphans < MEGA_JOBS_ORPHANS)
    snprintf(t->orphans[t->norphans++], sizeof t->orphans[0], "%s", job_id);
  return MEGA_OK;
}

mega_status mega_jobs_apply(mega_jobs *t, const uint8_t *rec, size_t len, mega_err *err) {
  Megad__V1__JournalRecord *r = megad__v1__journal_record__unpack(NULL, len, rec);
  if (!r) return mega_fail(err, MEGA_ERR_INVALID, "a journal record of %zu bytes does not parse", len);
  mega_status s = MEGA_OK;
  Mega__V1__WatchJobResponse item = MEGA__V1__WATCH_JOB_RESPONSE__INIT;
  switch (r->rec_case) {
  case MEGAD__V1__JOURNAL_RECORD__REC_JOB:
    s = apply_job(t, r->job, err);
    break;
  case MEGAD__V1__JOURNAL_RECORD__REC_EVENT:
    if (r->event->event) {
      item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_EVENT;
      item.event = r->event->event;
      s = apply_item(t, r->event->job_id, &item, err);
    }
    break;
  case MEGAD__V1__JOURNAL_RECORD__REC_STEP:
    if (r->step->step) {
      item.item_case = MEGA__V1__WATCH_JOB_RESPONSE__ITEM_STEP;
      item.step = r->step->step;
      s = apply_item(t, r->step->job_id, &item, err);
    }
    break;
  case MEGAD__V1__JOURNAL_RECORD__REC_FORGET:
    if (r->forget->job_id && r->forget->job_id[0]) mega_jobs_forget(t, r->forget->job_id);
    break;
  default:
    t->unknown_records++; /* a record kind from a newer megad: skip it */
    break;
  }
  megad__v1__journal_record__free_unpacked(r, NULL);
  return s;
}
