#!/bin/bash
# deploy/slurm/mega.sbatch, unchanged, on a real Slurm (slurm_fixture.sh: two
# slurmd nodes on this machine): one sbatch of a two-node job with
# --exit-signal-handler; Slurm's warning signal to the batch shell
# (scancel --batch --signal TERM, what --signal=B:TERM@120 sends) makes the
# job save and stop, the script exits 92 and requeues itself (MEGA_REQUEUE=1),
# the second run goes on from the checkpoint and finishes; every iteration's
# loss is `megad run`'s for the same job. Prints two figures: sbatch to the
# workers' start (the first iteration, with lost), and SIGTERM to the
# committed checkpoint.
#
# The tiny job trains 300 iterations in well under a second, less than the
# warning's way through slurmctld, the batch shell and srun to each megad:
# a warning sent after a few iterations could land after the last one,
# which ends the job without a requeue. So the first run's first worker
# waits at its start (a wrapper of megaw, then exec) until the warning
# reached both megads; their Stop frames are then in the workers' pipes,
# and the job stops after its first iteration, with all the others to go.
#
# With a fifth argument, etcd, the same with the script's etcd branch: an
# etcd started here, the allocation's keys under mega/slurm-JOBID/. With
# lost, the head node's megad is killed (SIGKILL) after the job's first
# checkpoint instead: the script's watch is lost, it exits 94 and requeues
# itself once (MEGA_LOST_REQUEUES=1), and the second run goes on from that
# checkpoint (the iterations after it are trained again, with equal losses).
#
# usage: test_slurm.sh SOURCE_ROOT MEGAD MEGACTL MEGAW [etcd|lost]   (exit 77: skipped)
set -u
src=$1 megad=$2 megactl=$3 megaw=$4 mode=${5:-peers}
. "$src/tests/deploy/slurm_fixture.sh"
if why=$(slurm_fixture_missing); then echo "$why"; exit 77; fi
if [ "$mode" = etcd ] && ! command -v etcd >/dev/null; then
  echo "skipped: etcd is not installed"; exit 77
fi
slurm_fixture_reexec "$0" "$@"

fail() { echo "FAIL: $*"; for f in "$T"/job.out "$T"/run/megad-*.log; do
         [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
now() { date +%s.%N; }

T=$(mktemp -d /tmp/mega-slurm-test.XXXXXX)
held=  # a worker waits at its start until the test lets it go, even when it fails
trap '[ -n "$held" ] && timeout 5 bash -c "echo >\"\$1\"" _ "$T/release"
      slurm_fixture_stop; [ -n "${KEEP:-}" ] || rm -rf "$T"' EXIT
slurm_fixture_start "$T/slurm" || fail "no Slurm"
etcd_env=()
if [ "$mode" = etcd ]; then
  cport=$(slurm_fixture_port) pport=$(slurm_fixture_port)
  etcd --name e1 --data-dir "$T/etcd" --listen-client-urls "http://127.0.0.1:$cport" \
    --advertise-client-urls "http://127.0.0.1:$cport" --listen-peer-urls "http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "e1=http://127.0.0.1:$pport" --log-level warn >"$T/etcd.log" 2>&1 &
  SLURM_FIXTURE_PIDS+=($!)
  for _ in $(seq 100); do
    ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$cport" endpoint health >/dev/null 2>&1 && break
    sleep 0.1
  done
  etcd_env=(MEGA_ETCD_ENDPOINTS="http://127.0.0.1:$cport")
fi

for i in $(seq 200); do
  echo "The quick brown fox jumps over the lazy dog, line $i of a tiny corpus."
done >"$T/tiny.txt"
iters=300
job=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16
     --micro-batch-size 2 --global-batch-size 4 --lr 0.001 --train-iters $iters
     --data-path "$T/tiny.txt" --pipeline-model-parallel-size 2)

# the reference: the same job in one process tree
"$megad" run --slots 2 --json --worker "$megaw" "${job[@]}" >"$T/ref.jsonl" 2>"$T/ref.err" ||
  fail "megad run: $(cat "$T/ref.err")"

cd "$T" || exit 1
mkdir "$T/ck"
port=$(slurm_fixture_port)
# The batch shell's megactl watch runs (its trap is set): a command line that
# starts with it. A grep for the text would find its own command line.
watching() { ps -eo args= | awk -v p="$megactl watch " 'index($0, p) == 1 { f = 1 }
                                                       END { exit !f }'; }
watching && fail "a megactl watch of $megactl runs before the job is submitted"
t_sbatch=$(now)
lost_env=()
[ "$mode" = lost ] && lost_env=(MEGA_WATCH_RECONNECT=1s MEGA_LOST_REQUEUES=1) &&
  job+=(--save-interval 100)
# megaw as megad starts it, but the first run's first worker waits at its
# start for the test (the FIFO release); Slurm's TERM to the whole megad
# step is ignored there, megad's Stop frame tells megaw
worker=$megaw
if [ "$mode" != lost ]; then
  worker=$T/megaw-held
  mkfifo "$T/release" || fail "mkfifo"
  cat >"$worker" <<EOF
#!/bin/bash
echo \$\$ >>"$T/workers"
if [ -n "\${MEGA_WORKER_FD:-}" ] && mkdir "$T/held" 2>/dev/null; then
  trap '' TERM
  read -r _ <"$T/release"
fi
exec "$megaw" "\$@"
EOF
  chmod +x "$worker"
  held=1
fi
jid=$(env "${etcd_env[@]}" "${lost_env[@]}" \
      MEGAD="$megad" MEGACTL="$megactl" MEGAW="$worker" MEGA_PORT=$port MEGA_WATCH=--json \
      MEGA_RUN_DIR="$T/run" MEGA_STATE_ROOT="$T" MEGA_REQUEUE=1 \
      sbatch --parsable --nodes=2 --requeue --output="$T/job.out" \
      "$src/deploy/slurm/mega.sbatch" "${job[@]}" --save "$T/ck" --load "$T/ck" \
      --exit-signal-handler) || fail "sbatch refused the script"

running() { [ -n "$(squeue -h -j "$jid" -o %T 2>/dev/null)" ]; }
if [ "$mode" = lost ]; then
  # a few iterations, then the first checkpoint, then the head's megad killed
  lines() { grep -c '^{"iteration"' "$T/job.out" 2>/dev/null; }
  t_first=
  for _ in $(seq 600); do
    n=$(lines)
    [ -z "$t_first" ] && [ "${n:-0}" -ge 1 ] && t_first=$(now)
    [ "${n:-0}" -ge 5 ] && break
    running || fail "the job ended early"
    sleep 0.05
  done
  [ "${n:-0}" -ge 5 ] || fail "no iterations from the job"
  for _ in $(seq 1200); do
    [ -s "$T/ck/latest_checkpointed_iteration.txt" ] && break
    sleep 0.025
  done
  [ -s "$T/ck/latest_checkpointed_iteration.txt" ] || fail "no checkpoint from the job"
  bhost=$(scontrol show job "$jid" | grep -o 'BatchHost=[^ ]*' | cut -d= -f2)
  pid=$(pgrep -f -- "--state-dir $T/mega-$jid.0-$bhost( |\$)" | head -1)
  [ -n "$pid" ] || fail "no megad on the head node $bhost"
  t_term=$(now)
  kill -KILL "$pid"
  t_commit=$t_term
else
  # Slurm's warning once both workers started, one held, and the batch shell
  # has its trap (it starts megactl watch right after setting it)
  t_first=
  for _ in $(seq 600); do
    [ "$(grep -c . "$T/workers" 2>/dev/null)" -ge 2 ] && [ -d "$T/held" ] && watching &&
      { t_first=$(now); break; }
    running || fail "the job ended early"
    sleep 0.05
  done
  [ -n "$t_first" ] || fail "the job's workers did not start, or megactl watch did not"
  t_term=$(now)
  scancel --batch --signal=TERM "$jid" || fail "scancel --batch --signal TERM"
  stopping() { grep -l "save a checkpoint and stop first" "$T"/run/megad-*.log 2>/dev/null |
               grep -c .; }
  for _ in $(seq 1200); do
    [ "$(stopping)" -ge 2 ] && break
    sleep 0.025
  done
  [ "$(stopping)" -ge 2 ] || fail "the warning did not reach both megads"
  timeout 60 bash -c 'echo go >"$1"' _ "$T/release" || fail "the held worker is gone"
  held=
  t_commit=
  for _ in $(seq 1200); do
    [ -s "$T/ck/latest_checkpointed_iteration.txt" ] && { t_commit=$(now); break; }
    sleep 0.025
  done
  [ -n "$t_commit" ] || fail "no checkpoint after the warning"
fi

# the script exits 92 and requeues the job, whose second run finishes
for _ in $(seq 900); do
  state=$(squeue -h -j "$jid" -o %T 2>/dev/null)
  [ -z "$state" ] && grep -q "job .* succeeded" "$T/job.out" && break
  sleep 0.1
done
info=$(scontrol show job "$jid")
echo "$info" | grep -q "JobState=COMPLETED" || fail "job $jid: $(echo "$info" | grep -o 'JobState=[A-Z]*')"
echo "$info" | grep -q "Restarts=1" || fail "job $jid was not requeued once"
echo "$info" | grep -q "ExitCode=0:0" || fail "the second run did not exit 0"
if [ "$mode" = lost ]; then
  grep -q "lost job .*: no megad answered its watch" "$T/job.out" ||
    fail "the first run did not say it lost the job"
  grep -q "requeueing (1 of at most 1 for a lost job)" "$T/job.out" ||
    fail "the first run did not say it requeues"
else
  grep -q "stopped after its checkpoint; running this again goes on from it" "$T/job.out" ||
    fail "the first run did not say it stopped"
  grep -q "got SIGTERM (Slurm job $jid: its time limit is near" "$T/job.out" ||
    fail "the job record does not say it stopped for the time limit"
  grep -q "the checkpoint of iteration [0-9]* is committed" "$T/job.out" ||
    fail "the job record does not say where it goes on from"
fi

# every iteration once, each loss the reference's
python3 - "$T/ref.jsonl" "$T/job.out" $iters "$mode" <<'EOF' || fail "losses differ from megad run's"
import json, sys
ref = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    ref[j["iteration"]] = j["loss"]
got = {}
for line in open(sys.argv[2]):
    if line.startswith('{"iteration"'):
        j = json.loads(line)
        i = j["iteration"]
        if i in got and (sys.argv[4] != "lost" or got[i] != j["loss"]):
            sys.exit("iteration %d trained twice (losses %r, %r)" % (i, got[i], j["loss"]))
        got[i] = j["loss"]
iters = int(sys.argv[3])
if sorted(got) != list(range(1, iters + 1)):
    sys.exit("iterations %s, not 1..%d" % (sorted(got), iters))
bad = [i for i in got if got[i] != ref[i]]
if bad:
    sys.exit("iteration %d: loss %r, megad run's %r" % (bad[0], got[bad[0]], ref[bad[0]]))
print("all %d losses equal megad run's" % iters)
EOF
stopped=$(cat "$T/ck/latest_checkpointed_iteration.txt")
# the megads call each other with a token of their own, which megactl lacks
[ "$(stat -c %a "$T/run/peer-token")" = 600 ] || fail "no private peer-token in the run dir"
cmp -s "$T/run/token" "$T/run/peer-token" && fail "the peer token is the client token"
grep -l "serves clients and nodes alike" "$T"/run/megad-*.log &&
  fail "a megad runs without --peer-token-file"
if [ "$mode" = etcd ]; then
  n=$(ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$cport" get --prefix "mega/slurm-$jid/j/" \
      --keys-only | grep -c .)
  [ "$n" -gt 0 ] || fail "no job under mega/slurm-$jid/ in etcd"
  echo "etcd holds $n keys of the allocation's jobs under mega/slurm-$jid/"
fi
python3 -c "import sys; a = [float(x) for x in sys.argv[1:5]]
print('figure: sbatch to the %s: %.2f s' % (sys.argv[5], a[1] - a[0]))
if a[3] > a[2]: print('figure: SIGTERM to the committed checkpoint: %.2f s' % (a[3] - a[2]))" \
  "$t_sbatch" "$t_first" "$t_term" "$t_commit" \
  "$([ "$mode" = lost ] && echo "first iteration" || echo "workers' start")"
[ "$mode" = lost ] ||
  echo "stopped at iteration $(grep -o 'stopped after iteration [0-9]*' "$T/job.out" | head -1 |
    grep -o '[0-9]*$'), finished at $stopped after the requeue"
echo "PASS"
