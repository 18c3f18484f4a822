/* The rank fuzz_replica receives into, shared with fuzz_seeds, which
 * writes donors' answers for it as seeds. */
#ifndef MEGA_TESTS_FUZZ_REPLICA_FIXTURE_H
#define MEGA_TESTS_FUZZ_REPLICA_FIXTURE_H

/* Its tensors' floats, and the header every donor must send (donor i of
 * the input is rank i). */
static const size_t replica_sizes[3] = {6, 1, 5};
#define REPLICA_JOB "j-1-n1"
#define REPLICA_ATTEMPT 1
#define REPLICA_ITERATION 7

#endif
