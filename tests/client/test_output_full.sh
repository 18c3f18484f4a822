#!/bin/bash
# megactl, megad run and megaw whose output cannot be written (a full disk:
# /dev/full fails every write with ENOSPC): each fails with the reason on
# stderr, where it exited 0 and a script took a cut or empty file (`megactl
# watch --json > steps.jsonl`) for the whole. A watch stops at the first
# failed write; a job (megad run, megaw) trains to its end and then fails.
#
# usage: test_output_full.sh MEGACTL MEGAD MEGAW
set -u
megactl=$(readlink -f "$1")
megad=$(readlink -f "$2")
megaw=$(readlink -f "$3")
source "$(dirname "$(readlink -f "$0")")/../megad_lib.sh"

# full RC CMD...: CMD with stdout on /dev/full exits RC and says why.
full() {
  local rc=$1
  shift
  "$@" >/dev/full 2>err.txt
  local got=$?
  [ "$got" = "$rc" ] || fail "'$*' >/dev/full exited $got, want $rc; stderr: $(cat err.txt)"
  grep -q 'No space left on device' err.txt ||
    fail "'$*' >/dev/full did not say why: $(cat err.txt)"
}

full 1 "$megactl" --version
full 1 "$megactl" version --client
full 1 "$megactl" version # no megad answers either: both are said
full 1 "$megactl" --help
full 1 "$megad" --version
full 1 "$megaw" --version

start_megad --slots 1 --node-name full-node
printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 40) > data.txt
tiny=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16
      --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --data-path data.txt)
submit() { # submit ARGS...: the job's id in $id
  "$megactl" submit "${tiny[@]}" "$@" >out.txt 2>err.txt || fail "submit: $(cat err.txt)"
  id=$(tail -1 out.txt)
}

# a job that trains until cancelled: the watch stops at its first failed
# write (timeout's 124 would be a watch that went on for nothing)
submit --train-iters 100000 --simulate-compute 5:10
full 1 timeout 60 "$megactl" watch "$id" --json
full 1 timeout 60 "$megactl" watch "$id" --plain
full 1 "$megactl" status "$id"
full 1 "$megactl" ls
full 1 "$megactl" nodes --json
full 1 "$megactl" version
"$megactl" cancel "$id" >/dev/null 2>err.txt || fail "cancel: $(cat err.txt)"

# a job of its own: it trains to its end (its checkpoint is there), then
# the run fails for the output it lost
full 1 "$megad" run --slots 1 --json "${tiny[@]}" --train-iters 3 --save ck1 --save-interval 3
grep -q 'the job succeeded, but its output did not all reach stdout' err.txt ||
  fail "megad run did not say the job succeeded: $(cat err.txt)"
[ "$(cat ck1/latest_checkpointed_iteration.txt)" = 3 ] || fail "megad run did not train to its end"
full 1 "$megaw" --json "${tiny[@]}" --train-iters 3 --save ck2 --save-interval 3
[ "$(cat ck2/latest_checkpointed_iteration.txt)" = 3 ] || fail "megaw did not train to its end"
"$megaw" --json "${tiny[@]}" --train-iters 3 >steps.jsonl 2>err.txt || fail "megaw: $(cat err.txt)"
[ "$(wc -l <steps.jsonl)" = 3 ] || fail "megaw --json wrote $(wc -l <steps.jsonl) lines, not 3"

# with room, the same watch writes every step and exits 0
submit --train-iters 3
"$megactl" watch "$id" --json >steps.jsonl 2>err.txt || fail "watch: $(cat err.txt)"
[ "$(wc -l <steps.jsonl)" = 3 ] || fail "watch --json wrote $(wc -l <steps.jsonl) lines, not 3"

if [ "$fails" != 0 ]; then
  echo "$fails check(s) failed; megad's log:"
  tail -50 "$work/megad.log"
  exit 1
fi
echo "test_output_full: ok"
