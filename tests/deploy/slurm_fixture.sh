# A real Slurm on this machine, for tests and benchmarks (sourced by bash):
# Debian's munged, slurmctld and two slurmds, nodes n1 and n2 on 127.0.0.11
# and 127.0.0.12, each slurmd on a port of its own (Debian's slurmd takes -N
# NODE), started from a generated slurm.conf in a directory of the caller's,
# inside a private mount namespace whose /etc/hosts names the two nodes (so
# the machine's own /etc/hosts is never touched, and everything started
# here dies with the namespace's processes). What was checked to work on
# this machine, and why each setting: /work/shared/notes/slurm.md.
#
#   . tests/deploy/slurm_fixture.sh
#   slurm_fixture_missing && exit 77     # prints why it cannot run
#   slurm_fixture_reexec "$0" "$@"       # once: the rest runs under unshare -m
#   slurm_fixture_start "$dir"           # SLURM_CONF set; both nodes idle
#   ... sbatch ...
#   slurm_fixture_stop                   # also on EXIT

SLURM_FIXTURE_PIDS=()

# Why this machine cannot run the fixture (on stdout), or false.
slurm_fixture_missing() {
  local p
  for p in munged slurmctld slurmd sbatch scontrol squeue scancel unshare mount; do
    if ! command -v "$p" >/dev/null; then
      echo "skipped: $p is not installed (scripts/install-deps installs slurm-wlm and munge)"
      return 0
    fi
  done
  if [ "$(id -u)" != 0 ]; then
    echo "skipped: slurmd must run as root to start job steps"
    return 0
  fi
  if [ -z "${SLURM_FIXTURE_NS:-}" ] && ! unshare -m true 2>/dev/null; then
    echo "skipped: no private mount namespace (unshare -m) for the nodes' /etc/hosts"
    return 0
  fi
  return 1
}

# Runs "$@" again in a private mount namespace, once, and exits with it.
slurm_fixture_reexec() {
  [ -n "${SLURM_FIXTURE_NS:-}" ] && return 0
  SLURM_FIXTURE_NS=1 exec unshare -m --propagation private bash "$@"
}

# A free TCP port on 127.0.0.1 (the kernel's choice).
slurm_fixture_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

slurm_fixture_stop() {
  local i
  for ((i = ${#SLURM_FIXTURE_PIDS[@]} - 1; i >= 0; i--)); do
    kill "${SLURM_FIXTURE_PIDS[i]}" 2>/dev/null
  done
  for i in "${SLURM_FIXTURE_PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$i" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$i" 2>/dev/null
  done
  SLURM_FIXTURE_PIDS=()
}

# Starts the cluster with its files in dir (which must exist, and be
# reachable by root: the slurmds run as root). 0 once n1 and n2 are idle.
slurm_fixture_start() {
  local d=$1
  trap slurm_fixture_stop EXIT
  mkdir -p "$d/munge" "$d/ctld" "$d/spool/n1" "$d/spool/n2" "$d/log"
  chmod 700 "$d/munge"
  # the nodes' names, for this namespace only
  { cat /etc/hosts; echo "127.0.0.11 n1"; echo "127.0.0.12 n2"; } >"$d/hosts"
  mount --bind "$d/hosts" /etc/hosts || return 1
  head -c 128 /dev/urandom >"$d/munge/key" && chmod 400 "$d/munge/key"
  munged -F --force --socket="$d/munge/sock" --key-file="$d/munge/key" \
    --log-file="$d/munge/log" --pid-file="$d/munge/pid" --seed-file="$d/munge/seed" \
    >"$d/log/munged.out" 2>&1 &
  SLURM_FIXTURE_PIDS+=($!)
  local ctld_port n1_port n2_port
  ctld_port=$(slurm_fixture_port) n1_port=$(slurm_fixture_port) n2_port=$(slurm_fixture_port)
  cat >"$d/slurm.conf" <<EOF
ClusterName=megatest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/sock,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/ctld
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/ctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# a requeued job waits for the main scheduler's periodic pass: every second, not 60
SchedulerParameters=sched_interval=1
ReturnToService=2
MinJobAge=600
NodeName=n1 NodeHostname=$(hostname) NodeAddr=127.0.0.11 Port=$n1_port CPUs=1 RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeHostname=$(hostname) NodeAddr=127.0.0.12 Port=$n2_port CPUs=1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$d/slurm.conf"
  for _ in $(seq 50); do [ -S "$d/munge/sock" ] && break; sleep 0.1; done
  slurmctld -D -i -f "$SLURM_CONF" >"$d/log/slurmctld.out" 2>&1 &
  SLURM_FIXTURE_PIDS+=($!)
  slurmd -D -f "$SLURM_CONF" -N n1 >"$d/log/slurmd-n1.out" 2>&1 &
  SLURM_FIXTURE_PIDS+=($!)
  slurmd -D -f "$SLURM_CONF" -N n2 >"$d/log/slurmd-n2.out" 2>&1 &
  SLURM_FIXTURE_PIDS+=($!)
  local idle
  for _ in $(seq 300); do
    idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
    [ "$idle" -ge 2 ] && return 0
    sleep 0.1
  done
  echo "slurm_fixture: the nodes did not come up; logs in $d/log" >&2
  tail -5 "$d"/log/*.out >&2
  return 1
}
