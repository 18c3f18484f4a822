#!/bin/bash
# megactl's cluster commands without a daemon: help, usage errors (exit 2),
# the local job check (the same words megad uses), and the unreachable-server
# error (exit 1) wherever the address comes from.
#
# usage: test_cli.sh MEGACTL
set -u
megactl=$(readlink -f "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
unset MEGA_SERVER
fails=0

# expect RC STDERR_LINE_OR_EMPTY CMD...: runs CMD, checks the exit status and
# that stderr is exactly that one line (or empty).
expect() {
  local rc=$1 err=$2
  shift 2
  "$@" >out.txt 2>err.txt
  local got=$?
  if [ "$got" != "$rc" ]; then
    echo "FAIL: '$*' exited $got, want $rc; stderr: $(cat err.txt)"
    fails=$((fails + 1))
    return
  fi
  if [ "$(cat err.txt)" != "$err" ]; then
    echo "FAIL: '$*' stderr:"
    echo "  got:  $(cat err.txt)"
    echo "  want: $err"
    fails=$((fails + 1))
  fi
}

check() { # check DESCRIPTION COMMAND...: a shell condition
  local what=$1
  shift
  if ! "$@"; then
    echo "FAIL: $what"
    fails=$((fails + 1))
  fi
}

# A port nobody listens on: bind one, then let it go.
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dead=127.0.0.1:$port
# what to do about it follows, the same every time
hint="; is megad running there? Point megactl at another with --server HOST:PORT or MEGA_SERVER=HOST:PORT, or start one: megad serve --listen 127.0.0.1:7070 --state-dir DIR --slots N"
refused="megactl: cannot reach megad at $dead: connection refused$hint"

# ---- help ----
expect 0 "" "$megactl" --version
check "--version prints megactl's version" grep -q "^megactl [0-9]" out.txt
check "--version asks no megad" [ "$(wc -l <out.txt)" = 1 ]
own=$(cat out.txt)
# megactl version asks megad too; none answers: megactl's still, then why not, exit 1
expect 1 "megactl: megad's version is not known: cannot reach megad at $dead: connection refused$hint" \
  "$megactl" version --server "$dead"
check "version prints megactl's when megad does not answer" [ "$(cat out.txt)" = "$own" ]
expect 1 "megactl: megad's version is not known: cannot reach megad at $dead: connection refused$hint" \
  "$megactl" version --json --server "$dead"
check "version --json says megad's is not known" [ "$(jq -c . out.txt)" = "{\"megactl\":\"${own#megactl }\",\"megad\":null}" ]
expect 0 "" "$megactl" version --client --server "$dead"
check "version --client asks no megad" [ "$(cat out.txt)" = "$own" ]
expect 2 "megactl version: unknown flag '--server-only'; see 'megactl version --help'" "$megactl" version --server-only
expect 0 "" "$megactl" --help
check "top help lists the cluster commands" grep -q "^  submit " out.txt
check "top help names --server" grep -q -- "--server ADDR" out.txt
for c in submit watch status ls cancel nodes trace version; do
  expect 0 "" "$megactl" "$c" --help
  check "$c --help starts with its usage" grep -q "^usage: megactl $c" out.txt
done
expect 0 "" "$megactl" submit -h
check "submit help lists job flags from the table" grep -q -- "--pipeline-model-parallel-size N" out.txt
check "submit help lists submit flags" grep -q -- "--nproc-per-node K" out.txt
check "submit help gives --data-path's three forms" grep -q -- "--data-path FILE|PREFIX|W1 P1 W2 P2" out.txt
check "no help line names an internal symbol" sh -c '! grep -q mega_ out.txt' 

# ---- usage errors ----
"$megactl" frobnicate >/dev/null 2>err.txt
check "an unknown command exits 2" [ $? = 2 ]
check "an unknown command is named" [ "$(head -1 err.txt)" = "megactl: unknown command 'frobnicate'" ]
expect 2 "megactl: --server needs a value (host:port or unix:/path)" "$megactl" --server
expect 2 "megactl ls: unknown flag '--bogus'; see 'megactl ls --help'" "$megactl" ls --bogus
expect 2 "megactl ls: unexpected word 'extra'; see 'megactl ls --help'" "$megactl" ls extra
expect 2 "megactl ls: --state: 'done' is not a job state (pending, running, succeeded, failed, cancelled, restarting, stopped); see 'megactl ls --help'" "$megactl" ls --state running,done
# every state is a filter, stopped (--exit-signal-handler's end) too: it gets as far as the call
expect 1 "$refused" "$megactl" ls --state stopped,restarting --server "$dead"
expect 2 "megactl ls: --limit: '0' is not a positive integer; see 'megactl ls --help'" "$megactl" ls --limit 0
expect 2 "megactl status: which job? give its id, e.g. j-1; see 'megactl status --help'" "$megactl" status
expect 2 "megactl status: unexpected word 'j-2'; see 'megactl status --help'" "$megactl" status j-1 j-2
expect 2 "megactl cancel: --reason needs a value; see 'megactl cancel --help'" "$megactl" cancel j-1 --reason
expect 2 "megactl watch: --json and --plain do not go together; see 'megactl watch --help'" "$megactl" watch j-1 --json --plain
expect 2 "megactl trace: unknown flag '-x'; see 'megactl trace --help'" "$megactl" trace j-1 -x
expect 2 "megactl nodes: unknown flag '--state'; see 'megactl nodes --help'" "$megactl" nodes --state running

# ---- submit: the local checks come before any call, so a dead server does not matter ----
printf 'hello world, this is a small text file for a tiny job.\n%.0s' $(seq 20) > data.txt
job=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16
     --micro-batch-size 2 --global-batch-size 4 --train-iters 3 --lr 1e-3 --data-path data.txt)
expect 2 "megactl: invalid job: world size 6 is not divisible by TP·PP = 4 (TP 2 × PP 2); use a world size that is a multiple of 4" \
  "$megactl" submit --server "$dead" "${job[@]}" --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 2 --nnodes 1 --nproc-per-node 6
expect 2 "megactl: invalid job: --hidden-size 30 is not divisible by --num-attention-heads 4" \
  "$megactl" submit --server "$dead" "${job[@]}" --hidden-size 30 --num-attention-heads 4
expect 2 "megactl: invalid job: --global-batch-size 4 is not divisible by --micro-batch-size 2 × data-parallel size 4 = 8" \
  "$megactl" submit --server "$dead" "${job[@]}" --nnodes 2 --nproc-per-node 2
expect 2 "megactl: invalid job: --num-layers is required" "$megactl" submit --server "$dead" --hidden-size 32
# tensor parallelism: heads, the sequence under --sequence-parallel, a node's processes
expect 2 "megactl: invalid job: --num-attention-heads 2 is not divisible by --tensor-model-parallel-size 4" \
  "$megactl" submit --server "$dead" "${job[@]}" --tensor-model-parallel-size 4
expect 2 "megactl: invalid job: --sequence-parallel splits the sequence over the tensor-parallel ranks: --seq-length 15 is not divisible by --tensor-model-parallel-size 2" \
  "$megactl" submit --server "$dead" "${job[@]}" --tensor-model-parallel-size 2 --sequence-parallel --seq-length 15
expect 2 "megactl: invalid job: --tensor-model-parallel-size 2 is larger than the 1 process a node runs (--nproc-per-node, or the node's slots); a TP group stays inside one node" \
  "$megactl" submit --server "$dead" "${job[@]}" --tensor-model-parallel-size 2 --nnodes 2 --nproc-per-node 1
# Llama's sizes, in the words megad uses too (tests/daemon/test_megad.c, test_bad_input)
llama=(--position-embedding-type rope --normalization RMSNorm --swiglu)
expect 2 "megactl: invalid job: --num-attention-heads 2 is not divisible by --num-query-groups 3: each query group shares its key and value heads with the same number of query heads" \
  "$megactl" submit --server "$dead" "${job[@]}" "${llama[@]}" --group-query-attention --num-query-groups 3
expect 2 "megactl: invalid job: --group-query-attention without --num-query-groups is one key/value head for all query heads (Megatron's default --num-query-groups 1), which --tensor-model-parallel-size 2 cannot split: each tensor-parallel rank holds whole query groups; give --num-query-groups G, a multiple of 2" \
  "$megactl" submit --server "$dead" "${job[@]}" "${llama[@]}" --group-query-attention --tensor-model-parallel-size 2
expect 2 "megactl: invalid job: --swiglu without --ffn-hidden-size takes Megatron's default int(4 x 16 x 2/3 / 64) x 64 = 0 for --hidden-size 16; give --ffn-hidden-size N" \
  "$megactl" submit --server "$dead" "${job[@]}" "${llama[@]}" --hidden-size 16
expect 2 "megactl submit: --rotary-percent must be at most 1 (got 1.5); see 'megactl submit --help'" \
  "$megactl" submit --server "$dead" "${job[@]}" "${llama[@]}" --rotary-percent 1.5
expect 2 "megactl submit: --hidden-size: 'abc' is not a whole number; see 'megactl submit --help'" \
  "$megactl" submit --hidden-size abc
expect 2 "megactl submit: unknown flag '--bogus'; see 'megactl submit --help'" "$megactl" submit "${job[@]}" --bogus
expect 2 "megactl submit: unexpected word 'now'; see 'megactl submit --help'" "$megactl" submit now "${job[@]}"
# --data-path takes every word up to the next flag: a stray one reads as a blend
expect 2 "megactl: invalid job: --data-path: 'data.txt' is not a weight; a blend is weighted pairs W1 P1 W2 P2 ..., e.g. --data-path 0.3 web 0.7 books" "$megactl" submit "${job[@]}" now
expect 2 "megactl submit: --nnodes: '3:2' is not MIN or MIN:MAX with 1 <= MIN <= MAX; see 'megactl submit --help'" \
  "$megactl" submit "${job[@]}" --nnodes 3:2
expect 2 "megactl submit: --nproc-per-node: 'x' is not a positive integer; see 'megactl submit --help'" \
  "$megactl" submit "${job[@]}" --nproc-per-node x
# A data file shorter than one window is refused when megactl can see it.
printf 'short' > short.txt
expect 2 "megactl: invalid job: the data file $work/short.txt has 5 bytes, fewer than one window of --seq-length + 1 = 17 bytes" \
  "$megactl" submit --server "$dead" "${job[@]}" --data-path short.txt
# A valid job gets as far as the call.
expect 1 "$refused" "$megactl" submit --server "$dead" "${job[@]}" --nproc-per-node 2

# ---- an unreachable server, wherever its address comes from ----
for c in "ls" "nodes" "status j-1" "cancel j-1" "watch j-1" "watch j-1 --json" "trace j-1"; do
  # shellcheck disable=SC2086
  expect 1 "$refused" "$megactl" --server "$dead" $c
  # shellcheck disable=SC2086
  expect 1 "$refused" "$megactl" $c --server "$dead"
  # shellcheck disable=SC2086
  expect 1 "$refused" "$megactl" --server="$dead" $c
  # shellcheck disable=SC2086
  expect 1 "$refused" env MEGA_SERVER="$dead" "$megactl" $c
done
# The flag after the command wins over the one before, which wins over $MEGA_SERVER.
expect 1 "$refused" env MEGA_SERVER=127.0.0.1:1 "$megactl" --server 127.0.0.1:2 ls --server "$dead"
expect 1 "$refused" env MEGA_SERVER=127.0.0.1:1 "$megactl" --server "$dead" ls
expect 1 "megactl: cannot reach megad at unix:$work/nope.sock: no such socket$hint" \
  "$megactl" ls --server "unix:$work/nope.sock"
# Several servers (as etcdctl's endpoints): each is tried; none answering names each.
both="megactl: no megad answered: cannot reach megad at $dead: connection refused; cannot reach megad at unix:$work/nope.sock: no such socket$hint"
expect 1 "$both" "$megactl" ls --server "$dead,unix:$work/nope.sock"
expect 1 "$both" env MEGA_SERVER="$dead,unix:$work/nope.sock" "$megactl" status j-1
expect 1 "megactl: an empty megad address in --server or \$MEGA_SERVER" "$megactl" ls --server "$dead,"
# A port megad cannot have is refused before any call, wherever it comes from
# (gRPC once wrapped 99999 round to 34463 and took 'abc' for a name)
for bad in 99999 abc 0 -1 "" 7070x; do
  expect 2 "megactl: --server 127.0.0.1:$bad: '$bad' is not a port (a number from 1 to 65535)" \
    "$megactl" ls --server "127.0.0.1:$bad"
done
expect 2 "megactl: --server 127.0.0.1:99999: '99999' is not a port (a number from 1 to 65535)" \
  "$megactl" --server 127.0.0.1:99999 status j-1
expect 2 "megactl: \$MEGA_SERVER [::1]:65536: '65536' is not a port (a number from 1 to 65535)" \
  env MEGA_SERVER="$dead,[::1]:65536" "$megactl" cancel j-1
expect 2 "megactl: --server localhost: no port: give HOST:PORT or unix:/path" \
  "$megactl" submit "${job[@]}" --server localhost
expect 2 "megactl: --server [::1]: no port: give HOST:PORT or unix:/path" "$megactl" watch j-1 --server "[::1]"
check "a failed trace leaves no file" [ ! -e j-1-trace.json ]
check "a failed trace leaves no part file" [ ! -e j-1-trace.json.part ]

# An interrupted trace (Ctrl-C) leaves no FILE.part either. A server that takes
# the connection and never answers holds the download; megactl creates the
# .part before it connects, so once the connection is taken the file is there.
mkfifo srv.out
python3 -c 'import signal, socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); print("taken", flush=True); signal.pause()' >srv.out &
srv=$!
exec 3<srv.out
read -r port <&3
env --default-signal=INT "$megactl" trace j-1 --server "127.0.0.1:$port" >/dev/null 2>&1 &
mc=$!
read -r -t 60 _ <&3 # bounded: a megactl that never connects fails below, not hangs
check "a trace being downloaded is in its .part" [ -e j-1-trace.json.part ]
kill -INT "$mc"
wait "$mc"
rc=$?
kill "$srv"
wait "$srv" 2>/dev/null
exec 3<&-
check "an interrupted trace dies of SIGINT (exit 130)" [ "$rc" = 130 ]
check "an interrupted trace leaves no file" [ ! -e j-1-trace.json.part ]

if [ "$fails" != 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "test_cli: ok"
