#!/usr/bin/python3
"""Activation recomputation: peak activation bytes per rank and step time
for none / full uniform / full block / selective; figures, never a
pass/fail.

A small GPT (8 layers, hidden 128, 4 heads, sequences of 256, microbatches
of 2, 8 microbatches per iteration) at PP=2 with 1F1B, so rank 0 holds two
microbatches in flight. Each mode runs ITERS iterations; the step time is
the median over the iterations after the first (which allocates), and so
is the compute time (the busiest rank's). Where other work shares the
cores both are noisy; the CPU seconds per iteration (every rank's user and
system time, start-up included, over the iterations) are not, so compare
those there. The
losses of every mode are checked equal to the run without recomputation.
The modes run round-robin ROUNDS times and each figure is the median over
the rounds, so load from other work on the machine falls on all of them.

usage: bench_recompute.py MEGAW [--pp N] [--schedule S] [--iters N] [--rounds N]
"""
import argparse
import os
import resource
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "engine"))
from ranks import launch, write_data  # noqa: E402

MODEL = ["--num-layers", "8", "--hidden-size", "128", "--num-attention-heads", "4",
         "--seq-length", "256", "--micro-batch-size", "2", "--global-batch-size", "16",
         "--lr", "1e-3", "--seed", "3"]


def modes(per_stage):
    return [("none", []),
            ("full uniform 1", ["--recompute-granularity", "full", "--recompute-method",
                                "uniform", "--recompute-num-layers", "1"]),
            ("full uniform %d" % per_stage,
             ["--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", str(per_stage)]),
            ("full block 2", ["--recompute-granularity", "full", "--recompute-method", "block",
                              "--recompute-num-layers", "2"]),
            ("selective", ["--recompute-granularity", "selective"])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("megaw")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mega-bench-recompute-") as tmp:
        data = os.path.join(tmp, "data.txt")
        write_data(data)
        base = MODEL + ["--train-iters", str(a.iters), "--data-path", data,
                        "--pipeline-model-parallel-size", str(a.pp), "--schedule", a.schedule]
        print("GPT 8 layers, hidden 128, 4 heads, T=256, B=2, 8 microbatches; PP=%d %s; "
              "%d iterations, step time = median after the first" % (a.pp, a.schedule, a.iters))
        print("%-16s %-24s %9s %8s %11s %8s %9s %8s %s" % (
            "mode", "peak act. bytes per rank", "step (s)", "vs none", "compute (s)", "vs none",
            "CPU s/it", "vs none", "rank 0 bytes vs none"))
        figs = {}  # name -> [(peaks, step, comp, losses)] per round
        for _ in range(a.rounds):
            for name, flags in modes(8 // a.pp):
                ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                res = launch(a.megaw, a.pp, base + flags, tmp, timeout=900)
                ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / a.iters
                for rc, _, err in res:
                    if rc != 0:
                        raise SystemExit("%s: a rank failed: %s" % (name, err.strip()[-400:]))
                peaks = [max(l["peak_activation_bytes"] for l in lines) for _, lines, _ in res]
                step = statistics.median(l["step_time_s"] for l in res[-1][1]
                                         if l["iteration"] > 1)
                # compute: the busiest rank's median compute time per iteration
                comp = max(statistics.median(l["compute_s"] for l in lines if l["iteration"] > 1)
                           for _, lines, _ in res)
                losses = [l["loss"] for l in res[-1][1] if "loss" in l]
                figs.setdefault(name, []).append((peaks, step, comp, losses, cpu))
        ref = None
        for name, runs in figs.items():
            peaks = runs[0][0]
            step = statistics.median(r[1] for r in runs)
            comp = statistics.median(r[2] for r in runs)
            cpu = statistics.median(r[4] for r in runs)
            if ref is None:
                ref = (peaks, step, comp, runs[0][3], cpu)
            if any(r[3] != ref[3] for r in runs):
                raise SystemExit("%s: losses differ from none's %s" % (name, ref[3]))
            print("%-16s %-24s %9.3f %7.2fx %11.3f %7.2fx %9.3f %7.2fx %6.1f%%" % (
                name, " ".join("%.1f MiB" % (p / 2**20) for p in peaks), step, step / ref[1],
                comp, comp / ref[2], cpu, cpu / ref[4], 100.0 * peaks[0] / ref[0][0]),
                flush=True)
        print("losses of every mode equal none's, bit for bit")


if __name__ == "__main__":
    main()
