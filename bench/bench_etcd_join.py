#!/usr/bin/python3
"""Membership in etcd: figures (printed, never a pass/fail).

  join   N megad (2 slots each, loopback, --etcd-endpoints on one etcd
         member, no --peers) started at once: the time from the first spawn
         until every megad lists all N ALIVE (`megactl nodes --json` on each,
         polled; the poll adds up to one round of N megactl runs), for each N
  idle   with the largest N up: each megad's and etcd's resident memory and
         CPU use over IDLE_S seconds of doing nothing

usage: bench_etcd_join.py MEGAD MEGACTL [N ...]   (default: 4 8 16 32)
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_web import free_port  # noqa: E402

IDLE_S = 10
TICK = os.sysconf("SC_CLK_TCK")


def start_etcd(work):
    cport, pport = free_port(), free_port()
    curl, purl = "http://127.0.0.1:%d" % cport, "http://127.0.0.1:%d" % pport
    log = open(os.path.join(work, "etcd.log"), "w")
    proc = subprocess.Popen(
        ["etcd", "--name", "e1", "--data-dir", os.path.join(work, "etcd"),
         "--listen-client-urls", curl, "--advertise-client-urls", curl,
         "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
         "--initial-cluster", "e1=" + purl, "--log-level", "warn"],
        stdout=log, stderr=log)
    for _ in range(100):
        if subprocess.run(["etcdctl", "--endpoints", curl, "endpoint", "health"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return proc, curl
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("etcd did not become healthy (see %s/etcd.log)" % work)


def start_megad(megad, work, name, endpoints):
    state = os.path.join(work, name)
    log = open(state + ".log", "w")
    proc = subprocess.Popen([megad, "serve", "--listen", "127.0.0.1:0", "--state-dir", state,
                             "--slots", "2", "--node-name", name,
                             "--etcd-endpoints", endpoints],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    return proc


def address_of(proc):
    m = re.match(r"megad: listening on (\S+)", proc.stdout.readline())
    if not m:
        raise SystemExit("a megad did not start")
    return m.group(1)


def alive_seen(megactl, addr):
    r = subprocess.run([megactl, "nodes", "--json", "--server", addr], capture_output=True,
                       text=True)
    if r.returncode != 0:
        return 0
    nodes = json.loads(r.stdout).get("nodes", [])
    return sum(1 for n in nodes if n.get("state") in ("NODE_STATE_ALIVE", 1))


def join(megad, megactl, work, endpoints, n, round_no):
    t0 = time.monotonic()
    procs = [start_megad(megad, work, "r%d-n%02d" % (round_no, i), endpoints) for i in range(n)]
    addrs = [address_of(p) for p in procs]
    waiting = set(addrs)
    while waiting and time.monotonic() - t0 < 120:
        waiting = {a for a in waiting if alive_seen(megactl, a) < n}
    took = time.monotonic() - t0
    return procs, took if not waiting else None


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def idle(megads, etcd):
    pids = [p.pid for p in megads]
    time.sleep(2)
    before = {pid: cpu_ticks(pid) for pid in pids + [etcd.pid]}
    time.sleep(IDLE_S)
    cpu = {pid: (cpu_ticks(pid) - before[pid]) / TICK / IDLE_S * 100 for pid in before}
    m_cpu = [cpu[p] for p in pids]
    m_rss = [rss_mb(p) for p in pids]
    print("idle  %d megad over %d s: RSS %.1f MB each (max %.1f), CPU %.2f%% each (max %.2f%%, "
          "all %.1f%% of one core)" % (len(pids), IDLE_S, sum(m_rss) / len(m_rss), max(m_rss),
                                       sum(m_cpu) / len(m_cpu), max(m_cpu), sum(m_cpu)))
    print("idle  etcd (1 member): RSS %.1f MB, CPU %.2f%% of one core" %
          (rss_mb(etcd.pid), cpu[etcd.pid]))


def stop(procs):
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    megad, megactl = sys.argv[1], sys.argv[2]
    counts = [int(x) for x in sys.argv[3:]] or [4, 8, 16, 32]
    if not shutil.which("etcd") or not shutil.which("etcdctl"):
        raise SystemExit("etcd and etcdctl are needed (Debian: etcd-server etcd-client)")
    work = tempfile.mkdtemp(prefix="bench-etcd-")
    etcd, endpoints = start_etcd(work)
    try:
        for i, n in enumerate(counts):
            procs, took = join(megad, megactl, work, endpoints, n, i)
            print("join  %2d megad: all see all %d ALIVE after %s" %
                  (n, n, "%.2f s" % took if took is not None else "(not within 120 s)"))
            if i == len(counts) - 1:
                idle(procs, etcd)
            stop(procs)
    finally:
        etcd.kill()
        etcd.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
