#!/bin/bash
# megactl against a real megad (and real megaw workers, cpu backend): submit,
# watch (--json, plain), status, ls, nodes, cancel, trace, and every error a
# user meets: an unknown job, an invalid job (megactl's check and megad's),
# a job that fails, an unreachable server.
#
# usage: test_e2e.sh MEGACTL MEGAD MEGACTL_OTHER_BUILD
set -u
megactl=$(readlink -f "$1")
megad=$(readlink -f "$2")
megactl_other=$(readlink -f "$3")
source "$(dirname "$(readlink -f "$0")")/../megad_lib.sh"

# run RC CMD...: runs CMD with stdout in out.txt and stderr in err.txt, and
# checks its exit status.
run() {
  local rc=$1
  shift
  "$@" >out.txt 2>err.txt
  local got=$?
  [ "$got" = "$rc" ] || fail "'$*' exited $got, want $rc; stderr: $(cat err.txt); stdout: $(head -c 2000 out.txt)"
}

has() { grep -q -- "$2" "$1" || fail "$1 lacks '$2': $(head -c 2000 "$1")"; }
lacks() { ! grep -q -- "$2" "$1" || fail "$1 has '$2': $(head -c 2000 "$1")"; }
same() { [ "$1" = "$2" ] || fail "got '$1', want '$2'"; }

# ---- megad on a free port, two cpu slots ----
start_megad --slots 2 --node-name e2e-node

printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 40) > data.txt
tiny=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16
      --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --data-path data.txt)

# ---- nodes ----
run 0 "$megactl" nodes
has out.txt '^ID  *ADDRESS  *STATE'
has out.txt "^\*e2e-node  *127.0.0.1:$port  *alive  *cpu  *0/2"
run 0 "$megactl" nodes --json
same "$(jq -r .self_node_id out.txt)" e2e-node
same "$(jq -r '.nodes[0].state' out.txt)" NODE_STATE_ALIVE

# ---- version: megactl's and megad's builds ----
run 0 "$megactl" --version
own=$(sed 's/^megactl //' out.txt)
run 0 "$megactl" version
same "$(cat out.txt)" "megactl $own
megad   $own (node e2e-node, 127.0.0.1:$port)"
run 0 "$megactl" version --json
same "$(jq -c . out.txt)" "{\"megactl\":\"$own\",\"megad\":{\"version\":\"$own\",\"node\":\"e2e-node\",\"address\":\"127.0.0.1:$port\"},\"same_build\":true}"
# a megactl of another build (0.1.0 alone) says so; outside git every build is 0.1.0
if [ "$own" != 0.1.0 ]; then
  run 0 "$megactl_other" version
  has out.txt "^megactl 0.1.0$"
  has out.txt "^megad   $own (node e2e-node"
  has out.txt "^megactl and megad are different builds: .* use the megactl of megad's build, or upgrade megad"
  run 0 "$megactl_other" version --json
  same "$(jq -c .same_build out.txt)" false
fi

# ---- submit and watch --json to the end ----
run 0 "$megactl" submit "${tiny[@]}" --train-iters 3 --pipeline-model-parallel-size 2 \
  --name tiny --nproc-per-node 2
id=$(tail -1 out.txt)
[[ "$id" =~ ^[A-Za-z0-9._-]+$ ]] || fail "the last line of submit is not a job id: '$id'"
has out.txt "^submitted $id (tiny)"
run 0 "$megactl" watch "$id" --json
same "$(wc -l <out.txt)" 3
same "$(jq -c '[.iteration]' out.txt | tr -d '\n')" '[1][2][3]'
keys='["iteration","attempt","loss","grad_norm","lr","step_time_s","tokens_per_s","world_size","ranks"]'
rkeys='["rank","pp_rank","dp_rank","tp_rank","compute_s","tp_comm_s","bubble_s","p2p_wait_s","grad_sync_exposed_s","peak_activation_bytes","param_bytes","grad_bytes","optimizer_state_bytes","step_time_s","bubble_warmup_s","bubble_steady_s","bubble_cooldown_s","peak_inflight"]'
while read -r line; do
  same "$(jq -c keys_unsorted <<<"$line")" "$keys"
  same "$(jq -c '[.ranks[] | keys_unsorted] | unique | .[]' <<<"$line")" "$rkeys"
  same "$(jq -c '[.ranks[].pp_rank] | sort' <<<"$line")" '[0,1]'
  jq -e '.loss > 0 and .step_time_s > 0 and .tokens_per_s > 0 and .world_size == 2 and
         all(.ranks[]; .compute_s > 0 and .bubble_s >= 0)' <<<"$line" >/dev/null ||
    fail "implausible step: $line"
done <out.txt
[ -s err.txt ] && fail "watch --json wrote to stderr: $(cat err.txt)"

# plain lines (stdout is not a terminal) of the finished job: a replay
run 0 "$megactl" watch "$id"
has out.txt '^iter 1/3 loss [0-9.]* grad_norm [0-9.e+-]* lr [0-9.e+-]* step [0-9.]*s tokens/s [0-9]* bubble [0-9.]*% [0-9.]*%$'
has out.txt '^iter 3/3 '
has out.txt "^job $id succeeded at iteration 3"
has out.txt ' started '

# on a terminal (script gives it one): the block is redrawn in place
if command -v script >/dev/null; then
  TERM=xterm COLUMNS=100 script -qec "'$megactl' watch '$id'" /dev/null >tty.txt 2>&1 </dev/null
  same "$?" 0
  grep -q $'\x1b\\[[0-9]*A\x1b\\[J' tty.txt || fail "no redraw in place: $(cat -v tty.txt | head -c 2000)"
  has tty.txt 'bubble per stage'
  has tty.txt 'stage 1 \['
  has tty.txt "job $id succeeded at iteration 3"
fi

# ---- status and ls ----
run 0 "$megactl" status "$id"
has out.txt "^job  *$id$"
has out.txt '^state  *succeeded$'
has out.txt '^world  *2 = TP 1 x PP 2 x DP 1$'
has out.txt '^progress  *3/3 iterations$'
has out.txt '^events$'
has out.txt '^  [0-9:]* submitted  *submitted as tiny'
has out.txt '^  [0-9:]* succeeded  *succeeded after 3 iterations'
run 0 "$megactl" status "$id" --json
same "$(jq -r .state out.txt)" JOB_STATE_SUCCEEDED
same "$(jq -r .spec.nproc_per_node out.txt)" 2
same "$(jq -r '.events[0].kind' out.txt)" JOB_EVENT_KIND_SUBMITTED
same "$(jq -r '.events[-1].kind' out.txt)" JOB_EVENT_KIND_SUCCEEDED
jq -e '.events | all(.time_unix_ms > 0 and (.message | length) > 0)' out.txt >/dev/null ||
  fail "events without a time or a message: $(cat out.txt)"
run 0 "$megactl" ls
has out.txt '^ID  *NAME  *STATE  *WORLD  *TP/PP/DP  *ITER  *AGE$'
has out.txt "^$id  *tiny  *succeeded  *2  *1/2/1  *3/3 "
run 0 "$megactl" ls --state succeeded --json
same "$(jq -r "[.[].id] | index(\"$id\") != null" out.txt)" true
run 0 "$megactl" ls --state running,pending
lacks out.txt "^$id "

# ---- cancel ----
run 0 "$megactl" submit "${tiny[@]}" --train-iters 100000 --name long --nproc-per-node 1
long=$(tail -1 out.txt)
run 0 "$megactl" cancel "$long" --reason "e2e says stop"
has out.txt "$long"
run 1 "$megactl" watch "$long"
same "$(cat err.txt)" "megactl: job $long was cancelled: e2e says stop"
has out.txt "^job $long cancelled"
run 0 "$megactl" cancel "$id"
same "$(cat out.txt)" "$id already succeeded; nothing to cancel"
# several at once, and every pending job (these wait for a second node)
ids=()
for n in 1 2 3 4; do
  run 0 "$megactl" submit "${tiny[@]}" --train-iters 3 --nnodes 2 --nproc-per-node 1 --name "w$n"
  ids+=("$(tail -1 out.txt)")
done
run 0 "$megactl" cancel "${ids[0]}" "${ids[1]}"
has out.txt "^cancelled ${ids[0]}$"
has out.txt "^cancelled ${ids[1]}$"
run 0 "$megactl" cancel --all-pending
same "$(cat out.txt)" "$(printf 'cancelled %s\ncancelled %s' "${ids[3]}" "${ids[2]}")"
run 0 "$megactl" cancel --all-pending
same "$(cat out.txt)" "no pending jobs"
# a job cancelled before is not cancelled again
run 0 "$megactl" cancel "${ids[0]}" "$long"
same "$(cat out.txt)" "$(printf '%s already cancelled; nothing to cancel\n%s already cancelled; nothing to cancel' "${ids[0]}" "$long")"
run 2 "$megactl" cancel "${ids[0]}" --all-pending

# ---- relative paths: every flag naming a file is made absolute here ----
echo '{"a":0,"b":1,"c":2}' > vocab.json
printf '#version: 0.2\na b\n' > merges.txt
mkdir -p sub
(cd sub && run 0 "$megactl" submit "${tiny[@]/data.txt/../data.txt}" --train-iters 3 --nnodes 2 \
  --nproc-per-node 1 --name rel --tokenizer-type GPT2BPETokenizer --vocab-file ../vocab.json \
  --merge-file ./../merges.txt --save ck)
mv sub/out.txt sub/err.txt . 2>/dev/null
rel=$(tail -1 out.txt)
run 0 "$megactl" status "$rel" --json
for want in "$work/sub/../data.txt" "$work/sub/../vocab.json" "$work/sub/../merges.txt" "$work/sub/ck"; do
  jq -e --arg p "$want" '.spec.args | index($p) != null' out.txt >/dev/null ||
    fail "submit from sub/ did not send $want: $(jq -c .spec.args out.txt)"
done
run 0 "$megactl" cancel "$rel"

# ---- trace ----
run 0 "$megactl" submit "${tiny[@]}" --train-iters 2 --trace-iteration 2 --name traced \
  --nproc-per-node 2 --pipeline-model-parallel-size 2
traced=$(tail -1 out.txt)
run 0 "$megactl" watch "$traced" --json
run 0 "$megactl" trace "$traced"
has out.txt "^wrote $traced-trace.json ([0-9]* bytes)$"
jq -e '(.traceEvents // .) | map(select(.ph == "X")) | length > 0' "$traced-trace.json" >/dev/null ||
  fail "the trace has no spans"
run 0 "$megactl" trace "$traced" -o t.json
cmp -s t.json "$traced-trace.json" || fail "-o wrote another trace"

# ---- errors ----
for c in status cancel watch trace; do
  run 1 "$megactl" "$c" j-nope
  same "$(cat err.txt)" "megactl: no job 'j-nope'"
done
run 1 "$megactl" watch j-nope --json
same "$(cat err.txt)" "megactl: no job 'j-nope'"
# megactl cannot know the world without --nproc-per-node; megad refuses it, in the same words,
# said to be megad's (of the same build: nothing about builds).
run 2 "$megactl" submit "${tiny[@]}" --train-iters 3 --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 2
same "$(cat err.txt)" "megactl: megad refused the job: invalid job: world size 2 is not divisible by TP·PP = 4 (TP 2 × PP 2); use a world size that is a multiple of 4"
# The same job with the world given is refused before any call.
run 2 "$megactl" submit "${tiny[@]}" --train-iters 3 --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 2 --nproc-per-node 2
same "$(cat err.txt)" "megactl: invalid job: world size 2 is not divisible by TP·PP = 4 (TP 2 × PP 2); use a world size that is a multiple of 4"
# A job that fails on the node: watch exits 1 with the cause.
# what can be checked at submit is: a data file megad cannot see
run 2 "$megactl" submit "${tiny[@]}" --train-iters 3 --data-path /nonexistent/data.txt \
  --nproc-per-node 1 --name broken
grep -q "nonexistent/data.txt" err.txt || fail "submit of a missing data file: $(cat err.txt)"
# what only a worker finds: a checkpoint directory it cannot read
mkdir -p badckpt && echo garbage > badckpt/latest_checkpointed_iteration.txt
run 0 "$megactl" submit "${tiny[@]}" --train-iters 3 --load badckpt --nproc-per-node 1 \
  --name broken
broken=$(tail -1 out.txt)
run 1 "$megactl" watch "$broken"
[[ "$(cat err.txt)" == "megactl: job $broken failed: "*"one iteration number"* ]] ||
  fail "the failed job's cause: $(cat err.txt)"
# resume: only a failed job; it runs again (and fails the same way here)
run 0 "$megactl" resume "$broken"
has out.txt "^resumed $broken: "
run 1 "$megactl" watch "$broken"
run 0 "$megactl" status "$broken" --json
same "$(jq -r '[.events[] | select(.kind == "JOB_EVENT_KIND_RESTARTING")] | length' out.txt)" 1
run 1 "$megactl" resume "$id"
has err.txt "is succeeded; only a failed or stopped job can be resumed"
# rescale: within the job's --nnodes range only
run 1 "$megactl" rescale "$id" --nnodes 2
has err.txt "only a running job can be rescaled"
run 2 "$megactl" rescale "$id"
has err.txt "--nnodes N is required"
# the launcher's flags
run 2 "$megactl" submit "${tiny[@]}" --train-iters 3 --max-restarts many
has err.txt "--max-restarts: 'many' is not a count"
run 2 "$megactl" submit "${tiny[@]}" --train-iters 3 --step-timeout 30
has err.txt "needs a unit: write 30ms or 30s"
run 2 "$megactl" watch j-1 --reconnect-timeout 5
has err.txt "reconnect-timeout"
# megad's: a held rank lets go by itself after 2 minutes, so no longer wait is offered
run 2 "$megad" serve --listen 127.0.0.1:0 --state-dir "$work/held" --slots 1 \
  --held-state-timeout 5m
has err.txt "held-state-timeout 5m is out of range (1000 ms to 120000 ms)"

# kill -9 of megad, and megad started again on its state dir and port
kill_megad() {
  kill -KILL "$megad_pid"
  wait "$megad_pid" 2>/dev/null
}
serve_again() {
  "$megad" serve --listen "127.0.0.1:$port" --state-dir "$work/state" --slots 2 \
    --node-name e2e-node >megad.out 2>>megad.log &
  megad_pid=$!
}
restart_megad() { kill_megad; serve_again; }

# ---- watch through the coordinator's restart ----
# kill -9 megad under a running job; started again on its state dir (and
# port) it resumes the job, and the watch follows without a gap or a repeat
run 0 "$megactl" submit "${tiny[@]}" --train-iters 400 --save "$work/ck" --save-interval 20 \
  --name survivor --nproc-per-node 2
survivor=$(tail -1 out.txt)
"$megactl" watch "$survivor" --json >survivor.json 2>survivor.err &
watch_pid=$!
# a second watch that does not wait for megad to come back: exit 94, "lost"
"$megactl" watch "$survivor" --json --reconnect-timeout 0s >lost.json 2>lost.err &
lost_pid=$!
for _ in $(seq 200); do
  [ "$(wc -l <survivor.json)" -ge 60 ] && [ -s lost.json ] && break
  sleep 0.05
done
kill_megad
wait "$lost_pid"
same "$?" 94
grep -q "megactl: lost the watch of $survivor" lost.err || fail "no loss said: $(cat lost.err)"
serve_again
wait "$watch_pid"
same "$?" 0
grep -q "lost the watch of $survivor" survivor.err || fail "no reconnect said: $(cat survivor.err)"
same "$(jq -s 'map(.iteration) | last' survivor.json)" 400
# after the restart the redone iterations come again, under the new attempt
jq -e -s 'group_by(.attempt) | length == 2' survivor.json >/dev/null ||
  fail "not two attempts in the watch: $(jq -c -s 'map([.attempt, .iteration])' survivor.json | head -c 400)"
[ "$(jq -s 'map(select(.attempt == 0)) | map(.iteration) | . == (. | unique)' survivor.json)" = true ] ||
  fail "an iteration shown twice within one attempt"

# ---- two outages, each within --reconnect-timeout ----
# a watch that came back from one break takes the next as a new one: it
# once measured the second from the first break, and gave up at once
lines_past() { # N FILE: wait until FILE has more than N lines
  for _ in $(seq 200); do
    [ "$(wc -l <"$2")" -gt "$1" ] && return 0
    sleep 0.05
  done
  fail "$2 stayed at $1 lines"
}
run 0 "$megactl" submit "${tiny[@]}" --train-iters 100000 --save "$work/ck2" --save-interval 20 \
  --name twice
twice=$(tail -1 out.txt)
"$megactl" watch "$twice" --json --reconnect-timeout 3s >twice.json 2>twice.err &
twice_pid=$!
lines_past 30 twice.json
restart_megad
n=$(wc -l <twice.json)
lines_past "$n" twice.json # reconnected: the first outage is over
sleep 3.5                  # past the timeout, counted from the first break
restart_megad
n=$(wc -l <twice.json)
lines_past "$n" twice.json
kill -0 "$twice_pid" 2>/dev/null || fail "the watch gave up at the second outage: $(cat twice.err)"
run 0 "$megactl" cancel "$twice"
wait "$twice_pid"
same "$?" 1 # cancelled
same "$(grep -c "lost the watch of $twice (" twice.err)" 2

# ---- megad gone ----
kill -TERM "$megad_pid"
wait "$megad_pid"
rc=$?
megad_pid=
same "$rc" 0
run 1 "$megactl" ls
same "$(cat err.txt)" "megactl: cannot reach megad at 127.0.0.1:$port: connection refused; is megad running there? Point megactl at another with --server HOST:PORT or MEGA_SERVER=HOST:PORT, or start one: megad serve --listen 127.0.0.1:7070 --state-dir DIR --slots N"

if [ "$fails" != 0 ]; then
  echo "$fails check(s) failed; megad's log:"
  tail -50 "$work/megad.log"
  exit 1
fi
echo "test_e2e: ok"
