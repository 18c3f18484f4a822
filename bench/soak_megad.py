#!/usr/bin/python3
"""Soak: submit/cancel cycles against one megad for a while, and whether it
leaks. Each cycle submits a tiny job that starts (one rank, a few hundred
iterations), lets it run a moment and cancels it, then submits one that
waits (it needs two nodes) and cancels that. megad keeps 50 ended jobs
(--retain-jobs), so a run of a few minutes passes retention. Every 30 s it
samples megad's resident memory, its open fds, its live child processes,
its journal's size and the files under its state dir (what a long life
leaves on disk). Figures, never a pass/fail: it prints the samples and the
first-to-last change.

usage: soak_megad.py MEGAD MEGACTL MEGAW [SECONDS]   (default 600)
"""
import os
import re
import subprocess
import sys
import tempfile
import time


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def disk(state):
    files = sum(len(fs) + len(ds) for _, ds, fs in os.walk(state))
    try:
        journal = os.path.getsize(os.path.join(state, "journal"))
    except OSError:
        journal = 0
    return journal / 1024, files


def children(pid):
    out = subprocess.run(["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True,
                         text=True).stdout
    return len(out.split())


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    megad, megactl, megaw = sys.argv[1:4]
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 600
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        data = os.path.join(tmp, "data.txt")
        with open(data, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog. " * 400)
        state = os.path.join(tmp, "state")
        d = subprocess.Popen([megad, "serve", "--listen", "127.0.0.1:0", "--state-dir", state,
                              "--slots", "1", "--worker", megaw, "--retain-jobs", "50"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        addr = None
        for line in d.stdout:
            m = re.match(r"megad: listening on (\S+)", line)
            if m:
                addr = m.group(1)
                break
        if not addr:
            print("megad did not start")
            return 1
        env = dict(os.environ, MEGA_SERVER=addr)
        job = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
               "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "1",
               "--lr", "1e-3", "--train-iters", "100000", "--data-path", data]

        def ctl(*args):
            p = subprocess.run([megactl] + list(args), capture_output=True, text=True, env=env)
            return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout else None

        samples, cycles, t0, next_sample = [], 0, time.time(), 0.0
        print("%8s %8s %10s %6s %9s %11s %6s" % ("seconds", "cycles", "rss MB", "fds", "children",
                                                "journal KB", "files"))
        def sample(now):
            time.sleep(1.0)  # let the last cancel's workers go
            s = (now, cycles, rss_kb(d.pid) / 1024, fds(d.pid), children(d.pid)) + disk(state)
            samples.append(s)
            print("%8.0f %8d %10.1f %6d %9d %11.1f %6d" % s, flush=True)

        while True:
            now = time.time() - t0
            if now >= seconds:
                sample(now)
                break
            if now >= next_sample:
                sample(now)
                next_sample += 30
            running = ctl("submit", "--nproc-per-node", "1", *job)
            waiting = ctl("submit", "--nnodes", "2", "--nproc-per-node", "1", *job)
            time.sleep(0.2)
            for j in (running, waiting):
                if j:
                    ctl("cancel", j)
            cycles += 1
        d.terminate()
        d.wait(timeout=30)
        a, b = samples[1] if len(samples) > 1 else samples[0], samples[-1]
        print("over %d cycles: rss %+.1f MB, fds %+d, children %+d, journal %+.1f KB, files %+d "
              "(from the 30 s sample to the last)"
              % (b[1], b[2] - a[2], b[3] - a[3], b[4] - a[4], b[5] - a[5], b[6] - a[6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
