#!/usr/bin/python3
"""What a checkpoint costs a training step (figures, never a pass/fail).

A small real model (4 layers, hidden 256, about 3.2 M parameters: a
checkpoint of about 39 MB with Adam's state) trains on one rank and on two
pipeline stages, three ways side by side: without --save, saving every
SAVE_EVERY iterations synchronously, and with --async-save. For each run:

  step      median step_time_s of iterations with no save in flight
  gap       wall time between two iteration reports beyond the step itself
            (the save's blocking part lands here), median over the iterations
            after which a save ran, minus the same median without saves
  blocked   what megaw reports as the time training waited for the save
  write     the save's whole duration (copy, shards, fsync, manifest, commit)
  next      extra time of the step right after a save over the run's other
            steps (an async write competes with it for the cores)

usage: bench_ckpt.py MEGAW [ITERS]
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "engine"))
from ranks import write_data  # noqa: E402

MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
         "--seq-length", "128", "--micro-batch-size", "4", "--global-batch-size", "16",
         "--lr", "1e-3", "--lr-decay-iters", "1000"]
SAVE_EVERY = 5
REPORT = re.compile(r"saved checkpoint of iteration (\d+) in \S+ \(([\d.]+) MB, ([\d.]+) s, "
                    r"training blocked ([\d.]+) s\)")


def run(megaw, world, args, tmp):
    """Runs the ranks; returns rank 0's [(arrival time, JSON line)] and all stderr."""
    rdv = tempfile.mkdtemp(dir=tmp, prefix="rdv-")
    base = [megaw] + args + ["--json"]
    if world > 1:
        base += ["--world-size", str(world), "--rendezvous-dir", rdv,
                 "--pipeline-model-parallel-size", str(world)]
    procs = [subprocess.Popen(base + (["--rank", str(r)] if world > 1 else []),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    lines, errs = [], [""] * world

    def read_out(p, keep):
        for l in p.stdout:
            if keep and l.startswith("{"):
                lines.append((time.monotonic(), json.loads(l)))

    def read_err(i, p):
        errs[i] = p.stderr.read()

    threads = [threading.Thread(target=read_out, args=(p, i == 0)) for i, p in enumerate(procs)]
    threads += [threading.Thread(target=read_err, args=(i, p)) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, p in enumerate(procs):
        if p.wait() != 0:
            raise SystemExit("rank %d failed: %s" % (i, errs[i].strip()[-400:]))
    return lines, "".join(errs)


def figures(lines, err):
    it = {l["iteration"]: (t, l["step_time_s"]) for t, l in lines}
    last = max(it)
    # the gap after iteration k: report of k+1 arrives after k's report,
    # plus whatever blocked in between, plus k+1's own step
    gap = {k: it[k + 1][0] - it[k][0] - it[k + 1][1] for k in it if k + 1 in it and k > 1}
    saves = [k for k in gap if k % SAVE_EVERY == 0]
    quiet = [k for k in gap if k % SAVE_EVERY not in (0, 1)]
    steps = [it[k][1] for k in it if k > 2 and (k - 1) % SAVE_EVERY not in (0,)]
    reports = [tuple(float(x) for x in m.groups()) for m in REPORT.finditer(err)]
    reports = [r for r in reports if r[0] != last]  # the final save has no next step
    return {"step": statistics.median(steps),
            "gap_save": statistics.median(gap[k] for k in saves) if saves else 0.0,
            "gap_quiet": statistics.median(gap[k] for k in quiet),
            "next": [it[k + 1][1] - statistics.median(it[k + j][1] for j in
                                                      range(2, SAVE_EVERY + 1) if k + j in it)
                     for k in saves if k + 2 in it],
            "blocked": statistics.median(r[3] for r in reports) if reports else 0.0,
            "write": statistics.median(r[2] for r in reports) if reports else 0.0,
            "mb": reports[0][1] if reports else 0.0, "nsaves": len(reports)}


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    megaw = sys.argv[1]
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 31
    with tempfile.TemporaryDirectory(prefix="mega-bench-ckpt-") as tmp:
        data = os.path.join(tmp, "data.txt")
        write_data(data)
        base = MODEL + ["--train-iters", str(iters), "--data-path", data]
        print("GPT 4 layers x hidden 256, seq 128, global batch 16; %d iterations, a save "
              "every %d; median seconds" % (iters, SAVE_EVERY))
        print("%-6s %-6s %8s %9s %9s %9s %11s %8s" %
              ("ranks", "save", "step", "gap", "blocked", "write", "next", "MB"))
        for world in (1, 2):
            res = {}
            for mode in ("none", "sync", "async"):
                args = list(base)
                if mode != "none":
                    args += ["--save", os.path.join(tmp, "ckpt-%d-%s" % (world, mode)),
                             "--save-interval", str(SAVE_EVERY)]
                if mode == "async":
                    args.append("--async-save")
                res[mode] = figures(*run(megaw, world, args, tmp))
            ref = res["none"]
            # a step's worth of work that would have run anyway
            print("%-6s %-6s %8.4f %9.4f" % ("PP=%d" % world, "none", ref["step"],
                                             ref["gap_quiet"]))
            for mode in ("sync", "async"):
                f = res[mode]
                after = statistics.median(f["next"]) if f["next"] else 0.0
                print("%-6s %-6s %8.4f %9.4f %9.4f %9.4f %11.4f %8.1f" %
                      ("PP=%d" % world, mode, f["step"], f["gap_save"] - ref["gap_quiet"],
                       f["blocked"], f["write"], after, f["mb"]))
        print("gap: the step time a save costs (sync: the whole write; async: the copy to "
              "host memory); next: the async write's cost to the step it overlaps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
