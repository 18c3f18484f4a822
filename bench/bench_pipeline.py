#!/usr/bin/python3
"""Pipeline engine benchmarks (figures, never a pass/fail):

  overhead   --simulate-compute 20:40 at PP=4, M=16, for 1F1B and interleaved
             V=2: the measured iteration time over core/sim's predicted
             makespan (megactl plan) with the P2P latency measured in the run
  bubble     measured bubble fraction next to the closed forms: 1F1B
             (P-1)/(M+P-1), interleaved (P-1)/(V*M+P-1), and ZB-H1 against
             1F1B at T_f = T_b = T_w
  compute    tokens/s of a real model at PP=2 against the single rank

usage: bench_pipeline.py MEGAW MEGACTL [overhead|bubble|compute ...]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "engine"))
from ranks import launch, write_data  # noqa: E402

P, M = 4, 16
SIM_MODEL = ["--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "2",
             "--seq-length", "32", "--micro-batch-size", "1", "--global-batch-size", str(M),
             "--lr", "1e-3"]


def run_job(megaw, world, args, tmp):
    res = launch(megaw, world, args, tmp, timeout=600)
    for rc, _, err in res:
        if rc != 0:
            raise SystemExit("a rank failed: " + err.strip()[-300:])
    return [lines for _, lines, _ in res]


def per_iteration(ranks, key, skip=1):
    """For each iteration after `skip`, the max over ranks of key."""
    iters = sorted({l["iteration"] for l in ranks[0]})[skip:]
    return [max(next(l[key] for l in r if l["iteration"] == i) for r in ranks) for i in iters]


def plan(megactl, args):
    out = subprocess.run([megactl, "plan", "--format", "json"] + args, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def receives(plan_json):
    return sum(a.startswith(("RF", "RB")) for r in plan_json["ranks"]
               for a in r["actions"].split())


def measure(megaw, megactl, tmp, sched, vp, f, b, w=None, iters=6):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    comp = "%g:%g" % (f, b) + (":%g" % w if w is not None else "")
    args = SIM_MODEL + ["--train-iters", str(iters), "--data-path", data,
                        "--pipeline-model-parallel-size", str(P), "--schedule", sched,
                        "--simulate-compute", comp]
    if vp > 1:
        args += ["--virtual-pipeline-model-parallel-size", str(vp)]
    ranks = run_job(megaw, P, args, tmp)
    step = statistics.median(per_iteration(ranks, "step_time_s"))
    lines = [l for r in ranks for l in r if l["iteration"] > 1]
    iters_measured = len({l["iteration"] for l in lines})
    pj_args = ["--pipeline-model-parallel-size", str(P), "--num-microbatches", str(M),
               "--schedule", sched, "--t-forward", str(f), "--t-backward", str(b)]
    if vp > 1:
        pj_args += ["--virtual-pipeline-model-parallel-size", str(vp)]
    if w is not None:
        pj_args += ["--t-weight", str(w)]
    ideal = plan(megactl, pj_args)
    # The P2P cost per message as the engine measured it: its transfer waits.
    latency_ms = 1e3 * sum(l["p2p_wait_s"] for l in lines) / iters_measured / receives(ideal)
    predicted = plan(megactl, pj_args + ["--p2p-latency", "%.6f" % latency_ms])
    bubble = statistics.mean(l["bubble_s"] / l["step_time_s"] for l in lines)
    idle = statistics.mean(1 - l["compute_s"] / l["step_time_s"] for l in lines)
    return {"step_ms": step * 1e3, "ideal_ms": ideal["makespan"],
            "predicted_ms": predicted["makespan"], "latency_ms": latency_ms,
            "bubble": bubble, "idle": idle, "sim_bubble": ideal["bubble_fraction"]}


def overhead(megaw, megactl, tmp):
    print("== engine overhead: --simulate-compute 20:40, PP=%d, M=%d (median of 5 iterations)" % (P, M))
    print("%-16s %10s %12s %14s %12s %8s" % ("schedule", "measured", "sim, no p2p",
                                             "sim, measured", "p2p latency", "ratio"))
    for sched, vp in (("1f1b", 1), ("interleaved", 2)):
        r = measure(megaw, megactl, tmp, sched, vp, 20, 40)
        print("%-16s %8.1f ms %9.1f ms %11.1f ms %9.3f ms %8.3f" %
              ("%s V=%d" % (sched, vp), r["step_ms"], r["ideal_ms"], r["predicted_ms"],
               r["latency_ms"], r["step_ms"] / r["predicted_ms"]))


def bubble(megaw, megactl, tmp):
    print("== bubble fraction, PP=%d, M=%d (measured: mean over ranks of bubble/step time)" % (P, M))
    print("%-26s %10s %10s %12s %12s" % ("schedule", "measured", "idle", "simulated",
                                         "closed form"))
    rows = [("1f1b", 1, 20, 20, None, (P - 1) / (M + P - 1)),
            ("interleaved", 2, 20, 20, None, (P - 1) / (2 * M + P - 1)),
            ("1f1b (T_w in B)", 1, 20, 20, 20, None),
            ("zb-h1", 1, 20, 20, 20, None)]
    got = {}
    for name, vp, f, b, w, closed in rows:
        sched = name.split()[0]
        r = measure(megaw, megactl, tmp, sched, vp, f, b, w)
        got[name] = r
        print("%-26s %9.1f%% %9.1f%% %11.1f%% %12s" %
              ("%s T=%g:%g%s" % (name, f, b, ":%g" % w if w else ""), 100 * r["bubble"],
               100 * r["idle"], 100 * r["sim_bubble"],
               "%.1f%%" % (100 * closed) if closed is not None else "-"))
    zb, base = got["zb-h1"], got["1f1b (T_w in B)"]
    print("zb-h1 bubble time / 1f1b bubble time at T_f=T_b=T_w: measured %.2f, simulated %.2f "
          "(goal <= 1/3)" % (zb["bubble"] * zb["step_ms"] / (base["bubble"] * base["step_ms"]),
                             zb["sim_bubble"] * zb["ideal_ms"] /
                             (base["sim_bubble"] * base["ideal_ms"])))


def compute(megaw, megactl, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    model = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
             "--seq-length", "128", "--micro-batch-size", "4", "--global-batch-size", "32",
             "--lr", "1e-3", "--train-iters", "6", "--data-path", data]
    print("== real compute: tokens/s, 4 layers, d=128, seq 128, micro 4, global 32 (median)")
    for name, world, extra in (("single rank, 1 thread", 1, []),
                               ("single rank, 2 threads", 1, ["--blas-threads", "2"]),
                               ("PP=2, 1 thread each, M=8", 2,
                                ["--pipeline-model-parallel-size", "2"]),
                               ("PP=2, 1 thread each, M=16", 2,
                                ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2"]),
                               ("DP=2, 1 thread each", 2, [])):
        ranks = run_job(megaw, world, model + extra, tmp)
        steps = per_iteration(ranks, "step_time_s")
        tokens = 32 * 128
        print("%-28s %9.0f tokens/s  (%.3f s per iteration)" %
              (name, tokens / statistics.median(steps), statistics.median(steps)))


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    megaw, megactl = sys.argv[1], sys.argv[2]
    which = sys.argv[3:] or ["overhead", "bubble", "compute"]
    with tempfile.TemporaryDirectory(prefix="mega-bench-") as tmp:
        for w in which:
            {"overhead": overhead, "bubble": bubble, "compute": compute}[w](megaw, megactl, tmp)
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
