#!/bin/bash
# The committed seeds are what the real writers write now: each file
# fuzz_seeds writes equals its copy in tests/fuzz/corpus/ (a writer that
# changed and seeds that did not leave the fuzzers starting from inputs
# no save makes). On a difference: scripts/fuzz --seeds, and commit them.
#
# usage: seeds_current.sh FUZZ_SEEDS CORPUS
set -u
seeds=$1 corpus=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$seeds" "$work" >/dev/null || { echo "FAIL: $seeds exited $?"; exit 1; }
stale=0
for f in "$work"/*/*; do
  rel=${f#"$work"/}
  if ! cmp -s "$f" "$corpus/$rel"; then
    echo "FAIL: tests/fuzz/corpus/$rel is not what its writer writes now"
    stale=$((stale + 1))
  fi
done
[ "$stale" = 0 ] || { echo "$stale stale seed(s): run scripts/fuzz --seeds and commit them"; exit 1; }
echo "$(find "$work" -type f | wc -l) seeds current"
