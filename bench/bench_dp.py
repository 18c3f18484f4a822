#!/usr/bin/python3
"""Data-parallel gradient benchmarks (seeds 002 and 003); figures, never a
pass/fail. Each section runs its configurations side by side in one go.

  overlap  DP=2 with --simulate-compute and real-sized gradients (hidden 512,
           4 layers, 12.8M parameters): exposed grad sync without and with
           --overlap-grad-reduce at a few bucket sizes, and the fraction of
           the reduction hidden behind backward, 1 - exposed(overlap) /
           exposed(no overlap)
  bubble   PP=4 x DP=2 with --simulate-compute: exposed grad sync (mean over
           ranks, and per pipeline rank) with the reduction after each
           rank's schedule against launched in the cooldown (1F1B, and
           interleaved VP=2 with and without --align-grad-reduce), beside
           core/sim's prediction (megactl plan --t-grad-sync) with the
           reduction time measured in the same run
  memory   --use-distributed-optimizer: optimizer_state_bytes per rank at
           DP=1, 2 and 4 against the unsharded figure
  compute  a real model at DP=2: tokens/s without and with overlap (and the
           distributed optimizer) on this machine

  overlap8 the same with 8 layers (twice the gradients, the same tail)

usage: bench_dp.py MEGAW MEGACTL [overlap|overlap8|bubble|memory|compute ...]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "engine"))
from pipeline_check import launch, write_data  # noqa: E402

WIDE = ["--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "64",
        "--micro-batch-size", "1", "--lr", "1e-3"]


def run(megaw, world, args, tmp):
    res = launch(megaw, world, args, tmp, timeout=900)
    for rc, _, err in res:
        if rc != 0:
            raise SystemExit("a rank failed: " + err.strip()[-400:])
    return [lines for _, lines, _ in res]


def after(ranks, key, skip):
    """Per rank, the values of key in the iterations after the first skip."""
    return [[l[key] for l in lines if l["iteration"] > skip] for lines in ranks]


def plan(megactl, args):
    out = subprocess.run([megactl, "plan", "--format", "json"] + args, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def overlap(megaw, megactl, tmp, layers=4):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    iters, skip, f, b = 12, 2, 25 * layers, 50 * layers
    args = WIDE + ["--num-layers", str(layers), "--global-batch-size", "8", "--train-iters",
                   str(iters), "--data-path", data, "--simulate-compute", "%d:%d" % (f, b)]
    print("== DP overlap: DP=2, hidden 512, %d layers, M=4, --simulate-compute %d:%d (ms per "
          "microbatch), real-sized gradient buffers, iterations %d..%d" %
          (layers, f, b, skip + 1, iters))
    print("%-34s %8s %20s %9s %9s" % ("configuration", "buckets", "exposed ms mean/med",
                                       "step ms", "hidden"))
    base = None
    # The baseline runs first and again last: the difference is this
    # machine's noise over the section.
    for name, extra, buckets in (
            ("no overlap (one bucket)", [], 1),
            ("--overlap-grad-reduce, default 40M", ["--overlap-grad-reduce"], None),
            ("--overlap-grad-reduce, 4M", ["--overlap-grad-reduce", "--bucket-size", "4000000"],
             None),
            ("--overlap-grad-reduce, 2M", ["--overlap-grad-reduce", "--bucket-size", "2000000"],
             None),
            ("--overlap-grad-reduce, 1M", ["--overlap-grad-reduce", "--bucket-size", "1000000"],
             None),
            ("no overlap, again", [], 1)):
        ranks = run(megaw, 2, args + extra, tmp)
        values = sum(after(ranks, "grad_sync_exposed_s", skip), [])
        exposed, median = statistics.mean(values), statistics.median(values)
        step = statistics.median(sum(after(ranks, "step_time_s", skip), []))
        grad = ranks[0][-1]["grad_bytes"] / 4
        if buckets is None:
            size = float(extra[-1]) if extra[-1].isdigit() else 40e6
            buckets = "~%d" % max(1, round(grad / size))
        if base is None:
            base = exposed
        print("%-34s %8s %12.1f / %5.1f %9.1f %8.1f%%" %
              (name, buckets, 1e3 * exposed, 1e3 * median, 1e3 * step,
               100 * (1 - exposed / base)))
    print("(exposed: over both ranks and the iterations; hidden: of the mean; %.1fM gradient "
          "floats per rank)" % (grad / 1e6))


def overlap8(megaw, megactl, tmp):
    overlap(megaw, megactl, tmp, layers=8)


def bubble(megaw, megactl, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    P, DP, M, iters, skip, f, b = 4, 2, 8, 10, 2, 20, 40
    bucket = 1000000
    args = WIDE + ["--num-layers", "8", "--global-batch-size", str(M * DP),
                   "--train-iters", str(iters), "--data-path", data,
                   "--pipeline-model-parallel-size", str(P), "--simulate-compute",
                   "%d:%d" % (f, b)]
    print("== bubble hiding: PP=%d x DP=%d, hidden 512, 8 layers, M=%d, --simulate-compute "
          "%d:%d, buckets of %d, iterations %d..%d" % (P, DP, M, f, b, bucket, skip + 1, iters))
    print("%-36s %9s %7s %8s  %-24s %8s" % ("configuration", "exposed", "hidden", "median",
                                             "per PP rank (ms)", "sim"))
    ov = ["--overlap-grad-reduce", "--bucket-size", str(bucket)]
    rows = (("1f1b, sync after the schedule", 1, [], []),
            ("1f1b, sync in the cooldown", 1, ov, ["--overlap-grad-reduce"]),
            ("interleaved V=2, after the schedule", 2, [], []),
            ("interleaved V=2, in the cooldown", 2, ov, ["--overlap-grad-reduce"]),
            ("interleaved V=2, cooldown + align", 2, ov + ["--align-grad-reduce"],
             ["--overlap-grad-reduce", "--align-grad-reduce"]))
    base = {}
    for name, vp, extra, plan_flags in rows:
        a = args + extra
        if vp > 1:
            a += ["--virtual-pipeline-model-parallel-size", str(vp)]
        ranks = run(megaw, P * DP, a, tmp)
        per_pp = {}
        for lines in ranks:
            for l in lines:
                if l["iteration"] > skip:
                    per_pp.setdefault(l["pp_rank"], []).append(l["grad_sync_exposed_s"])
        pp_mean = [statistics.mean(per_pp[r]) for r in range(P)]
        mean = statistics.mean(pp_mean)
        med = statistics.mean(statistics.median(per_pp[r]) for r in range(P))
        grad_floats = max(l["grad_bytes"] for lines in ranks for l in lines) / 4
        if not plan_flags:
            # Nothing hides rank 0's reduction after its schedule: its exposed
            # time is the reduction's, the simulator's T_grad_sync.
            base[vp] = (mean, pp_mean[0])
        t_gs = base[vp][1]
        nb = max(1, round(grad_floats / vp / bucket)) if plan_flags else 1
        sim = plan(megactl, ["--pipeline-model-parallel-size", str(P), "--num-microbatches",
                             str(M), "--t-forward", str(f), "--t-backward", str(b),
                             "--t-grad-sync", "%.3f" % (1e3 * t_gs), "--grad-buckets", str(nb)] +
                   (["--virtual-pipeline-model-parallel-size", str(vp)] if vp > 1 else []) +
                   plan_flags)
        print("%-36s %6.1f ms %6.1f%% %5.1f ms  %-24s %5.1f ms" %
              (name, 1e3 * mean, 100 * (1 - mean / base[vp][0]), 1e3 * med,
               " ".join("%.1f" % (1e3 * x) for x in pp_mean), sim["grad_sync_exposed"]))
    print("(exposed: mean over ranks and iterations; hidden: against the same schedule with the "
          "sync after it;\n median: the mean over ranks of each rank's median; sim: megactl "
          "plan's mean exposed grad\n sync with T_grad_sync = PP rank 0's measured reduction)")


def memory(megaw, megactl, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    args = WIDE + ["--num-layers", "4", "--global-batch-size", "8", "--train-iters", "1",
                   "--data-path", data, "--simulate-compute", "1:1"]
    print("== distributed optimizer memory: hidden 512, 4 layers, bytes per rank")
    print("%-38s %14s %14s %16s %9s" % ("configuration", "param_bytes", "grad_bytes",
                                        "optimizer_state", "of DP=1"))
    unsharded = None
    for name, world, extra in (("DP=1, unsharded", 1, []),
                               ("DP=1, --use-distributed-optimizer", 1,
                                ["--use-distributed-optimizer"]),
                               ("DP=2, --use-distributed-optimizer", 2,
                                ["--use-distributed-optimizer"]),
                               ("DP=4, --use-distributed-optimizer", 4,
                                ["--use-distributed-optimizer"]),
                               ("DP=4, + overlap, buckets of 1M", 4,
                                ["--use-distributed-optimizer", "--overlap-grad-reduce",
                                 "--bucket-size", "1000000"])):
        ranks = run(megaw, world, args + extra, tmp)
        last = [lines[-1] for lines in ranks]
        opt = max(l["optimizer_state_bytes"] for l in last)
        if unsharded is None:
            unsharded = opt
        print("%-38s %14d %14d %16d %8.3f" % (name, last[0]["param_bytes"], last[0]["grad_bytes"],
                                              opt, opt / unsharded))
    print("(optimizer state: Adam's two moments of the elements a rank owns; the model trains "
          "in fp32,\n so the parameters are the master weights and there is no second copy)")


def compute(megaw, megactl, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    model = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
             "--seq-length", "128", "--micro-batch-size", "4", "--global-batch-size", "32",
             "--lr", "1e-3", "--train-iters", "8", "--data-path", data]
    print("== real compute at DP=2, 1 BLAS thread per rank: 4 layers, d=128, seq 128, micro 4, "
          "global 32 (median of iterations 3..8)")
    for name, world, extra in (("single rank", 1, []),
                               ("DP=2, no overlap", 2, []),
                               ("DP=2, --overlap-grad-reduce", 2,
                                ["--overlap-grad-reduce", "--bucket-size", "100000"]),
                               ("DP=2, overlap + distributed optimizer", 2,
                                ["--overlap-grad-reduce", "--bucket-size", "100000",
                                 "--use-distributed-optimizer"])):
        ranks = run(megaw, world, model + extra, tmp)
        steps = sum(after(ranks, "step_time_s", 2), [])
        exposed = sum(after(ranks, "grad_sync_exposed_s", 2), [])
        step = statistics.median(steps)
        print("%-40s %8.0f tokens/s  (%.3f s per iteration, exposed grad sync %.1f ms)" %
              (name, 32 * 128 / step, step, 1e3 * statistics.mean(exposed)))


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    megaw, megactl = sys.argv[1], sys.argv[2]
    which = sys.argv[3:] or ["overlap", "bubble", "memory", "compute"]
    sections = {"overlap": overlap, "overlap8": overlap8, "bubble": bubble, "memory": memory,
                "compute": compute}
    with tempfile.TemporaryDirectory(prefix="mega-bench-dp-") as tmp:
        for w in which:
            sections[w](megaw, megactl, tmp)
            print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
